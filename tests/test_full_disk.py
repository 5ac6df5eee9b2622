"""A full disk while Snakemake records a finished job (`Error recording metadata ... Please
ensure write permissions`): one `Failed:` line says what happened and what to do, and the rerun,
which Snakemake stops on the output it left marked incomplete, says `--rerun-incomplete` is safe
there (no run holds the lock)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fair_calib.jobs.failures import metadata_line
from fair_calib.jobs.preflight import incomplete_note, incomplete_outputs

REPO = Path(__file__).resolve().parents[1]
FULL_DISK = '''
import errno, sys
if "snakemake" in sys.argv[0]:          # Snakemake's process, not its jobs'
    import snakemake.persistence as P

    async def finished(self, job):
        raise OSError(errno.ENOSPC, "No space left on device", ".snakemake/metadata/x")

    P.PersistenceBase.finished = finished
'''


def test_the_metadata_error_is_one_line_saying_what_to_do():
    line = metadata_line("make_data", "/w/.snakemake",
                         "[Errno 28] No space left on device: '.snakemake/metadata/x'")
    assert line.startswith("Failed: make_data: its outputs are written, but Snakemake could not "
                           "record the job in /w/.snakemake ([Errno 28] No space left on device")
    assert "the disk (or quota) holding it is full: free space, then rerun with " \
           "--rerun-incomplete" in line and "\n" not in line


def test_incomplete_markers_are_named(tmp_path):
    from base64 import urlsafe_b64encode

    inc = tmp_path / ".snakemake/incomplete"
    inc.mkdir(parents=True)
    (inc / urlsafe_b64encode(b"resources/data/train.txt").decode()).write_text("{}")
    (inc / "migration_underway").write_text("")
    files = incomplete_outputs(str(tmp_path / ".snakemake"))
    assert files == ["resources/data/train.txt"]
    note = incomplete_note(files)
    assert note.startswith("Note: 1 output of an earlier run is marked incomplete "
                           "(resources/data/train.txt)") and "--rerun-incomplete" in note
    assert incomplete_note([]) is None


@pytest.mark.slow
def test_a_full_disk_at_the_metadata_and_the_rerun_each_say_one_line(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    for item in ("Snakefile", "workflow", "config", "profiles"):
        src = REPO / item
        (shutil.copytree if src.is_dir() else shutil.copy)(src, ws / item)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FULL_DISK)
    cmd = ["snakemake", "--cores", "1", "--configfile", "config/smoke.yaml", "--",
           "resources/data/manifest.json"]
    res = subprocess.run(cmd, cwd=ws, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{hook}{os.pathsep}{REPO}"})
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    failed = [l for l in out.splitlines() if l.startswith("Failed: ")]
    assert len(failed) == 1 and failed[0].startswith("Failed: make_data: its outputs are "
                                                     "written") and "No space left" in failed[0], out[-3000:]
    again = subprocess.run(cmd[:1] + ["-n"] + cmd[1:], cwd=ws, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    out = again.stdout + again.stderr
    notes = [l for l in out.splitlines() if "marked incomplete" in l and l.startswith("Note:")]
    assert len(notes) == 1 and "--rerun-incomplete to redo them: it is safe here" in notes[0], out
