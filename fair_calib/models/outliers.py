"""Activation outliers by a function-preserving channel rescaling.

Released LLMs carry a few input channels of very large magnitude at their linears (the outliers
that per-token activation quantization loses everything else to; SmoothQuant, QuaRot and
FlatQuant exist because of them). Small models trained for minutes grow none, so at W4A4 every
method scores as FP and no table shows what the methods do. ``inject_outliers`` gives a trained
model such channels without changing its function: SmoothQuant's migration run backwards. At
each site, ``channels`` input channels of the quantized linear are multiplied by ``scale`` where
they are produced and the linear's weight columns of those channels divided by it:

- ``norm``: the RMSNorm weight before q/k/v (and before gate/up) times ``scale``, the columns of
  q/k/v (gate/up) over it;
- ``v_o``: rows of v_proj (and its bias) times ``scale``, the o_proj columns they feed (every
  query head of the kv group) over it (attention is linear in V);
- ``up_down``: rows of up_proj (and its bias) times ``scale``, the down_proj columns over it
  (SwiGLU is linear in up).

In exact arithmetic the logits are unchanged; in float32 they move by rounding only (tested).
The channels are drawn per layer and site from a generator seeded by ``seed``.
"""
from __future__ import annotations

import torch
from torch import nn

SITES = ("norm", "v_o", "up_down")


def _channels(width: int, count: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randperm(width, generator=gen)[:count].sort().values


def _scale_rows(linear: nn.Linear, rows: torch.Tensor, factor: float) -> None:
    linear.weight.data[rows] *= factor
    if linear.bias is not None:
        linear.bias.data[rows] *= factor


def _scale_columns(linears, cols: torch.Tensor, factor: float) -> None:
    for linear in linears:
        linear.weight.data[:, cols] *= factor


def _inject_norm(norm: nn.Module, linears, cols: torch.Tensor, scale: float) -> None:
    norm.weight.data[cols] *= scale
    _scale_columns(linears, cols, 1.0 / scale)


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


def _inject_v_o(attn: nn.Module, cfg, cols: torch.Tensor, scale: float) -> torch.Tensor:
    """``cols`` index v_proj's output (kv heads x head_dim); the o_proj columns they feed."""
    head_dim, group = _head_dim(cfg), cfg.num_attention_heads // cfg.num_key_value_heads
    kv_head, dim = cols // head_dim, cols % head_dim
    o_cols = torch.cat([(kv_head * group + g) * head_dim + dim for g in range(group)]).sort().values
    _scale_rows(attn.v_proj, cols, scale)
    _scale_columns([attn.o_proj], o_cols, 1.0 / scale)
    return o_cols


def inject_outliers(model: nn.Module, channels: int, scale: float, seed: int = 0,
                    sites: tuple[str, ...] = SITES) -> dict:
    """Rescale ``model`` (a Llama / Qwen2-style ``*ForCausalLM``) in place; returns what was
    done: per layer and site, the channels the quantized linear's input carries as outliers."""
    import math

    if not math.isfinite(scale) or scale <= 1 or channels < 1:
        raise ValueError(f"outliers: scale {scale} must be > 1 and finite, and channels {channels} >= 1")
    unknown = set(sites) - set(SITES)
    if unknown:
        raise ValueError(f"outliers.sites: {sorted(unknown)} unknown; choose from {list(SITES)}")
    cfg = model.config
    widths = {"norm": cfg.hidden_size, "v_o": cfg.num_key_value_heads * _head_dim(cfg),
              "up_down": cfg.intermediate_size}
    too_wide = {s: widths[s] for s in sites if channels > widths[s]}
    if too_wide:
        raise ValueError(f"outliers.channels = {channels} exceeds the widths {too_wide}")
    gen = torch.Generator().manual_seed(int(seed))
    record = []
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            # every site's channels drawn, used or not: a shorter site list keeps the others'
            cols = {key: _channels(widths[site], channels, gen) for key, site in
                    (("qkv_in", "norm"), ("gate_up_in", "norm"), ("v_rows", "v_o"),
                     ("down_in", "up_down"))}
            entry = {"layer": i}
            if "norm" in sites:
                _inject_norm(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj],
                             cols["qkv_in"], scale)
                _inject_norm(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj],
                             cols["gate_up_in"], scale)
                entry.update(qkv_in=cols["qkv_in"].tolist(), gate_up_in=cols["gate_up_in"].tolist())
            if "v_o" in sites:
                entry["o_in"] = _inject_v_o(attn, cfg, cols["v_rows"], scale).tolist()
            if "up_down" in sites:
                _scale_rows(mlp.up_proj, cols["down_in"], scale)
                _scale_columns([mlp.down_proj], cols["down_in"], 1.0 / scale)
                entry["down_in"] = cols["down_in"].tolist()
            record.append(entry)
    return {"channels": channels, "scale": scale, "seed": int(seed), "sites": list(sites),
            "layers": record}
