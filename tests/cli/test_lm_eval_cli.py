"""`fair-calib lm-eval` (fair_calib/cli/lm_eval_cli.py) refuses what an offline task cannot
honour before loading the model, as the config check does (tests/checks/test_config.py)."""
import pytest


def test_lm_eval_cli_refuses_offline_few_shot_before_loading(tmp_path):
    from fair_calib.cli.lm_eval_cli import forward_to_lm_eval, offline_fewshot_refusal

    (tmp_path / "fc_task_utils.py").write_text("")
    (tmp_path / "winogrande.yaml").write_text("")
    argv = ["--model", "fair_calib_dlm", "--model_args", "pretrained=/nonexistent",
            "--tasks", "piqa,winogrande", "--num_fewshot", "5", "--include_path", str(tmp_path)]
    with pytest.raises(SystemExit, match="--tasks winogrande --num_fewshot 5: the offline"):
        forward_to_lm_eval(argv)
    assert offline_fewshot_refusal(argv[:-2]) is None               # lm-eval's own task
    assert offline_fewshot_refusal(argv[:7] + ["0"] + argv[8:]) is None
