"""Quant-dLLM's Masked Calibration Simulation (``mcs``), checked against the paper's formulas
written out here: the forward process q(y_t | y) = Cat(alpha_t y + (1 - alpha_t) m) with a
deterministic visible prefix P = {1..floor(gamma L)}, gamma = 0.25, r_i ~ Bernoulli(alpha(t))
elsewhere, every calibration sequence at every t of the grid (S_MCS's uniform pi), and a full
FlatQuant calibration on those rows for both families' layouts."""
import pytest
import torch

from fair_calib.calibrate import calibrate, calibration_generator
from fair_calib.methods import load_quantized, make_method
from fair_calib.quant.toy import tiny_random_loaded

torch.set_num_threads(1)
LAYOUTS = {"llada": ("llama", "tiny-llada"), "dream": ("qwen2", "tiny-dream")}


def loaded(layout="llada"):
    arch, family = LAYOUTS[layout]
    return tiny_random_loaded(arch, layers=2, family=family)


def windows(n, length, seed=1):
    return torch.randint(0, 60, (n, length), generator=torch.Generator().manual_seed(seed))


def simulate(method, lm, ids, seed=0):
    return method.calibration_inputs(lm, ids, calibration_generator(seed))


def test_rows_are_each_window_at_each_timestep_with_its_prefix_visible():
    lm, ids = loaded(), windows(3, 40)
    out, w = simulate(make_method({"type": "mcs", "timesteps": 5}, 4, 4), lm, ids)
    assert w is None                                   # every position, uniformly
    assert out.shape == (3 * 5, 40)
    prefix = int(0.25 * 40)                            # |P| = floor(gamma L) = 10
    for b in range(3):
        for k in range(5):
            row = out[b * 5 + k]
            assert torch.equal(row[:prefix], ids[b, :prefix])
            kept = row != lm.mask_id                   # x~_i = x_i where visible, else [MASK]
            assert torch.equal(row[kept], ids[b][kept])
            assert bool((row[~kept] == lm.mask_id).all())
        # t = 1 (k = K): every position after the prefix is masked
        assert bool((out[b * 5 + 4, prefix:] == lm.mask_id).all())


@pytest.mark.parametrize("K", [4, 8])
def test_mask_rate_at_each_timestep_is_t(K):
    """Per grid point t_k = k/K, the share of masked non-prefix positions is t_k = 1 - alpha(t_k)
    (binomial over 64 x 300 positions: standard error <= 0.0037)."""
    lm, ids = loaded(), windows(64, 400)
    out, _ = simulate(make_method({"type": "mcs", "timesteps": K}, 4, 4), lm, ids)
    masked = (out.view(64, K, 400)[:, :, 100:] == lm.mask_id).double()
    rate = masked.mean(dim=(0, 2))
    want = torch.tensor([k / K for k in range(1, K + 1)], dtype=torch.float64)
    assert torch.allclose(rate, want, atol=0.02), (rate, want)
    # independent across positions: the masked count of a row is Binomial(300, t_k), whose
    # variance the rows' spread matches
    counts = masked.sum(-1)                            # [64, K]
    var = counts[:, : K - 1].var(dim=0)
    binom = 300 * want[: K - 1] * (1 - want[: K - 1])
    assert bool(((var / binom) > 0.4).all() and ((var / binom) < 2.2).all()), (var, binom)


def test_prefix_ratio_setting_and_the_draws_as_documented():
    """gamma from ``prefix_ratio``; the draws: one uniform [n, K, L] of the calibration generator,
    a non-prefix position visible iff its draw < alpha(t_k) = 1 - k/K (the docstring's contract)."""
    lm, ids = loaded(), windows(2, 20)
    out, _ = simulate(make_method({"type": "mcs", "timesteps": 3, "prefix_ratio": 0.5}, 4, 4), lm, ids, 7)
    u = torch.rand((2, 3, 20), generator=calibration_generator(7), dtype=torch.float64)
    want = ids[:, None, :].repeat(1, 3, 1)
    for k in range(3):
        hidden = u[:, k] >= 1 - (k + 1) / 3
        hidden[:, :10] = False
        want[:, k][hidden] = lm.mask_id
    assert torch.equal(out, want.reshape(6, 20))


def test_same_seed_same_bits_other_seed_other_masks():
    lm, ids = loaded(), windows(4, 32)
    m = make_method({"type": "mcs"}, 4, 4)
    a, _ = simulate(m, lm, ids, 3)
    b, _ = simulate(make_method({"type": "mcs"}, 4, 4), lm, ids, 3)
    c, _ = simulate(m, lm, ids, 4)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("bad", [{"timesteps": 0}, {"timesteps": 2.5}, {"prefix_ratio": 1.0}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match="mcs"):
        make_method({"type": "mcs", **bad}, 4, 4)


@pytest.mark.parametrize("layout", ["llada", "dream"])
def test_calibrates_end_to_end(tmp_path, layout):
    """A full FlatQuant-transform calibration on the simulated rows (FP targets on the same
    masked rows), then loaded back: finite logits, and n * K calibration rows recorded."""
    ids = windows(2, 16)
    m = make_method({"type": "mcs", "epochs": 1, "timesteps": 2}, 4, 4, seed=0)
    rows, _ = simulate(m, loaded(layout), ids)
    meta = calibrate(loaded(layout), m, rows, tmp_path, batch_size=4, log=lambda s: None)
    assert meta["type"] == "mcs" and meta["n_samples"] == 4 and meta["n_blocks"] == 2
    q = load_quantized(loaded(layout), tmp_path)
    with torch.no_grad():
        assert bool(torch.isfinite(q.logits(rows)).all())


@pytest.mark.parametrize("method", [{"type": "mcs", "timesteps": 2},
                                    {"type": "tmas"}])
def test_the_stage_calibrates_on_the_methods_rows(tmp_path, method):
    """``calibrate.run`` (the Snakemake job's entry) builds the windows, hands them to the
    method's ``calibration_inputs`` and calibrates on what comes back: MCS's n * K rows, TMAS's
    n snapshots (seq_len 12: a 9-token rest cut to one 8-token LLaDA block, a 4-token prompt)."""
    import json

    from fair_calib.jobs import io
    from fair_calib.calibrate import run_cli
    from test_calibrate import _tiny_model_dir

    mdir, sdir = _tiny_model_dir(tmp_path)
    settings = {"seed": 0, "device": "cpu", "dtype": "float32", "data_dir": str(tmp_path),
                "synthetic_dir": str(sdir), "model": {"name": "tiny-llada", "family": "tiny-llada"},
                "method": {"name": method["type"], "epochs": 1, "export": False, **method},
                "bits": {"name": "w4a4", "w_bits": 4, "a_bits": 4},
                "calibration": {"dataset": "synthetic", "n_samples": 4, "seq_len": 12,
                                "batch_size": 2}}
    run_cli(["--settings", json.dumps(settings), "--model-dir", str(mdir), "--out-dir",
             str(tmp_path / "calib")])
    meta = io.read_json(tmp_path / "calib" / "meta.json")
    assert meta["type"] == method["type"] and meta["position_weights"] is None
    assert meta["n_samples"] == (8 if method["type"] == "mcs" else 4) and meta["seq_len"] == 12
