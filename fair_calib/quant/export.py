"""Deployment export: integer weights packed into bytes, for the deployment-memory table.

Every fake-quant linear is written as its integer codes of Q_W(W T^{-1}) (4-bit: two codes per
byte, low nibble first, two's complement; 5..8 bits: one int8 per code) plus one float16 scale
per output channel and its bias; a group-wise weight (``gptq``, ``awq``, ``smoothquant``) as its
unsigned codes with float16 scales and int16 zero points per (row, group) (:func:`group_tensors`). The online part of each input group (the folded transform
matrices P1, P2 and diagonal d, an online rotation's factors, a static activation scale) and all
non-quantized parameters (embeddings, norms, LM head) are stored in bfloat16 (float16 for the
small scales). The file is a plain safetensors file; its size on disk is what ``export_bytes``
reports.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .qlinear import InputQuant, QuantLinear
from .quantizers import is_quantized, qmax


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int codes in [-8, 7], shape [out, in] -> uint8 [out, ceil(in / 2)] (low nibble first)."""
    c = codes.to(torch.int16)
    if c.numel() and (c.min() < -8 or c.max() > 7):
        raise ValueError("4-bit codes must lie in [-8, 7]")
    u = (c & 0xF).to(torch.uint8)
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros(*u.shape[:-1], 1, dtype=torch.uint8)], dim=-1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    lo = (packed & 0xF).to(torch.int16)
    hi = (packed >> 4).to(torch.int16)
    u = torch.stack([lo, hi], dim=-1).reshape(*packed.shape[:-1], -1)[..., :n]
    return torch.where(u >= 8, u - 16, u).to(torch.int8)


@torch.no_grad()
def quant_basis_weight(ql: QuantLinear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(W T^{-1} in float32, the output factor in float32 or None) with the folding's
    arithmetic (W T^{-1} in float64): what the weight quantizer's row scales are taken from."""
    w = ql.linear.weight.double()
    if ql.inq is not None:
        ql.inq.unfold()
        w = ql.inq.weight_inverse(w)
        ql.inq.fold()
    fac = ql.out_factor(torch.float64)
    return w.float(), None if fac is None else fac.float()


@torch.no_grad()
def linear_codes(ql: QuantLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 per-row scale) with codes * scale == the float32 quantized weight
    Q_W(W T^{-1}) that :meth:`QuantLinear.fold` casts to the model dtype (its ``w_folded``)."""
    bits = ql.wq.bits
    if ql.w_quant is not None:                      # GPTQ keeps its codes
        codes, scale = ql._gptq
        return codes.to(torch.int8), scale.float().reshape(-1, 1)
    # codes and row scales from the float32 quantized weight, with the folding's arithmetic:
    # in a bf16 model the folded weight is that value rounded to bf16, off the grid (every
    # bf16 export was refused before, seen on a lent GPU)
    w32, fac = quant_basis_weight(ql)
    wq = ql.wq(w32, fac).float()
    scale = ql.wq.row_scale(w32, fac).float().reshape(-1, 1)
    codes = torch.clamp(torch.round(wq / scale), -qmax(bits) - 1, qmax(bits))
    if not torch.allclose(codes * scale, wq, atol=1e-6, rtol=1e-5):
        raise RuntimeError("export: quantized weight is not on its quantization grid")
    return codes.to(torch.int8), scale


def pack_uint4(codes: torch.Tensor) -> torch.Tensor:
    """unsigned codes in [0, 15], shape [out, in] -> uint8 [out, ceil(in / 2)] (low nibble first)."""
    c = codes.to(torch.int16)
    if c.numel() and (c.min() < 0 or c.max() > 15):
        raise ValueError("unsigned 4-bit codes must lie in [0, 15]")
    u = c.to(torch.uint8)
    if u.shape[-1] % 2:
        u = torch.cat([u, torch.zeros(*u.shape[:-1], 1, dtype=torch.uint8)], dim=-1)
    return u[..., 0::2] | (u[..., 1::2] << 4)


def unpack_uint4(packed: torch.Tensor, n: int) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1)[..., :n]


def group_tensors(name: str, gc) -> dict[str, torch.Tensor]:
    """A group-wise weight (:class:`~fair_calib.quant.groupwise.GroupCodes`): its unsigned codes
    (bits <= 4: two per byte, low nibble first; else one uint8 each), float16 scales and int16
    zero points per (row, group), and ``g_idx`` only where the groups are not consecutive
    (GPTQ's act-order): w = scale[:, g_idx] (code - zero[:, g_idx])."""
    codes = gc.codes.cpu()
    out = {f"{name}.qweight": pack_uint4(codes) if gc.bits <= 4 else codes.to(torch.uint8),
           f"{name}.scales": gc.scale.to(torch.float16).cpu(),
           f"{name}.zeros": gc.zero.to(torch.int16).cpu()}
    n, ng = codes.shape[1], gc.scale.shape[1]
    gs = -(-n // ng)
    if not torch.equal(gc.g_idx.long().cpu(), torch.arange(n) // gs):
        out[f"{name}.g_idx"] = gc.g_idx.to(torch.int32).cpu()
    return out


@torch.no_grad()
def export_quantized(model: nn.Module, path: str | Path) -> dict[str, int]:
    """Write the packed deployment file for a fake-quant ``model``; returns sizes in bytes."""
    from ..jobs import io

    tensors: dict[str, torch.Tensor] = {}
    skip: set[int] = set()
    quant_linears = [(n, m) for n, m in model.named_modules() if isinstance(m, QuantLinear)]
    for name, ql in quant_linears:
        if ql.backend is not None:
            raise RuntimeError(f"export: {name} runs on low-bit codes (lowbit.attach_block: its "
                               "weight is a one-element stand-in); export from a model loaded "
                               "with lowbit='fake'")
    for name, ql in quant_linears:
        if is_quantized(ql.wq.bits):
            ql.fold()                       # creates w_folded (skipped below, stored as codes)
        skip.add(id(ql.linear.weight))
        for sub in (ql.wq, ql.inq):
            if sub is not None:
                skip.update(id(t) for t in sub.parameters())
                skip.update(id(t) for t in sub.buffers())
        for t in (ql.w_folded, ql.w_quant):
            if t is not None:
                skip.add(id(t))
        gc = getattr(ql, "_groups", None)
        if gc is not None:                 # group-wise codes with zero points (gptq, awq, ...)
            tensors.update(group_tensors(name, gc))
            continue
        if not is_quantized(ql.wq.bits):
            tensors[f"{name}.weight"] = ql.linear.weight.detach().to(torch.bfloat16)
            continue
        codes, scale = linear_codes(ql)
        if ql.b_folded is not None:       # FlatQuant's v_proj: the bias in the folded basis
            tensors[f"{name}.linear.bias"] = ql.b_folded.to(torch.bfloat16).cpu()
            skip.add(id(ql.linear.bias))
        tensors[f"{name}.qweight"] = (pack_int4(codes) if ql.wq.bits <= 4 else codes).cpu()
        tensors[f"{name}.scale"] = scale.reshape(-1).to(torch.float16).cpu()
    seen_inq: dict[int, str] = {}
    for name, ql in quant_linears:
        inq: InputQuant | None = ql.inq
        if inq is None or id(inq) in seen_inq:
            continue
        seen_inq[id(inq)] = name
        pre = f"{name}.input"
        if inq.transform is not None:
            inq.transform.fold(torch.float32)
            for k, v in inq.transform._folded.items():
                if k in ("p1", "p2", "d"):
                    tensors[f"{pre}.{k}"] = v.to(torch.bfloat16).cpu()
        if inq.rotation is not None and hasattr(inq.rotation, "export_tensors"):
            # a calibrated rotation (DuQuant's block rotations and permutation)
            tensors.update({f"{pre}.{k}": v for k, v in inq.rotation.export_tensors().items()})
        elif inq.rotation is not None:
            tensors[f"{pre}.rot_signs"] = inq.rotation.s.to(torch.int8).cpu()
            if inq.rotation.m > 1:
                tensors[f"{pre}.rot_m"] = inq.rotation.mfac.to(torch.bfloat16).cpu()
        smooth = getattr(inq, "smooth", None)     # SmoothQuant's online division (GQA o_proj)
        if smooth is not None:
            tensors[f"{pre}.smooth"] = smooth.to(torch.float16).cpu()
        if inq.act.enabled:   # one row per reader: (max-side, min-side) clip factors or LSQ scale
            rows = [a.scale.abs().reshape(1).repeat(2) if a.scale is not None
                    else torch.stack(a.ratios(torch.device("cpu"))) for a in inq.acts]
            tensors[f"{pre}.act_param"] = torch.stack(rows).to(torch.float16).cpu()
    for n, p in list(model.named_parameters()) + list(model.named_buffers()):
        if id(p) in skip or p is None:
            continue
        skip.add(id(p))
        tensors[n] = p.detach().to(torch.bfloat16 if p.is_floating_point() else p.dtype).cpu()
    path = Path(path)
    io.save_tensors(tensors, path)
    return {"export_bytes": path.stat().st_size}


def fp_bf16_bytes(model: nn.Module) -> int:
    """Bytes of the model's own parameters in bfloat16 (quantizer state excluded): counted from
    shapes, so a low-bit model's one-element weight stand-ins count as the FP weights they
    replace (the FP model's size, not what is resident: :func:`resident_bytes`)."""
    quant_state: set[int] = set()
    for m in model.modules():
        if isinstance(m, QuantLinear):
            for sub in (m.wq, m.inq):
                if sub is not None:
                    quant_state.update(id(p) for p in sub.parameters())
    return int(sum(p.numel() * 2 for p in model.parameters() if id(p) not in quant_state))



def resident_bytes(module: nn.Module) -> int:
    """Bytes ``module`` holds in memory: every parameter's and buffer's storage once (shared
    storages once). Unlike ``sum(p.numel() * p.element_size())``, which counts a low-bit
    linear's expanded one-element weight stand-in (``lowbit.attach_block``) as a full FP
    weight and misses its codes (buffers), this counts the stand-in as one element and the
    packed codes and scales as they are stored."""
    seen: set[tuple] = set()
    total = 0
    for t in list(module.parameters()) + list(module.buffers()):
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes(), t.device)
        if key not in seen:
            seen.add(key)
            total += st.nbytes()
    return total
