"""One subcommand per stage. Thin: each stage module owns its argument parsing in
``run_cli(argv)`` and does the work in a pure function over files."""
from __future__ import annotations

import importlib
import json
import os
import sys
import time

from ..jobs.environment import check_settings_environment
from ..jobs.job_log import JOB_LINE  # the prefix of job_record's lines (benchmarks/gpu_trained.py)

SUBCOMMANDS = {
    "make-data": "fair_calib.models.tiny.corpus",     # synthetic corpus and task files
    "train-tiny": "fair_calib.models.tiny.train",     # train an embedded tiny diffusion LM
    "convert-hub": "fair_calib.models.toy_hub",       # a tiny model in a hub checkpoint layout
    "probe": "fair_calib.probe",                      # Stage I: random-commit teacher rollouts
    "prior": "fair_calib.prior",                      # Stage I: aggregate the position prior
    "calibrate": "fair_calib.calibrate",              # Stage II: layer-wise calibration
    "evaluate": "fair_calib.evaluate.run",            # benchmarks through lm-eval
    "trajectories": "fair_calib.diagnostics",         # record decoding trajectories
    "diagnose": "fair_calib.diagnostics",             # diagnostics from trajectories
    "report": "fair_calib.report.tables",             # LaTeX tables
    "figures": "fair_calib.report.figures",           # PDF/PNG figures
    "floor-sweep": "fair_calib.report.sweep",         # accuracy vs the prior's floor (figure)
    "lm-eval": "fair_calib.cli.lm_eval_cli",          # lm-eval's own CLI, fair_calib_dlm registered
    "render-tasks": "fair_calib.cli.lm_eval_cli",     # offline / synthetic task YAMLs for it
    "generate": "fair_calib.cli.generate_cli",        # a model's completions of your prompts
    "compare-runs": "fair_calib.report.compare",      # two runs' evaluations, cell by cell
    "jobs": "fair_calib.report.jobs",                 # a run's jobs: time, card, overlap
    "cost": "fair_calib.budget.cost",                 # GPU-hours of a config's DAG
    "census": "fair_calib.budget.census",             # shapes x counts of the grid's forwards
    "check-config": "fair_calib.checks.references",   # syntax/schema check of config files
}
# These read their own subcommand name (one module serves two of them).
WHOLE_ARGV = ("trajectories", "diagnose", "lm-eval", "render-tasks")
# These write no output of the workflow (lm-eval's own options name its files): no output lock.
UNLOCKED = ("lm-eval", "generate", "cost", "check-config", "compare-runs", "jobs")


def _checked_settings(stage: str, argv: list[str]) -> list[str]:
    """Parse and validate the stage's --settings (fair_calib.checks.config: the checks the Snakefile
    applies to the config), so a stage run by hand refuses what the workflow would refuse.
    ``--threads N`` (train-tiny) is a run-time option: it sets ``model.train.threads``, which
    the workflow keeps out of the job's settings so that a thread count never retrains."""
    from ..checks import config

    argv = list(argv)
    threads = None
    if stage == "train-tiny" and "--threads" in argv:
        i = argv.index("--threads")
        try:
            threads = int(argv[i + 1])
        except (IndexError, ValueError):
            sys.exit(f"fair-calib {stage}: error: --threads needs a positive integer")
        del argv[i:i + 2]
    runtime = _pop_runtime(stage, argv)
    if "--model-dir" in argv[:-1]:
        problem = config.missing_model_folder(argv[argv.index("--model-dir") + 1])
        if problem:
            sys.exit(f"error: fair-calib {stage} --model-dir: {problem}")
    idx = next((i for i, a in enumerate(argv) if a == "--settings" or a.startswith("--settings=")),
               None)
    if idx is None:
        return argv  # the stage's own parser reports a missing required --settings
    if argv[idx] == "--settings":
        if idx + 1 >= len(argv):
            sys.exit(f"fair-calib {stage}: error: --settings needs a JSON object")
        text, span = argv[idx + 1], 2
    else:
        text, span = argv[idx].split("=", 1)[1], 1
    try:
        settings = config.parse_settings(text, stage)
        if isinstance(settings, dict):
            settings = {**settings, **runtime}
        if threads is not None and isinstance(settings.get("model"), dict):
            model = dict(settings["model"])
            model["train"] = {**(model.get("train") or {}), "threads": threads}
            settings["model"] = model
        config.check_settings(stage, settings)
    except config.ConfigError as err:
        sys.exit(f"error: fair-calib {err}")
    check_settings_environment(stage, settings)
    return argv[:idx] + ["--settings", json.dumps(settings)] + argv[idx + span:]


def _settings_device(argv: list[str]) -> str | None:
    """The ``device`` of the checked ``--settings`` JSON in ``argv`` (None without one)."""
    if "--settings" not in argv[:-1]:
        return None
    try:
        settings = json.loads(argv[argv.index("--settings") + 1])
    except json.JSONDecodeError:
        return None     # "@file" settings: the stage reads them itself
    return settings.get("device") if isinstance(settings, dict) else None


def _take_gpu_slot(argv: list[str]) -> None:
    """A job on ``cuda`` gets a card of its own before torch initialises CUDA
    (fair_calib/jobs/gpu_slots.py); the card is written to the job's log (stderr)."""
    if _settings_device(argv) == "cuda":
        from ..jobs import gpu_slots

        gpu_slots.assign_card()


def _pop_runtime(stage: str, argv: list[str]) -> dict:
    """``--runtime JSON``: the environment keys (``device``, ``data_dir``, ``data_source``,
    ``synthetic_dir``), merged over the settings. The workflow passes them outside
    ``--settings`` so that they never rerun a job (fair_calib.checks.config.ENV_SETTINGS)."""
    from ..checks import config

    if "--runtime" not in argv:
        return {}
    i = argv.index("--runtime")
    text = argv[i + 1] if i + 1 < len(argv) else None
    del argv[i:i + 2]
    try:
        runtime = config.parse_settings(text, f"{stage} --runtime")
    except config.ConfigError as err:
        sys.exit(f"error: fair-calib {err}")
    bad = sorted(set(runtime) - set(config.ENV_SETTINGS)) if isinstance(runtime, dict) else runtime
    if bad:
        sys.exit(f"error: fair-calib {stage} --runtime: only {list(config.ENV_SETTINGS)} may be "
                 f"given here, not {bad}")
    return {k: v for k, v in runtime.items() if v is not None}


def main(argv: list[str] | None = None) -> None:
    as_program = argv is None          # a process of its own (not a call from Python)
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in SUBCOMMANDS:
        names = "\n  ".join(f"{k:14s} {v}" for k, v in SUBCOMMANDS.items())
        msg = f"usage: fair-calib <subcommand> [options]\n\nsubcommands:\n  {names}\n"
        if argv and argv[0] not in ("-h", "--help"):
            sys.exit(f"unknown subcommand {argv[0]!r}\n\n{msg}")
        print(msg)
        return
    stage = argv[0]
    from ..jobs import job_log

    # the job's log: opened by the job once it holds its output's lock (fair_calib/jobs/job_log.py)
    log = job_log.pop_log(argv)
    if as_program and stage in JOB_STAGES:
        from ..jobs import job_watch

        # a death by signal (SIGKILL: out of memory) is reported by a watcher process
        job_watch.watch(stage, argv[1:], log)
    # before any stage module imports torch: the same kernels, so the same bits, on every
    # x86-64 machine (fair_calib/jobs/numerics.py)
    from ..jobs import numerics

    numerics.pin_environment()
    try:
        rest = _checked_settings(stage, argv[1:])
    except SystemExit as err:    # refused before the lock: the line goes to the log too
        if isinstance(err.code, str):
            _note_before_lock(stage, argv[1:], log, err.code)
        raise
    _exit_quietly_on_signals(stage)
    started: list[float] = []
    try:
        _run_stage(stage, rest, log, started)
    except SystemExit as err:
        from ..jobs import job_lock

        # ended before it opened its log (a refused job wrote its own, job_lock.hold)
        if not started and isinstance(err.code, str) and not job_lock.REFUSED:
            _note_before_lock(stage, rest, log, err.code)
        if started and stage in JOB_STAGES:
            job_record(stage, "error", started[0])
        raise
    except BaseException:
        if started and stage in JOB_STAGES:
            job_record(stage, "error", started[0])
        raise
    if stage in JOB_STAGES:
        job_record(stage, "ok", started[0])


def _note_before_lock(stage: str, argv: list[str], log: str | None, line: str) -> None:
    """The last line of a job that ended before it opened its log: in the log if this job
    holds the output or no job does; else in its own waiting log (the log is the holder's)."""
    from ..jobs import job_lock, job_log

    if not log:
        return
    if job_lock.WAITING or (not job_lock.holding() and job_lock.busy(stage, argv)):
        log = job_log.side_log(log, os.getpid())
    job_log.append_line(log, line)


def _start(stage: str, log: str | None, started: list[float]) -> None:
    """Once the job holds its output: its log opened (``--log``), its start recorded."""
    from ..jobs import job_lock, job_log

    if log:
        waited = job_lock.WAITED
        job_log.open_log(log, header=(
            f"---- fair-calib {stage}, pid {os.getpid()}: a new job for this output; the lines "
            "above are an earlier job's" + (f" ({waited['holder']}, waited for "
                                            f"{waited['seconds']:.0f} s)" if waited else "")
            + " ----"))
    started.append(time.time())
    if stage in JOB_STAGES:
        job_record(stage, "start", started[0])


def _run_stage(stage: str, rest: list[str], log: str | None = None,
               started: list[float] | None = None) -> None:
    from ..jobs.io import CorruptFileError
    started = [] if started is None else started
    try:
        if stage not in UNLOCKED:
            # before the card and the work: a second job for this output waits for the first
            # (fair_calib/jobs/job_lock.py), whatever Snakemake's own lock does
            from ..jobs import job_lock

            job_lock.hold(stage, rest, log=log)
        _start(stage, log, started)
        _take_gpu_slot(rest)
        module = importlib.import_module(SUBCOMMANDS[stage])
        module.run_cli([stage] + rest if stage in WHOLE_ARGV else rest)
    except CorruptFileError as err:  # names the file and the command that regenerates it
        sys.exit(f"error: fair-calib {stage}: {err}")
    except KeyboardInterrupt:
        sys.exit(_interrupted(stage, "Ctrl-C"))
    except Exception as err:         # noqa: BLE001 - every failure ends in one line
        sys.exit(_failure_line(stage, err))


def _interrupted(stage: str, how: str) -> str:
    from ..jobs import job_lock

    if stage == "generate":
        from .generate_cli import interrupted_line

        return interrupted_line(how)
    if stage in UNLOCKED:       # commands that are no pipeline stage: nothing to resume
        return f"fair-calib {stage}: interrupted ({how}); rerun the command to redo it"

    if job_lock.WAITING:
        return (f"fair-calib {stage}: interrupted ({how}) while waiting for the job writing "
                f"{job_lock.WAITING[0]}; that job goes on, its output and log are its own")
    return (f"fair-calib {stage}: interrupted ({how}); nothing half-written is kept as finished "
            "(outputs are written atomically; a calibration resumes from its finished blocks)")


def _exit_quietly_on_signals(stage: str) -> None:
    """SIGTERM (a cluster's scancel, Snakemake stopping its jobs) ends the stage like Ctrl-C:
    one line, no traceback. The first of them ends it; later ones are ignored (Ctrl-C reaches
    both the stage and its watcher, which forwards it, fair_calib/jobs/job_watch.py; ignored, not
    handled, so that one arriving while Python shuts down cannot kill the ending stage)."""
    import signal

    def stop(signum, frame):
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(f"{_interrupted(stage, signal.Signals(signum).name)}")

    signal.signal(signal.SIGTERM, stop)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, stop)


def _failure_hint(err: BaseException) -> str:
    """What to do about a failure, by what it is."""
    import errno

    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk (or quota) is full: free space where the outputs are written, then rerun"
    if isinstance(err, MemoryError):
        return ("out of memory: lower the job's sizes or raise its memory "
                "(resources.<rule>.mem_mb in the config)")
    if isinstance(err, FileNotFoundError):
        return ("a file it reads is missing: rerun Snakemake, which makes the files the job "
                "needs (or pass the path of one that exists)")
    if isinstance(err, OSError):
        return "a file-system error: check the path named here (its folders, permissions)"
    if isinstance(err, (ValueError, KeyError, TypeError)):
        return "check the settings or files named here; the traceback above says where"
    return "unexpected: the traceback above says where (please report it with this log)"


def _failure_line(stage: str, err: BaseException) -> str:
    """The traceback to stderr (a workflow job's log; at a terminal only with
    FAIR_CALIB_TRACEBACK=1), then one line: what failed and what to do."""
    import os
    import traceback

    if not sys.stderr.isatty() or os.environ.get("FAIR_CALIB_TRACEBACK"):
        traceback.print_exc()
    what = " ".join(str(err).split()) or type(err).__name__
    return f"error: fair-calib {stage}: {type(err).__name__}: {what}; {_failure_hint(err)}"


# The stages the workflow runs as jobs: each writes, to its log (stderr), one line when it
# starts and one when it ends, with its wall time and the card it ran on, so a run's cost per
# job can be read off its logs (benchmarks/gpu_trained.py summarises them).
JOB_STAGES = ("make-data", "train-tiny", "convert-hub", "probe", "prior", "calibrate",
              "evaluate", "trajectories", "diagnose", "report", "figures", "floor-sweep")


def job_card() -> str:
    """The GPU this process computed on (torch's name for it), or ``cpu``: a process that never
    initialised CUDA ran on the CPU."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return "cpu"
    return torch.cuda.get_device_name(torch.cuda.current_device())


def job_record(stage: str, status: str, start: float) -> dict:
    """Print (stderr) and return the job line: ``status`` is ``start``, ``ok`` or ``error``."""
    rec = {"stage": stage, "status": status, "start": round(start, 3)}
    if status != "start":
        rec["wall_s"] = round(time.time() - start, 3)
        try:
            rec["card"] = job_card()
            if rec["card"] != "cpu":
                torch = sys.modules["torch"]
                rec["peak_gpu_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 3)
        except Exception as err:  # noqa: BLE001  (a failed job's CUDA context may be broken)
            rec["card"] = f"unknown ({type(err).__name__}: {err})"[:200]
    print(JOB_LINE + json.dumps(rec), file=sys.stderr, flush=True)
    return rec


if __name__ == "__main__":
    main()
