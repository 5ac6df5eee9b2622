"""Can this machine run the config's jobs? Checked before any output is deleted.

``device`` and ``dtype`` are the config keys a machine can fail: ``device: cuda`` where torch
has no CUDA (a CPU build, no driver, no visible GPU), ``dtype: bfloat16`` on a GPU without
bf16. Snakemake deletes a job's previous outputs before running it, so such a machine must be
refused before the first job, not by the job (which would fail only after its finished outputs
are gone):

* the Snakefile calls :func:`environment_problem` at parse time, in the main process, when its
  jobs run on this machine (a cluster run checks on the GPU node, in each job, instead: the
  login node that plans the DAG has no GPU);
* every stage CLI calls it on its own ``--runtime`` / ``--settings`` before loading anything.

torch is imported only when the device is not the CPU, so the default's planning stays fast.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

# Executors whose jobs run on the machine that plans them.
LOCAL_EXECUTORS = ("local", "dryrun", "touch")


def environment_problem(device: str | None, dtype: str | None = None) -> str | None:
    """One line naming the key this machine cannot honour, else None."""
    if not device or device == "cpu":
        return None
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        why = ("this torch is a CPU build" if torch.version.cuda is None
               else "torch sees no GPU (no driver, or CUDA_VISIBLE_DEVICES hides them)")
        return (f"device = {device!r} but CUDA is not available here ({why}; torch "
                f"{torch.__version__}). Set device: cpu, or run on a GPU machine with a CUDA "
                "build of torch (docs/cluster.md).")
    if device.startswith("cuda") and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name()
        return (f"dtype = 'bfloat16' but this GPU ({name}) has no bfloat16 support; set "
                "dtype: float16 or float32, or run on an Ampere or newer GPU.")
    return None


def check_settings_environment(stage: str, settings: Mapping) -> None:
    """A stage CLI's check: exit with one line if this machine cannot run the job."""
    problem = environment_problem(settings.get("device"), settings.get("dtype"))
    if problem:
        sys.exit(f"error: fair-calib {stage}: config: {problem}")


def runs_locally(argv: list[str]) -> bool:
    """Whether ``snakemake argv`` runs its jobs on this machine: its executor (from the
    command line or a profile, as Snakemake resolves it) is a local one. Snakemake does not
    expose its executor while the Snakefile is parsed, so the command line is read again."""
    import contextlib
    import io

    from snakemake.cli import parse_args

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            _, args = parse_args(argv)
    except (SystemExit, Exception):  # not snakemake's command line (the Python API)
        return True
    return (getattr(args, "executor", None) or "local") in LOCAL_EXECUTORS


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """The environment variable ``name`` (``default`` when unset), lower-cased, one of
    ``choices``; any other value is refused naming the variable, the value and the choices."""
    raw = os.environ.get(name, default)
    v = raw.strip().lower()
    if v not in choices:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(choices)}")
    return v
