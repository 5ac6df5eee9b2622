"""Tiny models for the decoding tests (random weights, no tokenizer)."""
from __future__ import annotations


import torch

from fair_calib.models.adapters import LoadedModel, get_adapter

VOCAB = 40
MASK_ID, PAD_ID, EOS_ID = 39, 38, 37


def tiny_llama(family: str = "tiny-llada", seed: int = 0, max_pos: int = 64) -> LoadedModel:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_pos,
                      is_causal=False, use_cache=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    # sharpen the head a little so argmax / confidences are not all near-uniform ties
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return LoadedModel(model=model, tokenizer=None, adapter=get_adapter(family), mask_id=MASK_ID,
                       pad_id=PAD_ID, eos_id=EOS_ID)


def load_llada_like():
    import fixtures.llada_like as module

    return module

