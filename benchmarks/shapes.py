"""Random weights at the real LLaDA-8B (a bidirectional Llama: no GQA, untied head) and Dream-7B
(a bidirectional Qwen2: q/k/v bias, GQA) shapes, where speed and memory depend only on the
shapes; the GPU benchmarks' quantized structures on them, built with the pipeline's own modules
and fused as ``load_quantized`` fuses them; one JSON line per measurement (:func:`emit`)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from fair_calib.methods import make_method
from fair_calib.quant import lowbit
from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups
from fair_calib.quant.hadamard import KronRotation
from fair_calib.quant.qlinear import InputQuant, QuantLinear
from fair_calib.quant.quantizers import ActQuantizer, WeightQuantizer

SHAPES = {
    "llada-8b": dict(cls="llama", hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=32, vocab_size=126464,
                     rope_theta=500000.0, max_position_embeddings=4096, rms_norm_eps=1e-5,
                     adapter="tiny-llada", mask_id=126336),
    "dream-7b": dict(cls="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                     num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                     rope_theta=1000000.0, max_position_embeddings=2048, rms_norm_eps=1e-6,
                     adapter="tiny-dream", mask_id=151666),
}
STRUCTURES = ("fair_calib", "quarot", "rtn")


def build(shape: str, layers: int | None = None, device: str = "cuda",
          dtype: torch.dtype = torch.bfloat16, authors_rotary: bool = False):
    """A LoadedModel of random weights at ``shape`` (optionally with fewer layers);
    ``authors_rotary``: LLaDA's hub loading rotates q and k in float32 (``hub.load_native_model``
    sets the attention implementation that casts them back); Dream's has no such rotary."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from fair_calib.models.adapters import LoadedModel, get_adapter

    spec = dict(SHAPES[shape])
    cls, adapter, mask_id = spec.pop("cls"), spec.pop("adapter"), spec.pop("mask_id")
    spec["num_hidden_layers"] = layers or spec["num_hidden_layers"]
    config_cls, model_cls = ((LlamaConfig, LlamaForCausalLM) if cls == "llama"
                             else (Qwen2Config, Qwen2ForCausalLM))
    config = config_cls(**spec, is_causal=False, tie_word_embeddings=False)
    config.use_cache = False
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(config)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    if authors_rotary and shape == "llada-8b":
        from fair_calib.models import hub
        model.set_attn_implementation(hub.register_float32_rotary_attention())
        hub.use_authors_rotary(model, True, True)
    return LoadedModel(model=model, tokenizer=None, adapter=get_adapter(adapter), mask_id=mask_id,
                       pad_id=0, eos_id=1)


def cuda_time(fn, warmup: int = 2, iters: int = 5) -> float:
    """Mean seconds per call, synchronised."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def matmul_tflops(n: int = 8192, dtype=torch.bfloat16) -> float:
    """Measured dense bf16 matrix-multiply throughput (the physical anchor for utilisation)."""
    a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
    return 2 * n ** 3 / cuda_time(lambda: a @ b, warmup=3, iters=10) / 1e12


def forward_flops(shape: str, batch: int, seq: int, layers: int | None = None) -> float:
    """Matmul FLOPs of one forward (linears + attention scores/values + LM head)."""
    s = SHAPES[shape]
    h, i, L = s["hidden_size"], s["intermediate_size"], layers or s["num_hidden_layers"]
    kv = h * s["num_key_value_heads"] // s["num_attention_heads"]
    tokens = batch * seq
    per_layer = 2 * tokens * (h * h + 2 * h * kv + h * h + 3 * h * i) + 4 * batch * seq * seq * h
    return L * per_layer + 2 * tokens * h * s["vocab_size"]


def ids_for(shape: str, batch: int, seq: int, dev: str, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, SHAPES[shape]["vocab_size"] - 2, (batch, seq), generator=gen).to(dev)


def emit(rec: dict, name: str = "benchmarks") -> None:
    """Print one JSON line; with ``OUT`` set (the device tool's folder), also append it to
    ``$OUT/<name>.jsonl``, which comes back whole where the console's tail is cut."""
    line = json.dumps(rec)
    print(line, flush=True)
    if os.environ.get("OUT"):
        with open(Path(os.environ["OUT"]) / f"{name}.jsonl", "a") as f:
            f.write(line + "\n")


def block_groups(lm, dev: str):
    probe = capture_block_inputs(lm.model, lm.blocks[0], torch.arange(64, device=dev)[None], 1,
                                 device=dev, hidden_dtype=next(lm.model.parameters()).dtype)
    with torch.no_grad():
        return discover_groups(lm.blocks[0], lambda: call_block(lm.blocks[0], probe, 0))


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
        name, rot = g.names[0], None
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


def to_byte_storage(lm) -> None:
    """4-bit codes one per byte (the GEMM's operand dtype), what ``load_quantized`` stores on
    CUDA by default."""
    from fair_calib.quant import lowbit_triton

    for m in lm.model.modules():
        if isinstance(m, lowbit.LowBitLinear) and m.packed:
            m.qweight = lowbit_triton.unpack_int4(m.qweight, m.in_features, m.code_dtype)
            m.packed = False
