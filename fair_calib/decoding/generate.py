"""Masked-diffusion decoding for any family, batched with left padding.

Every family is driven through ``LoadedModel.logits(ids, attention_mask)`` (logit shift already
applied) and the model's ``mask_id`` / ``pad_id``; the commit rule comes from the policy name.

Steps are numbered ``t = T`` (first step, window fully masked) down to ``1`` (last step). A
recorder, when given, sees every step: ``recorder.start(batch, gen_length, steps)``, then
``recorder.step(t, logits, masked, committed, window)`` with the window logits ``[B, K, V]`` the
commit decision used (after classifier-free guidance, before temperature), the positions masked
at the start of the step, the positions committed during it and the window after it, and
finally ``recorder.finish(tokens)``.

Randomness: ``generator`` is ``None`` (torch's global RNG), one ``torch.Generator`` (draws for
the whole batch at once) or a sequence of generators, one per row; with per-row generators a
row's random stream does not depend on the other rows in the batch.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

from fair_calib.decoding.policies import (BLOCK_POLICIES, RANDOM_COMMIT_POLICIES, DecodePolicy,
                                        block_commit_counts)

log = logging.getLogger(__name__)

Generators = torch.Generator | Sequence[torch.Generator] | None


def model_context(model: Any) -> int | None:
    """Longest sequence the model accepts (from its config), or None if it does not say."""
    cfg = getattr(getattr(model, "model", model), "config", None)
    for key in ("max_position_embeddings", "max_sequence_length", "n_positions"):
        val = getattr(cfg, key, None)
        if isinstance(val, int) and val > 0:
            return val
    return None


def uniform(batch: int, shape: tuple[int, ...], generator: Generators,
            device: torch.device | str) -> torch.Tensor:
    """float64 uniforms in [0, 1) of shape ``[batch, *shape]`` drawn from ``generator``."""
    if generator is None:
        return torch.rand((batch, *shape), dtype=torch.float64, device=device)
    if isinstance(generator, torch.Generator):
        out = torch.rand((batch, *shape), dtype=torch.float64, generator=generator,
                         device=generator.device)
        return out.to(device)
    gens = list(generator)
    if len(gens) != batch:
        raise ValueError(f"got {len(gens)} generators for a batch of {batch} rows")
    return torch.stack([torch.rand(shape, dtype=torch.float64, generator=g, device=g.device)
                        for g in gens]).to(device)


def pad_left(prompts: Sequence[Sequence[int]], gen_length: int, mask_id: int, pad_id: int,
             device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``[pad.. prompt | mask * gen_length]`` and its attention mask; returns (ids, attn, Lp)."""
    lp = max((len(p) for p in prompts), default=0)
    rows, attn = [], []
    for p in prompts:
        n_pad = lp - len(p)
        rows.append([pad_id] * n_pad + [int(v) for v in p] + [mask_id] * gen_length)
        attn.append([0] * n_pad + [1] * (len(p) + gen_length))
    ids = torch.tensor(rows, dtype=torch.long, device=device)
    am = torch.tensor(attn, dtype=torch.long, device=device)
    return ids, am, lp


def window_logits(model: Any, ids: torch.Tensor, attn: torch.Tensor | None, lp: int,
                  cfg_scale: float = 0.0) -> torch.Tensor:
    """Logits ``[B, K, V]`` of the generation window in the model's dtype, with classifier-free guidance
    when ``cfg_scale > 0`` (second forward with the prompt masked:
    ``un + (cfg + 1) * (cond - un)``). The logits are the model's, the mask token's included
    (the decoders never commit it). ``attn`` is None when no row is padded. The LM head runs on the window only."""
    k = ids.shape[1] - lp
    if cfg_scale > 0:
        un = ids.clone()
        prompt_part = torch.zeros_like(ids, dtype=torch.bool)
        prompt_part[:, :lp] = True if attn is None else attn[:, :lp].bool()
        un[prompt_part] = model.mask_id
        both = model.logits(torch.cat([ids, un]), None if attn is None else torch.cat([attn, attn]),
                            keep_last=k)
        cond, unc = both.chunk(2, dim=0)
        out = unc + (cfg_scale + 1.0) * (cond - unc)
    else:
        # Kept in the model's dtype, as the authors' decoders compute (their softmax
        # confidences, and so the order of commits, are in that dtype).
        out = model.logits(ids, attn, keep_last=k)
    return out


def _select_top(conf: torch.Tensor, counts: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Per row, the ``counts[row]`` highest-confidence allowed positions (ties: lowest index)."""
    conf = conf.masked_fill(~allowed, float("-inf"))
    order = torch.argsort(conf, dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank.scatter_(-1, order, torch.arange(conf.shape[-1], device=conf.device).expand_as(order))
    return (rank < counts[:, None]) & allowed


def _topk_over_rows(conf: torch.Tensor, allowed: torch.Tensor, counts: Sequence[int],
                    offset: int, length: int, per_row: bool) -> torch.Tensor:
    """The authors' commit choice: ``torch.topk`` over the whole sequence row (prompt and
    non-candidates at ``-inf``), in the confidences' own dtype. Ties (frequent in bfloat16, and
    exact zeros of entropy after top-p) are then broken the way their code breaks them.
    ``conf``/``allowed`` cover positions ``offset..offset+W`` of rows of ``length``; LLaDA's
    ``generate`` calls topk per row (``per_row``), Dream's ``_sample`` once for the batch (one
    count). Returns the chosen positions ``[B, W]``."""
    b, width = conf.shape
    full = conf.new_full((b, length), float("-inf"))
    full[:, offset:offset + width] = conf.masked_fill(~allowed, float("-inf"))
    chosen = torch.zeros((b, length), dtype=torch.bool, device=conf.device)
    if per_row:
        for j, n in enumerate(counts):
            if n > 0:
                chosen[j, torch.topk(full[j], int(n)).indices] = True
    elif counts[0] > 0:
        chosen.scatter_(1, torch.topk(full, int(counts[0]), dim=-1).indices, True)
    return chosen[:, offset:offset + width] & allowed


def _gumbel_argmax(logits: torch.Tensor, temperature: float, generator: Generators) -> torch.Tensor:
    """Gumbel-max in float64: argmax of ``exp(l) / (-log U)^temperature`` (log form)."""
    b = logits.shape[0]
    u = uniform(b, tuple(logits.shape[1:]), generator, logits.device)
    noisy = logits.double() - temperature * torch.log(-torch.log(u))
    return noisy.argmax(-1)


def _filter_top_p_top_k(logits: torch.Tensor, top_p: float | None, top_k: int | None) -> torch.Tensor:
    """Dream's ``sample_tokens`` filters: nucleus first, then top-k (the order matters when
    both are set)."""
    if top_p is not None and top_p < 1:
        sorted_l, idx = torch.sort(logits, dim=-1, descending=True)
        cum = torch.softmax(sorted_l, dim=-1).cumsum(-1)
        drop_sorted = cum > top_p
        drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, idx, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def _never_the_mask(x0: torch.Tensor, scores: torch.Tensor, mask_id: int) -> torch.Tensor:
    """Replace a predicted mask token by the best other token (by ``scores``). Only an
    untrained model predicts the mask (the released ones give it ~0 probability), so wherever
    the authors' code, which has no such guard, commits a real token, nothing changes."""
    top2 = torch.topk(scores, 2, dim=-1).indices
    best_other = torch.where(top2[..., 0] == mask_id, top2[..., 1], top2[..., 0])
    return torch.where(x0 == mask_id, best_other, x0)


def _schedule_tokens(logits: torch.Tensor, policy: DecodePolicy, generator: Generators,
                     mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and confidences for the schedule policies (Dream's token step)."""
    # The model's dtype throughout, as Dream's ``sample_tokens`` computes (bfloat16 in its
    # evaluation): the confidences, and so their ties, are the authors'.
    lg = logits
    if policy.temperature > 0:
        lg = lg / policy.temperature
    lg = _filter_top_p_top_k(lg, policy.top_p, policy.top_k)
    probs = torch.softmax(lg, dim=-1)
    if policy.temperature > 0:
        noisy = torch.log(probs.double())
        noisy[..., mask_id] = float("-inf")       # never sample the mask token itself
        x0 = _gumbel_argmax(noisy, 1.0, generator)
        conf = probs.gather(-1, x0[..., None]).squeeze(-1)
    else:
        conf, x0 = probs.max(-1)
    if policy.name == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif policy.name == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    if policy.temperature == 0:
        fixed = _never_the_mask(x0, probs, mask_id)
        if policy.name in ("maskgit_plus", "origin"):
            conf = torch.where(fixed != x0, probs.gather(-1, fixed[..., None]).squeeze(-1), conf)
        x0 = fixed
    return x0, conf


@torch.no_grad()
def generate(model: Any, prompts: Sequence[Sequence[int]], policy: DecodePolicy,
             generator: Generators = None, recorder: Any = None) -> torch.LongTensor:
    """Decode ``policy.gen_length`` tokens after each prompt; returns ``LongTensor[B, K]``.

    ``model`` is a :class:`~fair_calib.models.adapters.LoadedModel` (``.logits``, ``.mask_id``,
    ``.pad_id``). Prompts are token-id lists of any lengths (left-padded inside).
    """
    if not isinstance(policy, DecodePolicy):
        raise TypeError(f"policy must be a DecodePolicy, got {type(policy).__name__}")
    policy.validate()
    prompts = [list(p) for p in prompts]
    if not prompts:
        raise ValueError("generate() needs at least one prompt")
    policy.check_context(max(len(p) for p in prompts), model_context(model))
    mask_id = int(model.mask_id)
    if any(mask_id in p for p in prompts):
        raise ValueError(f"a prompt contains the mask token id {mask_id}")
    device = model.device
    ids, attn, lp = pad_left(prompts, policy.gen_length, mask_id, int(model.pad_id), device)
    if len({len(p) for p in prompts}) == 1:
        attn = None       # no padding: attention without a mask tensor (fast kernels, no sync)
    b, k, T = len(prompts), policy.gen_length, policy.steps
    if recorder is not None:
        recorder.start(b, k, T)

    if policy.name in BLOCK_POLICIES or policy.name in RANDOM_COMMIT_POLICIES:
        _decode_blocks(model, ids, attn, lp, policy, generator, recorder)
    else:
        _decode_schedule(model, ids, attn, lp, policy, generator, recorder)

    out = ids[:, lp:].clone()
    if bool((out == mask_id).any()):
        raise RuntimeError("decoding left masked positions in the window")  # a bug, not input
    if recorder is not None:
        recorder.finish(out)
    return out


def _block_tokens(span: torch.Tensor, policy: DecodePolicy, generator: Generators, mask_id: int,
                  uniform_conf: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LLaDA's token step: Gumbel-max (float64) or argmax, and the untempered softmax
    probability of the chosen token in the logits' dtype (``generate.py``)."""
    if policy.temperature > 0:
        noisy_logits = span.double()
        noisy_logits[..., mask_id] = float("-inf")   # never sample the mask token itself
        x0 = _gumbel_argmax(noisy_logits, policy.temperature, generator)
    else:
        x0 = span.argmax(-1)
    if uniform_conf:
        return _never_the_mask(x0, span, mask_id), None
    probs = torch.softmax(span, dim=-1)
    conf = probs.gather(-1, x0[..., None]).squeeze(-1)
    if policy.temperature == 0:
        fixed = _never_the_mask(x0, probs, mask_id)
        conf = torch.where(fixed != x0, probs.gather(-1, fixed[..., None]).squeeze(-1), conf)
        x0 = fixed
    return x0, conf


def _decode_blocks(model, ids, attn, lp, policy: DecodePolicy, generator, recorder) -> None:
    """LLaDA-style semi-autoregressive blocks; ``random_commit`` is one block with uniform
    confidences (positions uniformly at random among masked)."""
    mask_id = int(model.mask_id)
    b, k, T = ids.shape[0], policy.gen_length, policy.steps
    bl = policy.block_len if policy.name in BLOCK_POLICIES else k
    n_blocks = k // bl
    spb = T // n_blocks
    uniform_conf = policy.name in ("random", "random_commit")
    win = ids[:, lp:]                                   # view: commits write into ids
    step_index = 0
    for blk in range(n_blocks):
        lo, hi = blk * bl, (blk + 1) * bl
        # Every block starts fully masked (earlier blocks are finished, prompts hold no mask),
        # so the counts need no device->host copy.
        n_masked = [hi - lo] * b
        per_row = [block_commit_counts(n, spb) for n in n_masked]
        host_counts = [[row[s] for row in per_row] for s in range(spb)]   # [spb][B]
        counts = torch.tensor(per_row, dtype=torch.long, device=ids.device)   # [B, spb]
        if uniform_conf:
            # All of the block's draws at once: one host->device copy per block rather than a
            # synchronising copy per step (per-row generators live on the host).
            block_u = uniform(b, (spb, hi - lo), generator, ids.device)
        for s in range(spb):
            t = T - step_index
            step_index += 1
            logits = window_logits(model, ids, attn, lp, policy.cfg_scale)   # [B, K, V]
            masked_before = win == mask_id
            x0, conf = _block_tokens(logits[:, lo:hi], policy, generator, mask_id, uniform_conf)
            if uniform_conf:
                chosen = _select_top(block_u[:, s], counts[:, s], masked_before[:, lo:hi])
            else:
                chosen = _topk_over_rows(conf, masked_before[:, lo:hi], host_counts[s],
                                         lp + lo, ids.shape[1], per_row=True)
            # torch.where, not boolean indexing: no host sync, so the next forward's kernels
            # are queued while this step's run.
            win[:, lo:hi] = torch.where(chosen, x0, win[:, lo:hi])
            if recorder is not None:
                committed = torch.zeros_like(masked_before)
                committed[:, lo:hi] = chosen
                recorder.step(t, logits, masked_before, committed, win.clone())


def _decode_schedule(model, ids, attn, lp, policy: DecodePolicy, generator, recorder) -> None:
    """Dream-style decoding over the timestep schedule ``linspace(1, eps, steps + 1)``."""
    mask_id = int(model.mask_id)
    b, k, T = ids.shape[0], policy.gen_length, policy.steps
    timesteps = torch.linspace(1, policy.eps, T + 1)
    win = ids[:, lp:]
    # Masked counts per row, tracked on the host: top-k commits exactly min(n, masked) per row,
    # so no step needs a device->host copy (origin's random commits excepted).
    n_masked = [k] * b
    for i in range(T):
        t_step = T - i
        last = i == T - 1
        t, s = timesteps[i], timesteps[i + 1]
        logits = window_logits(model, ids, attn, lp, 0.0)
        masked = win == mask_id
        x0, conf = _schedule_tokens(logits, policy, generator, mask_id)
        if last:
            chosen = masked.clone()
        elif policy.name == "origin":
            p_transfer = float(1 - s / t)
            u = uniform(b, (k,), generator, ids.device)
            chosen = masked & (u < p_transfer)
        else:
            mean_masked = torch.tensor(float(sum(n_masked)), dtype=torch.float32) / b
            n = int(mean_masked * (1 - s / t))
            counts = torch.full((b,), n, dtype=torch.long, device=ids.device)
            if n <= 0:
                chosen = torch.zeros_like(masked)
            elif policy.alg_temp > 0:
                scores = torch.log_softmax(
                    conf.double().masked_fill(~masked, float("-inf")) / policy.alg_temp, dim=-1)
                u = uniform(b, (k,), generator, ids.device)
                scores = scores - torch.log(-torch.log(u))   # Gumbel-top-k = sampling w/o replacement
                chosen = _select_top(scores, counts, masked)
            else:
                chosen = _topk_over_rows(conf, masked, [n] * b, lp, ids.shape[1], per_row=False)
        win.copy_(torch.where(chosen, x0, win))
        if last:
            n_masked = [0] * b
        elif policy.name == "origin":
            n_masked = (win == mask_id).sum(-1).tolist()
        else:
            n_masked = [m - min(max(n, 0), m) for m in n_masked]
        if recorder is not None:
            recorder.step(t_step, logits, masked, chosen, win.clone())
