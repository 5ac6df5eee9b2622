"""The GPU-hour projection: per-request arithmetic, and the paper grid end to end."""
import pytest

from fair_calib import cost

SHAPE = dict(docs=10, choices=4, ctx=100, shot=50, target=1)
LLADA = {"estimator": "llada", "mc_num": 128, "batch_size": 8}


def test_mc_and_exact_costs_follow_the_forwards():
    task = {"num_fewshot": 2, "mc_num": 128, "batch_size": 8}
    mc = cost.mc_task_seconds(task, SHAPE, "llada", False, LLADA)
    # 10 docs x 4 choices x 16 forwards of 8 rows x (100 + 2 x 50 + 1) tokens
    assert mc == pytest.approx(10 * 4 * 16 * (cost.FWD_FIXED_S + 8 * 201 * cost.FWD_TOKEN_S))
    exact = cost.mc_task_seconds({**task, "exact_below": 2}, SHAPE, "llada", False, LLADA)
    assert exact == pytest.approx(10 * (cost.FWD_FIXED_S + 201 * cost.FWD_TOKEN_S))  # shared
    guided = cost.mc_task_seconds({**task, "cfg_scale": 0.5}, SHAPE, "llada", True, LLADA,
                                  "fair_calib")
    assert guided == pytest.approx(10 * 4 * 16 * (cost.FWD_FIXED_S + 16 * 201 * cost.FWD_TOKEN_S)
                                   * cost.REAL_QUANT_SCALE["llada"]["transform"])
    assert cost.quant_scale("dream", "w8a8", "fair_calib") == cost.QUANT_SCALE   # fake quant
    assert cost.quant_scale("dream", "w3a4", "rtn") == cost.REAL_QUANT_SCALE["dream"]["plain"]
    assert cost.quant_scale("dream", "w4a4", "quarot") == cost.REAL_QUANT_SCALE["dream"]["hadamard"]
    # a type without a measured structure: the family's slowest
    assert cost.quant_scale("llada", True, "qdrop") == max(cost.REAL_QUANT_SCALE["llada"].values())


def test_paper_grid_projection(repo_root):
    cfg = cost.load_config([repo_root / "config" / "paper.yaml"], repo_root / "config" / "config.yaml")
    res = cost.project(cfg)
    assert set(res["rules"]) == {"probe_shard", "calibrate", "evaluate_shard", "trajectories"}
    assert all(r["gpu_hours"] > 0 and r["jobs"] > 0 for r in res["rules"].values())
    assert res["total_gpu_hours"] == pytest.approx(sum(r["gpu_hours"] for r in res["rules"].values()),
                                                   abs=0.3)
    assert set(res["evaluate_by_task"]) == set(cfg["tables"]["main"]["tasks"])
