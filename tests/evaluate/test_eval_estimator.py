"""The masked likelihood estimators against the authors' masking and exact enumeration."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from fair_calib.evaluate.likelihood import (LikelihoodSettings, dream_iteration_losses, dream_noise,
                                            exact_loglikelihoods, greedy_match,
                                            llada_iteration_losses, llada_mask_counts,
                                            mc_loglikelihood, request_generator)

PREFIX = [4, 5, 6, 7, 8, 9]          # "Question : Answer what is the" in the tiny vocabulary
TARGET = [12, 20]                    # a two-token continuation
EOS = 2


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


def authors_mask_counts(k, L, b):
    """``forward_process`` of the authors' get_log_likelihood.py (and eval_llada.py) for draw
    ``k``: there ``k = torch.randint(1, L + 1, ())``, an int64 0-dim tensor, ``L`` a Python
    int, and torch.linspace runs in the default float32."""
    k = torch.tensor(k, dtype=torch.int64)
    x = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), steps=b)).long()
    return ((x - 1) % L) + 1


def estimator_count_probs(L, b):
    """Marginal distribution of a row's mask count under the reference's stratification."""
    probs = {}
    for k in range(1, L + 1):
        for c in authors_mask_counts(k, L, b).tolist():
            probs[c] = probs.get(c, 0.0) + 1.0 / (L * b)
    return probs


def exact_dream(loaded, prefix, target, eps, grid=20000):
    """Dream's expected loss by enumeration: every pattern S of the maskable target positions
    (all but the sequence's last, the EOS) weighs E_p[p^|S| (1-p)^(n-|S|) / p], p uniform on
    [eps, 1) (midpoint rule on a fine grid: independent of the code under test)."""
    maskable = list(range(len(target) - 1))
    n = len(maskable)
    p = eps + (1 - eps) * (torch.arange(grid, dtype=torch.float64) + 0.5) / grid
    total = 0.0
    for m in range(1, n + 1):
        w = float((p ** (m - 1) * (1 - p) ** (n - m)).mean())
        for S in itertools.combinations(maskable, m):
            total += w * sum(masked_ce(loaded, prefix, target, S).values())
    return total


def authors_dream_forward_process(b, length, eps):
    """DreamLM/Dream eval/eval.py ``_forward_process`` random calls, on the global CPU RNG."""
    u0 = torch.rand(1, dtype=torch.float32)
    t = (u0 + torch.arange(b).float() / b) % 1
    p_mask = ((1 - eps) * t + eps)[:, None].repeat(1, length)
    mask = torch.rand((b, length)) < p_mask
    mask[:, 0] = False
    mask[:, -1] = False
    return mask, p_mask[:, 0]


@torch.no_grad()
@pytest.mark.parametrize("b", [2, 6, 16])
def test_llada_estimator_matches_exact_enumeration(tiny_llada, b):
    st = LikelihoodSettings("llada", mc_num=b * 200, batch_size=b)
    losses = llada_iteration_losses(tiny_llada, PREFIX, TARGET, st, request_generator(0, "t", b))
    est, se = float(losses.mean()), float(losses.std() / len(losses) ** 0.5)
    exact = exact_llada(tiny_llada, PREFIX, TARGET, estimator_count_probs(len(TARGET), b))
    assert se > 0
    assert abs(est - exact) < 4 * se, (est, exact, se)
    # exact mode computes the same expectation, with no sampling
    ex = exact_loglikelihoods(tiny_llada, [(PREFIX, TARGET)], st)[0]
    assert ex == pytest.approx(-exact, rel=1e-5)
    if b == 2:   # linspace(k, k+1, 2): counts exactly uniform, so this is the masked ELBO itself
        assert estimator_count_probs(2, 2) == {1: 0.5, 2: 0.5}


def test_llada_mask_counts_are_the_authors_for_every_row_count():
    """Their end point is a float32 tensor (int64 k + a Python float); b = 6, L = 5, k = 5
    is one of the cases where a float64 end point would give [5, 1, 2, 3, 3, 4]."""
    assert llada_mask_counts(5, 5, 6).tolist() == [5, 1, 2, 2, 3, 4]
    for b in range(1, 65):
        for L in (1, 2, 3, 5, 7, 8, 13, 32, 100):
            for k in range(1, L + 1):
                assert torch.equal(llada_mask_counts(k, L, b), authors_mask_counts(k, L, b)), \
                    (k, L, b)


def test_llada_row_count_changes_the_expectation():
    """Why rows must be lm-eval's batch size: the count distribution depends on it."""
    assert estimator_count_probs(3, 8) != estimator_count_probs(3, 32)


@torch.no_grad()
def test_llada_estimator_with_cfg_uses_guided_logits(tiny_llada):
    plain = LikelihoodSettings("llada", mc_num=32, batch_size=16)
    guided = LikelihoodSettings("llada", mc_num=32, batch_size=16, cfg_scale=0.5)
    a = mc_loglikelihood(tiny_llada, PREFIX, TARGET, plain, request_generator(0, "x"))[0]
    b = mc_loglikelihood(tiny_llada, PREFIX, TARGET, guided, request_generator(0, "x"))[0]
    assert a != b


@pytest.mark.parametrize("seed,b,length", [(0, 32, 9), (7, 5, 3), (3, 8, 1 + 1)])
def test_dream_draws_are_the_authors_masks(seed, b, length):
    """Same random calls as eval.py: identical masks and rates under a shared seed."""
    torch.manual_seed(seed)
    ref_mask, ref_p = authors_dream_forward_process(b, length, 1e-3)
    mask, p = dream_noise(b, length, 1e-3, torch.Generator().manual_seed(seed))
    assert torch.equal(mask, ref_mask) and torch.equal(p, ref_p)


@torch.no_grad()
def test_dream_estimator_matches_exact_enumeration(tiny_llada):
    """EOS appended, never masked or scored; p = (1-eps) t + eps with stratified t."""
    eps = 1e-3
    target = TARGET + [EOS]
    st = LikelihoodSettings("dream", mc_num=16 * 300, batch_size=16, eps=eps)
    losses = dream_iteration_losses(tiny_llada, PREFIX, target, st, request_generator(0, "d"))
    est, se = float(losses.mean()), float(losses.std() / len(losses) ** 0.5)
    exact = exact_dream(tiny_llada, PREFIX, target, eps)
    assert abs(est - exact) < 4 * se, (est, exact, se)
    ex = exact_loglikelihoods(tiny_llada, [(PREFIX, target)], st)[0]
    assert ex == pytest.approx(-exact, rel=1e-4)
    # scoring EOS like a target token (the old behaviour) is far outside the noise
    eos_ce = masked_ce(tiny_llada, PREFIX, target, (2,))[2]
    assert eos_ce > 20 * se


@torch.no_grad()
@pytest.mark.parametrize("estimator", ["llada", "dream"])
def test_exact_mode_equals_mean_of_many_mc_runs(tiny_llada, estimator):
    target = [12, 20, 7] + ([EOS] if estimator == "dream" else [])
    st = LikelihoodSettings(estimator, mc_num=8, batch_size=8, exact_below=8)
    runs = torch.tensor([mc_loglikelihood(tiny_llada, PREFIX, target, st,
                                          request_generator(r, "many"))[0] for r in range(300)])
    mean, se = float(runs.mean()), float(runs.std() / math.sqrt(len(runs)))
    exact = exact_loglikelihoods(tiny_llada, [(PREFIX, target)], st)[0]
    assert se > 0 and abs(mean - exact) < 4 * se, (mean, exact, se)


@torch.no_grad()
def test_llada_single_token_exact_is_the_mc_value_and_shares_forwards(tiny_llada, monkeypatch):
    """L = 1: every MC sample is the same pattern, so exact mode changes no number; a
    question's choices read one forward."""
    st = LikelihoodSettings("llada", mc_num=16, batch_size=8, exact_below=2)
    choices = [[12], [13], [14], [15]]
    mc = [mc_loglikelihood(tiny_llada, PREFIX, c, st, request_generator(0, c))[0] for c in choices]
    calls = []
    real = tiny_llada.model.forward
    monkeypatch.setattr(tiny_llada.model, "forward", lambda *a, **k: calls.append(1) or real(*a, **k))
    ex = exact_loglikelihoods(tiny_llada, [(PREFIX, c) for c in choices], st)
    assert ex == pytest.approx(mc, abs=1e-5)
    assert len(calls) == 1


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


@torch.no_grad()
def test_dream_one_token_target_exact_is_one_forward_within_the_mc_error():
    """Dream, one-token choice (EOS appended, never masked): each MC row contributes
    CE / p when its one token is masked (probability p) and 0 otherwise, so the estimator's
    expectation is CE itself, from the single forward of [context | MASK | EOS]. Exact mode
    (``exact_below: 2``, the paper config's Dream setting) returns exactly that, and the
    authors' sampled estimator lies within its standard error of it."""
    from tiny_eval_helpers import make_loaded
    loaded = make_loaded("tiny-dream")
    token, target = 12, [12, EOS]
    ids = torch.tensor([PREFIX + [loaded.mask_id, EOS]])
    analytic = float(torch.log_softmax(loaded.logits(ids)[0, len(PREFIX)].double(), -1)[token])
    exact_st = LikelihoodSettings("dream", mc_num=128, batch_size=32, exact_below=2)
    calls = []
    real = loaded.model.forward
    loaded.model.forward = lambda *a, **k: calls.append(1) or real(*a, **k)
    exact = exact_loglikelihoods(loaded, [(PREFIX, target), (PREFIX, [13, EOS])], exact_st)[0]
    loaded.model.forward = real
    assert exact == pytest.approx(analytic, rel=1e-6, abs=1e-9)
    assert len(calls) == 1                       # both choices read the same forward
    mc_st = LikelihoodSettings("dream", mc_num=32 * 64, batch_size=32, exact_below=0)
    est, se = mc_loglikelihood(loaded, PREFIX, target, mc_st, request_generator(0, "one-token"))
    assert se > 0 and abs(est - exact) < se, (est, exact, se)      # 0.42 se here
