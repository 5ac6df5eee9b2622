"""Tiny models for the decoding tests (random weights, no tokenizer)."""
from __future__ import annotations


import torch

from fair_calib.models.adapters import LoadedModel, get_adapter

VOCAB = 40
MASK_ID, PAD_ID, EOS_ID = 39, 38, 37


def tiny_llama(family: str = "tiny-llada", seed: int = 0, max_pos: int = 64,
               mask_bias: float = -30.0) -> LoadedModel:
    """A random bidirectional Llama. As a trained model, it gives the mask token ~0 probability
    (a head bias of ``mask_bias`` = -30 there): random weights would otherwise make the mask
    the argmax of some positions, which the decoders commit as the authors' do (tests of that
    rule pass a bias that favours the mask)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_pos,
                      is_causal=False, use_cache=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    # sharpen the head a little so argmax / confidences are not all near-uniform ties
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
        model.lm_head.bias = torch.nn.Parameter(torch.zeros(VOCAB))
        model.lm_head.bias[MASK_ID] = mask_bias
    return LoadedModel(model=model, tokenizer=None, adapter=get_adapter(family), mask_id=MASK_ID,
                       pad_id=PAD_ID, eos_id=EOS_ID)


def load_llada_like():
    import fixtures.llada_like as module

    return module

