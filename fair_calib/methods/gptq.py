"""``gptq``: weight-only GPTQ as AutoGPTQ computes it (the ``BaseQuantizeConfig`` that QDLM's
``AutoGPTQ/quantize.py`` builds: ``bits`` = w_bits, ``group_size`` 128, ``desc_act`` False;
AutoGPTQ's defaults ``sym`` True, ``damp_percent`` 0.01, ``true_sequential`` True,
``static_groups`` False; block size 128).

Per block, group by group in execution order (q/k/v, o, gate/up, down: AutoGPTQ's
``true_sequential``), each group's Hessian comes from the block run with the earlier groups
already quantized (activations never quantized), then each of its linears is quantized by
:func:`~fair_calib.quant.gptq.gptq_grouped`; the next block is fed the quantized block's outputs
(``propagate: quant``, as AutoGPTQ's ``layer_inputs, layer_outputs`` swap). Settings:
``group_size`` (128; -1: one group per row), ``sym`` (True), ``act_order`` (False: QDLM's
``desc_act``), ``damp`` (0.01), ``arithmetic``: ``authors`` (the default: AutoGPTQ's float32
running-mean Hessian fed one sequence at a time, float32 sweep, its damping order) or
``precise`` (H = sum x x^T and the sweep in float64, the sweep QuaRot's GPTQ runs); see
``fair_calib.quant.gptq``.
"""
from __future__ import annotations

import torch

from ..quant.discovery import get_submodule
from ..quant.gptq import autogptq_hessian, group_hessian, gptq_grouped
from .weight_only import GroupCodesMethod, require_weight_only


class GPTQMethod(GroupCodesMethod):
    type_name = "gptq"

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        require_weight_only(self)

    def training_settings(self):
        s = super().training_settings()
        s["propagate"] = str(self.cfg.get("propagate", "quant"))
        return s

    def make_input_quant(self, group, j, stats, block, block_index):
        return None

    @torch.no_grad()
    def fit_block(self, block, groups, inputs, block_index, run) -> None:
        if not (0 < self.w_bits < 16):
            return
        authors = self.arithmetic == "authors"
        for g in groups:
            H = (autogptq_hessian if authors else group_hessian)(block, g, len(inputs), run)
            for n in g.names:
                ql = get_submodule(block, n)
                w = ql.linear.weight.float() if authors else ql.linear.weight.double()
                gc = gptq_grouped(w, H, self.w_bits,
                                  group_size=self.group_size, sym=bool(self.cfg.get("sym", True)),
                                  act_order=bool(self.cfg.get("act_order", False)),
                                  damp=float(self.cfg.get("damp", 0.01)),
                                  arithmetic=self.arithmetic)
                self.set_codes(ql, gc)
