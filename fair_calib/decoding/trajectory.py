"""Decoding trajectories without full-vocabulary logits.

A trajectory is fully determined by (prompt, final window tokens, commit step per position):
the state at step ``t`` is the prompt plus every token committed at a step ``> t`` (earlier in
time), masks elsewhere. :func:`teacher_force` replays those states through ANY model and records
per-step statistics; :class:`TrajectoryRecorder` records the same statistics live inside
:func:`~fair_calib.decoding.generate`.

Per (sample, step, window position) the recorded columns are (see ``TRAJECTORY_SCHEMA``):
``committed`` (committed at this step), ``token`` (the token committed at this step, -1 if
not), ``top1`` (the model's argmax), ``p_commit`` (probability of the position's token in the
trajectory's final output), ``p_ref`` (probability of the reference token, e.g. the teacher's
final token), ``margin`` (top-1 minus top-2 probability), ``entropy`` (nats) and ``p_alt`` (the
largest probability of any token other than the reference token: the reference's strongest
alternative, exact whatever the reference's rank; NaN without a reference). Probabilities
are ``softmax`` of the logits the commit decision saw (after classifier-free guidance, before
any temperature).
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from fair_calib.decoding.generate import Generators, generate, model_context, pad_left, window_logits
from fair_calib.decoding.policies import DecodePolicy

log = logging.getLogger(__name__)

TRAJECTORY_SCHEMA = pa.schema([
    ("sample_id", pa.int64()),
    ("step", pa.int32()),
    ("position", pa.int32()),
    ("committed", pa.bool_()),
    ("token", pa.int64()),
    ("top1", pa.int64()),
    ("p_commit", pa.float64()),
    ("p_ref", pa.float64()),
    ("margin", pa.float64()),
    ("entropy", pa.float64()),
    ("p_alt", pa.float64()),
])


def step_stats(logits: torch.Tensor, *token_sets: torch.Tensor | None,
               alternative_to: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-position statistics of ``logits [B, K, V]``: top1, top-1 probability, margin (top-1
    minus top-2 probability), entropy, under ``probs`` the probability of each given
    ``[B, K]`` token tensor (``None`` or a negative id -> NaN), and under ``p_alt`` the largest
    probability of a token other than ``alternative_to``'s (NaN where that is ``None`` or
    negative). Computed in float64, one row at a time so that no ``[B, K, V]`` float64 tensor
    is ever held."""
    rows: list[dict[str, Any]] = []
    for r in range(logits.shape[0]):
        logp = torch.log_softmax(logits[r].double(), dim=-1)
        p = logp.exp()
        top2 = torch.topk(p, min(2, p.shape[-1]), dim=-1)
        p1 = top2.values[..., 0]
        p2 = top2.values[..., 1] if p.shape[-1] > 1 else torch.zeros_like(p1)
        rec = {"top1": top2.indices[..., 0], "p_top1": p1, "margin": p1 - p2,
               "entropy": -(p * logp).nan_to_num(0.0).sum(-1), "probs": []}   # 0 log 0 = 0
        for toks in token_sets:
            if toks is None:
                rec["probs"].append(torch.full_like(p1, float("nan")))
            else:
                t = toks[r]
                g = p.gather(-1, t.clamp(min=0)[..., None]).squeeze(-1)
                rec["probs"].append(torch.where(t >= 0, g, torch.full_like(g, float("nan"))))
        rec["p_alt"] = _best_alternative(p, None if alternative_to is None else alternative_to[r])
        rows.append(rec)
    keys = ("top1", "p_top1", "margin", "entropy", "p_alt")
    out = {key: torch.stack([rec[key] for rec in rows]) for key in keys}
    out["probs"] = [torch.stack([rec["probs"][j] for rec in rows]) for j in range(len(token_sets))]
    return out


def _best_alternative(p: torch.Tensor, toks: torch.Tensor | None) -> torch.Tensor:
    """max_{v != toks[k]} p[k, v] for ``p [K, V]`` (NaN where ``toks`` is None or negative)."""
    nan = torch.full(p.shape[:-1], float("nan"), dtype=p.dtype, device=p.device)
    if toks is None:
        return nan
    others = p.scatter(-1, toks.clamp(min=0)[..., None], float("-inf"))
    return torch.where(toks >= 0, others.max(-1).values, nan)


class CommitRecorder:
    """Records only the commit step of every window position (and the final tokens)."""

    def __init__(self) -> None:
        self.commit_steps: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None

    def start(self, batch: int, gen_length: int, steps: int) -> None:
        self.commit_steps = torch.zeros(batch, gen_length, dtype=torch.long)
        self.steps = steps

    def step(self, t: int, logits: torch.Tensor, masked: torch.Tensor, committed: torch.Tensor,
             window: torch.Tensor) -> None:
        self.commit_steps[committed.cpu()] = t

    def finish(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens.cpu()


class TrajectoryRecorder(CommitRecorder):
    """Records the trajectory statistics step by step (no full-vocabulary tensors are kept).

    ``reference`` ``[B, K]``: tokens whose probability goes to ``p_ref`` (NaN if not given).
    ``final_tokens`` ``[B, K]``: the trajectory's final output when known in advance (teacher
    forcing); live inside :func:`generate` it is not, so ``p_commit`` is then exact from the
    commit step on and NaN at earlier steps -- use :func:`record_trajectory` for the complete
    column (it replays the states once more).
    """

    def __init__(self, reference: torch.Tensor | None = None,
                 final_tokens: torch.Tensor | None = None,
                 sample_ids: Sequence[int] | None = None) -> None:
        super().__init__()
        self.reference = reference
        self.final_tokens = final_tokens
        self.sample_ids = None if sample_ids is None else [int(s) for s in sample_ids]
        self._rows: list[dict[str, np.ndarray]] = []

    def step(self, t: int, logits: torch.Tensor, masked: torch.Tensor, committed: torch.Tensor,
             window: torch.Tensor) -> None:
        super().step(t, logits, masked, committed, window)
        dev = logits.device
        ref = None if self.reference is None else self.reference.to(dev)
        if self.final_tokens is not None:
            final = self.final_tokens.to(dev)
        else:   # tokens known so far: committed now or before; -1 where still masked
            final = torch.where(masked & ~committed, torch.full_like(window, -1), window)
        st = step_stats(logits, final, ref, alternative_to=ref)
        p_commit, p_ref = st["probs"]
        token = torch.where(committed, window, torch.full_like(window, -1))
        self._rows.append({
            "step": np.full(tuple(window.shape), t, dtype=np.int32),
            "committed": committed.cpu().numpy(),
            "token": token.cpu().numpy().astype(np.int64),
            "top1": st["top1"].cpu().numpy().astype(np.int64),
            "p_commit": p_commit.cpu().numpy(),
            "p_ref": p_ref.cpu().numpy(),
            "margin": st["margin"].cpu().numpy(),
            "entropy": st["entropy"].cpu().numpy(),
            "p_alt": st["p_alt"].cpu().numpy(),
        })

    def frame(self) -> pd.DataFrame:
        """The trajectory as a DataFrame in ``TRAJECTORY_SCHEMA`` column order, sorted by
        (sample_id, step descending, position)."""
        if not self._rows:
            return pd.DataFrame({f.name: pd.Series(dtype=f.type.to_pandas_dtype())
                                 for f in TRAJECTORY_SCHEMA})
        b, k = self._rows[0]["committed"].shape
        sids = np.asarray(self.sample_ids if self.sample_ids is not None else range(b), dtype=np.int64)
        if len(sids) != b:
            raise ValueError(f"{len(sids)} sample ids for a batch of {b}")
        cols = {key: np.stack([r[key] for r in self._rows], axis=1) for key in self._rows[0]}
        n_steps = len(self._rows)                   # arrays are [B, steps, K]
        data = {
            "sample_id": np.repeat(sids, n_steps * k),
            "step": cols["step"].reshape(-1).astype(np.int32),
            "position": np.tile(np.arange(k, dtype=np.int32), b * n_steps),
        }
        for key in ("committed", "token", "top1", "p_commit", "p_ref", "margin", "entropy", "p_alt"):
            data[key] = cols[key].reshape(-1)
        return pd.DataFrame(data)[[f.name for f in TRAJECTORY_SCHEMA]]


@torch.no_grad()
def teacher_force(model: Any, prompts: Sequence[Sequence[int]], final_tokens: torch.Tensor,
                  commit_steps: torch.Tensor, reference: torch.Tensor | None = None,
                  cfg_scale: float = 0.0, steps: int | None = None,
                  sample_ids: Sequence[int] | None = None,
                  batch_size: int | None = None) -> pd.DataFrame:
    """Evaluate ``model`` on the intermediate states of a recorded trajectory.

    ``final_tokens`` / ``commit_steps``: ``[B, K]``; position ``i`` holds ``final_tokens[i]``
    from step ``commit_steps[i] - 1`` on (it is masked at steps ``t >= commit_steps[i]``).
    ``reference`` defaults to ``final_tokens`` (so ``p_ref == p_commit``). ``steps`` defaults to
    ``commit_steps.max()``. Returns a DataFrame in ``TRAJECTORY_SCHEMA``.
    """
    final_tokens = torch.as_tensor(final_tokens, dtype=torch.long).cpu()
    commit_steps = torch.as_tensor(commit_steps, dtype=torch.long).cpu()
    b, k = final_tokens.shape
    if commit_steps.shape != (b, k) or len(prompts) != b:
        raise ValueError(f"teacher_force: {len(prompts)} prompts, final_tokens {tuple(final_tokens.shape)}, "
                         f"commit_steps {tuple(commit_steps.shape)} do not agree")
    T = int(commit_steps.max()) if steps is None else int(steps)
    if int(commit_steps.min()) < 1 or int(commit_steps.max()) > T:
        raise ValueError(f"commit steps must lie in 1..{T}, got {int(commit_steps.min())}.."
                         f"{int(commit_steps.max())}")
    ctx = model_context(model)
    longest = max(len(p) for p in prompts)
    if ctx is not None and longest + k > ctx:
        raise ValueError(f"prompt length {longest} + gen_length {k} exceeds the model context "
                         f"max_position_embeddings={ctx}")
    reference = final_tokens if reference is None else torch.as_tensor(reference, dtype=torch.long).cpu()
    sids = list(range(b)) if sample_ids is None else [int(s) for s in sample_ids]
    bs = b if batch_size is None else int(batch_size)
    frames = []
    mask_id, device = int(model.mask_id), model.device
    for lo in range(0, b, bs):
        hi = min(b, lo + bs)
        rec = TrajectoryRecorder(reference=reference[lo:hi], final_tokens=final_tokens[lo:hi],
                                 sample_ids=sids[lo:hi])
        ids, attn, lp = pad_left(prompts[lo:hi], k, mask_id, int(model.pad_id), device)
        fin = final_tokens[lo:hi].to(device)
        cs = commit_steps[lo:hi].to(device)
        rec.start(hi - lo, k, T)
        for t in range(T, 0, -1):
            ids[:, lp:] = torch.where(cs > t, fin, torch.full_like(fin, mask_id))
            logits = window_logits(model, ids, attn, lp, cfg_scale)
            after = torch.where(cs >= t, fin, torch.full_like(fin, mask_id))
            rec.step(t, logits, cs <= t, cs == t, after)
        rec.finish(fin)
        frames.append(rec.frame())
    return pd.concat(frames, ignore_index=True)


def record_trajectory(model: Any, prompts: Sequence[Sequence[int]], policy: DecodePolicy,
                      generator: Generators = None, reference: torch.Tensor | None = None,
                      sample_ids: Sequence[int] | None = None) -> tuple[torch.Tensor, torch.Tensor, pd.DataFrame]:
    """Decode, then replay the trajectory through the same model for complete statistics.

    Returns ``(tokens [B, K], commit_steps [B, K], trajectory DataFrame)``.
    """
    rec = CommitRecorder()
    tokens = generate(model, prompts, policy, generator=generator, recorder=rec)
    df = teacher_force(model, prompts, tokens.cpu(), rec.commit_steps, reference=reference,
                       cfg_scale=policy.cfg_scale, steps=policy.steps, sample_ids=sample_ids)
    return tokens, rec.commit_steps, df
