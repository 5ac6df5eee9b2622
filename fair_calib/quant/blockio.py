"""Capture the inputs of the first transformer block, generically, and call a block with them.

A forward pre-hook (with kwargs) on block 0 records the hidden states and every other positional
and keyword argument the model passes (attention mask, position embeddings, ...) and then aborts
the forward, so no family's forward is rewritten. Each calibration micro-batch keeps its own
args/kwargs; they are reused unchanged for every block (the model computes them once, before the
first block).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class _Captured(Exception):
    pass


@dataclass
class BlockInputs:
    hidden: list[torch.Tensor]                   # one [b, L, D] tensor per micro-batch
    args: list[tuple[Any, ...]] = field(default_factory=list)   # positional args without hidden
    kwargs: list[dict[str, Any]] = field(default_factory=list)
    hidden_key: int | str = 0                    # where hidden states go: positional 0 or a kwarg

    def __len__(self) -> int:
        return len(self.hidden)

    def with_hidden(self, hidden: list[torch.Tensor]) -> "BlockInputs":
        return BlockInputs(hidden, self.args, self.kwargs, self.hidden_key)


def block_output(out: Any) -> torch.Tensor:
    """The hidden-state output of a block (tensor, or the first element of a tuple)."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        return out[0]
    if hasattr(out, "hidden_states"):
        return out.hidden_states
    raise TypeError(f"cannot read hidden states from a block output of type {type(out).__name__}")


def call_block(block: nn.Module, inputs: BlockInputs, i: int,
               hidden: torch.Tensor | None = None) -> torch.Tensor:
    h = inputs.hidden[i] if hidden is None else hidden
    args = list(inputs.args[i])
    kwargs = dict(inputs.kwargs[i])
    if inputs.hidden_key == 0:
        args.insert(0, h)
    else:
        kwargs[str(inputs.hidden_key)] = h
    return block_output(block(*args, **kwargs))


@torch.no_grad()
def capture_block_inputs(model: nn.Module, block: nn.Module, input_ids: torch.Tensor,
                         batch_size: int, attention_mask: torch.Tensor | None = None,
                         device: str | torch.device | None = None,
                         hidden_dtype: torch.dtype = torch.float32) -> BlockInputs:
    """Run ``model`` on ``input_ids`` in micro-batches, recording what ``block`` receives."""
    device = device if device is not None else next(model.parameters()).device
    hidden: list[torch.Tensor] = []
    all_args: list[tuple] = []
    all_kwargs: list[dict] = []
    where: list[int | str] = []

    def hook(_mod, args, kwargs):
        if args:
            h, rest, key = args[0], tuple(args[1:]), 0
        elif "hidden_states" in kwargs:
            h, rest, key = kwargs["hidden_states"], (), "hidden_states"
            kwargs = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        else:
            raise RuntimeError("block 0 was called without hidden states (positional or "
                               "'hidden_states=')")
        hidden.append(h.detach().to(hidden_dtype))
        all_args.append(rest)
        all_kwargs.append(dict(kwargs))
        where.append(key)
        raise _Captured

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for s in range(0, input_ids.shape[0], batch_size):
            ids = input_ids[s:s + batch_size].to(device)
            kw = {}
            if attention_mask is not None:
                kw["attention_mask"] = attention_mask[s:s + batch_size].to(device)
            try:
                model(input_ids=ids, **kw)
            except _Captured:
                pass
            else:
                raise RuntimeError("the model forward never reached the given block")
    finally:
        handle.remove()
    return BlockInputs(hidden, all_args, all_kwargs, where[0] if where else 0)
