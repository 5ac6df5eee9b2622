"""The whole DAG on a lent GPU: the helper of ``benchmarks/gpu_dag.sh``.

    python benchmarks/gpu_dag.py data --src ../shared/data --out .gpu_dag_data
    python benchmarks/gpu_dag.py checkpoints --data .gpu_dag_data --out RUN/models --layers 4 [--smoke]
    python benchmarks/gpu_dag.py check-env
    python benchmarks/gpu_dag.py summary --run RUN [--out "$OUT"]

``data`` (CPU machine): real documents in the offline copies' formats (docs/data.md): GSM8K
test questions and HellaSwag items, 2 from each of 3 token-count classes (its shortest and
longest), the first GSM8K train questions (probe prompts), the start of WikiText-2 (calibration
windows), and ``manifest.json``. ``checkpoints``: random weights in the released LLaDA / Dream
hub layouts at the real widths of benchmarks/shapes.py with ``--layers`` blocks (``--smoke``:
tiny widths), and the tiny models' word-level tokenizer trained on the documents, padded with
reserved tokens to the model's vocabulary (a word-level token is about a BPE token of English
text). ``summary``: one row per job from the job lines every stage logs (wall time, card, peak
GPU memory), evaluation times per method next to FP, the run's span; with ``--out`` also
summary.md, jobs.json, the logs' tails and the tables, for the device tool to bring back.
"""
from __future__ import annotations

import argparse
import bz2
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FAMILY_SHAPE = {"llada": "llada-8b", "dream": "dream-7b"}
METHOD_ORDER = ("fp", "rtn", "quarot", "flatquant", "fair-calib")   # config/gpu_dag.yaml's
# The CPU smoke's widths (the vocabulary is the tokenizer's own size there).
SMOKE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4)
SMOKE_KV_HEADS = {"llada": 4, "dream": 2}       # LLaDA: no GQA; Dream: GQA, as at full size
HELLASWAG_FILE = "hellaswag/hellaswag_val_full.txt.bz2"
WIKITEXT_FILE = "wikitext2/wiki.test.raw"


# ------------------------------------------------------------------------------ data
def n_tokens(text: str) -> int:
    """Tokens of ``text`` under the run's word-level tokenizer: one per word or punctuation run
    (its pre-tokenizer's pieces; an unknown word is one [UNK])."""
    from fair_calib.models.tiny.tokenizer import _pre_tokenizer

    return len(_pre_tokenizer().pre_tokenize_str(text))


def pick_by_length(lengths: list[int], classes: int, per_class: int) -> list[tuple[int, int]]:
    """``(index, class)`` of the documents taken: the documents sorted by length (ties by
    index) are cut into ``classes`` runs of equal size; from each, ``per_class`` documents at
    evenly spaced ranks, its shortest and its longest included."""
    if classes < 1 or per_class < 1:
        raise ValueError(f"classes ({classes}) and per_class ({per_class}) must be >= 1")
    if len(lengths) < classes * per_class:
        raise ValueError(f"{len(lengths)} documents cannot fill {classes} classes of {per_class}")
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    picked = []
    for c in range(classes):
        lo, hi = c * len(order) // classes, (c + 1) * len(order) // classes
        if per_class == 1:
            ranks = [(lo + hi - 1) // 2]
        else:
            ranks = [lo + round(j * (hi - 1 - lo) / (per_class - 1)) for j in range(per_class)]
        picked += [(order[r], c) for r in dict.fromkeys(ranks)]
    return picked


def read_hellaswag_items(path: Path) -> list[list[str]]:
    """The copy's items, 6 lines each (``label: ctx``, gold index, 4 endings)."""
    with bz2.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    if lines and lines[-1] == "":
        lines = lines[:-1]
    if len(lines) % 6:
        raise ValueError(f"{path}: {len(lines)} lines is not a multiple of 6")
    return [lines[i:i + 6] for i in range(0, len(lines), 6)]


def hellaswag_tokens(item: list[str]) -> int:
    """A request's length: the context and its longest ending."""
    return n_tokens(item[0].partition(": ")[2]) + max(n_tokens(e) for e in item[2:6])


def write_data(src: Path, out: Path, classes: int = 3, per_class: int = 2, n_train: int = 16,
               wiki_chars: int = 200_000) -> dict:
    """The carried data folder (see the module doc); returns its manifest."""
    from fair_calib.data import read_jsonl

    out.mkdir(parents=True, exist_ok=True)
    manifest = {"source": str(src), "classes": classes, "per_class": per_class, "documents": {}}
    test = read_jsonl(src / "gsm8k" / "test.jsonl")
    picks = pick_by_length([n_tokens(r["question"]) for r in test], classes, per_class)
    _write_jsonl(out / "gsm8k" / "test.jsonl", [test[i] for i, _ in picks])
    manifest["documents"]["gsm8k_test"] = [
        {"index": i, "class": c, "question_tokens": n_tokens(test[i]["question"])} for i, c in picks]
    train = read_jsonl(src / "gsm8k" / "train.jsonl")[:n_train]
    _write_jsonl(out / "gsm8k" / "train.jsonl", train)
    items = read_hellaswag_items(src / HELLASWAG_FILE)
    picks = pick_by_length([hellaswag_tokens(it) for it in items], classes, per_class)
    (out / HELLASWAG_FILE).parent.mkdir(parents=True, exist_ok=True)
    with bz2.open(out / HELLASWAG_FILE, "wt", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for i, _ in picks for line in items[i]))
    manifest["documents"]["hellaswag"] = [
        {"index": i, "class": c, "request_tokens": hellaswag_tokens(items[i])} for i, c in picks]
    raw = (src / WIKITEXT_FILE).read_bytes()
    cut = raw.rfind(b"\n", 0, wiki_chars) + 1 or len(raw)
    (out / WIKITEXT_FILE).parent.mkdir(parents=True, exist_ok=True)
    (out / WIKITEXT_FILE).write_bytes(raw[:cut])
    manifest["wikitext2_bytes"] = cut
    manifest["gsm8k_train_rows"] = len(train)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def data_texts(data: Path) -> list[str]:
    """Every text of the carried folder: what the tokenizer's vocabulary is trained on."""
    from fair_calib.data import read_jsonl

    texts = []
    for split in ("test", "train"):
        texts += [r["question"] + " " + r["answer"]
                  for r in read_jsonl(data / "gsm8k" / f"{split}.jsonl")]
    texts += [line for item in read_hellaswag_items(data / HELLASWAG_FILE) for line in item]
    texts += (data / WIKITEXT_FILE).read_text(encoding="utf-8").splitlines()
    return texts


# ------------------------------------------------------------------------------ checkpoints
def family_tokenizer(texts: list[str], family: str, vocab_size: int | None, max_length: int):
    """The word-level tokenizer of ``texts`` with ``family``'s special-token names, its vocabulary
    padded with ``<|reserved_k|>`` tokens to ``vocab_size`` (None: its own size)."""
    from tokenizers import Tokenizer

    from fair_calib.models.tiny.tokenizer import train_tokenizer, wrap_fast
    from fair_calib.models.toy_hub import HUB_SPECIAL_TOKENS, rename_special_tokens

    tok = train_tokenizer(texts)
    if vocab_size is not None:
        spec = json.loads(tok.to_str())
        vocab = spec["model"]["vocab"]
        if len(vocab) > vocab_size:
            raise ValueError(f"the tokenizer has {len(vocab)} tokens, more than the model's "
                             f"vocabulary of {vocab_size}")
        vocab.update({f"<|reserved_{k}|>": k for k in range(len(vocab), vocab_size)})
        tok = Tokenizer.from_str(json.dumps(spec))
    fast = wrap_fast(tok)
    fast.model_max_length = max_length
    return rename_special_tokens(fast, HUB_SPECIAL_TOKENS[family])


def model_spec(family: str, layers: int, smoke: bool, vocab_size: int | None) -> dict:
    """The native config's fields: the real shape with ``layers`` blocks (tiny widths and the
    tokenizer's vocabulary with ``smoke``)."""
    from benchmarks import shapes

    spec = dict(shapes.SHAPES[FAMILY_SHAPE[family]])
    for key in ("cls", "adapter", "mask_id"):
        spec.pop(key)
    spec["num_hidden_layers"] = layers
    if smoke:
        spec.update(SMOKE, num_key_value_heads=SMOKE_KV_HEADS[family], vocab_size=vocab_size)
    theta = spec.pop("rope_theta")
    spec["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    return spec


def write_checkpoint(family: str, out: Path, layers: int, smoke: bool, texts: list[str]) -> dict:
    """One random-weight checkpoint in ``family``'s hub layout, with its tokenizer, at ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from fair_calib import io
    from fair_calib.models.hub import LAYOUTS, native_config, save_hub_layout

    t0 = time.perf_counter()
    spec = model_spec(family, layers, smoke, None)
    tok = family_tokenizer(texts, family, None if smoke else spec["vocab_size"],
                           spec["max_position_embeddings"])
    spec = model_spec(family, layers, smoke, len(tok)) if smoke else spec
    ids = {"mask_token_id": tok.mask_token_id, "pad_token_id": tok.pad_token_id,
           "eos_token_id": tok.eos_token_id}
    layout = LAYOUTS[family]
    config_cls, model_cls = ((LlamaConfig, LlamaForCausalLM) if layout.native_arch == "llama"
                             else (Qwen2Config, Qwen2ForCausalLM))
    base = config_cls(**spec, tie_word_embeddings=False, pad_token_id=ids["pad_token_id"],
                      eos_token_id=ids["eos_token_id"])
    # through the hub config.json and back: the model is what the loader will build
    native = native_config(layout, {**layout.to_hub(base), **ids})
    dtype = torch.float32 if smoke else torch.bfloat16
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(native)
    finally:
        torch.set_default_dtype(prev)
    model.to("cpu")
    with io.atomic_dir(out) as tmp:
        save_hub_layout(model, layout, tmp, max_shard_bytes=2 * 1024 ** 3, extra_config=ids)
        tok.save_pretrained(tmp)
    return {"family": family, "layers": layers, "dtype": str(dtype), "spec": spec,
            "tokenizer_words": sum(not t.startswith("<|reserved_") for t in tok.get_vocab()),
            "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
            "seconds": round(time.perf_counter() - t0, 1)}


# ------------------------------------------------------------------------------ environment
def check_env() -> list[str]:
    """Versions of what the run relies on (into env.txt, beside the summary)."""
    import importlib.metadata as md

    out = []
    for name in ("torch", "triton", "transformers", "tokenizers", "numpy", "pandas", "pyarrow",
                 "fsspec", "snakemake", "lm-eval", "datasets"):
        try:
            out.append(f"{name} {md.version(name)}")
        except md.PackageNotFoundError:
            out.append(f"{name} MISSING")
    return out


# ------------------------------------------------------------------------------ summary
def job_records(run: Path) -> list[dict]:
    """One record per log of ``run/logs``: rule, wildcards, the job lines' fields, and the
    process seconds of its Snakemake benchmark file where there is one."""
    from fair_calib.cli import JOB_LINE

    records = []
    for log in sorted((run / "logs").rglob("*.log")):
        rel = log.relative_to(run / "logs").with_suffix("")
        rec = {"job": rel.parts[0], "wildcards": "/".join(rel.parts[1:]), "status": "no job line"}
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith(JOB_LINE):
                fields = json.loads(line[len(JOB_LINE):])
                rec.update(fields)
        if rec["status"] == "start":
            rec["status"] = "started, never ended (killed?)"
        bench = run / "results" / "benchmarks" / rel.with_suffix(".tsv")
        if bench.is_file():
            rows = bench.read_text().splitlines()
            rec["process_s"] = float(rows[1].split("\t")[0])
        records.append(rec)
    return sorted(records, key=lambda r: (r.get("start", float("inf")), r["job"], r["wildcards"]))


def max_overlap(records: list[dict], gpu_only: bool) -> int:
    """The most jobs (GPU jobs: ``gpu_only``) that ran at one time."""
    events = sorted((t, d) for r in records
                    if "wall_s" in r and not (gpu_only and r["card"] == "cpu")
                    for t, d in ((r["start"], 1), (r["start"] + r["wall_s"], -1)))
    most = now = 0
    for _, d in events:
        now += d
        most = max(most, now)
    return most


def _fmt(x, digits=1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


COPY_JOBS = ("gather_eval",)     # one shard: `cp`, no stage process, so no job line


def jobs_table(records: list[dict]) -> list[str]:
    t0 = min((r["start"] for r in records if "start" in r), default=0.0)
    out = ["| job | wildcards | status | wall s | process s | card | peak GPU GB | start s |",
           "|---|---|---|---:|---:|---|---:|---:|"]
    for r in records:
        if r["job"] in COPY_JOBS and r["status"] == "no job line":
            continue
        start = r["start"] - t0 if "start" in r else None
        out.append(f"| {r['job']} | {r['wildcards']} | {r['status']} | {_fmt(r.get('wall_s'))} "
                   f"| {_fmt(r.get('process_s'))} | {r.get('card', '-')} "
                   f"| {_fmt(r.get('peak_gpu_gb'), 2)} | {_fmt(start)} |")
    return out


def methods_table(records: list[dict]) -> list[str]:
    """Evaluation wall seconds per (model, task) and method, FP first, and each / FP."""
    cells: dict[tuple[str, str], dict[str, float]] = {}
    methods: list[str] = []
    for r in records:
        if r["job"] != "evaluate" or "wall_s" not in r:
            continue
        model, method, _bits, task = r["wildcards"].split("/")[:4]
        cells.setdefault((model, task), {})[method] = r["wall_s"]
        methods += [method] if method not in methods else []
    order = {m: i for i, m in enumerate(METHOD_ORDER)}
    methods = sorted(methods, key=lambda m: (order.get(m, len(order)), m))
    if not cells:
        return []
    out = ["| model | task | " + " | ".join(f"{m} s" for m in methods) + " |",
           "|---|---|" + "---:|" * len(methods)]
    for (model, task), row in sorted(cells.items()):
        fp = row.get("fp")
        vals = [f"{_fmt(row.get(m))}" + (f" ({row[m] / fp:.2f}x)" if fp and m in row and m != "fp"
                                          else "") for m in methods]
        out.append(f"| {model} | {task} | " + " | ".join(vals) + " |")
    return out


def summary_lines(run: Path, records: list[dict]) -> list[str]:
    timed = [r for r in records if "wall_s" in r]
    span = (max(r["start"] + r["wall_s"] for r in timed) - min(r["start"] for r in timed)
            if timed else 0.0)
    cards = sorted({r["card"] for r in timed if r["card"] != "cpu"})
    failed = [r for r in records if r["status"] != "ok"
              and not (r["job"] in COPY_JOBS and r["status"] == "no job line")]
    copies = sum(1 for r in records if r["job"] in COPY_JOBS and r["status"] == "no job line")
    env = run / "env.txt"
    lines = [f"# GPU DAG run ({run})", "", "```"]
    lines += (env.read_text().splitlines() if env.is_file() else ["(no env.txt)"]) + ["```", "",
             f"jobs with a job line: {len(timed)}; not ok: {len(failed)}; cards: "
             f"{', '.join(cards) or 'none (CPU)'}; span first start -> last end: {span:.1f} s; "
             f"sum of job wall times: {sum(r['wall_s'] for r in timed):.1f} s; most jobs at once: "
             f"{max_overlap(records, False)} (GPU jobs: {max_overlap(records, True)})", "",
             "wall s: the stage's own time (fair_calib.cli job line: after the interpreter "
             "started, imports included); process s: Snakemake's benchmark file (the whole "
             "command), where the rule has one; start s: after the first job's start. "
             f"{copies} gather_eval jobs of one shard (a file copy, no Python) are not listed.",
             ""]
    lines += jobs_table(records) + [""]
    methods = methods_table(records)
    if methods:
        lines += ["Evaluation wall s per method (x: over FP):", ""] + methods + [""]
    return lines


def write_out(run: Path, out: Path, lines: list[str], records: list[dict],
              tail_lines: int = 12) -> None:
    """summary.md, jobs.json, logs_tail.txt and the run's tables into ``out`` (flat)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    (out / "jobs.json").write_text(json.dumps(records, indent=1))
    tails = []
    for log in sorted((run / "logs").rglob("*.log")):
        text = log.read_text(errors="replace").splitlines()
        tails += [f"==> {log.relative_to(run)} <=="] + text[-tail_lines:] + [""]
    (out / "logs_tail.txt").write_text("\n".join(tails))
    for tex in sorted((run / "results" / "tables").glob("*.tex"))[:4]:
        (out / tex.name).write_bytes(tex.read_bytes())


# ------------------------------------------------------------------------------ CLI
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("data", help="the carried documents (CPU machine)")
    d.add_argument("--src", type=Path, required=True, help="the offline copies (../shared/data)")
    d.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("checkpoints", help="random-weight hub-layout checkpoints")
    c.add_argument("--data", type=Path, required=True)
    c.add_argument("--out", type=Path, required=True, help="folder of models/{llada,dream}")
    c.add_argument("--layers", type=int, required=True)
    c.add_argument("--smoke", action="store_true", help="tiny widths, float32 (CPU)")
    sub.add_parser("check-env", help="versions of what the run relies on")
    s = sub.add_parser("summary", help="per-job wall time and card from a run's logs")
    s.add_argument("--run", type=Path, required=True)
    s.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.cmd == "data":
        m = write_data(args.src, args.out)
        print(json.dumps({k: v for k, v in m.items() if k != "documents"}))
    elif args.cmd == "checkpoints":
        texts = data_texts(args.data)
        for family in FAMILY_SHAPE:
            print(json.dumps(write_checkpoint(family, args.out / family, args.layers, args.smoke,
                                              texts)), flush=True)
    elif args.cmd == "check-env":
        print("\n".join(check_env()))
    else:
        records = job_records(args.run)
        lines = summary_lines(args.run, records)
        print("\n".join(lines))
        if args.out is not None:
            write_out(args.run, args.out, lines, records)


if __name__ == "__main__":
    main()
