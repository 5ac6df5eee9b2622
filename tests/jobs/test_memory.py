"""The calibration memory measure (fair_calib.jobs.memory): what the calib_memory table reports."""
import mmap

import pytest

from fair_calib.jobs import memory
from fair_calib.jobs.memory import PeakMemory, process_peak_rss_mb

MB = 2**20
SLACK_MB = 1   # the kernel's RSS counters are approximate (per-thread/per-CPU caches: ~0.2 MB)


def _touched(mb: int) -> mmap.mmap:
    """``mb`` MiB of fresh anonymous memory with every page written (resident). Not a tensor:
    an allocator may place one partly in pages that are already resident, which the process
    does not add."""
    buf = mmap.mmap(-1, mb * MB)
    for i in range(0, mb * MB, mmap.PAGESIZE):
        buf[i] = 1
    return buf


def _cpu_region() -> PeakMemory:
    mem = PeakMemory("cpu").start()
    if mem.kind != "cpu_rss_added":
        pytest.skip("/proc/self/clear_refs is not writable here (not Linux?)")
    return mem


def test_cpu_peak_counts_what_the_region_allocates_even_once_freed():
    mem = _cpu_region()
    x = _touched(64)
    x.close()                               # freed before the reading: the peak keeps it
    assert mem.peak_mb() >= 64 - SLACK_MB


def test_cpu_peak_excludes_memory_allocated_before_the_region():
    before = _touched(128)                  # e.g. imports and the loaded model
    mem = _cpu_region()
    x = _touched(16)
    peak = mem.peak_mb()
    assert 16 - SLACK_MB <= peak < 64, peak
    assert process_peak_rss_mb() >= 128 + 16     # the process-wide peak holds both
    x.close(), before.close()


def test_without_clear_refs_the_process_peak_is_reported_and_named(monkeypatch):
    monkeypatch.setattr(memory, "_reset_cpu_high_water_mark", lambda: False)
    mem = PeakMemory("cpu").start()
    assert mem.kind == "cpu_process_peak_rss" and "imports" in memory.MEASURES[mem.kind]
    assert mem.peak_mb() == pytest.approx(process_peak_rss_mb(), rel=0.05)


def test_every_measure_is_described():
    assert set(memory.MEASURES) == {"cuda_max_allocated", "cpu_rss_added", "cpu_process_peak_rss"}
