"""Adapters: families as data; the aligned, optionally window-only logits."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fair_calib.names import registry
from fair_calib.models.adapters import ADAPTERS, LoadedModel, get_adapter, get_module


def _tiny(family: str) -> LoadedModel:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      is_causal=False, tie_word_embeddings=False)
    return LoadedModel(LlamaForCausalLM(cfg).eval(), None, get_adapter(family), 39, 0, 1)


@pytest.mark.parametrize("family", ["tiny-llada", "tiny-dream"])
def test_keep_last_equals_slice_of_full_logits(family):
    lm = _tiny(family)
    ids = torch.randint(2, 39, (3, 12))
    with torch.no_grad():
        full = lm.logits(ids)
        for k in (1, 5, 12, 20):
            part = lm.logits(ids, keep_last=k)
            assert torch.allclose(part, full[:, -k:], atol=1e-5), k


def test_logit_shift_moves_predictions_one_position():
    llada, dream = _tiny("tiny-llada"), _tiny("tiny-dream")
    ids = torch.randint(2, 39, (2, 9))
    with torch.no_grad():
        raw, shifted = llada.logits(ids), dream.logits(ids)
    assert torch.equal(shifted[:, 1:], raw[:, :-1]) and torch.equal(shifted[:, 0], raw[:, 0])


def test_unknown_family_lists_the_registered_ones():
    with pytest.raises(KeyError, match="tiny-llada"):
        get_adapter("gpt2")


def test_paths_resolve_and_missing_path_is_named():
    lm = _tiny("tiny-llada")
    assert len(lm.blocks) == 2 and lm.head is lm.model.lm_head
    with pytest.raises(AttributeError, match="transformer"):
        get_module(lm.model, "model.transformer.blocks")


def test_registry_lists_every_adapter():
    assert set(registry.FAMILIES) == set(ADAPTERS)
