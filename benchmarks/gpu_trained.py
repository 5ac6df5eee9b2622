"""Does the GPU give the reference's numbers? (issue 40) The pipeline itself, on one lent GPU.

    python benchmarks/gpu_trained.py run [--phases default,wide,fake,cpu,decode] [--out DIR]
    python benchmarks/gpu_trained.py run --cpu-smoke            # the suite's CPU version
    python benchmarks/gpu_trained.py compare RUN_A RUN_B        # two runs' evaluations, cell by cell

Phases of ``run`` (each a Snakemake run of the project in a folder of its own, cold, timed; a
phase starts only while ``--deadline`` leaves it time, so one call stays inside 10 minutes):

- ``default``: the embedded default with ``--config device=cuda`` (every stage on the card), and
  with two cards a second cold run at once on the other card; the tables compared byte for byte
  with each other and printed beside the CPU's recorded table.
- ``wide``: ``config/gpu_trained.yaml``: LLaDA- and Dream-layout models 1,024 wide (head_dim
  128) trained on the card, W4A4 RTN / QuaRot / FlatQuant / FAIR-Calib and W8A8 RTN /
  SmoothQuant, evaluated in bfloat16 under ``FAIR_CALIB_LOWBIT=auto`` (integer codes), plus the
  256-token generation task for early exit.
- ``fake``: the same calibrations evaluated again under ``FAIR_CALIB_LOWBIT=fake`` (a copy of
  the wide run, its evaluations forced), then ``compare`` real against fake.
- ``cpu``: the same calibrations evaluated by fake quantization on the CPU (bfloat16): bf16
  arithmetic's own device-to-device noise, compared with the card's fake quantization.
- ``decode``: batch-1 decodes of the wide models at the grid's generation length (256 tokens,
  256 steps; LLaDA in blocks of 32): steps run with exact early exit against the full
  schedule, and W4A4 FAIR-Calib (integer codes) against bf16 time, CUDA graphs replayed.

``compare`` prints, per (model, method, bits, task): each run's accuracy, how many generations
are identical, and the largest difference of a choice's log-likelihood; a summary of a
phase's comparison goes to ``$OUT`` with the tables and job timings.

Wheels: snakemake, lm-eval and datasets travel as in ``benchmarks/gpu_dag.sh`` (``wheels``
there builds ``.whl/``; name it in the device tool's ``carry``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PHASES = ("default", "wide", "fake", "decode", "cpu")
# the CPU's table of the embedded default (tests/recorded_hashes.json, "default")
CPU_TABLE_SHA = "97503071140723f312317f6c4951d7a3cc51852c2c534e57d00bcdb18d15c988"
WIDE_CONFIGS = ["config/gpu_trained.yaml"]
SMOKE_CONFIGS = ["config/gpu_trained.yaml", "config/gpu_trained_cpu.yaml"]
LONG_TASK = "synth_gen_long"
# the phase's Snakemake runs need at least this much time left (seconds)
PHASE_MIN_S = {"default": 200, "wide": 240, "fake": 60, "cpu": 90, "decode": 60}


def log(msg: str) -> None:
    print(f"[gpu-trained {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------------ run folders
def prepare_run(run: Path) -> None:
    """A run folder holding the workflow's files; the package is imported from the repo."""
    shutil.rmtree(run, ignore_errors=True)
    (run / "bin").mkdir(parents=True)
    for name in ("Snakefile", "workflow", "config", "profiles"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, run / name)
    # the rules call `python`: this interpreter, by its own path
    (run / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (run / "bin" / "python").chmod(0o755)


def run_env(run: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{run / 'bin'}:{env['PATH']}"
    env["PYTHONPATH"] = ":".join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               FAIR_CALIB_GPU_LOCK_DIR=str(run / ".gpu-slots"))
    env.update(extra)
    return env


def snakemake(run: Path, args: list[str], env: dict[str, str], budget: float,
              log_name: str) -> tuple[int, float]:
    """Snakemake in ``run`` (stopped by SIGINT once ``budget`` seconds have passed); returns
    its exit status and wall time. Its output goes to ``run/<log_name>``."""
    cores = env.get("GPU_TRAINED_CORES") or str(os.cpu_count())
    cmd = [sys.executable, "-m", "snakemake", "--cores", cores, "--scheduler",
           "greedy", "--keep-going", *args]
    t0 = time.perf_counter()
    with open(run / log_name, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=run, env=env, stdout=fh, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=max(budget, 1))
        except subprocess.TimeoutExpired:
            proc.send_signal(2)
            rc = proc.wait()
    return rc, time.perf_counter() - t0


def table_of(run: Path, workdir: str = ".") -> Path:
    return run / workdir / "results" / "tables" / "main.tex"


# ------------------------------------------------------------------------ comparisons
def eval_records(run_dir: Path) -> dict[tuple[str, str, str, str], dict]:
    """``(model, method, bits, task) -> per_doc`` of every gathered evaluation under
    ``run_dir/results/eval`` (the raw JSON beside each Parquet file)."""
    from fair_calib.evaluate.run import run_per_docs

    out = {}
    for path in sorted((run_dir / "results" / "eval").glob("*/*/*/*.parquet")):
        model, method, bits = path.parts[-4:-1]
        out[(model, method, bits, path.stem)] = merge_per_docs(run_per_docs(path))
    return out


def merge_per_docs(per_docs: list[dict]) -> dict:
    """One run's shards as one record: metrics, responses and executions."""
    merged: dict = {"metrics": {}, "responses": {}, "executions": []}
    for d in per_docs:
        for key, by_task in d.get("metrics", {}).items():
            for t, docs in by_task.items():
                merged["metrics"].setdefault(key, {}).setdefault(t, {}).update(docs)
        for t, by_filter in (d.get("responses") or {}).items():
            for filt, docs in by_filter.items():
                merged["responses"].setdefault(t, {}).setdefault(filt, {}).update(docs)
        merged["executions"] += d.get("executions") or ([d["execution"]] if d.get("execution")
                                                        else [])
    return merged


def accuracy(per_doc: dict) -> float | None:
    """The mean of the run's first accuracy-like metric (acc / exact_match), in %."""
    for key in sorted(per_doc.get("metrics", {})):
        if key.split(",")[0] in ("acc", "exact_match", "acc_norm"):
            vals = [v for docs in per_doc["metrics"][key].values() for v in docs.values()]
            return 100.0 * sum(vals) / len(vals) if vals else None
    return None


def response_diff(a: dict, b: dict) -> dict:
    """Identical generations (text answers) and the largest log-likelihood difference
    (choices' scores) between two runs' responses of the same documents."""
    same = total = 0
    max_dll = 0.0
    for task, by_filter in (a.get("responses") or {}).items():
        for filt, docs in by_filter.items():
            other = ((b.get("responses") or {}).get(task) or {}).get(filt) or {}
            for doc, resp in docs.items():
                if doc not in other:
                    continue
                lls_a, lls_b = _lls(resp), _lls(other[doc])
                if lls_a is not None and lls_b is not None and len(lls_a) == len(lls_b):
                    max_dll = max([max_dll] + [abs(x - y) for x, y in zip(lls_a, lls_b)])
                else:
                    total += 1
                    same += resp == other[doc]
    return {"identical": same, "generations": total, "max_dll": max_dll}


def _lls(resp) -> list[float] | None:
    """Log-likelihoods of a loglikelihood request's choices (``[[ll, greedy], ...]``)."""
    if isinstance(resp, list) and resp and all(isinstance(r, list) and len(r) == 2
                                               and isinstance(r[0], (int, float)) for r in resp):
        return [float(r[0]) for r in resp]
    return None


def compare_runs(run_a: Path, run_b: Path, names=("A", "B")) -> list[dict]:
    ra, rb = eval_records(run_a), eval_records(run_b)
    rows = []
    for key in sorted(set(ra) & set(rb)):
        a, b = ra[key], rb[key]
        rows.append({"model": key[0], "method": key[1], "bits": key[2], "task": key[3],
                     f"acc_{names[0]}": accuracy(a), f"acc_{names[1]}": accuracy(b),
                     "arith_" + names[0]: _arith(a), "arith_" + names[1]: _arith(b),
                     **response_diff(a, b)})
    return rows


def _arith(per_doc: dict) -> str:
    from fair_calib.evaluate.run import arithmetic_of

    return arithmetic_of(per_doc)


def format_rows(rows: list[dict], names=("A", "B")) -> str:
    a, b = names
    head = (f"| model | method | bits | task | {a} | {b} | acc {a} | acc {b} | identical "
            "generations | max dLL |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        acc_a = "--" if r[f"acc_{a}"] is None else f"{r[f'acc_{a}']:.1f}"
        acc_b = "--" if r[f"acc_{b}"] is None else f"{r[f'acc_{b}']:.1f}"
        gens = f"{r['identical']} of {r['generations']}" if r["generations"] else "--"
        lines.append(f"| {r['model']} | {r['method']} | {r['bits']} | {r['task']} | "
                     f"{r['arith_' + a]} | {r['arith_' + b]} | {acc_a} | {acc_b} | {gens} | "
                     f"{r['max_dll']:.3g} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------ phases
class Runner:
    def __init__(self, args):
        self.args = args
        self.t0 = time.perf_counter()
        self.base = Path(args.runs)
        self.out = Path(args.out) if args.out else None
        self.summary: list[str] = []
        self.cards = cuda_cards() if not args.cpu_smoke else []

    def left(self) -> float:
        return self.args.deadline - (time.perf_counter() - self.t0)

    def note(self, text: str) -> None:
        log(text)
        self.summary.append(text)

    def keep(self, src: Path, name: str) -> None:
        """A file for ``--out``: gathered in one archive at the end (the device tool brings
        back few files)."""
        if self.out and src.is_file():
            (self.base / "_out").mkdir(parents=True, exist_ok=True)
            shutil.copy(src, self.base / "_out" / name)

    def default(self, card: str | None, reruns: int = 2) -> None:
        """The embedded default on ``card``, cold, ``reruns`` times one after the other (each
        in a fresh folder): the tables compared byte for byte, and with the CPU's."""
        import hashlib

        tables = []
        for name in ("default-a", "default-b")[:reruns]:
            if self.left() < PHASE_MIN_S["default"]:
                self.note(f"{name}: skipped, {self.left():.0f} s left")
                break
            run = self.base / name
            prepare_run(run)
            env = run_env(run, **({"CUDA_VISIBLE_DEVICES": card} if card else {}))
            rc, secs = snakemake(run, ["results/tables/main.tex", "--config", "device=cuda"],
                                 env, self.left() - 20, "snakemake.log")
            tex = table_of(run)
            self.note(f"default on cuda ({name}, card {card}): exit {rc}, {secs:.0f} s cold; "
                      f"table {'written' if tex.is_file() else 'MISSING'}")
            self.keep(run / "snakemake.log", f"{name}.snakemake.log")
            self.job_times(run, name)
            if tex.is_file():
                tables.append(tex.read_bytes())
                self.keep(tex, f"{name}.main.tex")
        if len(tables) == 2:
            self.note("default: the rerun's table is "
                      + ("identical" if tables[0] == tables[1] else "DIFFERENT"))
        if tables:
            sha = hashlib.sha256(tables[0]).hexdigest()
            self.note(f"default: card table sha256 {sha[:12]}; the CPU's recorded "
                      f"{CPU_TABLE_SHA[:12]} ({'same' if sha == CPU_TABLE_SHA else 'differs'})")

    def job_times(self, run: Path, name: str) -> None:
        """The slowest jobs of a run (the job records every stage writes to its log)."""
        from fair_calib.cli import JOB_LINE

        recs = []
        for logf in run.glob("logs/**/*.log"):
            for line in logf.read_text(errors="replace").splitlines():
                if line.startswith(JOB_LINE) and '"status": "ok"' in line:
                    try:
                        recs.append(json.loads(line[len(JOB_LINE):]))
                    except json.JSONDecodeError:
                        pass
        by_stage: dict[str, list[dict]] = {}
        for r in recs:
            by_stage.setdefault(r.get("stage", "?"), []).append(r)
        text = "; ".join(
            f"{k} {len(v)} jobs, {sum(r['wall_s'] for r in v):.0f} s (max "
            f"{max(r['wall_s'] for r in v):.0f}) on {sorted({r.get('card', '?') for r in v})}"
            for k, v in sorted(by_stage.items()))
        self.note(f"{name} jobs by stage: {text or 'no job records'}")

    def wide_args(self) -> list[str]:
        configs = SMOKE_CONFIGS if self.args.cpu_smoke else WIDE_CONFIGS
        return ["--configfile", *configs]

    def wide_targets(self, run: Path) -> list[str]:
        """The main table and the long-generation evaluations (FP and FAIR-Calib seed 0)."""
        from fair_calib.config import load_yaml

        cfg = {}
        for c in ["config/config.yaml"] + (SMOKE_CONFIGS if self.args.cpu_smoke else WIDE_CONFIGS):
            deep_update(cfg, load_yaml(run / c))
        tables = ["main"] if self.args.cpu_smoke else self.args.tables.split(",")
        targets = [f"results/tables/{t}.tex" for t in tables]
        if LONG_TASK in cfg.get("tasks", {}) and "main" in tables:
            for model in cfg["tables"]["main"]["models"]:
                targets += [f"results/eval/{model}/fp/fp/{LONG_TASK}.parquet",
                            f"results/eval/{model}/{self.args.decode_method}/w4a4/{LONG_TASK}.parquet"]
        return targets

    def wide(self) -> Path:
        run = self.base / "wide"
        prepare_run(run)
        lowbit = "fake" if self.args.cpu_smoke else "auto"
        rc, secs = threading_snakemake(run, self.wide_targets(run) + self.wide_args(),
                                       run_env(run, FAIR_CALIB_LOWBIT=lowbit),
                                       self.left() - 20, "snakemake.log").result()
        work = run / "runs" / "gpu_trained"
        self.note(f"wide (FAIR_CALIB_LOWBIT={lowbit}): exit {rc}, {secs:.0f} s cold")
        self.keep(table_of(work), "wide.main.tex")
        for tex in sorted((work / "results" / "tables").glob("*.tex")):
            self.keep(tex, f"wide.{tex.name}")
        self.keep(run / "snakemake.log", "wide.snakemake.log")
        self.job_times(work, "wide")
        return work

    def cpu_targets(self, run: Path) -> list[str]:
        """The CPU's share (bf16 on CPU cores is slow): FP, RTN and the decode phase's method
        on the main table's tasks, every model."""
        from fair_calib.config import load_yaml

        cfg: dict = {}
        for c in ["config/config.yaml"] + (SMOKE_CONFIGS if self.args.cpu_smoke else WIDE_CONFIGS):
            deep_update(cfg, load_yaml(run / c))
        tables = ["main"] if self.args.cpu_smoke else self.args.tables.split(",")
        out = []
        for name in tables:
            table = cfg["tables"][name]
            bits = table.get("bits", "w4a4")
            cells = [("fp", "fp"), ("rtn", bits)] + ([] if self.args.cpu_smoke else
                                                     [(self.args.decode_method, bits)])
            out += [f"results/eval/{m}/{x}/{b}/{t}.parquet" for m in table["models"]
                    for x, b in cells for t in table["tasks"] if x in table["methods"]
                    or x.split("@")[0] in table["methods"] or x == "fp"]
        return list(dict.fromkeys(out))

    def rerun_evals(self, name: str, lowbit: str, device: str | None,
                    targets: list[str] | None = None) -> Path | None:
        """A copy of the wide run whose evaluations run again (``lowbit``, ``device``)."""
        src = self.base / "wide"
        if not table_of(src / "runs" / "gpu_trained").is_file():
            self.note(f"{name}: skipped (the wide run has no table)")
            return None
        run = self.base / name
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(src, run, symlinks=True)
        extra = ["--config", f"device={device}"] if device else []
        if device == "cpu":
            extra += ["--set-threads", "evaluate_shard=4"]
        # targets first: --configfile takes every word after it
        rc, secs = threading_snakemake(
            run, (targets or self.wide_targets(run)) + ["--forcerun", "evaluate_shard"] + extra
            + self.wide_args(), run_env(run, FAIR_CALIB_LOWBIT=lowbit),
            self.left() - 10, "snakemake.log").result()
        work = run / "runs" / "gpu_trained"
        self.note(f"{name} (FAIR_CALIB_LOWBIT={lowbit}, device {device or 'cuda'}): exit {rc}, "
                  f"{secs:.0f} s")
        self.keep(table_of(work), f"{name}.main.tex")
        return work

    def compare(self, a: Path, b: Path, names, out_name: str) -> None:
        rows = compare_runs(a, b, names)
        text = format_rows(rows, names)
        print(text, flush=True)
        self.summary.append(text)
        if self.out:
            (self.base / "_out").mkdir(parents=True, exist_ok=True)
            (self.base / "_out" / out_name).write_text(json.dumps(rows, indent=1))

    def write_summary(self) -> None:
        """``--out``: summary.md, and results.tgz with the kept files and every run's logs."""
        if not self.out:
            return
        import tarfile

        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "summary.md").write_text("\n\n".join(self.summary) + "\n")
        with tarfile.open(self.out / "results.tgz", "w:gz") as tar:
            if (self.base / "_out").is_dir():
                tar.add(self.base / "_out", arcname="kept")
            for logs in sorted(self.base.glob("*/logs")) + sorted(self.base.glob("*/runs/*/logs")):
                tar.add(logs, arcname=str(logs.relative_to(self.base)))
            for tables in sorted(self.base.glob("*/runs/*/results/tables")):
                tar.add(tables, arcname=str(tables.relative_to(self.base)))


class threading_snakemake:
    """Snakemake started now, its result read later (two runs at once on two cards)."""

    def __init__(self, run, args, env, budget, log_name):
        import threading

        self._res = None
        self._th = threading.Thread(target=self._go, args=(run, args, env, budget, log_name))
        self._th.start()

    def _go(self, *a):
        self._res = snakemake(*a)

    def result(self):
        self._th.join()
        return self._res


# ------------------------------------------------------------------------ decodes
# The grid's generation (config/paper.yaml): 256 tokens in 256 steps, LLaDA in blocks of 32.
GRID_DECODE = {"llada": {"gen_length": 256, "steps": 256, "block_length": 32},
               "dream": {"gen_length": 256, "steps": 256}}


def measure_decodes(work: Path, args) -> list[str]:
    """Batch-1 decodes of the wide models at the grid's generation length on the synthetic
    recall questions: FP (bf16) and W4A4 ``--decode-method`` as the evaluation loads them, CUDA
    graphs replayed, exact early exit at the first EOS; steps run against the full schedule,
    and the quantized model's time against FP's."""
    import torch

    from fair_calib.config import load_yaml

    if not (work / "resources" / "data" / "synth_gen.jsonl").is_file():
        return ["decode: skipped (the wide run made no corpus)"]
    cfg: dict = {}
    for c in ["config/config.yaml"] + (SMOKE_CONFIGS if args.cpu_smoke else WIDE_CONFIGS):
        deep_update(cfg, load_yaml(work.parent.parent / c))
    questions = [json.loads(x)["question"] for x in
                 (work / "resources" / "data" / "synth_gen.jsonl").read_text().splitlines()[:args.decode_n]]
    lines = []
    for model in cfg["tables"]["main"]["models"]:
        family = cfg["models"][model]["family"]
        calib = work / "results" / "calib" / model / args.decode_method / "w4a4"
        runs = {}
        for variant, calib_dir in (("bf16", None), ("w4a4", calib)):
            if calib_dir is not None and not (calib_dir / "meta.json").is_file():
                lines.append(f"decode {model}: no calibration at {calib_dir}")
                continue
            runs[variant] = decode_questions(work / "resources" / "hub" / model, family,
                                             calib_dir, questions, cfg["dtype"], cfg["device"])
            torch.cuda.empty_cache() if torch.cuda.is_available() else None
        for variant, r in runs.items():
            lines.append(f"decode {model} {variant}: {len(questions)} questions, batch 1, "
                         f"{r['seconds']:.2f} s, steps run {r['steps']} of {r['full']} "
                         f"({100 * (1 - r['steps'] / r['full']):.1f} % saved by early exit)")
        if len(runs) == 2:
            a, b = runs["bf16"], runs["w4a4"]
            same = sum(x == y for x, y in zip(a["tokens"], b["tokens"]))
            lines.append(f"decode {model}: W4A4 / bf16 time {b['seconds'] / a['seconds']:.3f}; "
                         f"per step {(b['seconds'] / b['steps']) / (a['seconds'] / a['steps']):.3f}; "
                         f"{same} of {len(questions)} answers identical")
    return lines


def decode_questions(model_dir: Path, family: str, calib_dir: Path | None, questions, dtype,
                     device) -> dict:
    """Decode each question alone (the grid's batch 1); wall time after one warm-up decode."""
    import torch

    from fair_calib.decoding import decode, make_policy
    from fair_calib.decoding.early_exit import StopRule
    from fair_calib.methods import load_quantized
    from fair_calib.models.adapters import load_model

    loaded = load_model(model_dir, family, dtype=dtype, device=device)
    if calib_dir is not None:
        loaded = load_quantized(loaded, calib_dir)
    if device == "cuda":
        loaded.replay_graphs()
    policy = make_policy(loaded.adapter.decoding, GRID_DECODE[family])
    stop = StopRule(frozenset({int(loaded.eos_id)}))
    prompts = [loaded.tokenizer(f"Question: {q}\nAnswer:")["input_ids"] for q in questions]
    decode(loaded, prompts[:1], policy, stop=stop)           # capture / compile
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    t0, steps, tokens = time.perf_counter(), 0, []
    for p in prompts:
        out = decode(loaded, [p], policy, stop=stop)
        steps += int(out.steps[0])
        tokens.append(out.tokens[0].tolist())
    sync()
    return {"seconds": time.perf_counter() - t0, "steps": steps,
            "full": policy.steps * len(prompts), "tokens": tokens}


def deep_update(dst: dict, src: dict) -> dict:
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_update(dst[k], v)
        else:
            dst[k] = v
    return dst


def cuda_cards() -> list[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [x.strip() for x in out.splitlines() if x.strip().isdigit()]


def install_wheels(site: Path) -> None:
    """The carried wheelhouse (``benchmarks/gpu_dag.sh wheels``) into ``site``."""
    whl = REPO / ".whl"
    if not whl.is_dir():
        sys.exit("error: .whl/ is missing: run 'benchmarks/gpu_dag.sh wheels' on the CPU machine "
                 "and name .whl in the device tool's carry")
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
                    *map(str, sorted(whl.glob("*.whl")))], check=True)
    os.environ["PYTHONPATH"] = ":".join(p for p in (str(site), os.environ.get("PYTHONPATH"))
                                        if p)
    sys.path.insert(0, str(site))


def run(args) -> int:
    phases = [p for p in args.phases.split(",") if p]
    bad = sorted(set(phases) - set(PHASES))
    if bad:
        sys.exit(f"error: --phases {bad}: choose from {list(PHASES)}")
    if not args.cpu_smoke:
        install_wheels(Path(args.site))
    r = Runner(args)
    r.note(f"phases {phases}; cards {r.cards or 'none'}; {os.cpu_count()} CPU cores")
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
    for phase in phases:
        run_phase(r, phase, args)
    if side is not None:
        side.join()
    r.write_summary()
    return 0


def run_phase(r: Runner, phase: str, args) -> None:
    if r.left() < PHASE_MIN_S[phase] * (0.3 if args.cpu_smoke else 1):
        r.note(f"{phase}: skipped, {r.left():.0f} s left before the deadline")
        return
    if phase == "wide":
        r.wide()
    elif phase == "fake":
        fake = r.rerun_evals("fake", "fake", None)
        if fake is not None:
            r.compare(r.base / "wide" / "runs" / "gpu_trained", fake, ("real", "fake"),
                      "real_vs_fake.json")
    elif phase == "cpu":
        cpu = r.rerun_evals("cpu", "fake", "cpu", r.cpu_targets(r.base / "wide"))
        fake = r.base / "fake" / "runs" / "gpu_trained"
        if cpu is not None and fake.is_dir():
            r.compare(fake, cpu, ("cardfake", "cpufake"), "fake_card_vs_cpu.json")
    elif phase == "decode":
        for line in measure_decodes(r.base / "wide" / "runs" / "gpu_trained", args):
            r.note(line)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rp = sub.add_parser("run")
    rp.add_argument("--phases", default=",".join(PHASES))
    rp.add_argument("--runs", default="/tmp/gpu_trained", help="where the run folders go")
    rp.add_argument("--out", default=os.environ.get("OUT"))
    rp.add_argument("--deadline", type=float, default=560.0, help="seconds for all phases")
    rp.add_argument("--site", default="/tmp/site")
    rp.add_argument("--decode-n", type=int, default=40, help="questions the decode phase times")
    rp.add_argument("--tables", default="main,w2a4,w8a8",
                    help="the tables of config/gpu_trained.yaml the wide phase makes")
    rp.add_argument("--decode-method", default="fair-calib-seeds@s0",
                    help="the W4A4 calibration the decode phase times against FP")
    rp.add_argument("--cpu-smoke", action="store_true",
                    help="the CPU version: tiny widths, fake quantization (the suite runs it)")
    cp = sub.add_parser("compare")
    cp.add_argument("run_a")
    cp.add_argument("run_b")
    args = ap.parse_args(argv)
    if args.cmd == "compare":
        print(format_rows(compare_runs(Path(args.run_a), Path(args.run_b))))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
