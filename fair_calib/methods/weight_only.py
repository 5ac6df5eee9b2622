"""What the group-wise baselines (``gptq``, ``awq``, ``smoothquant``) share: every linear's
weight ends up as integer codes with per-(row, group) scales and zero points
(:class:`~fair_calib.quant.groupwise.GroupCodes`), held by its ``QuantLinear`` as the already
quantized weight (``w_quant``) and saved as ``{linear}.codes/.scale/.zero/.g_idx``; norm
weights a method rescales (AWQ's and SmoothQuant's folded scales) are saved as
``norm.{module}.weight``, and the biases of the linears whose rows they divide (v_proj's, where
o_proj's scale folds into it) as ``bias.{linear}``. Not registered itself.
"""
from __future__ import annotations

import torch
from torch import nn

from ..quant.discovery import get_submodule
from ..quant.groupwise import GroupCodes
from ..quant.qlinear import QuantLinear
from ..quant.quantizers import WeightQuantizer, is_quantized
from ..names.registry import check_arithmetic
from .base import QuantMethod

NORM_PREFIX = "norm."
BIAS_PREFIX = "bias."


class GroupCodesMethod(QuantMethod):
    """Base of the methods whose weights are :class:`GroupCodes`."""

    # their weights are not on the symmetric per-row grid the integer GEMMs of
    # fair_calib.quant.lowbit read: evaluation keeps fake quantization
    integer_gemm = False

    def make_weight_quant(self, name, linear: nn.Linear, inq, stats):
        # identity until fit_block sets the codes (w_quant replaces Q_W(W))
        return WeightQuantizer(linear.out_features, 16)

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        # ``authors`` (default): the authors' own arithmetic, dtype and order included;
        # ``precise``: the project's higher-precision variant (each method's docstring).
        # Recorded in the settings: the resume key and meta.json's method_settings name it, so
        # a reload computes as the calibration did whatever the default.
        self.arithmetic = check_arithmetic(str(self.cfg.get("arithmetic", "authors")),
                                           self.type_name)
        self.cfg["arithmetic"] = self.arithmetic

    @property
    def group_size(self) -> int:
        g = int(self.cfg.get("group_size", 128))
        if g == 0 or g < -1:
            raise ValueError(f"{self.type_name}: group_size must be positive or -1 (one group per "
                             f"row), got {g}")
        return g

    @staticmethod
    def set_codes(ql: QuantLinear, gc: GroupCodes) -> None:
        ql._groups = gc
        ql.w_quant = gc.dequantize().to(ql.linear.weight.device)

    def extra_linear_state(self, name, ql):
        gc = getattr(ql, "_groups", None)
        return {} if gc is None else gc.state(name)

    def load_extra_linear_state(self, name, ql, state):
        if f"{name}.codes" in state:
            self.set_codes(ql, GroupCodes.from_state(state, name, self.w_bits))

    # --- norm weights changed by the method ------------------------------------------------
    def block_state(self, block, groups):
        out = super().block_state(block, groups)
        for n in getattr(block, "_scaled_norms", ()):
            out[f"{NORM_PREFIX}{n}.weight"] = get_submodule(block, n).weight.detach().float().cpu()
        for n in getattr(block, "_scaled_biases", ()):
            out[f"{BIAS_PREFIX}{n}"] = get_submodule(block, n).linear.bias.detach().float().cpu()
        return out

    @torch.no_grad()
    def load_block_state(self, block, groups, state):
        norms = {k: v for k, v in state.items() if k.startswith(NORM_PREFIX)}
        biases = {k: v for k, v in state.items() if k.startswith(BIAS_PREFIX)}
        super().load_block_state(block, groups, {k: v for k, v in state.items()
                                                 if k not in norms and k not in biases})
        names = []
        for k, v in norms.items():
            name = k[len(NORM_PREFIX):-len(".weight")]
            _copy_checked(get_submodule(block, name).weight, v, k)
            names.append(name)
        block._scaled_norms = tuple(names)
        for k, v in biases.items():
            _copy_checked(get_submodule(block, k[len(BIAS_PREFIX):]).linear.bias, v, k)
        block._scaled_biases = tuple(k[len(BIAS_PREFIX):] for k in biases)


def _copy_checked(p: torch.Tensor, v: torch.Tensor, key: str) -> None:
    if p.shape != v.shape:
        raise ValueError(f"{key}: shape {tuple(v.shape)} != {tuple(p.shape)}")
    p.copy_(v.to(p.dtype))


def require_weight_only(method: QuantMethod) -> None:
    """GPTQ and AWQ quantize weights only (QDLM runs them at W4A16 / W3A16)."""
    if is_quantized(method.a_bits):
        raise ValueError(f"method type {method.type_name!r} is weight-only: its bits need "
                         f"a_bits 16, got a_bits {method.a_bits}")
