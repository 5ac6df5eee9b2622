"""Which linear is the value projection and which group is o_proj, found by running the block.

QuaRot (per-head Hadamard on v/o, the online cross-head Hadamard) and FlatQuant (the o_proj
heads x head_dim transform folded into v_proj) need them; no family names are used: the value
projection is the one q/k/v member whose output, scaled by 2, exactly doubles the o_proj input
(attention is linear in V only).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .blockio import call_block, capture_block_inputs
from .discovery import discover_groups, get_submodule


def head_dim(config) -> int:
    for attr in ("head_dim",):
        v = getattr(config, attr, None)
        if isinstance(v, int) and v > 0:
            return v
    for h, n in (("hidden_size", "num_attention_heads"), ("d_model", "n_heads")):
        hv, nv = getattr(config, h, None), getattr(config, n, None)
        if isinstance(hv, int) and isinstance(nv, int) and nv > 0:
            return hv // nv
    raise ValueError("cannot read the attention head dimension from the model config")


def _is_rmsnorm_like(mod: nn.Module, dim: int) -> bool:
    w = getattr(mod, "weight", None)
    b = getattr(mod, "bias", None)
    return (isinstance(w, torch.Tensor) and w.dim() == 1 and w.shape[0] == dim
            and not isinstance(mod, nn.Linear) and b is None)


@torch.no_grad()
def trace_block(block: nn.Module, run) -> dict[str, Any]:
    """Groups, the module producing each group's input, and which linears are v / o."""
    producers: dict[int, tuple[torch.Tensor, str]] = {}
    handles = []
    for name, mod in block.named_modules():
        if name and not isinstance(mod, nn.Linear):
            def hook(_m, _a, out, name=name):
                if isinstance(out, torch.Tensor):
                    producers[id(out)] = (out, name)
            handles.append(mod.register_forward_hook(hook))
    group_inputs: dict[str, torch.Tensor] = {}

    def pre(_m, args, name):
        group_inputs.setdefault(name, args[0])

    linears = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}
    for n, m in linears.items():
        handles.append(m.register_forward_pre_hook(lambda mod, args, n=n: pre(mod, args, n)))
    try:
        groups = discover_groups(block, run)
    finally:
        for h in handles:
            h.remove()
    producer = []
    for g in groups:
        x = group_inputs[g.names[0]]
        rec = producers.get(id(x))
        producer.append(rec[1] if rec is not None and rec[0] is x else None)
    # value projection / o-projection: scale each q/k/v member's output by 2
    norm_fed = [j for j, p in enumerate(producer)
                if p is not None and _is_rmsnorm_like(get_submodule(block, p), groups[j].in_features)]
    internal = [j for j in range(len(groups)) if j not in norm_fed]
    v_name = o_group = None
    base_inputs: dict[str, torch.Tensor] = {}
    hk = [linears[groups[j].names[0]].register_forward_pre_hook(
        lambda m, a, j=j: base_inputs.__setitem__(groups[j].names[0], a[0].clone())) for j in internal]
    try:
        run()
    finally:
        for h in hk:
            h.remove()
    for j in norm_fed:
        if len(groups[j].names) < 2:
            continue
        for cand in groups[j].names:
            seen: dict[str, torch.Tensor] = {}
            h1 = linears[cand].register_forward_hook(lambda m, a, out: out * 2)
            hs = [linears[groups[k].names[0]].register_forward_pre_hook(
                lambda m, a, k=k: seen.__setitem__(groups[k].names[0], a[0].clone())) for k in internal]
            try:
                run()
            finally:
                h1.remove()
                for h in hs:
                    h.remove()
            for k in internal:
                key = groups[k].names[0]
                b0, b1 = base_inputs[key], seen[key]
                if b0.abs().max() > 0 and torch.allclose(b1, 2 * b0, rtol=1e-4, atol=1e-6) \
                        and not torch.allclose(b1, b0):
                    v_name, o_group = cand, k
                    break
            if v_name is not None:
                break
        if v_name is not None:
            break
    return {"groups": groups, "producer": producer, "norm_fed": norm_fed, "internal": internal,
            "v_name": v_name, "o_group": o_group}


@torch.no_grad()
def trace_model(loaded, n_tokens: int = 8, feeders: bool = False) -> dict[int, dict[str, Any]]:
    """:func:`trace_block` for every block, fed the FP model's own hidden states of a short
    probe sequence (the model is not changed); ``feeders``: each trace also gets
    ``"feeders"`` (:func:`linear_feeders`)."""
    model, blocks, embed = loaded.model, loaded.blocks, loaded.embed
    device = embed.weight.device
    ids = torch.arange(n_tokens, device=device).unsqueeze(0) % embed.weight.shape[0]
    inputs = capture_block_inputs(model, blocks[0], ids, 1, device=device,
                                  hidden_dtype=embed.weight.dtype)
    h = inputs.hidden[0]
    traces = {}
    for i, block in enumerate(blocks):
        dev = next(block.parameters()).device
        hid = h.to(dev, next(block.parameters()).dtype)
        traces[i] = trace_block(block, lambda: call_block(block, inputs, 0, hid))
        if feeders:
            traces[i]["feeders"] = linear_feeders(block, lambda: call_block(block, inputs, 0, hid),
                                                  traces[i])
        h = call_block(block, inputs, 0, hid)
    return traces


@torch.no_grad()
def linear_feeders(block: nn.Module, run, tr: dict[str, Any]) -> dict[int, str]:
    """For each group not fed by a norm, the linear (a member of a multi-linear norm-fed group)
    whose output its input is linear in, channel by channel: doubling that linear's output
    exactly doubles the group's input (v_proj -> o_proj, up_proj -> down_proj; a gate behind
    SiLU does not). Found by running the block, no names. Returns {group index: linear name}
    (groups with no such linear are absent)."""
    groups, internal = tr["groups"], tr["internal"]
    linears = {n: m for n, m in block.named_modules() if isinstance(m, nn.Linear)}

    def inputs_of(extra=None) -> dict[int, torch.Tensor]:
        seen: dict[int, torch.Tensor] = {}
        hs = [linears[groups[k].names[0]].register_forward_pre_hook(
            lambda m, a, k=k: seen.__setitem__(k, a[0].clone())) for k in internal]
        if extra is not None:
            hs.append(extra)
        try:
            run()
        finally:
            for h in hs:
                h.remove()
        return seen

    base = inputs_of()
    out: dict[int, str] = {}
    for j in tr["norm_fed"]:
        if len(groups[j].names) < 2:
            continue
        for cand in groups[j].names:
            seen = inputs_of(linears[cand].register_forward_hook(lambda m, a, o: o * 2))
            for k in internal:
                b0, b1 = base[k], seen[k]
                if k not in out and b0.abs().max() > 0 and not torch.allclose(b1, b0) \
                        and torch.allclose(b1, 2 * b0, rtol=1e-4, atol=1e-6):
                    out[k] = cand
    return out
