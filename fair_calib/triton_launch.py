"""Launching Triton kernels with less host time (the low-bit forward and the fused rotary).

``kernel[grid](*args)`` binds the arguments, specialises them (pointer alignment, integers
equal to 1 or divisible by 16), builds a cache key and looks the compiled kernel up: tens of
microseconds of host time a launch. A W4A4 forward launches four to five hundred Triton
kernels, and on the lent H100s the quantized forward's host time exceeded its GPU time
(docs/benchmarks.md). :func:`launch` does Triton's own launch the first time for a given
specialisation, keeps the compiled kernel, and afterwards calls it directly, the way
``CompiledKernel.__getitem__`` does. The cache key holds what Triton specialises the runtime
arguments on (:func:`arg_spec`), the constexprs, the launch options and the device, so a
direct launch runs the kernel Triton's own launch would pick. Where a launch hook is
installed (profilers), on CPU tensors (Triton's interpreter), or with ``DIRECT_LAUNCH`` off,
every launch takes Triton's path.
"""
from __future__ import annotations

import torch
from triton import knobs
from triton.runtime import driver

DIRECT_LAUNCH = True   # off: every launch through kernel[grid](...) (benchmarks compare both)
_COMPILED: dict = {}


def _on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def _hooked(hook) -> bool:
    """Whether a launch hook is installed: Triton's HookChain with calls in it (its default is
    an empty chain), or any other callable."""
    return hook is not None and bool(getattr(hook, "calls", True))


class _Unsupported(Exception):
    pass


def arg_spec(a) -> tuple | None:
    """What Triton specialises a runtime argument on: a tensor's dtype and 16-byte alignment,
    an integer's being 1, divisible by 16, or 64-bit; nothing for a float. Anything else is
    not cached (:func:`launch` takes Triton's path)."""
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if isinstance(a, int) and not isinstance(a, bool):
        return a == 1, a % 16 == 0, not -2 ** 31 <= a < 2 ** 31
    if isinstance(a, float):
        return None
    raise _Unsupported(type(a).__name__)


def launch(kernel, grid: int, args: tuple, consts: dict, options: dict) -> None:
    """``kernel[(grid,)](*args, **consts, **options)``: ``args`` the runtime arguments (the
    kernel's first parameters, in order), ``consts`` all its constexpr parameters, ``options``
    the launch options (num_warps, maxnreg)."""
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    cache = DIRECT_LAUNCH and first is not None and _on_gpu(first) and not (
        _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook))
    if not cache:                      # CPU tensors (Triton's interpreter), profilers' hooks
        kernel[(grid,)](*args, **consts, **options)
        return
    device = driver.active.get_current_device()
    try:
        key = (kernel, device, tuple(arg_spec(a) for a in args), tuple(consts.items()),
               tuple(options.items()))
    except _Unsupported:
        kernel[(grid,)](*args, **consts, **options)
        return
    hit = _COMPILED.get(key)
    if hit is None:
        compiled = kernel[(grid,)](*args, **consts, **options)
        if hasattr(compiled, "packed_metadata"):
            names = kernel.arg_names[len(args):]
            _COMPILED[key] = (compiled, tuple(consts[n] for n in names))
        return
    compiled, const_values = hit
    compiled.run(grid, 1, 1, driver.active.get_current_stream(device), compiled.function,
                 compiled.packed_metadata, None, None, None, *args, *const_values)
