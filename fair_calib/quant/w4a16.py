"""Weight-only execution (W4A16, W3A16) of group-wise codes: the backend a :class:`QuantLinear`
holding :class:`~fair_calib.quant.groupwise.GroupCodes` (``gptq``, ``awq``) delegates its
inference forward to.

Fake quantization multiplies the activations by the dequantized weight s (c - z), rounded to
the model dtype. This backend keeps the weight as 4-bit codes with per-(row, group) scales and
runs torch's tinygemm W4A16 kernel, ``aten._weight_int4pack_mm`` (CUDA, bf16 activations;
``_weight_int4pack_mm_for_cpu`` on CPU, the same arithmetic contract, used by the tests). Its
dequantization is ``(q - 8) * scale + zero`` per (group, output) with q in [0, 15] and
``scales_and_zeros`` laid out [K / group, N, 2] in the activation dtype (torch's
``test_linalg._group_quantize_tensor``; CUDA: one bf16 ``__hfma2``, CPU: a float32 fma). The
project's (c - z) s maps onto it as q = c + t, zero = (8 - z - t) s, with an integer shift t
per (row, group) chosen so every q stays in [0, 15] and |8 - z - t| is smallest: W3 codes and
symmetric W4 codes (z = 8) get zero = 0 exactly, so only the scale's rounding to the
activation dtype separates the kernel's weight from the fake quant's.

tinygemm is a GEMV-style kernel: above ``KERNEL_MAX_ROWS`` rows a forward dequantizes the
codes (the fake quant's own float32 arithmetic, so bit for bit its weight) and runs the dense
GEMM instead.

Modes (``FAIR_CALIB_WEIGHT_ONLY``):
- ``auto`` (default): ``fake``. Measured on a lent H100 (docs/benchmarks.md, issue 31): the
  kernel beats the fake quant's bf16 GEMM on the dequantized weight only at one row (0.5x);
  at 16 rows it is 1.1-1.2x, at the grid's 408-2,048 rows 20-27x, and the dequantizing path
  above ``KERNEL_MAX_ROWS`` costs 6-7 ms a block. Every request of the grid has more than one
  row, so the fastest execution is the fake quant's, which keeps the dequantized bf16 weight;
- ``kernel``: the kernel (on CPU too): weights at about 1.1 bytes each instead of 2, for a
  model that does not fit otherwise; refused by name where the environment or a linear's
  layout does not allow it;
- ``fake``: fake quantization (the reference).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..jobs.environment import env_choice
from .export import pack_int4, unpack_int4
from .groupwise import GroupCodes
from .qlinear import QuantLinear

SETTING = "FAIR_CALIB_WEIGHT_ONLY"
MODES = ("auto", "kernel", "fake")
GROUP_SIZES = (32, 64, 128, 256)     # the group sizes tinygemm is compiled for
K_TILE = 16                           # tinygemm's k tile: the packed layout's unit
INNER_K_TILES = (8, 4, 2)             # k tiles per load, widest that divides K first
N_MULTIPLE = {"cuda": 8, "cpu": 16}   # the packers' output-row tile
# Rows at or below which a forward runs the kernel; above, dequantize + dense GEMM. The rows
# up to which the kernel is no slower than fake quant (benchmarks/weight_only_gpu.py of commit
# be0153a, lent H100, 2026-11-27: one row 0.49-0.53x, 16 rows 1.10-1.19x, every LLaDA-8B /
# Dream-7B shape).
KERNEL_MAX_ROWS = 1
# max |kernel - fake| / max |fake| on a probe, at attach time (auto keeps fake above it). The
# kernel's weight differs from the fake quant's by the scale's rounding to bf16 (2^-9
# relative) and one rounding of the product: a few bf16 ulp of an output, ~1e-2 at most.
EXACT_TOLERANCE = 2e-2
PROBE_ROWS = 8


def setting() -> str:
    return env_choice(SETTING, "auto", MODES)


def _ops(device: torch.device) -> tuple[str, str]:
    """(pack, matmul) aten op names for ``device``."""
    if device.type == "cuda":
        return "_convert_weight_to_int4pack", "_weight_int4pack_mm"
    return "_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"


def kernel_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot run on ``device`` with ``dtype`` activations; None where it can."""
    if device.type not in N_MULTIPLE:
        return f"device {device} has no int4pack kernel"
    missing = [n for n in _ops(device) if not hasattr(torch.ops.aten, n)]
    if missing:
        return f"torch {torch.__version__} has no aten.{', aten.'.join(missing)}"
    if device.type == "cuda":
        if dtype != torch.bfloat16:
            return f"the CUDA kernel takes bfloat16 activations, the model runs in {dtype}"
        cc = torch.cuda.get_device_capability(device)
        if cc < (8, 0):
            return f"compute capability {cc[0]}.{cc[1]} < 8.0 (tinygemm needs bf16 mma)"
    elif dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return f"the CPU kernel takes no {dtype} activations"
    return None


def resolve_mode(device: torch.device, dtype: torch.dtype, mode: str | None = None) -> str:
    """How :func:`attach_block` runs for a model on ``device`` in ``dtype``: ``fake`` (no
    kernel) or ``kernel`` (every linear, else refused). ``auto`` is ``fake``: the kernel is slower than the fake quant at every request
    shape the grid runs (module docstring)."""
    mode = setting() if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"weight-only mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode == "fake":
        return "fake"
    problem = kernel_problem(device, dtype)
    if mode == "kernel" and problem:
        raise RuntimeError(f"{SETTING}=kernel: {problem}; use {SETTING}=fake (fake quantization)")
    return "kernel" if mode == "kernel" else "fake"


# ------------------------------------------------------------------------------- layout
def group_layout(gc: GroupCodes) -> tuple[int, torch.Tensor | None]:
    """(group size, column permutation or None): the columns of each group made contiguous.
    GPTQ's act-order assigns groups to permuted columns; sorting by group restores contiguous
    groups and the forward permutes x the same way. A group of another size (a shorter last
    group) is refused by name."""
    g_idx = gc.g_idx.long().cpu()
    k = g_idx.numel()
    counts = torch.bincount(g_idx)
    g = int(counts[0])
    if k % g or not bool((counts == g).all()):
        raise ValueError(f"group size {g} does not divide the {k} input columns (groups of "
                         f"{sorted(set(counts.tolist()))} columns): tinygemm needs equal groups")
    perm = torch.argsort(g_idx, stable=True)
    return g, (None if torch.equal(perm, torch.arange(k)) else perm)


def layout_problem(gc: GroupCodes, device: torch.device) -> str | None:
    """Why these codes cannot take the kernel's layout; None where they can."""
    n, k = gc.codes.shape
    if gc.bits > 4:
        return f"{gc.bits}-bit codes do not fit 4-bit containers"
    try:
        g, _ = group_layout(gc)
    except ValueError as e:
        return str(e)
    if g not in GROUP_SIZES:
        return f"group size {g} is not one of tinygemm's {GROUP_SIZES}"
    if k % (K_TILE * INNER_K_TILES[-1]):
        return f"{k} input columns are not a multiple of {K_TILE * INNER_K_TILES[-1]}"
    m = N_MULTIPLE.get(device.type, 8)
    if n % m:
        return f"{n} output rows are not a multiple of {m} (the {device.type} packer's tile)"
    return None


@torch.no_grad()
def shifted_codes(codes: torch.Tensor, zero: torch.Tensor, g: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(q [N, K] int32 in [0, 15], m [N, G]) with (q - 8) + m = c - z in every group: q = c + t,
    m = 8 - z - t, the integer shift t as close to 8 - z as keeps the group's codes in [0, 15]
    (a zero term m s of 0 or a power of two is exact in any dtype)."""
    n, k = codes.shape
    c = codes.long().reshape(n, k // g, g)
    t = torch.clamp(8 - zero.round().long(), min=-c.amin(-1), max=15 - c.amax(-1))
    q = (c + t.unsqueeze(-1)).reshape(n, k).to(torch.int32)
    return q, (8 - zero.round().long() - t).float()


def inner_k_tiles(k: int) -> int:
    return next(i for i in INNER_K_TILES if k % (K_TILE * i) == 0)


def pack(q: torch.Tensor, device: torch.device) -> torch.Tensor:
    """q [N, K] int32 in [0, 15] -> the tinygemm layout on ``device``."""
    pack_op, _ = _ops(device)
    inner = inner_k_tiles(q.shape[1])
    q = q.to(device)
    if device.type == "cuda":
        # the CUDA packer reads [N, K/2] bytes, the even column in the high nibble
        q = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
    return getattr(torch.ops.aten, pack_op)(q.contiguous(), inner)


def scales_and_zeros(scale: torch.Tensor, m: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[G, N, 2] in ``dtype``: (s, m s) per (group, output row). m s is formed in float32 and
    rounded once: the nearest ``dtype`` value to the zero term."""
    return torch.stack([scale.T, (m * scale).T], dim=-1).to(dtype).contiguous()


# ------------------------------------------------------------------------------- the layer
class WeightOnlyLinear(nn.Module):
    """The 4-bit form of one weight-only :class:`QuantLinear`: the codes in tinygemm's layout
    (the kernel) and in the export's packed layout with float32 scales and zero points (the
    dequantizing path above ``max_rows``), the column permutation of act-order, the bias."""

    def __init__(self, gc: GroupCodes, bias: torch.Tensor | None, dtype: torch.dtype,
                 device: torch.device, max_rows: int = KERNEL_MAX_ROWS):
        super().__init__()
        problem = layout_problem(gc, device)
        if problem:
            raise ValueError(f"weight-only kernel: {problem}")
        self.out_features, self.in_features = gc.codes.shape
        self.group_size, perm = group_layout(gc)
        self.max_rows = int(max_rows)
        self.dtype = dtype
        codes = gc.codes if perm is None else gc.codes[:, perm.to(gc.codes.device)]
        q, m = shifted_codes(codes.cpu(), gc.zero.cpu(), self.group_size)
        self.register_buffer("qweight", pack(q, device))
        self.register_buffer("scales_zeros", scales_and_zeros(gc.scale.cpu(), m, dtype).to(device))
        # the export's signed nibbles: codes and zero points both shifted by 8 (c - z unchanged)
        self.register_buffer("codes", pack_int4(codes.long() - 8).to(device))
        self.register_buffer("scale", gc.scale.float().to(device).contiguous())
        self.register_buffer("zero", (gc.zero.float() - 8).to(device).contiguous())
        self.register_buffer("perm", None if perm is None else perm.to(device))
        self.register_buffer("bias", None if bias is None else bias.detach().to(device, dtype))
        self._mm = getattr(torch.ops.aten, _ops(device)[1])

    def dequantized(self) -> torch.Tensor:
        """The fake quant's weight (c - z) s, in float32 then the model dtype, in the kernel's
        column order: bit for bit ``GroupCodes.dequantize().to(dtype)`` (columns permuted)."""
        n, k, g = self.out_features, self.in_features, self.group_size
        c = unpack_int4(self.codes, k).reshape(n, k // g, g).float()
        w = (c - self.zero.unsqueeze(-1)) * self.scale.unsqueeze(-1)
        return w.reshape(n, k).to(self.dtype)

    def kernel(self, x2: torch.Tensor) -> torch.Tensor:
        return self._mm(x2.contiguous(), self.qweight, self.group_size, self.scales_zeros)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.dtype)
        if self.perm is not None:
            x2 = x2.index_select(-1, self.perm)
        if x2.shape[0] <= self.max_rows:
            y = self.kernel(x2)
            y = y if self.bias is None else y + self.bias
        else:   # the fake quant's own F.linear (bias in its epilogue): the same bits
            y = F.linear(x2, self.dequantized(), self.bias)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


# ------------------------------------------------------------------------------- attaching
@torch.no_grad()
def probe_error(layer: WeightOnlyLinear, seed: int = 0) -> float:
    """max |kernel - fake| / max |fake| on ``PROBE_ROWS`` random rows (the same weight order)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(PROBE_ROWS, layer.in_features, generator=g).to(layer.qweight.device,
                                                                    layer.dtype)
    ref = F.linear(x, layer.dequantized()).float()
    got = layer.kernel(x).float()
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def _eligible(ql: QuantLinear) -> GroupCodes | None:
    """The group codes of a weight-only linear (no input quantizer), else None."""
    gc = getattr(ql, "_groups", None)
    return gc if gc is not None and ql.inq is None and ql.backend is None else None


def _drop_weight(ql: QuantLinear) -> None:
    """Free the FP and dequantized weights; a one-element stand-in keeps ``.weight``'s shape,
    dtype and device readable (as ``lowbit.attach_block``)."""
    w = ql.linear.weight
    ql.linear.weight = nn.Parameter(torch.zeros((), dtype=w.dtype, device=w.device)
                                    .expand(w.shape), requires_grad=False)
    ql.w_quant = ql.w_folded = ql.b_folded = None
    ql.fp_weight_dropped = True


@torch.no_grad()
def attach_block(block: nn.Module, mode: str, max_rows: int = KERNEL_MAX_ROWS) -> dict[str, str]:
    """Give every weight-only linear of ``block`` whose codes fit the kernel a
    :class:`WeightOnlyLinear` backend, then free its weights. ``mode``: ``auto`` (a linear
    whose layout does not fit or whose probe misses ``EXACT_TOLERANCE`` keeps fake quant) or
    ``kernel`` (either is refused by name). Returns {linear: "kernel" or why it stays fake}."""
    if mode not in ("auto", "kernel"):
        raise ValueError(f"weight-only attach: mode {mode!r} is not auto or kernel")
    out = {}
    for name, ql in block.named_modules():
        gc = _eligible(ql) if isinstance(ql, QuantLinear) else None
        if gc is None:
            continue
        w = ql.linear.weight
        why = layout_problem(gc, w.device)
        layer = None if why else WeightOnlyLinear(gc, ql.linear.bias, w.dtype, w.device, max_rows)
        err = None if layer is None else probe_error(layer)
        if err is not None and err > EXACT_TOLERANCE:
            why = f"probe error {err:.3g} > {EXACT_TOLERANCE}"
        if why and mode == "kernel":
            raise RuntimeError(f"{SETTING}=kernel: {name}: {why}")
        out[name] = why or "kernel"
        if not why:
            ql.backend = layer
            _drop_weight(ql)
    return out
