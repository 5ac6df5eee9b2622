"""``tmas``: DLLMQuant's Temporal-Mask Adaptive Sampling (Xu & Yang, arXiv 2508.14090, the TMAS
part of its method section) as the calibration data of a FlatQuant calibration.

Sources: the paper's abstract (arXiv 2508.14090v2) and secondary accounts of its method
section, quoted below; its full method text was not readable where this was written, so its
section and equation numbers are not given (docs/fidelity.md, "TMAS and MCS").

DLLMQuant's first issue: "iterative generation and dynamic masking ratios lead to distinct token
distributions across decoding steps, which are not adequately captured by existing PTQ
calibration methods". TMAS, "a calibration method that accounts for both time and mask
factors", draws the calibration inputs from the model's own generation: it "divides the
iterative generation into blocks and selects calibration inputs at specific time intervals,
ensuring coverage of diverse mask ratios across all timesteps" (the survey arXiv 2506.13759,
Appendix E.I, summarising the paper), "collects calibration data from various time steps and
masking ratios" (its OpenReview reviews), with the sampling proportion ``[0.3, 0.2, 0.2, 0.3]``
over those blocks (ibid.: the paper's own setting, more samples at the first and the last
stage of the generation).

What is implemented:

* states from the FP model's own denoising trajectory, not random masks: each calibration
  window ``x`` (length ``L``) is split into a prompt ``x[:L-G]`` and a generation window of
  ``G`` positions, fully masked at the start, ``G = L - floor(prompt_ratio * L)`` cut down to
  whole blocks of a block policy (LLaDA's), or ``decoding.gen_length``; the FP teacher decodes
  it with its family's default decoding policy (``adapter.decoding``: LLaDA's low-confidence
  remasking in semi-autoregressive blocks, Dream's entropy order), ``gen_length = G`` and
  ``steps`` (default ``G``: one token a step, as the families' defaults); overrides in
  ``decoding``. A window's decoding stops once its snapshot is taken (the later steps would be
  discarded), so the cost is about half of ``n`` full generations;
* the timeline split into ``S = len(stage_proportions)`` contiguous stages of the ``T`` decoding
  steps (in decoding order, step index ``s = 0..T-1``; stage ``j`` covers ``[floor(j T / S),
  floor((j + 1) T / S))``), stage ``j`` receiving ``n_j`` of the ``n`` calibration sequences,
  ``n_j`` the largest-remainder rounding of ``n * p_j`` (ties: the earlier stage), ``p =
  [0.3, 0.2, 0.2, 0.3]``;
* which window goes to which stage: a seeded permutation of the ``n`` windows, the first
  ``n_0`` to stage 0, the next ``n_1`` to stage 1, ...; within stage ``j`` its ``n_j`` windows
  are snapshotted at evenly spaced steps, ``s = a_j + floor((i + 1/2) (b_j - a_j) / n_j)``,
  ``i = 0..n_j - 1`` ("at specific time intervals");
* a snapshot is the model's input at the start of step ``s``: the prompt, the tokens committed
  by the previous ``s`` steps, the mask token elsewhere. With one token a step its mask ratio
  over the window is ``1 - s / T``: time and mask ratio are the same axis, so the stages are
  mask-ratio bands too ("temporal-mask");
* every position in the loss, uniformly (TMAS changes the data only; DLLMQuant's token
  weighting belongs to its CGQ, a GPTQ-Hessian weighting, not to TMAS). The FP teacher's targets
  are its outputs on the same snapshots (``calibrate.run``).

Choices the paper leaves open, made here (docs/fidelity.md, "TMAS and MCS"): the prompt split
(``prompt_ratio`` 0.25, as Quant-dLLM's visible prefix, so that the two baselines differ only
in how the masked states arise), the decoding (the family's default policy), the even spacing
within a stage, the assignment of windows to stages by a seeded permutation, one snapshot per
window (``n`` calibration rows, as FlatQuant's ``n`` windows). Same seed, same snapshots: the
permutation draws from the calibration generator, and the default policies decode greedily
(temperature 0); a sampling policy draws from the same generator.

Settings: FlatQuant's (``flatquant``), plus ``prompt_ratio`` (0.25), ``stage_proportions``
([0.3, 0.2, 0.2, 0.3]) and ``decoding`` (overrides of the family's policy; ``gen_length`` is
always ``G``).
"""
from __future__ import annotations

import math

import torch

from .flatquant import FlatQuantMethod

STAGE_PROPORTIONS = (0.3, 0.2, 0.2, 0.3)
DECODE_CHUNK = 16     # windows decoded together (rows are independent; memory only)


def stage_counts(n: int, proportions) -> list[int]:
    """``n`` split by ``proportions``: floors of ``n * p_j``, the remainder one each to the
    largest fractional parts (earlier stage first on ties)."""
    raw = [n * float(p) for p in proportions]
    counts = [math.floor(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda j: (-(raw[j] - counts[j]), j))
    for j in order[: n - sum(counts)]:
        counts[j] += 1
    return counts


def stage_bounds(steps: int, n_stages: int) -> list[tuple[int, int]]:
    """Stage j's step indices [floor(j T / S), floor((j + 1) T / S))."""
    return [(j * steps // n_stages, (j + 1) * steps // n_stages) for j in range(n_stages)]


def snapshot_steps(steps: int, proportions, n: int) -> list[int]:
    """The step index of each stage slot, stage by stage (length ``n``)."""
    out = []
    for (a, b), c in zip(stage_bounds(steps, len(proportions)), stage_counts(n, proportions)):
        out += [a + math.floor((i + 0.5) * (b - a) / c) for i in range(c)]
    return out


class _Done(Exception):
    """Every snapshot of a chunk is taken: its decoding stops there."""


class _Snapshots:
    """Decoding recorder keeping row r's window at the start of step index ``want[r]``; raises
    :class:`_Done` once it has them all (the later steps would be discarded)."""

    def __init__(self, want: list[int], mask_id: int):
        self.want = want
        self.mask_id = mask_id
        self.states: list[torch.Tensor | None] = [None] * len(want)

    def start(self, batch, gen_length, steps):
        self.steps = steps
        self.index = 0

    def step(self, t, logits, masked, committed, window):
        # the input of this step: the window after it with the positions masked before it
        before = torch.where(masked, torch.full_like(window, self.mask_id), window).cpu()
        for r, s in enumerate(self.want):
            if s == self.index:
                self.states[r] = before[r].clone()
        self.index += 1
        if self.index > max(self.want):
            raise _Done

    def finish(self, tokens):
        pass


class TMASMethod(FlatQuantMethod):
    type_name = "tmas"

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        g = self.cfg.get("prompt_ratio", 0.25)
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 < g < 1:
            raise ValueError(f"tmas: prompt_ratio must lie in (0, 1), got {g!r}")
        p = list(self.cfg.get("stage_proportions", STAGE_PROPORTIONS))
        if not p or any(isinstance(x, bool) or not isinstance(x, (int, float)) or x < 0 for x in p) \
                or abs(sum(p) - 1.0) > 1e-6:
            raise ValueError(f"tmas: stage_proportions must be non-negative and sum to 1, got {p!r}")
        if not isinstance(self.cfg.get("decoding", {}), dict):
            raise ValueError("tmas: decoding must be a mapping of decoding settings")

    @property
    def prompt_ratio(self) -> float:
        return float(self.cfg.get("prompt_ratio", 0.25))

    @property
    def stage_proportions(self) -> list[float]:
        return [float(x) for x in self.cfg.get("stage_proportions", STAGE_PROPORTIONS)]

    def policy(self, loaded, length: int):
        """The teacher's decoding policy for windows of ``length`` tokens: the family's default
        with the ``decoding`` overrides; ``gen_length`` G: the override, else the rest after
        ``floor(prompt_ratio * length)`` prompt tokens, cut down to whole blocks of a block
        policy (LLaDA's); ``steps``: the override, else G."""
        from ..decoding import BLOCK_POLICIES, make_policy

        over = dict(self.cfg.get("decoding") or {})
        gen = over.pop("gen_length", None)
        if gen is None:
            gen = length - int(self.prompt_ratio * length)
            defaults = dict(loaded.adapter.decoding)
            name = over.get("policy", over.get("name", defaults.get("policy", defaults.get("name"))))
            block = over.get("block_length", defaults.get("block_length"))
            if name in BLOCK_POLICIES and block:
                gen -= gen % int(block)
        if not 1 <= int(gen) < length:
            raise ValueError(f"tmas: a generation window of {gen} tokens leaves no prompt or no "
                             f"window in calibration sequences of {length} tokens")
        over.setdefault("steps", int(gen))
        return make_policy(loaded, over, gen_length=int(gen))

    @torch.no_grad()
    def calibration_inputs(self, loaded, ids, generator):
        from ..decoding import generate

        ids = torch.as_tensor(ids).long().cpu()
        n, length = ids.shape
        policy = self.policy(loaded, length)
        prompt = length - policy.gen_length
        mask_id = int(loaded.mask_id)
        if bool((ids[:, :prompt] == mask_id).any()):
            raise ValueError("tmas: a calibration prompt contains the mask token")
        steps = snapshot_steps(policy.steps, self.stage_proportions, n)
        order = torch.randperm(n, generator=generator).tolist()
        want = [0] * n
        for slot, row in enumerate(order):
            want[row] = steps[slot]
        out = ids.clone()
        was_training = loaded.model.training
        loaded.model.eval()
        # windows decoded together in order of their snapshot step: a chunk stops at its last
        by_step = sorted(range(n), key=lambda r: (want[r], r))
        try:
            for lo in range(0, n, DECODE_CHUNK):
                rows = by_step[lo:lo + DECODE_CHUNK]
                rec = _Snapshots([want[r] for r in rows], mask_id)
                try:
                    generate(loaded, [ids[r, :prompt].tolist() for r in rows], policy,
                             generator=generator, recorder=rec)
                except _Done:
                    pass
                for i, r in enumerate(rows):
                    if rec.states[i] is None:
                        raise RuntimeError(f"tmas: decoding never reached step {want[r]}")
                    out[r, prompt:] = rec.states[i]
        finally:
            loaded.model.train(was_training)
        return out, None
