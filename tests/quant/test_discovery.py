import pytest
import torch

from fair_calib.quant.blockio import call_block, capture_block_inputs
from fair_calib.quant.discovery import discover_groups, groups_from_json, groups_to_json
from fair_calib.quant.toy import tiny_random_loaded
from fixtures.llada_like import make_loaded as llada_like_loaded

torch.set_num_threads(1)


def _groups(loaded, block_index=0):
    ids = torch.randint(0, 40, (2, 12))
    inputs = capture_block_inputs(loaded.model, loaded.blocks[0], ids, 2)
    block = loaded.blocks[block_index]
    return discover_groups(block, lambda: call_block(block, inputs, 0)), inputs


@pytest.mark.parametrize("arch,kv", [("llama", None), ("qwen2", 2)])
def test_discovery_transformers_blocks(arch, kv):
    loaded = tiny_random_loaded(arch, kv_heads=kv)
    groups, inputs = _groups(loaded, 1)
    assert [g.names for g in groups] == [
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
        ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",)]
    assert [g.in_features for g in groups] == [64, 64, 64, 96]
    assert groups_from_json(groups_to_json(groups)) == groups
    # the captured kwargs make the block reproduce the model's own computation
    h = inputs.hidden[0]
    out = call_block(loaded.blocks[0], inputs, 0)
    assert out.shape == h.shape and not torch.allclose(out, h)


def test_discovery_llada_named_block():
    loaded = llada_like_loaded()
    groups, inputs = _groups(loaded)
    assert [g.names for g in groups] == [("q_proj", "k_proj", "v_proj"), ("attn_out",),
                                         ("ff_proj", "up_proj"), ("ff_out",)]
    # positional extra args (positions, key mask) were captured
    assert inputs.hidden_key == 0 and len(inputs.args[0]) == 2


def test_capture_reproduces_full_forward():
    loaded = tiny_random_loaded("llama", layers=2)
    ids = torch.randint(0, 60, (3, 10))
    inputs = capture_block_inputs(loaded.model, loaded.blocks[0], ids, 2)
    assert [h.shape[0] for h in inputs.hidden] == [2, 1]
    with torch.no_grad():
        want = loaded.model.model(input_ids=ids).last_hidden_state
        hs = []
        for b in range(len(inputs)):
            h = inputs.hidden[b]
            for blk in loaded.blocks:
                h = call_block(blk, inputs, b, h)
            hs.append(loaded.final_norm(h))
    assert torch.allclose(torch.cat(hs), want, atol=1e-5)
