"""``flatquant``: FlatQuant-style calibration.

Per input group: learnable T = Kronecker(P1, P2) after a SmoothQuant-initialised diagonal scale
(alpha 0.3), learnable per-channel weight clipping (sigmoid, init 0.98) and learnable activation
clipping; the block's loss is the uniform hidden-state MSE. Settings (method section):
``epochs`` (15), ``lr`` (5e-3), ``batch_size``, ``propagate`` (fp|quant), ``alpha`` (0.3),
``kron`` (true), ``smooth`` (true), ``init`` (orthogonal|identity), ``w_clip`` (true),
``w_clip_init`` (0.98), ``a_clip`` (true), ``a_clip_init`` (0.98).
"""
from __future__ import annotations

import torch
from torch import nn

from ..quant.discovery import get_submodule
from ..quant.qlinear import InputQuant
from ..quant.quantizers import ActQuantizer, WeightQuantizer
from ..quant.transforms import AffineTransform
from .base import QuantMethod


class FlatQuantMethod(QuantMethod):
    type_name = "flatquant"
    trainable = True

    @property
    def weighting(self) -> str:
        return str(self.cfg.get("weighting", "uniform"))

    def make_input_quant(self, group, j, stats, block, block_index):
        c = self.cfg
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + block_index * 1009 + j)
        tr = AffineTransform(group.in_features, kron=bool(c.get("kron", True)),
                             smooth=bool(c.get("smooth", True)),
                             init=str(c.get("init", "orthogonal")), generator=gen)
        if stats is not None and tr.log_d is not None:
            w_absmax = torch.stack([get_submodule(block, n).weight.detach().abs().amax(dim=0).float().cpu()
                                    for n in group.names]).amax(dim=0)
            tr.init_smooth(w_absmax, stats.x_absmax.float().cpu(), float(c.get("alpha", 0.3)))
        act = ActQuantizer(self.a_bits, learnable_clip=bool(c.get("a_clip", True)),
                           clip_init=float(c.get("a_clip_init", 0.98)))
        return InputQuant(group.in_features, act, transform=tr)

    def make_weight_quant(self, name, linear: nn.Linear, inq, stats):
        return WeightQuantizer(linear.out_features, self.w_bits,
                               learnable_clip=bool(self.cfg.get("w_clip", True)),
                               clip_init=float(self.cfg.get("w_clip_init", 0.98)))
