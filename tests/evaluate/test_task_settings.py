"""Per-family / per-model task settings: resolution order and config checks."""
import pytest

from fair_calib.evaluate.task_settings import check_task_overrides, resolve_task

ENTRY = {"kind": "lm_eval", "lm_eval_task": "gsm8k_cot", "mc_num": 128, "gen_length": 256,
         "by_family": {"llada": {"lm_eval_task": "gsm8k", "gen_length": 1024}},
         "by_model": {"llada-1.5": {"gen_length": 512}}}


def test_entry_then_family_then_model():
    assert resolve_task("g", ENTRY, "dream-7b-base", "dream") == {
        "name": "g", "kind": "lm_eval", "lm_eval_task": "gsm8k_cot", "mc_num": 128, "gen_length": 256}
    base = resolve_task("g", ENTRY, "llada-8b-base", "llada")
    assert (base["lm_eval_task"], base["gen_length"]) == ("gsm8k", 1024)
    one_five = resolve_task("g", ENTRY, "llada-1.5", "llada")
    assert (one_five["lm_eval_task"], one_five["gen_length"]) == ("gsm8k", 512)


@pytest.mark.parametrize("entry, message", [
    ({"kind": "lm_eval", "by_family": {"gpt2": {}}}, "tasks.t.by_family.gpt2"),
    ({"kind": "lm_eval", "by_model": {"nope": {}}}, "tasks.t.by_model.nope"),
    ({"kind": "lm_eval", "by_family": {"llada": {"kind": "synthetic_mc"}}}, "may not set ['kind']"),
])
def test_bad_overrides_name_the_key(entry, message):
    cfg = {"tasks": {"t": entry}, "models": {"m": {"family": "llada"}}}
    with pytest.raises(ValueError) as err:
        check_task_overrides(cfg, ["llada", "dream"])
    assert message in str(err.value)


def test_paper_config_scores_dreams_one_token_choices_exactly(repo_root):
    """config/paper.yaml: every likelihood task runs Dream with ``exact_below: 2`` (a one-token
    choice by the exact expectation of the authors' estimator); LLaDA keeps its adapter's."""
    import yaml
    cfg = yaml.safe_load((repo_root / "config" / "paper.yaml").read_text())
    likelihood = [n for n, e in cfg["tasks"].items()
                  if "mc_num" in e or "mc_num" in e.get("by_family", {}).get("dream", {})]
    assert sorted(likelihood) == ["arc_challenge", "arc_easy", "boolq", "hellaswag", "mmlu",
                                  "piqa", "truthfulqa_mc2", "winogrande"]
    for name in likelihood:
        assert resolve_task(name, cfg["tasks"][name], "dream-7b-base", "dream")["exact_below"] == 2
        assert "exact_below" not in resolve_task(name, cfg["tasks"][name], "llada-8b-base", "llada")
