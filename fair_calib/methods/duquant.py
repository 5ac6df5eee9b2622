"""``duquant``: DuQuant (Lin et al., Hsu1023/DuQuant) as QDLM runs it (``main.py --quant_method
duquant --block_size 128 --max_rotation_step 256 --smooth --alpha 0.5 --lac 0.9 --swc 0.8
--epochs 0``; W8A8 and W4A4).

Per block (no optimisation):
1. smoothing exactly as :mod:`.smoothquant` (DuQuant's ``--smooth``: alpha 0.5, max |x| of the
   FP calibration set, DuQuant's ``pairs``; folded into norms / feeders, GQA o_proj online);
2. rotation pass (``rotate_inps``): the block is run once, weights and activations quantized,
   on ONE sequence: for block 0 the mean over the calibration samples of its inputs, for block
   i > 0 the output of this pass through block i - 1 (the quantized blocks, not the FP ones).
   The first time a group's (smoothed) input arrives, its transform is found from it
   (``online_duquant_cali``): a greedy block rotation R1, the zigzag permutation P, a second
   greedy rotation R2; x -> ((x R1) P) R2 with block-diagonal R1, R2 (``block_size``). Every
   linear of the group uses it (k/v copy q's, up copies gate's), weights W -> W R1 P R2;
3. weights per output channel, asymmetric min/max with both bounds times ``swc`` (0.8), round
   to nearest; activations per token, asymmetric min/max with both bounds times ``lac`` (0.9).

Greedy rotation (``UniformAffineQuantizer.rotation``), on x reshaped to rows of ``block_size``:
up to ``max_rotation_step`` times take the largest and smallest entry, record their difference
(the peak), take the row index r of the larger in magnitude and multiply by ``get_rot`` with
channel 0 swapped with channel r mod block_size; keep the prefix of steps whose final peak is
smallest. ``get_rot`` is ``Rot.pkl``'s matrix (``get_rot.py``: a product of Givens rotations
whose channel-0 row spreads evenly) times diag(1, Q), Q orthogonal from a random Gaussian; one
draw per ``rotation`` call.
The rotations and permutation are saved with the group (``g{j}.rotation.R/perm``) and applied
online to the activations at evaluation (fake quantization: zero points, not the integer GEMMs).

``arithmetic``: ``authors`` (the default) as DuQuant's code computes: the layer in float16,
computing as DuQuant's layer classes (``fair_calib.quant.duquant_layer``; smoothing as
:mod:`.smoothquant`'s ``authors``; the rotation pass, its greedy search, the
rotations, weight codes and every quantizer in float16, ``fair_calib.quant.half``), the
attention matmuls' inputs quantized (Q and K rotated by a Hadamard of ``block_size`` and
quantized with ``lac``, V quantized; ``qkt_matmul`` / ``pv_matmul``), ``get_rot``'s Gaussian
drawn from the global RNG, seeded with the config's seed when calibration starts (``main.py``'s
``torch.manual_seed``) and continued from block to block as one stream (the calibration
driver's own per-block seeding does not touch it; its state is saved with every block, so a
resumed run continues it). ``precise``: everything in float32, attention matmuls in full
precision, the Gaussian from a generator seeded per block (seed x 1000003 + block).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import nn

from ..quant import half
from ..quant.blockio import BlockInputs, call_block
from ..quant.discovery import get_submodule
from ..quant.groupwise import fake_quant_zp, group_codes, minmax_asym_params
from ..quant.qlinear import QuantLinear
from ..quant.quantizers import WeightQuantizer, is_quantized
from .smoothquant import AsymActQuantizer, SmoothInputQuant, SmoothQuantMethod

ROT_INPUT_KEY = "duquant.rot_input"   # block 0's saved rotation-pass input (resume)
RNG_KEY = "duquant.rng_state"         # the global RNG's state after the block (authors)


# ------------------------------------------------------------------ the reference's matrices
@lru_cache(maxsize=None)
def givens_spread(n: int) -> torch.Tensor:
    """``Rot.pkl[n]`` as ``get_rot.py`` builds it: R = G_{n-2} ... G_0 (G_i rotates (i, i+1) by
    cos 1/sqrt(i+2)), then rows and columns 0 and n-1 exchanged. In float32 matmuls as there
    (on the CPU): the greedy search is discrete, a last-bit change of R can change its choices."""
    r = torch.eye(n)
    for i in range(n - 1):
        c, s = 1 / math.sqrt(i + 2), math.sqrt(i + 1) / math.sqrt(i + 2)
        g = torch.eye(n)
        g[i, i] = g[i + 1, i + 1] = c
        g[i, i + 1], g[i + 1, i] = -s, s
        r = g @ r
    return exchange(r, 0, n - 1)


def exchange(r: torch.Tensor, i: int, j: int) -> torch.Tensor:
    """``exchange_row_col``: rows i, j and then columns i, j swapped."""
    idx = torch.arange(r.shape[0])
    idx[i], idx[j] = j, i
    return r[idx][:, idx]


def random_rotation(n: int, gen: torch.Generator | None) -> torch.Tensor:
    """``get_rot(n)``: Rot.pkl[n] @ diag(1, Q), Q from the QR of an (n-1)^2 Gaussian (CPU,
    float32, so every device gets the same matrix); ``gen`` None: the global RNG."""
    q, _ = torch.linalg.qr(torch.randn(n - 1, n - 1, generator=gen))
    full = torch.zeros(n, n)
    full[0, 0] = 1.0
    full[1:, 1:] = q
    return givens_spread(n) @ full


def _peak(w: torch.Tensor) -> tuple[float, int]:
    """(max - min, the row of whichever is larger in magnitude) as ``rotation`` reads them."""
    n = w.shape[-1]
    r, c = divmod(int(w.argmax()), n)
    r2, c2 = divmod(int(w.argmin()), n)
    hi, lo = w[r, c], w[r2, c2]
    return float(hi - lo), (r if hi.abs() > lo.abs() else r2)


@torch.no_grad()
def greedy_rotation(x: torch.Tensor, block: int, steps: int,
                    gen: torch.Generator | None) -> torch.Tensor:
    """``rotation(x)``'s block matrix R_ (``[block, block]``) for x ``[tokens, dim]``, in x's
    dtype (DuQuant's float16 layer: the factors cast to it, the products in it)."""
    rot = random_rotation(block, gen).to(x.device, x.dtype)
    w = x.reshape(-1, block)
    ids, peaks = [], []
    for _ in range(steps):
        p, row = _peak(w)
        peaks.append(p)
        ids.append(row)
        w = w @ exchange(rot, 0, row % block)
    peaks.append(_peak(w)[0])
    best = min(range(len(peaks)), key=peaks.__getitem__)   # first minimum, as torch.argmin
    r = torch.eye(block, dtype=x.dtype, device=x.device)
    for row in ids[:best]:           # the kept prefix, multiplied again (as the reference)
        r = r @ exchange(rot, 0, row % block)
    return r


def zigzag_permutation(x: torch.Tensor, block: int) -> torch.Tensor:
    """``permutation_zigzag``: channels by decreasing max |x| (stable), dealt to the blocks
    0, 1, .., n-1, n-1, .., 0, 0, 1, ..; block k takes positions k*block.. of the result. Each
    block receives its channels in decreasing order already, so the reference's per-block
    re-sort (stable) changes nothing and is not repeated."""
    dim = x.shape[-1]
    nb = dim // block
    order = torch.sort(x.abs().amax(dim=0).cpu(), descending=True, stable=True)[1]
    k = torch.arange(dim) % (2 * nb)
    dest = torch.where(k < nb, k, 2 * nb - 1 - k)
    return torch.cat([order[dest == b] for b in range(nb)])


# ------------------------------------------------------------------ modules
class DuQuantRotation(nn.Module):
    """x -> ((x R1) P) R2 with R1, R2 applied to every ``block`` channels (``init_duquant``
    after calibration; ``permutation_times`` 1). ``.rotate`` is the InputQuant interface."""

    def __init__(self, dim: int, block: int):
        super().__init__()
        if block <= 0 or dim % block:
            raise ValueError(f"duquant: block_size {block} does not divide the input width {dim}")
        self.block = block
        self.register_buffer("R", torch.eye(block).repeat(2, 1, 1))
        self.register_buffer("perm", torch.arange(dim).unsqueeze(0))

    def _blocks(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return (x.reshape(-1, self.block) @ r.to(x.dtype)).reshape(x.shape)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        x = self._blocks(x, self.R[0])
        return self._blocks(x[..., self.perm[0]], self.R[1])

    @torch.no_grad()
    def calibrate(self, x: torch.Tensor, steps: int, gen: torch.Generator | None) -> None:
        """``online_duquant_cali`` on x ``[tokens, dim]``, in its dtype."""
        r1 = greedy_rotation(x, self.block, steps, gen)
        x = self._blocks(x, r1)
        perm = zigzag_permutation(x, self.block).to(x.device)
        r2 = greedy_rotation(x[:, perm], self.block, steps, gen)
        self.R.copy_(torch.stack([r1, r2]))
        self.perm.copy_(perm.unsqueeze(0))

    def export_tensors(self) -> dict[str, torch.Tensor]:
        return {"rot_R": self.R.to(torch.bfloat16).cpu(), "rot_perm": self.perm.to(torch.int32).cpu()}


class DuQuantInputQuant(SmoothInputQuant):
    """A group's input: divided by the online smoothing scales (GQA o_proj), rotated, then
    quantized per token (asymmetric, ``lac``)."""

    def __init__(self, dim: int, act, online_smooth: bool, rotation: DuQuantRotation,
                 in_dtype: bool = False):
        super().__init__(dim, act, online_smooth, in_dtype)
        self.rotation = rotation

    def smoothed(self, x: torch.Tensor) -> torch.Tensor:
        return super().transform_x(x)

    def transform_x(self, x, mats=None):
        return self.rotation.rotate(self.smoothed(x))


def swc_params(ratio: float):
    """DuQuant's min/max (scale, zero) with both bounds times ``ratio`` (swc / lac): the
    min/max of ratio * x (a positive factor commutes with max and min)."""
    return lambda x, bits: minmax_asym_params(x * ratio, bits)


class SWCWeightQuantizer(WeightQuantizer):
    """Per output channel, asymmetric, both bounds times ``clip_ratio`` (swc); used while the
    rotation pass runs, before the weights get their codes."""

    def forward(self, w, out_fac=None):
        if not self.enabled:
            return w
        scale, zero = swc_params(self.clip_ratio)(w, self.bits)
        return fake_quant_zp(w, scale, zero, self.bits)


def _first_sample(inputs: BlockInputs) -> BlockInputs:
    """Micro-batch 0's extra arguments cut to batch 1 (the rotation pass runs one sequence):
    every tensor whose leading dimension is the micro-batch size (masks, position embeddings)."""
    b = inputs.hidden[0].shape[0]

    def cut(o):
        if isinstance(o, torch.Tensor):
            return o[:1] if b > 1 and o.dim() > 0 and o.shape[0] == b else o
        if isinstance(o, (tuple, list)):
            return type(o)(cut(v) for v in o)
        if isinstance(o, dict):
            return {k: cut(v) for k, v in o.items()}
        return o
    return BlockInputs([inputs.hidden[0][:1]], [cut(inputs.args[0])], [cut(inputs.kwargs[0])],
                       inputs.hidden_key)


def _autocast_like(block: nn.Module):
    """The driver's autocast for a block placed on its device (half-precision CUDA blocks)."""
    p = next(block.parameters())
    on = p.device.type == "cuda" and p.dtype in (torch.bfloat16, torch.float16)
    return torch.autocast(p.device.type, dtype=p.dtype if on else torch.bfloat16, enabled=on)


class DuQuantMethod(SmoothQuantMethod):
    type_name = "duquant"

    def __init__(self, cfg, w_bits, a_bits, seed=0):
        super().__init__(cfg, w_bits, a_bits, seed)
        self._blocks = None
        self._rot_input0: torch.Tensor | None = None   # block 0's rotation-pass input
        self._rot: tuple[int, torch.Tensor] | None = None   # (block it feeds, hidden)
        self._rng_state: torch.Tensor | None = None   # authors: the global RNG's stream

    # the settings, QDLM's values as defaults (read literally: tests/test_faults.py greps them)
    @property
    def block_size(self) -> int:
        return int(self.cfg.get("block_size", 128))

    @property
    def steps(self) -> int:
        return int(self.cfg.get("max_rotation_step", 256))

    @property
    def lac(self) -> float:
        return float(self.cfg.get("lac", 0.9))

    @property
    def swc(self) -> float:
        return float(self.cfg.get("swc", 0.8))

    def prepare_model(self, loaded) -> None:
        super().prepare_model(loaded)
        self._blocks = loaded.blocks
        if self.authors:
            from ..quant.trace import head_dim

            hd = head_dim(loaded.model.config)
            if is_quantized(self.a_bits):
                if self.block_size > hd or hd % self.block_size:
                    raise ValueError(f"duquant: block_size {self.block_size} does not divide the "
                                     f"attention head dim {hd}: DuQuant's Hadamard on q/k "
                                     "(qkt_matmul) would mix tokens; use a block_size dividing it")
                half.hadamard_matrix(self.block_size)     # a power of two, else refused
            with torch.random.fork_rng(devices=[]):    # the caller's global state kept
                torch.manual_seed(self.seed)           # main.py's torch.manual_seed(args.seed)
                self._rng_state = torch.get_rng_state()

    def qkv_quant(self) -> half.QKVQuant:
        """DuQuant's ``qkt_matmul`` (Hadamard of block_size, ``lac``) and ``pv_matmul`` (V
        per row) inputs."""
        return half.QKVQuant(self.a_bits, lac=self.lac, hadamard=self.block_size)

    def make_input_quant(self, group, j, stats, block, block_index):
        act = (half.HalfActQuantizer(self.a_bits, clip_ratio=self.lac) if self.authors else
               AsymActQuantizer(self.a_bits, clip_ratio=self.lac))
        return DuQuantInputQuant(group.in_features, act,
                                 self.online_smooth(block, j, block_index),
                                 DuQuantRotation(group.in_features, self.block_size),
                                 in_dtype=self.authors)

    def make_weight_quant(self, name, linear, inq, stats):
        cls = half.HalfWeightQuantizer if self.authors else SWCWeightQuantizer
        return cls(linear.out_features, self.w_bits, clip_ratio=self.swc)

    def set_block_codes(self, block, groups) -> None:
        """Codes come after the rotation pass (:meth:`fit_block`), not after smoothing."""

    # ---------------------------------------------------------------- the rotation pass
    @torch.no_grad()
    def fit_block(self, block, groups, inputs, block_index, run) -> None:
        one = _first_sample(inputs)
        if block_index == 0:
            # rotate_inps = inps.mean(dim=0): in the layer's float16 (authors)
            dt = torch.float16 if self.authors else torch.float32
            self._rot_input0 = torch.cat([h.to(dt) for h in inputs.hidden]).mean(0, keepdim=True)
            h = self._rot_input0
        elif self._rot is not None and self._rot[0] == block_index:
            h = self._rot[1]
        else:
            h = self._replay(block_index, one)
        block._duquant_rot_input = self._rot_input0 if block_index == 0 else None
        out = self._rotation_pass(block, groups, one, h, block_index)
        self._rot = (block_index + 1, out)
        for g in groups:
            for n in g.names:
                self._set_codes(get_submodule(block, n))

    def _rotation_pass(self, block, groups, one, h, block_index) -> torch.Tensor:
        if not self.authors:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + block_index)
            return self._run_rotation_pass(block, groups, one, h, gen)
        if self._rng_state is None:
            raise RuntimeError("duquant: prepare_model must run before the rotation pass")
        # get_rot's torch.randn: the global RNG, continuing DuQuant's one stream (the
        # driver's own global seeding outside this pass is restored by fork_rng)
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self._rng_state)
            out = self._run_rotation_pass(block, groups, one, h, None)
            self._rng_state = torch.get_rng_state()
        return out

    def _run_rotation_pass(self, block, groups, one, h, gen) -> torch.Tensor:
        steps = self.steps
        done: set[int] = set()
        authors = self.authors

        def pre(mod, args):
            inq = mod.inq
            if id(inq) not in done:        # the group's first reader to run
                done.add(id(inq))
                x = inq.smoothed(args[0] if authors else args[0].float())
                inq.rotation.calibrate(x.reshape(-1, inq.dim), steps, gen)
        hooks = [get_submodule(block, n).register_forward_pre_hook(pre)
                 for g in groups for n in g.names]
        try:
            with _autocast_like(block):
                dt = next(block.parameters()).dtype
                return call_block(block, one, 0, h.to(dt)).float()
        finally:
            for hk in hooks:
                hk.remove()

    def _replay(self, block_index: int, one: BlockInputs) -> torch.Tensor:
        """A resumed run: block ``block_index``'s rotation input recomputed through the
        restored quantized blocks from block 0's saved one."""
        if self._rot_input0 is None or self._blocks is None:
            raise RuntimeError(f"duquant: no rotation input for block {block_index} (block 0's "
                               "saved state lacks it)")
        h = self._rot_input0
        for k in range(block_index):
            blk = self._blocks[k]
            home = next(blk.parameters()).device
            blk.to(h.device)
            with _autocast_like(blk):
                h = call_block(blk, one, 0, h.to(next(blk.parameters()).dtype)).float()
            blk.to(home)
        return h

    def _set_codes(self, ql: QuantLinear) -> None:
        if not is_quantized(self.w_bits):
            return
        if self.authors:        # quant_inplace: the weight quantizer on W R1 P R2, float16
            w = ql.inq.weight_inverse(ql.linear.weight)
            self.set_codes(ql, half.uaq_codes(w, self.w_bits, ql.wq.clip_ratio))
            return
        w = ql.inq.weight_inverse(ql.linear.weight.float())
        self.set_codes(ql, group_codes(w, self.w_bits, -1, swc_params(ql.wq.clip_ratio)))

    # ---------------------------------------------------------------- state
    def block_state(self, block, groups):
        out = super().block_state(block, groups)
        h = getattr(block, "_duquant_rot_input", None)
        if h is not None:
            out[ROT_INPUT_KEY] = h.detach().float().cpu()
        if self.authors and self._rng_state is not None:
            out[RNG_KEY] = self._rng_state.clone()
        return out

    @torch.no_grad()
    def load_block_state(self, block, groups, state):
        state = dict(state)
        if ROT_INPUT_KEY in state:
            self._rot_input0 = state.pop(ROT_INPUT_KEY).to(block_device(block))
            block._duquant_rot_input = self._rot_input0
        if RNG_KEY in state:
            self._rng_state = state.pop(RNG_KEY).cpu().to(torch.uint8)
        super().load_block_state(block, groups, state)


def block_device(block: nn.Module) -> torch.device:
    return next(block.parameters()).device
