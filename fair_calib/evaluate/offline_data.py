"""Offline benchmark data: parse the local copies in ``data_dir`` and write lm-eval task YAMLs.

The data directory (``/work/shared/data`` style, see its README) holds plain copies of public
data sets in their original or lightly converted formats. Formats that lm-eval's ``json``
loader cannot read as they are (PIQA's separate label file, HellaSwag's 6-line bz2 text,
TruthfulQA's ``mc_task.json``, MMLU's headerless CSVs, gzipped HumanEval) are converted here to
jsonl in a cache folder *outside* the repository's tracked files. Formats that are already jsonl
(BoolQ, ARC, WinoGrande, GSM8K) are read in place.

:func:`write_offline_tasks` then renders the packaged YAML templates
(``fair_calib/evaluate/tasks/*.yaml``, with ``@NAME@`` placeholders) into an include folder with ABSOLUTE ``data_files``
paths, for ``TaskManager(include_path=..., include_defaults=False)``.
"""
from __future__ import annotations

import bz2
import csv
import gzip
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterable

TEMPLATE_DIR = Path(__file__).resolve().parent / "tasks"

# The ten benchmarks of the paper, and the variants the shipped configs run (gsm8k, the LLaDA
# authors' Base recipe; humaneval_instruct, QDLM's Dream-Instruct), under lm-eval's names.
OFFLINE_TASKS = ("piqa", "boolq", "winogrande", "arc_easy", "arc_challenge", "hellaswag",
                 "truthfulqa_mc2", "mmlu", "humaneval", "gsm8k_cot", "gsm8k",
                 "humaneval_instruct", "mbpp", "minerva_math")

MMLU_CATEGORIES_FILE = "mmlu_subjects.json"

# lm-eval's own task files (inside the installed package) that the offline YAMLs include, so
# prompts, choices, targets and document processing are lm-eval's, not copies of them.
OFFICIAL_YAMLS = {"GSM8K_COT_YAML": "gsm8k/gsm8k-cot.yaml", "GSM8K_YAML": "gsm8k/gsm8k.yaml", "BOOLQ_YAML": "super_glue/boolq/default.yaml",
                  "HELLASWAG_YAML": "hellaswag/hellaswag.yaml", "PIQA_YAML": "piqa/piqa.yaml",
                  "ARC_EASY_YAML": "arc/arc_easy.yaml", "ARC_CHALLENGE_YAML": "arc/arc_challenge.yaml",
                  "WINOGRANDE_YAML": "winogrande/default.yaml"}

# MBPP's original release (mbpp.jsonl) split by task_id as the hub's google-research-datasets/mbpp
# "full" config splits it (inclusive ranges).
MBPP_SPLITS = {"prompt": (1, 10), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
# lm-eval's minerva_math subject tasks (suffix) -> the Hendrycks MATH release's subject folder,
# which is also EleutherAI/hendrycks_math's config name (lm-eval's dataset_name).
MINERVA_SUBJECTS = {"algebra": "algebra", "counting_and_prob": "counting_and_probability",
                    "geometry": "geometry", "intermediate_algebra": "intermediate_algebra",
                    "num_theory": "number_theory", "prealgebra": "prealgebra",
                    "precalc": "precalculus"}

# lm-eval draws these tasks' few-shot examples from `train`, which the offline copies lack
# (they hold the evaluation split only): offline they run 0-shot, or fail saying so.
NO_OFFLINE_FEWSHOT_POOL = ("piqa", "boolq", "winogrande", "arc_easy", "arc_challenge", "hellaswag")


def check_offline_fewshot(task: str, num_fewshot: int | None) -> None:
    """Refuse k-shot offline where the copy has no `train` split (never draw from the eval set)."""
    if num_fewshot and task in NO_OFFLINE_FEWSHOT_POOL:
        raise ValueError(
            f"{task}: {num_fewshot}-shot needs lm-eval's few-shot pool, the `train` split, which "
            f"the offline data copy (data_dir / FAIR_CALIB_DATA_DIR) does not have; run it with "
            f"data_source: hub (or task offline: false), or 0-shot")


def default_data_dir() -> Path:
    """``$FAIR_CALIB_DATA_DIR`` or ``../shared/data`` relative to the repository root."""
    env = os.environ.get("FAIR_CALIB_DATA_DIR")
    if env:
        return Path(env).resolve()
    repo_root = Path(__file__).resolve().parents[2]
    return (repo_root.parent / "shared" / "data").resolve()


# ----------------------------------------------------------------------------- readers
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_piqa(data_dir: Path) -> list[dict[str, Any]]:
    rows = _read_jsonl(Path(data_dir) / "piqa" / "valid.jsonl")
    labels = [int(x) for x in (Path(data_dir) / "piqa" / "valid-labels.lst").read_text().split()]
    if len(labels) != len(rows):
        raise ValueError(f"piqa: {len(rows)} rows but {len(labels)} labels")
    return [{"goal": r["goal"], "sol1": r["sol1"], "sol2": r["sol2"], "label": lab}
            for r, lab in zip(rows, labels)]


def read_boolq(data_dir: Path) -> list[dict[str, Any]]:
    """The converted copy (``Passage: P\nQuestion: Q?``) -> SuperGLUE rows ``{passage,
    question, label}``. The copy lost each passage's ``Title -- `` prefix, which lm-eval's
    prompt shows: the offline prompt lacks it (``data_source: hub`` has it)."""
    out = []
    for r in _read_jsonl(Path(data_dir) / "boolq" / "validation.jsonl"):
        passage, question = r["query"].rsplit("\nQuestion: ", 1)
        out.append({"passage": passage.removeprefix("Passage: "),
                    "question": question.removesuffix("?"), "label": int(r["gold"])})
    return out


def read_winogrande(data_dir: Path) -> list[dict[str, Any]]:
    """The converted copy (two partial contexts, one continuation) -> WinoGrande rows
    ``{sentence, option1, option2, answer}``. The options are the contexts' differing tails;
    lm-eval's prompt only ever joins ``sentence[:blank] + option``, so any split point gives
    its exact requests."""
    out = []
    for r in _read_jsonl(Path(data_dir) / "winogrande" / "dev.jsonl"):
        a, b = r["context_options"]
        n = len(os.path.commonprefix([a, b]))
        out.append({"sentence": a[:n] + "_ " + r["continuation"], "option1": a[n:],
                    "option2": b[n:], "answer": str(int(r["gold"]) + 1)})
    return out


def read_arc(data_dir: Path, subset: str) -> list[dict[str, Any]]:
    """The converted copy -> ai2_arc rows ``{question, choices: {text, label}, answerKey}``."""
    if subset not in ("easy", "challenge"):
        raise ValueError(f"arc subset must be easy|challenge, got {subset!r}")
    out = []
    for r in _read_jsonl(Path(data_dir) / "arc" / f"arc_{subset}_test.jsonl"):
        labels = [chr(ord("A") + i) for i in range(len(r["choices"]))]
        out.append({"question": r["query"].removeprefix("Question: "),
                    "choices": {"text": list(r["choices"]), "label": labels},
                    "answerKey": labels[int(r["gold"])]})
    return out


_SENTENCE_END = re.compile(r"[.!?] +(?=[^ ])")


def split_hellaswag_context(ctx: str) -> tuple[str, str]:
    """``(ctx_a, ctx_b)`` from the copy's flattened ``ctx_a + " " + ctx_b``. HellaSwag's
    ActivityNet items end in a sentence fragment that starts in lower case (``ctx_b``, which
    lm-eval capitalises); WikiHow items have ``ctx_b`` empty. The copy no longer marks the
    boundary: the fragment after the last sentence end, when it starts in lower case, is taken
    as ``ctx_b`` (an approximation; ``data_source: hub`` reads the real fields)."""
    ends = list(_SENTENCE_END.finditer(ctx))
    start = ends[-1].end() if ends else 0
    tail = ctx[start:]
    if tail[:1].islower():
        return ctx[:start].rstrip(), tail
    return ctx, ""


def read_hellaswag(data_dir: Path) -> list[dict[str, Any]]:
    """6 lines an item (``label: ctx``, the gold index, 4 endings) -> Rowan/hellaswag rows
    ``{activity_label, ctx_a, ctx_b, endings, label}`` for lm-eval's own ``process_docs``."""
    path = Path(data_dir) / "hellaswag" / "hellaswag_val_full.txt.bz2"
    with bz2.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    if len(lines) % 6:
        raise ValueError(f"hellaswag: {len(lines)} lines is not a multiple of 6")
    out = []
    for i in range(0, len(lines), 6):
        activity, _, ctx = lines[i].partition(": ")
        ctx_a, ctx_b = split_hellaswag_context(ctx)
        out.append({"activity_label": activity, "ctx_a": ctx_a, "ctx_b": ctx_b,
                    "endings": lines[i + 2:i + 6], "label": str(int(lines[i + 1].strip()))})
    return out


def read_truthfulqa(data_dir: Path) -> list[dict[str, Any]]:
    """``mc_task.json`` -> the HF ``truthful_qa/multiple_choice`` row layout."""
    items = json.loads((Path(data_dir) / "truthfulqa" / "mc_task.json").read_text())

    def targets(d: dict[str, int]) -> dict[str, list]:
        return {"choices": list(d.keys()), "labels": [int(v) for v in d.values()]}

    return [{"question": it["question"], "mc1_targets": targets(it["mc1_targets"]),
             "mc2_targets": targets(it["mc2_targets"])} for it in items]


def mmlu_subjects(data_dir: Path) -> list[str]:
    return sorted(p.name[: -len("_test.csv")] for p in (Path(data_dir) / "mmlu" / "test").glob("*_test.csv"))


def read_mmlu(data_dir: Path, subject: str, split: str = "test") -> list[dict[str, Any]]:
    """Headerless CSV (question, A, B, C, D, answer letter) -> cais/mmlu rows."""
    path = Path(data_dir) / "mmlu" / split / f"{subject}_{split}.csv"
    out = []
    with open(path, newline="", encoding="utf-8") as fh:
        for rec in csv.reader(fh):
            if len(rec) != 6:
                raise ValueError(f"{path}: expected 6 columns, got {len(rec)}")
            out.append({"question": rec[0], "subject": subject, "choices": rec[1:5],
                        "answer": "ABCD".index(rec[5].strip())})
    return out


def read_humaneval(data_dir: Path) -> list[dict[str, Any]]:
    return _read_jsonl(Path(data_dir) / "humaneval" / "HumanEval.jsonl.gz")


def read_gsm8k(data_dir: Path, split: str = "test") -> list[dict[str, Any]]:
    return _read_jsonl(Path(data_dir) / "gsm8k" / f"{split}.jsonl")


def read_mbpp(data_dir: Path, split: str = "test") -> list[dict[str, Any]]:
    """Rows of the hub's ``full`` config split ``split`` from the original ``mbpp.jsonl``."""
    lo, hi = MBPP_SPLITS[split]
    rows = _read_jsonl(Path(data_dir) / "mbpp" / "mbpp.jsonl")
    return [r for r in rows if lo <= int(r["task_id"]) <= hi]


def read_math(data_dir: Path, subject: str, split: str = "test") -> list[dict[str, Any]]:
    """One subject folder of the Hendrycks MATH release (``<n>.json`` a problem) -> the rows
    of EleutherAI/hendrycks_math (problem, level, type, solution), in the order of ``n``."""
    folder = Path(data_dir) / "math" / split / subject
    files = sorted(folder.glob("*.json"), key=lambda p: (len(p.stem), p.stem))
    if not files:
        raise FileNotFoundError(f"no MATH problems under {folder} (docs/data.md)")
    keys = ("problem", "level", "type", "solution")
    return [{k: d[k] for k in keys} for d in (json.loads(f.read_text(encoding="utf-8")) for f in files)]


# ----------------------------------------------------------------------------- cache
def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        for r in rows:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _cached(cache_dir: Path, rel: str, make) -> Path:
    path = Path(cache_dir) / rel
    if not path.exists():
        _write_jsonl(path, make())
    return path.resolve()


def prepare_offline_data(data_dir: str | os.PathLike, cache_dir: str | os.PathLike,
                         tasks: Iterable[str] = OFFLINE_TASKS) -> dict[str, str]:
    """Convert what needs converting into ``cache_dir``; return template substitutions
    (``@NAME@`` -> absolute path) for the requested tasks."""
    data_dir = Path(data_dir).resolve()
    cache_dir = Path(cache_dir).resolve()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"offline data directory {data_dir} does not exist "
                                f"(set data_dir in the config to the offline copies, docs/data.md)")
    subs: dict[str, str] = {}
    tasks = set(tasks)
    if "piqa" in tasks:
        subs["PIQA"] = str(_cached(cache_dir, "piqa/validation.jsonl", lambda: read_piqa(data_dir)))
    if "boolq" in tasks:
        subs["BOOLQ"] = str(_cached(cache_dir, "boolq/validation.jsonl", lambda: read_boolq(data_dir)))
    if "winogrande" in tasks:
        subs["WINOGRANDE"] = str(_cached(cache_dir, "winogrande/validation.jsonl",
                                         lambda: read_winogrande(data_dir)))
    if "arc_easy" in tasks:
        subs["ARC_EASY"] = str(_cached(cache_dir, "arc/easy_test.jsonl",
                                       lambda: read_arc(data_dir, "easy")))
    if "arc_challenge" in tasks:
        subs["ARC_CHALLENGE"] = str(_cached(cache_dir, "arc/challenge_test.jsonl",
                                            lambda: read_arc(data_dir, "challenge")))
    if "hellaswag" in tasks:
        subs["HELLASWAG"] = str(_cached(cache_dir, "hellaswag/validation.jsonl",
                                        lambda: read_hellaswag(data_dir)))
    if "truthfulqa_mc2" in tasks:
        subs["TRUTHFULQA"] = str(_cached(cache_dir, "truthfulqa/validation.jsonl",
                                         lambda: read_truthfulqa(data_dir)))
    if "mmlu" in tasks:
        for subject in mmlu_subjects(data_dir):
            for split in ("test", "dev"):
                _cached(cache_dir, f"mmlu/{split}/{subject}.jsonl",
                        lambda s=subject, sp=split: read_mmlu(data_dir, s, sp))
        subs["MMLU"] = str(cache_dir / "mmlu")
    if "humaneval" in tasks:
        subs["HUMANEVAL"] = str(_cached(cache_dir, "humaneval/test.jsonl",
                                        lambda: read_humaneval(data_dir)))
    if "gsm8k_cot" in tasks or "gsm8k" in tasks:
        subs["GSM8K_TEST"] = str(data_dir / "gsm8k" / "test.jsonl")
        subs["GSM8K_TRAIN"] = str(data_dir / "gsm8k" / "train.jsonl")
    if "mbpp" in tasks:
        for split in ("test", "prompt"):
            subs[f"MBPP_{split.upper()}"] = str(_cached(cache_dir, f"mbpp/{split}.jsonl",
                                                        lambda sp=split: read_mbpp(data_dir, sp)))
    if "minerva_math" in tasks:
        for subject in MINERVA_SUBJECTS.values():
            for split in ("test", "train"):
                _cached(cache_dir, f"math/{split}/{subject}.jsonl",
                        lambda s=subject, sp=split: read_math(data_dir, s, sp))
        subs["MATH"] = str(cache_dir / "math")
    return subs


def _lm_eval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).resolve().parent


def _render(template: str, subs: dict[str, str]) -> str:
    for key, val in subs.items():
        template = template.replace(f"@{key}@", json.dumps(val))  # quoted, YAML-safe
    leftovers = sorted(set(re.findall(r"@([A-Z_]+)@", template)))
    if leftovers:
        raise KeyError(f"unsubstituted template placeholders: {leftovers}")
    return template


def available_offline_tasks(data_dir: str | os.PathLike) -> list[str]:
    """The offline tasks whose copy folders ``data_dir`` holds (MBPP's and MATH's are the
    user's to add, docs/data.md)."""
    return [t for t in OFFLINE_TASKS if (Path(data_dir) / TASK_DATA[t]).exists()]


def write_offline_tasks(data_dir: str | os.PathLike, cache_dir: str | os.PathLike,
                        include_dir: str | os.PathLike,
                        tasks: Iterable[str] | None = None, stand_ins: bool = False) -> Path:
    """Render offline YAMLs for ``tasks`` (standard lm-eval names; default: those whose copies
    ``data_dir`` holds) into ``include_dir``; ``stand_ins`` (the census only): a copy without
    the few-shot pool draws its examples from its evaluation split (:func:`census_stand_ins`)."""
    tasks = list(available_offline_tasks(data_dir) if tasks is None else tasks)
    unknown = [t for t in tasks if t not in OFFLINE_TASKS]
    if unknown:
        raise KeyError(f"no offline definition for tasks {unknown}; offline tasks: {list(OFFLINE_TASKS)}")
    include_dir = Path(include_dir).resolve()
    include_dir.mkdir(parents=True, exist_ok=True)
    subs = prepare_offline_data(data_dir, cache_dir, tasks)
    subs.update({key: str(_lm_eval_tasks_dir() / rel) for key, rel in OFFICIAL_YAMLS.items()})
    shutil.copy(TEMPLATE_DIR / "fc_task_utils.py", include_dir / "fc_task_utils.py")
    if "humaneval_instruct" in tasks and "humaneval" not in tasks:
        tasks.append("humaneval")                  # humaneval_instruct.yaml includes it
        subs.update(prepare_offline_data(data_dir, cache_dir, ["humaneval"]))
    for task in tasks:
        if task == "mmlu":
            _write_mmlu(Path(data_dir), Path(subs["MMLU"]), include_dir)
            continue
        if task == "minerva_math":
            _write_minerva_math(Path(subs["MATH"]), include_dir)
            continue
        text = _render((TEMPLATE_DIR / f"{task}.yaml").read_text(), subs)
        if stand_ins and task in NO_OFFLINE_FEWSHOT_POOL:
            text = _eval_split_shots(text)
        (include_dir / f"{task}.yaml").write_text(text)
    return include_dir


def _eval_split_shots(text: str) -> str:
    """A rendered offline YAML whose few-shot examples come from its evaluation split."""
    split = re.search(r"^(?:validation|test)_split: (\w+)$", text, re.M).group(1)
    return text.replace("fewshot_config:\n  sampler: !function fc_task_utils.NoFewshotPool",
                        f"fewshot_split: {split}\nfewshot_config:\n  sampler: default")


# ----------------------------------------------------------------------------- the census
def census_refusal(task: str, data_dir: str | os.PathLike) -> str | None:
    """Why the census (which reads the offline copies only) cannot count lm-eval task
    ``task``: no offline definition of it, or its data folder missing; None if it can."""
    if task not in OFFLINE_TASKS and task not in RECIPE_TASKS:
        return (f"no offline definition; the census reads the offline copies, never the hub "
                f"(offline: {', '.join(OFFLINE_TASKS + tuple(RECIPE_TASKS))})")
    folder = Path(data_dir) / TASK_DATA[task]
    if not folder.exists():
        return f"its offline copy {folder} is missing (docs/data.md)"
    return None


def census_stand_ins(task: str, num_fewshot: int | None, data_dir: str | os.PathLike) -> list[str]:
    """The stand-ins the census counts ``task`` on where the offline copies lack a split."""
    out = []
    if num_fewshot and task in NO_OFFLINE_FEWSHOT_POOL:
        out.append(f"{num_fewshot}-shot examples drawn from the evaluation split (the copy has "
                   f"no train split)")
    if task in ARC_DEV_FILES and not (Path(data_dir) / ARC_DEV_FILES[task]).is_file():
        out.append(f"ARC's test split counted for its dev split ({ARC_DEV_FILES[task]} missing)")
    return out


def _write_mmlu(data_dir: Path, mmlu_cache: Path, include_dir: Path) -> None:
    """57 subject tasks ``mmlu_{subject}`` (lm-eval's prompt, 5-shot from dev) + group ``mmlu``."""
    template = (TEMPLATE_DIR / "mmlu_subject.yaml").read_text()
    subjects = mmlu_subjects(data_dir)
    if not subjects:
        raise FileNotFoundError(f"no MMLU subjects under {data_dir / 'mmlu' / 'test'}")
    sub_dir = include_dir / "mmlu"
    sub_dir.mkdir(exist_ok=True)
    for s in subjects:
        subs = {"SUBJECT_TASK": f"mmlu_{s}", "SUBJECT_ALIAS": s,
                "DESCRIPTION": f"The following are multiple choice questions (with answers) about "
                               f"{s.replace('_', ' ')}.\n\n",
                "TEST": str(mmlu_cache / "test" / f"{s}.jsonl"),
                "DEV": str(mmlu_cache / "dev" / f"{s}.jsonl")}
        (sub_dir / f"mmlu_{s}.yaml").write_text(_render(template, subs))
    group = {"group": "mmlu", "task": [f"mmlu_{s}" for s in subjects],
             "aggregate_metric_list": [{"metric": "acc", "weight_by_size": True}],
             "metadata": {"version": 2}}
    (include_dir / "mmlu_group.yaml").write_text(json.dumps(group, indent=1))


def _write_minerva_math(math_cache: Path, include_dir: Path) -> None:
    """lm-eval's 7 subject tasks (its own YAMLs included: prompt, fixed 4 few-shot examples,
    answer extraction, metrics) over the converted copy, and its group ``minerva_math``."""
    template = (TEMPLATE_DIR / "minerva_math_subject.yaml").read_text()
    lm_eval_dir = _lm_eval_tasks_dir() / "minerva_math"
    sub_dir = include_dir / "minerva_math"
    sub_dir.mkdir(exist_ok=True)
    for suffix, subject in MINERVA_SUBJECTS.items():
        task = f"minerva_math_{suffix}"
        subs = {"MINERVA_YAML": str(lm_eval_dir / f"{task}.yaml"),
                "TEST": str(math_cache / "test" / f"{subject}.jsonl"),
                "TRAIN": str(math_cache / "train" / f"{subject}.jsonl")}
        (sub_dir / f"{task}.yaml").write_text(_render(template, subs))
    # lm-eval's benchmarks/minerva_math.yaml, which include_defaults=False does not index
    group = _lm_eval_group("benchmarks/minerva_math.yaml")
    (include_dir / "minerva_math_group.yaml").write_text(json.dumps(group, indent=1))


def _lm_eval_group(rel: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((_lm_eval_tasks_dir() / rel).read_text())


SYNTHETIC_TASKS = {"synth_mc": "synth_mc.jsonl", "synth_gen": "synth_gen.jsonl",
                   "synth_copy": "synth_gen.jsonl"}   # the bench's copy items (corpus.gen_kind)


def write_synthetic_tasks(synthetic_dir: str | os.PathLike, include_dir: str | os.PathLike,
                          tasks: Iterable[str] = tuple(SYNTHETIC_TASKS)) -> Path:
    """Render the embedded synthetic tasks (``{synthetic_dir}/synth_*.jsonl``) into ``include_dir``."""
    include_dir = Path(include_dir).resolve()
    include_dir.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        if task not in SYNTHETIC_TASKS:
            raise KeyError(f"unknown synthetic task {task!r}; known: {sorted(SYNTHETIC_TASKS)}")
        data = (Path(synthetic_dir) / SYNTHETIC_TASKS[task]).resolve()
        if not data.exists():
            raise FileNotFoundError(f"{data} missing: run `fair-calib make-data` first")
        text = (TEMPLATE_DIR / f"{task}.yaml").read_text()
        (include_dir / f"{task}.yaml").write_text(_render(text, {task.upper(): str(data)}))
    return include_dir


# ----------------------------------------------------------------------------- OpenCompass
# The generative OpenCompass recipes of the LLaDA authors' Instruct evaluation (tasks/oc_*.yaml),
# read from the hub (data_source: hub) or from the local copies. name -> (hub dataset path,
# hub config name, hub split).
OC_TASKS = {
    "oc_arc_c_gen": ("allenai/ai2_arc", "ARC-Challenge", "validation"),
    "oc_hellaswag_gen": ("Rowan/hellaswag", None, "validation"),
    "oc_mmlu_gen": ("cais/mmlu", None, "test"),
    "oc_gsm8k_gen": ("openai/gsm8k", "main", "test"),
    "oc_humaneval_gen": ("openai/openai_humaneval", None, "test"),
    # OpenCompass's generative configs of the benchmarks LLaDA's repository has no recipe for
    "oc_piqa_gen": ("baber/piqa", None, "validation"),
    "oc_boolq_gen": ("aps/super_glue", "boolq", "validation"),
    "oc_winogrande_gen": ("allenai/winogrande", "winogrande_xl", "validation"),
    "oc_arc_e_gen": ("allenai/ai2_arc", "ARC-Easy", "validation"),
}
# mmlu_gen_a484b3's subjects (its mmlu_all_sets); the reported MMLU is their plain mean.
OC_MMLU_SUBJECTS = (
    "college_biology", "college_chemistry", "college_computer_science", "college_mathematics",
    "college_physics", "electrical_engineering", "astronomy", "anatomy", "abstract_algebra",
    "machine_learning", "clinical_knowledge", "global_facts", "management", "nutrition",
    "marketing", "professional_accounting", "high_school_geography", "international_law",
    "moral_scenarios", "computer_security", "high_school_microeconomics", "professional_law",
    "medical_genetics", "professional_psychology", "jurisprudence", "world_religions",
    "philosophy", "virology", "high_school_chemistry", "public_relations",
    "high_school_macroeconomics", "human_sexuality", "elementary_mathematics",
    "high_school_physics", "high_school_computer_science", "high_school_european_history",
    "business_ethics", "moral_disputes", "high_school_statistics", "miscellaneous",
    "formal_logic", "high_school_government_and_politics", "prehistory", "security_studies",
    "high_school_biology", "logical_fallacies", "high_school_world_history",
    "professional_medicine", "high_school_mathematics", "college_medicine",
    "high_school_us_history", "sociology", "econometrics", "high_school_psychology",
    "human_aging", "us_foreign_policy", "conceptual_physics")
# ARC-Challenge's dev split as AI2 ships it (ARC-V1-Feb2018: ARC-Challenge-Dev.jsonl), the file
# OpenCompass's ARCDataset reads; the offline copies hold the test split only.
ARC_DEV_FILE = "arc/ARC-Challenge-Dev.jsonl"
ARC_DEV_FILES = {"oc_arc_c_gen": ARC_DEV_FILE, "oc_arc_e_gen": "arc/ARC-Easy-Dev.jsonl"}


def read_arc_dev(data_dir: Path, task: str = "oc_arc_c_gen") -> list[dict[str, Any]]:
    """AI2's ARC jsonl (``question: {stem, choices: [{text, label}]}``) -> the hub rows."""
    path = Path(data_dir) / ARC_DEV_FILES[task]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} missing: {task} (OpenCompass's ARC config) scores the dev split, which the "
            f"offline copies lack; put AI2's {path.name} there or run with data_source: hub "
            f"(allenai/ai2_arc, validation)")
    return [{"id": r.get("id", ""), "question": r["question"]["stem"],
             "choices": {"text": [c["text"] for c in r["question"]["choices"]],
                         "label": [c["label"] for c in r["question"]["choices"]]},
             "answerKey": r["answerKey"]} for r in _read_jsonl(path)]


def _local_json(path: str | Path, split: str = "test") -> dict[str, Any]:
    return {"DATASET_PATH": "json", "DATASET_NAME": None,
            "DATASET_KWARGS": {"data_files": {split: str(path)}}, "TEST_SPLIT": split}


def oc_task_sources(name: str, offline: bool, data_dir: str | os.PathLike | None,
                    cache_dir: str | os.PathLike, stand_ins: bool = False) -> dict[str, Any]:
    """The dataset lines of an OpenCompass task's YAML: the hub's rows, or local copies
    converted to them (the task's ``process_docs`` then gives OpenCompass's columns);
    ``stand_ins`` (the census only): ARC's test split where its dev split is missing."""
    path, config, split = OC_TASKS[name]
    if not offline:
        return {"DATASET_PATH": path, "DATASET_NAME": config, "DATASET_KWARGS": None,
                "TEST_SPLIT": split}
    data_dir, cache_dir = Path(data_dir).resolve(), Path(cache_dir).resolve()
    if name in ARC_DEV_FILES:
        if stand_ins and not (data_dir / ARC_DEV_FILES[name]).is_file():
            subset = "challenge" if name == "oc_arc_c_gen" else "easy"
            return _local_json(_cached(cache_dir, f"arc/{name}_test_stand_in.jsonl",
                                       lambda: read_arc(data_dir, subset)))
        return _local_json(_cached(cache_dir, f"arc/{name}_dev.jsonl",
                                   lambda: read_arc_dev(data_dir, name)))
    if name in ("oc_piqa_gen", "oc_boolq_gen", "oc_winogrande_gen"):
        key = name[3:-4]
        return _local_json(prepare_offline_data(data_dir, cache_dir, [key])[key.upper()])
    if name == "oc_hellaswag_gen":
        return _local_json(prepare_offline_data(data_dir, cache_dir, ["hellaswag"])["HELLASWAG"])
    if name == "oc_gsm8k_gen":
        return _local_json(data_dir / "gsm8k" / "test.jsonl")
    if name == "oc_humaneval_gen":
        return _local_json(prepare_offline_data(data_dir, cache_dir, ["humaneval"])["HUMANEVAL"])
    raise KeyError(name)


def write_oc_tasks(include_dir: str | os.PathLike, names: Iterable[str], offline: bool,
                   data_dir: str | os.PathLike | None, cache_dir: str | os.PathLike,
                   stand_ins: bool = False) -> Path:
    """Render the OpenCompass recipe tasks ``names`` (``OC_TASKS``) into ``include_dir``."""
    include_dir = Path(include_dir).resolve()
    include_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(TEMPLATE_DIR / "fc_task_utils.py", include_dir / "fc_task_utils.py")
    for name in names:
        if name not in OC_TASKS:
            raise KeyError(f"no OpenCompass recipe task {name!r}; known: {sorted(OC_TASKS)}")
        if name == "oc_mmlu_gen":
            _write_oc_mmlu(include_dir, offline, data_dir, cache_dir)
            continue
        text = (TEMPLATE_DIR / f"{name}.yaml").read_text()
        subs = oc_task_sources(name, offline, data_dir, cache_dir, stand_ins)
        (include_dir / f"{name}.yaml").write_text(_render(text, subs))
    return include_dir


def oc_mmlu_subject_yaml(subject: str, data: dict[str, Any]) -> str:
    """Task ``oc_mmlu_gen_<subject>``: mmlu_gen_a484b3's hint and templates for ``subject``
    over the dataset lines ``data`` (``DATASET_PATH``, ``DATASET_NAME``, ``DATASET_KWARGS``)."""
    hint = (f"There is a single choice question about {subject.replace('_', ' ')}. Answer the "
            f"question by replying A, B, C or D.")
    options = "\nA. {{A}}\nB. {{B}}\nC. {{C}}\nD. {{D}}\n"
    subs = {"SUBJECT_TASK": f"oc_mmlu_gen_{subject}", "SUBJECT_ALIAS": subject,
            "DOC_TO_TEXT": f"{hint}\nQ: {{{{input}}}}{options}A: ",
            "ICE_TO_TEXT": f"{hint}\nQuestion: {{{{input}}}}{options}Answer: ", **data}
    return _render((TEMPLATE_DIR / "oc_mmlu_gen_subject.yaml").read_text(), subs)


def _write_oc_mmlu(include_dir: Path, offline: bool, data_dir, cache_dir) -> None:
    """mmlu_gen_a484b3: one task per subject (its hint in the prompts) and the group."""
    if offline:
        have = set(mmlu_subjects(Path(data_dir)))
        missing = [s for s in OC_MMLU_SUBJECTS if s not in have]
        if missing:
            raise FileNotFoundError(f"MMLU subjects {missing} missing under "
                                    f"{Path(data_dir) / 'mmlu' / 'test'}")
        mmlu_cache = Path(prepare_offline_data(data_dir, cache_dir, ["mmlu"])["MMLU"])
    sub_dir = include_dir / "oc_mmlu_gen"
    sub_dir.mkdir(exist_ok=True)
    # lm-eval imports a YAML's !function module from the YAML's own folder
    shutil.copy(TEMPLATE_DIR / "fc_task_utils.py", sub_dir / "fc_task_utils.py")
    for s in OC_MMLU_SUBJECTS:
        if offline:
            data = {"DATASET_PATH": "json", "DATASET_NAME": None, "DATASET_KWARGS": {
                "data_files": {"test": str(mmlu_cache / "test" / f"{s}.jsonl"),
                               "dev": str(mmlu_cache / "dev" / f"{s}.jsonl")}}}
        else:
            data = {"DATASET_PATH": OC_TASKS["oc_mmlu_gen"][0], "DATASET_NAME": s,
                    "DATASET_KWARGS": None}
        (sub_dir / f"oc_mmlu_gen_{s}.yaml").write_text(oc_mmlu_subject_yaml(s, data))
    group = {"group": "oc_mmlu_gen", "task": [f"oc_mmlu_gen_{s}" for s in OC_MMLU_SUBJECTS],
             "aggregate_metric_list": [{"metric": "acc", "weight_by_size": False}],
             "metadata": {"version": 1}}
    (include_dir / "oc_mmlu_gen_group.yaml").write_text(json.dumps(group, indent=1))


# ----------------------------------------------------------------------------- Dream eval_instruct
# DreamLM/Dream eval_instruct's tasks that its lm-eval fork defines otherwise than lm-eval 0.4.13
# (tasks/dream_*.yaml); its gsm8k_cot is lm-eval's own. name -> (hub path, config, split).
DREAM_TASKS = {
    "dream_mmlu_generative": ("cais/mmlu", None, "test"),
    "dream_humaneval_instruct": ("openai/openai_humaneval", None, "test"),
}
RECIPE_TASKS = {**OC_TASKS, **DREAM_TASKS}
# The offline copy (a folder of data_dir) each task reads.
TASK_DATA = {"piqa": "piqa", "boolq": "boolq", "winogrande": "winogrande", "arc_easy": "arc",
             "arc_challenge": "arc", "hellaswag": "hellaswag", "truthfulqa_mc2": "truthfulqa",
             "mmlu": "mmlu", "humaneval": "humaneval", "gsm8k_cot": "gsm8k", "gsm8k": "gsm8k",
             "humaneval_instruct": "humaneval", "mbpp": "mbpp", "minerva_math": "math",
             "oc_arc_c_gen": "arc", "oc_arc_e_gen": "arc", "oc_hellaswag_gen": "hellaswag",
             "oc_mmlu_gen": "mmlu", "oc_gsm8k_gen": "gsm8k", "oc_humaneval_gen": "humaneval",
             "oc_piqa_gen": "piqa", "oc_boolq_gen": "boolq", "oc_winogrande_gen": "winogrande",
             "dream_mmlu_generative": "mmlu", "dream_humaneval_instruct": "humaneval"}


def write_recipe_tasks(include_dir: str | os.PathLike, names: Iterable[str], offline: bool,
                       data_dir: str | os.PathLike | None, cache_dir: str | os.PathLike,
                       stand_ins: bool = False) -> Path:
    """Render the model authors' recipe tasks (``RECIPE_TASKS``) into ``include_dir``
    (``stand_ins``: :func:`oc_task_sources`)."""
    names = list(names)
    unknown = [n for n in names if n not in RECIPE_TASKS]
    if unknown:
        raise KeyError(f"no recipe task {unknown}; known: {sorted(RECIPE_TASKS)}")
    include_dir = write_oc_tasks(include_dir, [n for n in names if n in OC_TASKS], offline,
                                 data_dir, cache_dir, stand_ins)
    for name in names:
        if name == "dream_mmlu_generative":
            _write_dream_mmlu(include_dir, offline, data_dir, cache_dir)
        elif name == "dream_humaneval_instruct":
            path, config, split = DREAM_TASKS[name]
            subs = ({"DATASET_PATH": path, "DATASET_NAME": config, "DATASET_KWARGS": None,
                     "TEST_SPLIT": split} if not offline else _local_json(prepare_offline_data(
                         data_dir, cache_dir, ["humaneval"])["HUMANEVAL"]))
            text = (TEMPLATE_DIR / f"{name}.yaml").read_text()
            (include_dir / f"{name}.yaml").write_text(_render(text, subs))
    return include_dir


def dream_mmlu_subject_yaml(subject: str, data: dict[str, Any]) -> str:
    """Task ``dream_mmlu_generative_<subject>`` over the dataset lines ``data``."""
    subs = {"SUBJECT_TASK": f"dream_mmlu_generative_{subject}", "SUBJECT_ALIAS": subject,
            "DESCRIPTION": f"The following are multiple choice questions (with answers) about "
                           f"{subject.replace('_', ' ')}.\n\n", **data}
    return _render((TEMPLATE_DIR / "dream_mmlu_generative_subject.yaml").read_text(), subs)


def _write_dream_mmlu(include_dir: Path, offline: bool, data_dir, cache_dir) -> None:
    """mmlu_generative: the 57 subjects and the group (size-weighted exact match)."""
    if offline:
        mmlu_cache = Path(prepare_offline_data(data_dir, cache_dir, ["mmlu"])["MMLU"])
        subjects = mmlu_subjects(Path(data_dir))
    else:
        subjects = sorted(OC_MMLU_SUBJECTS)
    sub_dir = include_dir / "dream_mmlu_generative"
    sub_dir.mkdir(exist_ok=True)
    for s in subjects:
        if offline:
            data = {"DATASET_PATH": "json", "DATASET_NAME": None, "DATASET_KWARGS": {
                "data_files": {"test": str(mmlu_cache / "test" / f"{s}.jsonl"),
                               "dev": str(mmlu_cache / "dev" / f"{s}.jsonl")}}}
        else:
            data = {"DATASET_PATH": DREAM_TASKS["dream_mmlu_generative"][0], "DATASET_NAME": s,
                    "DATASET_KWARGS": None}
        (sub_dir / f"dream_mmlu_generative_{s}.yaml").write_text(dream_mmlu_subject_yaml(s, data))
    group = {"group": "dream_mmlu_generative",
             "task": [f"dream_mmlu_generative_{s}" for s in subjects],
             "aggregate_metric_list": [{"metric": "exact_match", "weight_by_size": True,
                                        "filter_list": "get_response"}],
             "metadata": {"version": 3}}
    (include_dir / "dream_mmlu_generative_group.yaml").write_text(json.dumps(group, indent=1))

