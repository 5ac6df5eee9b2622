"""The offline tasks render exactly the requests lm-eval's official tasks render for the same
rows (official YAMLs from the installed lm-eval, only the data source swapped), and the
conversions of the local copies give lm-eval's prompts."""
import json

import pytest

from fair_calib.evaluate import offline_data as od
from fair_calib.evaluate import run
from tiny_eval_helpers import base_settings

N_DOCS = 5
# task -> (official YAML inside lm_eval/tasks, rows of the first documents, eval split)
CASES = {
    "boolq": ("super_glue/boolq/default.yaml", lambda d: od.read_boolq(d), "validation"),
    "hellaswag": ("hellaswag/hellaswag.yaml", lambda d: od.read_hellaswag(d), "validation"),
    "piqa": ("piqa/piqa.yaml", lambda d: od.read_piqa(d), "validation"),
    "arc_easy": ("arc/arc_easy.yaml", lambda d: od.read_arc(d, "easy"), "test"),
    "arc_challenge": ("arc/arc_challenge.yaml", lambda d: od.read_arc(d, "challenge"), "test"),
    "winogrande": ("winogrande/default.yaml", lambda d: od.read_winogrande(d), "validation"),
    "truthfulqa_mc2": ("truthfulqa/truthfulqa_mc2.yaml", lambda d: od.read_truthfulqa(d), "validation"),
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _official_task(tmp_path, name, rel_yaml, rows, split_rows=None):
    """lm-eval's own task definition with the dataset swapped for ``rows`` in every split it
    may read, or ``split_rows[split]`` (so nothing else in the definition changes)."""
    from lm_eval.tasks import TaskManager

    folder = tmp_path / "official"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for split in ("train", "validation", "test", "dev"):
        files[split] = folder / f"{name}-{split}.jsonl"
        part = (split_rows or {}).get(split, rows)
        files[split].write_text("".join(json.dumps(r) + "\n" for r in part))
    splits = "".join(f"    {s}: {json.dumps(str(f))}\n" for s, f in files.items())
    (folder / f"{name}.yaml").write_text(
        f"include: {json.dumps(str(od._lm_eval_tasks_dir() / rel_yaml))}\ntask: {name}\n"
        f"dataset_path: json\ndataset_name: null\ndataset_kwargs:\n  data_files:\n{splits}")
    return TaskManager(include_path=str(tmp_path / "official"), include_defaults=False).load([name])["tasks"][name]


def _requests(task, n, shots=0):
    out = []
    for i, doc in enumerate(list(task.eval_docs)[:n]):
        ctx = task.fewshot_context(doc, shots)
        reqs = task.construct_requests(doc, ctx, metadata=(task.config.task, i, 1))
        out.append([r.args for r in (reqs if isinstance(reqs, list) else [reqs])])
    return out


@pytest.fixture(scope="module")
def offline_tasks(tmp_path_factory):
    from lm_eval.tasks import TaskManager

    from tiny_eval_helpers import data_dir

    if not data_dir().is_dir():
        pytest.skip(f"offline data directory {data_dir()} absent (set FAIR_CALIB_DATA_DIR)")
    tmp = tmp_path_factory.mktemp("offline")
    inc = od.write_offline_tasks(data_dir(), tmp / "cache", tmp / "tasks",
                                 list(CASES) + ["mmlu", "gsm8k_cot"])
    return TaskManager(include_path=str(inc), include_defaults=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_first_documents_render_as_lm_evals_task(offline_tasks, offline_data_dir, tmp_path, name):
    rel, read, split = CASES[name]
    ours = offline_tasks.load([name])["tasks"][name]
    official = _official_task(tmp_path, name, rel, read(offline_data_dir)[:N_DOCS])
    assert _requests(ours, N_DOCS) == _requests(official, N_DOCS)


def test_mmlu_five_shot_renders_as_lm_evals_task(offline_tasks, offline_data_dir, tmp_path):
    subject = "abstract_algebra"
    ours = offline_tasks.load(["mmlu"])["tasks"][f"mmlu_{subject}"]
    rows = od.read_mmlu(offline_data_dir, subject, "test")[:N_DOCS]
    dev = od.read_mmlu(offline_data_dir, subject, "dev")       # the few-shot pool (first_n)
    official = _official_task(tmp_path, f"mmlu_{subject}", f"mmlu/default/mmlu_{subject}.yaml",
                              rows, {"dev": dev})
    assert _requests(ours, N_DOCS, shots=5) == _requests(official, N_DOCS, shots=5)


def test_gsm8k_cot_renders_as_lm_evals_task(offline_tasks, offline_data_dir, tmp_path):
    ours = offline_tasks.load(["gsm8k_cot"])["tasks"]["gsm8k_cot"]
    official = _official_task(tmp_path, "gsm8k_cot", "gsm8k/gsm8k-cot.yaml",
                              od.read_gsm8k(offline_data_dir, "test")[:N_DOCS])
    assert _requests(ours, N_DOCS, shots=8) == _requests(official, N_DOCS, shots=8)


def test_conversions_give_lm_evals_prompts(offline_tasks, offline_data_dir):
    """What the copies hold, rendered by lm-eval: BoolQ without "Passage: " and "??", ARC and
    WinoGrande unchanged, HellaSwag with ctx_b capitalised and brackets stripped."""
    raw = od._read_jsonl(offline_data_dir / "boolq" / "validation.jsonl")[:N_DOCS]
    boolq = offline_tasks.load(["boolq"])["tasks"]["boolq"]
    for doc, r in zip(boolq.eval_docs, raw):
        assert boolq.doc_to_text(doc) == r["query"].removeprefix("Passage: ") + "\nAnswer:"
        assert not boolq.doc_to_text(doc).endswith("??\nAnswer:")
    raw = od._read_jsonl(offline_data_dir / "arc" / "arc_challenge_test.jsonl")[:N_DOCS]
    arc = offline_tasks.load(["arc_challenge"])["tasks"]["arc_challenge"]
    for doc, r in zip(arc.eval_docs, raw):
        assert (arc.doc_to_text(doc), arc.doc_to_choice(doc), arc.doc_to_target(doc)) == \
            (r["query"] + "\nAnswer:", r["choices"], r["gold"])
    raw = od._read_jsonl(offline_data_dir / "winogrande" / "dev.jsonl")
    wino = offline_tasks.load(["winogrande"])["tasks"]["winogrande"]
    for doc, r in zip(wino.eval_docs, raw):
        assert (wino.doc_to_text(doc), wino.doc_to_choice(doc), wino.doc_to_target(doc)) == \
            (r["gold"], r["context_options"], r["continuation"].strip())
    hs = offline_tasks.load(["hellaswag"])["tasks"]["hellaswag"]
    queries = [hs.doc_to_text(d) for d in hs.eval_docs]
    assert queries[0] == "Roof shingle removal: A man is sitting on a roof. He"
    assert not any("[" in q for q in queries)
    changed = sum(q != r["activity_label"] + ": " + (r["ctx_a"] + " " + r["ctx_b"]).strip()
                  for q, r in zip(queries, od.read_hellaswag(offline_data_dir)))
    assert 3000 < changed < 3600     # about a third of the 10042 (the ActivityNet items)


@pytest.mark.parametrize("name", ["winogrande", "arc_challenge"])
def test_offline_few_shot_without_train_split_fails_clearly(offline_data_dir, tmp_path, tiny_llada, name):
    task = {"name": name, "kind": "lm_eval", "offline": True, "limit": 1, "num_fewshot": 5}
    with pytest.raises(ValueError, match="`train` split"):
        run.evaluate(base_settings(task, data=offline_data_dir), None, None,
                     tmp_path / "x.parquet", loaded=tiny_llada)


def test_included_task_refuses_few_shot_from_the_eval_split(offline_tasks):
    """Through lm-eval's CLI (--include_path) too, never examples from the evaluation split."""
    wino = offline_tasks.load(["winogrande"])["tasks"]["winogrande"]
    with pytest.raises(ValueError, match="`train` split"):
        wino.fewshot_context(wino.eval_docs[0], 5)
