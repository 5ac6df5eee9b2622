"""``quarot``: QuaRot (Ashkboos et al.) as spcl/QuaRot's ``fake_quant`` computes it.

Model preparation (``prepare_model``, replayed identically from the seed when loading):
1. every linear group fed by an RMSNorm gets the norm's weight folded into its columns (norm
   weight set to 1); the final norm is folded into the LM head (a tied head is untied first);
2. the residual stream is rotated by a random Hadamard Q = diag(s) H / sqrt(n) with a true
   Hadamard factor (``fair_calib.quant.hadamard``): embedding rows E Q, norm-fed linears W Q,
   residual writers (linears not fed by a norm whose output width is the hidden size: o-proj,
   down-proj) Q^T W, head W Q. RMSNorm without weight commutes with Q, so the FP model's
   outputs are unchanged;
3. per-head Hadamard H on the value path: v rows per head H^T W_v, o-proj columns per head W_o H.
   The value projection is found without names (``fair_calib.quant.trace``).
Block quantization: online exact Hadamards (no random signs) on the down-projection input
(``online_full_had``) and across heads on the o_proj input (``online_partial_had``: the head_dim
part is already in v/o); activations per token with clip ratio ``a_clip_ratio`` (1.0, the README
command's default); weights by GPTQ (``damp`` 0.01, block 128) run sequentially inside the block
as ``gptq_fwrd`` (:meth:`QuaRotMethod.fit_block`), with the ``--w_clip`` MSE scale search
(``w_clip``, on); the next block is fed the outputs with quantized weights and FP activations
(``propagate: quant``). ``online_hadamard: false`` drops the online rotations.
Limitations: only RMSNorm (no mean subtraction / bias) is supported; no KV-cache quantization.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..quant.blockio import call_block, capture_block_inputs
from ..quant.discovery import get_submodule
from ..quant.trace import head_dim as _head_dim
from ..quant.trace import trace_block
from ..quant.gptq import group_hessian, gptq_quantize, mse_clip_scale
from ..quant.hadamard import KronRotation
from ..quant.qlinear import InputQuant, QuantLinear
from ..quant.quantizers import ActQuantizer, WeightQuantizer
from .base import QuantMethod


class QuaRotMethod(QuantMethod):
    type_name = "quarot"
    needs_hessian = False      # Hessians come from the sequential pass (fit_block)

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        self._traces: dict[int, dict[str, Any]] = {}

    # ---------------------------------------------------------------- model preparation
    @torch.no_grad()
    def prepare_model(self, loaded) -> None:
        model = loaded.model
        blocks = loaded.blocks
        embed, head, fnorm = loaded.embed, loaded.head, loaded.final_norm
        dim = embed.weight.shape[1]
        device = embed.weight.device
        gen = torch.Generator().manual_seed(self.seed * 65_537 + 17)
        Q = KronRotation(dim, gen).quarot_matrix().to(device)
        if head.weight is embed.weight or head.weight.data_ptr() == embed.weight.data_ptr():
            head.weight = nn.Parameter(head.weight.detach().clone())
            if hasattr(model.config, "tie_word_embeddings"):
                model.config.tie_word_embeddings = False
        probe_ids = torch.arange(8, device=device).unsqueeze(0) % embed.weight.shape[0]
        inputs = capture_block_inputs(model, blocks[0], probe_ids, 1, device=device,
                                      hidden_dtype=embed.weight.dtype)
        hd = self._head_dim = _head_dim(model.config)

        # embeddings
        embed.weight.copy_((embed.weight.double() @ Q).to(embed.weight.dtype))
        h = inputs.hidden[0].double() @ Q          # rotated input of block 0 (for tracing)
        for i, block in enumerate(blocks):
            dt = next(block.parameters()).dtype
            hid = h.to(dt)
            tr = trace_block(block, lambda: call_block(block, inputs, 0, hid))
            self._traces[i] = tr
            groups = tr["groups"]
            for j in tr["norm_fed"]:
                norm = get_submodule(block, tr["producer"][j])
                g = norm.weight.double()
                for n in groups[j].names:
                    lin = get_submodule(block, n)
                    lin.weight.copy_(((lin.weight.double() * g) @ Q).to(lin.weight.dtype))
                norm.weight.fill_(1.0)
            for j in tr["internal"]:
                for n in groups[j].names:
                    lin = get_submodule(block, n)
                    if lin.out_features == dim:
                        lin.weight.copy_((Q.T @ lin.weight.double()).to(lin.weight.dtype))
                        if lin.bias is not None:
                            lin.bias.copy_((Q.T @ lin.bias.double()).to(lin.bias.dtype))
            if tr["v_name"] is not None:
                Hh = KronRotation(hd, None, signs=False).matrix(torch.float64).to(device)
                v = get_submodule(block, tr["v_name"])
                o = get_submodule(block, groups[tr["o_group"]].names[0])
                if v.out_features % hd or o.in_features % hd:
                    raise ValueError(f"block {i}: v/o widths not multiples of head_dim {hd}")
                wv = v.weight.double().reshape(-1, hd, v.in_features)
                v.weight.copy_(torch.einsum("ji,kjd->kid", Hh, wv).reshape(v.weight.shape).to(v.weight.dtype))
                if v.bias is not None:
                    bv = v.bias.double().reshape(-1, hd)
                    v.bias.copy_((bv @ Hh).reshape(-1).to(v.bias.dtype))
                wo = o.weight.double().reshape(o.out_features, -1, hd)
                o.weight.copy_((wo @ Hh).reshape(o.weight.shape).to(o.weight.dtype))
            h = call_block(block, inputs, 0, hid).double()
        g = fnorm.weight.double()
        head.weight.copy_(((head.weight.double() * g) @ Q).to(head.weight.dtype))
        fnorm.weight.fill_(1.0)   # an LM-head bias is output-side: unaffected by the rotation

    # ---------------------------------------------------------------- block quantization
    def training_settings(self):
        s = super().training_settings()
        s["propagate"] = str(self.cfg.get("propagate", "quant"))   # gptq_fwrd: inps, outs swap
        return s

    def make_input_quant(self, group, j, stats, block, block_index):
        tr = self._traces.get(block_index)
        if tr is None:
            raise RuntimeError("QuaRot: prepare_model must run before quantize_block")
        act = ActQuantizer(self.a_bits, clip_ratio=float(self.cfg.get("a_clip_ratio", 1.0)))
        rot = None
        if j in tr["internal"] and bool(self.cfg.get("online_hadamard", True)):
            if j == tr["o_group"]:
                # online_partial_had: a Hadamard across heads (the head_dim one is in v/o)
                hd = self._head_dim
                rot = KronRotation(group.in_features, None, signs=False,
                                   split=(group.in_features // hd, hd), right=False)
            else:
                rot = KronRotation(group.in_features, None, signs=False)   # online_full_had
        return InputQuant(group.in_features, act, online_rotation=rot)

    def make_weight_quant(self, name, linear, inq, stats):
        return WeightQuantizer(linear.out_features, self.w_bits)

    @contextmanager
    def propagation(self, block):
        """QuaRot runs GPTQ (and propagates its outputs) before it configures the activation
        quantizers: weights quantized, activations in full precision."""
        acts = [m for m in block.modules() if isinstance(m, ActQuantizer)]
        saved = [a.enabled for a in acts]
        for a in acts:
            a.enabled = False
        try:
            yield
        finally:
            for a, e in zip(acts, saved):
                a.enabled = e

    @torch.no_grad()
    def fit_block(self, block, groups, inputs, block_index, run) -> None:
        """QuaRot's sequential GPTQ (``gptq_fwrd``): group by group in execution order
        (q/k/v, o, gate/up, down), each group's Hessian from the block run with the earlier
        groups already quantized (activations in full precision), inputs after the online
        rotation; then its linears are quantized. ``run(b)`` calls the block on micro-batch b."""
        if not (0 < self.w_bits < 16):
            return
        with self.propagation(block):
            for g in groups:
                H = group_hessian(block, g, len(inputs), run)
                for n in g.names:
                    self._gptq(get_submodule(block, n), H)

    def _gptq(self, ql: QuantLinear, H: torch.Tensor) -> None:
        w = ql.linear.weight.double()
        if ql.inq is not None:
            w = ql.inq.weight_inverse(w)
        scale = None
        if bool(self.cfg.get("w_clip", True)):
            scale = mse_clip_scale(w.float(), self.w_bits)
        codes, scale = gptq_quantize(w, H, self.w_bits, damp=float(self.cfg.get("damp", 0.01)),
                                     scale=scale)
        ql.w_quant = (codes.float() * scale).to(w.device)
        ql._gptq = (codes.cpu(), scale.cpu())

    def extra_linear_state(self, name, ql):
        if ql.w_quant is None:
            return {}
        codes, scale = getattr(ql, "_gptq")
        return {f"{name}.codes": codes, f"{name}.scale": scale}

    def load_extra_linear_state(self, name, ql, state):
        if f"{name}.codes" in state:
            codes = state[f"{name}.codes"].to(torch.int8)
            scale = state[f"{name}.scale"].float()
            ql._gptq = (codes.cpu(), scale.cpu())
            ql.w_quant = (codes.float() * scale).to(ql.linear.weight.device)
