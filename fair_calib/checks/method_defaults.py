"""Every method type's defaults, as its module reads them (``self.cfg.get(key, default)``),
importable without torch: a job's settings hold a method's resolved values
(``resolved_method``; a tiny model's ``train`` entry likewise, ``resolved_train``), so writing a
documented default explicitly (``alpha: 0.3``, ``arithmetic: authors``, ``steps: 1500``) gives
the same settings and reruns nothing.
``tests/checks/test_method_defaults.py`` reads the defaults out of each method class and checks
they equal these; a method type that reads a new default adds it here."""
from __future__ import annotations

from typing import Any, Mapping

_EXPORT = {"export": True, "keep_export": False}
_FLATQUANT = {"a_clip": True, "alpha": 0.3, "clip_init_logit": 4.0, "clip_lr_mult": 10.0,
              "epochs": 15, "eta_min_ratio": 0.001, "init": "orthogonal", "kron": True,
              "lr": 0.005, "normalize_loss": True, "o_trans": "heads", "shuffle": False,
              "smooth": True, "w_clip": True, "weight_decay": 0.01, **_EXPORT}
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "fp": {},
    "rtn": {"a_clip_ratio": 1.0, "w_clip_ratio": 1.0, **_EXPORT},
    "quarot": {"a_clip_ratio": 1.0, "damp": 0.01, "online_hadamard": True, "propagate": "quant",
               "w_clip": True, **_EXPORT},
    "flatquant": {**_FLATQUANT, "propagate": "fp", "weighting": "uniform"},
    "fair_calib": {**_FLATQUANT, "propagate": "teacher", "weighting": "prior"},
    "qdrop": {"drop_prob": 0.5, "epochs": 15, "lr": 0.001, "propagate": "quant", "shuffle": True,
              "weight_decay": 0.0, "weighting": "uniform", **_EXPORT},
    "gptq": {"act_order": False, "arithmetic": "authors", "damp": 0.01, "group_size": 128,
             "propagate": "quant", "sym": True, **_EXPORT},
    "awq": {"arithmetic": "authors", "group_size": 128, "propagate": "fp", **_EXPORT},
    "smoothquant": {"alpha": 0.5, "arithmetic": "authors", "propagate": "fp", **_EXPORT},
    "duquant": {"alpha": 0.5, "arithmetic": "authors", "block_size": 128, "lac": 0.9,
                "max_rotation_step": 256, "propagate": "fp", "swc": 0.8, **_EXPORT},
    "tmas": {**_FLATQUANT, "propagate": "fp", "weighting": "uniform", "decoding": {},
             "prompt_ratio": 0.25, "stage_proportions": [0.3, 0.2, 0.2, 0.3]},
    "mcs": {**_FLATQUANT, "propagate": "fp", "weighting": "uniform", "prefix_ratio": 0.25,
            "timesteps": 4},
}


def same_value(a: Any, b: Any) -> bool:
    """Equal as the method reads them (``0.3`` and ``.3``, ``128`` and ``128.0``), not
    ``True`` and ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def resolved_method(entry: Mapping[str, Any]) -> dict[str, Any]:
    """``entry`` (a ``methods:`` entry) with its type's defaults filled in: the values its job
    runs with. A written value equal to its default is stored as the default (``.3`` as
    ``0.3``, ``128.0`` as ``128``), so it yields the same settings."""
    import copy

    defaults = copy.deepcopy(METHOD_DEFAULTS.get(entry.get("type"), {}))
    out = {**defaults, **entry}
    for key, value in defaults.items():
        if same_value(out[key], value):
            out[key] = value
    return out


def resolved_train(train: Mapping[str, Any] | None) -> dict[str, Any]:
    """A tiny model's ``train`` entry with the trainer's defaults filled in
    (``fair_calib.models.tiny.defaults.DEFAULT_TRAIN``, which the trainer reads the same way)."""
    from fair_calib.models.tiny.defaults import DEFAULT_TRAIN

    out = {**DEFAULT_TRAIN, **(train or {})}
    return {k: DEFAULT_TRAIN[k] if k in DEFAULT_TRAIN and same_value(v, DEFAULT_TRAIN[k]) else v
            for k, v in out.items()}
