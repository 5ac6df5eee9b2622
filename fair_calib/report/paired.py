"""Paired comparison of two methods over the same items and their calibration seeds.

A table cell is an accuracy averaged over a task's items and, for a stochastic method, over its
calibration seeds. Two methods are compared on the same items, so the item-to-item variation
they share cancels in their difference; what remains is

* the seeds: each method's per-seed accuracy varies from seed to seed; its mean over S seeds
  has variance ``s^2 / S`` (s: the sample standard deviation over seeds; 0 for a deterministic
  method with one run);
* the items: the tasks are samples of items, so the per-item difference of the two methods'
  seed-averaged scores, ``delta_i``, has variance ``var(delta) / N`` about its mean.

``se = sqrt(s_a^2 / S_a + s_b^2 / S_b + var(delta) / N)``. This counts the seed-by-item noise
twice (it is in both the seeds' spread and delta), so the test is slightly conservative. Over
several tasks (the Avg. column) each task weighs 1/T, its items 1/(T N_t): the seeds' term
uses the per-seed averages, the items' term sums the tasks' ``var(delta_t) / (T^2 N_t)``.

The test: ``z = diff / se``, two-sided ``p = 2 (1 - Phi(|z|))``. The minimum detectable
difference at two-sided 5 % and 80 % power: ``(z_0.975 + z_0.8) se = 2.80 se``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

Z_ALPHA = 1.959963984540054      # two-sided 5 %
Z_POWER = 0.8416212335729143     # 80 % power
ALPHA = 0.05


@dataclass(frozen=True)
class Paired:
    """``a`` minus ``b``, in percentage points, with its standard error, p and MDE."""
    diff: float
    se: float
    p: float
    mde: float
    n_items: int
    seeds_a: int
    seeds_b: int

    @property
    def significant(self) -> bool:
        return self.p < ALPHA


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def compare(a: Sequence[Sequence[np.ndarray]], b: Sequence[Sequence[np.ndarray]]) -> Paired:
    """Compare methods ``a`` and ``b`` (percentage points).

    ``a[s][t]``: seed s's per-item scores (0..1) on task t, the items in one order for both
    methods; every task weighs equally. A deterministic method passes one seed."""
    if not a or not b:
        raise ValueError("each method needs at least one run")
    n_tasks = len(a[0])
    if any(len(run) != n_tasks for run in (*a, *b)):
        raise ValueError("every run needs scores of the same tasks")
    items = [len(a[0][t]) for t in range(n_tasks)]
    for run in (*a, *b):
        if [len(x) for x in run] != items:
            raise ValueError(f"item counts differ between runs: {[len(x) for x in run]} vs {items}")
    per_seed_a = np.array([np.mean([np.mean(x) for x in run]) for run in a])
    per_seed_b = np.array([np.mean([np.mean(x) for x in run]) for run in b])
    diff = float(per_seed_a.mean() - per_seed_b.mean())
    var = 0.0
    for per_seed in (per_seed_a, per_seed_b):
        if len(per_seed) > 1:
            var += float(per_seed.var(ddof=1)) / len(per_seed)
    for t in range(n_tasks):
        delta = (np.mean([np.asarray(run[t], float) for run in a], axis=0)
                 - np.mean([np.asarray(run[t], float) for run in b], axis=0))
        if len(delta) > 1:
            var += float(delta.var(ddof=1)) / (len(delta) * n_tasks ** 2)
    se = math.sqrt(var) * 100.0
    diff *= 100.0
    p = 1.0 if se == 0.0 and diff == 0.0 else (
        0.0 if se == 0.0 else 2.0 * _normal_sf(abs(diff) / se))
    return Paired(diff, se, p, (Z_ALPHA + Z_POWER) * se, int(sum(items)), len(a), len(b))


def item_scores(eval_path: str | Path, metric: str) -> np.ndarray:
    """The per-item scores of one gathered evaluation (``results/eval/.../<task>.parquet``)
    under ``metric`` (``acc,none``), in document order; read from the evaluation's per-document
    records beside it (evaluate/run.py)."""
    from fair_calib.evaluate.run import run_per_docs

    values: dict[int, float] = {}
    for per_doc in run_per_docs(eval_path):
        for task_values in (per_doc.get("metrics", {}).get(metric) or {}).values():
            values.update({int(k): float(v) for k, v in task_values.items()})
    if not values:
        raise ValueError(f"{eval_path}: no per-item {metric!r} scores in its per-document "
                         "records (rerun the evaluation)")
    return np.array([values[k] for k in sorted(values)])


def scores_by_run(paths: Mapping[tuple[str, str, int, str], str | Path],
                  metric_of: Mapping[tuple[str, str], str]) -> dict[tuple[str, str], list[list[np.ndarray]]]:
    """``{(model, method, seed, task): eval path}`` -> ``{(model, method): [per seed: [per
    task: scores]]}``, the tasks in sorted order; ``metric_of[(model, task)]`` names each
    task's metric."""
    runs: dict[tuple[str, str], dict[int, dict[str, np.ndarray]]] = {}
    for (model, method, seed, task), path in paths.items():
        runs.setdefault((model, method), {}).setdefault(seed, {})[task] = \
            item_scores(path, metric_of[model, task])
    return {key: [[by_task[t] for t in sorted(by_task)] for _, by_task in sorted(seeds.items())]
            for key, seeds in runs.items()}
