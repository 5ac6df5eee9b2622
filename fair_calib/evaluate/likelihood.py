"""Monte-Carlo masked likelihood estimators of the model authors (LLaDA, Dream).

Kept apart from the lm-eval model class so GPU benchmarks and other stages can use them on
machines without lm-eval. See ``fair_calib.evaluate.lm`` for the estimator definitions.
"""
from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from fair_calib.models.adapters import LoadedModel

LIKELIHOOD_ESTIMATORS = ("llada", "dream")
SETTING_KEYS = ("estimator", "mc_num", "batch_size", "cfg_scale", "eps", "append_eos",
                "exact_below")


@dataclass(frozen=True)
class LikelihoodSettings:
    """``batch_size`` is the number of rows per forward, as in the authors' harnesses, where it is
    lm-eval's ``--batch_size`` (8 in LLaDA's script, 32 in Dream's); the mask-count
    distribution, hence the expected value, depends on it. ``exact_below``: targets with fewer
    maskable tokens than this are scored by exact enumeration of every mask pattern, weighted
    by the estimator's own pattern distribution for ``batch_size`` rows (0: never)."""
    estimator: str
    mc_num: int
    batch_size: int
    cfg_scale: float = 0.0
    eps: float = 1e-3
    # dream: EOS appended to the continuation (visible, never scored). The authors' eval.py
    # always appends it and never masks the sequence's last position; without it the last
    # continuation token would never be scored (a one-token choice would score 0.0), so
    # False is refused for the dream estimator.
    append_eos: bool = True
    exact_below: int = 0

    def __post_init__(self) -> None:
        if self.estimator not in LIKELIHOOD_ESTIMATORS:
            raise ValueError(f"unknown likelihood estimator {self.estimator!r}; "
                             f"known: {list(LIKELIHOOD_ESTIMATORS)}")
        if self.mc_num < 1 or self.batch_size < 1:
            raise ValueError(f"mc_num and batch_size must be >= 1, got {self.mc_num}, {self.batch_size}")
        if self.cfg_scale < 0:
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        if self.cfg_scale > 0 and self.estimator != "llada":
            raise ValueError("cfg_scale is only defined for the llada estimator")
        if not 0 < self.eps < 1:
            raise ValueError(f"eps must lie in (0, 1), got {self.eps}")
        if self.estimator == "dream" and not self.append_eos:
            raise ValueError(
                "likelihood setting append_eos=False is not supported by the dream estimator: "
                "the authors' eval.py always appends EOS and never masks the last position, so "
                "the last continuation token would never be scored (a one-token choice scores "
                "0.0); drop append_eos (default True)")
        if not 0 <= self.exact_below <= 16:
            raise ValueError(f"exact_below must lie in 0..16 (2^15 patterns), got {self.exact_below}")

    @property
    def rows(self) -> int:
        return self.batch_size

    @property
    def iterations(self) -> int:
        # LLaDA's script asserts mc_num % batch_size == 0; Dream's runs max(mc_num // b, 1).
        return max(self.mc_num // self.rows, 1)


def likelihood_settings(adapter_likelihood: Mapping[str, Any],
                        overrides: Mapping[str, Any] | None = None) -> LikelihoodSettings:
    """Adapter ``likelihood`` dict merged with overrides (``None`` values are ignored)."""
    merged = dict(adapter_likelihood)
    for k, v in (overrides or {}).items():
        if v is not None:
            merged[k] = v
    if "cfg" in merged:
        merged["cfg_scale"] = merged.pop("cfg")
    unknown = sorted(set(merged) - set(SETTING_KEYS))
    if unknown:
        raise ValueError(f"unknown likelihood settings {unknown}; known: {sorted(SETTING_KEYS)}")
    return LikelihoodSettings(estimator=str(merged["estimator"]), mc_num=int(merged["mc_num"]),
                              batch_size=int(merged["batch_size"]),
                              cfg_scale=float(merged.get("cfg_scale", 0.0)),
                              eps=float(merged.get("eps", 1e-3)),
                              append_eos=_bool(merged.get("append_eos", True)),
                              exact_below=int(merged.get("exact_below", 0)))


def _bool(v: Any) -> bool:
    """lm-eval's ``--model_args`` may hand over ``"False"`` as a string."""
    return v.strip().lower() in ("1", "true", "yes") if isinstance(v, str) else bool(v)


def request_generator(seed: int, *parts: Any) -> torch.Generator:
    """A CPU generator seeded by ``seed`` and the request's content (order/shard independent)."""
    blob = json.dumps([int(seed), *parts], separators=(",", ":"), default=str).encode()
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") & ((1 << 63) - 1))
    return g


def _logits(loaded: LoadedModel, ids: torch.Tensor, prompt_len: int, cfg_scale: float) -> torch.Tensor:
    """Logits of the target positions only (``ids[:, prompt_len:]``): the LM head skips the
    context, whose tokens are never masked or scored."""
    keep = ids.shape[1] - prompt_len
    if cfg_scale > 0:
        un = ids.clone()
        un[:, :prompt_len] = loaded.mask_id
        both = loaded.logits(torch.cat([ids, un]), keep_last=keep).float()
        cond, uncond = both.chunk(2, dim=0)
        return uncond + (cfg_scale + 1.0) * (cond - uncond)
    return loaded.logits(ids, keep_last=keep).float()


def _weighted_masked_ce(loaded: LoadedModel, seq: torch.Tensor, target_mask: torch.Tensor,
                        p_mask: torch.Tensor, prompt_len: int, cfg_scale: float) -> float:
    """One iteration of either estimator: mask ``target_mask`` ([b, L] over the target
    positions) in ``seq`` ([b, P + L]), score the masked tokens, and return
    ``sum CE / p_mask`` (``p_mask`` [b]: each row's masking rate) averaged over rows."""
    b = seq.shape[0]
    target_mask = target_mask.to(seq.device)
    is_mask = torch.cat([torch.zeros_like(seq[:, :prompt_len], dtype=torch.bool), target_mask], 1)
    noisy = torch.where(is_mask, torch.full_like(seq, loaded.mask_id), seq)
    logits = _logits(loaded, noisy, prompt_len, cfg_scale)          # target positions only
    ce = F.cross_entropy(logits[target_mask], seq[is_mask], reduction="none").double()
    rate = p_mask.to(seq.device).unsqueeze(1).expand_as(target_mask)[target_mask]
    return (ce / rate).sum().item() / b


def _repeated(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int], b: int):
    seq = torch.tensor(list(prefix) + list(target), dtype=torch.long, device=loaded.device)
    return seq.unsqueeze(0).repeat(b, 1)


def llada_mask_counts(k: int, L: int, b: int) -> torch.Tensor:
    """Rows' mask counts for draw ``k``: the authors' stratified linspace (``forward_process``
    of get_log_likelihood.py) with their arithmetic. There ``k`` is the int64 tensor
    ``torch.randint`` returns, so the end point ``k + (b - 1) * (L / b)`` is a float32 tensor:
    the Python float ``(b - 1) * (L / b)`` is rounded to float32 and added in float32. Rounding
    the float64 sum once instead moves a count for b = 6, 12, 14, 18, ... (b = 6, L = 5, k = 5:
    theirs [5, 1, 2, 2, 3, 4], the float64 end point [5, 1, 2, 3, 3, 4])."""
    k_t = torch.tensor(int(k), dtype=torch.int64)
    end = k_t + (b - 1) * (L / b)                    # int64 tensor + float: float32, as theirs
    x = torch.round(torch.linspace(float(k), end.to(torch.float32), steps=b,
                                   dtype=torch.float32)).long()
    return ((x - 1) % L) + 1


@torch.no_grad()
def llada_iteration_losses(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                           st: LikelihoodSettings, generator: torch.Generator) -> torch.Tensor:
    """Per-iteration losses (float64, ``[iterations]``) of the LLaDA stratified estimator."""
    b, L = st.rows, len(target)
    seq = _repeated(loaded, prefix, target, b)
    out = []
    for _ in range(st.iterations):
        k = int(torch.randint(1, L + 1, (), generator=generator))
        x = llada_mask_counts(k, L, b)
        order = torch.stack([torch.randperm(L, generator=generator) for _ in range(b)])
        target_mask = order < x.unsqueeze(1)           # exactly x_i random target positions
        out.append(_weighted_masked_ce(loaded, seq, target_mask, x.double() / L, len(prefix),
                                       st.cfg_scale))
    return torch.tensor(out, dtype=torch.float64)


def dream_maskable(prefix_len: int, target_len: int) -> list[int]:
    """Target positions Dream's ``_forward_process`` may mask: never the sequence's last
    position (the appended EOS) nor its first (BOS, when the prefix is empty)."""
    total = prefix_len + target_len
    return [j for j in range(target_len) if prefix_len + j not in (0, total - 1)]


def dream_noise(b: int, length: int, eps: float, generator: torch.Generator):
    """The authors' random calls for one iteration over a whole ``[b, length]`` sequence:
    ``t = (u0 + i/b) mod 1`` and ``p = (1-eps) t + eps`` in float32, one uniform per position,
    first and last position never masked. Returns (mask ``[b, length]``, p ``[b]``)."""
    u0 = torch.rand(1, generator=generator, dtype=torch.float32)
    t = (u0 + torch.arange(b, dtype=torch.float32) / b) % 1
    p = (1 - eps) * t + eps
    mask = torch.rand((b, length), generator=generator, dtype=torch.float32) < p[:, None]
    mask[:, 0] = False
    mask[:, -1] = False
    return mask, p


@torch.no_grad()
def dream_iteration_losses(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                           st: LikelihoodSettings, generator: torch.Generator) -> torch.Tensor:
    """Per-iteration losses (float64, ``[iterations]``) of Dream's stratified-t estimator.

    ``target`` is scored as given (the caller appends EOS when ``append_eos``); its last token
    is never masked, so an appended EOS is visible and never scored, as in the authors' code."""
    b, P, L = st.rows, len(prefix), len(target)
    seq = _repeated(loaded, prefix, target, b)
    out = []
    for _ in range(st.iterations):
        mask, p = dream_noise(b, P + L, st.eps, generator)
        target_mask = mask[:, P:]                      # the prompt is never masked ("ftb")
        if not bool(target_mask.any()):
            out.append(0.0)
            continue
        out.append(_weighted_masked_ce(loaded, seq, target_mask, p.double(), P, 0.0))
    return torch.tensor(out, dtype=torch.float64)


# ----------------------------------------------------------------------------- exact mode
EXACT_MIN_ROWS = 32
def maskable_positions(st: LikelihoodSettings, prefix_len: int, target_len: int) -> list[int]:
    if st.estimator == "dream":
        return dream_maskable(prefix_len, target_len)
    return list(range(target_len))


@functools.lru_cache(maxsize=None)      # pure; exact mode asks it once per request
def llada_count_probs(L: int, b: int) -> dict[int, float]:
    """Marginal distribution of one row's mask count: ``k`` uniform on ``1..L``, the row
    uniform among the ``b`` stratified rows."""
    probs: dict[int, float] = {}
    for k in range(1, L + 1):
        for c in llada_mask_counts(k, L, b).tolist():
            probs[c] = probs.get(c, 0.0) + 1.0 / (L * b)
    return probs


@functools.lru_cache(maxsize=None)
def dream_pattern_weight(m: int, n: int, eps: float) -> float:
    """``E_p[p^(m-1) (1-p)^(n-m)]`` with ``p = (1-eps) t + eps``, ``t ~ U[0, 1]``: the expected
    weight ``P(pattern) / p`` of one pattern of ``m`` masked among ``n`` maskable tokens.
    Gauss-Legendre with ``n`` nodes is exact for this degree ``n-1`` polynomial."""
    nodes, weights = np.polynomial.legendre.leggauss(max(n, 1))
    p = eps + (1 - eps) * (nodes + 1) / 2                 # [-1, 1] -> [eps, 1]
    vals = p ** (m - 1) * (1 - p) ** (n - m)
    return float((weights * vals).sum() / 2)               # mean over [eps, 1]


def exact_patterns(st: LikelihoodSettings, prefix_len: int,
                   target_len: int) -> list[tuple[tuple[int, ...], float]]:
    """Every mask pattern (target indices) with weight ``P(pattern) / rate``, so that
    ``sum_S w(S) sum_{j in S} CE_j(S)`` is the estimator's expected loss."""
    pos = maskable_positions(st, prefix_len, target_len)
    n = len(pos)
    out = []
    if st.estimator == "llada":
        for m, q in sorted(llada_count_probs(n, st.rows).items()):
            w = q / math.comb(n, m) * n / m
            out += [(S, w) for S in itertools.combinations(pos, m)]
        return out
    for m in range(1, n + 1):
        w = dream_pattern_weight(m, n, st.eps)
        out += [(S, w) for S in itertools.combinations(pos, m)]
    return out


def use_exact(st: LikelihoodSettings, prefix_len: int, target_len: int) -> bool:
    n = len(maskable_positions(st, prefix_len, target_len))
    return 0 < n < st.exact_below


def exact_inputs(items: Sequence[tuple[Sequence[int], Sequence[int]]], st: LikelihoodSettings,
                 mask_id: int) -> tuple[list[tuple[int, list[int]]], list[list[tuple[int, int, int, float]]]]:
    """The distinct noisy inputs of exact mode, ``(prefix length, ids)``, and per item what
    it reads of them, ``(input, position, token, weight)``: identical inputs appear once, so
    the choices of a question with single-token targets (MMLU's letters, BoolQ's yes/no) all
    read the same ``[context | MASK (| EOS)]`` input."""
    unique: dict[tuple[int, tuple[int, ...]], int] = {}
    inputs: list[tuple[int, list[int]]] = []
    needs: list[list[tuple[int, int, int, float]]] = []
    for prefix, target in items:
        P, req = len(prefix), []
        for S, w in exact_patterns(st, P, len(target)):
            noisy = list(prefix) + [mask_id if j in S else t for j, t in enumerate(target)]
            key = (P, tuple(noisy))
            if key not in unique:
                unique[key] = len(inputs)
                inputs.append((P, noisy))
            req += [(unique[key], j, int(target[j]), w) for j in S]
        needs.append(req)
    return inputs, needs


def exact_forward_chunks(inputs: Sequence[tuple[int, list[int]]],
                         st: LikelihoodSettings) -> list[tuple[int, list[int]]]:
    """The forwards of exact mode: ``(prefix length, input indices)``, inputs of one context
    and total length together, at least ``EXACT_MIN_ROWS`` a forward (the row count changes
    no value here: the pattern weights already hold ``st.rows``)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (P, ids) in enumerate(inputs):
        groups.setdefault((P, len(ids)), []).append(i)
    step = max(st.rows, EXACT_MIN_ROWS)
    return [(P, idx[s:s + step]) for (P, _), idx in groups.items()
            for s in range(0, len(idx), step)]


@torch.no_grad()
def exact_loglikelihoods(loaded: LoadedModel, items: Sequence[tuple[Sequence[int], Sequence[int]]],
                         st: LikelihoodSettings) -> list[float]:
    """Exact expectation of the estimator for each ``(prefix, target)``, zero variance, from
    the distinct noisy inputs (:func:`exact_inputs`) in :func:`exact_forward_chunks`."""
    inputs, needs = exact_inputs(items, st, loaded.mask_id)
    wanted: dict[int, set[tuple[int, int]]] = {}
    for req in needs:
        for i, j, tok, _ in req:
            wanted.setdefault(i, set()).add((j, tok))
    logp = _target_logprobs(loaded, inputs, wanted, st)
    return [sum(w * logp[i, j, tok] for i, j, tok, w in req) for req in needs]


def _target_logprobs(loaded: LoadedModel, inputs: Sequence[tuple[int, list[int]]],
                     wanted: Mapping[int, set[tuple[int, int]]],
                     st: LikelihoodSettings) -> dict[tuple[int, int, int], float]:
    """``log p(token at target position j | input i)`` for every wanted ``(i, j, token)``;
    only those values leave the device."""
    out: dict[tuple[int, int, int], float] = {}
    for P, chunk in exact_forward_chunks(inputs, st):
        ids = torch.tensor([inputs[i][1] for i in chunk], dtype=torch.long, device=loaded.device)
        logp = torch.log_softmax(_logits(loaded, ids, P, st.cfg_scale).float(), dim=-1)
        keys = [(r, j, tok) for r, i in enumerate(chunk) for j, tok in sorted(wanted[i])]
        r_, j_, t_ = (torch.tensor(v, device=logp.device) for v in zip(*keys))
        vals = logp[r_, j_, t_].double().tolist()
        for (r, j, tok), v in zip(keys, vals):
            out[(chunk[r], j, tok)] = v
    return out


def mc_loglikelihood(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                     st: LikelihoodSettings, generator: torch.Generator) -> tuple[float, float]:
    """MC estimate of ``log p(target | prefix)`` and its standard error (over iterations)."""
    if len(target) == 0:
        return 0.0, 0.0
    fn = llada_iteration_losses if st.estimator == "llada" else dream_iteration_losses
    losses = fn(loaded, prefix, target, st, generator)
    se = float(losses.std(unbiased=True) / math.sqrt(len(losses))) if len(losses) > 1 else float("nan")
    return -float(losses.mean()), se


def score_requests(loaded: LoadedModel, items: Sequence[tuple[Sequence[int], Sequence[int]]],
                   st: LikelihoodSettings, seed: int) -> list[float]:
    """Log-likelihoods of ``(prefix, scored target)`` pairs: the exact expectation where
    ``exact_below`` allows (batched: identical noisy inputs run once), else the MC estimate
    with a generator seeded by ``(seed, prefix, target)`` (any batch, order or shard)."""
    exact = [i for i, (p, t) in enumerate(items) if use_exact(st, len(p), len(t))]
    values = dict(zip(exact, exact_loglikelihoods(loaded, [items[i] for i in exact], st)))
    for i, (prefix, target) in enumerate(items):
        if i not in values:
            gen = request_generator(seed, list(prefix), list(target))
            values[i] = mc_loglikelihood(loaded, prefix, target, st, gen)[0]
    return [float(values[i]) for i in range(len(items))]


MASK_STAND_IN = -1      # a mask id no tokenizer gives: the inputs' identity without a model


def planned_forwards(items: Sequence[tuple[Sequence[int], Sequence[int]]],
                     st: LikelihoodSettings) -> Counter:
    """The forwards :func:`score_requests` runs for these ``(prefix, scored target)`` items,
    ``{(request class, rows, tokens): count}``: exact mode's chunks of distinct inputs
    (``exact``; twice the rows with classifier-free guidance), and ``iterations`` forwards
    of ``rows`` (LLaDA with guidance: twice) per sampled item (``mc``; Dream's iterations
    whose draw masks nothing are skipped there, which depends on the draws: counted)."""
    out: Counter = Counter()
    guided = 2 if st.cfg_scale > 0 else 1
    exact = [(p, t) for p, t in items if use_exact(st, len(p), len(t))]
    inputs, _ = exact_inputs(exact, st, MASK_STAND_IN)
    for _, chunk in exact_forward_chunks(inputs, st):
        out[("exact", len(chunk) * guided, len(inputs[chunk[0]][1]))] += 1
    mc_rows = st.rows * (guided if st.estimator == "llada" else 1)
    for p, t in items:
        if len(t) and not use_exact(st, len(p), len(t)):
            out[("mc", mc_rows, len(p) + len(t))] += st.iterations
    return out


@torch.no_grad()
def greedy_match(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                 cfg_scale: float = 0.0) -> bool:
    """Does one pass with the whole target masked predict every target token by argmax?"""
    if len(target) == 0:
        return True
    P = len(prefix)
    ids = torch.tensor([list(prefix) + [loaded.mask_id] * len(target)], device=loaded.device)
    logits = _logits(loaded, ids, P, cfg_scale)
    pred = logits[0].argmax(-1).tolist()
    return pred == list(target)
