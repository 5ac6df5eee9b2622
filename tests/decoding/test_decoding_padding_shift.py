"""Left-padding invariance, the logit shift, and the LLaDA-like module tree."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fair_calib.decoding import generate, make_policy
from fair_calib.models.adapters import LoadedModel, get_adapter, get_module

from decoding_helpers import MASK_ID, PAD_ID, VOCAB, load_llada_like


def gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("policy,temperature,extra", [
    ("low_confidence", 0.0, {"block_length": 4}),
    ("random", 0.9, {"block_length": 4}),
    ("random_commit", 0.0, {}),
    ("random_commit", 1.0, {}),
    ("entropy", 0.0, {}),
    ("topk_margin", 0.0, {}),
    ("maskgit_plus", 0.8, {"alg_temp": 0.3}),
    ("origin", 0.5, {}),
])
def test_padded_batch_equals_rows_alone(llada_tiny, dream_tiny, prompts, policy, temperature, extra):
    for model in (llada_tiny, dream_tiny):
        pol = make_policy(model, {"policy": policy, "steps": 4, "gen_length": 8,
                                  "temperature": temperature, **extra})
        seeds = [11, 12, 13]
        batched = generate(model, prompts, pol, generator=gens(seeds))
        for r, p in enumerate(prompts):
            alone = generate(model, [p], pol, generator=gens([seeds[r]]))
            assert torch.equal(batched[r], alone[0]), (policy, model.adapter.name, r)


class PositionOracle(nn.Module):
    """Raw logits at sequence index j favour token (j + 1) mod (VOCAB - 1): a next-token head."""

    def __init__(self):
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(max_position_embeddings=64)

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        b, n = input_ids.shape
        target = (torch.arange(n) + 1) % (VOCAB - 1)
        logits = torch.zeros(b, n, VOCAB) + self.dummy
        logits[:, torch.arange(n), target] = 10.0
        return SimpleNamespace(logits=logits)


def test_logit_shift_follows_adapter():
    oracle = PositionOracle()
    shifted = LoadedModel(oracle, None, get_adapter("tiny-dream"), MASK_ID, PAD_ID, None)
    plain = LoadedModel(oracle, None, get_adapter("tiny-llada"), MASK_ID, PAD_ID, None)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    raw = oracle(ids).logits
    assert torch.equal(plain.logits(ids), raw)
    assert torch.equal(shifted.logits(ids)[:, 1:], raw[:, :-1])
    assert torch.equal(shifted.logits(ids)[:, 0], raw[:, 0])
    prompt = [[1, 2, 3]]                            # window starts at sequence index 3
    for name in ("entropy", "low_confidence", "random_commit"):
        pol = make_policy({"policy": name, "steps": 4, "gen_length": 8})
        out_s = generate(shifted, prompt, pol, generator=torch.Generator().manual_seed(0))
        out_p = generate(plain, prompt, pol, generator=torch.Generator().manual_seed(0))
        idx = torch.arange(3, 11)
        assert out_s[0].tolist() == (idx % (VOCAB - 1)).tolist()          # token i from state i-1
        assert out_p[0].tolist() == ((idx + 1) % (VOCAB - 1)).tolist()    # token i from state i


def test_llada_like_paths_blocks_and_head():
    fx = load_llada_like()
    loaded = fx.make_loaded(vocab=48, n_layers=3)
    lm = loaded.model
    adapter = loaded.adapter
    blocks = get_module(lm, adapter.blocks_path)
    assert blocks is lm.model.transformer.blocks and len(blocks) == 3
    assert all(isinstance(b, fx.LLaDALikeBlock) for b in blocks)
    head = get_module(lm, adapter.head_path)
    assert head is loaded.head is lm.model.transformer.ff_out
    assert head.out_features == 48 and head.in_features == 32
    # the block-internal down-projections share the name but are not the head
    ff_outs = [m for n, m in lm.named_modules() if n.split(".")[-1] == "ff_out"]
    assert len(ff_outs) == 4
    assert all(b.ff_out is not head and b.ff_out.out_features == 32 for b in blocks)
    assert loaded.final_norm is lm.model.transformer.ln_f
    assert loaded.embed is lm.model.transformer.wte
    # recomputing through the adapter's modules gives the model's logits
    ids = torch.tensor([[3, 7, 1, 47, 47, 47]])
    pos = torch.arange(6)[None]
    with torch.no_grad():
        x = loaded.embed(ids)
        for b in loaded.blocks:
            x = b(x, pos, None)
        manual = loaded.head(loaded.final_norm(x))
        assert torch.allclose(manual, loaded.logits(ids), atol=1e-6)
    # the head fires once per forward with vocab-sized outputs, each block's ff_out once
    seen = []
    hooks = [head.register_forward_hook(lambda m, i, o: seen.append(("head", o.shape[-1])))]
    hooks += [b.ff_out.register_forward_hook(lambda m, i, o: seen.append(("down", o.shape[-1])))
              for b in blocks]
    loaded.logits(ids)
    for h in hooks:
        h.remove()
    assert seen == [("down", 32)] * 3 + [("head", 48)]


def test_llada_like_decodes_with_padding():
    fx = load_llada_like()
    loaded = fx.make_loaded(vocab=48)
    pol = make_policy(loaded, {"steps": 8, "gen_length": 8, "block_length": 4})
    assert pol.name == "low_confidence"
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8]]
    out = generate(loaded, prompts, pol)
    assert out.shape == (2, 8) and not bool((out == loaded.mask_id).any())
    for r, p in enumerate(prompts):
        assert torch.equal(out[r], generate(loaded, [p], pol)[0])


class NoPositionIds(nn.Module):
    """Forward without ``position_ids`` (like LLaDA's remote code): padded batches must work."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids, attention_mask)


def test_forward_without_position_ids_decodes_padded_batch():
    fx = load_llada_like()
    base = fx.make_loaded(vocab=48)
    loaded = LoadedModel(NoPositionIds(base.model), None, base.adapter, base.mask_id, base.pad_id, None)
    pol = make_policy(loaded, {"steps": 4, "gen_length": 8, "block_length": 8})
    out = generate(loaded, [[1, 2, 3, 4], [5]], pol)
    assert out.shape == (2, 8) and not bool((out == loaded.mask_id).any())
