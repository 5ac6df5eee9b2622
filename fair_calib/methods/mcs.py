"""``mcs``: Quant-dLLM's Masked Calibration Simulation (Zhang et al., ICLR 2026, arXiv 2510.03274,
its method section's "Masked Calibration Simulation") as the calibration data of a FlatQuant
calibration.

Sources: the paper's abstract and its formulas as quoted by two notes on it (the
papernotes.org ICLR 2026 note; a paper note reproducing its S_MCS and forward-process
equations); its full text was not readable where this was written, so the section and equation
numbers are not given: the formulas are named by what they define (docs/fidelity.md, "TMAS and
MCS").

Quant-dLLM calibrates on masked, timestep-aware copies of fully visible calibration sequences
instead of the sequences themselves: "masked-denoising activations in dLLMs differ from the
fully visible signals assumed by standard PTQ methods". What MCS prescribes:

* the masked diffusion forward process (the paper's preliminaries): ``q(y_t | y) = Cat(alpha_t
  y + (1 - alpha_t) m)``, ``m`` the mask token: each position of ``y`` keeps its token with
  probability ``alpha_t`` (its visibility) and is the mask token otherwise;
* a deterministic, always visible prefix ``P = {1, ..., floor(gamma L)}`` of every length-``L``
  sequence, ``gamma = 0.25`` (its implementation details, default gamma = 0.25);
* for each timestep ``t`` of a grid ``T``, the visibility ``alpha(t)`` of the schedule, a binary
  mask ``r in {0,1}^L`` with ``r_i = 1`` on ``P`` and ``r_i ~ Bernoulli(alpha(t))`` i.i.d. on the
  other positions, and the simulated input ``x~_i(t) = x_i`` where ``r_i = 1``, ``[MASK]``
  elsewhere;
* every calibration sequence ``b`` at every ``t`` in ``T``, uniformly over the grid: the
  calibration statistics are ``S_MCS = E_{t~pi}[sum_b X~_b(t) X~_b(t)^T] ~= 1/|T| sum_{t in T}
  sum_b X~_b(t) X~_b(t)^T`` (the paper's S_MCS equation, the second moment its DAQ reads).

Here the same simulated inputs feed FlatQuant's layer-wise calibration (``flatquant``'s
transforms, clipping, optimiser and loss): each window of ``fair_calib.data.calibration_batch``
becomes ``|T|`` rows, one per timestep, all weighted alike (the uniform ``pi`` of S_MCS), every
position in the loss (S_MCS sums over every token, masked or not). The FP teacher's targets are
its outputs on the same masked rows (``calibrate.run``).

Choices the paper leaves open, made here (docs/fidelity.md, "TMAS and MCS"):

* the grid: ``T = {k / K : k = 1, ..., K}`` of mask ratios (``timesteps: K``, default 4), the
  visibility the linear schedule's ``alpha(t) = 1 - t`` (LLaDA's forward process; Dream's
  ``(1 - eps) t + eps`` differs by eps = 1e-3). ``t = 0`` (fully visible, plain PTQ data) is left
  out, ``t = 1`` (every position after the prefix masked: a generation's first step) is in. The
  paper gives the prior ``pi`` as uniform over a grid without naming the grid;
* ``gamma`` is ``prefix_ratio`` (default the paper's 0.25);
* the draws: one ``torch.rand`` of shape ``[n, K, L]`` from the calibration generator, position
  ``i > |P|`` of row ``(b, k)`` visible iff its draw is ``< alpha(t_k)``; row order ``b * K + k``.
  Same seed, same rows, bit for bit;
* the mask token is the model's own (``LoadedModel.mask_id``: LLaDA's ``<|mdm_mask|>``, Dream's
  ``<|mask|>``); the input construction is the same for both families (Dream's shifted logits
  change what its outputs predict, not its inputs);
* the cost: ``K`` times FlatQuant's calibration rows (S_MCS sums over every ``(b, t)``), so
  ``n_samples`` windows give ``n_samples * K`` rows; lower ``n_samples`` to match a budget.

Settings: FlatQuant's (``flatquant``), plus ``timesteps`` (4) and ``prefix_ratio`` (0.25).
"""
from __future__ import annotations

import torch

from .flatquant import FlatQuantMethod


def mask_ratios(timesteps: int) -> list[float]:
    """The grid T of mask ratios t_k = k / K, k = 1..K (visibility alpha = 1 - t)."""
    return [k / timesteps for k in range(1, timesteps + 1)]


class MCSMethod(FlatQuantMethod):
    type_name = "mcs"

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        k = self.cfg.get("timesteps", 4)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"mcs: timesteps must be a positive integer, got {k!r}")
        g = self.cfg.get("prefix_ratio", 0.25)
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not 0 <= g < 1:
            raise ValueError(f"mcs: prefix_ratio must lie in [0, 1), got {g!r}")

    @property
    def timesteps(self) -> int:
        return int(self.cfg.get("timesteps", 4))

    @property
    def prefix_ratio(self) -> float:
        return float(self.cfg.get("prefix_ratio", 0.25))

    @torch.no_grad()
    def calibration_inputs(self, loaded, ids, generator):
        ids = torch.as_tensor(ids).long().cpu()
        n, length = ids.shape
        k = self.timesteps
        prefix = int(self.prefix_ratio * length)            # |P| = floor(gamma L)
        visibility = 1.0 - torch.tensor(mask_ratios(k), dtype=torch.float64)   # alpha(t_k)
        draws = torch.rand((n, k, length), generator=generator, dtype=torch.float64)
        visible = draws < visibility[None, :, None]
        visible[:, :, :prefix] = True                       # r_i = 1 on the prefix
        rows = ids[:, None, :].expand(n, k, length)
        out = torch.where(visible, rows, torch.full_like(rows, int(loaded.mask_id)))
        return out.reshape(n * k, length).contiguous(), None
