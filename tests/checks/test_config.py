"""Settings an offline task cannot honour are refused from the config, before any job (the
evaluation job would refuse them only after loading the model)."""
import copy

import pytest

from fair_calib.checks.config import ConfigError, check_offline_tasks, load_yaml, offline_task_error
from fair_calib.evaluate.offline_data import NO_OFFLINE_FEWSHOT_POOL, check_offline_fewshot


@pytest.fixture(scope="module")
def paper(repo_root):
    cfg = load_yaml(repo_root / "config/paper.yaml")
    cfg["data_source"] = "local"
    return cfg


def test_winogrande_five_shot_offline_names_task_and_key(paper):
    err = offline_task_error(paper, "winogrande", "dream-7b-base")
    assert err.startswith("config: tasks.winogrande.num_fewshot = 5 (model dream-7b-base)")
    assert "`train` split" in err and "data_source: hub" in err and "\n" not in err
    with pytest.raises(ConfigError, match="tasks.winogrande.num_fewshot"):
        check_offline_tasks(paper, [("dream-7b-base", "piqa"), ("dream-7b-base", "winogrande")])


def test_the_key_is_the_override_that_set_it(paper):
    cfg = copy.deepcopy(paper)
    cfg["tasks"]["arc_easy"]["by_model"] = {"llada-1.5": {"num_fewshot": 25}}
    assert offline_task_error(cfg, "arc_easy", "llada-8b-base") is None
    assert "tasks.arc_easy.by_model.llada-1.5.num_fewshot = 25" in offline_task_error(
        cfg, "arc_easy", "llada-1.5")
    # LLaDA runs `gsm8k` (lm-eval's 5-shot task, set by_family), defined offline (train pool)
    assert offline_task_error(paper, "gsm8k_cot", "llada-8b-base") is None
    cfg["tasks"]["gsm8k_cot"]["by_family"]["llada"]["lm_eval_task"] = "lambada_openai"
    err = offline_task_error(cfg, "gsm8k_cot", "llada-8b-base")
    assert "tasks.gsm8k_cot.by_family.llada.lm_eval_task = 'lambada_openai'" in err
    assert "no offline definition" in err
    assert offline_task_error(paper, "gsm8k_cot", "dream-7b-base") is None   # 8-shot, in YAML
    # Dream-Instruct's HumanEval is the eval_instruct fork's task, defined offline too
    assert offline_task_error(paper, "humaneval", "dream-7b-instruct") is None


def test_what_can_run_offline_passes(paper):
    assert offline_task_error(paper, "mmlu", "dream-7b-base") is None        # 5-shot from dev
    assert offline_task_error(paper, "piqa", "llada-8b-base") is None
    hub = {**paper, "data_source": "hub"}
    assert offline_task_error(hub, "winogrande", "dream-7b-base") is None
    cfg = copy.deepcopy(paper)
    cfg["tasks"]["winogrande"]["offline"] = False
    assert offline_task_error(cfg, "winogrande", "dream-7b-base") is None
    cfg["tasks"]["winogrande"].update(offline=True, num_fewshot=0)
    assert offline_task_error(cfg, "winogrande", "dream-7b-base") is None


@pytest.mark.parametrize("task", ["piqa", "boolq", "winogrande", "arc_easy", "arc_challenge",
                                  "hellaswag", "mmlu", "gsm8k_cot", "truthfulqa_mc2"])
def test_the_config_check_agrees_with_the_jobs_refusal(paper, task):
    cfg = copy.deepcopy(paper)
    entry = cfg["tasks"][task]
    entry.pop("by_family", None)
    entry.update(lm_eval_task=task, num_fewshot=3)
    job_refuses = task in NO_OFFLINE_FEWSHOT_POOL
    try:
        check_offline_fewshot(task, 3)
    except ValueError:
        assert job_refuses
    else:
        assert not job_refuses
    assert (offline_task_error(cfg, task, "dream-7b-base") is not None) == job_refuses


def test_opencompass_recipes_offline(paper, tmp_path):
    """The LLaDA-Instruct recipes (oc_* tasks) run from the local copies, except ARC-C's dev
    split, which the copies lack: refused from the config, naming the file."""
    cfg = {**paper, "data_dir": str(tmp_path)}
    assert offline_task_error(cfg, "gsm8k_cot", "llada-8b-instruct") is None
    assert offline_task_error(cfg, "mmlu", "llada-1.5") is None
    err = offline_task_error(cfg, "arc_challenge", "llada-8b-instruct")
    assert "tasks.arc_challenge.by_model.llada-8b-instruct.lm_eval_task = 'oc_arc_c_gen'" in err
    assert "ARC-Challenge-Dev.jsonl" in err and "data_source: hub" in err
    (tmp_path / "arc").mkdir()
    (tmp_path / "arc" / "ARC-Challenge-Dev.jsonl").write_text("")
    assert offline_task_error(cfg, "arc_challenge", "llada-8b-instruct") is None
