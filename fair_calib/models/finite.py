"""Non-finite weights refused in one line: no stage writes a checkpoint holding inf or NaN
values (a conversion with ``outliers.scale: .inf``, a training run that diverged), nor loads
one (a file edited by hand), nor scores with log-likelihoods that are not finite."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import torch


class NonFiniteError(ValueError):
    """Weights or scores holding inf or NaN."""


def nonfinite_summary(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """``"976 inf and 64 NaN values in 4 tensors (first: <name>)"``, or None where every
    floating-point value is finite."""
    n_inf = n_nan = n_tensors = 0
    first = None
    for name, t in named:
        if not torch.is_floating_point(t):
            continue
        bad = ~torch.isfinite(t)
        if not bool(bad.any()):
            continue
        nan = int(torch.isnan(t).sum())
        n_nan += nan
        n_inf += int(bad.sum()) - nan
        n_tensors += 1
        first = first or name
    if not n_tensors:
        return None
    return (f"{n_inf} inf and {n_nan} NaN values in {n_tensors} tensor"
            f"{'s' if n_tensors > 1 else ''} (first: {first})")


def check_finite_weights(model: torch.nn.Module, what: str, hint: str) -> None:
    """Refuse ``model`` when a parameter or buffer holds inf or NaN: one line naming ``what``
    (the folder written or read), how many values and the first tensor, and ``hint``."""
    found = nonfinite_summary(list(model.named_parameters()) + list(model.named_buffers()))
    if found:
        raise NonFiniteError(f"{what}: the weights hold {found}; {hint}")


def check_finite_scores(values: Sequence[float], what: str) -> None:
    """Refuse log-likelihoods that are not finite (the model's logits overflowed)."""
    bad = [i for i, v in enumerate(values) if not math.isfinite(float(v))]
    if bad:
        raise NonFiniteError(
            f"{what}: {len(bad)} of {len(values)} log-likelihoods are not finite (first: "
            f"request {bad[0]}, {values[bad[0]]}); the model's weights or activations overflow "
            "(inf/NaN): check the checkpoint (e.g. an outliers scale too large for its dtype)")
