"""The interface every quantization method implements.

A method turns the linears of one block (grouped by shared input, see
``fair_calib.quant.discovery``) into fake-quant modules, says which of their parameters are
calibrated, and saves/loads those parameters. The calibration driver (``fair_calib.calibrate``)
owns the loop; a method never loops over data itself, except through the statistics the driver
hands it (per-channel input maxima, optionally input Hessians).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from ..quant.discovery import LinearGroup, get_submodule, set_submodule
from ..quant.qlinear import InputQuant, QuantLinear
from ..quant.quantizers import ActQuantizer, WeightQuantizer


@dataclass
class GroupStats:
    """Statistics of one group's input over the calibration set (FP block)."""
    x_absmax: torch.Tensor            # [dim] per-channel max |x|
    tok_absmax_mean: float            # mean over tokens of the per-token max |x|
    n_tokens: int
    hessian: torch.Tensor | None = None   # [dim, dim] sum of x x^T (only if the method asks)


class QuantMethod:
    """Base class; subclasses override the ``make_*`` hooks and class attributes."""

    type_name: ClassVar[str] = "base"
    trainable: ClassVar[bool] = False       # the driver optimises ``parameters(block)``
    needs_hessian: ClassVar[bool] = False   # the driver collects sum x x^T per group
    quantizes: ClassVar[bool] = True        # False only for ``fp``

    def __init__(self, cfg: dict[str, Any], w_bits: int, a_bits: int, seed: int = 0):
        self.cfg = dict(cfg)
        self.w_bits = int(w_bits)
        self.a_bits = int(a_bits)
        self.seed = int(seed)

    # --- training hyperparameters the driver reads ------------------------------------------
    @property
    def weighting(self) -> str:
        """'uniform' or 'prior' (position weights from Stage I)."""
        return str(self.cfg.get("weighting", "uniform"))

    def training_settings(self) -> dict[str, Any]:
        return {"epochs": int(self.cfg.get("epochs", 15)), "lr": float(self.cfg.get("lr", 5e-3)),
                "batch_size": self.cfg.get("batch_size"),
                "propagate": str(self.cfg.get("propagate", "fp")),
                "weight_decay": float(self.cfg.get("weight_decay", 0.0)),
                "clip_lr_mult": 1.0, "eta_min_ratio": 0.0, "normalize_loss": False,
                "shuffle": bool(self.cfg.get("shuffle", True))}

    # --- calibration data ---------------------------------------------------------------------
    def calibration_inputs(self, loaded, ids: torch.Tensor, generator: torch.Generator
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The calibration sequences the blocks are fitted on, from the fully observed windows
        ``ids`` ``[n, L]`` (``fair_calib.data.calibration_batch``), and position weights ``[L]``
        for the loss (None: uniform, or the method's own weighting). Called by
        ``calibrate.run`` before anything else touches the model (the FP model: its own
        denoising states may be drawn here); the FP teacher's targets are then its outputs on
        the returned sequences. ``generator``: the only source of randomness (seeded from the
        calibration seed). Default: the windows unchanged (every method but the dLLM
        calibration-data baselines ``tmas`` and ``mcs``)."""
        return ids, None

    # --- model-level hooks --------------------------------------------------------------------
    def prepare_model(self, loaded) -> None:
        """Change the FP model before calibration/loading (QuaRot: fold norms, rotate)."""

    # --- block-level hooks --------------------------------------------------------------------
    def make_input_quant(self, group: LinearGroup, j: int, stats: GroupStats | None,
                         block: nn.Module, block_index: int) -> InputQuant | None:
        return InputQuant(group.in_features, ActQuantizer(self.a_bits))

    def make_weight_quant(self, name: str, linear: nn.Linear, inq: InputQuant | None,
                          stats: GroupStats | None) -> WeightQuantizer:
        return WeightQuantizer(linear.out_features, self.w_bits)

    def make_quant_linear(self, linear: nn.Linear, inq: InputQuant | None, wq: WeightQuantizer,
                          user: int) -> QuantLinear:
        """The fake-quant module that replaces ``linear`` (DuQuant's float16 layers: their own)."""
        return QuantLinear(linear, inq, wq, user=user)

    def after_wrap(self, block: nn.Module, groups: list[LinearGroup],
                   stats: list[GroupStats] | None, block_index: int) -> None:
        """Called once the block's linears are wrapped (QuaRot runs GPTQ here)."""

    def quantize_block(self, block: nn.Module, groups: list[LinearGroup],
                       stats: list[GroupStats] | None, block_index: int) -> None:
        """Replace the block's grouped linears by :class:`QuantLinear` modules, in place.

        ``stats`` is None when loading saved parameters (they are then overwritten by
        :meth:`load_block_state`)."""
        if not self.quantizes:
            return
        for j, group in enumerate(groups):
            gs = stats[j] if stats is not None else None
            first = get_submodule(block, group.names[0])
            dev = first.weight.device
            inq = self.make_input_quant(group, j, gs, block, block_index)
            if inq is not None:
                inq.to(dev)
                inq.n_users = len(group.names)
            for k, name in enumerate(group.names):
                lin = get_submodule(block, name)
                if isinstance(lin, QuantLinear):
                    raise RuntimeError(f"{name} is already quantized")
                wq = self.make_weight_quant(name, lin, inq, gs).to(dev)
                set_submodule(block, name, self.make_quant_linear(lin, inq, wq, k))
        if stats is not None:
            self.after_wrap(block, groups, stats, block_index)

    def param_groups(self, block: nn.Module, lr: float) -> list[dict[str, Any]]:
        """AdamW parameter groups of a wrapped block (default: one group at ``lr``)."""
        return [{"params": self.parameters(block), "lr": lr}]

    def fit_block(self, block: nn.Module, groups: list[LinearGroup], inputs, block_index: int,
                  run) -> None:
        """Data-driven fitting of a wrapped block before its loss is read (QuaRot: sequential
        GPTQ). ``run(b)`` calls the block on micro-batch b (no grad, the driver's autocast)."""

    def propagation(self, block: nn.Module):
        """Context in which the driver computes a block's outputs for the next block with
        ``propagate: quant`` (QuaRot: activation quantizers off)."""
        return contextlib.nullcontext()

    def parameters(self, block: nn.Module) -> list[nn.Parameter]:
        """Calibrated parameters of a wrapped block (deduplicated, requires_grad)."""
        seen: dict[int, nn.Parameter] = {}
        for m in block.modules():
            if isinstance(m, QuantLinear):
                for sub in (m.inq, m.wq):
                    if sub is None:
                        continue
                    for p in sub.parameters():
                        if p.requires_grad:
                            seen.setdefault(id(p), p)
        return list(seen.values())

    def export_info(self, loaded, out_dir) -> dict:
        """Write the packed deployment file and report its measured size (meta.json entries).

        Runs for quantizing methods unless ``export: false``; the file ``export.safetensors`` is
        deleted after measuring unless ``keep_export: true`` (it is as large as the model in 4 bits).
        """
        from pathlib import Path

        from ..quant.export import export_quantized, fp_bf16_bytes

        info = {"fp_bf16_bytes": fp_bf16_bytes(loaded.model)}
        if not self.quantizes or not bool(self.cfg.get("export", True)):
            return info
        path = Path(out_dir) / "export.safetensors"
        info.update(export_quantized(loaded.model, path))
        info["export_kept"] = bool(self.cfg.get("keep_export", False))
        if not info["export_kept"]:
            path.unlink()
        return info

    # --- saving / loading ---------------------------------------------------------------------
    def block_state(self, block: nn.Module, groups: list[LinearGroup]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if not self.quantizes:
            return out
        for j, group in enumerate(groups):
            first = get_submodule(block, group.names[0])
            if first.inq is not None:
                for k, v in first.inq.state_dict().items():
                    out[f"g{j}.{k}"] = v.detach().float().cpu()
            for name in group.names:
                ql = get_submodule(block, name)
                for k, v in ql.wq.state_dict().items():
                    out[f"{name}.wq.{k}"] = v.detach().float().cpu()
                out.update(self.extra_linear_state(name, ql))
        return out

    def extra_linear_state(self, name: str, ql: QuantLinear) -> dict[str, torch.Tensor]:
        return {}

    def load_extra_linear_state(self, name: str, ql: QuantLinear, state: dict[str, torch.Tensor]) -> None:
        pass

    @torch.no_grad()
    def load_block_state(self, block: nn.Module, groups: list[LinearGroup],
                         state: dict[str, torch.Tensor]) -> None:
        if not self.quantizes:
            return
        used: set[str] = set()
        for j, group in enumerate(groups):
            first = get_submodule(block, group.names[0])
            if first.inq is not None:
                sub = {k[len(f"g{j}."):]: v for k, v in state.items() if k.startswith(f"g{j}.")}
                _load_exact(first.inq, sub, f"group {j}")
                used.update(f"g{j}.{k}" for k in sub)
            for name in group.names:
                ql = get_submodule(block, name)
                pre = f"{name}.wq."
                sub = {k[len(pre):]: v for k, v in state.items() if k.startswith(pre)}
                _load_exact(ql.wq, sub, name)
                used.update(pre + k for k in sub)
                self.load_extra_linear_state(name, ql, state)
                used.update(k for k in state if k.startswith(f"{name}.") and not k.startswith(pre))
        extra = set(state) - used
        if extra:
            raise KeyError(f"saved block state has unknown keys {sorted(extra)[:5]}")


def _load_exact(mod: nn.Module, sub: dict[str, torch.Tensor], what: str) -> None:
    own = mod.state_dict()
    missing = [k for k in own if k not in sub and own[k] is not None]
    unexpected = [k for k in sub if k not in own]
    if missing or unexpected:
        raise KeyError(f"{what}: saved state mismatch (missing {missing}, unexpected {unexpected})")
    for k, v in sub.items():
        t = own[k]
        if t.shape != v.shape:
            raise ValueError(f"{what}.{k}: shape {tuple(v.shape)} != {tuple(t.shape)}")
        t.copy_(v.to(t.dtype))


def fold_block(block: nn.Module, drop_fp: bool = False) -> None:
    """Fold every fake-quant linear of ``block``; ``drop_fp``: then free their FP weights.
    Linears already running on their integer codes (``lowbit.attach_block``) are left alone."""
    for m in block.modules():
        if isinstance(m, QuantLinear) and m.backend is None:
            m.fold()
            if drop_fp:
                m.drop_fp_weight()
