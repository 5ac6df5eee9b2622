"""The end-of-run summary: where the results are and the main table in plain text."""
from __future__ import annotations

import io as _io
import subprocess
import sys

import pandas as pd
import pytest

from fair_calib.jobs.io import write_parquet
from fair_calib.report import summary as S
from fair_calib.report import tables as T

CONFIG = {"models": {"m1": {"label": "Tiny-LLaDA"}, "m2": {"label": "Tiny-Dream"}},
          "methods": {"fp": {"label": "FP"}, "rtn": {"label": "RTN"},
                      "fc": {"label": "FAIR-Calib", "latex_label": "\\textbf{FAIR-Calib}"}},
          "tasks": {"t1": {"label": "Synth-MC"}, "t2": {"label": "Synth-Recall"}},
          "tables": {"main": {"bits": "w2a4"}, "calib_memory": {"bits": "w4a4"}}}


def _results(tmp_path, n_tasks=2):
    rows = []
    for model in ("m1", "m2"):
        for method, bits, v in (("fp", "fp", 0.8), ("rtn", "w2a4", 0.3), ("fc", "w2a4", 0.6)):
            for k in range(n_tasks):
                rows.append((model, method, bits, f"t{k + 1}", "acc", v, 0.021, 200, 0.25))
    ev = pd.DataFrame(rows, columns=["model", "method", "bits", "task", "metric", "value",
                                     "stderr", "n", "chance"])
    records: list[dict] = []
    T.main_table(ev, ["m1", "m2"], ["fp", "rtn", "fc"], [f"t{k + 1}" for k in range(n_tasks)],
                 T.labels_from_settings({"labels": {k: CONFIG[k] for k in ("models", "methods", "tasks")}}),
                 bits="w2a4", records=records)
    tdir = tmp_path / "results" / "tables"
    write_parquet(T.cells_frame(records), tdir / "main.parquet", T.cells_schema())
    (tdir / "main.tex").write_text("x")
    (tmp_path / "results" / "figures").mkdir(parents=True)
    for name in ("a", "b"):
        (tmp_path / "results" / "figures" / f"{name}.png").write_bytes(b"png")
    return tmp_path / "results"


def test_summary_says_where_results_are_and_prints_the_main_table(tmp_path):
    res = _results(tmp_path)
    out = S.summary(CONFIG, res)
    text = "\n".join(out)
    assert f"tables:  {res}/tables/main.tex " in text     # calib_memory.tex absent: not named
    assert "calib_memory" not in text
    assert f"figures: {res}/figures/ (2 figures" in text
    table = [ln.strip() for ln in out[out.index(next(ln for ln in out if ln.startswith("  model"))):]]
    assert table[0].split() == ["model", "method", "Synth-MC", "Synth-Recall", "Avg."]
    assert table[1].split() == ["Tiny-LLaDA", "FP", "80.0", "±", "2.1", "80.0", "±", "2.1",
                                "80.0", "±", "1.5"]
    assert table[2].split()[:2] == ["Chance", "25.0"]
    assert table[4].startswith("FAIR-Calib  60.0 ± 2.1*")    # plain label, bold marked *
    assert table[5].startswith("Tiny-Dream")
    assert "standard error over the items" in text and "Chance" in text
    assert len(out) < 25
    # a config in its own folder (workdir: runs/smoke): paths as the user names them
    shown = "\n".join(S.summary(CONFIG, res, shown="runs/smoke/results"))
    assert "tables:  runs/smoke/results/tables/main.tex " in shown
    assert "figures: runs/smoke/results/figures/ (2 figures" in shown


def test_a_wide_table_keeps_the_avg_column(tmp_path):
    res = _results(tmp_path, n_tasks=9)
    out = S.summary(CONFIG, res)
    assert max(len(ln) for ln in out if not ln.startswith(("  tables", "  figures"))) <= S.WIDTH
    assert any("per-task columns" in ln for ln in out)


def test_nothing_to_say_without_results_and_a_failure_never_raises(tmp_path, monkeypatch):
    assert S.summary(CONFIG, tmp_path / "results") == []
    monkeypatch.setattr(S, "summary", lambda *a: 1 / 0)
    buf = _io.StringIO()
    S.print_summary(CONFIG, tmp_path, stream=buf)
    assert buf.getvalue().startswith("(no results summary: ZeroDivisionError")


def test_summary_module_imports_nothing_heavy():
    code = ("import sys, fair_calib.report.summary; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_snakefile_prints_the_summary_on_success():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "Snakefile").read_text()
    assert "onsuccess:" in text and "print_summary(config" in text


def test_readme_warns_about_the_cuda_wheel_before_the_command_and_documents_figures():
    """Issue 23: the multi-GB CUDA-wheel warning came after the command that downloads it;
    no figures-only command was documented."""
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    first_install = readme.index("pip install torch==2.13.0 && pip install -c requirements/lock.txt -e")
    assert readme.index("several GB") < first_install
    assert readme.index("download.pytorch.org/whl/cpu") < first_install
    assert "snakemake --cores 2 figures" in readme


def test_the_figures_rule_is_a_target(tmp_path):
    """`snakemake figures` (the README's figures-only command) plans every figure."""
    from pathlib import Path

    repo = Path(__file__).parents[2]
    snakemake = str(Path(sys.executable).with_name("snakemake"))
    out = subprocess.run([snakemake, "-n", "-p", "--forceall", "--cores", "2", "figures"], cwd=repo,
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert "rule figures:" in text
    # every figure: the diagnostics' and the prior ablation's floor sweep (issue 32)
    assert "rule diagnostic_figures:" in text and "rule floor_sweep:" in text
    target = text[text.index("rule figures:"):]
    inputs = target[target.index("input:"):].splitlines()[0]
    assert "results/figures/floor_sweep.pdf" in inputs and "prior_curve_tiny-llada.png" in inputs
    # the figure settings name the prior by the method that uses it, and only that prior is
    # drawn in prior_curve_<model> (the cross-corpus priors have their own figure)
    assert '"priors": {"default": "prior of FAIR-Calib"}' in text
    assert '"priors": ["default"]' in text
