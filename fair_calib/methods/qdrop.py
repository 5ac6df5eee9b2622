"""``qdrop``: QDrop-style calibration (paper appendix "Extension to QDrop-Style Calibration").

No transforms: the quantization parameters themselves are learned, LSQ-style. Weights: one
learnable scale per output channel (init max|w| / qmax). Activations: one learnable static scale
per layer input (init: mean over calibration tokens of the per-token max / qmax). During
calibration each activation element is replaced by its FP value with probability ``drop_prob``
(0.5; QDrop's activation drop); evaluation always quantizes. The loss is the uniform or the
position-weighted hidden MSE (``weighting: uniform|prior``). Settings: ``epochs``, ``lr``
(default 1e-3 here, since scales are learned directly), ``batch_size``, ``propagate`` (default
``quant``: QDrop reconstructs on the quantized model's own inputs), ``drop_prob``, ``weighting``.
"""
from __future__ import annotations

import torch
from torch import nn

from ..quant.qlinear import InputQuant
from ..quant.quantizers import ActQuantizer, WeightQuantizer
from .base import QuantMethod


class QDropMethod(QuantMethod):
    type_name = "qdrop"
    trainable = True

    def training_settings(self):
        s = super().training_settings()
        s["lr"] = float(self.cfg.get("lr", 1e-3))
        s["propagate"] = str(self.cfg.get("propagate", "quant"))
        return s

    def make_input_quant(self, group, j, stats, block, block_index):
        act = ActQuantizer(self.a_bits, learnable_scale=True)
        if stats is not None and act.scale is not None:
            with torch.no_grad():
                act.scale.fill_(max(stats.tok_absmax_mean / (2 ** (self.a_bits - 1) - 1), 1e-8))
        return InputQuant(group.in_features, act, act_drop=float(self.cfg.get("drop_prob", 0.5)))

    def make_weight_quant(self, name, linear: nn.Linear, inq, stats):
        wq = WeightQuantizer(linear.out_features, self.w_bits, learnable_scale=True)
        if stats is not None:
            wq.init_scale(linear.weight.detach().float().cpu())
        return wq
