"""Stage: evaluate one model x method x bits on one task through lm-eval; write Parquet + JSON.

``evaluate(settings, model_dir, calib_dir, out_path)`` is a pure function over files. Rows follow
the eval schema of docs/design.md; the raw lm-eval output (without the logged samples) and the
per-document metric values go to ``{out without .parquet}.json``.

Every reported number is computed from the per-document values, for a single run and for a
gathered set of shards alike: ``value`` = mean over documents (for a group such as ``mmlu`` this
is the size-weighted mean over its subtasks, as lm-eval's ``weight_by_size``), ``stderr`` =
sample standard deviation / sqrt(n). So ``gather`` of shards reproduces one run exactly.

Sharding: documents of every (sub)task, after ``limit``, are dealt round-robin: shard ``K`` of
``N`` takes document indices ``i`` with ``i % N == K`` (passed to lm-eval as ``samples``). The
likelihood draws are seeded per request, so a document scores the same in any shard.

Settings (JSON): ``{"seed", "device", "dtype", "data_dir", "synthetic_dir", "model": {"name",
"family", "source", "instruct"}, "method": {"name", "type", ...}, "bits": {"name", ...},
"task": {"name", "kind": "synthetic_mc"|"synthetic_gen"|"lm_eval", "lm_eval_task",
"num_fewshot", "limit", "gen_length", "steps", "block_length", "mc_num", "batch_size",
"cfg_scale", "eps", "exact_below", "add_bos_token", "decoding": {...}, "offline": bool,
"allow_code_execution": bool, "escape_until": bool, "code_postprocess": "none"|"dream",
"early_exit": bool, "apply_chat_template": bool, "fewshot_as_multiturn": bool,
"chat_add_special_tokens": bool, "whole_window": bool, "mean_over": "documents"|"subtasks",
"eos_split_until": bool, "max_prompt_len": int}}``:
one task's settings already resolved for the model (``fair_calib.evaluate.task_settings``: entry < ``by_family`` < ``by_model``).
``offline`` defaults to ``data_source == "local"`` (the config default); ``data_source: hub``
uses lm-eval's own task definitions and datasets.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pyarrow as pa

from fair_calib.jobs import io

EVAL_SCHEMA = pa.schema([
    ("model", pa.string()), ("method", pa.string()), ("bits", pa.string()), ("task", pa.string()),
    ("metric", pa.string()), ("value", pa.float64()), ("stderr", pa.float64()), ("n", pa.int64()),
    ("chance", pa.float64()), ("settings", pa.string()),
    # Diffusion decoding steps over the task's documents: run (early exit stops a row once its
    # output is final) and what the full schedule takes; 0 where the task decodes nothing.
    ("decode_steps", pa.int64()), ("decode_steps_full", pa.int64()),
])

SYNTHETIC_KINDS = {"synthetic_mc": "synth_mc", "synthetic_gen": "synth_gen"}
CODE_EXECUTION_SETTING = "task.allow_code_execution"


def raw_json_path(out_path: str | os.PathLike) -> Path:
    out = Path(out_path)
    return out.with_name(out.name[: -len(".parquet")] + ".json") if out.name.endswith(".parquet") \
        else out.with_name(out.name + ".json")


def lm_eval_task_name(task: Mapping[str, Any]) -> str:
    kind = task.get("kind", "lm_eval")
    if kind in SYNTHETIC_KINDS:
        return task.get("lm_eval_task") or SYNTHETIC_KINDS[kind]
    if kind != "lm_eval":
        raise ValueError(f"unknown task kind {kind!r}; expected one of "
                         f"{sorted(SYNTHETIC_KINDS) + ['lm_eval']}")
    return task.get("lm_eval_task") or task["name"]


@contextlib.contextmanager
def _env(**values: str):
    """Set environment variables inside the block only, restoring the previous state."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def is_offline(settings: Mapping[str, Any]) -> bool:
    """``task.offline`` if set, else ``data_source`` (``local``, the default, is offline)."""
    task = settings["task"]
    if task.get("kind", "lm_eval") in SYNTHETIC_KINDS:
        return True
    if task.get("offline") is not None:
        return bool(task["offline"])
    return (settings.get("data_source") or "local") == "local"


def build_task_manager(settings: Mapping[str, Any], include_dir: str | os.PathLike):
    """TaskManager for the settings' task: local YAMLs (synthetic / offline) or lm-eval's own."""
    from lm_eval.tasks import TaskManager

    from fair_calib.evaluate import offline_data

    task = settings["task"]
    kind = task.get("kind", "lm_eval")
    name = lm_eval_task_name(task)
    # the census's stand-ins for splits an offline copy lacks (fair_calib.budget.census); never a job's
    stand_ins = bool(settings.get("census_stand_ins"))
    if kind in SYNTHETIC_KINDS:
        synth = settings.get("synthetic_dir") or "resources/data"
        offline_data.write_synthetic_tasks(synth, include_dir, [name])
        return TaskManager(include_path=str(include_dir), include_defaults=False)
    if name in offline_data.RECIPE_TASKS:  # the model authors' recipes (OpenCompass, Dream's fork)
        offline_data.write_recipe_tasks(Path(include_dir) / "tasks", [name], is_offline(settings),
                                        settings.get("data_dir") or offline_data.default_data_dir(),
                                        Path(include_dir) / "_cache", stand_ins)
        return TaskManager(include_path=str(Path(include_dir) / "tasks"), include_defaults=False)
    if is_offline(settings):
        if not stand_ins:
            offline_data.check_offline_fewshot(name, task.get("num_fewshot"))
        data_dir = settings.get("data_dir") or offline_data.default_data_dir()
        offline_data.write_offline_tasks(data_dir, Path(include_dir) / "_cache",
                                         Path(include_dir) / "tasks", [name], stand_ins)
        return TaskManager(include_path=str(Path(include_dir) / "tasks"), include_defaults=False)
    return TaskManager()


# lm-eval's default few-shot sampling seed (``simple_evaluate(fewshot_random_seed=1234)``, the
# CLI's ``--seed`` default), which the authors' evaluation scripts run with: the same k-shot
# examples as theirs, whatever the config's ``seed`` (that one seeds the MC estimates). lm-eval
# draws them in document order from one generator per process; a run in N shards draws what an
# N-process (accelerate) run of lm-eval draws, whose ranks take documents i % N as shards do.
FEWSHOT_SEED = 1234


def shard_indices(n_docs: int, limit: int | float | None, shard: int, num_shards: int) -> list[int]:
    """Document indices of shard ``shard`` of ``num_shards`` after lm-eval-style ``limit``."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} out of range for {num_shards} shards")
    if limit is None:
        n = n_docs
    elif isinstance(limit, float) and limit < 1.0:
        n = int(math.ceil(n_docs * limit))
    else:
        n = min(int(limit), n_docs)
    return [i for i in range(n) if i % num_shards == shard]


def _doc_chance(task_obj, example: Mapping[str, Any]) -> float:
    if task_obj.get_config("output_type") not in ("multiple_choice",):
        return 0.0
    doc = example.get("doc") or {}
    mc2 = doc.get("mc2_targets") if isinstance(doc, dict) else None
    if isinstance(mc2, dict) and "labels" in mc2:   # TruthfulQA MC2: mass of uniform probs
        labels = list(mc2["labels"])
        return float(sum(labels)) / len(labels)
    n_choices = len(example.get("arguments") or [])
    return 1.0 / n_choices if n_choices else 0.0


def _majority_chance(per_doc: dict[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """Exact-match generation has no uniform chance level; the embedded tasks' manifest gives
    the share of the most frequent answer (what always answering it would score)."""
    manifest = Path(settings.get("synthetic_dir") or "") / "manifest.json"
    if not manifest.is_file():
        return per_doc
    share = io.read_json(manifest).get("chance", {}).get(SYNTHETIC_KINDS["synthetic_gen"])
    if share is None:
        return per_doc
    per_doc["chance"] = {t: {d: float(share) for d in docs} for t, docs in per_doc["chance"].items()}
    return per_doc


def _is_number(x: Any) -> bool:
    return isinstance(x, (bool, int, float, np.floating, np.integer)) and not isinstance(x, str)


def per_doc_values(results: Mapping[str, Any], tasks: Mapping[str, Any]) -> dict[str, Any]:
    """``{"metrics": {"acc,none": {task: {doc_id: v}}}, "chance": {task: {doc_id: c}},
    "responses": {task: {filter: {doc_id: resps}}}}``: the model's own answers (generated text;
    each choice's log-likelihood), so two runs can be compared answer by answer."""
    metrics: dict[str, dict[str, dict[str, float]]] = {}
    chance: dict[str, dict[str, float]] = {}
    responses: dict[str, dict[str, dict[str, Any]]] = {}
    for task_name, examples in (results.get("samples") or {}).items():
        task_obj = tasks[task_name]
        for ex in examples:
            doc_id = str(int(ex["doc_id"]))
            chance.setdefault(task_name, {})[doc_id] = _doc_chance(task_obj, ex)
            responses.setdefault(task_name, {}).setdefault(str(ex.get("filter")), {})[doc_id] = \
                _json_safe(ex.get("filtered_resps"))
            for m in ex.get("metrics", []):
                v = ex.get(m)
                if _is_number(v):
                    metrics.setdefault(f"{m},{ex['filter']}", {}).setdefault(task_name, {})[doc_id] = float(v)
    return {"metrics": metrics, "chance": chance, "responses": responses}


def execution_record(loaded, settings: Mapping[str, Any]) -> dict[str, Any]:
    """What computed a run's numbers: the device, dtype and, for a quantized model, the
    arithmetic of its linears (``fake``: fake quantization; ``integer``: the real low-bit
    kernels; methods.load_quantized) with the line its log shows."""
    import torch

    device = loaded.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    execution = getattr(loaded, "execution", None) or {"arithmetic": "full precision",
                                                         "line": ""}
    return {"device": name, "dtype": str(settings.get("dtype", "float32")), **execution}


def run_per_docs(eval_path: str | os.PathLike) -> list[dict[str, Any]]:
    """The per-document records of a gathered evaluation ``<task>.parquet``: its raw JSON, or
    where the gather copied a single shard (evaluate.smk), the shards' own beside it."""
    eval_path = Path(eval_path)
    raw = raw_json_path(eval_path)
    if raw.is_file():
        return [io.read_json(raw)["per_doc"]]
    shards = sorted(eval_path.with_suffix("").glob("shard-*.json"))
    return [io.read_json(p)["per_doc"] for p in shards]


def arithmetic_of(*per_docs: Mapping[str, Any]) -> str:
    """One run's arithmetic from its per-document records (a shard's ``execution``, a gathered
    run's ``executions``): ``mixed`` where they differ, "" without a record."""
    records = [r for d in per_docs
               for r in (d.get("executions") or ([d["execution"]] if d.get("execution") else []))]
    names = sorted({r["arithmetic"] for r in records})
    return names[0] if len(names) == 1 else ("mixed" if names else "")


def decode_step_totals(per_doc: Mapping[str, Any]) -> dict[str, int]:
    """Decoding steps summed over every document: ``decode_steps`` (run) and
    ``decode_steps_full`` (the full schedule), from ``per_doc["steps"]`` (``{task: {doc_id:
    [run, full]}}``)."""
    pairs = [v for docs in (per_doc.get("steps") or {}).values() for v in docs.values()]
    return {"decode_steps": sum(int(r) for r, _ in pairs),
            "decode_steps_full": sum(int(f) for _, f in pairs)}


def decode_steps_per_doc(lm: Any, samples: Mapping[str, list[int]]) -> dict[str, dict[str, list[int]]]:
    """``{task: {doc_id: [steps run, steps of the full schedule]}}`` from the model's record.
    A request's ``doc_id`` counts the selected documents (``samples``, ascending); the logged
    samples, and so the metrics, use the document's index in the task, as here."""
    out: dict[str, dict[str, list[int]]] = {}
    for (task_name, doc_id), steps in sorted(getattr(lm, "decode_steps", {}).items(),
                                             key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        true_id = samples[task_name][doc_id] if task_name in samples else doc_id
        out.setdefault(str(task_name), {})[str(int(true_id))] = [int(steps[0]), int(steps[1])]
    return out


def summarize(per_doc: Mapping[str, Any], mean_over: str | None = None) -> list[dict[str, Any]]:
    """One row per metric key: mean, stderr (ddof=1), n, mean chance over the same documents,
    and the decoding steps of the whole run. ``mean_over: subtasks`` (a group such as
    OpenCompass's MMLU, whose reported score is the plain mean over its subjects): the value is
    the mean of the subtasks' means and the stderr that of a mean of independent subtask means,
    ``sqrt(sum_s se_s^2) / S``."""
    if mean_over not in (None, "documents", "subtasks"):
        raise ValueError(f"task.mean_over = {mean_over!r}; choose documents or subtasks")
    if mean_over == "subtasks":
        return _summarize_subtask_mean(per_doc)
    rows = []
    chance = per_doc["chance"]
    steps = decode_step_totals(per_doc)
    for key in sorted(per_doc["metrics"]):
        vals, ch = [], []
        for task_name in sorted(per_doc["metrics"][key]):
            for doc_id, v in sorted(per_doc["metrics"][key][task_name].items(), key=lambda kv: int(kv[0])):
                vals.append(v)
                ch.append(chance.get(task_name, {}).get(doc_id, 0.0))
        arr = np.asarray(vals, dtype=np.float64)
        n = len(arr)
        rows.append({"metric": key, "value": float(arr.mean()) if n else float("nan"),
                     "stderr": float(arr.std(ddof=1) / math.sqrt(n)) if n > 1 else float("nan"),
                     "n": n, "chance": float(np.mean(ch)) if n else float("nan"), **steps})
    return rows


def _summarize_subtask_mean(per_doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    rows = []
    steps = decode_step_totals(per_doc)
    for key in sorted(per_doc["metrics"]):
        means, var_of_means, ch, n = [], [], [], 0
        for task_name, docs in sorted(per_doc["metrics"][key].items()):
            arr = np.asarray([v for _, v in sorted(docs.items(), key=lambda kv: int(kv[0]))])
            means.append(float(arr.mean()))
            var_of_means.append(float(arr.var(ddof=1)) / len(arr) if len(arr) > 1 else float("nan"))
            chance = per_doc["chance"].get(task_name, {})
            ch.append(float(np.mean([chance.get(d, 0.0) for d in docs])))
            n += len(arr)
        s = len(means)
        rows.append({"metric": key, "value": float(np.mean(means)) if s else float("nan"),
                     "stderr": math.sqrt(sum(var_of_means)) / s if s else float("nan"),
                     "n": n, "chance": float(np.mean(ch)) if s else float("nan"), **steps})
    return rows


def _rows_frame(settings: Mapping[str, Any], stats: list[dict[str, Any]]):
    import pandas as pd

    base = {"model": settings["model"]["name"], "method": settings["method"]["name"],
            "bits": settings["bits"]["name"], "task": settings["task"]["name"],
            "settings": json.dumps(settings, sort_keys=True)}
    return pd.DataFrame([{**base, **r} for r in stats], columns=[f.name for f in EVAL_SCHEMA])


def _json_safe(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def make_lm(settings: Mapping[str, Any], model_dir: str | os.PathLike,
            calib_dir: str | os.PathLike | None = None, loaded=None, compute_greedy: bool = True):
    """The lm-eval model for these settings (loads ``model_dir`` unless ``loaded`` is given)."""
    from fair_calib.evaluate.lm import DiffusionLM

    model = settings["model"]
    if calib_dir:    # before the model loads: a calibration of other weights is refused
        from fair_calib.jobs.model_identity import check_calibration_content

        check_calibration_content(calib_dir, model_dir)
    if loaded is None:
        from fair_calib.models.adapters import load_model

        loaded = load_model(model_dir, model["family"], dtype=settings.get("dtype", "float32"),
                            device=settings.get("device", "cpu"),
                            trust_remote_code=model.get("trust_remote_code"),
                            loader=model.get("loader"))
    return DiffusionLM(loaded, calib_dir=str(calib_dir) if calib_dir else None,
                       seed=int(settings.get("seed", 0)), compute_greedy=compute_greedy,
                       **lm_options(settings))


def lm_options(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The lm-eval model's settings of a job (likelihood, decoding, chat and prompt options):
    what :class:`~fair_calib.evaluate.lm.DiffusionLM` and the census's request encoding take."""
    model, task = settings["model"], settings["task"]
    likelihood = {k: task.get(k) for k in ("mc_num", "batch_size", "cfg_scale", "eps",
                                           "exact_below")}
    decoding = dict(task.get("decoding") or {})
    for key in ("gen_length", "steps", "block_length"):
        if task.get(key) is not None:
            decoding[key] = task[key]
    return dict(instruct=bool(model.get("instruct", False)), likelihood=likelihood,
                decoding=decoding, add_bos_token=bool(task.get("add_bos_token", False)),
                escape_until=bool(task.get("escape_until", False)),
                whole_window=bool(task.get("whole_window", False)),
                chat_add_special_tokens=bool(task.get("chat_add_special_tokens", False)),
                chat_by_lm_eval=bool(task.get("apply_chat_template", False)),
                eos_split_until=bool(task.get("eos_split_until", False)),
                max_prompt_len=task.get("max_prompt_len"), gen_batch_size=task.get("batch_size"),
                early_exit=bool(task.get("early_exit", True)))


def use_code_postprocess(leaf_tasks: Mapping[str, Any], name: str | None) -> None:
    """``task.code_postprocess``: replace a code task's prediction filter by a model authors'
    post-processing (``dream``: Dream's ``postprocess_code.py``), under the same filter name."""
    if name in (None, "none"):
        return
    from lm_eval.filters import build_filter_ensemble

    from fair_calib.evaluate.code_postprocess import POSTPROCESSORS

    if name not in POSTPROCESSORS:
        raise ValueError(f"task.code_postprocess = {name!r}; choose one of "
                         f"{sorted(POSTPROCESSORS) + ['none']}")
    for t, obj in leaf_tasks.items():
        filters = getattr(obj, "_filters", None) or []
        if obj.get_config("output_type") != "generate_until" or len(filters) != 1:
            raise ValueError(f"task.code_postprocess = {name!r} needs a generation task with one "
                             f"filter (a code task such as humaneval); {t} is not")
        filters[0] = build_filter_ensemble(filters[0].name, [["custom", {
            "filter_fn": POSTPROCESSORS[name]}]])


def chat_kwargs(task: Mapping[str, Any]) -> dict[str, bool]:
    """lm-eval's chat arguments of a task that asks for the chat template (none otherwise:
    lm-eval's own defaults, as before the setting existed)."""
    if not task.get("apply_chat_template"):
        return {}
    return {"apply_chat_template": True,
            "fewshot_as_multiturn": bool(task.get("fewshot_as_multiturn", False))}


class LmEvalSession:
    """A job's lm-eval tasks, loaded as the evaluation loads them: the task manager, the leaf
    tasks (code post-processing applied), the shard's documents of each (``samples``) and the
    tasks that execute model-written code (``unsafe``)."""

    def __init__(self, tm, leaf_tasks: Mapping[str, Any], samples: dict[str, list[int]]):
        self.tm, self.leaf_tasks, self.samples = tm, leaf_tasks, samples
        self.unsafe = sorted(t for t, obj in leaf_tasks.items() if obj.get_config("unsafe_code"))

    def output_types(self) -> set[str]:
        return {self.leaf_tasks[t].get_config("output_type") for t in self.samples}


@contextlib.contextmanager
def lm_eval_session(settings: Mapping[str, Any], shard: int = 0, num_shards: int = 1):
    """The settings' lm-eval tasks (:class:`LmEvalSession`), inside their temporary task
    folder and, offline, with the hub switched off."""
    task = settings["task"]
    with tempfile.TemporaryDirectory(prefix="fair_calib_eval_") as tmp, \
            _env(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1") if is_offline(settings) \
            else contextlib.nullcontext():
        tm = build_task_manager(settings, tmp)
        name = lm_eval_task_name(task)
        try:
            leaf_tasks = tm.load([name])["tasks"]
        except ImportError as err:
            raise ImportError(f"loading lm-eval task {name!r} failed ({err}); lm-eval's own "
                              f"definition needs that package: install it, or set "
                              f"task.offline: true to use the local definitions") from err
        use_code_postprocess(leaf_tasks, task.get("code_postprocess"))
        samples: dict[str, list[int]] = {}
        for t, obj in leaf_tasks.items():
            idx = shard_indices(len(obj.eval_docs), task.get("limit"), shard, num_shards)
            if idx:
                samples[t] = idx
        yield LmEvalSession(tm, leaf_tasks, samples)


def run_lm_eval(lm, settings: Mapping[str, Any], session: LmEvalSession) -> dict[str, Any]:
    """lm-eval's evaluation of the session's documents with ``lm``: the job's few-shot count,
    seeds, chat options; the authors' few-shot draws (``FEWSHOT_SEED``)."""
    from lm_eval import simple_evaluate

    from .template_cache import install as compile_templates_once

    compile_templates_once()
    task, seed = settings["task"], int(settings.get("seed", 0))
    return simple_evaluate(
        model=lm, tasks=[session.leaf_tasks[t] for t in sorted(session.samples)],
        num_fewshot=task.get("num_fewshot"), samples=session.samples, log_samples=True,
        bootstrap_iters=0, task_manager=session.tm, random_seed=seed,
        numpy_random_seed=seed, torch_random_seed=seed,
        fewshot_random_seed=FEWSHOT_SEED, **chat_kwargs(task),
        confirm_run_unsafe_code=bool(session.unsafe))


def evaluate(settings: Mapping[str, Any], model_dir: str | os.PathLike | None,
             calib_dir: str | os.PathLike | None, out_path: str | os.PathLike,
             shard: int = 0, num_shards: int = 1, loaded=None):
    """Evaluate and write ``out_path`` (Parquet) + the raw JSON beside it; returns the rows."""
    import torch

    settings = json.loads(json.dumps(settings))
    task = settings["task"]
    seed = int(settings.get("seed", 0))
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    allow_code = bool(task.get("allow_code_execution", False))

    with lm_eval_session(settings, shard, num_shards) as session:
        if session.unsafe and not allow_code:
            raise PermissionError(
                f"task {task['name']!r} ({', '.join(session.unsafe)}) executes model-written "
                f"code; set {CODE_EXECUTION_SETTING}: true in its settings to allow it")
        per_doc: dict[str, Any] = {"metrics": {}, "chance": {}}
        raw: dict[str, Any] = {}
        if session.samples:
            lm = make_lm(settings, model_dir, calib_dir, loaded=loaded,
                         compute_greedy="loglikelihood" in session.output_types())
            code_env = _env(HF_ALLOW_CODE_EVAL="1") if allow_code and session.unsafe \
                else contextlib.nullcontext()
            with code_env:
                res = run_lm_eval(lm, settings, session)
            per_doc = per_doc_values(res, session.leaf_tasks)
            per_doc["steps"] = decode_steps_per_doc(lm, session.samples)
            per_doc["execution"] = execution_record(lm.loaded, settings)
            raw = _json_safe({k: v for k, v in res.items() if k != "samples"})
    if task.get("kind") == "synthetic_gen":
        per_doc = _majority_chance(per_doc, settings)
    stats = summarize(per_doc, task.get("mean_over"))
    df = _rows_frame(settings, stats)
    from fair_calib.jobs.model_identity import content_id

    # the weights evaluated (sha256): a table refuses cells of one model on two weights
    content = content_id(model_dir) if model_dir is not None and loaded is None else None
    prov = io.provenance(settings, seed=seed, shard=shard, num_shards=num_shards,
                         model_dir=str(model_dir), calib_dir=str(calib_dir) if calib_dir else None,
                         arithmetic=arithmetic_of(per_doc), model_content=content)
    io.write_json(raw_json_path(out_path), {"lm_eval": raw, "per_doc": per_doc, "settings": settings,
                                            "shard": shard, "num_shards": num_shards,
                                            "model_content": content})
    io.write_parquet(df, out_path, EVAL_SCHEMA, provenance=prov)
    return df


def gather(shard_paths: Iterable[str | os.PathLike], out_path: str | os.PathLike):
    """Combine shard outputs into the result of one run (rows recomputed from per-doc values)."""
    shard_paths = [Path(p) for p in shard_paths]
    if not shard_paths:
        raise ValueError("gather needs at least one shard")
    merged: dict[str, Any] = {"metrics": {}, "chance": {}}
    settings = None
    raws = []
    contents: dict[str, Path] = {}
    for p in shard_paths:
        rec = io.read_json(raw_json_path(p))
        if settings is None:
            settings = rec["settings"]
        elif rec["settings"] != settings:
            raise ValueError(f"{p}: settings differ from {shard_paths[0]}; not shards of one run")
        if rec.get("model_content"):
            contents.setdefault(rec["model_content"], p)
        if len(contents) > 1:
            (a, pa), (b, pb) = contents.items()
            raise ValueError(f"{pa} was evaluated on weights {a}, {pb} on {b} (the model changed "
                             "between the shards); rerun snakemake, which replans them")
        raws.append({"shard": rec.get("shard"), "num_shards": rec.get("num_shards"),
                     "lm_eval": rec.get("lm_eval")})
        for key, by_task in rec["per_doc"]["metrics"].items():
            for t, docs in by_task.items():
                dst = merged["metrics"].setdefault(key, {}).setdefault(t, {})
                dup = set(dst) & set(docs)
                if dup:
                    raise ValueError(f"{p}: documents {sorted(dup, key=int)[:5]} of {t} appear in "
                                     f"two shards")
                dst.update(docs)
        for t, docs in rec["per_doc"]["chance"].items():
            merged["chance"].setdefault(t, {}).update(docs)
        for t, docs in (rec["per_doc"].get("steps") or {}).items():
            merged.setdefault("steps", {}).setdefault(t, {}).update(docs)
        for t, by_filter in (rec["per_doc"].get("responses") or {}).items():
            for filt, docs in by_filter.items():
                merged.setdefault("responses", {}).setdefault(t, {}).setdefault(filt, {}).update(docs)
        if rec["per_doc"].get("execution"):
            merged.setdefault("executions", []).append(rec["per_doc"]["execution"])
    df = _rows_frame(settings, summarize(merged, settings["task"].get("mean_over")))
    prov = io.provenance(settings, seed=settings.get("seed"),
                         gathered_from=[str(p) for p in shard_paths],
                         arithmetic=arithmetic_of(merged),
                         model_content=next(iter(contents), None))
    io.write_json(raw_json_path(out_path), {"lm_eval_shards": raws, "per_doc": merged,
                                            "settings": settings})
    io.write_parquet(df, out_path, EVAL_SCHEMA, provenance=prov)
    return df


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib evaluate", description=__doc__.split("\n")[0])
    ap.add_argument("--settings", help="settings JSON (or @path to a JSON file)")
    ap.add_argument("--model-dir")
    ap.add_argument("--calib-dir", default=None)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--num-shards", type=int, default=1)
    ap.add_argument("--gather", action="store_true", help="combine --inputs shard outputs")
    ap.add_argument("--inputs", nargs="+", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.gather:
        if not args.inputs:
            ap.error("--gather needs --inputs")
        gather(args.inputs, args.out)
        return
    if not args.settings or not args.model_dir:
        ap.error("--settings and --model-dir are required unless --gather")
    text = Path(args.settings[1:]).read_text() if args.settings.startswith("@") else args.settings
    evaluate(json.loads(text), args.model_dir, args.calib_dir, args.out,
             shard=args.shard, num_shards=args.num_shards)


if __name__ == "__main__":
    run_cli()
