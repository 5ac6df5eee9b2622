"""``awq``: activation-aware weight quantization as mit-han-lab/llm-awq computes it (QDLM's copy,
``llm-awq/entry.py --run_awq --w_bit B --q_group_size 128``: ``auto_scale`` then ``auto_clip``
per block, then ``pseudo_quantize_model_weight`` with zero points).

Per block, on the FP block (the next block is fed FP outputs, as ``run_awq``):
1. input features of every group (a forward pass): per channel mean |x| over all calibration
   tokens (``get_act_scale``), and the tokens ``auto_clip`` samples (every (n // 512)-th);
2. ``auto_scale``: for each group with a place to fold a scale into (a norm-fed group: the norm;
   o_proj: v_proj, only where their shapes are equal; down_proj: up_proj), for ratio r/20,
   r = 0..19: s = clamp(mean|x|^ratio, 1e-4), s /= sqrt(max s * min s); the group's weights
   replaced by Q(W s) / s; the loss is the mean squared change of the output of the smallest
   module holding the group (attention for q/k/v, the MLP for gate/up, the linear itself for
   o/down: llm-awq's ``module2inspect``); the first minimum is kept. All searches run on the FP
   block; then the scales are applied (norm weight / s or the feeder's rows / s, the group's
   columns * s) and the sampled features divided by s;
3. ``auto_clip``: every linear except the query and key projections: per (row, group), among
   the symmetric clamps max|w| (1 - i/20), i = 0..9, the one minimising the mean over the
   sampled tokens of the squared change of each group's partial dot product;
4. every linear quantized round-to-nearest: group size ``group_size`` (128), 2^b levels with a
   zero point (:func:`~fair_calib.quant.groupwise.awq_params`).
The query/key and value/o/up/down roles are found by running the block
(:func:`~fair_calib.quant.trace.trace_model` with feeders), not by names.

``arithmetic``: ``authors`` (the default) computes as llm-awq does, in the block's dtype and
llm-awq's order: every calibration token's input kept (on the CPU, as ``cache_input_hook``) and
its mean |x| taken in one ``x.abs().view(-1, C).mean(0)`` on the block's device; the ratio
search's scales in that dtype, the loss one ``(org - out).float().pow(2).mean()`` over every
token; scales and clips applied in place in the parameters' dtype; ``auto_clip`` in the
weight's dtype over chunks of 256 rows (64 where 256 does not divide them). ``precise``: mean
|x| accumulated in float64, the search, clip and weights in float32, the loss summed in float64
over micro-batches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..quant.discovery import get_submodule
from ..quant.groupwise import awq_params, awq_pseudo_quantize, group_codes
from .weight_only import GroupCodesMethod, require_weight_only

N_GRID = 20            # auto_scale's ratios r / 20
CLIP_GRID = 20         # auto_clip's shrink steps 1 / 20
CLIP_MAX_SHRINK = 0.5  # auto_clip tries 1 - i / 20 for i < 0.5 * 20
CLIP_TOKENS = 512      # auto_clip's n_sample_token


class _Stop(Exception):
    """Raised by a capture hook: the rest of the block is not needed."""


@dataclass
class _Feat:
    mean_abs: torch.Tensor   # [C] mean |x| over every calibration token
    sample: torch.Tensor     # [n_s, C] every step-th token (auto_clip)


def _llm_awq_mean_abs(xs: list[torch.Tensor], device) -> torch.Tensor:
    """``get_act_scale`` on the concatenated features, as ``_search_module_scale`` calls it:
    every token at once, in their dtype, on the block's device."""
    x = torch.cat(xs, dim=0).to(device)
    return x.abs().view(-1, x.shape[-1]).mean(0)


def lca_name(names) -> str:
    """The dotted name of the smallest module holding every one of ``names`` ("" = the block)."""
    parts = [n.split(".") for n in names]
    if len(parts) == 1:
        return names[0]
    common = []
    for seg in zip(*parts):
        if len(set(seg)) > 1:
            break
        common.append(seg[0])
    return ".".join(common)


class AWQMethod(GroupCodesMethod):
    type_name = "awq"

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        require_weight_only(self)
        self._traces: dict = {}
        # per block: the chosen scales and ratios, and the clip bounds (logs, tests)
        self.search: dict[int, dict] = {}

    def prepare_model(self, loaded) -> None:
        from ..quant.trace import trace_model

        self._traces = trace_model(loaded, feeders=True)

    def make_input_quant(self, group, j, stats, block, block_index):
        return None

    @torch.no_grad()
    def fit_block(self, block, groups, inputs, block_index, run) -> None:
        if not (0 < self.w_bits < 16):
            return
        tr = self._traces.get(block_index)
        if tr is None:
            raise RuntimeError("awq: prepare_model must run before fit_block")
        plan = self._plan(block, groups, tr)
        feats = self._features(block, groups, inputs, run)
        found = {j: self._search_scale(block, groups[j], feats[j].mean_abs, len(inputs), run)
                 for j, _ in plan}
        scales = {j: s for j, (s, _) in found.items()}
        self._apply_scales(block, groups, plan, scales, feats)
        skip = self._no_clip(groups, tr)
        clips = {}
        authors = self.authors
        for j, g in enumerate(groups):
            for n in g.names:
                if n not in skip:
                    lin = get_submodule(block, n).linear
                    w = lin.weight if authors else lin.weight.float()
                    mx = auto_clip(w, feats[j].sample, self.w_bits, self.group_size,
                                   rows_per_chunk=llm_awq_chunk(w.shape[0]) if authors else 64)
                    if authors:      # apply_clip: the bound cast to the weight's dtype
                        lin.weight.copy_(apply_clip(lin.weight, mx.to(lin.weight.dtype)))
                    else:
                        lin.weight.copy_(apply_clip(lin.weight.float(), mx).to(lin.weight.dtype))
                    clips[n] = mx
        self.search[block_index] = {"scales": scales, "ratios": {j: r for j, (_, r) in found.items()},
                                    "prev": dict(plan), "clips": clips}
        for g in groups:
            for n in g.names:
                ql = get_submodule(block, n)
                w = ql.linear.weight if authors else ql.linear.weight.float()
                self.set_codes(ql, group_codes(w, self.w_bits, self.group_size, awq_params))

    @property
    def authors(self) -> bool:
        return self.arithmetic == "authors"

    # ----------------------------------------------------------------- the block's structure
    @staticmethod
    def _plan(block, groups, tr) -> list[tuple[int, tuple[str, str]]]:
        """(group, (kind, module)) of every group auto_scale searches: ("norm", norm name) or
        ("linear", feeder name); a feeder needs as many rows as the group has inputs."""
        plan = []
        feeders = tr.get("feeders", {})
        for j, g in enumerate(groups):
            if j in tr["norm_fed"]:
                plan.append((j, ("norm", tr["producer"][j])))
            elif j in feeders:
                f = get_submodule(block, feeders[j])
                if f.out_features == g.in_features:
                    plan.append((j, ("linear", feeders[j])))
        return plan

    @staticmethod
    def _no_clip(groups, tr) -> set[str]:
        """The query and key projections: the attention-input group's members other than v."""
        v = tr.get("v_name")
        for g in groups:
            if v in g.names:
                return {n for n in g.names if n != v}
        return set()

    # ----------------------------------------------------------------- statistics
    def _features(self, block, groups, inputs, run) -> list[_Feat]:
        n_tok = sum(h.shape[:-1].numel() for h in inputs.hidden)
        step = max(1, n_tok // CLIP_TOKENS)
        authors = self.authors
        sums = [None] * len(groups)
        kept: list[list[torch.Tensor]] = [[] for _ in groups]     # authors: every token
        samples: list[list[torch.Tensor]] = [[] for _ in groups]
        offset = [0] * len(groups)
        handles = []

        def make_hook(j):
            def hook(_m, args):
                if authors:        # cache_input_hook: x.detach().cpu(), in its dtype
                    kept[j].append(args[0].detach().cpu())
                    return
                x = args[0].detach().float().reshape(-1, args[0].shape[-1])
                a = x.abs().double().sum(0)
                sums[j] = a if sums[j] is None else sums[j] + a
                idx = torch.arange(offset[j], offset[j] + x.shape[0], device=x.device)
                samples[j].append(x[idx % step == 0].cpu())
                offset[j] += x.shape[0]
            return hook
        for j, g in enumerate(groups):
            handles.append(get_submodule(block, g.names[0]).register_forward_pre_hook(make_hook(j)))
        try:
            for b in range(len(inputs)):
                run(b)
        finally:
            for h in handles:
                h.remove()
        if not authors:
            return [_Feat((sums[j] / offset[j]).float(), torch.cat(samples[j]))
                    for j in range(len(groups))]
        device = next(block.parameters()).device
        feats = []
        for j in range(len(groups)):
            mean_abs = _llm_awq_mean_abs(kept[j], device)
            x = torch.cat(kept[j], dim=0)
            kept[j] = []
            feats.append(_Feat(mean_abs, x.reshape(-1, x.shape[-1])[0::step].clone()))
        return feats

    # ----------------------------------------------------------------- auto_scale
    def _outputs(self, block, module: str, n_batches: int, run) -> list[torch.Tensor]:
        """The output of ``module`` ("" = the block) on every micro-batch; the block stops there.
        In float32 (``precise``) or in the dtype the module returns (``authors``)."""
        outs: list[torch.Tensor] = []
        cast = (lambda t: t) if self.authors else (lambda t: t.float())   # noqa: E731
        if module == "":
            return [cast(run(b)) for b in range(n_batches)]

        def hook(_m, _a, out):
            outs.append(cast((out[0] if isinstance(out, tuple) else out).detach()))
            raise _Stop
        handle = get_submodule(block, module).register_forward_hook(hook)
        try:
            for b in range(n_batches):
                try:
                    run(b)
                except _Stop:
                    pass
        finally:
            handle.remove()
        return outs

    def _search_scale(self, block, group, x_mean, n_batches, run) -> tuple[torch.Tensor, float]:
        module = lca_name(group.names)
        org = self._outputs(block, module, n_batches, run)
        if self.authors:
            org = torch.cat(org, dim=0)
        qls = [get_submodule(block, n) for n in group.names]
        best, best_s = float("inf"), None
        for r in range(N_GRID):
            s = x_mean.pow(r / N_GRID).clamp(min=1e-4).view(-1)
            s = s / (s.max() * s.min()).sqrt()
            try:
                for ql in qls:
                    ql.w_quant = self._scaled_quantized(ql.linear.weight, s)
                out = self._outputs(block, module, n_batches, run)
            finally:
                for ql in qls:
                    ql.w_quant = None
            if self.authors:   # "float prevents overflow": one mean over every token
                loss = (org - torch.cat(out, dim=0)).float().pow(2).mean().item()
            else:
                num = sum(float((o - q).double().pow(2).sum()) for o, q in zip(org, out))
                loss = num / sum(o.numel() for o in org)
            if loss < best:
                best, best_s, best_r = loss, s, r / N_GRID
        if best_s is None:
            raise RuntimeError(f"awq: no finite loss for group {group.names}")
        return best_s, best_r

    def _scaled_quantized(self, weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Q(W s) / s: in the weight's dtype as ``_search_module_scale`` (``fc.weight.mul_``,
        ``w_quantize_func``), or in float32."""
        if self.authors:
            w = weight.detach().clone().mul_(s.view(1, -1))
            return awq_pseudo_quantize(w, self.w_bits, self.group_size) / s.view(1, -1)
        w = weight.float() * s.view(1, -1)
        return awq_pseudo_quantize(w, self.w_bits, self.group_size) / s.view(1, -1)

    def _apply_scales(self, block, groups, plan, scales, feats) -> None:
        norms = list(getattr(block, "_scaled_norms", ()))
        biases = []
        for j, (kind, prev) in plan:
            s = scales[j]
            if kind == "norm":
                nw = get_submodule(block, prev).weight
                self._divide(nw, s)
                norms.append(prev)
            else:
                f = get_submodule(block, prev).linear
                self._divide(f.weight, s.view(-1, 1))
                if f.bias is not None:
                    self._divide(f.bias, s)
                    biases.append(prev)
            for n in groups[j].names:
                lin = get_submodule(block, n).linear
                if self.authors:
                    lin.weight.mul_(s.view(1, -1).to(lin.weight.dtype))
                else:
                    lin.weight.copy_((lin.weight.float() * s.view(1, -1)).to(lin.weight.dtype))
            sample = feats[j].sample
            feats[j].sample = sample / s.view(1, -1).to(sample.device, sample.dtype)
        block._scaled_norms = tuple(dict.fromkeys(norms))
        block._scaled_biases = tuple(biases)

    def _divide(self, p: torch.Tensor, s: torch.Tensor) -> None:
        """p / s in place: in p's dtype (``scale_ln_fcs``, ``scale_fc_fc``) or via float32."""
        if self.authors:
            p.div_(s.to(p.dtype))
        else:
            p.copy_((p.float() / s).to(p.dtype))


def llm_awq_chunk(rows: int) -> int:
    """``auto_clip_layer``'s ``oc_batch_size``: 256 output rows at a time where 256 divides
    them, else 64 (a last shorter chunk where 64 does not either: llm-awq asserts)."""
    return 256 if rows % 256 == 0 else 64


# ----------------------------------------------------------------------- auto_clip
@torch.no_grad()
def auto_clip(w: torch.Tensor, x: torch.Tensor, bits: int, group_size: int,
              rows_per_chunk: int = 64) -> torch.Tensor:
    """llm-awq's ``auto_clip_layer``: the clamp bound max|w| (1 - i/20) per (row, group),
    i < 10, minimising the mean over tokens of the squared change of the group's partial dot
    products <x_g, Q(clamp(w_g))> (zero-point quantizer, groups of ``group_size``). ``w``
    [out, in], ``x`` [tokens, in], both in the dtype it computes in; returns the bounds
    [out, n_groups, 1]."""
    out, cin = w.shape
    gs = group_size if group_size > 0 else cin
    if cin % gs:
        raise ValueError(f"awq: group_size {gs} does not divide the {cin} input columns")
    xg = x.to(w.device).reshape(1, x.shape[0], -1, gs)
    wg = w.reshape(out, 1, -1, gs)
    best_all = []
    for r0 in range(0, out, rows_per_chunk):
        wc = wg[r0:r0 + rows_per_chunk]
        org_max = wc.abs().amax(dim=-1, keepdim=True)
        best = org_max.clone()
        min_err = torch.ones_like(org_max) * 1e9
        org_out = (xg * wc).sum(dim=-1)
        for i in range(int(CLIP_MAX_SHRINK * CLIP_GRID)):
            mx = org_max * (1 - i / CLIP_GRID)
            q = awq_pseudo_quantize(torch.clamp(wc, -mx, mx), bits, gs)
            err = ((xg * q).sum(dim=-1) - org_out).pow(2).mean(dim=1).view(min_err.shape)
            better = err < min_err
            min_err[better] = err[better]
            best[better] = mx[better]
        best_all.append(best)
    return torch.cat(best_all, dim=0).squeeze(1)


def apply_clip(w: torch.Tensor, max_val: torch.Tensor) -> torch.Tensor:
    """``apply_clip``: w clamped to [-max_val, max_val] per (row, group)."""
    shape = w.shape
    wr = w.reshape(*max_val.shape[:2], -1)
    return torch.clamp(wr, -max_val, max_val).reshape(shape)
