"""Per-family and per-model task settings (torch-free: the Snakefile reads it).

A task entry of the config holds the settings every model uses, and may override them:

    tasks:
      arc_challenge:
        {kind: lm_eval, lm_eval_task: arc_challenge, num_fewshot: 0, mc_num: 128,
         by_family: {llada: {cfg_scale: 0.5, batch_size: 8}, dream: {batch_size: 32}},
         by_model: {llada-8b-instruct: {...}}}

The resolved settings of (task, model) are the entry, then ``by_family[<model's family>]``,
then ``by_model[<model>]``; the model authors' scripts differ per family and per task, and
instruct models have their own setups.
"""
from __future__ import annotations

from typing import Any, Mapping

OVERRIDE_KEYS = ("by_family", "by_model")
FIXED_KEYS = ("kind", "label")      # what a table column is; never differs per model


def resolve_task(name: str, entry: Mapping[str, Any], model: str, family: str,
                 by_model: bool = True) -> dict[str, Any]:
    """The settings task ``name`` runs with on ``model`` (of ``family``). ``by_model=False``
    (the config's ``instruct_recipes: false``) leaves the per-model entries out: every model
    runs its family's settings, the Instruct models those of their Base model."""
    out = {k: v for k, v in entry.items() if k not in OVERRIDE_KEYS}
    out.update(entry.get("by_family", {}).get(family, {}))
    if by_model:
        out.update(entry.get("by_model", {}).get(model, {}))
    return {"name": name, **out}


def use_by_model(cfg: Mapping[str, Any]) -> bool:
    """The config's ``instruct_recipes`` (default true: per-model entries apply)."""
    return bool(cfg.get("instruct_recipes", True))


def check_task_overrides(cfg: Mapping[str, Any], families: Any) -> None:
    """Every override names a known family / model and no fixed key; errors name the key."""
    for name, entry in cfg["tasks"].items():
        for section, valid in (("by_family", families), ("by_model", cfg["models"])):
            for key, over in entry.get(section, {}).items():
                if key not in valid:
                    raise ValueError(f"config: tasks.{name}.{section}.{key} is not valid; choose "
                                     f"one of {sorted(valid)}")
                bad = sorted(set(over) & set(FIXED_KEYS + OVERRIDE_KEYS))
                if bad:
                    raise ValueError(f"config: tasks.{name}.{section}.{key} may not set {bad}")
