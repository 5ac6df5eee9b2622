"""``flatquant``: FlatQuant (Sun et al.) as ruikangliu/FlatQuant computes it.

Per input group a learnable transform T = Kronecker(P1, P2), after a SmoothQuant-initialised
diagonal scale (alpha 0.3) on the q/k/v, gate/up and down inputs; on the o_proj input
(``o_trans: heads``, the reference's ``o_trans`` + ``vcache_trans``) a heads x head_dim transform
without diagonal scale whose head_dim factor is folded into v_proj (applied to v_proj's rows
after its weight clipping), so only the heads factor runs online. Every linear has its own
learnable weight clipping (LWC: two logits per output row) and its own learnable activation
clipping (LAC: two logits), all initialised at 4 (``flat_linear.py``, ``quant_utils.py``). The
block's loss is the uniform hidden-state MSE, divided by its detached value, optimised by AdamW
in FlatQuant's parameter groups (``train_utils.py``): transform factors and diagonal scales at
``lr``, clip logits at ``clip_lr_mult`` x ``lr``, weight decay 0.01, cosine schedule to
``lr * eta_min_ratio``, micro-batches in order.

Settings (method section; defaults are the reference's W4A4 script): ``epochs`` (15), ``lr``
(5e-3), ``batch_size``, ``propagate`` (fp), ``alpha`` (0.3), ``kron`` (true), ``smooth`` (true),
``init`` (orthogonal|identity), ``w_clip`` (true), ``a_clip`` (true), ``clip_init_logit`` (4.0),
``o_trans`` (heads | kron: the closest-factor transform with diagonal scale, not folded),
``weight_decay`` (0.01), ``clip_lr_mult`` (10), ``eta_min_ratio`` (1e-3), ``normalize_loss``
(true), ``shuffle`` (false).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..quant.discovery import get_submodule
from ..quant.qlinear import InputQuant, QuantLinear
from ..quant.quantizers import CLIP_INIT_LOGIT, ActQuantizer, WeightQuantizer
from ..quant.transforms import AffineTransform, InvertibleFactor
from .base import QuantMethod

O_TRANS = ("heads", "kron")


class FlatQuantMethod(QuantMethod):
    type_name = "flatquant"
    trainable = True

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        if self.o_trans not in O_TRANS:
            raise ValueError(f"o_trans must be one of {O_TRANS}, got {self.o_trans!r}")
        self._attn: dict[int, tuple[str | None, str | None, int]] = {}

    @property
    def weighting(self) -> str:
        return str(self.cfg.get("weighting", "uniform"))

    @property
    def o_trans(self) -> str:
        return str(self.cfg.get("o_trans", "heads"))

    def training_settings(self) -> dict[str, Any]:
        c = self.cfg
        s = super().training_settings()
        s.update(weight_decay=float(c.get("weight_decay", 0.01)),
                 clip_lr_mult=float(c.get("clip_lr_mult", 10.0)),
                 eta_min_ratio=float(c.get("eta_min_ratio", 1e-3)),
                 normalize_loss=bool(c.get("normalize_loss", True)),
                 shuffle=bool(c.get("shuffle", False)))
        return s

    # ---------------------------------------------------------------- model preparation
    @torch.no_grad()
    def prepare_model(self, loaded) -> None:
        """Find every block's value projection and o_proj (for the heads transform)."""
        if self.o_trans != "heads" or not self.quantizes:
            return
        from ..quant.trace import head_dim, trace_model

        hd = head_dim(loaded.model.config)
        for i, tr in trace_model(loaded).items():
            o_name = (tr["groups"][tr["o_group"]].names[0] if tr["o_group"] is not None else None)
            self._attn[i] = (tr["v_name"], o_name, hd)

    # ---------------------------------------------------------------- block quantization
    def _is_o_input(self, group, block_index: int) -> bool:
        v, o, _ = self._attn.get(block_index, (None, None, 0))
        return self.o_trans == "heads" and o is not None and group.names[0] == o

    def make_input_quant(self, group, j, stats, block, block_index):
        c = self.cfg
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + block_index * 1009 + j)
        if self._is_o_input(group, block_index):
            hd = self._attn[block_index][2]
            tr = AffineTransform(group.in_features, kron=True, smooth=False,
                                 init=str(c.get("init", "orthogonal")), generator=gen,
                                 factors=(group.in_features // hd, hd), right_online=False)
        else:
            tr = AffineTransform(group.in_features, kron=bool(c.get("kron", True)),
                                 smooth=bool(c.get("smooth", True)),
                                 init=str(c.get("init", "orthogonal")), generator=gen)
            if stats is not None and tr.diag_scale is not None:
                w_absmax = torch.stack([get_submodule(block, n).weight.detach().abs().amax(dim=0).float().cpu()
                                        for n in group.names]).amax(dim=0)
                tr.init_smooth(w_absmax, stats.x_absmax.float().cpu(), float(c.get("alpha", 0.3)))
        acts = [ActQuantizer(self.a_bits, learnable_clip=bool(c.get("a_clip", True)),
                             clip_init_logit=float(c.get("clip_init_logit", CLIP_INIT_LOGIT)))
                for _ in group.names]
        return InputQuant(group.in_features, acts, transform=tr)

    def make_weight_quant(self, name, linear: nn.Linear, inq, stats):
        return WeightQuantizer(linear.out_features, self.w_bits,
                               learnable_clip=bool(self.cfg.get("w_clip", True)),
                               clip_init_logit=float(self.cfg.get("clip_init_logit", CLIP_INIT_LOGIT)))

    def quantize_block(self, block, groups, stats, block_index) -> None:
        super().quantize_block(block, groups, stats, block_index)
        v, o, _ = self._attn.get(block_index, (None, None, 0))
        if self.o_trans == "heads" and v is not None and o is not None:
            vq, oq = get_submodule(block, v), get_submodule(block, o)
            if isinstance(vq, QuantLinear) and isinstance(oq, QuantLinear):
                vq._out_transform = (oq.inq.transform,)

    # ---------------------------------------------------------------- optimiser
    def param_groups(self, block: nn.Module, lr: float) -> list[dict[str, Any]]:
        """FlatQuant's AdamW groups: transform factors, diagonal scales, weight clips and
        activation clips (the clips at ``clip_lr_mult`` x lr); empty groups dropped."""
        mult = float(self.cfg.get("clip_lr_mult", 10.0))
        factors, diags, wclips, aclips = [], [], [], []
        for m in block.modules():
            if isinstance(m, InvertibleFactor):
                factors += [m.a, m.b, m.diag]
            elif isinstance(m, AffineTransform) and m.diag_scale is not None:
                diags.append(m.diag_scale)
            elif isinstance(m, WeightQuantizer) and m.learnable_clip:
                wclips += [m.clip_max, m.clip_min]
            elif isinstance(m, ActQuantizer) and m.learnable_clip:
                aclips += [m.clip_max, m.clip_min]
        groups = [(factors, lr), (diags, lr), (wclips, lr * mult), (aclips, lr * mult)]
        seen: set[int] = set()
        out = []
        for params, glr in groups:
            uniq = [p for p in params if p.requires_grad and id(p) not in seen and not seen.add(id(p))]
            if uniq:
                out.append({"params": uniq, "lr": glr})
        return out
