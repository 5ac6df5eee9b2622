"""lm-eval's own command line runs the project's model (FP and calibrated) with standard flags."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lm_eval.api.instance import Instance

from fair_calib.evaluate.lm import DiffusionLM
from tiny_eval_helpers import make_loaded

REPO = Path(__file__).resolve().parents[2]


def _save(loaded, d):
    loaded.model.save_pretrained(d)
    loaded.tokenizer.save_pretrained(d)
    return d


def _rtn_calibration(tmp_path):
    from fair_calib.calibrate import calibrate
    from fair_calib.methods import make_method

    ids = torch.randint(4, 40, (4, 12), generator=torch.Generator().manual_seed(0))
    calibrate(make_loaded(), make_method({"type": "rtn"}, 4, 4), ids, tmp_path / "calib",
              batch_size=4, log=lambda *_: None)
    return tmp_path / "calib"


def _lm_eval(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "fair_calib.cli", "lm-eval", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


@pytest.mark.parametrize("calibrated", [False, True])
def test_lm_eval_cli_with_limit_2(tmp_path, synthetic_dir, calibrated):
    from fair_calib.cli.lm_eval_cli import render_tasks

    model_dir = _save(make_loaded(), tmp_path / "model")
    calib = _rtn_calibration(tmp_path) if calibrated else None
    include = render_tasks(tmp_path / "tasks", ["synth_mc"], synthetic_dir=str(synthetic_dir))
    model_args = f"pretrained={model_dir},family=tiny-llada,mc_num=8,exact_below=0,seed=3"
    if calib:
        model_args += f",calib_dir={calib}"
    _lm_eval(["--model", "fair_calib_dlm", "--model_args", model_args, "--tasks", "synth_mc",
              "--include_path", str(include), "--batch_size", "4", "--limit", "2",
              "--num_fewshot", "0", "--output_path", str(tmp_path / "out"), "--log_samples"],
             cwd=tmp_path)
    samples = list((tmp_path / "out").rglob("samples_synth_mc_*.jsonl"))
    results = list((tmp_path / "out").rglob("results_*.json"))
    assert len(samples) == 1 and len(results) == 1
    rows = [json.loads(line) for line in samples[0].read_text().splitlines()]
    assert [r["doc_id"] for r in rows] == [0, 1]
    # The CLI's scores are the in-process model's, with lm-eval's --batch_size as the rows.
    lm = DiffusionLM(make_loaded(), calib_dir=str(calib) if calib else None, seed=3,
                     likelihood={"mc_num": 8, "batch_size": 4, "exact_below": 0})
    assert lm.lik.rows == 4
    for r in rows:
        reqs = [Instance("loglikelihood", {}, (a["arg_0"], a["arg_1"]), 0)
                for a in r["arguments"].values()]
        ours = [ll for ll, _ in lm.loglikelihood(reqs)]
        theirs = [float(resp[0][0]) for resp in r["resps"]]
        assert theirs == pytest.approx(ours, abs=1e-4)
    acc = json.loads(results[0].read_text())["results"]["synth_mc"]["acc,none"]
    assert 0.0 <= acc <= 1.0


def test_unknown_model_arg_is_named():
    with pytest.raises(TypeError, match="unknown argument 'mcnum'"):
        DiffusionLM(make_loaded(), mcnum=4)


def test_recipe_tasks_render_and_their_model_args_parse(tmp_path, offline_data_dir):
    """`fair-calib render-tasks --tasks oc_gsm8k_gen` writes the recipe for lm-eval's
    --include_path, and the recipe's model settings pass through --model_args (run with
    lm-eval's own --apply_chat_template --fewshot_as_multiturn)."""
    from fixtures.hub_checkpoints import llada_checkpoint

    from fair_calib.cli.lm_eval_cli import render_tasks

    include = render_tasks(tmp_path / "tasks", ["oc_gsm8k_gen"], data_dir=str(offline_data_dir))
    assert (include / "oc_gsm8k_gen.yaml").is_file() and (include / "fc_task_utils.py").is_file()
    assert not (include / "piqa.yaml").exists()                   # named tasks only
    llada_checkpoint(tmp_path / "m")
    lm = DiffusionLM.create_from_arg_string(
        f"pretrained={tmp_path / 'm'},family=llada,chat_by_lm_eval=true,"
        "chat_add_special_tokens=true,whole_window=true,gen_length=4,steps=4,block_length=4,"
        "confidence_eos_eot_inf=true", {"batch_size": 1, "device": "cpu"})
    assert (lm.chat_by_lm_eval, lm.chat_add_special_tokens, lm.whole_window) == (True,) * 3
    pol = lm.policy()
    assert (pol.confidence_eos_eot_inf, pol.logits_eos_inf, pol.gen_length) == (True, False, 4)
