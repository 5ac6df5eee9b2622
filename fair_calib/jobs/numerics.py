"""Reproducible CPU numerics: the same float bits on every x86-64 CPU with AVX2 of one vendor.

A float32 training run of 1,150 steps amplifies last-bit rounding differences into different
models, and the rounding depends on which kernels run: ATen picks its vectorised kernels per CPU
(``default``/``avx2``/``avx512``: different vector widths, so different summation orders), MKL
picks its GEMM code path per CPU (and per vendor), oneDNN per ISA, and multi-threaded kernels
split reductions by thread count. Pinned mode (the default, ``FAIR_CALIB_CPU_NUMERICS=pinned``)
fixes every one of these choices before torch is imported:

* ``ATEN_CPU_CAPABILITY=avx2``: ATen's AVX2 kernels, the widest every x86-64 CPU of the last
  decade runs (an AVX-512 CPU runs them too, bit for bit like an AVX2-only CPU);
* ``MKL_CBWR=AVX2,STRICT``: MKL's conditional numerical reproducibility on its AVX2 code path,
  strict (results independent of memory alignment; Intel and AMD alike);
* ``ONEDNN_MAX_CPU_ISA=AVX2`` and, in :func:`pin_torch`, oneDNN off for these ops;
* one intra-op thread where the stage asks for bit-exact results (training).

``FAIR_CALIB_CPU_NUMERICS=native`` leaves all of them to torch (fastest kernels of this CPU;
results then differ between machines). A CPU without AVX2 (x86-64) is refused in pinned mode,
by name. On ARM (aarch64) none of these knobs exist (no MKL; ATen's NEON/SVE kernels and
OpenBLAS/oneDNN-ACL GEMMs): runs there are deterministic on one machine but do not reproduce
the x86-64 hashes (docs/benchmarks.md). Across vendors the bits differ: an Intel Xeon trains
other weights than an AMD EPYC in pinned mode (measured 2026-11-28; cause not isolated), so the
recorded hashes are kept per CPU vendor (:func:`environment_key`).
"""
from __future__ import annotations

import contextlib
import os
import platform
import sys

MODE_VAR = "FAIR_CALIB_CPU_NUMERICS"
MODES = ("pinned", "native")
PINNED_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "AVX2,STRICT",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",   # oneDNN's older name for the same knob
}
X86 = ("x86_64", "amd64")


def mode() -> str:
    value = os.environ.get(MODE_VAR, "pinned")
    if value not in MODES:
        sys.exit(f"error: {MODE_VAR}={value!r} is not valid; choose one of {list(MODES)}")
    return value


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pin_environment() -> str:
    """Set the pinned-mode variables (before torch is imported); returns the mode in force.
    Refuses, naming the problem, a CPU without AVX2/FMA and a process that imported torch first
    (its kernels are already chosen)."""
    current = mode()
    if current == "native" or platform.machine().lower() not in X86:
        return current if current == "native" else "pinned-non-x86"
    flags = _cpu_flags()
    if flags and not {"avx2", "fma"} <= flags:
        sys.exit(f"error: this CPU lacks AVX2/FMA, which {MODE_VAR}=pinned (the reproducible "
                 f"default) needs; set {MODE_VAR}=native to run with this CPU's own kernels "
                 "(results then differ from the hashes docs/benchmarks.md records)")
    if "torch" in sys.modules and any(os.environ.get(k) != v for k, v in PINNED_ENV.items()):
        raise RuntimeError("fair_calib.jobs.numerics.pin_environment() must run before torch is "
                           "imported: torch has already chosen its CPU kernels")
    os.environ.update(PINNED_ENV)
    # cuBLAS's deterministic workspace (torch's deterministic algorithms need it on CUDA), so a
    # job on a card computes the same bits on a rerun; no effect on the CPU
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return current


def pin_torch(torch, threads: int | None = None) -> None:
    """The in-process half of pinned mode: deterministic algorithms, oneDNN off, and
    optionally the intra-op thread count."""
    if mode() != "pinned":
        return
    # warn_only: a CUDA op without a deterministic kernel warns instead of failing a GPU run
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.mkldnn.enabled = False
    if threads:
        torch.set_num_threads(int(threads))


@contextlib.contextmanager
def deterministic_attention(device):
    """Attention's backward on a card by SDPA's math kernels while gradients flow through it
    (training, calibration) in pinned mode: under warn-only deterministic algorithms the
    memory-efficient kernel's backward stays nondeterministic (it warns), and two trainings of
    the same model on one H200 ended with different weights (2026-11-28). The forward kernels
    are deterministic and are left alone; no effect on the CPU."""
    import torch

    if mode() != "pinned" or torch.device(device).type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        yield


def describe() -> dict:
    """What a run's provenance records about its numerics."""
    out = {"cpu_numerics": mode(), "machine": platform.machine()}
    out.update({k: os.environ.get(k) for k in PINNED_ENV})
    return out


# ------------------------------------------------------------------ recorded model hashes
RECORD = "tests/recorded_hashes.json"   # relative to the repository root


def cpu_vendor() -> str:
    """The CPU's vendor (``/proc/cpuinfo``'s ``vendor_id``: ``GenuineIntel``, ``AuthenticAMD``),
    or ``unknown``."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


# The packages besides torch whose versions each record lists under ``measured_with``: they
# compute or write the recorded files (the model code, the tokenizer, the file format, the
# corpus generator), so a record names the versions it was measured with and a mismatch names
# the one that moved. torch's version is part of the key itself: its kernels compute the bits.
MEASURED_WITH = ("transformers", "tokenizers", "safetensors", "numpy")


def environment_key() -> dict:
    """What the recorded hashes were measured to depend on besides the code: torch's version
    (its kernels), the CPU architecture and vendor, and the numerics mode. The vendor, because
    pinned mode's bits were measured to differ between an AMD EPYC and an Intel Xeon
    (2026-11-28, docs/benchmarks.md); within one vendor they do not depend on the CPU's vector
    width or thread count. The other packages' versions are not part of the key (transformers
    5.24.0 and 5.25.0 train the same bits): :func:`measured_with` lists them beside it."""
    from importlib import metadata

    return {"torch": metadata.version("torch"), "machine": platform.machine(),
            "cpu_vendor": cpu_vendor(), "cpu_numerics": mode()}


def measured_with() -> dict[str, str]:
    """This environment's versions of :data:`MEASURED_WITH`."""
    from importlib import metadata

    return {name: metadata.version(name) for name in MEASURED_WITH}


def _record_for_this_environment(record_path) -> dict | None:
    import json

    env = environment_key()
    with open(record_path) as fh:
        for rec in json.load(fh)["records"]:
            if rec["environment"] == env:
                return rec
    return None


def recorded_hashes(record_path, group: str) -> dict[str, str] | None:
    """The recorded sha256 values of ``group`` for this environment ("test": per tiny family,
    tests/models/test_repro.py; "default": per file of the embedded default's run, relative to
    the repository root), or None where none was recorded for it."""
    rec = _record_for_this_environment(record_path)
    return None if rec is None else rec.get(group)


def unmeasured_versions(record_path) -> list[str]:
    """The packages of :data:`MEASURED_WITH` installed here at a version the record of this
    environment was not measured with, one phrase each ("transformers 5.26.0 (recorded with
    5.24.0, 5.25.0)"); empty where every version was measured or no record exists."""
    rec = _record_for_this_environment(record_path)
    if rec is None:
        return []
    known = rec.get("measured_with", {})
    return [f"{name} {version} (recorded with {', '.join(known.get(name, [])) or 'none'})"
            for name, version in measured_with().items() if version not in known.get(name, [])]


def mismatch_hint(record_path) -> str:
    """Why recorded bits may have moved besides the code: the packages at unmeasured versions."""
    moved = unmeasured_versions(record_path)
    if not moved:
        return ("every package is at a version the record was measured with, so the code "
                "changed the bits")
    return "packages at versions the record was not measured with: " + "; ".join(moved)


def check_files(record_path, group: str = "default", root=".") -> list[str]:
    """Problems (empty: all match) of the recorded files of ``group`` under ``root``."""
    from pathlib import Path

    from fair_calib.jobs.io import file_sha256

    want = recorded_hashes(record_path, group)
    if want is None:
        return [f"{record_path} records no {group!r} hashes for this environment "
                f"{environment_key()}: compare in a recorded one, or record these"]
    problems = []
    for rel, sha in sorted(want.items()):
        path = Path(root) / rel
        if not path.exists():
            problems.append(f"{path}: missing")
        elif file_sha256(path) != sha:
            problems.append(f"{path}: sha256 {file_sha256(path)} != recorded {sha}")
    if problems:
        problems.append(mismatch_hint(record_path))
    return problems


if __name__ == "__main__":  # python -m fair_calib.jobs.numerics [ROOT]: .ci/run's check
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    problems = check_files(os.path.join(root, RECORD), "default", root)
    for p in problems:
        print(f"error: {p}", file=sys.stderr)
    if not problems:
        print("every recorded model and table of the embedded default matches its sha256")
    sys.exit(1 if problems else 0)
