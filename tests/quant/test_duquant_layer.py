"""``fair_calib.quant.duquant_layer``: which of DuQuant's layers a model's blocks compute as, and
the float32 sin/cos its rotary starts from (the layer-for-layer equality with DuQuant's classes
is pinned in tests/methods/test_{smoothquant,duquant}_fidelity.py)."""
import torch

from fair_calib.quant import duquant_layer
from fair_calib.quant.toy import tiny_random_loaded
from fixtures.duquant_layers import LAYOUTS


def test_the_family_picks_the_layer():
    for layout, (make, rope32) in LAYOUTS.items():
        arith = duquant_layer.layer_arith(make())
        assert (arith.style, arith.rope32) == (layout.split("-")[0], rope32), layout


def test_a_low_precision_model_hands_the_layer_float32_sin_cos():
    """A bf16 model passes its blocks bf16 cos/sin; DuQuant's layers cast float32 tables to
    float16, so the float32 ones are recomputed (and used as they are where float32)."""
    lm = tiny_random_loaded("qwen2", layers=1, kv_heads=2, family="tiny-dream")
    arith = duquant_layer.layer_arith(lm)
    pid = torch.arange(8)[None]
    want = lm.model.model.rotary_emb(torch.zeros(1, 8, 64), pid)
    low = lm.model.model.rotary_emb(torch.zeros(1, 8, 64, dtype=torch.bfloat16), pid)
    assert low[0].dtype == torch.bfloat16
    like = torch.zeros(1, 8, 64, dtype=torch.float16)
    for given in (want, low):
        got = duquant_layer._float32_sin_cos(arith, given, pid, like)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    # half-precision sin/cos cast to float16 are not the float32 ones cast (not vacuous)
    assert not torch.equal(low[0].half(), want[0].half())
