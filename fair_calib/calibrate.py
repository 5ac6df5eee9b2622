"""Stage II: layer-wise calibration of a quantization method.

For every transformer block, in order:
1. FP targets h* of the block on the calibration inputs (no_grad), with per-group input
   statistics (channel maxima; input Hessians when the method asks);
2. the method wraps the block's linears (grouped by shared input, found without family names);
3. trainable methods optimise their parameters on sum_i w_bar_i ||h^q_i - h*_i||^2 (mean over
   batch and hidden dim; w_bar normalised to mean 1, uniform for FlatQuant, the Stage I prior
   for FAIR-Calib) with AdamW and a cosine schedule;
4. the block's parameters go to ``blocks/{i}.safetensors`` (atomic); a rerun resumes after the
   last finished block (its recorded settings must match);
5. the next block is fed the FP outputs (``propagate: fp``, FlatQuant), or the quantized outputs
   (``propagate: quant``: targets are then the FP block's outputs on those quantized inputs;
   QuaRot's and QDrop's loops), or the quantized outputs with the FP teacher's hidden states as
   targets (``propagate: teacher``, FAIR-Calib's Eq. layerwise_loss: h^q_l(x; theta_<=l) of the
   quantized model with earlier blocks calibrated and frozen, against h*_l(x) of the FP model;
   a second, FP stream is carried; input statistics come from the quantized stream).
Finally ``stats.parquet``, ``params.safetensors`` and, last, ``meta.json`` are written; the output
is complete only once ``meta.json`` exists.
"""
from __future__ import annotations

import argparse
import json
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .jobs import io, numerics
from .jobs.memory import PeakMemory
from .methods import make_method
from .methods.base import GroupStats, QuantMethod
from .quant.blockio import BlockInputs, call_block, capture_block_inputs
from .quant.discovery import discover_groups, get_submodule, groups_to_json
from .quant.qlinear import InputQuant, QuantLinear
from .quant.transforms import (AffineTransform, InvertibleFactor, plan_squarings,
                               set_squaring_plans, squaring_norms)



def stats_schema():
    """Schema of ``stats.parquet`` (pyarrow imported lazily: GPU benchmark images lack it)."""
    import pyarrow as pa

    return pa.schema([("block", pa.int32()), ("epoch", pa.int32()), ("loss", pa.float64()),
                      ("seconds", pa.float64()), ("peak_mem_mb", pa.float64()),
                      ("peak_mem_kind", pa.string())])
FORMAT_VERSION = 1
PROPAGATE = ("fp", "quant", "teacher")


class NonFiniteError(RuntimeError):
    """A NaN/inf appeared while calibrating a block; the message names the block."""


def _memory(mem: PeakMemory) -> dict[str, Any]:
    """The stats row's memory columns: the peak so far and what it measures."""
    return {"peak_mem_mb": mem.peak_mb(), "peak_mem_kind": mem.kind}


def weighted_mse(out: torch.Tensor, target: torch.Tensor, w: torch.Tensor | None) -> torch.Tensor:
    """mean_{b,i} w_i * mean_d (out - target)^2 ; ``w`` is [L] (mean 1) or None (uniform)."""
    per_pos = (out.float() - target.float()).pow(2).mean(dim=-1)       # [b, L]
    if w is None:
        return per_pos.mean()
    if w.shape[0] != per_pos.shape[-1]:
        raise ValueError(f"position weights have length {w.shape[0]}, sequences {per_pos.shape[-1]}")
    return (per_pos * w.to(per_pos.device)).mean()


def normalise_weights(w) -> torch.Tensor:
    w = torch.as_tensor(w, dtype=torch.float64).flatten()
    if w.numel() == 0 or not torch.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ValueError("position weights must be finite, non-negative, not all zero")
    return (w / w.mean()).float()


def _cast_floating(obj: Any, dtype: torch.dtype, device: torch.device | None = None) -> Any:
    if isinstance(obj, torch.Tensor):
        obj = obj.to(device) if device is not None else obj
        return obj.to(dtype) if obj.is_floating_point() else obj
    if isinstance(obj, tuple):
        return tuple(_cast_floating(o, dtype, device) for o in obj)
    if isinstance(obj, list):
        return [_cast_floating(o, dtype, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _cast_floating(v, dtype, device) for k, v in obj.items()}
    return obj


def _autocast(device: torch.device, dtype: torch.dtype, enabled: bool):
    """bf16/fp16 autocast for the block's matmuls (CUDA, half-precision models only); the
    quantizers, transform matrices and the weight side W T^{-1} stay in float32."""
    return torch.autocast(device.type, dtype=dtype, enabled=enabled)


def _check_finite(t: torch.Tensor, what: str, block: int) -> None:
    if not bool(torch.isfinite(t).all()):
        raise NonFiniteError(f"non-finite values (NaN/inf) in {what} of block {block}")


@torch.no_grad()
def _targets_and_stats(block: nn.Module, inputs: BlockInputs, groups, want_hessian: bool,
                       block_index: int, store_dtype: torch.dtype = torch.float32):
    """FP outputs of ``block`` for every micro-batch, and per-group input statistics."""
    amax: list[torch.Tensor | None] = [None] * len(groups)
    tok_sum: list[torch.Tensor | float] = [0.0] * len(groups)   # on the device: read once
    n_tok = [0] * len(groups)
    hess: list[torch.Tensor | None] = [None] * len(groups)
    handles = []

    def make_hook(j):
        def hook(_m, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])
            a = x.abs().amax(dim=0)
            amax[j] = a if amax[j] is None else torch.maximum(amax[j], a)
            tok_sum[j] = tok_sum[j] + x.abs().amax(dim=-1).sum().double()
            n_tok[j] += x.shape[0]
            if want_hessian:
                h = x.T.double() @ x.double()
                hess[j] = h if hess[j] is None else hess[j] + h
        return hook

    for j, g in enumerate(groups):
        handles.append(get_submodule(block, g.names[0]).register_forward_pre_hook(make_hook(j)))
    try:
        targets = []
        for b in range(len(inputs)):
            out = call_block(block, inputs, b).detach().to(store_dtype)
            _check_finite(out, "the FP outputs", block_index)
            targets.append(out)
    finally:
        for h in handles:
            h.remove()
    stats = [GroupStats(x_absmax=amax[j], tok_absmax_mean=float(tok_sum[j]) / max(n_tok[j], 1),
                        n_tokens=n_tok[j], hessian=hess[j]) for j in range(len(groups))]
    return targets, stats


def _set_quant_training(block: nn.Module, mode: bool) -> None:
    for m in block.modules():
        if isinstance(m, InputQuant):
            m.train(mode)


@torch.no_grad()
def _eval_loss(block, inputs, targets, w, amp: torch.dtype | None = None) -> float:
    tot = torch.zeros((), dtype=torch.float64)
    for b in range(len(inputs)):
        with _autocast(inputs.hidden[b].device, amp or torch.bfloat16, amp is not None):
            loss = weighted_mse(call_block(block, inputs, b), targets[b], w)
        tot = tot.to(loss.device) + loss.double()
    return float(tot) / len(inputs)


def _make_optimizer(method: QuantMethod, block: nn.Module, tr: dict[str, Any], steps: int):
    """AdamW over the method's parameter groups, cosine schedule over ``steps`` to
    ``lr * eta_min_ratio`` (one absolute floor for every group, as FlatQuant's
    ``CosineAnnealingLR(eta_min=flat_lr * 1e-3)``)."""
    groups = method.param_groups(block, tr["lr"])
    params = [p for g in groups for p in g["params"]]
    fused = bool(params) and all(p.is_cuda for p in params)   # one kernel per step
    opt = torch.optim.AdamW(groups, lr=tr["lr"], weight_decay=tr["weight_decay"],
                            fused=fused or None)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(
        opt, T_max=steps, eta_min=tr["lr"] * tr.get("eta_min_ratio", 0.0))
    return opt, sched


class _StepChecks:
    """Each training step's finiteness check (loss, gradients) and the norms that size the
    next step's matrix exponentials, read with one host synchronisation per step."""

    def __init__(self, factors: list[InvertibleFactor], block_index: int):
        self.factors = factors
        self.block_index = block_index
        plan_squarings(factors)

    def after_step(self, loss: torch.Tensor, grads: list[torch.Tensor], epoch: int) -> None:
        loss_ok = torch.isfinite(loss.detach()).all()
        # max |g| per tensor is finite iff the tensor is (NaN propagates through max): a few
        # multi-tensor kernels instead of two per parameter
        grads_ok = (torch.isfinite(torch.stack(torch._foreach_max(torch._foreach_abs(grads)))).all()
                    if grads else loss_ok)
        norms = (squaring_norms(self.factors).flatten() if self.factors
                 else loss.new_zeros(0, dtype=torch.float32))
        host = torch.cat([torch.stack([loss_ok, grads_ok]).to(norms.dtype), norms]).double().cpu()
        if host[0] == 0:
            raise NonFiniteError(f"non-finite loss in block {self.block_index} (epoch {epoch})")
        if host[1] == 0:
            raise NonFiniteError(f"non-finite gradient in block {self.block_index} (epoch {epoch})")
        if self.factors:
            set_squaring_plans(self.factors, host[2:].view(-1, 2).tolist())

    def close(self) -> None:
        for f in self.factors:
            f.forget_plan()


def _train_block(method: QuantMethod, block: nn.Module, inputs: BlockInputs, targets, w,
                 block_index: int, tr: dict[str, Any], seed: int,
                 device: torch.device, mem: PeakMemory, log,
                 amp: torch.dtype | None = None) -> list[dict[str, Any]]:
    epochs = tr["epochs"]
    params = method.parameters(block)
    rows = []
    t0 = time.time()
    init = _eval_loss(block, inputs, targets, w, amp)
    if not math.isfinite(init):
        raise NonFiniteError(f"non-finite initial loss in block {block_index}")
    rows.append({"block": block_index, "epoch": -1, "loss": init, "seconds": time.time() - t0,
                 **_memory(mem)})
    if not params or epochs <= 0:
        return rows
    opt, sched = _make_optimizer(method, block, tr, epochs * len(inputs))
    gen = torch.Generator().manual_seed(seed * 7919 + block_index)
    checks = _StepChecks([m for m in block.modules() if isinstance(m, InvertibleFactor)],
                         block_index)
    transforms = [m for m in block.modules() if isinstance(m, AffineTransform)]
    _set_quant_training(block, True)
    try:
        for ep in range(epochs):
            t0 = time.time()
            tot = torch.zeros((), dtype=torch.float64, device=targets[0].device)
            order = (torch.randperm(len(inputs), generator=gen).tolist() if tr.get("shuffle", True)
                     else range(len(inputs)))   # FlatQuant: in order
            for b in order:
                # matrices are rebuilt once per step: a fused optimizer updates the parameters
                # without bumping their version counters, which key the transforms' cache
                for t in transforms:
                    t.clear_cache()
                with torch.enable_grad():
                    with _autocast(inputs.hidden[b].device, amp or torch.bfloat16, amp is not None):
                        out = call_block(block, inputs, b)
                        loss = weighted_mse(out, targets[b], w)
                    opt.zero_grad(set_to_none=True)
                    # FlatQuant divides the loss by its detached value (unit-size gradients)
                    (loss / loss.detach() if tr.get("normalize_loss") else loss).backward()
                opt.step()
                sched.step()
                # after the step: the next step's exponentials are planned from the new norms
                checks.after_step(loss, [p.grad for p in params if p.grad is not None], ep)
                tot += loss.detach().double()
            for p in params:
                _check_finite(p.detach(), "the calibrated parameters", block_index)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            ep_loss = float(tot) / len(inputs)
            rows.append({"block": block_index, "epoch": ep, "loss": ep_loss,
                         "seconds": time.time() - t0, **_memory(mem)})
            log(f"block {block_index} epoch {ep}: loss {ep_loss:.6g}")
    finally:
        _set_quant_training(block, False)
        checks.close()
        for t in transforms:      # the last step changed the parameters (unseen by the cache)
            t.clear_cache()
    return rows


def _cache_matrices(block: nn.Module, on: bool) -> None:
    """While a block is calibrated (``on``), its transforms reuse their matrices until a
    parameter changes (:meth:`AffineTransform._mats`' step cache, keyed on the parameters'
    versions and the grad mode): the forward passes without training (initial loss,
    propagation) build them once instead of once per micro-batch, and within a training step
    the activation side and every linear's weight side share one construction (and one
    backward)."""
    for t in block.modules():
        if isinstance(t, AffineTransform):
            t.step_cache = on
            t.clear_cache()


def _restore_dtype(method: QuantMethod, block: nn.Module, groups, state, dtype: torch.dtype) -> None:
    """Cast the block back to the model dtype; calibrated parameters stay float32 (reloaded)."""
    if dtype == torch.float32:
        return
    block.to(dtype)
    for m in block.modules():
        if isinstance(m, QuantLinear):
            m.wq.float()
            if m.inq is not None:
                m.inq.float()
    method.load_block_state(block, groups, state)


@dataclass
class _Settings:
    """What every block's steps read: fixed before the first block."""
    method: QuantMethod
    tr: dict[str, Any]
    w: torch.Tensor | None
    batch_size: int
    resume_key: str
    blocks_dir: Path
    home: torch.device
    device: torch.device
    model_dtype: torch.dtype
    amp: bool
    mem: PeakMemory
    log: Callable[[str], None]
    write_outputs: bool

    @property
    def propagate(self) -> str:
        return self.tr["propagate"]

    @property
    def offload(self) -> bool:
        return self.device != self.home

    @property
    def amp_dtype(self) -> torch.dtype | None:
        return self.model_dtype if self.amp else None

    @property
    def store_dtype(self) -> torch.dtype:
        return self.model_dtype if self.amp else torch.float32

    def autocast(self):
        return _autocast(self.device, self.amp_dtype or torch.bfloat16, self.amp)

    def block_path(self, i: int) -> Path:
        return self.blocks_dir / f"{i}.safetensors"


def _position_weights(weights, input_ids: torch.Tensor) -> torch.Tensor | None:
    w = None if weights is None else normalise_weights(weights)
    if w is not None and w.shape[0] != input_ids.shape[1]:
        raise ValueError(f"position weights have length {w.shape[0]} but sequences {input_ids.shape[1]}")
    return w


def _resume_key(method: QuantMethod, input_ids: torch.Tensor, w: torch.Tensor | None,
                batch_size: int) -> str:
    """The hash of everything a saved block depends on: a block saved under another is stale."""
    return io.config_hash({"method": method.type_name, "cfg": method.cfg,
                           "w_bits": method.w_bits, "a_bits": method.a_bits,
                           "seed": method.seed, "batch_size": batch_size,
                           "ids": io.config_hash(input_ids.tolist()),
                           "weights": None if w is None else [round(float(v), 8) for v in w],
                           "version": FORMAT_VERSION})


def _calibration_device(device: str | torch.device | None, home: torch.device) -> torch.device:
    device = torch.device(device) if device is not None else home
    if device.type == "cuda" and device.index is None:
        # an explicit index, so that comparing it with the model's device detects offloading
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _start(loaded, method: QuantMethod, input_ids: torch.Tensor, out_dir: Path, weights,
           batch_size: int, device, amp: bool | None, log, write_outputs: bool) -> _Settings:
    """Check the settings (before any work), start measuring memory and prepare the model."""
    tr = method.training_settings()
    if tr["propagate"] not in PROPAGATE:
        raise ValueError(f"propagate must be one of {PROPAGATE}, got {tr['propagate']!r}")
    w = _position_weights(weights, input_ids)
    resume_key = _resume_key(method, input_ids, w, batch_size)
    home = loaded.device
    device = _calibration_device(device, home)
    mem = PeakMemory(device).start()   # from here: what calibration adds (fair_calib.jobs.memory)
    torch.manual_seed(method.seed)
    method.prepare_model(loaded)
    model_dtype = next(loaded.model.parameters()).dtype
    if amp is None:
        amp = device.type == "cuda" and model_dtype in (torch.bfloat16, torch.float16)
    return _Settings(method=method, tr=tr, w=w, batch_size=batch_size, resume_key=resume_key,
                     blocks_dir=out_dir / "blocks", home=home, device=device,
                     model_dtype=model_dtype, amp=amp, mem=mem, log=log,
                     write_outputs=write_outputs)


@dataclass
class _Streams:
    """The next block's inputs, and with ``propagate: teacher`` the FP model's (the inputs of
    the FP model's blocks), whose block outputs are the targets."""
    inputs: BlockInputs
    teacher: BlockInputs | None

    @classmethod
    def capture(cls, loaded, input_ids: torch.Tensor, s: _Settings) -> "_Streams":
        inputs = capture_block_inputs(loaded.model, loaded.blocks[0], input_ids, s.batch_size,
                                      device=s.home, hidden_dtype=s.store_dtype)
        inputs = BlockInputs([h.to(s.device) for h in inputs.hidden],
                             _cast_floating(inputs.args, s.store_dtype, s.device),
                             _cast_floating(inputs.kwargs, s.store_dtype, s.device),
                             inputs.hidden_key)
        # the FP stream is the quantized stream until the first block has been quantized
        return cls(inputs, inputs if s.propagate == "teacher" else None)

    def targets_and_stats(self, block: nn.Module, groups, s: _Settings, i: int):
        """The block's targets and the input statistics of the stream it is calibrated on."""
        targets, gstats = _targets_and_stats(block, self.inputs, groups, s.method.needs_hessian,
                                             i, s.store_dtype)
        if self.teacher is not None and self.teacher is not self.inputs:
            del targets           # the FP teacher's h*_l, from the FP stream
            targets, _ = _targets_and_stats(block, self.teacher, groups, False, i, s.store_dtype)
        return targets, gstats


def _place_block(s: _Settings, block: nn.Module) -> None:
    if s.offload:
        block.to(s.device)
    if not s.amp:
        block.float()
    block.eval()


def _release_block(s: _Settings, block: nn.Module, groups, state) -> None:
    """Give the block back as the model keeps it: its dtype, its device, no matrix cache."""
    _cache_matrices(block, False)
    _restore_dtype(s.method, block, groups, state, s.model_dtype)
    if s.offload:
        block.to(s.home)


def _discard_blocks_from(blocks_dir: Path, i: int) -> None:
    """Later blocks were fed by block i's outputs: they are stale with it."""
    for stale in blocks_dir.glob("*.safetensors"):
        if stale.stem.isdigit() and int(stale.stem) >= i:
            stale.unlink()


def _saved_block(s: _Settings, i: int) -> tuple[dict[str, torch.Tensor], list] | None:
    """Block i's state and stats rows as a previous run with the same settings saved them, or
    None (nothing saved, or saved unreadable or under other settings: then discarded)."""
    path = s.block_path(i)
    if not path.exists():
        return None
    try:
        state, prov = io.load_tensors(path)
        if not isinstance(prov.get("stats"), list):
            raise io.CorruptFileError(f"{path}: no block stats in its metadata")
    except (io.CorruptFileError, FileNotFoundError) as err:
        # A partial or overwritten block file (a full disk, a copy gone wrong): never taken as
        # finished.
        s.log(f"WARNING block {i}: {path} is unreadable ({err}); discarding it and every "
              "later block, recomputing from here")
        warnings.warn(f"calibrate: discarded unreadable {path}; recomputing block {i}")
        _discard_blocks_from(s.blocks_dir, i)
        return None
    if prov.get("resume_key") != s.resume_key:
        # Settings changed since these blocks were saved (Snakemake reruns the job on a params
        # change).
        s.log(f"block {i}: {path} was written with other settings; discarding it and "
              "every later block")
        _discard_blocks_from(s.blocks_dir, i)
        return None
    return state, prov["stats"]


def _restore_saved_block(s: _Settings, block: nn.Module, groups, i: int, state) -> None:
    # no statistics: the saved state replaces everything they would initialise
    s.method.quantize_block(block, groups, None, i)
    s.method.load_block_state(block, groups, state)
    _cache_matrices(block, True)
    s.log(f"block {i}: resumed from {s.block_path(i)}")


def _fit_block(s: _Settings, block: nn.Module, groups, gstats, inputs: BlockInputs, targets,
               i: int) -> tuple[dict[str, torch.Tensor], list[dict[str, Any]]]:
    """Quantize block i and fit it to the targets; its state (checked finite) and stats rows."""
    method = s.method
    method.quantize_block(block, groups, gstats, i)
    _cache_matrices(block, True)

    def run_batch(b):
        with torch.no_grad(), s.autocast():
            return call_block(block, inputs, b)
    method.fit_block(block, groups, inputs, i, run_batch)
    if method.trainable:
        with numerics.deterministic_attention(s.device):
            rows = _train_block(method, block, inputs, targets, s.w, i, s.tr, method.seed,
                                s.device, s.mem, s.log, s.amp_dtype)
    else:
        t0 = time.time()
        loss = _eval_loss(block, inputs, targets, s.w, s.amp_dtype)
        rows = [{"block": i, "epoch": -1, "loss": loss, "seconds": time.time() - t0,
                 **_memory(s.mem)}]
    if not all(math.isfinite(r["loss"]) for r in rows):
        raise NonFiniteError(f"non-finite loss in block {i}")
    state = method.block_state(block, groups)
    for k, v in state.items():
        _check_finite(v, f"saved parameter {k}", i)
    return state, rows


def _save_block(s: _Settings, i: int, state, rows, groups) -> None:
    io.save_tensors(state, s.block_path(i), provenance={"resume_key": s.resume_key, "block": i,
                                                        "stats": rows,
                                                        "groups": groups_to_json(groups)})


def _propagated_outputs(s: _Settings, block: nn.Module, inputs: BlockInputs, targets,
                        i: int) -> list[torch.Tensor]:
    """The next block's inputs: the quantized block's outputs, or the FP targets."""
    if s.propagate in ("quant", "teacher") and s.method.quantizes:
        with torch.no_grad(), s.autocast(), s.method.propagation(block):
            nxt = [call_block(block, inputs, b).detach().to(s.store_dtype)
                   for b in range(len(inputs))]
    else:
        nxt = targets
    for t in nxt:
        _check_finite(t, "the outputs", i)
    return nxt


def _calibrate_block(s: _Settings, i: int, block: nn.Module, streams: _Streams):
    """Calibrate block i (or take it from a previous run) and move the streams past it;
    returns its stats rows, state and groups."""
    t_block = time.time()
    torch.manual_seed(s.method.seed * 1_000_003 + i)
    _place_block(s, block)
    groups = discover_groups(block, lambda: call_block(block, streams.inputs, 0))
    targets, gstats = streams.targets_and_stats(block, groups, s, i)
    saved = _saved_block(s, i)
    if saved is not None:
        state, rows = saved
        _restore_saved_block(s, block, groups, i, state)
    else:
        state, rows = _fit_block(s, block, groups, gstats, streams.inputs, targets, i)
        rows[-1]["seconds"] = time.time() - t_block
        if s.write_outputs:
            _save_block(s, i, state, rows, groups)
    if streams.teacher is not None:
        streams.teacher = streams.teacher.with_hidden(targets)
    nxt = _propagated_outputs(s, block, streams.inputs, targets, i)
    del targets
    _release_block(s, block, groups, state)
    streams.inputs = streams.inputs.with_hidden(nxt)
    return rows, state, groups


@dataclass
class _Calibrated:
    """What the finished blocks add to the outputs."""
    stats_rows: list[dict[str, Any]] = field(default_factory=list)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
    groups: dict[str, Any] = field(default_factory=dict)
    block_seconds: list[float] = field(default_factory=list)

    def add(self, i: int, rows, state, groups) -> None:
        self.stats_rows.extend(rows)
        self.params.update({f"{i}.{k}": v for k, v in state.items()})
        self.groups[str(i)] = groups_to_json(groups)
        self.block_seconds.append(float(rows[-1]["seconds"]))

    @property
    def peak_mb(self) -> float:
        return max((r["peak_mem_mb"] for r in self.stats_rows), default=0.0)


def _write_outputs(loaded, s: _Settings, done: _Calibrated, input_ids: torch.Tensor,
                   out_dir: Path, run_info: dict[str, Any]) -> dict[str, Any]:
    """stats.parquet, params.safetensors, the method's export and, last, meta.json."""
    import pandas as pd

    method = s.method
    from .models.finite import NonFiniteError, nonfinite_summary

    bad = nonfinite_summary(done.params.items())
    if bad:     # a diverged calibration: nothing written that a table would read
        raise NonFiniteError(
            f"{out_dir}: the calibrated parameters hold {bad}; the calibration diverged and "
            f"nothing was written: lower the method's lr, then rerun from scratch "
            f"(rm -r {out_dir / 'blocks'}: the finished blocks hold them too)")
    prov = io.provenance(run_info, seed=method.seed)
    io.write_parquet(pd.DataFrame(done.stats_rows), out_dir / "stats.parquet", stats_schema(), prov)
    io.save_tensors(done.params, out_dir / "params.safetensors", provenance=prov)
    meta = {"format_version": FORMAT_VERSION, "method": run_info.get("method_name", method.type_name),
            "type": method.type_name, "method_settings": method.cfg,
            "bits": {"w_bits": method.w_bits, "a_bits": method.a_bits, **run_info.get("bits", {})},
            "seed": method.seed, "propagate": s.propagate, "weighting": method.weighting,
            "n_samples": int(input_ids.shape[0]), "seq_len": int(input_ids.shape[1]),
            "batch_size": s.batch_size, "n_blocks": len(done.block_seconds), "groups": done.groups,
            "position_weights": None if s.w is None else [float(v) for v in s.w],
            "peak_mem_mb": done.peak_mb, "peak_mem_kind": s.mem.kind,
            "seconds": sum(done.block_seconds),
            "provenance": prov}
    meta.update(method.export_info(loaded, out_dir) or {})
    io.write_json(out_dir / "meta.json", meta)
    return meta


def calibrate(loaded, method: QuantMethod, input_ids: torch.Tensor, out_dir: str | Path, *,
              weights=None, batch_size: int = 4, run_info: dict[str, Any] | None = None,
              on_block_done: Callable[[int], None] | None = None,
              log: Callable[[str], None] = print, device: str | torch.device | None = None,
              amp: bool | None = None, write_outputs: bool = True) -> dict[str, Any]:
    """Calibrate ``method`` on ``loaded`` (modified in place: its blocks end up fake-quantized)
    and write ``out_dir``/{blocks/, stats.parquet, params.safetensors, meta.json}.

    ``weights``: position weights w_bar of length ``input_ids.shape[1]`` (None: uniform).
    ``run_info``: JSON-able settings/provenance stored in meta.json; its hash guards resume.
    ``on_block_done(i)`` is called after block i is saved (tests inject interruptions here).
    ``device``: where blocks are calibrated (default: the model's device). When it differs from
    the model's device (model kept in CPU memory), each block is moved there for its
    calibration and back afterwards, so only one block is resident on the GPU.
    ``amp`` (default: on for a bfloat16/float16 model on CUDA): keep the block, its captured
    inputs and FP targets in the model dtype and run the block's matmuls under autocast; the
    calibrated parameters, quantizers and transform matrices stay float32. Off: everything in
    float32 (the block is cast up while it is calibrated).
    ``write_outputs=False`` (benchmarks): skip stats.parquet/params/export, return the meta.
    Returns the meta dict.
    """
    out_dir = Path(out_dir)
    run_info = dict(run_info or {})
    s = _start(loaded, method, input_ids, out_dir, weights, batch_size, device, amp, log,
               write_outputs)
    streams = _Streams.capture(loaded, input_ids, s)
    done = _Calibrated()
    for i, block in enumerate(loaded.blocks):
        done.add(i, *_calibrate_block(s, i, block, streams))
        if on_block_done is not None:
            on_block_done(i)
    if not write_outputs:
        return {"n_blocks": len(done.block_seconds), "seconds": sum(done.block_seconds),
                "stats": done.stats_rows, "peak_mem_mb": done.peak_mb, "peak_mem_kind": s.mem.kind}
    return _write_outputs(loaded, s, done, input_ids, out_dir, run_info)


def position_weights_from_prior(prior_path: str | Path, seq_len: int) -> torch.Tensor:
    """w_bar over a calibration sequence from a Stage I prior file (floor from its provenance)."""
    from .prior import expand_prior

    df, prov = io.read_parquet(prior_path)
    if "floor" not in prov:
        raise KeyError(f"{prior_path}: provenance lacks 'floor'")
    return expand_prior(df, float(prov["floor"]), int(seq_len))


def calibration_generator(seed: int) -> torch.Generator:
    """The generator a method's :meth:`~fair_calib.methods.base.QuantMethod.calibration_inputs`
    draws from: seeded by the calibration seed alone (same seed, same calibration sequences),
    apart from the window offsets' stream and torch's global one."""
    return torch.Generator().manual_seed(1_000_003 * int(seed) + 7919)


def run(settings: dict[str, Any], model_dir: str | Path, out_dir: str | Path,
        prior_path: str | Path | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Load the model and calibration data named by ``settings`` and calibrate (see module doc)."""
    from . import data
    from .jobs.model_identity import content_id
    from .models.adapters import load_model

    # On CPU peak memory is the process's RSS high-water mark. Every job writes Parquet at the
    # end, but only prior-weighted methods read Parquet (the prior) before calibrating: import
    # pandas/pyarrow here for every method, so that their ~80 MB is in every job's baseline and
    # the calibration-memory table compares the calibrations, not the imports.
    import pandas  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    seed = int(settings.get("seed", 0))
    torch.manual_seed(seed)
    bits = dict(settings.get("bits") or {"name": "fp"})
    w_bits, a_bits = int(bits.get("w_bits", 16)), int(bits.get("a_bits", 16))
    method = make_method(settings["method"], w_bits, a_bits, seed)
    calib = settings["calibration"]
    model = settings["model"]
    loaded = load_model(model_dir, model["family"], settings.get("dtype", "float32"),
                        settings.get("device", "cpu"),
                        trust_remote_code=model.get("trust_remote_code"),
                        loader=model.get("loader"))
    texts = data.calibration_texts(calib["dataset"], settings.get("data_dir"),
                                   settings.get("synthetic_dir"),
                                   source=settings.get("data_source") or "local")
    seq_len = int(calib["seq_len"])
    ids = data.calibration_batch(loaded.tokenizer, texts, int(calib["n_samples"]), seq_len, seed)
    # the method's calibration sequences (tmas, mcs: masked states of the windows; every other
    # method: the windows themselves), drawn from their own seeded stream
    ids, weights = method.calibration_inputs(loaded, ids, calibration_generator(seed))
    if weights is not None and method.weighting == "prior":
        raise ValueError(f"method {settings['method'].get('name')!r} weights positions twice "
                         "(its calibration inputs and the Stage I prior)")
    if method.weighting == "prior":
        if prior_path is None:
            raise ValueError(f"method {settings['method'].get('name')!r} weights positions by the "
                             "Stage I prior: pass --prior")
        weights = position_weights_from_prior(prior_path, seq_len)
    elif method.weighting != "uniform":
        raise ValueError(f"weighting must be 'uniform' or 'prior', got {method.weighting!r}")
    batch_size = int(settings["method"].get("batch_size") or calib.get("batch_size", 4))
    run_info = {"settings": settings, "method_name": settings["method"].get("name", method.type_name),
                "bits": bits, "model_dir": str(model_dir),
                # the weights calibrated (fair_calib/jobs/model_identity.py): every stage that
                # applies this calibration refuses other weights at model_dir
                "model_content": content_id(model_dir),
                "prior": None if prior_path is None or weights is None else str(prior_path)}
    return calibrate(loaded, method, ids, out_dir, weights=weights, batch_size=batch_size,
                     run_info=run_info, log=log)


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("--settings", required=True, help="JSON settings (see docs/design.md)")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--prior", default=None, help="results/prior/{model}/{prior}.parquet")
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args(argv)
    settings = json.loads(args.settings)
    meta = run(settings, args.model_dir, args.out_dir, args.prior,
               log=lambda s: print(s, flush=True))
    print(json.dumps({k: meta[k] for k in ("method", "type", "bits", "n_blocks", "seconds",
                                           "peak_mem_mb")}, default=str), flush=True)
