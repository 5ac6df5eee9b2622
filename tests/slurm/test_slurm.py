"""End-to-end runs of the workflow through a real SLURM cluster (issue 8).

Needs a working SLURM client (`sinfo`); tests/slurm/slurm_up.sh starts a single-node cluster on
localhost and .ci/slurm.sh runs this file against it. Skipped unless FAIR_CALIB_SLURM_TEST=1.

1. `test_slurm_run_matches_local`: the smoke config with tests/slurm/dag.yaml over it (every
   rule of the smoke DAG, on one model and two methods) is run with `--profile profiles/local`
   in one copy of the repository and with `--profile profiles/slurm` in another. Every job of
   the SLURM run must have gone through SLURM (the executor's "submitted with SLURM jobid N"
   lines, one SLURM log file per job, and `scontrol show job N` = COMPLETED with the copy as
   WorkDir), every rule of the DAG must have run, and every result (Parquet data + provenance
   minus volatile keys, LaTeX, JSON, safetensors) must equal the local run's.
2. `test_killed_calibration_resumes`: a calibration job is cancelled (`scancel`) right after its
   first block is saved; Snakemake resubmits it (attempt 2, with more memory), the retry resumes
   from the saved block, and the final output is complete.
3. `test_interrupted_run_is_not_taken_as_complete`: the calibration job *and* the Snakemake
   process are killed mid-calibration (a lost login node) and the cell is left with truncated
   outputs plus a bogus completion marker; Snakemake must report them incomplete, the profile
   (rerun-incomplete) must rerun the job, and the rerun resumes from the saved block.

Environment: FAIR_CALIB_SLURM_TEST=1 (run), FAIR_CALIB_SLURM_REQUIRE=1 (fail instead of skip
when no cluster answers; CI sets it), FAIR_CALIB_SLURM_STATE (slurm_up.sh's state folder),
FAIR_CALIB_SLURM_CONFIG (default config/smoke.yaml), FAIR_CALIB_SLURM_OVERLAY (default
tests/slurm/dag.yaml, merged over it; empty: the config's whole DAG), FAIR_CALIB_SLURM_TARGET
(default results/tables/main.tex), FAIR_CALIB_SLURM_RUN_TIMEOUT (seconds per Snakemake run, default 1500),
FAIR_CALIB_SLURM_JOBS (concurrent SLURM jobs, default 4), FAIR_CALIB_SLURM_WORKDIR (keep the
copies there instead of a pytest tmp dir, for inspection).
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("FAIR_CALIB_SLURM_STATE", "/tmp/fair-calib-slurm"))
CONFIG = os.environ.get("FAIR_CALIB_SLURM_CONFIG", "config/smoke.yaml")
OVERLAY = os.environ.get("FAIR_CALIB_SLURM_OVERLAY", "tests/slurm/dag.yaml")
CONFIGS = [CONFIG, *([OVERLAY] if OVERLAY else [])]
TARGET = os.environ.get("FAIR_CALIB_SLURM_TARGET", "results/tables/main.tex")
RUN_TIMEOUT = int(os.environ.get("FAIR_CALIB_SLURM_RUN_TIMEOUT", "1500"))
JOBS = os.environ.get("FAIR_CALIB_SLURM_JOBS", "4")
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
# Calibration cell the fault tests kill, and how long its blocks train there.
FAULT_CELL = os.environ.get("FAIR_CALIB_SLURM_FAULT_CELL", "tiny-llada/flatquant/w4a4")
FAULT_EPOCHS = int(os.environ.get("FAIR_CALIB_SLURM_FAULT_EPOCHS", "300"))

# The test cluster has no slurmdbd: sacct fails there and plugin 2.8.0 would wait forever,
# so status goes through squeue (slurm_up.sh sets MinJobAge well above 3x the init wait).
SLURM_TEST_FLAGS = ["--slurm-status-command", "squeue",
                    "--slurm-init-seconds-before-status-checks", "2",
                    "--latency-wait", "10", "--jobs", JOBS]

SUBMIT_RE = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: ([^)]+)\)")
FAILED_RE = re.compile(r"SLURM-job '(\d+)' failed, SLURM status is: '(\w+)'")
FINISHED_RE = re.compile(r"Finished jobid: \d+ \(Rule: (\w+)\)")
LOCALRULE_RE = re.compile(r"^localrule (\w+):", re.M)
# Keys of provenance / meta records that legitimately differ between two runs of the same job.
VOLATILE_KEYS = {"seconds", "time", "timestamp", "created", "created_at", "started", "finished",
                 "date", "host", "hostname", "node", "pid", "elapsed", "wall_seconds",
                 "peak_mem_mb", "duration", "runtime_s", "user", "cwd", "slurm_job_id",
                 # lm-eval's raw output: wall-clock stamps, its temporary task-config path
                 "start_time", "end_time", "total_evaluation_time_seconds", "config_source"}
# Data columns that are measurements of the run itself, not results.
VOLATILE_COLUMNS = {"seconds", "peak_mem_mb"}


# ------------------------------------------------------------------------------ environment
def _env(repo: Path | None = None) -> dict[str, str]:
    env = os.environ.copy()
    if "SLURM_CONF" not in env and (STATE / "slurm.conf").exists():
        env["SLURM_CONF"] = str(STATE / "slurm.conf")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # jobs import the copy's package, not the editable install's (exported to SLURM jobs too)
    if repo is None:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = str(repo)
    return env


def _cluster_problem() -> str | None:
    if os.environ.get("FAIR_CALIB_SLURM_TEST") != "1":
        return ("SLURM end-to-end test: set FAIR_CALIB_SLURM_TEST=1 with a cluster up "
                "(tests/slurm/slurm_up.sh, or run .ci/slurm.sh)")
    if shutil.which("sinfo") is None:
        return "SLURM end-to-end test: `sinfo` not found (tests/slurm/slurm_up.sh installs it)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=_env(), capture_output=True,
                             text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "SLURM end-to-end test: `sinfo` hung for 30 s"
    states = out.stdout.split()
    if out.returncode != 0 or not any(s.rstrip("*~#") in ("idle", "mixed", "allocated")
                                      for s in states):
        return (f"SLURM end-to-end test: no usable node (sinfo rc={out.returncode}, "
                f"states={states}, stderr={out.stderr.strip()[:200]!r})")
    return None


_problem = _cluster_problem()
if _problem and os.environ.get("FAIR_CALIB_SLURM_TEST") == "1" \
        and os.environ.get("FAIR_CALIB_SLURM_REQUIRE") == "1":
    raise RuntimeError(_problem)  # CI: a cluster that did not come up is a failure, not a skip
pytestmark = [pytest.mark.slurm, pytest.mark.slow,
              pytest.mark.skipif(_problem is not None, reason=_problem or "")]


# ------------------------------------------------------------------------------ helpers
def copy_repo(dest: Path) -> Path:
    """Copy the working tree (tracked + untracked, not ignored) to dest/repo; dest/shared links
    to the real ../shared so relative data paths keep working."""
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    repo = dest / "repo"
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():
            continue  # deleted but still in the index
        out = repo / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)
    shared = REPO.parent / "shared"
    if shared.exists() and not (dest / "shared").exists():
        (dest / "shared").symlink_to(shared)
    return repo


def snakemake_cmd(*args: str, timeout: int = RUN_TIMEOUT) -> list[str]:
    # A hung Snakemake ignores SIGTERM: `timeout -k` follows up with SIGKILL.
    return ["timeout", "-k", "30", str(timeout), SNAKEMAKE, *args]


def run_snakemake(repo: Path, args: list[str], log: Path) -> tuple[int, str, float]:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        proc = subprocess.run(snakemake_cmd(*args), cwd=repo, env=_env(repo), stdout=fh,
                              stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT + 120)
    return proc.returncode, log.read_text(), time.monotonic() - t0


def config_args(*extra: str) -> list[str]:
    # in the copy's own root, whatever folder the config names for itself (smoke.yaml's
    # workdir: runs/smoke): this test compares and kills files there
    return ["--configfile", *CONFIGS, *extra, "--config", "workdir=.", "--"]


def planned_rules(repo: Path, configs: list[str]) -> set[str]:
    """The rules of TARGET's whole DAG under ``configs`` (a dry run from scratch)."""
    out = subprocess.run(snakemake_cmd("-n", "--forceall", "--configfile", *configs, "--config",
                                       "workdir=.", "--", TARGET, timeout=300),
                         cwd=repo, env=_env(repo), capture_output=True, text=True)
    assert out.returncode == 0, tail(out.stdout + out.stderr)
    return set(re.findall(r"^(?:local)?rule (\w+):", out.stdout, re.M)) - {"all"}


def scontrol_job(jobid: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", jobid], env=_env(),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, f"scontrol show job {jobid}: {out.stderr}"
    rec = {}
    for tok in out.stdout.split():
        if "=" in tok:
            k, v = tok.split("=", 1)
            rec[k] = v
    return rec


def resource_table(repo: Path) -> dict:
    """`resources:` of config/config.yaml overlaid with the test configs' (one level deep)."""
    import yaml

    table = {}
    for path in (repo / "config" / "config.yaml", *(repo / c for c in CONFIGS)):
        for rule, res in ((yaml.safe_load(path.read_text()) or {}).get("resources") or {}).items():
            table.setdefault(rule, {}).update(res)
    return table


ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"}


def crash_job(jobid: str) -> None:
    """SIGKILL every process of a running job at once (the single test node is this host)."""
    out = subprocess.run(["scontrol", "listpids", jobid], env=_env(), capture_output=True,
                         text=True, timeout=30)
    pids = [int(line.split()[0]) for line in out.stdout.splitlines()[1:]
            if line.split() and line.split()[0].isdigit()]
    assert pids, f"scontrol listpids {jobid}: {out.stdout} {out.stderr}"
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["scancel", jobid], env=_env(), timeout=30)  # in case the batch shell lingers


def tail(text: str, n: int = 60) -> str:
    return "\n".join(text.splitlines()[-n:])


def strip_volatile(obj, root: Path | None = None):
    """Drop volatile keys; with ``root``, paths inside the run's copy become "<repo>/..."."""
    if isinstance(obj, dict):
        return {k: strip_volatile(v, root) for k, v in obj.items() if k not in VOLATILE_KEYS}
    if isinstance(obj, list):
        return [strip_volatile(v, root) for v in obj]
    if isinstance(obj, str) and root is not None:
        return obj.replace(str(root), "<repo>")
    return obj


def first_diff(a, b, path: str = "") -> str | None:
    """Where two JSON-like values first differ (None: equal)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}/{k} (only in {'slurm' if k not in a else 'local'})"
            d = first_diff(a[k], b[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (u, v) in enumerate(zip(a, b)):
            d = first_diff(u, v, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: {str(a)[:80]!r} != {str(b)[:80]!r}"


def compare_trees(local: Path, slurm: Path) -> list[str]:
    """Differences between the results/ of two runs (empty list: equal)."""
    import pandas as pd
    import torch

    from fair_calib.jobs import io

    problems = []
    rel_files = lambda root: {p.relative_to(root) for p in (root / "results").rglob("*")
                              if p.is_file() and "benchmarks" not in p.parts
                              and not p.name.startswith(".")}
    a, b = rel_files(local), rel_files(slurm)
    if a != b:
        problems.append(f"file sets differ: only local {sorted(map(str, a - b))[:10]}, "
                        f"only slurm {sorted(map(str, b - a))[:10]}")
    for rel in sorted(a & b):
        pa_, pb_ = local / rel, slurm / rel
        suffix = rel.suffix
        if suffix == ".parquet":
            (da, prov_a), (db, prov_b) = io.read_parquet(pa_), io.read_parquet(pb_)
            drop = [c for c in da.columns if c in VOLATILE_COLUMNS]
            try:
                pd.testing.assert_frame_equal(da.drop(columns=drop), db.drop(columns=drop),
                                              check_exact=True)
            except AssertionError as err:
                problems.append(f"{rel}: data differ: {str(err)[:300]}")
            d = first_diff(strip_volatile(prov_a, local), strip_volatile(prov_b, slurm))
            if d:
                problems.append(f"{rel}: provenance differs beyond volatile keys at {d}")
        elif suffix == ".safetensors":
            (ta, prov_a), (tb, prov_b) = io.load_tensors(pa_), io.load_tensors(pb_)
            if ta.keys() != tb.keys():
                problems.append(f"{rel}: tensor names differ")
            else:
                bad = [k for k in ta if not torch.equal(ta[k], tb[k])]
                if bad:
                    problems.append(f"{rel}: tensors differ: {bad[:5]}")
            d = first_diff(strip_volatile(prov_a, local), strip_volatile(prov_b, slurm))
            if d:
                problems.append(f"{rel}: provenance differs beyond volatile keys at {d}")
        elif suffix == ".json":
            d = first_diff(strip_volatile(json.loads(pa_.read_text()), local),
                           strip_volatile(json.loads(pb_.read_text()), slurm))
            if d:
                problems.append(f"{rel}: JSON differs beyond volatile keys at {d}")
        elif suffix in (".tex", ".csv", ".txt", ".md", ".tsv"):
            if pa_.read_text().replace(str(local), "<repo>") != \
                    pb_.read_text().replace(str(slurm), "<repo>"):
                problems.append(f"{rel}: text differs")
        # binary figures (pdf/png) embed creation dates; their data is in the Parquet files
    return problems


def wait_for(pred, timeout: float, interval: float = 0.2, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        val = pred()
        if val:
            return val
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    keep = os.environ.get("FAIR_CALIB_SLURM_WORKDIR")
    if keep:
        path = Path(keep)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return tmp_path_factory.mktemp("slurm_e2e")


@pytest.fixture(scope="module")
def local_run(workdir) -> Path:
    repo = copy_repo(workdir / "local")
    rc, log, secs = run_snakemake(repo, ["--profile", "profiles/local", "--cores", "2",
                                         *config_args(), TARGET], workdir / "local.log")
    print(f"\n[slurm-e2e] local run: {secs:.0f} s (rc={rc})")
    assert rc == 0, f"local run failed (rc={rc}):\n{tail(log)}"
    return repo


@pytest.fixture(scope="module")
def slurm_repo(workdir) -> Path:
    return copy_repo(workdir / "slurm")


@pytest.fixture(scope="module")
def slurm_run(slurm_repo, workdir):
    repo = slurm_repo
    rc, log, secs = run_snakemake(repo, ["--profile", "profiles/slurm", *SLURM_TEST_FLAGS,
                                         *config_args(), TARGET], workdir / "slurm.log")
    print(f"\n[slurm-e2e] SLURM run: {secs:.0f} s (rc={rc})")
    assert rc == 0, f"SLURM run failed (rc={rc}):\n{tail(log)}"
    return repo, log


# ------------------------------------------------------------------------------ tests
def test_slurm_run_matches_local(local_run, slurm_run):
    repo, log = slurm_run
    submits = SUBMIT_RE.findall(log)
    assert submits, f"no job was submitted to SLURM:\n{tail(log)}"
    finished_rules = FINISHED_RE.findall(log)
    local_rules = set(LOCALRULE_RE.findall(log)) | {"all"}
    # every job except the workflow's declared local rules went through sbatch
    n_jobs = len([r for r in finished_rules if r not in local_rules])
    assert len(submits) == n_jobs, f"{len(submits)} SLURM submissions for {n_jobs} jobs"
    assert len({jid for _, jid, _ in submits}) == len(submits)
    # the overlay's smaller DAG runs every rule of the config's whole DAG, each non-local one
    # through SLURM
    whole = planned_rules(repo, [CONFIG])
    assert set(finished_rules) - {"all"} == whole, whole ^ set(finished_rules)
    submitted = {re.search(r"/rule_(\w+)/", lf).group(1) for _, _, lf in submits}
    assert submitted == whole - local_rules, submitted ^ (whole - local_rules)
    for _, jid, logfile in submits:
        # the executor's per-job SLURM log (kept: slurm-keep-successful-logs) ...
        path = Path(logfile)
        assert path.is_file() and str(path).startswith(str(repo / "logs" / "slurm")), path
        # ... and the controller's record of the job
        rec = scontrol_job(jid)
        assert rec.get("JobState") == "COMPLETED", (jid, rec.get("JobState"))
        assert Path(rec.get("WorkDir", "")).resolve() == repo.resolve(), rec.get("WorkDir")
        assert rec.get("Partition"), rec
    # memory / time requests come from the config's resource table (attempt 1: base value)
    cal = [jid for _, jid, lf in submits if "/rule_calibrate/" in lf]
    assert cal, "no calibration job went through SLURM"
    want = resource_table(repo).get("calibrate", {})
    for jid in cal:
        rec = scontrol_job(jid)
        if "mem_mb" in want:
            assert rec["MinMemoryNode"] == f"{want['mem_mb']}M", (jid, rec["MinMemoryNode"])
    problems = compare_trees(local_run, repo)
    assert not problems, "SLURM results differ from the local run:\n" + "\n".join(problems)
    assert (repo / TARGET).is_file()


def _fault_overlay(workdir: Path) -> Path:
    """Config overlay that makes the fault cell's blocks train long enough to be killed in."""
    method = FAULT_CELL.split("/")[1]
    path = workdir / "fault.yaml"
    # workdir ".": the copy's own root, where this test looks (as config_args says)
    path.write_text(f"methods:\n  {method}: {{epochs: {FAULT_EPOCHS}}}\nworkdir: \".\"\n")
    return path


def _calib_paths(repo: Path):
    cdir = repo / "results" / "calib" / FAULT_CELL
    return cdir, cdir / "blocks", cdir / "meta.json", repo / "logs" / "calibrate" / f"{FAULT_CELL}.log"


def _assert_complete(repo: Path):
    import torch

    from fair_calib.jobs import io

    cdir, blocks, meta_path, _ = _calib_paths(repo)
    meta = json.loads(meta_path.read_text())
    n_blocks = meta["n_blocks"]
    assert n_blocks >= 2
    assert sorted(p.name for p in blocks.glob("*.safetensors")) == \
        sorted(f"{i}.safetensors" for i in range(n_blocks))
    stats, _ = io.read_parquet(cdir / "stats.parquet")
    assert sorted(stats["block"].unique().tolist()) == list(range(n_blocks))
    trained = stats[stats["epoch"] >= 0]  # epoch -1 is the loss before training
    assert trained.groupby("block")["epoch"].nunique().reindex(range(n_blocks)).tolist() == \
        [FAULT_EPOCHS] * n_blocks
    assert all(math.isfinite(v) for v in stats["loss"])
    tensors, _ = io.load_tensors(cdir / "params.safetensors")
    prefixes = {k.split(".", 1)[0] for k in tensors}
    assert prefixes == {str(i) for i in range(n_blocks)}, prefixes
    assert all(torch.isfinite(t.float()).all() for t in tensors.values())


def _start_calibration(repo: Path, workdir: Path, name: str, extra: list[str]):
    cdir, blocks, meta, rule_log = _calib_paths(repo)
    target = str(meta.relative_to(repo))
    log = workdir / f"{name}.log"
    fh = open(log, "w")
    proc = subprocess.Popen(
        snakemake_cmd("--profile", "profiles/slurm", *SLURM_TEST_FLAGS, *extra,
                      "--configfile", *CONFIGS, str(_fault_overlay(workdir)), "--", target),
        cwd=repo, env=_env(repo), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, fh, log


def _kill_after_first_block(proc, log: Path, repo: Path) -> str:
    cdir, blocks, meta, _ = _calib_paths(repo)

    def first_block():
        if proc.poll() is not None:
            raise AssertionError(f"Snakemake ended early:\n{tail(log.read_text())}")
        return (blocks / "0.safetensors").exists()

    wait_for(first_block, RUN_TIMEOUT, what=f"{blocks}/0.safetensors")
    jid = wait_for(lambda: [j for _, j, lf in SUBMIT_RE.findall(log.read_text())
                            if "/rule_calibrate/" in lf], 60, what="the calibration job id")[-1]
    subprocess.run(["scancel", jid], env=_env(), check=True, timeout=30)
    # the job was killed mid-calibration: not every block was done, and nothing final written
    assert not (blocks / "1.safetensors").exists(), \
        "block 1 finished before the cancel; raise FAIR_CALIB_SLURM_FAULT_EPOCHS"
    assert not meta.exists()
    wait_for(lambda: scontrol_job(jid).get("JobState") in ("CANCELLED", "FAILED"), 60,
             what=f"SLURM job {jid} to end")
    return jid


def test_killed_calibration_resumes(slurm_repo, workdir):
    # runs after test 1 in the same copy (upstream jobs done); alone, it builds them first
    repo = slurm_repo
    cdir, blocks, meta, rule_log = _calib_paths(repo)
    # the overlay changes this cell's settings: its old blocks would be refused, not resumed
    shutil.rmtree(cdir, ignore_errors=True)
    proc, fh, log = _start_calibration(repo, workdir, "fault_retry", [])
    try:
        killed = _kill_after_first_block(proc, log, repo)
        rc = proc.wait(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        fh.close()
    text = log.read_text()
    assert rc == 0, f"Snakemake did not recover from the killed job (rc={rc}):\n{tail(text)}"
    assert (killed, "CANCELLED") in FAILED_RE.findall(text), tail(text)
    cal = [(j, lf) for _, j, lf in SUBMIT_RE.findall(text) if "/rule_calibrate/" in lf]
    assert len(cal) == 2 and cal[0][0] == killed, cal  # submitted, killed, resubmitted once
    retry = scontrol_job(cal[1][0])
    assert retry.get("JobState") == "COMPLETED", retry.get("JobState")
    # memory grows with `attempt`: the retry asked SLURM for more than the first try
    mem = lambda rec: int(re.match(r"(\d+)", rec["MinMemoryNode"]).group(1))
    assert mem(retry) > mem(scontrol_job(killed)), (retry["MinMemoryNode"],)
    rule_text = rule_log.read_text()
    assert "block 0: resumed from" in rule_text, rule_text[-2000:]
    assert "block 1: resumed from" not in rule_text
    _assert_complete(repo)


def test_interrupted_run_is_not_taken_as_complete(slurm_repo, workdir):
    """Kill the job and Snakemake itself (a lost login node); the next run must not trust the
    half-written output and must resume the calibration from its saved block."""
    repo = slurm_repo
    cdir, blocks, meta, rule_log = _calib_paths(repo)
    shutil.rmtree(cdir, ignore_errors=True)  # start this cell from scratch (same settings as the previous test)
    proc, fh, log = _start_calibration(repo, workdir, "fault_lost", ["--retries", "0"])
    try:
        # SIGKILL Snakemake first (nothing can clean up), then every process of the job, as
        # a node crash would. (A plain `scancel` sends SIGTERM: the executor's job step then
        # deletes the job's outputs and its incomplete marker itself -- the easy case.)
        wait_for(lambda: (blocks / "0.safetensors").exists(), RUN_TIMEOUT, what="block 0")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        jids = [j for _, j, lf in SUBMIT_RE.findall(log.read_text()) if "/rule_calibrate/" in lf]
        assert jids
        crash_job(jids[-1])
        wait_for(lambda: scontrol_job(jids[-1]).get("JobState") not in ACTIVE_STATES, 60,
                 what="the orphaned job to end")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        fh.close()
    assert not meta.exists() and not (blocks / "1.safetensors").exists()
    # Worst case: a writer died half-way and left every output in place -- truncated
    # params/stats and even a (bogus) completion marker, all newer than the inputs. Only
    # Snakemake's record that the job started and never finished stands between these files
    # and a "done" verdict.
    (cdir / "params.safetensors").write_bytes(b"\0" * 16)
    (cdir / "stats.parquet").write_bytes(b"PAR1")
    meta.write_text('{"partial": true}\n')
    # the SIGKILLed Snakemake left its lock behind, as on a lost login node
    subprocess.run(snakemake_cmd("--unlock", "--configfile", *CONFIGS, str(_fault_overlay(workdir)),
                                 timeout=300), cwd=repo,
                   env=_env(repo), capture_output=True, check=True)
    # without --rerun-incomplete Snakemake refuses to go on and names the incomplete outputs
    dry = subprocess.run(
        snakemake_cmd("-n", "--configfile", *CONFIGS, str(_fault_overlay(workdir)), "--",
                      str(meta.relative_to(repo)), timeout=300),
        cwd=repo, env=_env(repo), capture_output=True, text=True)
    text = dry.stdout + dry.stderr
    assert dry.returncode != 0 and "incomplete" in text.lower(), tail(text)
    assert str(meta.relative_to(repo)) in text, tail(text)
    # the profile's rerun-incomplete plans the job again (the files are not taken as done)
    dry = subprocess.run(
        snakemake_cmd("-n", "--profile", "profiles/slurm", "--configfile", *CONFIGS,
                      str(_fault_overlay(workdir)), "--", str(meta.relative_to(repo)),
                      timeout=300),
        cwd=repo, env=_env(repo), capture_output=True, text=True)
    assert dry.returncode == 0 and "rule calibrate:" in dry.stdout + dry.stderr, \
        tail(dry.stdout + dry.stderr)
    proc, fh, log = _start_calibration(repo, workdir, "fault_resume", [])
    try:
        rc = proc.wait(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        fh.close()
    assert rc == 0, tail(log.read_text())
    assert "block 0: resumed from" in rule_log.read_text()
    _assert_complete(repo)
