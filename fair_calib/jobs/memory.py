"""Peak memory of calibration, measured as the calib_memory table says it is.

The process-wide peak (``getrusage`` ``ru_maxrss``) includes the imports (torch, transformers:
hundreds of MB) and whatever the process did before calibrating, so two methods whose
calibration needs the same memory could differ by import order or by the model loader's
transient copies. :class:`PeakMemory` measures the region instead:

* ``cuda_max_allocated`` (CUDA): ``torch.cuda.max_memory_allocated`` since the region started
  (its peak statistics are reset there); the tensors PyTorch allocated on the GPU, model
  weights that live there included.
* ``cpu_rss_added`` (CPU, Linux): the peak resident memory added during the region, i.e.
  ``VmHWM`` at the end minus ``VmRSS`` at the start, the high-water mark having been reset to the
  current resident size at the start by writing ``5`` to ``/proc/self/clear_refs``.
* ``cpu_process_peak_rss`` (CPU where ``/proc/self/clear_refs`` cannot be written, e.g. macOS):
  the process's peak resident memory since it started (``ru_maxrss``), imports included; only
  this fallback has that caveat, and the tables name it.

The kernel's resident-size counters are approximate (cached per thread or CPU), to a few
hundred kB: far below what a calibration adds.

``MEASURES`` maps each kind to the sentence the memory table prints about it (plain text).
"""
from __future__ import annotations

import resource
import sys

MB = 2**20
MEASURES = {
    "cuda_max_allocated": "GPU: torch.cuda.max_memory_allocated during calibration (tensors "
                          "on the GPU, model weights there included)",
    "cpu_rss_added": "CPU: peak resident memory added during calibration (Linux VmHWM, reset at "
                     "its start, minus the resident memory at its start; imports and the loaded "
                     "model excluded)",
    "cpu_process_peak_rss": "CPU: the process's peak resident memory (ru_maxrss; imports and the "
                            "loaded model included: /proc/self/clear_refs was not writable)",
}


def _status_kb(field: str) -> int:
    """A ``kB`` field (VmRSS, VmHWM) of /proc/self/status."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {field}")


def _reset_cpu_high_water_mark() -> bool:
    """Reset VmHWM to the current resident size (Linux >= 4.0); False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _status_kb("VmHWM")
    except OSError:
        return False
    return True


def process_peak_rss_mb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss   # KiB on Linux, bytes on macOS
    return rss / MB if sys.platform == "darwin" else rss / 1024


class PeakMemory:
    """Peak memory of a region on ``device``: :meth:`start` at its beginning, then
    :meth:`peak_mb` any time (the peak so far); :attr:`kind` names the measure (``MEASURES``)."""

    def __init__(self, device):
        import torch

        self.device = torch.device(device)
        self.kind = "cuda_max_allocated" if self.device.type == "cuda" else "cpu_rss_added"
        self.baseline_kb = 0

    def start(self) -> "PeakMemory":
        import torch

        if self.kind == "cuda_max_allocated":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif _reset_cpu_high_water_mark():
            self.baseline_kb = _status_kb("VmRSS")
        else:
            self.kind = "cpu_process_peak_rss"
        return self

    def peak_mb(self) -> float:
        import torch

        if self.kind == "cuda_max_allocated":
            return torch.cuda.max_memory_allocated(self.device) / MB
        if self.kind == "cpu_rss_added":
            return max(0, _status_kb("VmHWM") - self.baseline_kb) / 1024
        return process_peak_rss_mb()
