"""Offline MBPP and Minerva Math: toy copies in the original releases' layouts (mbpp.jsonl;
math/<split>/<subject>/<n>.json) beside the real offline copies, built through the evaluate
stage's own task construction; their prompts are lm-eval's; qdlm.yaml's census counts them;
without the copies the census names the missing folders."""
import json
from pathlib import Path

import pytest

from fair_calib.budget import census, cost
from fair_calib.checks import plan
from fair_calib.evaluate import offline_data
from fair_calib.checks.references import load_config

MBPP_IDS = (1, 2, 3, 4, 10, 11, 12, 510, 511, 601)   # prompt, test (11..510), validation, train
MATH_IDS = (10, 2)                                    # file order differs from numeric order
# lm-eval's first MBPP few-shot example (mbpp/utils.py list_fewshot_samples, task_id 2)
MBPP_SHOT_1 = {"text": "Write a function to find the similar elements from the given two tuple lists.",
               "code": "def similar_elements(test_tup1, test_tup2):\r\n  res = tuple(set(test_tup1) & "
                       "set(test_tup2))\r\n  return (res) ",
               "test_list": ["assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
                             "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
                             "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)"]}


def _mbpp_row(i):
    return {"task_id": i, "text": f"Write a function f{i} returning its argument.",
            "code": f"def f{i}(x):\r\n  return x", "test_list": [f"assert f{i}({k}) == {k}" for k in range(3)],
            "test_setup_code": "", "challenge_test_list": []}


def _math_row(subject, split, n):
    return {"problem": f"[{subject} {split} {n}] What is $1+{n}$?", "level": "Level 1",
            "type": subject.replace("_", " ").title(), "solution": f"It is $\\boxed{{{n + 1}}}$."}


def _toy_copies(root: Path) -> Path:
    """A few MBPP rows (every split's id range) and 2 MATH problems per subject and split."""
    (root / "mbpp").mkdir(parents=True)
    (root / "mbpp" / "mbpp.jsonl").write_text("".join(json.dumps(_mbpp_row(i)) + "\n" for i in MBPP_IDS))
    for split in ("test", "train"):
        for subject in offline_data.MINERVA_SUBJECTS.values():
            folder = root / "math" / split / subject
            folder.mkdir(parents=True)
            for n in MATH_IDS:
                (folder / f"{n}.json").write_text(json.dumps(_math_row(subject, split, n)))
    return root


@pytest.fixture
def data_dir(tmp_path, shared_data_dir):
    """The real offline copies (linked) plus the toy MBPP and MATH copies."""
    root = tmp_path / "data"
    root.mkdir()
    for folder in Path(shared_data_dir).iterdir():
        if folder.is_dir():
            (root / folder.name).symlink_to(folder.resolve())
    return _toy_copies(root)


@pytest.fixture
def qdlm(repo_root):
    return load_config([repo_root / "config" / "qdlm.yaml"], repo_root / "config" / "config.yaml")


def _contexts(cfg, model, task, data_dir, **overrides):
    """The generation contexts lm-eval sends for (model, task), built as the census and the
    evaluate stage build them (census.evaluation_settings -> run.build_task_manager)."""
    from fair_calib.budget.census_tokenizer import census_tokenizer

    s = census.evaluation_settings(cfg, model, task, data_dir, data_dir)
    s["task"].update(overrides)
    tok, context, _ = census_tokenizer(cfg, model, s["task"]["lm_eval_task"], data_dir, None)
    with census._quiet():
        reqs, _ = census.count_evaluation(s, tok, context)
    return [a[0] for a in reqs["generate_until"]]


def _mbpp_prompt(doc):
    """lm-eval's mbpp.yaml doc_to_text."""
    t = doc["test_list"]
    return (f"You are an expert Python programmer, and here is your task: {doc['text']} Your code "
            f"should pass these tests:\n\n{t[0]}\n{t[1]}\n{t[2]}\n[BEGIN]\n")


def test_mbpp_reads_the_test_split_with_lm_evals_prompt_and_shots(qdlm, data_dir):
    ctxs = _contexts(qdlm, "llada-8b-base", "mbpp", data_dir)
    assert len(ctxs) == 3                                  # task_ids 11, 12, 510 of 10 rows
    shot_1 = _mbpp_prompt(MBPP_SHOT_1) + MBPP_SHOT_1["code"] + "\n[DONE]"   # target_delimiter ""
    for ctx, i in zip(ctxs, (11, 12, 510)):
        assert ctx.startswith(shot_1 + "\n\n")
        assert ctx.endswith("[DONE]\n\n" + _mbpp_prompt(_mbpp_row(i)))
        assert ctx.count("[BEGIN]") == 4                   # 3-shot (first_n of lm-eval's list)


def test_mbpp_template_is_lm_evals_yaml_but_data_and_functions(tmp_path, data_dir):
    from lm_eval.tasks._yaml_loader import load_yaml

    ours = load_yaml(offline_data.write_offline_tasks(data_dir, tmp_path / "c", tmp_path / "t",
                                                      ["mbpp"]) / "mbpp.yaml", resolve_func=False)
    theirs = load_yaml(offline_data._lm_eval_tasks_dir() / "mbpp" / "mbpp.yaml", resolve_func=False)
    replaced = {"dataset_path", "dataset_name", "dataset_kwargs", "metric_list", "fewshot_config"}
    assert {k: v for k, v in ours.items() if k not in replaced} == \
        {k: v for k, v in theirs.items() if k not in replaced}
    assert ours["fewshot_config"]["sampler"] == theirs["fewshot_config"]["sampler"]
    assert [m["metric"].rsplit(".", 1)[1] for m in ours["metric_list"]] == ["pass_at_1"]
    from fair_calib.evaluate.tasks import fc_task_utils

    shots = fc_task_utils.mbpp_fewshot_samples()
    assert [s["task_id"] for s in shots] == [2, 3, 4] and all(s["is_fewshot"] for s in shots)


def test_mbpp_pass_at_1_stays_behind_the_opt_in(monkeypatch):
    from fair_calib.evaluate.tasks import fc_task_utils

    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    with pytest.raises(PermissionError):
        fc_task_utils.pass_at_1(["assert f(1) == 1"], ["def f(x):\n  return x"])
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    assert fc_task_utils.pass_at_1(["assert f(1) == 1"], ["def f(x):\n  return x"]) == 1.0
    assert fc_task_utils.pass_at_1(["assert f(1) == 1"], ["def f(x):\n  return 2"]) == 0.0


def test_mbpp_splits_follow_the_hubs_task_id_ranges(data_dir):
    ids = {s: [r["task_id"] for r in offline_data.read_mbpp(data_dir, s)] for s in offline_data.MBPP_SPLITS}
    assert ids == {"prompt": [1, 2, 3, 4, 10], "test": [11, 12, 510], "validation": [511], "train": [601]}


def test_minerva_math_is_lm_evals_group_over_the_copies(qdlm, data_dir):
    ctxs = _contexts(qdlm, "llada-8b-base", "minerva_math", data_dir)     # 0-shot in qdlm.yaml
    expected = ["Problem:\n" + _math_row(subject, "test", n)["problem"] + "\n\nSolution:"
                for subject in offline_data.MINERVA_SUBJECTS.values() for n in sorted(MATH_IDS)]
    assert sorted(ctxs) == sorted(expected)               # test split only, every subject
    # lm-eval's default 4 shots: its fixed list, its first problem first
    shot = _contexts(qdlm, "llada-8b-base", "minerva_math", data_dir, num_fewshot=4)
    assert all(c.startswith("Problem:\nFind the domain of the expression") and
               c.count("Problem:") == 5 for c in shot)


def test_minerva_subjects_are_lm_evals(data_dir):
    from lm_eval.tasks._yaml_loader import load_yaml

    lm_dir = offline_data._lm_eval_tasks_dir()
    for suffix, subject in offline_data.MINERVA_SUBJECTS.items():
        cfg = load_yaml(lm_dir / "minerva_math" / f"minerva_math_{suffix}.yaml", resolve_func=False)
        assert cfg["dataset_name"] == subject and cfg["task"] == f"minerva_math_{suffix}"
    group = load_yaml(lm_dir / "benchmarks" / "minerva_math.yaml", resolve_func=False)
    assert group["task"] == [f"minerva_math_{s}" for s in offline_data.MINERVA_SUBJECTS]
    rows = offline_data.read_math(data_dir, "algebra")
    assert [r["problem"] for r in rows] == [_math_row("algebra", "test", n)["problem"] for n in (2, 10)]


def test_qdlm_cost_prices_every_task(qdlm, data_dir, capsys):
    """With the copies, config/qdlm.yaml's census and cost run and price every task above 0
    (the first 4 documents of each lm-eval task: test_cost.py runs the CLI on whole configs)."""
    for entry in qdlm["tasks"].values():
        if entry.get("kind", "lm_eval") == "lm_eval":
            entry["limit"] = 4
    res = cost.project(qdlm, census.census(qdlm, data_dir))
    tasks = {t for _, _, _, t in plan.eval_cells(qdlm)}
    assert {"mbpp", "minerva_math"} <= tasks and set(res["evaluate_by_task"]) == tasks
    assert all(h > 0 for h in res["evaluate_by_task"].values()), res["evaluate_by_task"]
    cost.print_projection(res)
    assert f"**{res['total_gpu_hours']}**" in capsys.readouterr().out


def test_census_names_the_missing_copy_folders(qdlm, tmp_path, data_dir):
    bare = tmp_path / "bare"
    bare.mkdir()
    for folder in data_dir.iterdir():
        if folder.name not in ("mbpp", "math"):
            (bare / folder.name).symlink_to(folder.resolve())
    with pytest.raises(census.CensusError) as err:
        census.census(qdlm, bare)
    msg = str(err.value)
    assert f"mbpp (mbpp): its offline copy {bare / 'mbpp'} is missing" in msg
    assert f"minerva_math (minerva_math): its offline copy {bare / 'math'} is missing" in msg


def test_only_the_copies_present_are_rendered_by_default(tmp_path, data_dir):
    """`fair-calib render-tasks` (write_offline_tasks' default) skips absent copies, names
    present ones."""
    assert {"mbpp", "minerva_math"} <= set(offline_data.available_offline_tasks(data_dir))
    bare = tmp_path / "bare"
    (bare / "gsm8k").mkdir(parents=True)
    assert offline_data.available_offline_tasks(bare) == ["gsm8k_cot", "gsm8k"]
