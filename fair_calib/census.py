"""Census of the forwards a config's evaluations run: shapes (rows x tokens) and their counts.

    fair-calib census --configfile config/paper.yaml [--out results/census.parquet]
                      [--tokenizer llada=PATH --tokenizer dream=PATH] [--data-dir DIR]

For every evaluation the plan holds (:mod:`fair_calib.plan`: models x method runs x tasks, seeds
included), each document of the task's offline copy (``FAIR_CALIB_DATA_DIR``, default
``../shared/data``) is turned into the requests lm-eval sends for it, with the settings that
(task, model) job resolves to (``by_family`` / ``by_model``, the family adapter's defaults under
them; ``limit``: its first documents), and each request into the forwards the evaluator runs
(fair_calib/evaluate/likelihood.py, fair_calib/evaluate/lm.py):

* ``mc``: a choice scored by the sampled estimator: ``max(mc_num // batch_size, 1)`` forwards of
  ``batch_size`` rows (twice that with LLaDA's cfg) of context + target (+ Dream's EOS) tokens;
* ``exact``: a target of fewer than ``exact_below`` maskable tokens: its mask patterns' inputs,
  identical ones run once (the choices of a question with one-token targets share one), in
  forwards of up to ``max(batch_size, 32)`` inputs of one (context, total) length;
* ``generate``: ``steps`` forwards per batch of ``batch_size`` prompts (longest first, padded
  to the longest), of prompt + ``gen_length`` tokens. With ``early_exit`` (the default) a row
  stops once its output is final, which depends on the model's output: these counts are the
  upper bound (column ``early_exit``).

Prompts follow lm-eval's task templates (their text is read from the installed lm-eval where it
is fixed text: TruthfulQA's QA preamble, GSM8K-CoT's exemplars). Few-shot examples drawn at
random (GSM8K 5-shot from train, WinoGrande's 5 shots) are counted as one fixed draw of ``k``
examples of their pool (WinoGrande's train split is not in the offline copy: its dev examples
stand in). Instruct models' chat templates add ``CHAT_TOKENS`` tokens.

Token counts: with ``--tokenizer FAMILY=PATH`` (a ``tokenizer.json``, read with the
``tokenizers`` library), exact. Without one -- the LLaDA and Dream tokenizers are on the hub,
which this machine cannot reach -- ``chars / CHARS_PER_TOKEN[family][task]``: ratios measured
by ``benchmarks/census_token_ratio.py`` on every document of the offline copies with the
closest tokenizers a package ships (Dream: Qwen's BPE, whose ranks are Qwen2's; LLaDA: LLaMA-3's
BPE, a proxy -- LLaDA's own 126k vocabulary differs), with the per-document error there
(docs/benchmarks.md, "Census of the grid's forwards"). Shapes are bucketed by tokens rounded
up to a multiple of ``BUCKET``; exact mode's grouping by equal lengths uses the estimated
lengths. Truncation to the model's context and Dream's skipped all-unmasked iterations are
not modelled (neither happens at these lengths / is rare); exact mode's inputs are batched over
the whole task, where a sharded job batches within its shard (a few more partial forwards).

The output has one row per (family, task, request class, rows, tokens bucket, structure) (task:
the config's name; ``lm_eval_task`` beside it) --
``structure`` is how the forwards are computed (``fp``, or the quantized method's structure,
``fake`` for fake quantization) -- with its forward count over the whole grid; the printed
summary lists the shapes that carry at least 90% of the grid's forwards and of its projected
GPU time (:func:`fair_calib.cost.census_seconds`), heaviest first.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from fair_calib.evaluate.task_settings import resolve_task, use_by_model

BUCKET = 64                                   # tokens of a shape bucket
EXACT_MIN_ROWS = 32                           # fair_calib/evaluate/likelihood.py
CHAT_TOKENS = {"llada": 11, "dream": 20}      # chat template around a user turn (counted by hand)

# Characters per token, per family and lm-eval task, measured on every document of the offline
# copies with benchmarks/census_token_ratio.py (2026-11-27; Dream: qwen.tiktoken of the dashscope
# 2.0.2 wheel, Qwen2's BPE ranks; LLaDA: LLaMA-3's tokenizer.model of llama-models 0.3.0, a
# proxy), texts as this module builds them; "*": any other task (all these texts together).
# Error of round(chars / ratio) per context: mean 1-13%, 95th percentile 2-32% (MMLU's 5-shot
# contexts: 72-80 tokens mean absolute error); docs/benchmarks.md has the table.
CHARS_PER_TOKEN: dict[str, dict[str, float]] = {
    "llada": {
        "piqa": 4.365, "boolq": 4.558, "winogrande": 4.887, "arc_easy": 5.063,
        "arc_challenge": 4.956, "hellaswag": 4.655, "truthfulqa_mc2": 4.217, "mmlu": 4.41,
        "gsm8k": 3.44, "gsm8k_cot": 3.335, "humaneval": 3.432, "humaneval_instruct": 3.58,
        "*": 4.299},
    "dream": {
        "piqa": 4.343, "boolq": 4.417, "winogrande": 4.887, "arc_easy": 5.043,
        "arc_challenge": 4.918, "hellaswag": 4.641, "truthfulqa_mc2": 4.054, "mmlu": 4.329,
        "gsm8k": 3.032, "gsm8k_cot": 3.124, "humaneval": 3.36, "humaneval_instruct": 3.512,
        "*": 4.174},
}


# ----------------------------------------------------------------------------- token counting
class TokenCounter:
    """``count(text)`` per family: a tokenizer's exact count, or chars / the measured ratio."""

    def __init__(self, tokenizers: Mapping[str, str] | None = None):
        self._exact: dict[str, Callable[[str], int]] = {}
        for family, path in (tokenizers or {}).items():
            self._exact[family] = _load_tokenizer(path)

    def exact(self, family: str) -> bool:
        return family in self._exact

    def count(self, text: str, family: str, task: str) -> int:
        if family in self._exact:
            return self._exact[family](text)
        ratios = CHARS_PER_TOKEN.get(family) or CHARS_PER_TOKEN.get("*", {})
        ratio = ratios.get(task) or ratios.get("*") or 4.0
        return max(1, round(len(text) / ratio)) if text else 0


def _load_tokenizer(path: str) -> Callable[[str], int]:
    """A ``tokenizer.json`` (HF tokenizers) or a ``.tiktoken`` rank file (Qwen's pattern, or
    LLaMA-3's when the file name says llama)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"tokenizer {path}: no such file")
    if p.suffix == ".json":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(p))
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        raise FileNotFoundError(f"tokenizer {path}: a .tiktoken rank file needs the tiktoken "
                                "package (pip install tiktoken), or give a tokenizer.json") from None

    pat = TIKTOKEN_PATTERNS["llama3" if "llama" in p.name.lower() or p.name == "tokenizer.model"
                            else "qwen"]
    enc = tiktoken.Encoding(p.stem, pat_str=pat, mergeable_ranks=load_tiktoken_bpe(str(p)),
                            special_tokens={})
    return lambda text: len(enc.encode_ordinary(text))


TIKTOKEN_PATTERNS = {   # the pre-tokenizers of the two rank files (Qwen: single digits)
    "qwen": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


# ----------------------------------------------------------------------------- request texts
@dataclass(frozen=True)
class McDoc:
    """One multiple-choice document: its context and each choice's continuation."""
    context: str
    continuations: tuple[str, ...]


def _lm_eval_yaml(rel: str) -> dict:
    import yaml
    import lm_eval.tasks

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    return yaml.load((Path(lm_eval.tasks.__file__).parent / rel).read_text(), Loader=Loader)


def truthfulqa_preamble() -> str:
    """lm-eval's QA prompt (truthfulqa_mc1.yaml's ``prompt_qa``)."""
    text = _lm_eval_yaml("truthfulqa/truthfulqa_mc1.yaml")["doc_to_text"]
    start = text.index("'") + 1
    return text[start:text.index("'%}", start)]


def gsm8k_cot_shots() -> list[str]:
    return [f"Q: {s['question']}\nA: {s['target']}"
            for s in _lm_eval_yaml("gsm8k/gsm8k-cot.yaml")["fewshot_config"]["samples"]]


def mc_documents(task: str, data_dir: Path, shots: int, limit: int | None = None) -> list[McDoc]:
    """The multiple-choice documents of ``task`` (lm-eval's templates); ``limit``: the first
    ``limit`` of each (sub)task, as lm-eval's ``--limit``."""
    if task == "mmlu":
        return _mmlu(data_dir, shots, limit)
    return _mc_documents(task, data_dir, shots)[:limit]


def _mc_documents(task: str, data_dir: Path, shots: int) -> list[McDoc]:
    from fair_calib.evaluate import offline_data as od

    if task == "piqa":
        return [McDoc(f"Question: {d['goal']}\nAnswer:", (f" {d['sol1']}", f" {d['sol2']}"))
                for d in od.read_piqa(data_dir)]
    if task == "boolq":
        return [McDoc(f"{d['passage']}\nQuestion: {d['question']}?\nAnswer:", (" no", " yes"))
                for d in od.read_boolq(data_dir)]
    if task in ("arc_easy", "arc_challenge"):
        return [McDoc(f"Question: {d['question']}\nAnswer:",
                      tuple(f" {c}" for c in d["choices"]["text"]))
                for d in od.read_arc(data_dir, task.split("_")[1])]
    if task == "hellaswag":
        return [McDoc(f"{d['activity_label']}: {d['ctx_a']} {d['ctx_b'].capitalize()}".strip(),
                      tuple(f" {e}" for e in d["endings"])) for d in od.read_hellaswag(data_dir)]
    if task == "truthfulqa_mc2":
        pre = truthfulqa_preamble()
        return [McDoc(f"{pre}\n\nQ: {d['question']}\nA:",
                      tuple(f" {c}" for c in d["mc2_targets"]["choices"]))
                for d in od.read_truthfulqa(data_dir)]
    if task == "winogrande":
        return _winogrande(od.read_winogrande(data_dir), shots)
    raise KeyError(f"census: no request model for multiple-choice task {task!r}")


def _winogrande(docs: list[dict], shots: int) -> list[McDoc]:
    def whole(d):                  # a few-shot example: the sentence with its right option
        opt = d["option1"] if d["answer"] == "1" else d["option2"]
        return d["sentence"].replace("_", opt, 1)

    shot = _sampled_shots([whole(d) for d in docs], shots, "\n\n")
    out = []
    for d in docs:
        i = d["sentence"].index("_")
        target = " " + d["sentence"][i + 1:].strip()
        # choices differ in their context (partial evaluation): the longer one stands for both
        ctx = max((d["sentence"][:i] + o for o in (d["option1"], d["option2"])), key=len)
        out.append(McDoc(shot + ctx, (target, target)))
    return out


def _mmlu(data_dir: Path, shots: int, limit: int | None = None) -> list[McDoc]:
    from fair_calib.evaluate import offline_data as od

    def fmt(d, answer=True):
        opts = "".join(f"\n{L}. {c}" for L, c in zip("ABCD", d["choices"]))
        answer_text = f" {'ABCD'[d['answer']]}" if answer else ""
        return f"{d['question'].strip()}{opts}\nAnswer:{answer_text}"

    out = []
    for subject in od.mmlu_subjects(data_dir):
        head = (f"The following are multiple choice questions (with answers) about "
                f"{subject.replace('_', ' ')}.\n\n")
        dev = od.read_mmlu(data_dir, subject, "dev")[:shots]
        prefix = head + "".join(fmt(d) + "\n\n" for d in dev)
        out += [McDoc(prefix + fmt(d, answer=False), (" A", " B", " C", " D"))
                for d in od.read_mmlu(data_dir, subject, "test")[:limit]]
    return out


def _sampled_shots(pool: Sequence[str], k: int, sep: str) -> str:
    """``k`` examples drawn once from the pool (fixed seed), each followed by ``sep``: lm-eval
    draws per document; one draw for all documents keeps their mean length."""
    if not k or not pool:
        return ""
    import random

    return "".join(x + sep for x in random.Random(1234).sample(list(pool), k))


def gen_prompts(task: str, data_dir: Path, shots: int) -> list[str]:
    """The generation prompts of ``task`` (lm-eval's templates)."""
    from fair_calib.evaluate import offline_data as od

    if task in ("gsm8k", "gsm8k_cot"):
        docs = od.read_gsm8k(data_dir, "test")
        if task == "gsm8k_cot":
            fixed = gsm8k_cot_shots()[:shots]
            prefix = "".join(s + "\n\n" for s in fixed)
            return [f"{prefix}Q: {d['question']}\nA:" for d in docs]
        train = [f"Question: {d['question']}\nAnswer: {d['answer']}"
                 for d in od.read_gsm8k(data_dir, "train")]
        prefix = _sampled_shots(train, shots, "\n\n")
        return [f"{prefix}Question: {d['question']}\nAnswer:" for d in docs]
    if task == "humaneval":
        return [d["prompt"] for d in od.read_humaneval(data_dir)]
    if task == "humaneval_instruct":
        return [f"Write a solution to the following problem and make sure that it passes the "
                f"tests:\n```python\n{d['prompt']}\n```\nHere is the completed function:\n"
                f"```python\n{d['prompt']}\n" for d in od.read_humaneval(data_dir)]
    raise KeyError(f"census: no request model for generation task {task!r}")


GEN_TASKS = ("gsm8k", "gsm8k_cot", "humaneval", "humaneval_instruct")
# The Instruct models' generation recipes (fair_calib/evaluate/tasks/oc_*.yaml, dream_*.yaml):
# their documents are the base task's, and their prompts are counted as the base task's lm-eval
# rendering (the recipes' own wording and chat turns differ by a few tokens a document; chat
# tokens are added as for every Instruct generation): an approximation of their lengths.
RECIPE_BASE = {"oc_arc_c_gen": "arc_challenge", "oc_arc_e_gen": "arc_easy",
               "oc_boolq_gen": "boolq", "oc_hellaswag_gen": "hellaswag", "oc_mmlu_gen": "mmlu",
               "oc_piqa_gen": "piqa", "oc_winogrande_gen": "winogrande",
               "oc_gsm8k_gen": "gsm8k_cot", "oc_humaneval_gen": "humaneval",
               "dream_humaneval_instruct": "humaneval_instruct",
               "dream_mmlu_generative": "mmlu"}


def recipe_prompts(task: str, data_dir: Path, shots: int) -> list[str]:
    """Prompts of an Instruct recipe task, from its base task's documents (RECIPE_BASE)."""
    base = RECIPE_BASE[task]
    if base in GEN_TASKS:
        return gen_prompts(base, data_dir, shots)
    return [d.context for d in mc_documents(base, data_dir, shots)]


# ----------------------------------------------------------------------------- forwards
@dataclass(frozen=True)
class JobSettings:
    """What shapes one (task, model) evaluation runs with (resolved as the job resolves it)."""
    family: str
    lm_eval_task: str
    kind: str                       # "mc" or "generate"
    shots: int
    instruct: bool
    add_bos: bool
    estimator: str = "llada"
    mc_num: int = 128
    batch_size: int = 8
    guided: int = 1                 # 2 with cfg (conditional and unconditional rows)
    exact_below: int = 0
    gen_length: int = 256
    steps: int = 256
    block_length: int | None = None
    early_exit: bool = True
    limit: int | None = None        # lm-eval's limit: the first documents of each (sub)task


def job_settings(cfg: Mapping[str, Any], model: str, task: str) -> JobSettings:
    from fair_calib.models.adapters import get_adapter

    family = cfg["models"][model]["family"]
    t = resolve_task(task, cfg["tasks"][task], model, family, by_model=use_by_model(cfg))
    adapter = get_adapter(family)
    name = t.get("lm_eval_task") or task
    limit = int(t["limit"]) if t.get("limit") else None
    common = dict(family=family.removeprefix("tiny-"), lm_eval_task=name, limit=limit,
                  instruct=bool(cfg["models"][model].get("instruct", False)),
                  add_bos=bool(t.get("add_bos_token", False)),
                  early_exit=bool(t.get("early_exit", True)))
    if name in GEN_TASKS or name in RECIPE_BASE or t["kind"] == "synthetic_gen":
        dec = {**adapter.decoding, **(t.get("decoding") or {}),
               **{k: t[k] for k in ("gen_length", "steps", "block_length") if t.get(k) is not None}}
        shots = t.get("num_fewshot")
        if shots is None:           # lm-eval's defaults: gsm8k 5-shot, gsm8k-cot 8, humaneval 0
            shots = {"gsm8k": 5, "gsm8k_cot": 8}.get(name, 0)
        rows = int(t.get("batch_size") or adapter.likelihood["batch_size"])
        return JobSettings(kind="generate", shots=int(shots), batch_size=rows,
                           gen_length=int(dec["gen_length"]),
                           steps=int(dec.get("steps", dec["gen_length"])),
                           block_length=dec.get("block_length"), **common)
    lik = {**adapter.likelihood, **{k: t[k] for k in ("mc_num", "batch_size", "cfg_scale",
                                                      "exact_below") if t.get(k) is not None}}
    return JobSettings(kind="mc", shots=int(t.get("num_fewshot") or 0),
                       estimator=str(lik["estimator"]), mc_num=int(lik["mc_num"]),
                       batch_size=int(lik["batch_size"]),
                       guided=2 if float(lik.get("cfg_scale") or 0) > 0 else 1,
                       exact_below=int(lik.get("exact_below", 0)), **common)


def bucket(tokens: int) -> int:
    return max(BUCKET, -(-int(tokens) // BUCKET) * BUCKET)


Shape = tuple[str, int, int]        # (request class, rows, tokens)


def mc_forwards(docs: Sequence[tuple[int, Sequence[int]]], st: JobSettings) -> Counter:
    """Forwards of one evaluation of a multiple-choice task: ``docs`` are (context tokens,
    each choice's target tokens). Returns {(class, rows, tokens): count}."""
    out: Counter = Counter()
    eos = 1 if st.estimator == "dream" else 0          # Dream appends EOS (visible, unscored)
    exact_inputs: Counter = Counter()                  # (P, total) -> distinct inputs
    for ctx, targets in docs:
        shared: set[int] = set()                       # one-token targets of this question
        for n in targets:
            total = ctx + n + eos
            if 0 < n < st.exact_below:
                if n == 1:
                    shared.add(total)
                else:
                    exact_inputs[(ctx, total)] += _patterns(n, st)
                continue
            out[("mc", st.batch_size * st.guided, total)] += max(st.mc_num // st.batch_size, 1)
        for total in shared:
            exact_inputs[(ctx, total)] += 1
    step = max(st.batch_size, EXACT_MIN_ROWS)
    for (_, total), n in exact_inputs.items():
        full, rest = divmod(n, step)
        if full:
            out[("exact", step * st.guided, total)] += full
        if rest:
            out[("exact", rest * st.guided, total)] += 1
    return out


def _patterns(n: int, st: JobSettings) -> int:
    """Mask patterns of an n-token target in exact mode (likelihood.exact_patterns)."""
    if st.estimator == "llada":
        from fair_calib.evaluate.likelihood import llada_count_probs

        return sum(math.comb(n, m) for m in llada_count_probs(n, st.batch_size))
    return 2 ** n - 1


def gen_forwards(prompts: Sequence[int], st: JobSettings) -> Counter:
    """Forwards of one evaluation of a generation task: ``prompts`` are prompt token counts;
    batches of the longest first, each ``steps`` forwards of the batch's longest prompt +
    ``gen_length`` tokens (an upper bound with early exit)."""
    out: Counter = Counter()
    order = sorted(prompts, reverse=True)
    for s in range(0, len(order), st.batch_size):
        chunk = order[s:s + st.batch_size]
        out[("generate", len(chunk), chunk[0] + st.gen_length)] += st.steps
    return out


def evaluation_forwards(st: JobSettings, data_dir: Path, counter: TokenCounter,
                        cache: dict | None = None) -> Counter:
    """{(class, rows, tokens): forwards} of one evaluation with settings ``st``."""
    cache = {} if cache is None else cache
    task, fam = st.lm_eval_task, st.family
    chat = CHAT_TOKENS.get(fam, 0) if st.instruct and st.kind == "generate" else 0
    extra = int(st.add_bos) + chat
    if st.kind == "generate":
        key = ("gen", fam, task, st.shots, st.limit)
        if key not in cache:
            prompts = (recipe_prompts if task in RECIPE_BASE else gen_prompts)(
                task, data_dir, st.shots)
            cache[key] = [counter.count(p, fam, RECIPE_BASE.get(task, task))
                          for p in prompts[:st.limit]]
        return gen_forwards([n + extra for n in cache[key]], st)
    key = ("mc", fam, task, st.shots, st.limit)
    if key not in cache:
        cache[key] = [(counter.count(d.context, fam, task),
                       [counter.count(c, fam, task) for c in d.continuations])
                      for d in mc_documents(task, data_dir, st.shots, st.limit)]
    return mc_forwards([(ctx + extra, targets) for ctx, targets in cache[key]], st)


# ----------------------------------------------------------------------------- the grid
def structure(cfg: Mapping[str, Any], run: str, bits: str) -> str:
    """How an evaluation's forwards are computed: ``fp``; ``fake`` (fake quantization: bit
    widths ``FAIR_CALIB_LOWBIT=auto`` runs without a real low-bit GEMM, ``lowbit.kinds_for``);
    else the method type's quantized structure (fair_calib.cost.METHOD_STRUCTURE;
    ``unmeasured`` for a type without one)."""
    from fair_calib.cost import METHOD_STRUCTURE
    from fair_calib.plan import base_method

    mtype = cfg["methods"][base_method(run)]["type"]
    if bits == "fp" or mtype == "fp":
        return "fp"
    from fair_calib.quant.lowbit import gemm_kind, kinds_for

    b = cfg["bits"][bits]
    if gemm_kind(int(b["w_bits"]), int(b["a_bits"])) not in kinds_for("auto"):
        return "fake"
    return METHOD_STRUCTURE.get(mtype, "unmeasured")


CENSUS_COLUMNS = ("family", "task", "lm_eval_task", "request_class", "rows", "tokens",
                  "structure", "early_exit", "forwards", "tokens_mean", "evaluations",
                  "gpu_seconds")


def grid_census(cfg: Mapping[str, Any], data_dir: Path, counter: TokenCounter,
                per_cell: dict | None = None) -> list[dict]:
    """One record per (family, task, class, rows, tokens bucket, structure): forwards over all
    of the plan's evaluations of lm-eval tasks (synthetic tasks run on the CPU: left out),
    with their projected GPU seconds (fair_calib.cost.census_seconds). ``per_cell``, if given,
    receives each evaluation's seconds under its (model, run, bits, task)."""
    from fair_calib import plan
    from fair_calib.cost import census_seconds

    cache: dict = {}
    per_eval: dict[tuple[str, str], tuple[JobSettings, Counter]] = {}
    agg: dict[tuple, list[float]] = defaultdict(lambda: [0, 0.0, 0, 0.0])
    for model, run, bits, task in plan.eval_cells(cfg):
        if cfg["tasks"][task]["kind"] != "lm_eval":
            continue
        if (model, task) not in per_eval:
            st = job_settings(cfg, model, task)
            per_eval[(model, task)] = (st, evaluation_forwards(st, data_dir, counter, cache))
        st, fwd = per_eval[(model, task)]
        struct = structure(cfg, run, bits)
        seen = set()
        cell = 0.0
        for (cls, rows, tokens), n in fwd.items():
            key = (st.family, task, st.lm_eval_task, cls, rows, bucket(tokens), struct,
                   st.early_exit and cls == "generate")
            a = agg[key]
            a[0] += n
            a[1] += n * tokens
            sec = n * census_seconds(st.family, struct, cls, rows, tokens)
            a[3] += sec
            cell += sec
            if key not in seen:
                a[2] += 1
                seen.add(key)
        if per_cell is not None:
            per_cell[(model, run, bits, task)] = cell
    return [dict(zip(CENSUS_COLUMNS, (*k, int(a[0]), a[1] / a[0], int(a[2]), a[3])))
            for k, a in sorted(agg.items())]


def census_schema():
    import pyarrow as pa

    return pa.schema([("family", pa.string()), ("task", pa.string()), ("lm_eval_task", pa.string()),
                      ("request_class", pa.string()), ("rows", pa.int64()),
                      ("tokens", pa.int64()), ("structure", pa.string()),
                      ("early_exit", pa.bool_()), ("forwards", pa.int64()),
                      ("tokens_mean", pa.float64()), ("evaluations", pa.int64()),
                      ("gpu_seconds", pa.float64())])


def heavy_shapes(records: Iterable[Mapping[str, Any]], weight: str = "forwards",
                 share: float = 0.9, family: str | None = None) -> list[dict]:
    """The (family, class, rows, tokens bucket) shapes, heaviest first by ``weight``
    (``forwards`` or ``gpu_seconds``), that together carry at least ``share`` of the total."""
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


def summary(records: Sequence[Mapping[str, Any]], share: float = 0.9) -> str:
    lines = []
    for weight, what in (("forwards", "forwards"), ("gpu_seconds", "projected GPU time")):
        total = sum(r[weight] for r in records)
        shapes = heavy_shapes(records, weight, share)
        unit = (lambda v: f"{v:,.0f}") if weight == "forwards" else (lambda v: f"{v / 3600:,.1f} h")
        lines.append(f"{len(shapes)} shapes carry {share:.0%} of the grid's {what} "
                     f"({unit(total)} in all), heaviest first:")
        lines.append("  family  class     rows x tokens   share   cumulative")
        for s in shapes:
            lines.append(f"  {s['family']:7s} {s['request_class']:9s} {s['rows']:4d} x "
                         f"{s['tokens']:5d}   {s[weight] / total:6.1%}   "
                         f"{s['cumulative_share']:6.1%}")
    return "\n".join(lines)


def census(cfg: Mapping[str, Any], data_dir: str | Path | None = None,
           tokenizers: Mapping[str, str] | None = None, per_cell: dict | None = None) -> list[dict]:
    from fair_calib.evaluate.offline_data import default_data_dir

    data_dir = Path(data_dir) if data_dir else default_data_dir()
    if not data_dir.is_dir():
        raise FileNotFoundError(f"census: data folder {data_dir} not found (set "
                                f"FAIR_CALIB_DATA_DIR or pass --data-dir; docs/data.md)")
    return grid_census(cfg, data_dir, TokenCounter(tokenizers), per_cell)


def write_census(records: Sequence[Mapping[str, Any]], path: str | Path,
                 cfg: Mapping[str, Any], tokenizers: Mapping[str, str] | None) -> None:
    import pandas as pd

    from fair_calib.io import provenance, write_parquet

    write_parquet(pd.DataFrame(list(records), columns=list(CENSUS_COLUMNS)), path, census_schema(),
                  provenance(cfg, token_counts={f: (tokenizers or {}).get(f, "chars/ratio")
                                                for f in ("llada", "dream")},
                             chars_per_token=CHARS_PER_TOKEN, bucket=BUCKET))


def _tokenizer_args(items: Sequence[str]) -> dict[str, str]:
    out = {}
    for item in items:
        family, sep, path = item.partition("=")
        if not sep or not path:
            sys.exit(f"error: fair-calib census --tokenizer {item!r}: give FAMILY=PATH "
                     f"(e.g. dream=/path/to/tokenizer.json)")
        out[family] = path
    return out


def run_cli(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib census", description=__doc__.split("\n")[0])
    ap.add_argument("--configfile", required=True, nargs="+", help="merged in order")
    ap.add_argument("--base", default=None,
                    help="merged under --configfile (default: ./config/config.yaml)")
    ap.add_argument("--out", default=None, help="Parquet file of the census")
    ap.add_argument("--data-dir", default=None, help="offline data (default FAIR_CALIB_DATA_DIR)")
    ap.add_argument("--tokenizer", action="append", default=[], metavar="FAMILY=PATH",
                    help="a tokenizer.json (or .tiktoken) for exact token counts")
    ap.add_argument("--json", action="store_true", help="print the heavy shapes as JSON")
    args = ap.parse_args(argv)
    from fair_calib.config import ConfigError
    from fair_calib.cost import load_config

    tokenizers = _tokenizer_args(args.tokenizer)
    try:
        cfg = load_config(args.configfile, args.base)
        records = census(cfg, args.data_dir, tokenizers)
    except (ConfigError, FileNotFoundError, KeyError) as err:
        sys.exit(f"error: fair-calib census: {err}")
    if args.out:
        write_census(records, args.out, cfg, tokenizers)
    if args.json:
        print(json.dumps({w: heavy_shapes(records, w) for w in ("forwards", "gpu_seconds")}))
        return
    print(summary(records))
    if args.out:
        print(f"census: {len(records)} rows -> {args.out}")
