"""The quantized structures of the GPU benchmarks, built on random weights at the real shapes
(``benchmarks/shapes.py``) with the pipeline's own modules: FAIR-Calib/FlatQuant's online
Kronecker transforms at their initialisation, QuaRot's online Hadamards, RTN's plain per-token
quantization; every linear on the real (or emulated) low-bit backend, norms and SwiGLU products
fused as ``load_quantized`` fuses them; and one JSON line per measurement (:func:`emit`).
"""
from __future__ import annotations

import json

import torch

from benchmarks import shapes
from fair_calib.methods import make_method
from fair_calib.quant import lowbit
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups
from fair_calib.quant.hadamard import KronRotation
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer

OUT = None      # a file every emitted line is appended to, when set


def emit(rec: dict) -> None:
    line = json.dumps(rec)
    print(line, flush=True)
    if OUT:
        with open(OUT, "a") as f:
            f.write(line + "\n")


def block_groups(lm, dev):
    model = lm.model
    ids = torch.arange(64, device=dev).unsqueeze(0)
    probe = capture_block_inputs(model, lm.blocks[0], ids, 1, device=dev,
                                 hidden_dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        return discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))


def quantize_method(lm, groups, method_type, mode="real", bits=4):
    """A method's structure at its initialisation with the integer backend: "fair_calib"
    (FlatQuant's: random orthogonal Kronecker factors, clip logits 4, o_proj's head_dim factor
    folded into v_proj) or "rtn" (per-token activation quantization, no transform)."""
    method = make_method({"type": method_type}, bits, bits, seed=0)
    method.prepare_model(lm)
    for i, block in enumerate(lm.blocks):
        method.quantize_block(block, groups, None, i)
        lowbit.attach_block(block, mode)
    fuse(lm)
    lm.model.eval()


def quantize_fair_calib(lm, groups, mode="real", bits=4):
    quantize_method(lm, groups, "fair_calib", mode, bits)


def quantize_rtn(lm, groups, mode="real", bits=4):
    quantize_method(lm, groups, "rtn", mode, bits)


def fuse(lm):
    """Each norm read only by one low-bit group, and each SwiGLU product, into the kernel of
    the group that reads it (as load_quantized)."""
    n = lowbit.fuse_inputs(lm)
    emit({"kind": "inputs_fused", **n, "blocks": len(lm.blocks)})


def quantize_quarot(lm, groups, hd, mode="real", bits=4):
    """QuaRot's online part (no model rotation needed for speed): exact Hadamards online on the
    o_proj input (across heads) and the down_proj input (full width), per-token clip 1.0,
    ``bits`` for weights and activations."""
    for block in lm.blocks:
        for g in groups:
            name = g.names[0]
            rot = None
            if name.endswith("o_proj"):
                rot = KronRotation(g.in_features, None, signs=False,
                                   split=(g.in_features // hd, hd), right=False)
            elif name.endswith("down_proj"):
                rot = KronRotation(g.in_features, None, signs=False)
            dev = block.get_submodule(name).weight.device
            inq = InputQuant(g.in_features, ActQuantizer(bits), online_rotation=rot).to(dev)
            inq.n_users = len(g.names)
            for k, n in enumerate(g.names):
                lin = block.get_submodule(n)
                ql = QuantLinear(lin, inq, WeightQuantizer(lin.out_features, bits).to(dev),
                                 user=k)
                parent, _, leaf = n.rpartition(".")
                setattr(block.get_submodule(parent), leaf, ql)
        lowbit.attach_block(block, mode)
    fuse(lm)
    lm.model.eval()


def to_byte_storage(lm):
    """4-bit codes one per byte (the GEMM's operand dtype), what ``load_quantized`` stores on
    CUDA by default."""
    from fair_calib.quant import lowbit_triton
    for m in lm.model.modules():
        if isinstance(m, lowbit.LowBitLinear) and m.packed:
            m.qweight = lowbit_triton.unpack_int4(m.qweight, m.in_features, m.code_dtype)
            m.packed = False


def ids_for(shape, batch, seq, dev, seed=1):
    vocab = shapes.SHAPES[shape]["vocab_size"]
    return torch.randint(0, vocab - 2, (batch, seq), generator=torch.Generator().manual_seed(seed)).to(dev)
