"""Census of the forwards a config's evaluations run: shapes (rows x tokens) and their counts.

    fair-calib census --configfile config/paper.yaml [--out results/census.parquet]
                      [--tokenizer MODEL_OR_FAMILY=FOLDER ...] [--data-dir DIR] [--json]

For every (model, task) evaluation of the plan (:mod:`fair_calib.checks.plan`: models x method runs x
tasks, seeds included) the census asks the evaluation stage itself what it would run:

* the job's settings are those ``evaluate_shard`` receives (the task entry resolved for the
  model: ``by_family`` / ``by_model``, the display keys left out), and its lm-eval tasks are
  loaded as the stage loads them (:func:`fair_calib.evaluate.run.lm_eval_session`: the task
  manager, the offline or recipe definitions, code post-processing) and handed to lm-eval as
  the stage hands them (:func:`fair_calib.evaluate.run.run_lm_eval`: few-shot count and seed,
  chat template options), with a model that takes lm-eval's requests and stops there;
* the requests become token ids as the evaluator's model forms them
  (:class:`fair_calib.evaluate.requests.RequestEncoding`: BOS, Dream's EOS, chat templates,
  truncation to the model's context), and the ids become the forwards the evaluator runs:
  likelihood requests through :func:`fair_calib.evaluate.likelihood.planned_forwards` (MC
  iterations, exact mode's distinct inputs in chunks), generation in the evaluator's batches
  (longest prompts first, ``batch_size`` a batch), ``steps`` forwards of batch x (longest
  prompt + ``gen_length``) each -- with early exit (the default) a row stops once its output
  is final, which depends on the model: an upper bound (column ``early_exit``).

One lm-eval run of the whole task is counted: a sharded job draws its few-shot examples per
shard (``FEWSHOT_SEED``), a few tokens' difference. Token ids come from the model's tokenizer
where this machine has it, else the documented stand-in (:mod:`fair_calib.budget.census_tokenizer`).

Data: the offline copies under the data folder (``--data-dir``, else the config's ``data_dir``
where it exists, else ``FAIR_CALIB_DATA_DIR`` / ``../shared/data``), whatever ``data_source``
says: the census cannot reach the hub. Where a copy lacks a split a task reads, a stand-in
split is counted and named in the output (``fair_calib.evaluate.offline_data.census_stand_ins``:
a k-shot pool drawn from the evaluation split; ARC's dev split of OpenCompass's recipes counted
on ARC's test split). A task that has no offline copy, or whose lm-eval definition does not load
here, is refused by name before anything is counted. The synthetic tasks are read from the
config's ``synthetic_dir``, or made (``make-data``'s function) in a temporary folder.

The output has one row per (family, task, request class, rows, tokens bucket, structure) (task:
the config's name; ``lm_eval_task`` beside it) -- ``structure`` is how the forwards are
computed (``fp``; ``fake`` for fake quantization; else the method type's quantized structure,
``METHOD_STRUCTURE``) -- with its forward count over the whole grid. Prices are
:mod:`fair_calib.budget.cost`'s, which prices a census.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from fair_calib.evaluate.task_settings import resolve_task, use_by_model

BUCKET = 64                                   # tokens of a shape bucket
DISPLAY_KEYS = ("label", "latex_label", "group")    # workflow/rules/common.smk: never a setting
# How a quantized method type computes its forwards (the QUANT_RATIOS of fair_calib.budget.cost are
# measured per structure): FlatQuant-style online Kronecker transforms, QuaRot's online
# Hadamards, per-token quantization alone. A type without one is "unmeasured".
METHOD_STRUCTURE = {"fair_calib": "transform", "flatquant": "transform", "quarot": "hadamard",
                    "rtn": "plain"}


class CensusError(ValueError):
    """A task the census cannot count (named, with why)."""


# ----------------------------------------------------------------------------- one evaluation
def evaluation_settings(cfg: Mapping[str, Any], model: str, task: str, data_dir: Path,
                        synthetic_dir: Path) -> dict[str, Any]:
    """The settings the ``evaluate_shard`` job of (model, task) receives
    (workflow/rules/evaluate.smk), on the offline copies under ``data_dir``; method and bits
    change no request."""
    entry = {"name": model, **{k: v for k, v in cfg["models"][model].items()
                               if k not in DISPLAY_KEYS + ("decoding",)}}
    t = resolve_task(task, cfg["tasks"][task], model, entry["family"], by_model=use_by_model(cfg))
    for key in DISPLAY_KEYS:
        t.pop(key, None)
    if t.get("kind", "lm_eval") == "lm_eval":
        t["offline"] = True
    return {"seed": cfg.get("seed", 0), "dtype": cfg.get("dtype"), "model": entry,
            "method": {"name": "fp", "type": "fp"}, "bits": {"name": "fp"}, "task": t,
            "device": "cpu", "data_source": "local", "data_dir": str(data_dir),
            "synthetic_dir": str(synthetic_dir), "census_stand_ins": True}


class RequestsBuilt(Exception):
    """Raised by the recording model once lm-eval has built every request."""


def recording_lm(encoding_args: Mapping[str, Any]):
    """An lm-eval model with the evaluator's request encoding that stops lm-eval at its first
    request: the tasks' ``instances`` then hold every request lm-eval would send."""
    from lm_eval.api.model import LM

    from fair_calib.evaluate.requests import RequestEncoding

    class RecordingLM(RequestEncoding, LM):
        def __init__(self):
            LM.__init__(self)
            self.init_encoding(**encoding_args)

        def loglikelihood(self, requests, disable_tqdm: bool = False):
            raise RequestsBuilt

        generate_until = loglikelihood_rolling = loglikelihood

    return RecordingLM()


def encoding_args(settings: Mapping[str, Any], tokenizer: Any, max_length: int) -> dict[str, Any]:
    """The request encoding's arguments of the job's model (``DiffusionLM``'s, from the same
    ``lm_options``)."""
    from fair_calib.evaluate.likelihood import likelihood_settings
    from fair_calib.evaluate.run import lm_options
    from fair_calib.models.adapters import get_adapter

    adapter = get_adapter(settings["model"]["family"])
    opts = lm_options(settings)
    eos = tokenizer.convert_tokens_to_ids(adapter.eos_token) if adapter.eos_token \
        else getattr(tokenizer, "eos_token_id", None)
    keep = ("instruct", "add_bos_token", "chat_by_lm_eval", "chat_add_special_tokens",
            "max_prompt_len", "gen_batch_size")
    return dict(tokenizer=tokenizer, adapter=adapter,
                lik=likelihood_settings(adapter.likelihood, opts["likelihood"]), eos_id=eos,
                max_length=max_length, decoding=opts["decoding"],
                **{k: opts[k] for k in keep})


def evaluation_requests(settings: Mapping[str, Any], lm) -> dict[str, list]:
    """``{request type: [request args]}`` of one lm-eval run of the job's whole task (every
    document after ``limit``), as the evaluator's model receives them."""
    from fair_calib.evaluate.run import lm_eval_session, run_lm_eval

    with lm_eval_session(settings) as session:
        if not session.samples:
            return {}
        try:
            run_lm_eval(lm, settings, session)
        except RequestsBuilt:
            pass
        else:
            raise RuntimeError("census: lm-eval ran without asking for a request")
        out: dict[str, list] = defaultdict(list)
        for t in sorted(session.samples):
            for inst in session.leaf_tasks[t].instances:
                out[inst.request_type] += [inst.args] * inst.repeats
    return dict(out)


def evaluation_forwards(requests: Mapping[str, list], lm) -> Counter:
    """``{(class, rows, tokens): forwards}`` the evaluator runs for ``requests`` (the model's
    ``loglikelihood`` / ``generate_until``, with ``lm``'s encoding)."""
    from fair_calib.evaluate.likelihood import planned_forwards

    unknown = sorted(set(requests) - {"loglikelihood", "generate_until"})
    if unknown:
        raise CensusError(f"request types {unknown} are not counted (the configured tasks "
                          f"send loglikelihood and generate_until)")
    out: Counter = Counter()
    items = lm.likelihood_items([(a[0], a[1]) for a in requests.get("loglikelihood", [])])
    out.update(planned_forwards([(p, s) for p, s, _ in items], lm.lik))
    gen = requests.get("generate_until", [])
    if gen:
        out.update(generation_forwards([a[0] for a in gen], lm))
    return out


def generation_forwards(contexts: Sequence[str], lm) -> Counter:
    """The decoding forwards of ``DiffusionLM.generate_until``: per batch (longest prompts
    first), ``steps`` forwards of batch x (longest prompt + ``gen_length``) tokens, twice the
    rows with classifier-free guidance; early exit not modelled (an upper bound)."""
    from fair_calib.evaluate.requests import generation_batches

    policy = lm.policy()
    prompts = [lm.generation_prompt(c, policy.gen_length) for c in contexts]
    guided = 2 if float(getattr(policy, "cfg_scale", 0.0) or 0.0) > 0 else 1
    out: Counter = Counter()
    for idx in generation_batches(prompts, lm.gen_batch_size):
        longest = max(len(prompts[i]) for i in idx)
        out[("generate", len(idx) * guided, longest + policy.gen_length)] += policy.steps
    return out


def count_evaluation(settings: Mapping[str, Any], tokenizer: Any, max_length: int,
                     cache: dict | None = None) -> tuple[dict[str, list], Counter]:
    """``(requests by type, forwards)`` of one evaluation with these job settings, its model's
    tokenizer and context. ``cache``: requests already built, by :func:`request_key`."""
    lm = recording_lm(encoding_args(settings, tokenizer, max_length))
    key = request_key(settings, tokenizer)
    if cache is None or key not in cache:
        requests = evaluation_requests(settings, lm)
        if cache is not None:
            cache[key] = requests
    requests = cache[key] if cache is not None else requests
    return requests, evaluation_forwards(requests, lm)


def request_key(settings: Mapping[str, Any], tokenizer: Any) -> str:
    """What lm-eval's requests of a job depend on (the task definition, documents, few-shot
    draws and chat rendering), not the model's likelihood or decoding settings: jobs of equal
    keys get the same request texts."""
    from fair_calib.evaluate.run import chat_kwargs, lm_eval_task_name

    t = settings["task"]
    chat = chat_kwargs(t)
    return json.dumps([lm_eval_task_name(t), t.get("kind", "lm_eval"), t.get("num_fewshot"),
                       t.get("limit"), settings.get("seed"), chat,
                       [getattr(tokenizer, "name_or_path", ""),
                        getattr(tokenizer, "chat_template", None)] if chat else None],
                      sort_keys=True, default=str)


# ----------------------------------------------------------------------------- the grid
def structure(cfg: Mapping[str, Any], run: str, bits: str) -> str:
    """How an evaluation's forwards are computed: ``fp``; ``fake`` (fake quantization: bit
    widths ``FAIR_CALIB_LOWBIT=auto`` runs without a real low-bit GEMM, ``lowbit.kinds_for``);
    else the method type's quantized structure (``METHOD_STRUCTURE``; ``unmeasured`` for a
    type without one)."""
    from fair_calib.checks.plan import base_method

    mtype = cfg["methods"][base_method(run)]["type"]
    if bits == "fp" or mtype == "fp":
        return "fp"
    from fair_calib.quant.lowbit import gemm_kind, kinds_for

    b = cfg["bits"][bits]
    if gemm_kind(int(b["w_bits"]), int(b["a_bits"])) not in kinds_for("auto"):
        return "fake"
    return METHOD_STRUCTURE.get(mtype, "unmeasured")


def bucket(tokens: int) -> int:
    return max(BUCKET, -(-int(tokens) // BUCKET) * BUCKET)


CENSUS_COLUMNS = ("family", "task", "lm_eval_task", "request_class", "rows", "tokens",
                  "structure", "early_exit", "forwards", "tokens_mean", "evaluations")


class Census:
    """A config's census: ``records`` (one per shape and structure, ``CENSUS_COLUMNS``),
    ``cells`` ({(model, run, bits, task): {(class, rows, tokens): forwards}}, exact token
    counts), ``tokenizers`` ({model: what counted its tokens}), ``stand_ins`` (notes)."""

    def __init__(self, records, cells, tokenizers, stand_ins, requests):
        self.records, self.cells = records, cells
        self.tokenizers, self.stand_ins, self.requests = tokenizers, stand_ins, requests


def lm_eval_pairs(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (model, task) evaluations of the plan, in plan order, each once."""
    from fair_calib.checks import plan

    return list(dict.fromkeys((m, t) for m, _, _, t in plan.eval_cells(cfg)))


def check_countable(cfg: Mapping[str, Any], data_dir: Path) -> None:
    """Refuse, before anything is counted, every task that has no offline definition here
    (one line naming them)."""
    from fair_calib.evaluate.offline_data import census_refusal

    bad: dict[str, list[str]] = {}
    for model, task in lm_eval_pairs(cfg):
        s = evaluation_settings(cfg, model, task, data_dir, Path("."))
        if s["task"].get("kind", "lm_eval") != "lm_eval":
            continue
        name = s["task"].get("lm_eval_task") or task
        why = census_refusal(name, data_dir)
        if why and f"{task} ({name})" not in bad.setdefault(why, []):
            bad[why].append(f"{task} ({name})")
    if bad:
        raise CensusError("cannot count " + "; ".join(f"{', '.join(names)}: {why}"
                                                      for why, names in bad.items()))


def grid_census(cfg: Mapping[str, Any], data_dir: Path, synthetic_dir: Path,
                tokenizers: Mapping[str, str] | None = None) -> Census:
    """Count every evaluation of the plan (see the module's doc)."""
    from fair_calib.checks import plan
    from fair_calib.budget.census_tokenizer import census_tokenizer
    from fair_calib.evaluate.offline_data import census_stand_ins

    check_countable(cfg, data_dir)
    per_pair: dict[tuple[str, str], tuple[dict, Counter]] = {}
    used, notes, counts, cache = {}, {}, {}, {}
    for model, task in lm_eval_pairs(cfg):
        s = evaluation_settings(cfg, model, task, data_dir, synthetic_dir)
        name = s["task"].get("lm_eval_task") or task
        tok, context, what = census_tokenizer(cfg, model, name, synthetic_dir, tokenizers)
        try:
            reqs, fwd = count_evaluation(s, tok, context, cache)
        except (ImportError, FileNotFoundError, KeyError, ValueError) as err:
            raise CensusError(f"task {task} ({name}) on {model}: {err}") from err
        per_pair[(model, task)] = (s, fwd)
        used[model] = what
        counts[(model, task)] = {k: len(v) for k, v in reqs.items()}
        for note in census_stand_ins(name, s["task"].get("num_fewshot"), data_dir):
            notes[f"{task} ({name})"] = note
    cells = {}
    for model, run, bits, task in plan.eval_cells(cfg):
        cells[(model, run, bits, task)] = per_pair[(model, task)][1]
    return Census(_records(cfg, cells, per_pair), cells, used, notes, counts)


@contextlib.contextmanager
def _quiet():
    """No progress bars or per-task log lines from datasets / lm-eval while counting (one per
    evaluation would bury the census's output), and its templates compiled once."""
    import functools
    import logging

    import datasets
    import lm_eval.api.task as lm_eval_task

    import lm_eval.utils

    bar = lm_eval_task.tqdm
    lm_eval_task.tqdm = functools.partial(bar, disable=True)
    # lm-eval compiles a task's Jinja template again for every document; the census renders
    # every document of the grid, so it renders each template from one compiled copy
    apply_template = lm_eval.utils.apply_template
    compiled = functools.lru_cache(maxsize=256)(lm_eval.utils.env.from_string)
    lm_eval.utils.apply_template = lambda template, doc: compiled(template).render(**doc)
    was = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    levels = {n: logging.getLogger(n).level for n in ("lm_eval", "lm-eval")}
    for n in levels:
        logging.getLogger(n).setLevel(logging.ERROR)
    try:
        yield
    finally:
        lm_eval_task.tqdm = bar
        lm_eval.utils.apply_template = apply_template
        if was:
            datasets.enable_progress_bars()
        for n, level in levels.items():
            logging.getLogger(n).setLevel(level)


def _records(cfg, cells, per_pair) -> list[dict]:
    agg: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0])
    for (model, run, bits, task), fwd in cells.items():
        s = per_pair[(model, task)][0]
        family = s["model"]["family"]
        name = s["task"].get("lm_eval_task") or task
        struct = structure(cfg, run, bits)
        early = bool(s["task"].get("early_exit", True))
        seen = set()
        for (cls, rows, tokens), n in fwd.items():
            key = (family, task, name, cls, rows, bucket(tokens), struct,
                   early and cls == "generate")
            a = agg[key]
            a[0] += n
            a[1] += n * tokens
            if key not in seen:
                a[2] += 1
                seen.add(key)
    return [dict(zip(CENSUS_COLUMNS, (*k, int(a[0]), a[1] / a[0], int(a[2]))))
            for k, a in sorted(agg.items())]


@contextlib.contextmanager
def synthetic_folder(cfg: Mapping[str, Any]):
    """The config's ``synthetic_dir`` when it holds make-data's files or none is read (no
    synthetic task, no tiny model), else those files made (the make_data rule's function and
    settings) in a temporary folder."""
    given = Path(cfg.get("synthetic_dir") or "resources/data")
    pairs = lm_eval_pairs(cfg)
    needed = any(cfg["tasks"][t].get("kind", "lm_eval") != "lm_eval" for _, t in pairs) or any(
        cfg["models"][m].get("source") in ("train", "convert") for m, _ in pairs)
    if not needed or (given / "manifest.json").is_file():
        yield given
        return
    from fair_calib.models.tiny.corpus import make_data

    with tempfile.TemporaryDirectory(prefix="fair_calib_census_") as tmp:
        make_data({"seed": cfg.get("seed"), "dtype": cfg.get("dtype"),
                   "corpus": cfg.get("corpus", {})}, tmp)
        yield Path(tmp)


def data_folder(cfg: Mapping[str, Any], data_dir: str | Path | None) -> Path:
    """``data_dir`` if given, else the config's ``data_dir`` where it exists, else
    ``FAIR_CALIB_DATA_DIR`` / ``../shared/data``."""
    from fair_calib.evaluate.offline_data import default_data_dir

    if data_dir:
        path = Path(data_dir)
    elif cfg.get("data_dir") and Path(cfg["data_dir"]).is_dir():
        path = Path(cfg["data_dir"])
    else:
        path = default_data_dir()
    return path.resolve()


def needs_data(cfg: Mapping[str, Any]) -> bool:
    return any(cfg["tasks"][t].get("kind", "lm_eval") == "lm_eval" for _, t in lm_eval_pairs(cfg))


def census(cfg: Mapping[str, Any], data_dir: str | Path | None = None,
           tokenizers: Mapping[str, str] | None = None) -> Census:
    """The census of ``cfg`` (see the module's doc). Raises :class:`CensusError` (a task it
    cannot count) or ``FileNotFoundError`` (no data folder), each one line."""
    path = data_folder(cfg, data_dir)
    if needs_data(cfg) and not path.is_dir():
        raise FileNotFoundError(f"data folder {path} not found (set "
                                f"FAIR_CALIB_DATA_DIR or pass --data-dir; docs/data.md)")
    with synthetic_folder(cfg) as synth, _quiet():
        return grid_census(cfg, path, synth, tokenizers)


# ----------------------------------------------------------------------------- output
def census_schema():
    import pyarrow as pa

    return pa.schema([("family", pa.string()), ("task", pa.string()), ("lm_eval_task", pa.string()),
                      ("request_class", pa.string()), ("rows", pa.int64()),
                      ("tokens", pa.int64()), ("structure", pa.string()),
                      ("early_exit", pa.bool_()), ("forwards", pa.int64()),
                      ("tokens_mean", pa.float64()), ("evaluations", pa.int64())])


def heavy_shapes(records: Iterable[Mapping[str, Any]], weight: str = "forwards",
                 share: float = 0.9, family: str | None = None) -> list[dict]:
    """The (family, class, rows, tokens bucket) shapes, heaviest first by ``weight`` (a
    numeric column: ``forwards``, or a price a caller added), that together carry at least
    ``share`` of the total."""
    tot: dict[tuple, float] = defaultdict(float)
    for r in records:
        if family is None or r["family"] == family:
            tot[(r["family"], r["request_class"], int(r["rows"]), int(r["tokens"]))] += r[weight]
    total = sum(tot.values())
    out, acc = [], 0.0
    for key, w in sorted(tot.items(), key=lambda kv: (-kv[1], kv[0])):
        if total and acc >= share * total:
            break
        acc += w
        out.append(dict(zip(("family", "request_class", "rows", "tokens"), key),
                        **{weight: w, "cumulative_share": acc / total if total else 0.0}))
    return out


def shape_lines(records: Sequence[Mapping[str, Any]], weight: str, what: str,
                unit, share: float = 0.9) -> list[str]:
    total = sum(r[weight] for r in records)
    shapes = heavy_shapes(records, weight, share)
    lines = [f"{len(shapes)} shapes carry {share:.0%} of the grid's {what} "
             f"({unit(total)} in all), heaviest first:",
             "  family     class     rows x tokens   share   cumulative"]
    for s in shapes:
        lines.append(f"  {s['family']:10s} {s['request_class']:9s} {s['rows']:4d} x "
                     f"{s['tokens']:5d}   {s[weight] / total:6.1%}   {s['cumulative_share']:6.1%}")
    return lines


def summary(c: Census) -> str:
    reqs = Counter()
    for per in c.requests.values():
        reqs.update(per)
    lines = shape_lines(c.records, "forwards", "forwards", lambda v: f"{v:,.0f}")
    lines.append("requests (one run of each (model, task)): " + ", ".join(
        f"{k} {v:,}" for k, v in sorted(reqs.items())))
    lines.append("tokens counted by: " + ", ".join(f"{m} {w}" for m, w in c.tokenizers.items()))
    for task, note in c.stand_ins.items():
        lines.append(f"stand-in: {task}: {note}")
    return "\n".join(lines)


def write_census(c: Census, path: str | Path, cfg: Mapping[str, Any]) -> None:
    import pandas as pd

    from fair_calib.budget.census_tokenizer import CHARS_PER_TOKEN
    from fair_calib.jobs.io import provenance, write_parquet

    write_parquet(pd.DataFrame(list(c.records), columns=list(CENSUS_COLUMNS)), path,
                  census_schema(), provenance(cfg, token_counts=c.tokenizers,
                                              stand_ins=c.stand_ins,
                                              chars_per_token=CHARS_PER_TOKEN, bucket=BUCKET))


def tokenizer_args(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, path = item.partition("=")
        if not sep or not path:
            sys.exit(f"error: --tokenizer {item!r}: give MODEL_OR_FAMILY=FOLDER "
                     f"(e.g. dream=/path/to/Dream-v0-Base-7B)")
        out[key] = path
    return out


def add_census_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--configfile", required=True, nargs="+", help="merged in order")
    ap.add_argument("--base", default=None,
                    help="merged under --configfile (default: ./config/config.yaml)")
    ap.add_argument("--data-dir", default=None,
                    help="offline data (default: the config's data_dir, else FAIR_CALIB_DATA_DIR)")
    ap.add_argument("--tokenizer", action="append", default=[], metavar="MODEL_OR_FAMILY=FOLDER",
                    help="a checkpoint folder whose tokenizer counts that model's tokens")


def run_cli(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib census", description=__doc__.split("\n")[0])
    add_census_args(ap)
    ap.add_argument("--out", default=None, help="Parquet file of the census")
    ap.add_argument("--json", action="store_true", help="print the heavy shapes as JSON")
    args = ap.parse_args(argv)
    from fair_calib.checks.config import ConfigError
    from fair_calib.checks.references import load_config

    try:
        cfg = load_config(args.configfile, args.base)
        c = census(cfg, args.data_dir, tokenizer_args(args.tokenizer))
    except (ConfigError, FileNotFoundError, CensusError) as err:
        sys.exit(f"error: fair-calib census: {err}")
    if args.out:
        write_census(c, args.out, cfg)
    if args.json:
        print(json.dumps({"forwards": heavy_shapes(c.records, "forwards"),
                          "requests": {f"{m} {t}": n for (m, t), n in c.requests.items()}}))
        return
    print(summary(c))
    if args.out:
        print(f"census: {len(c.records)} rows -> {args.out}")
