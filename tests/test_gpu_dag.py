"""The pieces of the GPU runs that run anywhere (benchmarks/gpu_trained.py: the wheelhouse, the
grid's documents and tokenizer, the job summaries and what comes back; the stage CLIs' job
lines; config/gpu_dag*.yaml). The grid itself is `gpu_trained.py run --phases grid
[--cpu-smoke]`."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from fair_calib.cli import main as cli
from fair_calib.checks import config as C

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import gpu_trained as G  # noqa: E402
from fair_calib.report import jobs as J  # noqa: E402


def test_length_classes_take_each_classs_shortest_and_longest():
    lengths = [50, 10, 40, 30, 20, 60, 70, 80, 90]          # ranks: 1 4 3 2 0 5 6 7 8
    picked = G.pick_by_length(lengths, classes=3, per_class=2)
    assert [(lengths[i], c) for i, c in picked] == [(10, 0), (30, 0), (40, 1), (60, 1),
                                                    (70, 2), (90, 2)]
    assert [lengths[i] for i, _ in G.pick_by_length(lengths, 3, 1)] == [20, 50, 80]
    with pytest.raises(ValueError, match="cannot fill 3 classes of 4"):
        G.pick_by_length(lengths, 3, 4)


def test_the_tokenizer_decodes_every_id_of_the_models_vocabulary():
    tok = G.family_tokenizer(["Natalia sold 48 clips .", "a b c"], "llada", 600, 4096)
    assert len(tok) == 600 and tok.model_max_length == 4096
    assert tok.convert_ids_to_tokens(tok.mask_token_id) == "<|mdm_mask|>"
    assert tok.decode([599]) == "<|reserved_599|>"
    assert len(tok("Natalia sold 48 clips.", add_special_tokens=False)["input_ids"]) == \
        G.n_tokens("Natalia sold 48 clips.") == 5
    with pytest.raises(ValueError, match="more than the model's vocabulary of 10"):
        G.family_tokenizer(["a b c d e f g"], "dream", 10, 2048)


def _log(run: Path, rel: str, *lines: str) -> None:
    path = run / "logs" / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def test_summary_reads_the_job_lines_and_puts_each_method_next_to_fp(tmp_path, capsys):
    start = cli.job_record("evaluate", "start", 100.0)
    assert start == {"stage": "evaluate", "status": "start", "start": 100.0}
    def line(rec):
        return cli.JOB_LINE + json.dumps(rec)

    for method, wall in (("fp", 10.0), ("rtn", 15.0)):
        bits = "fp" if method == "fp" else "w4a4"
        _log(tmp_path, f"evaluate/m/{method}/{bits}/t/shard-0.log", line(start), "work",
             line({"stage": "evaluate", "status": "ok", "start": 100.0, "wall_s": wall,
                   "card": "NVIDIA H100 80GB HBM3", "peak_gpu_gb": 4.0}))
    _log(tmp_path, "calibrate/m/rtn/w4a4.log", line({**start, "stage": "calibrate"}))
    _log(tmp_path, "gather_eval/m/fp/fp/t.log")
    bench = tmp_path / "results/benchmarks/evaluate/m/fp/fp/t/shard-0.tsv"
    bench.parent.mkdir(parents=True)
    bench.write_text("s\th:m:s\n12.5\t0:00:12\n")
    records = J.job_records(tmp_path)
    by = {(r["job"], r["wildcards"]): r for r in records}
    assert by[("evaluate", "m/fp/fp/t/shard-0")]["process_s"] == 12.5
    assert by[("calibrate", "m/rtn/w4a4")]["status"] == "started, never ended (killed?)"
    assert J.max_overlap(records, gpu_only=True) == 2
    text = "\n".join(J.summary_lines("grid", records))
    assert "| m | t | 10.0 | 15.0 (1.50x) |" in text
    assert "not ok: 1" in text and "1 gather_eval jobs of one shard" in text
    assert "by stage: evaluate 2 jobs 25 s (max 15)" in text
    # what comes back from the device tool: summary.md and one archive of the rest
    runs, out = tmp_path / "runs", tmp_path / "out"
    (runs / "grid").mkdir(parents=True)
    os.rename(tmp_path / "logs", runs / "grid" / "logs")
    args = argparse.Namespace(cpu_smoke=True, runs=str(runs), out=str(out), deadline=1.0)
    runner = G.Runner(args)
    runner.jobs(runs / "grid", "grid")
    runner.write_summary()
    assert sorted(p.name for p in out.iterdir()) == ["results.tgz", "summary.md"]
    summary = (out / "summary.md").read_text()
    assert "grid jobs with a job line: 2; not ok: 1" in summary
    assert "| m | t | 10.0 | 15.0 (1.50x) |" in summary
    with tarfile.open(out / "results.tgz") as tar:
        names = tar.getnames()
        jobs = json.load(tar.extractfile("kept/grid.jobs.json"))
        table = tar.extractfile("kept/grid.jobs.md").read().decode()
    assert "grid/logs/evaluate/m/rtn/w4a4/t/shard-0.log" in names
    assert [r["wildcards"] for r in jobs] == [r["wildcards"] for r in records]
    assert "| evaluate | m/rtn/w4a4/t/shard-0 | ok | 15.0 | - | NVIDIA H100 80GB HBM3 |" in table


def test_the_wheelhouse_holds_only_what_the_lent_python_installs():
    ok = ["annotated_types-0.8.0-py3-none-any.whl",
          "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
          "sqlalchemy-2.0.58-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]
    assert G.wheelhouse_errors(ok) == []
    bad = ["greenlet-3.5.6-cp311-cp311-manylinux_2_24_x86_64.whl",
           "rpds_py-2026.9.1-cp312-cp312-macosx_11_0_arm64.whl"]
    assert G.wheelhouse_errors(ok + bad + ["Annotated.Types-0.9.0-py3-none-any.whl"]) == [
        f"a wheel the lent machine cannot install: {n}" for n in bad] + [
        "two versions of: annotated-types"]
    # every pin once; snakemake, lm-eval and datasets are what the run refuses to go without
    names = [w.split("==")[0] for w in G.WHEELS + G.SDIST_ONLY]
    assert len(names) == len(set(names)) == 59 and set(G.NEEDED) <= set(names)


def test_run_refuses_unknown_phases_and_a_grid_without_its_documents(tmp_path):
    with pytest.raises(SystemExit, match=r"--phases \['warm'\]: choose from"):
        G.main(["run", "--cpu-smoke", "--phases", "wide,warm"])
    with pytest.raises(SystemExit, match="manifest.json is missing: run 'python benchmarks/"
                                         "gpu_trained.py data'"):
        G.main(["run", "--cpu-smoke", "--phases", "grid", "--data", str(tmp_path)])


def _cli(cwd, *args):
    # run in a scratch folder: the stage's job lock is written beside its output
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "fair_calib.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd)


def test_a_stage_logs_its_wall_time_and_card_even_when_it_fails(tmp_path):
    refused = _cli(tmp_path, "prior", "--settings", "{}")   # refused before the job starts
    assert refused.returncode != 0 and cli.JOB_LINE not in refused.stderr
    failed = _cli(tmp_path, "report", "--out", "x")          # the stage's own parser refuses it
    lines = [json.loads(l[len(cli.JOB_LINE):]) for l in failed.stderr.splitlines()
             if l.startswith(cli.JOB_LINE)]
    assert failed.returncode != 0 and [r["status"] for r in lines] == ["start", "error"]
    assert lines[1]["card"] == "cpu" and lines[1]["wall_s"] >= 0


def test_the_gpu_dag_configs_pass_the_workflows_checks():
    from fair_calib.checks.references import check_config

    for files in (["gpu_dag.yaml"], ["gpu_dag.yaml", "gpu_dag_cpu.yaml"]):
        cfg = C.validate_config(C.merged_config([REPO / "config" / f for f in files]))
        check_config(cfg)
        assert cfg["tables"]["main"]["methods"] == list(J.METHOD_ORDER)
        assert not cfg["diagnostics"]["enabled"] and not cfg["prior_ablation"]["enabled"]
