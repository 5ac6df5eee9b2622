"""Monte-Carlo masked likelihood estimators of the model authors (LLaDA, Dream).

Kept apart from the lm-eval model class so GPU benchmarks and other stages can use them on
machines without lm-eval. See ``fair_calib.evaluate.lm`` for the estimator definitions.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F

from fair_calib.models.adapters import LoadedModel

LIKELIHOOD_ESTIMATORS = ("llada", "dream")


@dataclass(frozen=True)
class LikelihoodSettings:
    estimator: str
    mc_num: int
    batch_size: int
    cfg_scale: float = 0.0
    eps: float = 1e-3
    append_eos: bool = True      # dream: EOS appended to the continuation

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

    @property
    def rows(self) -> int:
        return min(self.batch_size, self.mc_num)

    @property
    def iterations(self) -> int:
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
    known = {"estimator", "mc_num", "batch_size", "cfg_scale", "eps", "append_eos"}
    unknown = sorted(set(merged) - known)
    if unknown:
        raise ValueError(f"unknown likelihood settings {unknown}; known: {sorted(known)}")
    return LikelihoodSettings(estimator=str(merged["estimator"]), mc_num=int(merged["mc_num"]),
                              batch_size=int(merged["batch_size"]),
                              cfg_scale=float(merged.get("cfg_scale", 0.0)),
                              eps=float(merged.get("eps", 1e-3)),
                              append_eos=bool(merged.get("append_eos", True)))


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


@torch.no_grad()
def llada_iteration_losses(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                           st: LikelihoodSettings, generator: torch.Generator) -> torch.Tensor:
    """Per-iteration losses (float64, ``[iterations]``) of the LLaDA stratified estimator."""
    b, L = st.rows, len(target)
    seq = _repeated(loaded, prefix, target, b)
    out = []
    for _ in range(st.iterations):
        k = int(torch.randint(1, L + 1, (), generator=generator))
        x = torch.round(torch.linspace(float(k), k + (b - 1) * (L / b), steps=b,
                                       dtype=torch.float64)).long()
        x = ((x - 1) % L) + 1
        order = torch.stack([torch.randperm(L, generator=generator) for _ in range(b)])
        target_mask = order < x.unsqueeze(1)           # exactly x_i random target positions
        out.append(_weighted_masked_ce(loaded, seq, target_mask, x.double() / L, len(prefix),
                                       st.cfg_scale))
    return torch.tensor(out, dtype=torch.float64)


@torch.no_grad()
def dream_iteration_losses(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                           st: LikelihoodSettings, generator: torch.Generator) -> torch.Tensor:
    """Per-iteration losses (float64, ``[iterations]``) of the Dream stratified-t estimator.

    ``target`` is scored as given (the caller appends EOS when ``append_eos``)."""
    b, L = st.rows, len(target)
    seq = _repeated(loaded, prefix, target, b)
    out = []
    for _ in range(st.iterations):
        u0 = torch.rand((), generator=generator, dtype=torch.float64)
        t = (u0 + torch.arange(b, dtype=torch.float64) / b) % 1.0
        p = (1.0 - st.eps) * t + st.eps                                    # [b]
        target_mask = torch.rand((b, L), generator=generator, dtype=torch.float64) < p.unsqueeze(1)
        if not bool(target_mask.any()):
            out.append(0.0)
            continue
        out.append(_weighted_masked_ce(loaded, seq, target_mask, p, len(prefix), 0.0))
    return torch.tensor(out, dtype=torch.float64)


def mc_loglikelihood(loaded: LoadedModel, prefix: Sequence[int], target: Sequence[int],
                     st: LikelihoodSettings, generator: torch.Generator) -> tuple[float, float]:
    """MC estimate of ``log p(target | prefix)`` and its standard error (over iterations)."""
    if len(target) == 0:
        return 0.0, 0.0
    fn = llada_iteration_losses if st.estimator == "llada" else dream_iteration_losses
    losses = fn(loaded, prefix, target, st, generator)
    se = float(losses.std(unbiased=True) / math.sqrt(len(losses))) if len(losses) > 1 else float("nan")
    return -float(losses.mean()), se


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
