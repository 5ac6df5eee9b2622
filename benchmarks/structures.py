"""The quantized structures of the GPU benchmarks on random weights at the real shapes
(``benchmarks/shapes.py``), built with the pipeline's own modules and fused as
``load_quantized`` fuses them; and one JSON line per measurement (:func:`emit`)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from benchmarks import shapes
from fair_calib.methods import make_method
from fair_calib.quant import lowbit
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups
from fair_calib.quant.hadamard import KronRotation
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer


def emit(rec: dict, name: str = "benchmarks") -> None:
    """Print one JSON line; with ``OUT`` set (the device tool's folder), also append it to
    ``$OUT/<name>.jsonl``, which comes back whole where the console's tail is cut."""
    line = json.dumps(rec)
    print(line, flush=True)
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / f"{name}.jsonl", "a") as f:
            f.write(line + "\n")


def block_groups(lm, dev):
    model = lm.model
    ids = torch.arange(64, device=dev).unsqueeze(0)
    probe = capture_block_inputs(model, lm.blocks[0], ids, 1, device=dev,
                                 hidden_dtype=next(model.parameters()).dtype)
    with torch.no_grad():
        return discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))


STRUCTURES = ("fair_calib", "quarot", "rtn")


def quantize(lm, groups, name: str, bits: int = 4, mode: str = "real") -> None:
    """``name``'s structure at its initialisation on the integer backend, every block: "fair_calib"
    (FlatQuant's: random orthogonal Kronecker factors, clip logits 4, o_proj's head_dim factor
    folded into v_proj), "quarot" (its online Hadamards) or "rtn" (plain per-token quantization)."""
    config = lm.model.config
    hd = config.hidden_size // config.num_attention_heads
    method = None if name == "quarot" else make_method({"type": name}, bits, bits, seed=0)
    if method is not None:
        method.prepare_model(lm)
    for i, block in enumerate(lm.blocks):   # each block on codes before the next is wrapped
        if method is None:
            _online_hadamards(block, groups, hd, bits)
        else:
            method.quantize_block(block, groups, None, i)
        lowbit.attach_block(block, mode)
    n = lowbit.fuse_inputs(lm)    # norms and SwiGLU products into their group's kernel
    emit({"kind": "inputs_fused", **n, "blocks": len(lm.blocks)})
    lm.model.eval()


def _online_hadamards(block, groups, hd: int, bits: int) -> None:
    """QuaRot's online part (no model rotation needed for speed): exact Hadamards online on the
    o_proj input (across heads) and the down_proj input (full width), per-token clip 1.0."""
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
            ql = QuantLinear(lin, inq, WeightQuantizer(lin.out_features, bits).to(dev), user=k)
            parent, _, leaf = n.rpartition(".")
            setattr(block.get_submodule(parent), leaf, ql)


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
