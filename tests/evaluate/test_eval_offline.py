"""Offline benchmark data: every format in the data directory parses with the right row counts,
and the rendered local YAMLs run through lm-eval on a tiny model (no network)."""
import os
from pathlib import Path

import pytest

from fair_calib.evaluate import offline_data as od
from fair_calib.evaluate import run
from tiny_eval_helpers import base_settings, make_loaded


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_every_offline_format_parses_with_right_row_counts(offline_data_dir):
    d = offline_data_dir
    counts = {"piqa": len(od.read_piqa(d)), "boolq": len(od.read_boolq(d)),
              "winogrande": len(od.read_winogrande(d)), "arc_easy": len(od.read_arc(d, "easy")),
              "arc_challenge": len(od.read_arc(d, "challenge")),
              "hellaswag": len(od.read_hellaswag(d)), "truthfulqa": len(od.read_truthfulqa(d)),
              "humaneval": len(od.read_humaneval(d)), "gsm8k_test": len(od.read_gsm8k(d, "test")),
              "gsm8k_train": len(od.read_gsm8k(d, "train"))}
    assert counts == {"piqa": 1838, "boolq": 3270, "winogrande": 1267, "arc_easy": 2376,
                      "arc_challenge": 1172, "hellaswag": 10042, "truthfulqa": 817,
                      "humaneval": 164, "gsm8k_test": 1319, "gsm8k_train": 7473}
    subjects = od.mmlu_subjects(d)
    assert len(subjects) == 57
    assert sum(len(od.read_mmlu(d, s, "test")) for s in subjects) == 14042
    assert sum(len(od.read_mmlu(d, s, "dev")) for s in subjects) == 285
    hs = od.read_hellaswag(d)
    assert all(len(r["endings"]) == 4 and r["label"] in "0123" for r in hs)
    tqa = od.read_truthfulqa(d)[0]
    assert len(tqa["mc2_targets"]["choices"]) == len(tqa["mc2_targets"]["labels"])
    assert set(od.read_piqa(d)[0]) == {"goal", "sol1", "sol2", "label"}
    mm = od.read_mmlu(d, "abstract_algebra")[0]
    assert mm["answer"] == 1 and len(mm["choices"]) == 4


def test_rendered_yamls_load_every_task_with_all_docs(offline_data_dir, tmp_path):
    from lm_eval.tasks import TaskManager

    inc = od.write_offline_tasks(offline_data_dir, tmp_path / "cache", tmp_path / "tasks")
    text = (inc / "piqa.yaml").read_text()
    assert str(tmp_path / "cache") in text and "@" not in text   # absolute, rendered
    tm = TaskManager(include_path=str(inc), include_defaults=False)
    expected = {"piqa": 1838, "boolq": 3270, "winogrande": 1267, "arc_easy": 2376,
                "arc_challenge": 1172, "hellaswag": 10042, "truthfulqa_mc2": 817,
                "humaneval": 164, "gsm8k_cot": 1319, "gsm8k": 1319, "mmlu": 14042}
    for name, n in expected.items():
        tasks = tm.load([name])["tasks"]
        assert sum(len(t.eval_docs) for t in tasks.values()) == n, name
        assert len(tasks) == (57 if name == "mmlu" else 1)
    wino = tm.load(["winogrande"])["tasks"]["winogrande"]
    doc = wino.eval_docs[0]
    assert wino.doc_to_text(doc) == int(doc["answer"]) - 1 and len(wino.doc_to_choice(doc)) == 2
    gsm = tm.load(["gsm8k_cot"])["tasks"]["gsm8k_cot"]
    assert gsm.get_config("num_fewshot") == 8 and gsm.doc_to_target(gsm.eval_docs[0]) == "18"
    plain = tm.load(["gsm8k"])["tasks"]["gsm8k"]            # lm-eval's 5-shot, train pool
    assert plain.get_config("num_fewshot") == 5 and len(plain.fewshot_docs()) == 7473


@pytest.mark.parametrize("name,shots", [("arc_easy", 0), ("winogrande", 0), ("truthfulqa_mc2", 0),
                                        ("hellaswag", 0), ("mmlu", 5)])
def test_offline_mc_benchmarks_run_on_tiny_model(offline_data_dir, tmp_path, tiny_llada, name, shots):
    task = {"name": name, "kind": "lm_eval", "lm_eval_task": name, "offline": True, "limit": 2,
            "num_fewshot": shots, "mc_num": 2, "batch_size": 2}
    if name == "mmlu":
        task["limit"] = 1
    settings = base_settings(task, data=offline_data_dir)
    df = run.evaluate(settings, None, None, tmp_path / f"{name}.parquet", loaded=tiny_llada)
    row = df.set_index("metric").loc["acc,none"]
    assert row["n"] == (57 if name == "mmlu" else 2)
    assert 0.0 <= row["value"] <= 1.0
    chance = {"arc_easy": 0.25, "winogrande": 0.5, "hellaswag": 0.25, "mmlu": 0.25}
    if name in chance:
        assert row["chance"] == pytest.approx(chance[name])
    else:   # truthfulqa_mc2: true answers / all answers of the first two questions
        rows = od.read_truthfulqa(offline_data_dir)[:2]
        ref = sum(sum(r["mc2_targets"]["labels"]) / len(r["mc2_targets"]["labels"]) for r in rows) / 2
        assert row["chance"] == pytest.approx(ref)


def test_offline_gsm8k_cot_generates(offline_data_dir, tmp_path):
    task = {"name": "gsm8k_cot", "kind": "lm_eval", "offline": True, "limit": 1,
            "gen_length": 8, "steps": 8, "block_length": 8, "batch_size": 1}
    settings = base_settings(task, data=offline_data_dir)
    # the 8-shot prompt (610 tokens here) is never cut: a model that takes it
    loaded = make_loaded("tiny-llada", max_positions=1024)
    df = run.evaluate(settings, None, None, tmp_path / "g.parquet", loaded=loaded)
    m = df.set_index("metric")
    assert set(m.index) == {"exact_match,strict-match", "exact_match,flexible-extract"}
    assert (m["n"] == 1).all() and (m["chance"] == 0).all()


def test_humaneval_needs_explicit_opt_in(offline_data_dir, tmp_path, tiny_llada):
    task = {"name": "humaneval", "kind": "lm_eval", "offline": True, "limit": 1,
            "gen_length": 8, "steps": 8, "block_length": 8}
    settings = base_settings(task, data=offline_data_dir)
    with pytest.raises(PermissionError, match="task.allow_code_execution"):
        run.evaluate(settings, None, None, tmp_path / "h.parquet", loaded=tiny_llada)
    assert not (tmp_path / "h.parquet").exists()
    before = os.environ.get("HF_ALLOW_CODE_EVAL")
    settings["task"]["allow_code_execution"] = True
    df = run.evaluate(settings, None, None, tmp_path / "h.parquet", loaded=tiny_llada)
    assert os.environ.get("HF_ALLOW_CODE_EVAL") == before          # restored after the job
    row = df.set_index("metric").loc["pass@1,create_test"]          # lm-eval's key
    assert row["n"] == 1 and row["value"] == 0.0     # 8 random tokens never pass the tests


def test_pass_at_k_executes_programs(offline_data_dir, monkeypatch, tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("fc_task_utils", od.TEMPLATE_DIR / "fc_task_utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    doc = od.read_humaneval(offline_data_dir)[0]
    ref = doc["test"] + f"\ncheck({doc['entry_point']})"
    good = doc["prompt"] + doc["canonical_solution"]
    bad = doc["prompt"] + "    return False\n"
    monkeypatch.delenv("HF_ALLOW_CODE_EVAL", raising=False)
    with pytest.raises(PermissionError):
        utils.pass_at_k([ref], [[good]], k=[1])
    monkeypatch.setenv("HF_ALLOW_CODE_EVAL", "1")
    assert utils.pass_at_k([ref, ref], [[good], [bad]], k=[1]) == {"pass@1": 0.5}


def test_offline_humaneval_instruct_is_lm_evals(offline_data_dir, tmp_path):
    """Its prompt, answer opening and filter are lm-eval's humaneval_instruct.yaml's."""
    import lm_eval.tasks
    import yaml
    from lm_eval.tasks import TaskManager

    inc = od.write_offline_tasks(offline_data_dir, tmp_path / "cache", tmp_path / "tasks",
                                 ["humaneval_instruct"])
    task = TaskManager(include_path=str(inc), include_defaults=False).load(
        ["humaneval_instruct"])["tasks"]["humaneval_instruct"]
    loader = type("L", (yaml.SafeLoader,), {})
    loader.add_multi_constructor("!", lambda _, suffix, node: suffix)
    own = yaml.load((Path(lm_eval.tasks.__file__).parent / "humaneval" /
                     "humaneval_instruct.yaml").read_text(), Loader=loader)
    assert len(task.eval_docs) == 164 and task.config.unsafe_code
    assert (task.config.doc_to_text, task.config.gen_prefix) == (own["doc_to_text"],
                                                                 own["gen_prefix"])
    doc = task.eval_docs[0]
    pred = rendered_task_utils(inc).build_predictions_instruct([["    return 1\n```\nmore"]], [doc])
    assert pred == [[doc["prompt"] + "    return 1\n"]]


def rendered_task_utils(inc):
    import importlib.util

    spec = importlib.util.spec_from_file_location("fc_task_utils", inc / "fc_task_utils.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
