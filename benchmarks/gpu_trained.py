"""The pipeline itself on one lent GPU (issues 30, 40): the grid's DAG at the real widths, the
embedded default, trained GPU-width models (real kernels against fake quantization).

    python benchmarks/gpu_trained.py wheels    # CPU machine: .whl/, what the lent machine lacks
    python benchmarks/gpu_trained.py data [--src ../shared/data] [--out .gpu_dag_data]   # CPU
    python benchmarks/gpu_trained.py run [--phases default,wide,fake,cpu,grid,bench] [--out DIR]
    python benchmarks/gpu_trained.py run --cpu-smoke [--phases ...]   # tiny widths on the CPU
    fair-calib compare-runs RUN_A RUN_B; fair-calib jobs RUN   # read a run folder afterwards

``.whl/`` (installed by ``run`` into ``--site``) and ``.gpu_dag_data/`` (``data``: GSM8K test
questions and HellaSwag items, 2 from each of 3 token-count classes with its shortest and
longest; GSM8K train questions for the probes; the start of WikiText-2; ``manifest.json``) are
never committed: name both in the device tool's ``carry``. Phases of ``run``, each a cold,
timed Snakemake run in a folder of its own under ``--runs``, started only while ``--deadline``
leaves it time (one call stays inside 10 minutes); ``grid`` and ``bench`` are not in the
default list:

- ``bench``: config/bench.yaml with config/bench_gpu.yaml (W3A3, 8 epochs, fifteen seeds a
  method) on the card, the tables' cells first; a second call on the same warm machine resumes
  it; ``benchmarks/bench_power.py``'s report of every finished cell is in the summary.
- ``grid``: config/gpu_dag.yaml on random weights in the LLaDA / Dream hub layouts at the real
  widths (benchmarks/shapes.py), ``--grid-layers`` blocks, the carried documents' word-level
  tokenizer padded to the model's vocabulary (a word is about a BPE token of English); GPU
  slots off, at most ``--grid-jobs`` GPU jobs at once (``--resources gpu=N``).
- ``default``: the embedded default with ``--config device=cuda``, twice cold (two cards: on the
  first, the other phases on the second); tables compared with each other and the CPU's.
- ``wide``: config/gpu_trained.yaml: LLaDA- and Dream-layout models 1,024 wide trained on the
  card and given activation outliers, W4A4 RTN / QuaRot / FlatQuant / FAIR-Calib, W8A8 RTN /
  SmoothQuant, evaluated in bf16 under ``FAIR_CALIB_LOWBIT=auto`` (integer codes); ``--tables``
  and ``--methods`` choose the cells.
- ``fake``: the wide run's evaluations again under ``FAIR_CALIB_LOWBIT=fake``; real vs fake.
- ``cpu``: FP and ``--cpu-method`` by fake quantization on the CPU's own bf16 kernels, beside
  ``fake``: the card-to-CPU noise of bf16 fake quantization, against ``fake``.

The decode phase (early exit and W4A4 / bf16 time on the trained models) is retired: its
answers are in docs/benchmarks.md, its code at ``git show c9349df:benchmarks/gpu_trained.py``.

Each phase's jobs are summarised (``fair-calib jobs``), runs compared (``fair-calib
compare-runs``). ``--out`` (default ``$OUT``): summary.md and results.tgz (kept files, logs).
"""
from __future__ import annotations

import argparse
import bz2
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from fair_calib.report.compare import compare_runs, format_rows  # noqa: E402
from fair_calib.report.jobs import job_records, methods_table, summary_lines  # noqa: E402

PHASES = ("default", "wide", "fake", "cpu", "grid", "bench")
DEFAULT_PHASES = ("default", "wide", "fake", "cpu")
# the CPU's table of the embedded default (tests/recorded_hashes.json, "default")
CPU_TABLE_SHA = "97503071140723f312317f6c4951d7a3cc51852c2c534e57d00bcdb18d15c988"
SMOKE_CONFIGS = ["config/gpu_trained.yaml", "config/gpu_trained_cpu.yaml"]
# the phase's Snakemake runs need at least this much time left (seconds)
PHASE_MIN_S = {"default": 200, "wide": 240, "fake": 60, "cpu": 90, "grid": 120, "bench": 120}
NEEDED = ("snakemake", "lm-eval", "datasets")   # what the wheels bring; refused without
# What the lent machine's Python lacks (it has torch, triton, transformers, tokenizers, numpy,
# pandas, pyarrow, ...), at the project environment's versions; typing-extensions and fsspec are
# shipped for the versions pydantic and datasets need. pulp (Snakemake's ILP scheduler, 16 MB)
# is left out: the runs use `--scheduler greedy`.
WHEELS = """annotated-types==0.8.0 argparse-dataclass==2.0.0 chardet==6.0.0.post1
conda-inject==1.3.2 configargparse==1.9.0 dataproperty==1.1.1 datasets==5.2.0 defusedxml==0.7.1
dill==0.4.1 docutils==0.22.4 dpath==2.2.0 evaluate==0.4.6 fastjsonschema==2.22.3
fsspec==2026.9.0 gitdb==4.0.12 gitpython==3.2.1 greenlet==3.5.6 humanfriendly==10.0
immutables==0.21 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 jupyter-core==5.9.1
lm-eval==0.4.13 mbstrdecoder==1.1.5 more-itertools==11.2.1 multiprocess==0.70.19
nbformat==5.11.1 nltk==3.10.4 pathvalidate==3.3.1 platformdirs==4.14.8 pydantic==2.14.4
pydantic-core==2.50.5 pytablewriter==1.2.1 referencing==0.37.0 rpds-py==2026.9.1
smart-open==7.7.1 smmap==5.0.3 snakemake==9.27.1 snakemake-interface-common==1.23.0
snakemake-interface-executor-plugins==9.4.0 snakemake-interface-logger-plugins==2.1.0
snakemake-interface-report-plugins==1.3.0 snakemake-interface-scheduler-plugins==2.0.2
snakemake-interface-storage-plugins==4.4.1 sqlalchemy==2.0.58 sqlmodel==0.0.37
tabledata==1.3.5 tcolorpy==0.1.7 tenacity==9.2.1 throttler==1.2.3 traitlets==5.16.1
typepy==1.3.5 typing-extensions==4.16.0 typing-inspection==0.4.5 yte==1.9.4""".split()
# Published as source only (pure Python): built into wheels here.
SDIST_ONLY = ["connection-pool==0.0.3", "rouge-score==0.1.2", "sqlitedict==2.1.0",
              "word2number==1.1"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64",
             "manylinux1_x86_64"]
INSTALLABLE = re.compile(r"-([a-z0-9]+\.)*(py3|py312|cp312)(\.[a-z0-9]+)*-(none|cp312|abi3)-"
                         r"(any|manylinux[0-9_a-z.]*x86_64)\.whl$")
# the grid's checkpoints: the real shapes by family; the CPU smoke's widths
FAMILY_SHAPE = {"llada": "llada-8b", "dream": "dream-7b"}
SMOKE = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4)
SMOKE_KV_HEADS = {"llada": 4, "dream": 2}       # LLaDA: no GQA; Dream: GQA, as at full size
HELLASWAG_FILE = "hellaswag/hellaswag_val_full.txt.bz2"
WIKITEXT_FILE = "wikitext2/wiki.test.raw"


# ------------------------------------------------------------------------ CPU machine
def wheelhouse_errors(names: list[str]) -> list[str]:
    """Wheels the lent machine (CPython 3.12, x86-64) cannot install, and packages twice."""
    keys = [re.sub(r"-[0-9].*", "", n).lower().replace("_", "-").replace(".", "-") for n in names]
    return ([f"a wheel the lent machine cannot install: {n}" for n in names
             if not INSTALLABLE.search(n)]
            + [f"two versions of: {k}" for k in sorted({k for k in keys if keys.count(k) > 1})])


def build_wheels(dest: Path = REPO / ".whl") -> None:
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    pip = [sys.executable, "-m", "pip"]
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
                    "3.12", "--implementation", "cp", *platforms, "-d", dest, *WHEELS], check=True)
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "-w", dest, *SDIST_ONLY], check=True)
    files = sorted(dest.iterdir())
    errors = wheelhouse_errors([f.name for f in files])
    if errors:
        sys.exit("error: " + "; ".join(errors))
    size = sum(f.stat().st_size for f in files)
    print(f"wheelhouse {dest.name}/: {len(files)} wheels, {size} bytes ({size / 2**20:.0f} MiB)")


def n_tokens(text: str) -> int:
    """Tokens of ``text`` under the grid's word-level tokenizer: one per word or punctuation
    run (its pre-tokenizer's pieces; an unknown word is one [UNK])."""
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
        ranks = ([(lo + hi - 1) // 2] if per_class == 1 else
                 [lo + round(j * (hi - 1 - lo) / (per_class - 1)) for j in range(per_class)])
        picked += [(order[r], c) for r in dict.fromkeys(ranks)]
    return picked


def read_hellaswag_items(path: Path) -> list[list[str]]:
    """The copy's items, 6 lines each (``label: ctx``, gold index, 4 endings)."""
    with bz2.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    lines = lines[:-1] if lines and lines[-1] == "" else lines
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

    def put(rel: str, data: str | bytes) -> None:
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(data if isinstance(data, bytes) else data.encode())

    def jsonl(rows: list[dict]) -> str:
        return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)

    test, train = (read_jsonl(src / "gsm8k" / f"{s}.jsonl") for s in ("test", "train"))
    picks = pick_by_length([n_tokens(r["question"]) for r in test], classes, per_class)
    put("gsm8k/test.jsonl", jsonl([test[i] for i, _ in picks]))
    put("gsm8k/train.jsonl", jsonl(train[:n_train]))
    docs = {"gsm8k_test": [{"index": i, "class": c, "question_tokens":
                            n_tokens(test[i]["question"])} for i, c in picks]}
    items = read_hellaswag_items(src / HELLASWAG_FILE)
    picks = pick_by_length([hellaswag_tokens(it) for it in items], classes, per_class)
    put(HELLASWAG_FILE, bz2.compress("".join(line + "\n" for i, _ in picks
                                             for line in items[i]).encode()))
    docs["hellaswag"] = [{"index": i, "class": c, "request_tokens": hellaswag_tokens(items[i])}
                         for i, c in picks]
    raw = (src / WIKITEXT_FILE).read_bytes()
    cut = raw.rfind(b"\n", 0, wiki_chars) + 1 or len(raw)
    put(WIKITEXT_FILE, raw[:cut])
    manifest = {"source": str(src), "classes": classes, "per_class": per_class,
                "documents": docs, "wikitext2_bytes": cut, "gsm8k_train_rows": len(train[:n_train])}
    put("manifest.json", json.dumps(manifest, indent=1))
    return manifest


def data_texts(data: Path) -> list[str]:
    """Every text of the carried folder: what the tokenizer's vocabulary is trained on."""
    from fair_calib.data import read_jsonl

    texts = [r["question"] + " " + r["answer"] for split in ("test", "train")
             for r in read_jsonl(data / "gsm8k" / f"{split}.jsonl")]
    texts += [line for item in read_hellaswag_items(data / HELLASWAG_FILE) for line in item]
    return texts + (data / WIKITEXT_FILE).read_text(encoding="utf-8").splitlines()


# ------------------------------------------------------------------------ grid checkpoints
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

    spec = {k: v for k, v in shapes.SHAPES[FAMILY_SHAPE[family]].items()
            if k not in ("cls", "adapter", "mask_id")}
    spec["num_hidden_layers"] = layers
    if smoke:
        spec.update(SMOKE, num_key_value_heads=SMOKE_KV_HEADS[family], vocab_size=vocab_size)
    spec["rope_parameters"] = {"rope_type": "default", "rope_theta": spec.pop("rope_theta")}
    return spec


def write_checkpoint(family: str, out: Path, layers: int, smoke: bool, texts: list[str]) -> dict:
    """One random-weight checkpoint in ``family``'s hub layout, with its tokenizer, at ``out``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from fair_calib.jobs import io
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
    torch.manual_seed(0)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu"):
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


# ------------------------------------------------------------------------ run folders
def prepare_run(run: Path) -> None:
    """A run folder holding the workflow's files; the package is imported from the repo."""
    shutil.rmtree(run, ignore_errors=True)
    (run / "bin").mkdir(parents=True)
    for name in ("Snakefile", "workflow", "config", "profiles"):
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, run / name)
    # the rules call `python`: this interpreter, by its own path (a symlink would hide a
    # virtual environment's pyvenv.cfg from it)
    (run / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (run / "bin" / "python").chmod(0o755)


def snakemake(run: Path, args: list[str], budget: float, **env: str) -> tuple[int, float]:
    """Snakemake in ``run`` (environment: ours and ``env``), stopped by SIGINT once ``budget``
    seconds have passed (killed 20 s later); its exit status and wall time; its output in
    ``run/snakemake.log``."""
    env = {**os.environ, "PATH": f"{run / 'bin'}:{os.environ['PATH']}",
           "PYTHONPATH": ":".join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
           "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "FAIR_CALIB_GPU_LOCK_DIR": str(run / ".gpu-slots"), **env}
    cmd = [sys.executable, "-m", "snakemake", "--cores", env.get("GPU_TRAINED_CORES")
           or str(os.cpu_count()), "--scheduler", "greedy", "--keep-going", *args]
    t0 = time.perf_counter()
    with open(run / "snakemake.log", "w") as fh:
        proc = subprocess.Popen(cmd, cwd=run, env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=max(budget, 1))
        except subprocess.TimeoutExpired:
            proc.send_signal(2)
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
    return rc, time.perf_counter() - t0


def table_of(run: Path) -> Path:
    return run / "results" / "tables" / "main.tex"


def configs_of(smoke: bool, grid: bool = False) -> list[str]:
    return ["config/gpu_dag.yaml", "config/gpu_dag_cpu.yaml"][:1 + smoke] if grid else \
        (SMOKE_CONFIGS if smoke else ["config/gpu_trained.yaml"])


def wide_config(smoke: bool) -> dict:
    from fair_calib.checks.config import merged_config

    return merged_config([REPO / c for c in configs_of(smoke)], base=REPO / "config/config.yaml")


def versions() -> list[str]:
    """Versions of what the runs rely on."""
    import importlib.metadata as md

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "MISSING"
    return [f"{n} {version(n)}" for n in ("torch", "triton", "transformers", "tokenizers",
                                           "numpy", "pandas", "pyarrow", "fsspec", *NEEDED)]


def install_wheels(site: Path) -> None:
    """The carried wheelhouse (``wheels``) into ``site``, first on the path."""
    if not (REPO / ".whl").is_dir():
        sys.exit("error: .whl/ is missing: run 'python benchmarks/gpu_trained.py wheels' on the "
                 "CPU machine and name .whl in the device tool's carry")
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", site,
                    *sorted((REPO / ".whl").glob("*.whl"))], check=True)
    os.environ["PYTHONPATH"] = ":".join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, str(site))


def cuda_cards() -> list[list[str]]:
    """(index, name, memory, driver) of each card nvidia-smi lists."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[f.strip() for f in x.split(",")] for x in out.splitlines() if x[:1].isdigit()]


# ------------------------------------------------------------------------ phases
class Runner:
    def __init__(self, args):
        self.args, self.smoke, self.t0 = args, args.cpu_smoke, time.perf_counter()
        self.base = Path(args.runs)
        self.out = Path(args.out) if args.out else None
        self.summary: list[str] = []
        self.card_rows = [] if self.smoke else cuda_cards()
        self.cards = [c[0] for c in self.card_rows]
        self.tables = ["main"] if self.smoke else args.tables.split(",")

    def left(self) -> float:
        return self.args.deadline - (time.perf_counter() - self.t0)

    def note(self, text: str) -> None:
        print(f"[gpu-trained {time.strftime('%H:%M:%S')}] {text}", flush=True)
        self.summary.append(text)

    def keep(self, src: Path | str, name: str) -> None:
        """A file (a Path) or a text for ``--out``, into the archive (few files come back)."""
        if self.out and (isinstance(src, str) or src.is_file()):
            dst = self.base / "_out" / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_text(src) if isinstance(src, str) else shutil.copy(src, dst)

    def snake(self, name: str, run: Path, args: list[str], what: str, work: Path | None = None,
              margin: float = 20, **env: str) -> int:
        """One timed Snakemake run of a phase: noted, its log and jobs (in ``work``) kept."""
        rc, secs = snakemake(run, args, self.left() - margin, **env)
        self.note(f"{name} {what}: exit {rc}, {secs:.0f} s")
        self.keep(run / "snakemake.log", f"{name}.snakemake.log")
        self.jobs(work or run, name)
        return rc

    def jobs(self, run: Path, name: str) -> None:
        """A run's jobs: the summary's first line and the methods' times noted, all kept."""
        records = job_records(run)
        lines, methods = summary_lines(name, records), methods_table(records)
        self.note(lines[0])
        if methods:
            self.note(f"{name} evaluation wall s per method (x: over FP):\n" + "\n".join(methods))
        self.keep("\n".join(lines) + "\n", f"{name}.jobs.md")
        self.keep(json.dumps(records, indent=1), f"{name}.jobs.json")

    def grid(self) -> None:
        """config/gpu_dag.yaml on random-weight checkpoints (see the module doc)."""
        data, run = Path(self.args.data).resolve(), self.base / "grid"
        layers = self.args.grid_layers or (2 if self.smoke else 4)
        jobs = self.args.grid_jobs or (2 if self.smoke else 4)
        prepare_run(run)
        texts = data_texts(data)
        for family in FAMILY_SHAPE:
            self.note(json.dumps(write_checkpoint(family, run / "models" / family, layers,
                                                  self.smoke, texts)))
        if self.left() < 80:
            return self.note(f"grid: Snakemake skipped, {self.left():.0f} s left")
        lowbit = "fake" if self.smoke else "auto"
        prior = [f"results/prior/{m}-gpu-dag/default.parquet" for m in FAMILY_SHAPE]
        self.snake("grid", run, ["--config", f"data_dir={data}", "--resources", f"gpu={jobs}",
                                 "--rerun-incomplete", "--prioritize", *prior, "--configfile",
                                 *configs_of(self.smoke, grid=True)],
                   f"({layers} layers, {jobs} GPU jobs at once, FAIR_CALIB_LOWBIT={lowbit})",
                   FAIR_CALIB_LOWBIT=lowbit, FAIR_CALIB_GPU_SLOTS="0", HF_HOME=str(run / "hf"))

    def default(self, card: str | None) -> None:
        """The embedded default on ``card``, twice cold (each in a fresh folder): the tables
        compared byte for byte, and with the CPU's."""
        tables = []
        for name in ("default-a", "default-b"):
            if self.left() < PHASE_MIN_S["default"]:
                self.note(f"{name}: skipped, {self.left():.0f} s left")
                break
            run = self.base / name
            prepare_run(run)
            self.snake(name, run, ["results/tables/main.tex", "--config", "device=cuda"],
                       f"on cuda (card {card}, cold)",
                       **({"CUDA_VISIBLE_DEVICES": card} if card else {}))
            self.note(f"{name}: table {'written' if table_of(run).is_file() else 'MISSING'}")
            if table_of(run).is_file():
                tables.append(table_of(run).read_bytes())
                self.keep(table_of(run), f"{name}.main.tex")
        if len(tables) == 2:
            self.note("default: the rerun's table is "
                      + ("identical" if tables[0] == tables[1] else "DIFFERENT"))
        if tables:
            sha = hashlib.sha256(tables[0]).hexdigest()
            self.note(f"default: card table sha256 {sha[:12]}; the CPU's recorded "
                      f"{CPU_TABLE_SHA[:12]} ({'same' if sha == CPU_TABLE_SHA else 'differs'})")

    def bench(self) -> None:
        """config/bench.yaml with config/bench_gpu.yaml on the card, cold, its two tables' cells
        first; a later call on the same warm machine resumes the same folder. Kept: the tables,
        the figures (PNG, TXT), and benchmarks/bench_power.py's report of every cell that was
        evaluated (means, sd over seeds, paired tests against FlatQuant and against uniform
        weights), so a run the deadline stops still reports what it finished."""
        from bench_power import report

        run = self.base / "bench"
        if not (run / "Snakefile").is_file():
            prepare_run(run)
        work = run / "runs" / "bench-gpu"
        self.snake("bench", run, ["--configfile", "config/bench.yaml", "config/bench_gpu.yaml",
                                  "--rerun-incomplete", "--prioritize", "results/tables/main.tex",
                                  "results/tables/ablation.tex"],
                   "(config/bench_gpu.yaml, on cuda)", work=work)
        for path in sorted((work / "results").glob("*/*")):
            if path.parent.name in ("tables", "figures") and path.suffix != ".pdf":
                self.keep(path, f"bench/{path.parent.name}/{path.name}")
        main = ["fp", "rtn", "quarot", "flatquant", "fair-calib", "tmas", "mcs", "qdrop",
                "qdrop-weighted"]
        ablation = ["uniform-ptq", "hit-only", "rel-only", "fair-calib", "floor0.01", "floor1"]
        lines = (report(work, main, "flatquant") + ["", "Ablation:", ""]
                 + report(work, ablation, "uniform-ptq"))
        self.note("bench cells:\n" + "\n".join(lines))

    def cell_targets(self, methods: list[str]) -> list[str]:
        """The evaluations of ``methods`` (``fp``, a method, or one seed's run ``name@s<k>``)
        in the tables' cells: every model and task of a table that lists the method."""
        cfg, out = wide_config(self.smoke), []
        for name in self.tables:
            table = cfg["tables"][name]
            for x in methods:
                if x == "fp" or x.split("@")[0] in table["methods"]:
                    bits = "fp" if x == "fp" else table.get("bits", "w4a4")
                    out += [f"results/eval/{m}/{x}/{bits}/{t}.parquet" for m in table["models"]
                            for t in table["tasks"]]
        return list(dict.fromkeys(out))

    def wide_targets(self) -> list[str]:
        """The tables, or ``--methods``' cells of them."""
        methods = [m for m in (self.args.methods or "").split(",") if m]
        return (self.cell_targets(methods) if methods
                else [f"results/tables/{t}.tex" for t in self.tables])

    def wide(self) -> None:
        run = self.base / "wide"
        prepare_run(run)
        lowbit = "fake" if self.smoke else "auto"
        work = run / "runs" / "gpu_trained"
        # targets first: --configfile takes every word after it
        self.snake("wide", run, self.wide_targets() + ["--configfile", *configs_of(self.smoke)],
                   f"(FAIR_CALIB_LOWBIT={lowbit})", work, FAIR_CALIB_LOWBIT=lowbit)
        for tex in sorted((work / "results" / "tables").glob("*.tex")):
            self.keep(tex, f"wide.{tex.name}")

    def cpu_targets(self) -> list[str]:
        """The CPU's share (bf16 on CPU cores is slow): FP and ``--cpu-method``."""
        return self.cell_targets(["fp", self.args.cpu_method])

    def rerun_evals(self, name: str, lowbit: str, device: str | None,
                    targets: list[str] | None = None, cores: int | None = None) -> Path | None:
        """A copy of the wide run whose evaluations run again (``lowbit``, ``device``). The
        copy's evaluations of ``targets`` are deleted first (every evaluation, for a table), so
        a rerun stopped by the deadline leaves cells missing, never the wide run's copies. On
        the CPU, the CPU's own fastest kernels (FAIR_CALIB_CPU_NUMERICS=native: oneDNN's bf16
        GEMMs; the pinned AVX2 path is several times slower in bf16)."""
        src, run = self.base / "wide", self.base / name
        targets = targets or self.wide_targets()
        if not (src / "runs" / "gpu_trained" / "results" / "eval").is_dir():
            return self.note(f"{name}: skipped (the wide run has no evaluations)")
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(src, run, symlinks=True)
        work = run / "runs" / "gpu_trained"
        drop_evaluations(work, targets)
        env = {"FAIR_CALIB_LOWBIT": lowbit}
        extra = ["--config", f"device={device}"] * bool(device)
        if cores:
            env["GPU_TRAINED_CORES"] = str(cores)
        if device == "cpu":
            threads = max(1, min(8, (cores or os.cpu_count() or 2) // max(1, len(targets))))
            extra += ["--set-threads", f"evaluate_shard={threads}"]
            env["FAIR_CALIB_CPU_NUMERICS"] = "native"
        self.snake(name, run, targets + ["--forcerun", "evaluate_shard", *extra, "--configfile",
                                         *configs_of(self.smoke)],
                   f"(FAIR_CALIB_LOWBIT={lowbit}, device {device or 'cuda'})", work, 10, **env)
        self.keep(table_of(work), f"{name}.main.tex")
        return work

    def compare(self, a: Path, b: Path, names, out_name: str) -> None:
        rows = compare_runs(a, b, names)
        self.note(format_rows(rows, names))
        self.keep(json.dumps(rows, indent=1), out_name)

    def write_summary(self) -> None:
        """``--out``: summary.md, and results.tgz: the kept files, every run's logs and tables."""
        if not self.out:
            return
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.md").write_text("\n\n".join(self.summary) + "\n")
        with tarfile.open(self.out / "results.tgz", "w:gz") as tar:
            for sub in ("_out", "*/logs", "*/runs/*/logs", "*/results/tables",
                        "*/runs/*/results/tables"):
                for path in sorted(self.base.glob(sub)):
                    rel = str(path.relative_to(self.base))
                    tar.add(path, arcname="kept" if rel == "_out" else rel)


def drop_evaluations(work: Path, targets: list[str]) -> None:
    """Delete ``targets``' evaluations in the run ``work`` (gathered file and shards); every
    evaluation and table where a target is a table."""
    if any(t.startswith("results/tables/") for t in targets):
        for sub in ("results/eval", "results/tables"):
            shutil.rmtree(work / sub, ignore_errors=True)
        return
    for t in targets:
        (work / t).unlink(missing_ok=True)
        shutil.rmtree(work / t.removesuffix(".parquet"), ignore_errors=True)


# ------------------------------------------------------------------------ CLI
def run(args) -> int:
    phases = [p for p in args.phases.split(",") if p]
    if set(phases) - set(PHASES):
        sys.exit(f"error: --phases {sorted(set(phases) - set(PHASES))}: choose from {PHASES}")
    if "grid" in phases and not (Path(args.data) / "manifest.json").is_file():
        sys.exit(f"error: {args.data}/manifest.json is missing: run 'python benchmarks/"
                 "gpu_trained.py data' on the CPU machine and name the folder in carry")
    if not args.cpu_smoke:
        install_wheels(Path(args.site))
    r = Runner(args)
    found = versions()
    r.note(f"phases {phases}; cards {r.card_rows or 'none'}; {os.cpu_count()} CPU cores; "
           + ", ".join(found))
    if any(v.endswith("MISSING") for v in found[-len(NEEDED):]):
        sys.exit(f"error: {', '.join(found[-len(NEEDED):])}: .whl/ brings what the lent "
                 "machine lacks")
    side = None
    if "default" in phases:
        phases.remove("default")
        if len(r.cards) > 1 and phases:
            # two cards: the default's runs on the first, the other phases on the second, at
            # once, each Snakemake with half the cores
            os.environ["GPU_TRAINED_CORES"] = str(max(1, (os.cpu_count() or 2) // 2))
            side = threading.Thread(target=r.default, args=(r.cards[0],))
            side.start()
            os.environ["CUDA_VISIBLE_DEVICES"] = r.cards[1]
        else:
            r.default(r.cards[0] if r.cards else None)
    run_phases(r, phases, args)
    if side is not None:
        side.join()
    r.write_summary()
    return 0


def run_phases(r: Runner, phases: list[str], args) -> None:
    """The phases in order; ``cpu`` beside ``fake`` when both run (the CPU's evaluations leave
    the cards free: they get three quarters of the cores, the card's jobs the rest), compared
    once both are done."""
    side = None
    if {"fake", "cpu"} <= set(phases):
        cores = int(os.environ.get("GPU_TRAINED_CORES") or os.cpu_count() or 2)
        cpu_cores, card_cores = max(1, cores * 3 // 4), max(1, cores - cores * 3 // 4)
        phases = [p for p in phases if p != "cpu"]
        side = threading.Thread(target=r.rerun_evals, args=("cpu", "fake", "cpu"),
                                kwargs={"targets": r.cpu_targets(), "cores": cpu_cores})
    for phase in phases:
        if phase == "fake" and side is not None:
            if r.left() < PHASE_MIN_S["cpu"]:
                r.note(f"cpu: skipped, {r.left():.0f} s left before the deadline")
                side = None
            else:
                os.environ["GPU_TRAINED_CORES"] = str(card_cores)
                side.start()
        run_phase(r, phase, args)
    if side is not None:
        side.join()
        compare_cpu(r)


def compare_cpu(r: Runner) -> None:
    fake, cpu = (r.base / p / "runs" / "gpu_trained" for p in ("fake", "cpu"))
    if fake.is_dir() and cpu.is_dir():
        r.compare(fake, cpu, ("cardfake", "cpufake"), "fake_card_vs_cpu.json")


def run_phase(r: Runner, phase: str, args) -> None:
    wide, fake = (r.base / p / "runs" / "gpu_trained" for p in ("wide", "fake"))
    if r.left() < PHASE_MIN_S[phase] * (0.3 if args.cpu_smoke else 1):
        r.note(f"{phase}: skipped, {r.left():.0f} s left before the deadline")
    elif phase == "wide":
        r.wide()
    elif phase == "grid":
        r.grid()
    elif phase == "bench":
        r.bench()
    elif phase == "fake" and r.rerun_evals("fake", "fake", None):
        r.compare(wide, fake, ("real", "fake"), "real_vs_fake.json")
    elif phase == "cpu" and r.rerun_evals("cpu", "fake", "cpu", r.cpu_targets()):
        compare_cpu(r)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("wheels", help="CPU machine: .whl/, what the lent machine's Python lacks")
    dp = sub.add_parser("data", help="CPU machine: the grid's carried documents")
    dp.add_argument("--src", default=os.environ.get("FAIR_CALIB_SOURCE_DATA", "../shared/data"))
    dp.add_argument("--out", default=".gpu_dag_data")
    rp = sub.add_parser("run")
    rp.add_argument("--phases", default=",".join(DEFAULT_PHASES), help=f"of {','.join(PHASES)}")
    rp.add_argument("--runs", default="/tmp/gpu_trained", help="where the run folders go")
    rp.add_argument("--out", default=os.environ.get("OUT"))
    rp.add_argument("--deadline", type=float, default=560.0, help="seconds for all phases")
    rp.add_argument("--site", default="/tmp/site", help="where the carried wheels are installed")
    rp.add_argument("--data", default=".gpu_dag_data", help="the grid's documents (`data`)")
    rp.add_argument("--grid-layers", type=int, help="blocks a grid model (4; smoke 2)")
    rp.add_argument("--grid-jobs", type=int, help="the grid's GPU jobs at once (4; smoke 2)")
    rp.add_argument("--methods", help="only these methods' cells of the tables (fp, a method, "
                    "or one seed's run: fair-calib-seeds@s0), comma-separated")
    rp.add_argument("--tables", default="main,w8a8", help="config/gpu_trained.yaml's (plain: "
                    "the models without outliers)")
    rp.add_argument("--cpu-method", default="fair-calib-seeds@s0",
                    help="the method whose cells the cpu phase evaluates again, beside FP")
    rp.add_argument("--cpu-smoke", action="store_true", help="tiny widths, fake quantization")
    args = ap.parse_args(argv)
    if args.cmd == "wheels":
        build_wheels()
    elif args.cmd == "data":
        m = write_data(Path(args.src), Path(args.out))
        print(json.dumps({k: v for k, v in m.items() if k != "documents"}))
    return run(args) if args.cmd == "run" else 0


if __name__ == "__main__":
    raise SystemExit(main())
