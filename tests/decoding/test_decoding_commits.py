"""Exact commit counts, monotonicity, determinism and validation of every policy."""
from __future__ import annotations

import pytest
import torch

from fair_calib.decoding import DecodePolicy, generate, make_policy
from fair_calib.names.registry import POLICIES

from decoding_helpers import MASK_ID


class StepLog:
    """Keeps every step's masks and window (test-only recorder)."""

    def start(self, batch, gen_length, steps):
        self.shape, self.steps_total, self.steps = (batch, gen_length), steps, []

    def step(self, t, logits, masked, committed, window):
        self.steps.append((t, masked.clone(), committed.clone(), window.clone(), logits.clone()))

    def finish(self, tokens):
        self.tokens = tokens.clone()


def check_monotone(log: StepLog) -> None:
    b, k = log.shape
    prev = torch.full((b, k), MASK_ID)
    assert [s[0] for s in log.steps] == list(range(log.steps_total, 0, -1))
    for t, masked, committed, window, _ in log.steps:
        assert torch.equal(masked, prev == MASK_ID)               # state seen = previous state
        assert not bool((committed & ~masked).any())             # only masked positions commit
        kept = prev != MASK_ID
        assert torch.equal(window[kept], prev[kept])              # commits are never undone
        assert torch.equal(window != MASK_ID, kept | committed)
        prev = window
    assert not bool((prev == MASK_ID).any())
    assert torch.equal(prev, log.tokens)


@pytest.mark.parametrize("name", ["low_confidence", "random"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_block_policy_counts(llada_tiny, prompts, name, temperature):
    # 10 tokens in 2 blocks of 5, 3 steps per block: counts [2, 2, 1] per block, per row
    pol = DecodePolicy(name=name, steps=6, gen_length=10, block_length=5, temperature=temperature)
    log = StepLog()
    generate(llada_tiny, prompts, pol, generator=torch.Generator().manual_seed(0), recorder=log)
    check_monotone(log)
    expected = [2, 2, 1, 2, 2, 1]
    for j, (t, masked, committed, window, _) in enumerate(log.steps):
        assert committed.sum(-1).tolist() == [expected[j]] * len(prompts)
        blk = j // 3
        outside = torch.ones(10, dtype=torch.bool)
        outside[blk * 5:(blk + 1) * 5] = False
        assert not bool(committed[:, outside].any())              # semi-autoregressive blocks


def test_block_counts_uneven_remainder(llada_tiny, prompts):
    # 8 tokens, one block, 3 steps: base 2, remainder 2 -> [3, 3, 2]
    pol = make_policy(llada_tiny, {"steps": 3, "gen_length": 8, "block_length": 8})
    log = StepLog()
    generate(llada_tiny, prompts, pol, recorder=log)
    check_monotone(log)
    assert [s[2].sum(-1).tolist() for s in log.steps] == [[3] * 3, [3] * 3, [2] * 3]


@pytest.mark.parametrize("steps,expected", [(4, [3, 3, 2, 2]), (13, [1] * 10 + [0] * 3)])
def test_random_commit_counts(dream_tiny, prompts, steps, expected):
    pol = DecodePolicy(name="random_commit", steps=steps, gen_length=10)
    log = StepLog()
    generate(dream_tiny, prompts, pol, generator=torch.Generator().manual_seed(1), recorder=log)
    check_monotone(log)
    assert [s[2].sum(-1).tolist() for s in log.steps] == [[c] * 3 for c in expected]
    # tokens at temperature 0 are the argmax of the step's logits
    for t, masked, committed, window, logits in log.steps:
        assert torch.equal(window[committed], logits.argmax(-1)[committed])


def dream_expected_counts(k: int, steps: int, eps: float) -> list[int]:
    ts = torch.linspace(1, eps, steps + 1)
    left, out = k, []
    for i in range(steps):
        if i == steps - 1:
            n = left
        else:
            n = int(torch.tensor(float(left)) * (1 - ts[i + 1] / ts[i]))
        out.append(n)
        left -= n
    return out


@pytest.mark.parametrize("name", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("steps", [4, 7])
def test_schedule_policy_counts(dream_tiny, prompts, name, steps):
    pol = make_policy(dream_tiny, {"policy": name, "steps": steps, "gen_length": 12})
    log = StepLog()
    generate(dream_tiny, prompts, pol, recorder=log)
    check_monotone(log)
    exp = dream_expected_counts(12, steps, 1e-3)
    assert sum(exp) == 12
    assert [s[2].sum(-1).tolist() for s in log.steps] == [[c] * 3 for c in exp]
    # top-k by the policy's confidence among masked positions
    for t, masked, committed, window, logits in log.steps:
        p = torch.softmax(logits, -1)
        if name == "maskgit_plus":
            conf = p.max(-1).values
        elif name == "topk_margin":
            v = p.topk(2, -1).values
            conf = v[..., 0] - v[..., 1]
        else:
            conf = (p * torch.log(p + 1e-10)).sum(-1)
        for r in range(3):
            if committed[r].any() and (masked[r] & ~committed[r]).any():
                assert conf[r][committed[r]].min() >= conf[r][masked[r] & ~committed[r]].max() - 1e-6


def test_schedule_alg_temp_and_origin(dream_tiny, prompts):
    pol = make_policy(dream_tiny, {"steps": 5, "gen_length": 12, "alg_temp": 0.5, "temperature": 0.8,
                                   "top_p": 0.9, "top_k": 10})
    log = StepLog()
    generate(dream_tiny, prompts, pol, generator=torch.Generator().manual_seed(3), recorder=log)
    check_monotone(log)
    assert [s[2].sum(-1).tolist() for s in log.steps] == [[c] * 3 for c in dream_expected_counts(12, 5, 1e-3)]
    pol = make_policy(dream_tiny, {"policy": "origin", "steps": 5, "gen_length": 12})
    log = StepLog()
    generate(dream_tiny, prompts, pol, generator=torch.Generator().manual_seed(3), recorder=log)
    check_monotone(log)


def test_top_k_restricts_sampled_tokens(dream_tiny, prompts):
    pol = make_policy(dream_tiny, {"steps": 4, "gen_length": 8, "temperature": 5.0, "top_k": 1})
    log = StepLog()
    generate(dream_tiny, prompts, pol, generator=torch.Generator().manual_seed(0), recorder=log)
    for t, masked, committed, window, logits in log.steps:   # top_k=1 makes sampling greedy
        assert torch.equal(window[committed], logits.argmax(-1)[committed])


@pytest.mark.parametrize("name", ["low_confidence", "entropy", "topk_margin", "maskgit_plus"])
def test_deterministic_at_temperature_zero(llada_tiny, prompts, name):
    pol = make_policy(llada_tiny, {"policy": name, "steps": 4, "gen_length": 8, "block_length": None})
    a = generate(llada_tiny, prompts, pol)
    torch.manual_seed(999)
    b = generate(llada_tiny, prompts, pol)
    assert torch.equal(a, b)


def test_same_seed_same_sample(llada_tiny, prompts):
    pol = DecodePolicy(name="random", steps=8, gen_length=8, block_length=4, temperature=1.0)
    a = generate(llada_tiny, prompts, pol, generator=torch.Generator().manual_seed(5))
    b = generate(llada_tiny, prompts, pol, generator=torch.Generator().manual_seed(5))
    c = generate(llada_tiny, prompts, pol, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


class CountingModel:
    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def logits(self, ids, attn=None):
        self.calls += 1
        return self.inner.logits(ids, attn)


def test_validation_before_forward(llada_tiny, prompts):
    with pytest.raises(ValueError, match="bogus.*low_confidence"):
        make_policy(llada_tiny, {"policy": "bogus"})
    for p in POLICIES:                                  # every registered policy is accepted
        make_policy(llada_tiny, {"policy": p, "steps": 8, "gen_length": 8})
    with pytest.raises(ValueError, match="gen_length=10 is not divisible by block_length=4"):
        make_policy(llada_tiny, {"gen_length": 10, "block_length": 4, "steps": 10})
    with pytest.raises(ValueError, match="steps=5 do not divide among 2 blocks"):
        make_policy(llada_tiny, {"gen_length": 8, "block_length": 4, "steps": 5})
    with pytest.raises(ValueError, match="unknown decoding settings.*'nope'"):
        make_policy(llada_tiny, {"nope": 1})
    # context: tiny model has max_position_embeddings 64; 8 + 60 > 64
    counting = CountingModel(llada_tiny)
    pol = make_policy(llada_tiny, {"gen_length": 60, "block_length": 60, "steps": 60})
    with pytest.raises(ValueError, match="prompt length 8 .*exceeds the model context.*64"):
        generate(counting, prompts, pol)
    assert counting.calls == 0
    # the adapter defaults themselves are valid policies
    assert make_policy(llada_tiny).name == "low_confidence"


def test_cfg_logits(llada_tiny, prompts):
    pol = make_policy(llada_tiny, {"steps": 2, "gen_length": 4, "block_length": 4, "cfg_scale": 1.5})
    log = StepLog()
    generate(llada_tiny, prompts[:1], pol, recorder=log)
    t, masked, committed, window, logits = log.steps[0]
    p = prompts[0]
    cond = llada_tiny.logits(torch.tensor([p + [MASK_ID] * 4]))[:, len(p):]
    un = llada_tiny.logits(torch.tensor([[MASK_ID] * len(p) + [MASK_ID] * 4]))[:, len(p):]
    expected = un + 2.5 * (cond - un)               # the model's logits, mask token included
    assert torch.allclose(logits, expected, atol=1e-5)
    # and the guided logits drive the commits
    assert torch.equal(window[committed], logits.argmax(-1)[committed])


def test_registry_lists_exactly_the_implemented_policies():
    from fair_calib.decoding import policies

    assert set(policies.POLICIES) == set(POLICIES)


def test_make_policy_merging(llada_tiny, dream_tiny):
    # a block length inherited from the adapter is dropped for whole-window policies ...
    pol = make_policy(llada_tiny, {"policy": "random_commit", "steps": 32, "gen_length": 32,
                                   "block_length": None})
    assert pol.block_length is None and pol.num_blocks == 1
    pol = make_policy(llada_tiny, {"name": "entropy", "steps": 16, "gen_length": 32})
    assert pol.name == "entropy" and pol.block_length is None
    # ... kept for block policies, and an explicit one is validated
    assert make_policy(llada_tiny, {"steps": 32, "gen_length": 32}).block_length == 8
    with pytest.raises(ValueError, match="block_length=8 must be unset or equal gen_length=32"):
        make_policy(llada_tiny, {"policy": "entropy", "steps": 32, "gen_length": 32, "block_length": 8})
    # adapter defaults carry through (Dream's eps / alg_temp)
    pol = make_policy(dream_tiny, steps=8, gen_length=8)
    assert (pol.name, pol.eps, pol.alg_temp) == ("entropy", 1e-3, 0.0)
    assert make_policy(dream_tiny.adapter.decoding, {"steps": 8.0, "gen_length": 8}).steps == 8
