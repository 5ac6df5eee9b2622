"""Quantization methods: ``REGISTRY[type] -> class`` and loading for evaluation.

Adding a method is one module defining a :class:`~fair_calib.methods.base.QuantMethod` subclass
and one entry below (keys equal ``fair_calib.names.registry.METHOD_TYPES``).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from .awq import AWQMethod
from .duquant import DuQuantMethod
from .base import QuantMethod, fold_block
from .fair_calib import FairCalibMethod
from .flatquant import FlatQuantMethod
from .fp import FPMethod
from .gptq import GPTQMethod
from .mcs import MCSMethod
from .qdrop import QDropMethod
from .quarot import QuaRotMethod
from .rtn import RTNMethod
from .smoothquant import SmoothQuantMethod
from .tmas import TMASMethod

REGISTRY: dict[str, type[QuantMethod]] = {
    "fp": FPMethod,
    "rtn": RTNMethod,
    "quarot": QuaRotMethod,
    "flatquant": FlatQuantMethod,
    "fair_calib": FairCalibMethod,
    "qdrop": QDropMethod,
    "gptq": GPTQMethod,
    "awq": AWQMethod,
    "smoothquant": SmoothQuantMethod,
    "duquant": DuQuantMethod,
    "tmas": TMASMethod,
    "mcs": MCSMethod,
}


def make_method(method_cfg: dict[str, Any], w_bits: int, a_bits: int, seed: int = 0) -> QuantMethod:
    """Instantiate from a config ``methods:`` entry (``type`` names the registered class)."""
    cfg = dict(method_cfg)
    mtype = cfg.pop("type", None) or cfg.get("name")
    cfg.pop("name", None)
    if mtype not in REGISTRY:
        raise KeyError(f"unknown method type {mtype!r}; registered: {sorted(REGISTRY)}")
    return REGISTRY[mtype](cfg, w_bits, a_bits, seed)


@torch.no_grad()
def load_quantized(loaded, calib_dir: str | Path, fold: bool = True, keep_fp: bool = False,
                   lowbit: str | None = None, weight_only: str | None = None):
    """FP model + calibrated parameters in ``calib_dir`` -> the quantized model (in place).

    Reads ``meta.json`` (method, bits, per-block linear groups) and ``params.safetensors``,
    replays the method's model-level preparation (QuaRot rotations), wraps every block's
    linears, loads their parameters and, with ``fold``, precomputes the quantized weights.
    Folded layers then drop their FP weights (one weight per layer, as much memory as the FP
    model) unless ``keep_fp`` (needed only to unfold or re-export).

    ``lowbit`` (default: the ``FAIR_CALIB_LOWBIT`` setting, see ``fair_calib.quant.lowbit``):
    with a folded, FP-free model, ``real``/``emulate`` run every linear an integer GEMM covers
    on its integer codes (``auto``: real where the GPU has FP8 tensor cores and Triton, else
    fake quantization).

    ``weight_only`` (default: the ``FAIR_CALIB_WEIGHT_ONLY`` setting, see
    ``fair_calib.quant.w4a16``): with a folded, FP-free model, the weight-only methods' 4- and
    3-bit group codes run on torch's W4A16 kernel (``auto``: on CUDA in bf16, each linear whose
    layout fits and whose probe is exact enough; ``kernel``: every one, else refused by name).
    """
    from ..jobs import io
    from ..quant import lowbit as lowbit_mod
    from ..quant import w4a16
    from ..quant.discovery import groups_from_json

    calib_dir = Path(calib_dir)
    meta_path = calib_dir / "meta.json"
    if not calib_dir.is_dir():
        raise FileNotFoundError(f"calib_dir {calib_dir} does not exist: calibrate first "
                                f"(snakemake {calib_dir}/meta.json), or pass an existing one")
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path} missing: calibration in {calib_dir} is incomplete")
    meta = io.read_json(meta_path)
    cfg = dict(meta["method_settings"], type=meta["type"])
    method = make_method(cfg, meta["bits"]["w_bits"], meta["bits"]["a_bits"], meta["seed"])
    params, _ = io.load_tensors(calib_dir / "params.safetensors")
    method.prepare_model(loaded)
    blocks = loaded.blocks
    if len(blocks) != int(meta["n_blocks"]):
        raise ValueError(f"model has {len(blocks)} blocks, calibration {meta['n_blocks']}")
    device = loaded.device
    mode = lowbit_mod.resolve_mode(device, lowbit) if fold and not keep_fp else "fake"
    wo_mode = "fake"
    if not getattr(method, "integer_gemm", True):
        mode = "fake"   # weights not on the integer GEMMs' grid (group-wise, zero points)
        if fold and not keep_fp:
            wo_mode = w4a16.resolve_mode(device, loaded.embed.weight.dtype, weight_only)
    n_integer = 0
    for i, block in enumerate(blocks):
        groups = groups_from_json(meta["groups"][str(i)])
        prefix = f"{i}."
        state = {k[len(prefix):]: v.to(device) for k, v in params.items() if k.startswith(prefix)}
        method.quantize_block(block, groups, None, i)
        method.load_block_state(block, groups, state)
        if fold and wo_mode != "fake":
            # 4-bit codes on the W4A16 kernel; fold_block skips these
            w4a16.attach_block(block, wo_mode)
        if fold and mode != "fake":
            # integer codes; fold_block skips these
            n_integer += lowbit_mod.attach_block(block, mode, lowbit_mod.storage_for(mode),
                                                 kinds=lowbit_mod.kinds_for(lowbit))
        if fold:
            fold_block(block, drop_fp=not keep_fp)
    if fold and mode != "fake":
        # each RMSNorm read only by one low-bit group, and each SwiGLU product, is formed
        # inside the quantizing kernel of the group that reads it
        lowbit_mod.fuse_inputs(loaded)
    if fold and not keep_fp:
        line = execution_line(loaded, mode, n_integer, lowbit,
                              getattr(method, "integer_gemm", True))
        # what computed the numbers, for the evaluation's record (evaluate/run.py, the tables)
        loaded.execution = {"arithmetic": arithmetic_name(mode, n_integer, wo_mode),
                            "line": line.removeprefix("[fair-calib] low-bit execution: ")}
        print(line, file=sys.stderr, flush=True)
    loaded.model.eval()
    return loaded


def arithmetic_name(mode: str, n_integer: int, weight_only_mode: str = "fake") -> str:
    """The arithmetic of a quantized model's linears in one word: ``integer`` (every or some
    linear on integer codes: the real kernels, or ``emulated``), ``w4a16`` (weight-only
    kernel) or ``fake`` (fake quantization, the reference)."""
    if n_integer:
        return "emulated" if mode == "emulate" else "integer"
    return "w4a16" if weight_only_mode not in ("fake", None) else "fake"


def execution_line(loaded, mode: str, n_integer: int, lowbit: str | None,
                   integer_gemm: bool = True) -> str:
    """What a job's log says of how its quantized linears execute: how many run on integer
    codes, with which GEMM, or why none do (the setting, a GPU without FP8 tensor cores)."""
    from ..quant import lowbit as lowbit_mod
    from ..quant.qlinear import QuantLinear

    total = sum(isinstance(m, QuantLinear) for b in loaded.blocks for m in b.modules())
    if mode == "real":
        how = f"real, {lowbit_mod.gemm_choice()} GEMM"
    elif mode == "emulate":
        how = "emulated in torch"
    elif not integer_gemm:
        how = "the method's weights are not on the integer GEMM's grid"
    else:
        setting = lowbit_mod.setting() if lowbit is None else lowbit
        problem = lowbit_mod.real_path_problem(loaded.device) if setting == "auto" else None
        how = f"{lowbit_mod.SETTING}={setting}" + (f": {problem}" if problem else "")
    rest = "" if n_integer == total else "; the others on fake quantization"
    return (f"[fair-calib] low-bit execution: {n_integer} of {total} quantized linears on "
            f"integer codes ({how}){rest}")
