"""Real low-bit execution of a folded fake-quant model: the backend a :class:`QuantLinear`
delegates its inference forward to.

Fake quantization computes y = (c_x s_x) (c_W s_W)^T + b with integer codes c and float
scales s, every product rounded in the model dtype. This backend computes the same function
from the codes themselves: y = s_x s_W (c_x c_W^T) + b, the integer dot product exact
(float32 accumulation of integer products stays exact below 2^24), the scales applied once in
the epilogue. On CUDA the product runs on the INT8 tensor cores in the Triton GEMM of
:mod:`lowbit_gemm` (int32 accumulation, the epilogue in the emulation's order: the emulation's
output bit for bit), or with ``FAIR_CALIB_LOWBIT_GEMM=cublas`` on cuBLAS: codes of up to 5 bits
([-16, 15], exact in FP8 e4m3: W4A4, W3A4) on the FP8 tensor cores (``torch._scaled_mm``,
per-token x per-channel scales, bias, bf16 out), codes of up to 8 bits on ``torch._int_mm``.

Per layer input group (:class:`LowBitInput`, shared by q/k/v or gate/up as the
:class:`InputQuant` it replaces): the RMSNorm that feeds it where nothing else reads that
norm's output (:func:`fuse_block_norms`, run by ``load_quantized``), or for a SwiGLU MLP's
down_proj the product SiLU(gate) * up (:func:`fuse_block_gated`), the online transform
(FlatQuant's folded Kronecker factors and diagonal, or QuaRot's online Hadamard), the
per-token (or static, QDrop) scale of every reader and the codes, in one fused Triton kernel
on CUDA (:mod:`lowbit_triton`; a transform factor wider than 256 goes through cuBLAS first).
Per linear (:class:`LowBitLinear`): the weight's codes, 4-bit packed two per byte (the
export's layout, low nibble first) for codes of up to 4 bits, else int8/FP8 one per byte, and
the float32 row scales.

Modes (``FAIR_CALIB_LOWBIT``):
- ``auto`` (default): ``real`` where the device has FP8 tensor cores (CUDA compute capability
  >= 8.9) and Triton is installed, else ``fake``;
- ``real``: the CUDA kernels; refused by name where the environment lacks them;
- ``emulate``: the same arithmetic in plain torch on any device (integer codes, exact integer
  dot product in float64, the same scales): the reference the tests compare with fake quant;
- ``fake``: fake quantization (the reference; the CPU default).

Layers whose bit widths no integer GEMM covers (activations >= 9 bits, e.g. W4A16) keep the
fake-quant forward.
"""
from __future__ import annotations

from itertools import permutations

import torch
import torch.nn.functional as F
from torch import nn

from ..jobs.environment import env_choice
from .export import linear_codes, pack_int4, unpack_int4
from .fused import head_rows
from .qlinear import InputQuant, QuantLinear
from .quantizers import qmax
from .transforms import kron_last

SETTING = "FAIR_CALIB_LOWBIT"
MODES = ("auto", "real", "emulate", "fake")
FP8_MAX_BITS = 5          # codes in [-16, 15]: every one exact in e4m3
INT8_MAX_BITS = 8
# Weight storage for codes of up to 4 bits (``FAIR_CALIB_LOWBIT_STORAGE``): "packed" (two
# per byte, the export's layout, unpacked to FP8 by every forward on CUDA) or "bytes" (one per
# byte, FP8 on the real path, read directly). "auto": bytes on the real path, packed
# elsewhere. The same codes either way (same logits bit for bit); on an H100/H200 the
# per-forward unpacking took 16-25% of a batch-1 W4A4 decode (docs/benchmarks.md), for half
# the weight bytes.
STORAGE_SETTING = "FAIR_CALIB_LOWBIT_STORAGE"
STORAGES = ("auto", "packed", "bytes")
PACKED_STORAGE = "packed"
# The real path's GEMM (``FAIR_CALIB_LOWBIT_GEMM``): "triton" (:mod:`lowbit_gemm`, int8
# codes) or "cublas" (FP8 codes on ``torch._scaled_mm`` up to 5 bits, int8 on ``torch._int_mm``
# above). "auto" is triton: on an H100, summed over LLaDA-8B's or Dream-7B's linears, it took
# 0.75-0.97x cuBLAS's FP8 GEMM time at 416-1,936 rows (1.07-1.13x at exactly 512, where
# cuBLAS's 128-row tiles fit) and 0.98-1.04x at the MC batches' 3,072-4,096
# (docs/benchmarks.md); its output is the emulation's bit for bit (cuBLAS's: within 1 ulp).
GEMM_SETTING = "FAIR_CALIB_LOWBIT_GEMM"
GEMMS = ("auto", "triton", "cublas")


def setting() -> str:
    return env_choice(SETTING, "auto", MODES)


def storage_for(mode: str) -> str:
    """``packed`` or ``bytes`` for linears attached in ``mode`` (real / emulate)."""
    choice = env_choice(STORAGE_SETTING, "auto", STORAGES)
    if choice == "auto":
        return "bytes" if mode == "real" else PACKED_STORAGE
    return choice


def gemm_choice() -> str:
    """``triton`` or ``cublas``: the real path's GEMM (``FAIR_CALIB_LOWBIT_GEMM``)."""
    choice = env_choice(GEMM_SETTING, "auto", GEMMS)
    return "triton" if choice == "auto" else choice


def code_dtype(kind: str, gemm: str) -> torch.dtype:
    """The real path's code dtype (activations and byte-stored weights): FP8 e4m3 for cuBLAS's
    FP8 GEMM, else int8."""
    return torch.float8_e4m3fn if kind == "fp8" and gemm == "cublas" else torch.int8


def real_path_problem(device: torch.device) -> str | None:
    """Why the real (CUDA) path cannot run on ``device``; None where it can."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    cc = torch.cuda.get_device_capability(device)
    if cc < (8, 9):
        return (f"{torch.cuda.get_device_name(device)} (compute capability {cc[0]}.{cc[1]}) has "
                "no FP8 tensor cores (needs >= 8.9)")
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    return None


def resolve_mode(device: torch.device, mode: str | None = None) -> str:
    """The mode to run with on ``device``: ``real``, ``emulate`` or ``fake``."""
    mode = setting() if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"low-bit mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode in ("emulate", "fake"):
        return mode
    problem = real_path_problem(device)
    if problem is None:
        return "real"
    if mode == "real":
        raise RuntimeError(f"{SETTING}=real: {problem}; use {SETTING}=fake (fake quantization) "
                           f"or {SETTING}=emulate")
    return "fake"


def kinds_for(mode: str | None = None) -> tuple[str, ...]:
    """The code widths a setting runs on an integer GEMM: every width of up to 8 bits ("fp8":
    W4A4, W3A4; "int8": W8A8), except under ``auto`` with ``FAIR_CALIB_LOWBIT_GEMM=cublas``,
    which keeps W8A8 on fake quantization: cuBLAS's int8 GEMM (``torch._int_mm``) made its
    forward 1.6-1.8x the bf16 forward on an H100, where the int8 Triton GEMM makes it
    0.60-0.76x (``docs/benchmarks.md``)."""
    mode = setting() if mode is None else mode
    return ("fp8",) if mode == "auto" and gemm_choice() == "cublas" else ("fp8", "int8")


def gemm_kind(w_bits: int, a_bits: int) -> str | None:
    """"fp8", "int8", or None (no integer GEMM for these widths)."""
    if not (0 < w_bits < 16 and 0 < a_bits < 16):
        return None
    if max(w_bits, a_bits) <= FP8_MAX_BITS:
        return "fp8"
    if max(w_bits, a_bits) <= INT8_MAX_BITS:
        return "int8"
    return None


# ------------------------------------------------------------------------------- activations
class LowBitInput(nn.Module):
    """The online part of one input group: transform, then every reader's per-token (or static)
    scale and codes. Built from a folded :class:`InputQuant`; computed once per input tensor and
    handed to each reading linear (as the InputQuant's own cache)."""

    def __init__(self, inq: InputQuant, dtype: torch.dtype, device: torch.device, mode: str,
                 kind: str, gemm: str = "triton"):
        super().__init__()
        self.mode, self.kind, self.gemm = mode, kind, gemm
        self.code_dtype = code_dtype(kind, gemm)
        self.dim = inq.dim
        self.bits = inq.act.bits
        self.n_users = inq.n_users
        # the transform, as (d, P1, P2^T, n1, n2) in the model dtype: what the folded fake
        # quant applies (``fused.act_chain_folded`` / ``KronRotation.rotate``)
        d = p1 = p2t = None
        n1, n2 = 1, self.dim
        if inq.rotation is not None:
            r = inq.rotation
            # QuaRot's online rotations carry no signs: x * 1 is x, skip the pass
            d = None if bool((r.s == 1).all()) else r.s
            p1 = r.mfac.T
            p2t = r.hfac
            n1, n2 = r.m, r.p
        elif inq.transform is not None:
            t = inq.transform
            if t._folded is None:
                t.fold(torch.float32)
            d, p1, p2t = t.folded_mats(dtype)
            if not t.right_online:
                p2t = None
            n1, n2 = t.n1, t.n2
        if p1 is None:
            p2t = None
        self.n1, self.n2 = n1, n2
        self.rotation = inq.rotation is not None

        def buf(v):
            return None if v is None else v.detach().to(dtype).contiguous()
        self.register_buffer("d", buf(d))
        self.register_buffer("p1", buf(p1))
        self.register_buffer("p2t", buf(p2t))
        acts = list(inq.acts)
        dev = device
        static = [a.scale is not None for a in acts]
        if any(static) and not all(static):
            raise ValueError("low-bit input group mixes static and dynamic activation scales")
        self.static = all(static)
        if self.static:
            s = torch.stack([a.scale.detach().abs().float().clamp(min=1e-8).reshape(())
                             for a in acts])
            self.register_buffer("static_scale", s.to(dev))
            self.register_buffer("r_max", None)
            self.register_buffer("r_min", None)
            self.register_buffer("floor", None)
        else:
            pairs = [a.ratios(dev) for a in acts]
            self.register_buffer("static_scale", None)
            self.register_buffer("r_max", torch.stack([p[0] for p in pairs]).float().reshape(-1))
            self.register_buffer("r_min", torch.stack([p[1] for p in pairs]).float().reshape(-1))
            # the folded learnable-clip path (act_chain_folded) has no floor; the module path
            # (rotations, fixed clip ratios: ``sym_scale``) floors the scale at 1e-8
            floor = 0.0 if (inq.rotation is None and all(a.scale is None for a in acts)) else 1e-8
            self.register_buffer("floor", torch.full((len(acts),), floor, device=dev))
        self._cache: tuple | None = None
        # (weight, eps) of the RMSNorm whose output this group reads, when that norm is fused
        # into this group (:func:`fuse_block_norms`): the input is then the norm's input
        self.norm: tuple[torch.Tensor, float] | None = None

    @property
    def n_readers(self) -> int:
        return int(self.static_scale.numel() if self.static else self.r_max.numel())

    def apply_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The fused RMSNorm (:func:`rms_norm`), or x where none is fused."""
        return x if self.norm is None else rms_norm(x, *self.norm)

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """T x in x's dtype, with the fake quant's operations (the fused norm if any, d, then
        P1 X P2^T)."""
        x = self.apply_norm(x)
        if self.d is not None:
            x = x * self.d.to(x.dtype)
        if self.p1 is not None:
            p2t = None if self.p2t is None else self.p2t.to(x.dtype)
            x = kron_last(x, self.p1.to(x.dtype), p2t, self.n1, self.n2)
        return x

    def scales_and_codes(self, xt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [K, T, dim] as float32 integers, scales [K, T] float32) of the transformed
        tokens ``xt`` [T, dim]: the quantizers' arithmetic in float32."""
        xf = xt.float()
        q = qmax(self.bits)
        k = self.n_readers
        if self.static:
            s = self.static_scale.reshape(k, 1).expand(k, xf.shape[0])
        else:
            hi = torch.clamp(xf.amax(dim=-1), min=0.0)
            lo = torch.clamp(xf.amin(dim=-1), max=0.0).abs()
            m = torch.maximum(lo.unsqueeze(0) * self.r_min.reshape(k, 1),
                              hi.unsqueeze(0) * self.r_max.reshape(k, 1))
            s = torch.where(m == 0, torch.ones_like(m),
                            torch.maximum(m / q, self.floor.reshape(k, 1)))
        codes = torch.clamp(torch.round(xf.unsqueeze(0) / s.unsqueeze(-1)), -q - 1, q)
        return codes, s.contiguous()

    def quantize(self, x2: torch.Tensor, up: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes [K, T, dim] (int8 in emulation; FP8 e4m3 or int8 on CUDA) and scales [K, T]
        of x2 [T, dim], or with ``up`` [T, dim] of :func:`silu_mul` (x2, up) (x2 the gate). On
        CUDA the codes have padding rows after the T tokens (``lowbit_triton.gemm_rows``)."""
        if self.mode == "real":
            from . import lowbit_triton
            return lowbit_triton.quantize_input(self, x2, up)
        if up is not None:
            x2 = silu_mul(x2, up)
        codes, s = self.scales_and_codes(self.transform(x2))
        return codes.to(torch.int8), s

    def forward(self, x: torch.Tensor, user: int, up: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """(codes [T, dim], scales [T]) of reader ``user`` for x [..., dim] (with ``up``: for
        SiLU(x) * up); readers fed the same tensor object share one computation."""
        c = self._cache
        if c is not None and c[0] is x and c[2] < self.n_users:
            outs, uses = c[1], c[2] + 1
        else:
            outs, uses = self.quantize(x.reshape(-1, self.dim),
                                       None if up is None else up.reshape(-1, self.dim)), 1
        self._cache = (x, outs, uses) if uses < self.n_users else None
        k = min(user, self.n_readers - 1)
        return outs[0][k], outs[1][k]


# ----------------------------------------------------------------------------------- weights
@torch.no_grad()
def weight_codes(ql: QuantLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes [out, in], float32 row scales [out]) of Q_W(W T^{-1}), with the folding's
    arithmetic (W T^{-1} in float64, the quantizer in float32): codes * scale is the float32
    weight :meth:`QuantLinear.fold` stores before casting to the model dtype
    (:func:`export.linear_codes`, on the GPTQ codes' device where GPTQ made them)."""
    gptq = getattr(ql, "_gptq", None)
    if ql.w_quant is not None and gptq is not None:
        codes, scale = gptq
        dev = ql.w_quant.device
        return codes.to(torch.int8).to(dev), scale.float().reshape(-1).to(dev)
    ql._require_fp_weight("low-bit weight codes")
    codes, scale = linear_codes(ql)
    return codes, scale.reshape(-1)


class LowBitLinear(nn.Module):
    """The integer form of one folded :class:`QuantLinear`: weight codes, row scales, bias (in
    the output basis), and the group's shared :class:`LowBitInput`."""

    def __init__(self, ql: QuantLinear, inp: LowBitInput, dtype: torch.dtype, mode: str,
                 kind: str, storage: str = PACKED_STORAGE):
        super().__init__()
        self.mode, self.kind = mode, kind
        self.inp = inp
        self.user = ql.user
        self.in_features, self.out_features = ql.in_features, ql.out_features
        self.w_bits = ql.wq.bits
        codes, scale = weight_codes(ql)
        self.packed = storage == "packed" and self.w_bits <= 4 and self.in_features % 2 == 0
        if self.packed:
            w = pack_int4(codes)
        elif mode == "real":
            w = codes.to(self.code_dtype)
        else:
            w = codes
        self.register_buffer("qweight", w.contiguous())
        self.register_buffer("w_scale", scale.float().contiguous())
        b = ql.linear.bias
        fac = ql.out_factor(torch.float64)
        if b is not None and fac is not None:
            b = head_rows(b.double(), fac)
        self.register_buffer("bias", None if b is None else b.detach().to(dtype))

    @property
    def gemm(self) -> str:
        """The real path's GEMM, the input group's (one choice per group)."""
        return self.inp.gemm

    @property
    def code_dtype(self) -> torch.dtype:
        return self.inp.code_dtype

    def weight_int(self) -> torch.Tensor:
        """int8 codes [out, in] (emulation)."""
        if self.packed:
            return unpack_int4(self.qweight, self.in_features)
        return self.qweight.float().to(torch.int8)      # int8 or FP8 storage: exact codes

    def forward(self, x: torch.Tensor, up: torch.Tensor | None = None) -> torch.Tensor:
        """y for input x, or with ``up`` for input :func:`silu_mul` (x, up) (a fused SwiGLU
        MLP's down_proj: the product is formed inside the quantizing kernel)."""
        xc, xs = self.inp.forward(x, self.user, up)   # no module hooks: less host time
        if self.mode == "real":
            from . import lowbit_triton
            # the codes carry padding rows after the tokens (lowbit_triton.gemm_rows)
            y = lowbit_triton.gemm(self, xc, xs, x.dtype, x.numel() // x.shape[-1])
        else:
            y = emulate_gemm(xc, xs, self.weight_int(), self.w_scale, self.bias, x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)


def emulate_gemm(xc: torch.Tensor, xs: torch.Tensor, wc: torch.Tensor, ws: torch.Tensor,
                 bias: torch.Tensor | None, out_dtype: torch.dtype) -> torch.Tensor:
    """What the CUDA GEMM computes: the integer dot product c_x c_W^T (exact; float64 holds
    every sum of these codes), times the per-token and per-channel scales in float32, plus the
    bias, in ``out_dtype``."""
    acc = (xc.double() @ wc.double().T).float()
    y = acc * xs.float().unsqueeze(1) * ws.float().unsqueeze(0)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


# ------------------------------------------------------------------------------- attaching
def _dropped_weight(like: torch.Tensor) -> nn.Parameter:
    """A stand-in for a freed weight: right shape, dtype and device, one element of storage
    (code that reads ``.weight.dtype``/``.device``/``.shape`` keeps working)."""
    return nn.Parameter(torch.zeros((), dtype=like.dtype, device=like.device).expand(like.shape),
                        requires_grad=False)


@torch.no_grad()
def attach_block(block: nn.Module, mode: str, storage: str = PACKED_STORAGE,
                 kinds: tuple[str, ...] = ("fp8", "int8")) -> int:
    """Give every folded :class:`QuantLinear` of ``block`` whose bit widths an integer GEMM
    covers a :class:`LowBitLinear` backend (``mode``: ``real`` or ``emulate``), then free its
    FP and folded weights; ``kinds``: the GEMMs to use ("fp8", "int8"). Returns how many
    linears were attached; the others keep fake quant."""
    if mode not in ("real", "emulate"):
        raise ValueError(f"attach_block: mode {mode!r} is not real or emulate")
    inputs: dict[int, LowBitInput] = {}
    gemm = gemm_choice() if mode == "real" else "triton"
    n = 0
    for ql in [m for m in block.modules() if isinstance(m, QuantLinear)]:
        kind = gemm_kind(ql.wq.bits, ql.inq.act.bits if ql.inq is not None else 16)
        if kind not in kinds or ql.inq is None or not all(a.enabled for a in ql.inq.acts):
            continue
        if ql.fp_weight_dropped and getattr(ql, "_gptq", None) is None:
            raise RuntimeError("low-bit backend: attach before drop_fp_weight()")
        dtype = ql.linear.weight.dtype
        if ql.inq.transform is not None and ql.inq.transform._folded is None:
            ql.inq.fold()
        inp = inputs.get(id(ql.inq))
        if inp is None:
            inp = inputs[id(ql.inq)] = LowBitInput(ql.inq, dtype, ql.linear.weight.device, mode,
                                                   kind, gemm)
        ql.backend = LowBitLinear(ql, inp, dtype, mode, kind, storage)
        ql.linear.weight = _dropped_weight(ql.linear.weight)
        ql.w_folded = None
        ql.b_folded = None
        ql.w_quant = None
        ql.fp_weight_dropped = True
        n += 1
    return n


# ------------------------------------------------------------------------------ norm fusion
# A group fed by an RMSNorm whose output nothing else reads (q/k/v after the attention norm,
# gate/up after the MLP norm) takes the norm into its quantizing kernel: the norm's module
# passes its input through under inference and the kernel normalizes the token it already
# holds, so no normalized copy (and none of the norm's float32 passes) goes through memory.
# Which norm feeds which group, and that its arithmetic is :func:`rms_norm`, is found by
# running the block, never from family names; a block whose output moves is left unfused.
FUSE_TOLERANCE = 0.05     # block-update change allowed by fusion (code flips: ~1e-3)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The RMSNorm arithmetic the fusion reproduces (Llama's and Qwen2's, checked per module
    by :func:`norm_eps`): float32 mean of squares, rsqrt, the product rounded to x's dtype,
    times the weight."""
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dt)


@torch.no_grad()
def norm_eps(mod: nn.Module, dim: int) -> float | None:
    """eps where ``mod`` computes :func:`rms_norm` over ``dim`` features (bitwise, on a probe
    with outlier channels), else None."""
    eps = next((getattr(mod, a) for a in ("variance_epsilon", "eps")
                if isinstance(getattr(mod, a, None), float)), None)
    w = getattr(mod, "weight", None)
    if (eps is None or isinstance(mod, nn.Linear) or not isinstance(w, torch.Tensor)
            or w.dim() != 1 or w.shape[0] != dim or getattr(mod, "bias", None) is not None):
        return None
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, dim, generator=g) * torch.linspace(0.1, 30.0, dim)
    x = x.to(w.device, w.dtype)
    y = mod(x)
    return eps if isinstance(y, torch.Tensor) and torch.equal(y, rms_norm(x, w, eps)) else None


class DeferredNorm(nn.Module):
    """Stands in for an RMSNorm fused into the low-bit input groups that read its output:
    under inference it returns its input (the groups normalize it); with gradients on (where a
    :class:`QuantLinear` ignores its backend) it is the norm. Keeps the norm's ``weight``
    (same parameter, same state-dict name)."""

    def __init__(self, norm: nn.Module, eps: float, inputs: list[LowBitInput]):
        super().__init__()
        self.weight = norm.weight
        self.eps = eps
        self._norm = [norm]            # a list: not a submodule (its weight is ours)
        self._inputs = inputs
        self.active = True

    def set_active(self, on: bool) -> None:
        self.active = on
        for inp in self._inputs:
            inp.norm = (self.weight, self.eps) if on else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.active and not torch.is_grad_enabled():
            return x
        return self._norm[0](x)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.eps}, fused={self.active}"


def set_norm_fusion(model: nn.Module, on: bool) -> int:
    """Switch every fused norm of ``model`` on or off (benchmarks, tests); returns how many."""
    norms = [m for m in model.modules() if isinstance(m, DeferredNorm)]
    for m in norms:
        m.set_active(on)
    return len(norms)


def _block_update_change(out0, out1, h_in) -> float:
    d = (out0.float() - h_in.float()).norm()
    return float((out1.float() - out0.float()).norm() / d.clamp(min=1e-30))


@torch.no_grad()
def fuse_block_norms(block: nn.Module, run, hidden: torch.Tensor) -> int:
    """Fuse into each low-bit input group the RMSNorm that produces its input, where every
    reader of that output is one of the group's linears; ``run()`` runs ``block`` once on the
    input ``hidden`` and returns its hidden-state output. The block's update (output minus
    input) must stay within ``FUSE_TOLERANCE`` of the unfused one, else nothing is fused.
    Returns how many norms were fused."""
    qls = {n: m for n, m in block.named_modules()
           if isinstance(m, QuantLinear) and isinstance(m.backend, LowBitLinear)}
    if not qls:
        return 0
    cands = {n: m for n, m in block.named_modules()
             if n and not isinstance(m, (QuantLinear, DeferredNorm, LowBitLinear, LowBitInput))
             and isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 1}
    produced: dict[int, tuple[torch.Tensor, str]] = {}     # strong refs: ids stay unique
    read: dict[str, torch.Tensor] = {}
    linears = {n: m for n, m in block.named_modules() if isinstance(m, (QuantLinear, nn.Linear))}
    hooks = [m.register_forward_hook(
        lambda _m, _a, out, n=n: produced.__setitem__(id(out), (out, n)))
        for n, m in cands.items()]
    hooks += [m.register_forward_pre_hook(
        lambda _m, a, n=n: read.__setitem__(n, a[0])) for n, m in linears.items()]
    try:
        out0 = run()
    finally:
        for h in hooks:
            h.remove()
    readers: dict[str, list[str]] = {}
    for q, x in read.items():
        rec = produced.get(id(x))
        if rec is not None and rec[0] is x:
            readers.setdefault(rec[1], []).append(q)
    produced.clear()
    read.clear()
    fused: list[tuple[str, nn.Module, DeferredNorm]] = []
    for norm_name, names in readers.items():
        if not all(q in qls for q in names):       # a reader without a low-bit backend
            continue
        inps = {id(qls[q].backend.inp): qls[q].backend.inp for q in names}
        if len(inps) != 1:
            continue
        inp = next(iter(inps.values()))
        if any(m.backend.inp is inp for q, m in qls.items() if q not in names):
            continue
        norm = cands[norm_name]
        eps = norm_eps(norm, inp.dim)
        if eps is None:
            continue
        dn = DeferredNorm(norm, eps, [inp])
        _set_child(block, norm_name, dn)
        dn.set_active(True)
        fused.append((norm_name, norm, dn))
    if not fused:
        return 0
    if _block_update_change(out0, run(), hidden) > FUSE_TOLERANCE:
        for norm_name, norm, dn in fused:       # another reader of the norm's output
            dn.set_active(False)
            _set_child(block, norm_name, norm)
        return 0
    return len(fused)


def _set_child(root: nn.Module, dotted: str, new: nn.Module) -> None:
    parent, _, leaf = dotted.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, leaf, new)


# ------------------------------------------------------------------------ SwiGLU fusion
# A SwiGLU MLP computes down(act(gate(x)) * up(x)). With its three linears on the low-bit
# backend, the down_proj group's kernel takes gate's and up's outputs and forms the product
# itself (:func:`silu_mul`'s arithmetic: SiLU in float32 rounded to the model dtype, the
# product rounded once), so the product never goes through memory and the two elementwise
# kernels that form it are gone. Which module is such an MLP, which linear is the gate and that
# the activation is SiLU are found by running the block (the product's bits are compared),
# never from family names.
def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The product a fused down_proj group reads (transformers' SwiGLU: ``ACT2FN["silu"]``)."""
    return F.silu(gate) * up


class _GatedForward:
    """Mixin of a SwiGLU MLP whose down_proj forms the product in its kernel: under inference
    (and while active) ``down(gate(x), up=up(x))``, else the MLP's own forward."""

    def forward(self, x):
        names, active = self._gated
        if not active or torch.is_grad_enabled():
            return super().forward(x)
        gate, up, down = (self.get_submodule(n) for n in names)
        return down.backend(gate(x), up(x))


_GATED_CLASSES: dict[type, type] = {}


def _set_gated(mlp: nn.Module, names: tuple[str, str, str] | None, active: bool) -> None:
    """Give ``mlp`` the fused forward (names: gate, up, down, relative to it), switch it, or
    (names None) restore its own class. The class swap keeps every parameter's name."""
    cls = type(mlp)
    if names is None:
        if isinstance(mlp, _GatedForward):
            mlp.__class__ = cls.__bases__[1]
            del mlp._gated
        return
    if not isinstance(mlp, _GatedForward):
        if cls not in _GATED_CLASSES:
            _GATED_CLASSES[cls] = type(f"Gated{cls.__name__}", (_GatedForward, cls), {})
        mlp.__class__ = _GATED_CLASSES[cls]
    mlp._gated = (names, active)


def set_gated_fusion(model: nn.Module, on: bool) -> int:
    """Switch every fused SwiGLU MLP of ``model`` on or off (benchmarks, tests)."""
    mlps = [m for m in model.modules() if isinstance(m, _GatedForward)]
    for m in mlps:
        _set_gated(m, m._gated[0], on)
    return len(mlps)


def _find_gated(block: nn.Module, qls: dict[str, QuantLinear], run):
    """((mlp name, gate, up, down) of every module of ``block`` that computes exactly
    down(silu(gate(x)) * up(x)) with three low-bit linears, down the only reader of its
    group; the block's output), from one run of the block (tensor identity and the product's
    bits)."""
    ins: dict[str, torch.Tensor] = {}
    outs: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_m, args, out):
            ins[name] = args[0] if args else None
            outs[name] = out
        return hook
    hooks = [m.register_forward_hook(record(n)) for n, m in block.named_modules() if n]
    try:
        out = run()
    finally:
        for h in hooks:
            h.remove()
    found = []
    for dn, down in qls.items():
        parent, _, leaf = dn.rpartition(".")
        if down.backend.inp.n_users != 1 or not parent or dn not in ins:
            continue
        sibs = [n for n in qls if n != dn and n.rpartition(".")[0] == parent and n in ins]
        for gn, un in permutations(sibs, 2):
            g, u = outs[gn], outs[un]
            if (ins[gn] is not ins[un] or ins.get(parent) is not ins[gn]
                    or outs.get(parent) is not outs[dn] or g.shape != ins[dn].shape
                    or u.shape != g.shape or not torch.equal(silu_mul(g, u), ins[dn])):
                continue
            cut = len(parent) + 1
            found.append((parent, gn[cut:], un[cut:], leaf))
            break
    return found, out


@torch.no_grad()
def fuse_block_gated(block: nn.Module, run, hidden: torch.Tensor) -> int:
    """Fuse SiLU(gate) * up into the down_proj kernel of every SwiGLU MLP of ``block`` whose
    linears all run on the low-bit backend (``run()`` runs the block once on ``hidden`` and
    returns its output). The block's update must stay within ``FUSE_TOLERANCE`` of the
    unfused one, else nothing is fused. Returns how many MLPs were fused."""
    qls = {n: m for n, m in block.named_modules()
           if isinstance(m, QuantLinear) and isinstance(m.backend, LowBitLinear)}
    if len(qls) < 3:
        return 0
    found, out0 = _find_gated(block, qls, run)
    for parent, gate, up, down in found:
        _set_gated(block.get_submodule(parent), (gate, up, down), True)
    if found and _block_update_change(out0, run(), hidden) > FUSE_TOLERANCE:
        for parent, *_ in found:
            _set_gated(block.get_submodule(parent), None, False)
        return 0
    return len(found)


@torch.no_grad()
def fuse_inputs(loaded, n_tokens: int = 16) -> dict[str, int]:
    """:func:`fuse_block_norms` and :func:`fuse_block_gated` for every block of a loaded model
    whose linears run on a low-bit backend, fed the model's own hidden states of a short probe
    sequence. Returns how many norms and MLPs were fused."""
    from .blockio import call_block, capture_block_inputs

    embed = loaded.embed
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, embed.weight.shape[0], (1, n_tokens), generator=g)
    inputs = capture_block_inputs(loaded.model, loaded.blocks[0], ids.to(embed.weight.device),
                                  1, device=embed.weight.device, hidden_dtype=embed.weight.dtype)
    h = inputs.hidden[0]
    counts = {"norms": 0, "gated": 0}
    for block in loaded.blocks:
        p = next(block.parameters())
        hid = h.to(p.device, p.dtype)

        def run(block=block, hid=hid):
            return call_block(block, inputs, 0, hid)
        counts["norms"] += fuse_block_norms(block, run, hid)
        counts["gated"] += fuse_block_gated(block, run, hid)
        h = run()
    return counts
