"""Masked-diffusion decoding for any family, batched with left padding.

Every family is driven through ``LoadedModel.logits(ids, attention_mask)`` (logit shift already
applied) and the model's ``mask_id`` / ``pad_id``; the commit rule comes from the policy name.

Steps are numbered ``t = T`` (first step, window fully masked) down to ``1`` (last step). A
recorder, when given, sees every step: ``recorder.start(batch, gen_length, steps)``, then
``recorder.step(t, logits, masked, committed, window)`` with the window logits ``[B, K, V]`` the
commit decision used (after classifier-free guidance, before temperature), the positions masked
at the start of the step, the positions committed during it and the window after it, and
finally ``recorder.finish(tokens)``.

The mask token: the authors' decoders commit a chosen token that is the mask token itself (an
argmax or a sample; only an untrained model gives it weight) as it is, and so does every policy
here but ``random_commit``: the position stays masked, is a candidate again at later steps (in
a later block too, with LLaDA's blocks) and may still be masked at the end, in the output.
``random_commit``, the project's Stage I policy, commits the best other token instead.

Early exit: given a :class:`~fair_calib.decoding.early_exit.StopRule`, a row whose output is
final (``early_exit``: every position before its first committed stop token is committed, or a
complete stop string is) is stopped and dropped from the batch; positions after its stop stay
``mask_id``. Off the CPU (``StopRule.drop_rows``) the batch instead keeps its shape and stops
once every row is final: a GPU's kernels, chosen by shape, may round a smaller batch
differently, so only an unchanged shape is exact there by construction. So does a batch of
several rows decoded by Dream's count rule (``maskgit_plus``, ``topk_margin``, ``entropy``),
on any device: its per-step count is a mean over every row's masked count, which a dropped
row, whose later commits may be the mask token, no longer gives. The rows that go on compute
exactly what they would have in the full batch: the window keeps its width and left padding,
batch-wide random draws are still drawn for every row and the finished rows' draws discarded
(per-row generators of finished rows are simply no longer drawn from). Token identity with the
full run then needs only a forward pass whose rows do not depend on the batch size (true on
CPU; see docs/fidelity.md). A recorder sees every step of every row, so recording turns early
exit off.

Randomness: ``generator`` is ``None`` (torch's global RNG), one ``torch.Generator`` (draws for
the whole batch at once) or a sequence of generators, one per row; with per-row generators a
row's random stream does not depend on the other rows in the batch.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from fair_calib.decoding.early_exit import ExitTracker, StopRule
from fair_calib.decoding.policies import (BLOCK_POLICIES, RANDOM_COMMIT_POLICIES, DecodePolicy,
                                        block_commit_counts)

# Dream's policies whose per-step count is int(mean masked count over the batch * (1 - s/t))
COUNTED_SCHEDULE_POLICIES = ("maskgit_plus", "topk_margin", "entropy")

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
    ``un + (cfg + 1) * (cond - un)``). The logits are the model's, the mask token's included.
    ``attn`` is None when no row is padded. The LM head runs on the window only."""
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
    count; it runs on the whole batch, as no row leaves a batch whose count is shared: which
    of several tied positions CUDA's topk returns can depend on the number of rows). Returns
    the chosen positions ``[B, W]``."""
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


def _gumbel_argmax(logits: torch.Tensor, temperature: float, batch: "_ActiveRows") -> torch.Tensor:
    """Gumbel-max in float64: argmax of ``exp(l) / (-log U)^temperature`` (log form)."""
    u = batch.uniform(tuple(logits.shape[1:]))
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
    """Replace a predicted mask token by the best other token (by ``scores``): ``random_commit``
    only, the project's Stage I policy, whose probe reads one commit step per position. The
    authors' decoders (LLaDA's ``generate.py``, Dream's ``_sample``) commit an argmax or sample
    that is the mask token as it is, and so do the policies that follow them."""
    top2 = torch.topk(scores, 2, dim=-1).indices
    best_other = torch.where(top2[..., 0] == mask_id, top2[..., 1], top2[..., 0])
    return torch.where(x0 == mask_id, best_other, x0)


def _schedule_tokens(logits: torch.Tensor, policy: DecodePolicy, batch: "_ActiveRows"
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and confidences for the schedule policies (Dream's token step)."""
    # The model's dtype throughout, as Dream's ``sample_tokens`` computes (bfloat16 in its
    # evaluation): the confidences, and so their ties, are the authors'.
    lg = logits
    if policy.temperature > 0:
        lg = lg / policy.temperature
    lg = _filter_top_p_top_k(lg, policy.top_p, policy.top_k)
    probs = torch.softmax(lg, dim=-1)
    # The mask token is a token like any other here, as in ``sample_tokens``: an argmax or a
    # sample that is the mask is committed and leaves its position masked.
    if policy.temperature > 0:
        x0 = _gumbel_argmax(torch.log(probs.double()), 1.0, batch)
        conf = probs.gather(-1, x0[..., None]).squeeze(-1)
    else:
        conf, x0 = probs.max(-1)
    if policy.name == "topk_margin":
        top2 = torch.topk(probs, 2, dim=-1).values
        conf = top2[..., 0] - top2[..., 1]
    elif policy.name == "entropy":
        conf = (probs * torch.log(probs + 1e-10)).sum(-1)
    return x0, conf


@torch.no_grad()
def generate(model: Any, prompts: Sequence[Sequence[int]], policy: DecodePolicy,
             generator: Generators = None, recorder: Any = None,
             stop: StopRule | None = None) -> torch.LongTensor:
    """Decode ``policy.gen_length`` tokens after each prompt; returns ``LongTensor[B, K]``.

    ``model`` is a :class:`~fair_calib.models.adapters.LoadedModel` (``.logits``, ``.mask_id``,
    ``.pad_id``). Prompts are token-id lists of any lengths (left-padded inside). ``stop``:
    stop each row once its output is final (module docstring); :func:`decode` also says how
    many steps each row ran.
    """
    return decode(model, prompts, policy, generator, recorder, stop).tokens


@dataclass
class Decoded:
    """``tokens`` ``[B, K]`` (a row stopped early keeps ``mask_id`` after its stop) and
    ``steps``: the forward passes each row took part in (``policy.steps`` without early exit)."""
    tokens: torch.LongTensor
    steps: list[int]


@torch.no_grad()
def decode(model: Any, prompts: Sequence[Sequence[int]], policy: DecodePolicy,
           generator: Generators = None, recorder: Any = None,
           stop: StopRule | None = None) -> Decoded:
    """:func:`generate`, returning the steps each row ran as well."""
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
    # A recorder needs every step of every row (diagnostics, probing): no early exit then.
    tracker = ExitTracker(stop, mask_id, device) if stop is not None and recorder is None else None
    drop_rows = stop is not None and (stop.drop_rows if stop.drop_rows is not None
                                      else torch.device(device).type == "cpu")
    if b > 1 and policy.name in COUNTED_SCHEDULE_POLICIES:
        drop_rows = False           # the count reads every row's masks (module docstring)
    batch = _ActiveRows(ids, attn, lp, generator, tracker, drop_rows)

    if policy.name in BLOCK_POLICIES or policy.name in RANDOM_COMMIT_POLICIES:
        _decode_blocks(model, batch, policy, recorder)
    else:
        _decode_schedule(model, batch, policy, recorder)
    batch.write_back()

    out = ids[:, lp:].clone()
    if tracker is None and policy.name in RANDOM_COMMIT_POLICIES and bool((out == mask_id).any()):
        raise RuntimeError("decoding left masked positions in the window")  # a bug, not input
    if recorder is not None:
        recorder.finish(out)
    return Decoded(out, batch.steps)


class _ActiveRows:
    """The rows of a batch still decoding: their ids (the full batch's tensor until a row is
    dropped, then a copy), attention mask, original indices and random draws.

    Random draws keep each row's stream as in the full batch: one generator (or torch's global
    RNG) draws for every row of the full batch, and the finished rows' draws are discarded;
    per-row generators draw for the active rows only."""

    def __init__(self, ids: torch.Tensor, attn: torch.Tensor | None, lp: int,
                 generator: Generators, tracker: ExitTracker | None, drop_rows: bool = True) -> None:
        self.full, self.ids, self.attn, self.lp = ids, ids, attn, lp
        self.n_total = ids.shape[0]
        self.rows = list(range(self.n_total))
        self.generator = generator
        self.tracker = tracker
        self.drop_rows = drop_rows
        self._final: set[int] = set()     # rows found final, when they stay in the batch
        self.steps = [0] * self.n_total
        self._index: torch.Tensor | None = None      # rows on the device, once any row is dropped

    @property
    def win(self) -> torch.Tensor:
        return self.ids[:, self.lp:]                   # view: commits write into self.ids

    def __len__(self) -> int:
        return len(self.rows)

    def uniform(self, shape: tuple[int, ...]) -> torch.Tensor:
        """float64 uniforms ``[active rows, *shape]``, each row's from its stream in the full batch."""
        device = self.ids.device
        if self.generator is None or isinstance(self.generator, torch.Generator):
            u = uniform(self.n_total, shape, self.generator, device)
            return u if self._index is None else u[self._index]
        gens = list(self.generator)
        if len(gens) != self.n_total:
            raise ValueError(f"got {len(gens)} generators for a batch of {self.n_total} rows")
        return uniform(len(self.rows), shape, [gens[r] for r in self.rows], device)

    def forward(self, model: Any, cfg_scale: float) -> torch.Tensor | None:
        """One step's window logits for the active rows, dropping the rows found final; None
        once every row is final."""
        lagged = self.tracker is not None and self.tracker.lagged
        if self.tracker is not None and not lagged:
            self._finish(self.tracker.finished())
        if self._all_final():
            return None
        logits = window_logits(model, self.ids, self.attn, self.lp, cfg_scale)
        for r in self.rows:
            self.steps[r] += 1
        if lagged:
            # The check reads the previous step's window, copied while this forward was queued.
            keep = self._finish(self.tracker.finished())
            if keep is not None:
                logits = logits[keep]
        return None if self._all_final() else logits

    def _finish(self, done: list[int]) -> torch.Tensor | None:
        """Rows found final: dropped (returns the kept local indices, as :meth:`_drop`), or
        remembered until the whole batch is final."""
        if self.drop_rows:
            return self._drop(done)
        self._final.update(done)
        return None

    def _all_final(self) -> bool:
        return not self.rows or (not self.drop_rows and len(self._final) == len(self.rows))

    def committed(self) -> None:
        """After a step's commits: let the tracker see the window."""
        if self.tracker is not None and self.rows:
            self.tracker.observe(self.win, self.rows)

    def _drop(self, done: list[int]) -> torch.Tensor | None:
        """Write the final rows back into the full batch and drop them; returns the kept local
        indices (None when nothing is dropped)."""
        if not done:
            return None
        done_set = set(done)
        local_done = [i for i, r in enumerate(self.rows) if r in done_set]
        local_keep = [i for i, r in enumerate(self.rows) if r not in done_set]
        device = self.ids.device
        self.full[torch.tensor([self.rows[i] for i in local_done], device=device)] = \
            self.ids[torch.tensor(local_done, device=device)]
        keep = torch.tensor(local_keep, dtype=torch.long, device=device)
        self.ids = self.ids[keep]
        self.attn = None if self.attn is None else self.attn[keep]
        self.rows = [self.rows[i] for i in local_keep]
        self._index = torch.tensor(self.rows, dtype=torch.long, device=device)
        return keep

    def write_back(self) -> None:
        if self.ids is not self.full and self.rows:
            self.full[self._index] = self.ids


def _block_tokens(span: torch.Tensor, policy: DecodePolicy, batch: "_ActiveRows", mask_id: int,
                  uniform_conf: bool, eos_eot: tuple[int, int] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """LLaDA's token step: Gumbel-max (float64) or argmax, and the untempered softmax
    probability of the chosen token in the logits' dtype (``generate.py``).

    Its two options act on ``eos_eot = (EOS, EoT)`` as its code computes them:
    ``logits_eos_inf`` sets the EOS logit to -inf before the token choice (so EOS is never
    chosen, and gets probability 0 in the confidence softmax too); ``confidence_eos_eot_inf``
    runs ``logits_with_noise[:, :, EOS] = logits[:, :, EoT] = -inf`` after the choice. At
    temperature 0 ``add_gumbel_noise`` returns ``logits`` itself, so both ids get -inf in the
    softmax the confidence is read from; at temperature > 0 ``logits_with_noise`` is a float64
    copy, so only EoT does there (EOS keeps its probability)."""
    guard = policy.name in RANDOM_COMMIT_POLICIES       # _never_the_mask's one user
    if policy.logits_eos_inf:
        span = span.clone()
        span[..., eos_eot[0]] = float("-inf")
    if policy.temperature > 0:
        noisy_logits = span.double()
        if guard:
            noisy_logits[..., mask_id] = float("-inf")
        x0 = _gumbel_argmax(noisy_logits, policy.temperature, batch)
    else:
        x0 = span.argmax(-1)                 # the mask token included, as generate.py's argmax
    if uniform_conf:
        return (_never_the_mask(x0, span, mask_id) if guard else x0), None
    if policy.confidence_eos_eot_inf:
        span = span.clone()
        span[..., eos_eot[1]] = float("-inf")
        if policy.temperature == 0:
            span[..., eos_eot[0]] = float("-inf")
    probs = torch.softmax(span, dim=-1)
    return x0, probs.gather(-1, x0[..., None]).squeeze(-1)


def _eos_eot_ids(model: Any, policy: DecodePolicy) -> tuple[int, int] | None:
    """The (EOS, EoT) ids LLaDA's generate options act on; an error where they are asked for on
    a model whose family names none."""
    if not (policy.logits_eos_inf or policy.confidence_eos_eot_inf):
        return None
    ids = getattr(model, "eos_eot_ids", None)
    if ids is None:
        raise ValueError(f"decoding logits_eos_inf / confidence_eos_eot_inf need the family's "
                         f"(EOS, EoT) tokens (adapter eos_eot_tokens); family "
                         f"{getattr(getattr(model, 'adapter', None), 'name', '?')!r} has none")
    return int(ids[0]), int(ids[1])


def _decode_blocks(model, batch: _ActiveRows, policy: DecodePolicy, recorder) -> None:
    """LLaDA-style semi-autoregressive blocks; ``random_commit`` is one block with uniform
    confidences (positions uniformly at random among masked).

    As in ``generate.py``, a step's candidates are the masked positions from the window's start
    to the current block's end: a position of an earlier block where the mask token itself was
    committed (an argmax that is the mask) is still masked and competes again, in any later
    step, for that step's count, which ``generate.py`` computes from the current block alone."""
    mask_id = int(model.mask_id)
    b, k, T = len(batch), policy.gen_length, policy.steps
    bl = policy.block_len if policy.name in BLOCK_POLICIES else k
    n_blocks = k // bl
    spb = T // n_blocks
    uniform_conf = policy.name in ("random", "random_commit")
    eos_eot = _eos_eot_ids(model, policy)
    step_index = 0
    for blk in range(n_blocks):
        hi = (blk + 1) * bl
        # Every block starts fully masked (later positions are never candidates, prompts hold
        # no mask), so the counts need no device->host copy, and every row has the same counts.
        per_step = block_commit_counts(bl, spb)
        counts = torch.tensor([per_step] * b, dtype=torch.long, device=batch.ids.device)  # [B, spb]
        if uniform_conf:
            # All of the block's draws at once: one host->device copy per block rather than a
            # synchronising copy per step (per-row generators live on the host).
            block_u, block_rows = batch.uniform((spb, hi)), list(batch.rows)
        for s in range(spb):
            t = T - step_index
            step_index += 1
            logits = batch.forward(model, policy.cfg_scale)                 # [B, K, V]
            if logits is None:
                return
            win, n = batch.win, len(batch)
            masked_before = win == mask_id
            x0, conf = _block_tokens(logits[:, :hi], policy, batch, mask_id, uniform_conf,
                                     eos_eot)
            if uniform_conf:
                u = block_u if block_rows == batch.rows else block_u[
                    torch.tensor([block_rows.index(r) for r in batch.rows], device=block_u.device)]
                chosen = _select_top(u[:, s], counts[:n, s], masked_before[:, :hi])
            else:
                chosen = _topk_over_rows(conf, masked_before[:, :hi], [per_step[s]] * n,
                                         batch.lp, batch.ids.shape[1], per_row=True)
            # torch.where, not boolean indexing: no host sync, so the next forward's kernels
            # are queued while this step's run.
            win[:, :hi] = torch.where(chosen, x0, win[:, :hi])
            batch.committed()
            if recorder is not None:
                committed = torch.zeros_like(masked_before)
                committed[:, :hi] = chosen
                recorder.step(t, logits, masked_before, committed, win.clone())


class _MaskedCount:
    """The batch's masked positions after the last step, as Dream's ``_sample`` reads them
    (``mask_index.sum()``) for its commit count. A committed mask token leaves its position
    masked, so the count is read from the window rather than derived from the schedule. On a
    CUDA device it is copied asynchronously and read after the next forward is queued, so
    reading it adds no GPU idle time."""

    def __init__(self, initial: int) -> None:
        self._value = int(initial)
        self._pending: tuple[torch.Tensor, Any] | None = None

    def observe(self, window: torch.Tensor, mask_id: int) -> None:
        total = (window == mask_id).sum()
        if total.is_cuda:
            host = torch.empty((), dtype=total.dtype, pin_memory=True)
            host.copy_(total, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._pending = (host, event)
        else:
            self._value = int(total)

    def value(self) -> int:
        if self._pending is not None:
            host, event = self._pending
            event.synchronize()
            self._value, self._pending = int(host), None
        return self._value


def _decode_schedule(model, batch: _ActiveRows, policy: DecodePolicy, recorder) -> None:
    """Dream-style decoding over the timestep schedule ``linspace(1, eps, steps + 1)``."""
    mask_id = int(model.mask_id)
    b, k, T = len(batch), policy.gen_length, policy.steps
    timesteps = torch.linspace(1, policy.eps, T + 1)
    # The batch's masked count, which the count rule reads (origin does not): every row's, as
    # no row leaves such a batch of several rows (decode, drop_rows).
    n_masked = _MaskedCount(b * k)
    for i in range(T):
        t_step = T - i
        last = i == T - 1
        t, s = timesteps[i], timesteps[i + 1]
        logits = batch.forward(model, 0.0)
        if logits is None:
            return
        win, n_rows = batch.win, len(batch)
        masked = win == mask_id
        x0, conf = _schedule_tokens(logits, policy, batch)
        n = 0
        if last:
            chosen = masked.clone()
        elif policy.name == "origin":
            p_transfer = float(1 - s / t)
            u = batch.uniform((k,))
            chosen = masked & (u < p_transfer)
        else:
            mean_masked = torch.tensor(float(n_masked.value()), dtype=torch.float32) / b
            n = int(mean_masked * (1 - s / t))
            counts = torch.full((n_rows,), n, dtype=torch.long, device=win.device)
            if n <= 0:
                chosen = torch.zeros_like(masked)
            elif policy.alg_temp > 0:
                scores = torch.log_softmax(
                    conf.double().masked_fill(~masked, float("-inf")) / policy.alg_temp, dim=-1)
                u = batch.uniform((k,))
                scores = scores - torch.log(-torch.log(u))   # Gumbel-top-k = sampling w/o replacement
                chosen = _select_top(scores, counts, masked)
            else:
                chosen = _topk_over_rows(conf, masked, [n] * n_rows, batch.lp, batch.ids.shape[1],
                                         per_row=False)
        win.copy_(torch.where(chosen, x0, win))
        batch.committed()
        if policy.name != "origin" and not last:
            n_masked.observe(win, mask_id)
        if recorder is not None:
            recorder.step(t_step, logits, masked, chosen, win.clone())
