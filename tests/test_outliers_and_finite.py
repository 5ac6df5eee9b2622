"""`outliers` settings a convert job would refuse, or that would write inf/NaN weights, are
refused before any job naming the key and the model's widths; no stage writes or loads
non-finite weights, or scores with non-finite log-likelihoods, without a one-line error."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from fixtures.check_config import check_config, one_error_line

REPO = Path(__file__).resolve().parents[1]
HUB = ("config/smoke.yaml", "config/hub_layout.yaml")    # toy-llada: convert of a 64-wide model


def _check_config(tmp_path, over):
    return check_config(tmp_path, over, HUB)


def test_more_channels_than_the_widths_are_refused_before_any_job(tmp_path):
    line = one_error_line(_check_config(
        tmp_path, {"models": {"toy-llada": {"outliers": {"channels": 1000, "scale": 30.0}}}}))
    assert "models.toy-llada.outliers.channels = 1000" in line, line
    assert "norm: 64" in line and "up_down: 128" in line and "at most 64" in line, line
    assert "models.tiny-llada.train.hidden" in line, line


def test_a_site_subset_is_checked_against_its_own_widths(tmp_path):
    ok = _check_config(tmp_path, {"models": {"toy-llada": {"outliers": {
        "channels": 100, "scale": 30.0, "sites": ["up_down"]}}}})
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.parametrize("scale", [math.inf, math.nan])
def test_a_scale_that_is_not_finite_is_refused_before_any_job(tmp_path, scale):
    line = one_error_line(_check_config(
        tmp_path, {"models": {"toy-llada": {"outliers": {"channels": 4, "scale": scale}}}}))
    assert "models.toy-llada.outliers.scale" in line and "not a finite number" in line, line


def test_the_convert_job_refuses_an_infinite_scale_too():
    from fair_calib.models.outliers import inject_outliers

    with pytest.raises(ValueError, match="must be > 1 and finite"):
        inject_outliers(None, 4, math.inf)


def test_non_finite_weights_are_named_in_one_line():
    from fair_calib.models.finite import NonFiniteError, check_finite_weights

    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight[0, :2] = math.inf
        lin.bias[1] = math.nan
    with pytest.raises(NonFiniteError) as err:
        check_finite_weights(lin, "resources/hub/x", "nothing was written")
    msg = str(err.value)
    assert "\n" not in msg and "2 inf and 1 NaN values in 2 tensors (first: weight)" in msg, msg
    check_finite_weights(torch.nn.Linear(2, 2), "fine", "")


def test_a_checkpoint_holding_inf_is_refused_when_loaded(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from fixtures.hub_checkpoints import llada_checkpoint, llada_state, write_checkpoint

    from fair_calib.models.adapters import load_model
    from fair_calib.models.finite import NonFiniteError

    cfg, state = llada_checkpoint(tmp_path / "m")
    key = next(k for k in state if k.endswith("ff_out.weight") or "ff_out" in k)
    state[key][0, 0] = math.inf
    write_checkpoint(tmp_path / "m", cfg, state)
    with pytest.raises(NonFiniteError, match=r"the weights hold 1 inf and 0 NaN"):
        load_model(tmp_path / "m", "llada")


def test_non_finite_log_likelihoods_are_refused():
    from fair_calib.models.finite import NonFiniteError, check_finite_scores

    with pytest.raises(NonFiniteError, match="1 of 3 log-likelihoods are not finite"):
        check_finite_scores([-1.0, math.nan, -2.0], "evaluation")
    check_finite_scores([-1.0, -2.0], "evaluation")


def test_a_diverged_calibration_writes_nothing(tmp_path, monkeypatch):
    """Calibrated parameters holding NaN: one line, and no stats, params or meta.json."""
    from fixtures.hub_checkpoints import llada_checkpoint

    from fair_calib import calibrate as C
    from fair_calib.methods import make_method
    from fair_calib.models.adapters import load_model
    from fair_calib.models.finite import NonFiniteError

    llada_checkpoint(tmp_path / "m")
    real = C._Calibrated.add

    def poisoned(self, i, *rest):
        real(self, i, *rest)
        self.params = {k: torch.full_like(v, math.nan) if v.is_floating_point() else v
                       for k, v in self.params.items()}
    monkeypatch.setattr(C._Calibrated, "add", poisoned)
    ids = torch.randint(0, 90, (4, 16), generator=torch.Generator().manual_seed(0))
    with pytest.raises(NonFiniteError, match=r"calibrated parameters hold 0 inf and \d+ NaN"):
        C.calibrate(load_model(tmp_path / "m", "llada"), make_method({"type": "flatquant", "epochs": 1}, 4, 4),
                    ids, tmp_path / "calib", batch_size=4, run_info={}, log=lambda *_: None)
    assert not (tmp_path / "calib/meta.json").exists()
    assert not (tmp_path / "calib/params.safetensors").exists()
