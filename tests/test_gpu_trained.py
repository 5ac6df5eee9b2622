"""benchmarks/gpu_trained.py (issue 40): the GPU-width config plans, two runs' evaluations are
compared answer by answer, and the script's CPU smoke runs its phases end to end."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import gpu_trained as G  # noqa: E402
from fair_calib.report import compare as C  # noqa: E402


def _shard(run: Path, cell: str, per_doc: dict) -> None:
    """A gathered evaluation that is one shard (evaluate.smk copies it): the Parquet file and
    the shard's raw JSON beside it."""
    task_dir = run / "results" / "eval" / cell
    task_dir.mkdir(parents=True)
    task_dir.with_suffix(".parquet").write_bytes(b"")
    (task_dir / "shard-0.json").write_text(json.dumps({"per_doc": per_doc}))


def _per_doc(acc: list[float], responses: dict, arithmetic: str) -> dict:
    return {"metrics": {"acc,none": {"t": {str(i): v for i, v in enumerate(acc)}}},
            "responses": {"t": {"none": responses}},
            "execution": {"arithmetic": arithmetic, "line": ""}}


def test_compare_counts_identical_generations_and_the_largest_loglikelihood_gap(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _shard(a, "m/rtn/w4a4/gen", _per_doc([1, 0, 1], {"0": ["x"], "1": ["y"], "2": ["z"]},
                                         "integer"))
    _shard(b, "m/rtn/w4a4/gen", _per_doc([1, 1, 1], {"0": ["x"], "1": ["w"], "2": ["z"]},
                                         "fake"))
    mc_a = {"0": [[-1.0, True], [-3.0, False]], "1": [[-2.0, False], [-0.5, True]]}
    mc_b = {"0": [[-1.25, True], [-3.0, False]], "1": [[-2.0, False], [-2.5, True]]}
    _shard(a, "m/rtn/w4a4/mc", _per_doc([1, 1], mc_a, "integer"))
    _shard(b, "m/rtn/w4a4/mc", _per_doc([1, 0], mc_b, "fake"))
    rows = {r["task"]: r for r in C.compare_runs(a, b, ("real", "fake"))}
    gen, mc = rows["gen"], rows["mc"]
    assert (gen["identical"], gen["generations"], gen["max_dll"]) == (2, 3, 0.0)
    assert gen["acc_real"] == pytest.approx(200 / 3) and gen["acc_fake"] == 100.0
    assert (mc["generations"], mc["max_dll"]) == (0, 2.0)
    assert (mc["arith_real"], mc["arith_fake"]) == ("integer", "fake")
    table = C.format_rows(list(rows.values()), ("real", "fake"))
    assert "| m | rtn | w4a4 | gen | integer | fake | 66.7 | 100.0 | 2 of 3 | 0 |" in table
    assert "| m | rtn | w4a4 | mc | integer | fake | 100.0 | 50.0 | -- | 2 |" in table


def test_the_gpu_width_configs_plan():
    """`snakemake -n` plans every table of config/gpu_trained.yaml on a machine without a GPU
    (the bar's CPU half), and the CPU smoke's config."""
    for configs, targets in ((["config/gpu_trained.yaml"],
                              ["results/tables/main.tex", "results/tables/w8a8.tex",
                               "results/tables/plain.tex"]),
                             (G.SMOKE_CONFIGS, ["results/tables/main.tex"])):
        out = subprocess.run([sys.executable, "-m", "snakemake", "-n", *targets,
                              "--configfile", *configs], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert "train_tiny" in out.stdout and "table" in out.stdout


@pytest.mark.slow
def test_the_cpu_smoke_runs_its_phases_end_to_end(tmp_path):
    """The script as a user runs it, on the CPU: the wide run (tiny widths, activation
    outliers), its evaluations again by fake quantization (identical: the same arithmetic),
    and beside them the CPU's share."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_trained.py", "run", "--cpu-smoke", "--phases",
         "wide,fake,cpu", "--cpu-method", "rtn", "--runs",
         str(tmp_path / "runs"), "--out", str(out), "--deadline", "1500"],
        cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    assert "wide (FAIR_CALIB_LOWBIT=fake): exit 0" in summary
    assert "fake (FAIR_CALIB_LOWBIT=fake, device cuda): exit 0" in summary
    rows = C.compare_runs(tmp_path / "runs" / "wide" / "runs" / "gpu_trained",
                          tmp_path / "runs" / "fake" / "runs" / "gpu_trained")
    # fp and RTN W4A4 (the smoke's main table) x synth_gen
    assert sorted((r["method"], r["bits"], r["task"]) for r in rows) == [
        ("fp", "fp", "synth_gen"), ("rtn", "w4a4", "synth_gen")]
    assert all(r["identical"] == r["generations"] > 0 and r["max_dll"] == 0 for r in rows)
    assert "cpu (FAIR_CALIB_LOWBIT=fake, device cpu): exit 0" in summary
    # each phase's jobs read off the stages' job lines, each method next to FP
    assert re.search(r"wide jobs with a job line: \d+; not ok: 0;", summary)
    assert "| wide-llada-outliers | synth_gen | " in summary
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
    assert {"kept/wide.jobs.md", "kept/fake.jobs.json", "kept/real_vs_fake.json",
            "kept/wide.main.tex", "kept/fake_card_vs_cpu.json"} <= set(names)


def test_compare_runs_and_jobs_are_commands(tmp_path, capsys):
    """`fair-calib compare-runs` and `fair-calib jobs` print the same tables; a folder that is
    no run is refused in one line naming it."""
    from fair_calib.report import jobs

    _shard(tmp_path / "a", "m/fp/fp/gen", _per_doc([1], {"0": ["x"]}, "full precision"))
    _shard(tmp_path / "b", "m/fp/fp/gen", _per_doc([1], {"0": ["x"]}, "full precision"))
    C.run_cli([str(tmp_path / "a"), str(tmp_path / "b"), "--names", "cpu", "card"])
    assert "| m | fp | fp | gen | full precision | full precision | 100.0 | 100.0 | 1 of 1 | 0 |" \
        in capsys.readouterr().out
    with pytest.raises(SystemExit, match="nowhere/results/eval does not exist"):
        C.run_cli([str(tmp_path / "nowhere"), str(tmp_path / "b")])
    with pytest.raises(SystemExit, match="logs does not exist"):
        jobs.run_cli([str(tmp_path / "a")])


def test_a_rerun_drops_the_copied_evaluations_it_redoes(tmp_path):
    """A rerun (fake, cpu) starts from a copy of the wide run: the evaluations it redoes are
    deleted first, so a rerun stopped by its deadline leaves cells missing, not the real
    path's results under the rerun's name; a table target drops every evaluation."""
    cell = "results/eval/m/fp/fp/synth_gen"
    for rel in (f"{cell}.parquet", f"{cell}/shard-0.parquet", "results/eval/m/rtn/w4a4/x.parquet",
                "results/tables/main.tex"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    G.drop_evaluations(tmp_path, [f"{cell}.parquet"])
    assert not (tmp_path / f"{cell}.parquet").exists() and not (tmp_path / cell).exists()
    assert (tmp_path / "results/eval/m/rtn/w4a4/x.parquet").is_file()
    G.drop_evaluations(tmp_path, ["results/tables/main.tex"])
    assert not (tmp_path / "results/eval").exists() and not (tmp_path / "results/tables").exists()
