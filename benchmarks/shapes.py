"""Random weights at the real LLaDA-8B (a bidirectional Llama: no GQA, untied head) and Dream-7B
(a bidirectional Qwen2: q/k/v bias, GQA) shapes; speed and memory depend only on the shapes."""
from __future__ import annotations

import time

import torch

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


# LLaDA's hub checkpoints rotate q and k in float32 (``rope_full_precision``), as
# ``fair_calib.models.hub`` loads them; ``build(..., authors_rotary=True)`` does the same
AUTHORS_ROTARY = {"llada-8b": True}


def build(shape: str, layers: int | None = None, device: str = "cuda",
          dtype: torch.dtype = torch.bfloat16, authors_rotary: bool = False):
    """A LoadedModel of random weights at ``shape`` (optionally with fewer layers);
    ``authors_rotary``: the rotary of the shape's hub loading (LLaDA: float32 q and k, the
    attention implementation that casts them back), as ``hub.load_native_model`` sets it."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from fair_calib.models.adapters import LoadedModel, get_adapter

    spec = dict(SHAPES[shape])
    cls, adapter, mask_id = spec.pop("cls"), spec.pop("adapter"), spec.pop("mask_id")
    if layers is not None:
        spec["num_hidden_layers"] = layers
    if cls == "llama":
        config, model_cls = LlamaConfig(**spec, is_causal=False, tie_word_embeddings=False), LlamaForCausalLM
    else:
        config, model_cls = Qwen2Config(**spec, is_causal=False, tie_word_embeddings=False), Qwen2ForCausalLM
    config.use_cache = False
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = model_cls(config)
    finally:
        torch.set_default_dtype(prev)
    model.eval()
    if authors_rotary and AUTHORS_ROTARY.get(shape):
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
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    sec = cuda_time(lambda: a @ b, warmup=3, iters=10)
    return 2 * n ** 3 / sec / 1e12


def forward_flops(shape: str, batch: int, seq: int, layers: int | None = None) -> float:
    """Matmul FLOPs of one forward (linears + attention scores/values + LM head)."""
    s = SHAPES[shape]
    h, i, L = s["hidden_size"], s["intermediate_size"], layers or s["num_hidden_layers"]
    kv = h * s["num_key_value_heads"] // s["num_attention_heads"]
    tokens = batch * seq
    per_layer = 2 * tokens * (h * h + 2 * h * kv + h * h + 3 * h * i) + 4 * batch * seq * seq * h
    return L * per_layer + 2 * tokens * h * s["vocab_size"]
