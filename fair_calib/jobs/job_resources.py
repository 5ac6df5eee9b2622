"""Per-rule job resources from the config's ``resources:`` table (Snakemake's resource names,
which the SLURM executor plugin turns into sbatch options).

``resources.<rule>`` (falling back key by key to ``resources.default``):

* ``mem_mb`` + ``mem_mb_per_attempt`` * (attempt - 1): host memory grows on each retry;
* ``runtime`` (minutes), ``threads``;
* passed through: ``gpu``, ``gpu_model``, ``gres``, ``cpus_per_gpu``, ``constraint``, ``qos``,
  ``slurm_partition``, ``slurm_account``, ``slurm_extra``.

``gpu_model``, ``gres``, ``constraint``, ``qos``, ``slurm_partition`` and ``slurm_extra`` may be
lists: one value per attempt, the last repeated, so a retry can
move a job to a bigger GPU (``gpu_model: [a100, h100]``, ``constraint: [gpu40g, gpu80g]``,
``gres: ["gpu:a100:1", "gpu:a100_80g:1"]``) or another partition. GPU memory itself is not a
SLURM option: clusters expose it as a GPU type (``gpu_model`` / ``gres``) or a node feature
(``constraint``); docs/cluster.md has the three forms. No heavy imports (read while planning).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

PASS_THROUGH = ("gpu", "gpu_model", "gres", "cpus_per_gpu", "constraint", "qos",
                "slurm_partition", "slurm_account", "slurm_extra")


def setting(table: Mapping[str, Any], rule: str, key: str, default: Any = None) -> Any:
    """``resources.<rule>.<key>``, else ``resources.default.<key>``, else ``default``."""
    own = table.get(rule) or {}
    return own[key] if key in own else (table.get("default") or {}).get(key, default)


def per_attempt(values: Sequence[Any]) -> Callable[..., Any]:
    """A Snakemake resource callable: the value of this attempt (1-based), the last repeated."""
    values = list(values)

    def pick(wildcards, attempt):
        return values[min(attempt, len(values)) - 1]

    return pick


def rule_resources(table: Mapping[str, Any], rule: str) -> dict[str, Any]:
    """The ``resources:`` of one rule, for ``resources: **rule_resources(config["resources"],
    rule)``; memory and list values are callables of ``attempt``."""
    base = setting(table, rule, "mem_mb", 2000)
    step = setting(table, rule, "mem_mb_per_attempt", 0)
    res: dict[str, Any] = {
        "mem_mb": lambda wildcards, attempt: base + step * (attempt - 1),
        "runtime": setting(table, rule, "runtime", 30),
    }
    for key in PASS_THROUGH:
        val = setting(table, rule, key)
        if isinstance(val, (list, tuple)):     # one per attempt (the schema allows it for
            # gpu_model, gres, constraint, qos, slurm_partition, slurm_extra)
            res[key] = per_attempt(val)
        elif val is not None:
            res[key] = val
    return res


def at_attempt(resources: Mapping[str, Any], attempt: int) -> dict[str, Any]:
    """The values a job's resources take at ``attempt`` (what the executor submits)."""
    return {k: v(None, attempt) if callable(v) else v for k, v in resources.items()}
