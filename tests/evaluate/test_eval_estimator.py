"""The Monte-Carlo masked likelihood estimators against exact enumeration of masks."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from fair_calib.evaluate.lm import (LikelihoodSettings, dream_iteration_losses, greedy_match,
                                    llada_iteration_losses, mc_loglikelihood, request_generator)

PREFIX = [4, 5, 6, 7, 8, 9]          # "Question : Answer what is the" in the tiny vocabulary
TARGET = [12, 20]                    # a two-token continuation


def masked_ce(loaded, prefix, target, mask):
    """CE of the target tokens at the masked target positions (mask: tuple of target indices)."""
    ids = torch.tensor([list(prefix) + [loaded.mask_id if i in mask else t
                                        for i, t in enumerate(target)]])
    logits = loaded.logits(ids)[0].double()
    return {i: float(F.cross_entropy(logits[len(prefix) + i:len(prefix) + i + 1],
                                     torch.tensor([target[i]]))) for i in mask}


def exact_llada(loaded, prefix, target, count_probs):
    """E[sum CE(masked) / (count / L)] with count ~ count_probs and a uniform mask of that size."""
    L = len(target)
    total = 0.0
    for count, pc in count_probs.items():
        masks = list(itertools.combinations(range(L), count))
        for m in masks:
            total += pc / len(masks) * sum(masked_ce(loaded, prefix, target, m).values()) / (count / L)
    return total


def estimator_count_probs(L, b):
    """Marginal distribution of a row's mask count under the reference's stratification."""
    probs = {}
    for k in range(1, L + 1):
        x = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), steps=b,
                                       dtype=torch.float64)).long()
        x = ((x - 1) % L) + 1
        for c in x.tolist():
            probs[c] = probs.get(c, 0.0) + 1.0 / (L * b)
    return probs


@torch.no_grad()
@pytest.mark.parametrize("b", [2, 16])
def test_llada_estimator_matches_exact_enumeration(tiny_llada, b):
    st = LikelihoodSettings("llada", mc_num=b * 200, batch_size=b)
    losses = llada_iteration_losses(tiny_llada, PREFIX, TARGET, st, request_generator(0, "t", b))
    est, se = float(losses.mean()), float(losses.std() / len(losses) ** 0.5)
    exact = exact_llada(tiny_llada, PREFIX, TARGET, estimator_count_probs(len(TARGET), b))
    assert se > 0
    assert abs(est - exact) < 4 * se, (est, exact, se)
    if b == 2:   # linspace(k, k+1, 2): counts exactly uniform, so this is the masked ELBO itself
        assert estimator_count_probs(2, 2) == {1: 0.5, 2: 0.5}


@torch.no_grad()
def test_llada_estimator_with_cfg_uses_guided_logits(tiny_llada):
    plain = LikelihoodSettings("llada", mc_num=32, batch_size=16)
    guided = LikelihoodSettings("llada", mc_num=32, batch_size=16, cfg_scale=0.5)
    a = mc_loglikelihood(tiny_llada, PREFIX, TARGET, plain, request_generator(0, "x"))[0]
    b = mc_loglikelihood(tiny_llada, PREFIX, TARGET, guided, request_generator(0, "x"))[0]
    assert a != b


@torch.no_grad()
def test_dream_estimator_matches_exact_integral(tiny_llada):
    eps = 1e-3
    st = LikelihoodSettings("dream", mc_num=16 * 300, batch_size=16, eps=eps)
    losses = dream_iteration_losses(tiny_llada, PREFIX, TARGET, st, request_generator(0, "d"))
    est, se = float(losses.mean()), float(losses.std() / len(losses) ** 0.5)
    # E_t sum_S p^|S| (1-p)^(L-|S|) sum_{i in S} CE_i(S) / p, p = (1-eps) t + eps, t ~ U[0, 1]:
    # single-token masks weigh (1-p), the full mask weighs p; E[p] = (1-eps)/2 + eps.
    ep = (1 - eps) / 2 + eps
    ce0, ce1 = masked_ce(tiny_llada, PREFIX, TARGET, (0,)), masked_ce(tiny_llada, PREFIX, TARGET, (1,))
    both = masked_ce(tiny_llada, PREFIX, TARGET, (0, 1))
    exact = (1 - ep) * (ce0[0] + ce1[1]) + ep * (both[0] + both[1])
    assert abs(est - exact) < 4 * se, (est, exact, se)


def test_estimates_are_seeded_and_greedy_is_argmax(tiny_llada):
    st = LikelihoodSettings("llada", mc_num=16, batch_size=8)
    a = mc_loglikelihood(tiny_llada, PREFIX, TARGET, st, request_generator(3, PREFIX, TARGET))
    b = mc_loglikelihood(tiny_llada, PREFIX, TARGET, st, request_generator(3, PREFIX, TARGET))
    c = mc_loglikelihood(tiny_llada, PREFIX, TARGET, st, request_generator(4, PREFIX, TARGET))
    assert a == b and a != c
    ids = torch.tensor([PREFIX + [tiny_llada.mask_id] * 2])
    argmax = tiny_llada.logits(ids)[0, len(PREFIX):].argmax(-1).tolist()
    assert greedy_match(tiny_llada, PREFIX, argmax)
    other = [(argmax[0] + 1) % 30 + 4, argmax[1]]
    assert not greedy_match(tiny_llada, PREFIX, other)
