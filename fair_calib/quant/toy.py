"""Tiny random transformers models wrapped as ``LoadedModel`` (tests and smoke runs)."""
from __future__ import annotations

import torch


def tiny_random_loaded(arch: str = "llama", hidden: int = 64, layers: int = 2, heads: int = 4,
                       kv_heads: int | None = None, intermediate: int = 96, vocab: int = 64,
                       seed: int = 0, family: str = "tiny-llada", init_range: float = 0.1):
    """A random bidirectional (``is_causal=False``) Llama/Qwen2 LM as a ``LoadedModel``."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from ..models.adapters import LoadedModel, get_adapter

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                  intermediate_size=intermediate, max_position_embeddings=256,
                  tie_word_embeddings=False, initializer_range=init_range)
    if arch == "llama":
        cfg = LlamaConfig(**common)
        cls = LlamaForCausalLM
    elif arch == "qwen2":
        cfg = Qwen2Config(**common)
        cls = Qwen2ForCausalLM
    else:
        raise ValueError(f"unknown arch {arch!r}")
    cfg.is_causal = False
    cfg.use_cache = False
    model = cls(cfg).eval()
    # Make the random model less trivial: non-unit norm weights, a few outlier channels.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
        emb = model.get_input_embeddings().weight
        emb[:, : max(1, hidden // 16)] *= 8.0
    return LoadedModel(model=model, tokenizer=None, adapter=get_adapter(family),
                       mask_id=vocab - 1, pad_id=vocab - 2, eos_id=vocab - 3)
