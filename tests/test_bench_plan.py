"""config/bench.yaml plans as a whole (rule all): one model's diagnostics figures without the
models-side-by-side figure, which needs two models (its job would otherwise fail on a missing
output), and every calibrated method with five seeds."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_bench_plans_one_models_figures_and_five_seeds_a_method(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "-p", "--cores", "2", "--configfile",
         "config/bench.yaml", "--config", f"workdir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "results/figures/frontier_margin_tiny-dream.pdf" in out
    assert "stability_lag_ccdf_models" not in out
    for method in ("flatquant", "fair-calib", "tmas", "mcs", "uniform-ptq", "hit-only"):
        assert f"results/calib/tiny-dream/{method}@s4/w3a3/meta.json" in out
        assert f"{method}@s5" not in out
