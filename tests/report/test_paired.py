"""The paired test of the bench's tables (report/paired.py), against its formula computed here
by hand, and on the tables (report/tables.py, ``significance: paired``)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fair_calib.report.paired import compare


def _by_hand(a, b):
    """se^2 = s_a^2/S_a + s_b^2/S_b + var(delta)/N, one task, percentage points."""
    acc_a = [sum(x) / len(x) for x in a]
    acc_b = [sum(x) / len(x) for x in b]

    def svar(v):
        m = sum(v) / len(v)
        return sum((x - m) ** 2 for x in v) / (len(v) - 1) if len(v) > 1 else 0.0
    n = len(a[0])
    delta = [sum(r[i] for r in a) / len(a) - sum(r[i] for r in b) / len(b) for i in range(n)]
    var = svar(acc_a) / len(a) + svar(acc_b) / len(b) + svar(delta) / n
    diff = sum(acc_a) / len(a) - sum(acc_b) / len(b)
    se = math.sqrt(var)
    z = abs(diff) / se
    p = 2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2))))
    return 100 * diff, 100 * se, p, 100 * se * (1.959964 + 0.841621)


def test_one_task_matches_the_formula():
    rng = np.random.default_rng(0)
    a = [list(rng.integers(0, 2, 50).astype(float)) for _ in range(5)]
    b = [list(rng.integers(0, 2, 50).astype(float)) for _ in range(3)]
    got = compare([[np.array(x)] for x in a], [[np.array(x)] for x in b])
    diff, se, p, mde = _by_hand(a, b)
    assert got.diff == pytest.approx(diff, abs=1e-9)
    assert got.se == pytest.approx(se, abs=1e-9)
    assert got.p == pytest.approx(p, abs=1e-9)
    assert got.mde == pytest.approx(mde, abs=1e-4)
    assert (got.n_items, got.seeds_a, got.seeds_b) == (50, 5, 3)


def test_pairing_cancels_what_the_items_share_and_seeds_add_their_spread():
    """Two deterministic runs that differ on 2 of 1,000 items: the items' term alone; the
    same difference with seeds that spread is detected less surely."""
    base = np.zeros(1000)
    base[:500] = 1
    other = base.copy()
    other[500:502] = 1                        # +0.2 points
    tight = compare([[other]], [[base]])
    assert tight.diff == pytest.approx(0.2)
    assert tight.se == pytest.approx(100 * math.sqrt(np.var(other - base, ddof=1) / 1000))
    spread = [other.copy() for _ in range(3)]
    spread[0][600:620] = 1                    # one seed 2 points higher
    loose = compare([[x] for x in spread], [[base]])
    assert loose.se > tight.se


def test_the_average_weighs_tasks_equally():
    """Two tasks of 10 and 1,000 items: the Avg. difference is the mean of the tasks' own."""
    rng = np.random.default_rng(1)
    a = [[rng.integers(0, 2, 10).astype(float), rng.integers(0, 2, 1000).astype(float)]
         for _ in range(2)]
    b = [[rng.integers(0, 2, 10).astype(float), rng.integers(0, 2, 1000).astype(float)]
         for _ in range(2)]
    both = compare(a, b)
    t0 = compare([[r[0]] for r in a], [[r[0]] for r in b])
    t1 = compare([[r[1]] for r in a], [[r[1]] for r in b])
    assert both.diff == pytest.approx((t0.diff + t1.diff) / 2)
    per_seed = lambda runs: [np.mean([x.mean() for x in r]) for r in runs]  # noqa: E731
    seeds = np.var(per_seed(a), ddof=1) / 2 + np.var(per_seed(b), ddof=1) / 2
    items = sum(np.var(np.mean([r[t] for r in a], 0) - np.mean([r[t] for r in b], 0), ddof=1)
                / (len(a[0][t]) * 4) for t in range(2))
    assert both.se == pytest.approx(100 * math.sqrt(seeds + items))


def test_runs_of_other_items_are_refused():
    with pytest.raises(ValueError, match="item counts differ"):
        compare([[np.zeros(3)]], [[np.zeros(4)]])


def _write_run(tmp_path, method: str, seed: int | None, scores: np.ndarray, task: str = "t1"):
    """An evaluation as the workflow writes it: the Parquet row and its per-document records."""
    import pandas as pd
    import pyarrow as pa

    from fair_calib.jobs.io import write_json, write_parquet

    name = method if seed is None else f"{method}@s{seed}"
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    p = d / f"{task}.parquet"
    schema = pa.schema([("model", pa.string()), ("method", pa.string()), ("bits", pa.string()),
                        ("task", pa.string()), ("metric", pa.string()),
                        ("value", pa.float64()), ("stderr", pa.float64()), ("n", pa.int64())])
    row = pd.DataFrame([{"model": "m", "method": name, "bits": "w4a4", "task": task,
                         "metric": "acc,none", "value": float(scores.mean()),
                         "stderr": float(scores.std(ddof=1) / len(scores) ** 0.5),
                         "n": len(scores)}])
    write_parquet(row, p, schema)
    write_json(p.with_suffix(".json"), {"per_doc": {"metrics": {"acc,none": {
        task: {str(i): float(v) for i, v in enumerate(scores)}}}}})
    return p


def test_a_paired_table_marks_what_the_pairing_supports(tmp_path):
    """Two methods 1.5 points apart on the same 2,000 items, seeds 0.3 apart: the unpaired rule
    (1.96 x the combined seed spread) and a paired test over items and seeds agree here; a
    method below the reference by the same margin gets the down arrow; the note states the MDE."""
    from fair_calib.report import tables as T

    rng = np.random.default_rng(0)
    base = (rng.random(2000) < 0.7).astype(float)
    paths = []
    for s in range(5):
        ref = base.copy()
        ref[rng.choice(2000, 4, replace=False)] = 1 - ref[rng.choice(2000, 4, replace=False)]
        up = ref.copy()
        up[np.flatnonzero(ref == 0)[:30]] = 1           # +1.5 points on the same items
        down = ref.copy()
        down[np.flatnonzero(ref == 1)[:30]] = 0
        paths += [_write_run(tmp_path, "ref", s, ref), _write_run(tmp_path, "up", s, up),
                  _write_run(tmp_path, "down", s, down)]
    ev = T.load_inputs(paths)["eval"]
    labels = {"models": {"m": {"label": "M"}}, "tasks": {"t1": {"label": "T1"}},
              "methods": {"ref": {"label": "Ref"}, "up": {"label": "Up"},
                          "down": {"label": "Down"}}}
    records = []
    tex = T.main_table(ev, ["m"], ["ref", "up", "down"], ["t1"], labels, bits="w4a4",
                       env=None, records=records, significance="paired", reference="ref")
    cells = T.cells_frame(records).set_index("method")
    assert cells.loc["up", "bold"] and not cells.loc["ref", "bold"]
    assert cells.loc["up", "diff_ref"] == pytest.approx(1.5)
    assert cells.loc["up", "p_ref"] < 0.05 and cells.loc["down", "p_ref"] < 0.05
    assert np.isnan(cells.loc["ref", "p_ref"])
    assert "$^{\\uparrow}$" in tex and "$^{\\downarrow}$" in tex
    assert "is detected with 80" in tex
    with pytest.raises(ValueError, match="reference 'nope'"):
        T.main_table(ev, ["m"], ["ref", "up"], ["t1"], labels, bits="w4a4", env=None,
                     significance="paired", reference="nope")


def test_a_paired_tables_keys_are_checked_before_any_job():
    """`reference` names one of the table's methods; `significance`/`reference` only on main
    tables; an unknown significance is a schema error naming the key."""
    import copy
    from pathlib import Path

    from fair_calib.checks import config as C
    from fair_calib.checks.references import ConfigError, check_config

    repo = Path(__file__).parents[2]
    base = C.load_yaml(repo / "config/config.yaml")

    def with_table(**keys):
        cfg = copy.deepcopy(base)
        cfg["tables"]["main"].update(keys)
        return cfg

    check_config(C.validate_config(with_table(significance="paired", reference="rtn")))
    with pytest.raises(ConfigError, match="tables.main.reference = 'nope'"):
        check_config(C.validate_config(with_table(significance="paired", reference="nope")))
    cfg = copy.deepcopy(base)
    cfg["tables"]["calib_memory"]["significance"] = "paired"
    with pytest.raises(ConfigError, match="tables.calib_memory.significance: only main tables"):
        check_config(C.validate_config(cfg))
    with pytest.raises(Exception, match="significance"):
        C.validate_config(with_table(significance="bonferroni"))
