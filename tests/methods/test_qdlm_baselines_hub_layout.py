"""The QDLM baselines (gptq, awq, smoothquant, duquant) calibrate on checkpoints in the layouts the hub
ships LLaDA (MHA) and Dream (GQA, q/k/v biases) in, read through the hub loader, and reload
from their saved state to the same model (the calibrate stage of config/qdlm.yaml, on toys)."""
import pytest
import torch

from fair_calib.calibrate import calibrate
from fair_calib.methods import load_quantized, make_method
from fair_calib.models.adapters import load_model
from fixtures.hub_checkpoints import dream_checkpoint, llada_checkpoint

torch.set_num_threads(1)
IDS = torch.randint(0, 80, (4, 16), generator=torch.Generator().manual_seed(5))
CASES = [({"type": "gptq", "group_size": 16}, 4, 16), ({"type": "awq", "group_size": 16}, 3, 16),
         ({"type": "smoothquant"}, 8, 8),
         # rotation blocks of 8: the toys' widths are 32 and 48, their head dim 8 (the q/k
         # Hadamard of DuQuant's attention matmuls needs a block_size dividing it)
         ({"type": "duquant", "block_size": 8}, 8, 8), ({"type": "duquant", "block_size": 8}, 4, 4)]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_qdlm_baselines_on_hub_layout_checkpoints(tmp_path, family):
    folder = tmp_path / family
    (llada_checkpoint if family == "llada" else dream_checkpoint)(folder)
    with torch.no_grad():
        fp = load_model(folder, family).logits(IDS)
    for cfg, w, a in CASES:
        out = tmp_path / f"{family}-{cfg['type']}-w{w}a{a}"
        lm = load_model(folder, family)
        meta = calibrate(lm, make_method(cfg, w, a), IDS, out, batch_size=2, log=lambda s: None)
        assert meta["n_blocks"] == 2, cfg["type"]
        # DuQuant's rotations (2 x 8 x 8 per group in bf16) outweigh 8-bit savings at these
        # toy widths (at LLaDA-8B's widths: 64 KiB per group beside a 16 MiB W8 weight)
        if (cfg["type"], w) != ("duquant", 8):
            assert meta["export_bytes"] < meta["fp_bf16_bytes"], (cfg["type"], w, a)
        with torch.no_grad():
            got = lm.logits(IDS)
            again = load_quantized(load_model(folder, family), out).logits(IDS)
        assert torch.allclose(again, got, atol=1e-5), cfg["type"]
        assert not torch.allclose(got, fp, atol=1e-4), cfg["type"]
