"""``rtn``: round-to-nearest, per-output-channel weights and per-token dynamic activations,
no transforms, no clipping, no optimisation."""
from __future__ import annotations

from torch import nn

from ..quant.qlinear import InputQuant
from ..quant.quantizers import ActQuantizer, WeightQuantizer
from .base import QuantMethod


class RTNMethod(QuantMethod):
    type_name = "rtn"

    def make_input_quant(self, group, j, stats, block, block_index):
        return InputQuant(group.in_features,
                          ActQuantizer(self.a_bits, clip_ratio=float(self.cfg.get("a_clip_ratio", 1.0))))

    def make_weight_quant(self, name, linear: nn.Linear, inq, stats):
        return WeightQuantizer(linear.out_features, self.w_bits,
                               clip_ratio=float(self.cfg.get("w_clip_ratio", 1.0)))
