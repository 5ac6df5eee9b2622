"""Find the linears of one transformer block and group those that read the same input.

No family-specific names: the block is run once with a forward pre-hook on every ``nn.Linear``;
linears whose input is the very same tensor object form one group (q/k/v; gate/up), the others
are alone (o-proj; down-proj). Groups are listed in execution order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn


@dataclass(frozen=True)
class LinearGroup:
    names: tuple[str, ...]   # dotted module names relative to the block, execution order
    in_features: int

    def to_json(self) -> dict[str, Any]:
        return {"names": list(self.names), "in_features": self.in_features}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LinearGroup":
        return cls(names=tuple(d["names"]), in_features=int(d["in_features"]))


def linear_modules(block: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}


@torch.no_grad()
def discover_groups(block: nn.Module, run: Callable[[], Any]) -> list[LinearGroup]:
    """Call ``run()`` (which must run ``block`` forward once) and group its linears by input.

    Linears never called are left out (they are not part of the block's computation)."""
    linears = linear_modules(block)
    if not linears:
        raise ValueError(f"{type(block).__name__} contains no nn.Linear")
    seen: list[tuple[torch.Tensor, list[str]]] = []   # (input tensor, names); strong refs
    handles = []

    def make_hook(name: str):
        def hook(_mod, args):
            x = args[0]
            for t, names in seen:
                if t is x:
                    if name not in names:
                        names.append(name)
                    return None
            seen.append((x, [name]))
            return None
        return hook

    try:
        for name, mod in linears.items():
            handles.append(mod.register_forward_pre_hook(make_hook(name)))
        run()
    finally:
        for h in handles:
            h.remove()
    groups = [LinearGroup(tuple(names), int(linears[names[0]].in_features)) for _, names in seen]
    seen.clear()
    return groups


def groups_to_json(groups: list[LinearGroup]) -> list[dict[str, Any]]:
    return [g.to_json() for g in groups]


def groups_from_json(items: list[dict[str, Any]]) -> list[LinearGroup]:
    return [LinearGroup.from_json(d) for d in items]


def get_submodule(root: nn.Module, dotted: str) -> nn.Module:
    return root.get_submodule(dotted)


def set_submodule(root: nn.Module, dotted: str, new: nn.Module) -> None:
    parent_name, _, child = dotted.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, child, new)
