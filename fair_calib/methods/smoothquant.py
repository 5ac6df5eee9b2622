"""``smoothquant``: SmoothQuant as QDLM runs it (DuQuant's code base, ``main.py --smooth
--alpha 0.5 --epochs 0``, activation scales from ``generate_act_scale_shift.py``; W8A8).

Per block (no optimisation; the next block is fed the FP block's outputs):
1. scales, all from the FP block: s = clamp(a^alpha / w^(1 - alpha), 1e-5), then lifted to
   1e-2 (DuQuant's ``truncate_number``), with a = clamp(max |x|, 1e-5) per input channel over
   the calibration set (the driver's ``x_absmax``: what ``get_act_scales`` records) and w =
   clamp(max |W|, 1e-5) per input channel of ONE linear of the group, as DuQuant's ``pairs``
   name it: the q projection (the attention-input group's first linear), the up projection
   (the MLP-input member that feeds the down projection), o_proj, down_proj;
2. folded (``smooth_and_let_inplace``): a norm-fed group's norm weight / s and its linears'
   columns * s; o_proj: v_proj's rows (and bias) / s and o_proj's columns * s, or, where v_proj
   has fewer rows than o_proj has inputs (GQA: Dream), an online division of o_proj's input by
   s (``smooth_fc_inplace``); down_proj: up_proj's rows / s;
3. weights: per output channel, asymmetric min/max (DuQuant's ``UniformAffineQuantizer``,
   ``symmetric`` False, ``per_channel``), rounded to nearest;
4. activations: per token, asymmetric min/max, dynamic (``a_dynamic_method per_token``).
The roles (q, v/o, up/down) are found by running the block, not by names. ``alpha`` (0.5).

``arithmetic``: ``authors`` (the default) as DuQuant's code computes: the scales from the
float16 activation maxima and the weight in its dtype, then the layer in float16
(``qlayer.half()``: truncation, folding, weight codes and every quantizer in float16,
``fair_calib.quant.half``) and the attention matmuls' inputs quantized too (Q, K, V per
(token, head), ``int_llama_layer.py``'s ``qkt_matmul`` / ``pv_matmul``); the quantized block
computes as DuQuant's own layer classes (``int_llada_layer`` / ``int_dream_layer`` /
``int_llama_layer`` by family: norms, rotary, attention, MLP in their dtypes and order,
``fair_calib.quant.duquant_layer``). ``precise``: scales, folding and quantizers in float32,
the layer in the model's dtype and classes, attention matmuls in full precision.
"""
from __future__ import annotations

import torch

from ..quant import duquant_layer, half
from ..quant.discovery import get_submodule
from ..quant.groupwise import group_codes, minmax_asym_params, fake_quant_zp
from ..quant.qlinear import InputQuant
from ..quant.quantizers import ActQuantizer, is_quantized
from .weight_only import GroupCodesMethod

CLIPMIN = 1e-5      # DuQuant's quantize/const.py
TRUNCATE = 1e-2     # DuQuant's truncate_number threshold on the smoothing scales


class AsymActQuantizer(ActQuantizer):
    """Per-token asymmetric min/max quantizer (DuQuant's activation quantizer); ``clip_ratio``
    multiplies both bounds (DuQuant's ``lac``; 1 for SmoothQuant)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.enabled:
            return x
        scale, zero = minmax_asym_params(x if self.clip_ratio == 1.0 else x * self.clip_ratio,
                                         self.bits)
        return fake_quant_zp(x, scale, zero, self.bits)


class SmoothInputQuant(InputQuant):
    """A group's input: optionally divided by the smoothing scales online (``smooth``), then
    quantized per token by :class:`AsymActQuantizer` (eager: the fused kernels are symmetric).
    ``in_dtype``: every step in the input's own dtype (DuQuant's float16 layer), else the
    quantizer in float32."""

    def __init__(self, dim: int, act: ActQuantizer, online_smooth: bool = False,
                 in_dtype: bool = False):
        super().__init__(dim, act)
        self.register_buffer("smooth", torch.ones(dim) if online_smooth else None)
        self.in_dtype = bool(in_dtype)

    def transform_x(self, x, mats=None):
        return x if self.smooth is None else x / self.smooth.to(x.dtype)

    def _fusable(self) -> bool:
        return False

    def _in_dtype(self, x):
        xt = self.transform_x(x)
        return tuple(a(xt) if a.enabled else xt for a in self.acts)

    def _compute_modules(self, x, mats, out_dtype):
        if self.in_dtype:
            return self._in_dtype(x)
        return super()._compute_modules(x, mats, out_dtype)

    def _compute_folded(self, x):
        if self.in_dtype:
            return self._in_dtype(x)
        xt = self.transform_x(x)
        return tuple(a(xt.float()).to(x.dtype) if a.enabled else xt for a in self.acts)


def smoothing_scale(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """DuQuant's smoothing scale of one group from its input's max |x| and one linear's weight."""
    act = act_absmax.float().clamp(min=CLIPMIN)
    w = weight.float().abs().max(dim=0)[0].clamp(min=CLIPMIN)
    s = (act.pow(alpha) / w.pow(1 - alpha)).clamp(min=CLIPMIN)
    return torch.where(s.abs() < TRUNCATE, s.sign() * TRUNCATE, s)


def smoothing_scale_half(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """:func:`smoothing_scale` as ``duquant()`` computes it: the activation maxima cast to the
    layer's float16, the weight's in its own dtype (the promoted quotient registered, then cast
    by ``qlayer.half()``), ``truncate_number`` on the float16 scale."""
    act = act_absmax.to(torch.float16).clamp(min=CLIPMIN)
    w = weight.abs().max(dim=0)[0].clamp(min=CLIPMIN)
    s = (act.pow(alpha) / w.to(act.device).pow(1 - alpha)).clamp(min=CLIPMIN).half()
    t = s.clone()
    t[t.abs() < TRUNCATE] = t[t.abs() < TRUNCATE].sign() * TRUNCATE
    return t


class SmoothQuantMethod(GroupCodesMethod):
    type_name = "smoothquant"

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        self._traces: dict = {}
        self._attention: dict[int, list[str]] = {}   # per block: its attention modules
        self.scales: dict[int, dict[int, torch.Tensor]] = {}   # per block: group -> s (tests)
        self._layer: duquant_layer.LayerArith | None = None    # authors: DuQuant's layer

    @property
    def alpha(self) -> float:
        return float(self.cfg.get("alpha", 0.5))

    @property
    def authors(self) -> bool:
        return self.arithmetic == "authors"

    def prepare_model(self, loaded) -> None:
        from ..quant.trace import trace_model

        if not self.authors:
            self._traces = trace_model(loaded, feeders=True)
            return
        self._layer = duquant_layer.layer_arith(loaded)
        half.install_qkv_attention(loaded.model)
        with half.record_attention() as seen:
            self._traces = trace_model(loaded, feeders=True)
        for i, block in enumerate(loaded.blocks):
            names = [n for n, m in block.named_modules() if any(m is s for s in seen)]
            if not names:
                raise RuntimeError(f"{self.type_name}: block {i}'s attention does not run through "
                                   "transformers' attention interface; its matmul inputs cannot be "
                                   "quantized (arithmetic: authors); use arithmetic: precise")
            self._attention[i] = names
            duquant_layer.check_layout(block, i)

    def qkv_quant(self) -> half.QKVQuant:
        """SmoothQuant's ``qkt_matmul`` / ``pv_matmul`` inputs: a_bits, no clipping, no
        rotation (``quant_method`` None)."""
        return half.QKVQuant(self.a_bits)

    def _trace(self, block_index):
        tr = self._traces.get(block_index)
        if tr is None:
            raise RuntimeError("smoothquant: prepare_model must run before quantize_block")
        return tr

    def _plan(self, block, groups, tr) -> dict[int, tuple[str, str | None, str]]:
        """group -> (how s is folded: norm / linear / online, where, the linear whose weight
        maximum enters s)."""
        feeders = tr.get("feeders", {})
        fed_by = set(feeders.values())
        plan = {}
        for j, g in enumerate(groups):
            if j in tr["norm_fed"]:
                # q_proj for the attention input (the group holding v), up_proj for the MLP's
                key = (g.names[0] if tr.get("v_name") in g.names else
                       next((n for n in g.names if n in fed_by), g.names[0]))
                plan[j] = ("norm", tr["producer"][j], key)
            elif j in feeders:
                f = get_submodule(block, feeders[j])
                same = f.out_features == g.in_features
                plan[j] = ("linear" if same else "online", feeders[j] if same else None, g.names[0])
        return plan

    def online_smooth(self, block, j, block_index) -> bool:
        """Whether group j's smoothing scales divide its input online (a GQA o_proj)."""
        tr = self._trace(block_index)
        return self._plan(block, tr["groups"], tr).get(j, ("",))[0] == "online"

    def make_input_quant(self, group, j, stats, block, block_index):
        act = half.HalfActQuantizer(self.a_bits) if self.authors else AsymActQuantizer(self.a_bits)
        return SmoothInputQuant(group.in_features, act, self.online_smooth(block, j, block_index),
                                in_dtype=self.authors)

    def make_quant_linear(self, linear, inq, wq, user):
        if self.authors:
            return half.HalfQuantLinear(linear, inq, wq, user=user)
        return super().make_quant_linear(linear, inq, wq, user)

    def quantize_block(self, block, groups, stats, block_index) -> None:
        super().quantize_block(block, groups, stats, block_index)
        if self.authors:
            for name in self._attention.get(block_index, ()):
                setattr(get_submodule(block, name), half.QKV_ATTR, self.qkv_quant())

    @torch.no_grad()
    def after_wrap(self, block, groups, stats, block_index) -> None:
        plan = self._plan(block, groups, self._trace(block_index))
        lin = lambda n: get_submodule(block, n).linear   # noqa: E731
        scale_of = smoothing_scale_half if self.authors else smoothing_scale
        scales = {j: scale_of(stats[j].x_absmax, lin(key).weight, self.alpha)
                  for j, (_, _, key) in plan.items()}
        if self.authors:
            self._half_layer(block)             # qlayer.half(), before the folding
        norms, biases = [], []
        for j, (kind, where, _) in plan.items():
            s = scales[j]
            if kind == "norm":
                nw = get_submodule(block, where).weight
                self._divide(nw, s)
                norms.append(where)
            elif kind == "linear":
                f = lin(where)
                self._divide(f.weight, s.view(-1, 1))
                if f.bias is not None:
                    self._divide(f.bias, s)
                    biases.append(where)
            else:
                get_submodule(block, groups[j].names[0]).inq.smooth.copy_(s)
            for n in groups[j].names:
                w = lin(n).weight
                if self.authors:
                    w.mul_(s.view(1, -1))
                else:
                    w.copy_((w.float() * s.view(1, -1)).to(w.dtype))
        block._scaled_norms = tuple(norms)
        block._scaled_biases = tuple(biases)
        self.scales[block_index] = scales
        self.set_block_codes(block, groups)

    def _divide(self, p: torch.Tensor, s: torch.Tensor) -> None:
        """p / s in place: in float16 (``smooth_ln_fcs_inplace``, ``smooth_fc_fc_inplace``) or
        via float32."""
        if self.authors:
            p.div_(s)
        else:
            p.copy_((p.float() / s).to(p.dtype))

    def set_codes(self, ql, gc) -> None:
        if not self.authors:
            return super().set_codes(ql, gc)
        ql._groups = gc
        ql.w_quant = half.dequantize_half(gc).to(ql.linear.weight.device)

    def set_block_codes(self, block, groups) -> None:
        """Every linear's weight codes, right after smoothing (DuQuant's ``quant_inplace``)."""
        lin = lambda n: get_submodule(block, n).linear   # noqa: E731
        if is_quantized(self.w_bits):
            for g in groups:
                for n in g.names:
                    w = lin(n).weight
                    gc = (half.uaq_codes(w, self.w_bits) if self.authors else
                          group_codes(w.float(), self.w_bits, -1, minmax_asym_params))
                    self.set_codes(get_submodule(block, n), gc)

    def _half_layer(self, block) -> None:
        """DuQuant's quantized layer: its arithmetic (``fair_calib.quant.duquant_layer``) in
        float16 (``qlayer.half()``)."""
        if self._layer is None:
            raise RuntimeError(f"{self.type_name}: prepare_model must run before quantize_block")
        duquant_layer.install(block, self._layer)
        half.make_half(block)

    @torch.no_grad()
    def load_block_state(self, block, groups, state):
        if self.authors:
            self._half_layer(block)
        super().load_block_state(block, groups, state)
