import pytest
import torch
import torch.nn.functional as F

from fair_calib.jobs import io
from fair_calib.names import registry
from fair_calib.calibrate import calibrate
from fair_calib.methods import REGISTRY, load_quantized, make_method
from fair_calib.quant.gptq import gptq_quantize
from fair_calib.quant.quantizers import WeightQuantizer
from fair_calib.quant.toy import tiny_random_loaded
from fixtures.llada_like import make_loaded as llada_like_loaded

torch.set_num_threads(1)
IDS = torch.randint(0, 40, (8, 16), generator=torch.Generator().manual_seed(1))
QUIET = dict(log=lambda s: None)
def kl(p_logits, q_logits):
    return F.kl_div(q_logits.log_softmax(-1), p_logits.log_softmax(-1), log_target=True,
                    reduction="batchmean").item()


def quantized_kl(tmp_path, make, method_cfg, w_bits, a_bits):
    with torch.no_grad():
        fp = make().logits(IDS)
    calibrate(make(), make_method(method_cfg, w_bits, a_bits), IDS, tmp_path, batch_size=4, **QUIET)
    with torch.no_grad():
        q = load_quantized(make(), tmp_path).logits(IDS)
    return kl(fp, q)


def test_registry_keys():
    from fair_calib.calibrate import PROPAGATE
    from fair_calib.methods.flatquant import O_TRANS

    assert tuple(REGISTRY) == registry.METHOD_TYPES
    assert registry.PROPAGATE == PROPAGATE and registry.O_TRANS == O_TRANS
    with pytest.raises(KeyError):
        make_method({"type": "nope"}, 4, 4)


def test_rtn_w8a8_close_to_fp(tmp_path):
    make = lambda: tiny_random_loaded("llama", layers=2)   # noqa: E731
    k8 = quantized_kl(tmp_path / "8", make, {"type": "rtn"}, 8, 8)
    k4 = quantized_kl(tmp_path / "4", make, {"type": "rtn"}, 4, 4)
    assert k8 < 1e-2 and k8 < k4 / 100, (k8, k4)


def test_fp_method_is_identity(tmp_path):
    make = lambda: tiny_random_loaded("llama", layers=2)   # noqa: E731
    assert quantized_kl(tmp_path, make, {"type": "fp"}, 16, 16) == 0.0


@pytest.mark.parametrize("which", ["llama", "qwen2", "llada"])
def test_quarot_rotation_preserves_fp_function(which):
    make = {"llama": lambda: tiny_random_loaded("llama", layers=2),
            "qwen2": lambda: tiny_random_loaded("qwen2", layers=2, kv_heads=2),
            "llada": lambda: llada_like_loaded()}[which]
    lm = make()
    with torch.no_grad():
        want = lm.logits(IDS)
        m = make_method({"type": "quarot"}, 4, 4)
        m.prepare_model(lm)
        got = lm.logits(IDS)
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max()), (got - want).abs().max()
    tr = m._traces[0]
    v = {"llama": "self_attn.v_proj", "qwen2": "self_attn.v_proj", "llada": "v_proj"}[which]
    o = {"llama": "self_attn.o_proj", "qwen2": "self_attn.o_proj", "llada": "attn_out"}[which]
    assert tr["v_name"] == v and tr["groups"][tr["o_group"]].names == (o,)
    # norms were folded into the linears
    norms = [lm.blocks[0].get_submodule(tr["producer"][j]) for j in tr["norm_fed"]]
    assert len(norms) == 2 and all(torch.all(n.weight == 1) for n in norms)


def test_quarot_beats_rtn_w4a4(tmp_path):
    make = lambda: tiny_random_loaded("llama", layers=2)   # noqa: E731
    k_rtn = quantized_kl(tmp_path / "rtn", make, {"type": "rtn"}, 4, 4)
    k_qr = quantized_kl(tmp_path / "qr", make, {"type": "quarot"}, 4, 4)
    assert k_qr < 0.6 * k_rtn, (k_qr, k_rtn)
    params, _ = io.load_tensors(tmp_path / "qr" / "params.safetensors")
    assert params["0.mlp.down_proj.codes"].dtype == torch.int8
    assert "0.g3.rotation.hfac" in params and "0.g0.rotation.hfac" not in params


def test_gptq_beats_rtn_on_correlated_inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g) @ torch.randn(8, 32, generator=g) + 0.1 * torch.randn(512, 32, generator=g)
    w = torch.randn(16, 32, generator=g)
    codes, scale = gptq_quantize(w, x.T.double() @ x.double(), 4, damp=0.01, block_size=8)
    assert codes.dtype == torch.int8 and codes.max() <= 7 and codes.min() >= -8
    err_gptq = (x @ (codes.float() * scale).T - x @ w.T).pow(2).mean()
    err_rtn = (x @ WeightQuantizer(16, 4)(w).T - x @ w.T).pow(2).mean()
    assert err_gptq < 0.7 * err_rtn, (err_gptq, err_rtn)


def test_qdrop_calibrates_and_drops_only_in_training(tmp_path):
    lm = tiny_random_loaded("llama", layers=2)
    meta = calibrate(lm, make_method({"type": "qdrop", "epochs": 6, "lr": 2e-3,
                                      "weighting": "prior"}, 4, 4),
                     IDS, tmp_path, weights=torch.linspace(1, 2, 16), batch_size=4, **QUIET)
    assert meta["weighting"] == "prior" and meta["propagate"] == "quant"
    df, _ = io.read_parquet(tmp_path / "stats.parquet")
    first = df[(df.block == 0) & (df.epoch == -1)].loss.item()
    last = df[(df.block == 0) & (df.epoch == 5)].loss.item()
    assert last < first
    ql = lm.blocks[0].self_attn.q_proj
    assert ql.inq.act.scale is not None and ql.wq.scale is not None
    x = torch.randn(2, 16, 64)
    with torch.no_grad():
        assert torch.equal(ql.inq(x), ql.inq(x))          # eval: deterministic, fully quantized
        ql.inq.train()
        a, b = ql.inq(x), ql.inq(x)
        ql.inq.eval()
    assert not torch.equal(a, b)


def test_flatquant_on_llada_named_model(tmp_path):
    k_rtn = quantized_kl(tmp_path / "rtn", llada_like_loaded, {"type": "rtn"}, 4, 4)
    k_fq = quantized_kl(tmp_path / "fq", llada_like_loaded,
                        {"type": "flatquant", "epochs": 3}, 4, 4)
    assert k_fq < k_rtn, (k_fq, k_rtn)
    meta = io.read_json(tmp_path / "fq" / "meta.json")
    assert [g["names"] for g in meta["groups"]["0"]] == [["q_proj", "k_proj", "v_proj"], ["attn_out"],
                                                         ["ff_proj", "up_proj"], ["ff_out"]]


def _weight_bytes(model):
    """Bytes of distinct tensor storages among the model's parameters and buffers."""
    seen = {}
    for t in list(model.parameters()) + list(model.buffers()):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


@pytest.mark.parametrize("cfg", [{"type": "flatquant", "epochs": 1}, {"type": "quarot"}])
def test_evaluation_model_drops_fp_weights(tmp_path, cfg):
    """load_quantized frees the FP copy of every folded weight: same outputs, one weight per
    layer; what needs the FP weight (unfold) says so."""
    from fair_calib.quant.qlinear import QuantLinear

    make = lambda: tiny_random_loaded("qwen2", layers=2, kv_heads=2)   # noqa: E731
    calibrate(make(), make_method(cfg, 4, 4), IDS, tmp_path, batch_size=4, **QUIET)
    kept = load_quantized(make(), tmp_path, keep_fp=True)
    lean = load_quantized(make(), tmp_path)
    with torch.no_grad():
        assert torch.equal(kept.logits(IDS), lean.logits(IDS))
    linear_bytes = sum(m.linear.weight.numel() * m.linear.weight.element_size()
                       for m in lean.model.modules() if isinstance(m, QuantLinear))
    assert _weight_bytes(kept.model) - _weight_bytes(lean.model) >= linear_bytes
    ql = next(m for m in lean.model.modules() if isinstance(m, QuantLinear))
    assert ql.linear.weight is not None and ql.weight.shape == (ql.out_features, ql.in_features)
    with pytest.raises(RuntimeError, match="FP weight was dropped"):
        ql.unfold()


# ------------------------------------------------------------------ plan-time shape checks
SHAPE_CASES = [
    # (method settings, (w_bits, a_bits), (hidden, heads, intermediate), refused)
    ({"type": "awq", "group_size": 48}, (4, 16), (64, 4, 128), True),
    ({"type": "awq", "group_size": 48}, (4, 16), (96, 4, 192), False),
    ({"type": "awq", "group_size": 32}, (4, 16), (64, 4, 96), False),
    ({"type": "gptq", "group_size": 48}, (4, 16), (64, 4, 128), False),   # a shorter last group
    ({"type": "duquant", "block_size": 48, "max_rotation_step": 2}, (4, 4), (64, 4, 128), True),
    # the authors' arithmetic (default): the block also divides the head dim (24, 16 here)
    ({"type": "duquant", "block_size": 48, "max_rotation_step": 2}, (4, 4), (96, 4, 192), True),
    ({"type": "duquant", "block_size": 48, "max_rotation_step": 2, "arithmetic": "precise"},
     (4, 4), (96, 4, 192), False),
    ({"type": "duquant", "block_size": 32, "max_rotation_step": 2}, (4, 4), (64, 4, 96), True),
    ({"type": "duquant", "block_size": 16, "max_rotation_step": 2}, (4, 4), (64, 4, 96), False),
    ({"type": "quarot"}, (4, 4), (96, 6, 192), True),                     # no Hadamard of order 6
    ({"type": "quarot", "online_hadamard": False}, (4, 4), (96, 6, 192), False),
    ({"type": "quarot"}, (4, 4), (104, 4, 128), True),                    # hidden 104 = 52 x 2
    ({"type": "quarot"}, (4, 4), (64, 4, 208), True),                     # intermediate 52 x 4
    ({"type": "quarot", "online_hadamard": False}, (4, 4), (64, 4, 208), False),
]


@pytest.mark.parametrize("cfg, bits, shape, refused", SHAPE_CASES,
                         ids=[f"{c['type']}-{s}-{'-'.join(f'{k}{v}' for k, v in c.items() if k != 'type')}"
                              for c, _, s, _ in SHAPE_CASES])
def test_plan_time_shape_check_refuses_exactly_what_the_job_refuses(tmp_path, cfg, bits, shape,
                                                                     refused):
    """fair_calib.checks.method_shapes (torch-free, before any job) refuses a calibration exactly where
    the calibrate job raises on it (issue 42: a job that refuses its settings has already cost
    its finished outputs)."""
    from fair_calib.checks.method_shapes import CHECKS
    from fair_calib.checks.model_widths import Widths

    hidden, heads, inter = shape
    w = Widths("toy", hidden, inter, heads, hidden // heads,
               {k: f"toy.{k}" for k in ("hidden", "intermediate", "heads", "head_dim")})
    check = CHECKS.get(cfg["type"], lambda *a: None)
    planned = check("m", cfg, {"w_bits": bits[0], "a_bits": bits[1]}, w)
    assert (planned is not None) == refused, planned
    ids = torch.randint(0, 40, (2, 8), generator=torch.Generator().manual_seed(1))
    lm = tiny_random_loaded("llama", hidden=hidden, heads=heads, intermediate=inter, layers=1)
    try:
        calibrate(lm, make_method(cfg, *bits), ids, tmp_path, batch_size=2, **QUIET)
    except ValueError as err:
        assert planned is not None, f"the job refused what the plan took: {err}"
    else:
        assert planned is None, f"the plan refused what the job takes: {planned}"
