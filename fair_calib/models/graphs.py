"""CUDA-graph replay of :meth:`LoadedModel.logits`: the same kernels as eager, without the host.

Every step of one generation has one shape, and so do an MC request's batches. At those shapes
(one row of 200-2,000 tokens, a few rows of 50-300) the host, not the GPU, sets the time of a
forward: enqueueing a quantized forward's ~800 kernels takes longer than running them
(docs/benchmarks.md). :class:`GraphCache` runs a forward eagerly the first time its key (input
shape, ``keep_last``) is seen, captures it into a CUDA graph the second time, and from then on
copies the input ids into the graph's buffer and replays it.

Replay computes what eager computes, kernel for kernel:

- the attention: transformers up to at least 5.17 builds the bidirectional attention mask
  whenever a CUDA stream is capturing (its "can the mask be skipped" check treats capture as
  tracing), where eager passes none; SDPA then picks its math kernel in the graph and a fused
  one in eager (other logits, and slower). The capture runs with that check answering as it
  does in eager for a forward without a padding mask (:func:`_eager_mask_decisions`), so SDPA
  gets the same inputs (no mask) and picks the same kernel;
- Triton kernels are compiled by the eager call before the capture (Triton's own launch
  finds them in its cache while capturing); cuBLAS gets a workspace of the same size on the
  capture stream, so its heuristics choose the same algorithms;
- a forward with a padding mask (its position ids need a host read) or with gradients, off
  CUDA, or under a transformers without that mask check, always runs eagerly.

``tests`` check the caching policy on the CPU; ``benchmarks/decode_graphs_gpu.py`` checks on a
GPU that decoding through replay gives eager's tokens and bit-identical logits.

Memory: graphs share one memory pool per model; each keeps its input buffer and its output
logits alive (the intermediates are reused between graphs, which run one at a time), and at
most ``MAX_GRAPHS`` are kept, the least recently used dropped first. Replayed logits are
returned as a copy, so a caller may keep them across steps as it keeps eager's.

``FAIR_CALIB_GRAPHS``: ``auto`` (default: replay where the conditions above hold) or ``off``.
"""
from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..jobs.environment import env_choice

SETTING = "FAIR_CALIB_GRAPHS"
MODES = ("auto", "off")
MAX_GRAPHS = 4          # graphs kept per model: one generation, or an MC request, needs one
CAPTURE_AT = 2          # the call of a key that captures it (the first runs eagerly: warm-up)


def setting() -> str:
    return env_choice(SETTING, "auto", MODES)


def replayable(ids: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether a forward on ``ids`` may run from a graph: CUDA, no padding mask, no autograd,
    and a transformers whose mask decision the capture can align with eager's."""
    return (attention_mask is None and ids.is_cuda and not torch.is_grad_enabled()
            and setting() == "auto" and mask_decision_alignable())


def mask_decision_alignable() -> bool:
    """Whether transformers has the bidirectional-mask check :func:`_eager_mask_decisions`
    aligns; a transformers without it may build the mask under capture in another way, so
    its forwards run eagerly (the same numbers, no replay)."""
    from transformers import masking_utils as mu

    return callable(getattr(mu, "_ignore_bidirectional_mask_sdpa", None))


@dataclass
class _Graph:
    graph: object
    ids: torch.Tensor           # the captured input buffer
    out: torch.Tensor           # the captured output


@dataclass
class GraphStats:
    eager: int = 0
    captures: int = 0
    replays: int = 0
    evicted: int = 0
    capture_s: float = 0.0      # host time spent capturing (warm-up forward + capture)
    keys: list = field(default_factory=list)


class GraphCache:
    """Replays ``forward(ids, keep_last) -> logits`` from CUDA graphs keyed by shape.

    ``backend`` makes the graphs (``torch.cuda``'s by default; the tests pass a stand-in)."""

    def __init__(self, forward: Callable[[torch.Tensor, int | None], torch.Tensor],
                 max_graphs: int = MAX_GRAPHS, capture_at: int = CAPTURE_AT, backend=None):
        if max_graphs < 1 or capture_at < 2:
            raise ValueError(f"GraphCache: max_graphs={max_graphs} must be >= 1 and "
                             f"capture_at={capture_at} >= 2 (the first call warms up)")
        self.forward = forward
        self.max_graphs, self.capture_at = max_graphs, capture_at
        self.backend = backend or _CudaGraphs()
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.calls: dict[tuple, int] = {}
        self.stats = GraphStats()

    def __call__(self, ids: torch.Tensor, keep_last: int | None) -> torch.Tensor:
        key = (tuple(ids.shape), ids.dtype, str(ids.device), keep_last)
        g = self.graphs.get(key)
        if g is None:
            n = self.calls[key] = self.calls.get(key, 0) + 1
            if n < self.capture_at:
                self.stats.eager += 1
                return self.forward(ids, keep_last)
            g = self._capture(key, ids, keep_last)
        self.graphs.move_to_end(key)
        g.ids.copy_(ids)
        self.backend.replay(g.graph)
        self.stats.replays += 1
        return g.out.clone()

    def _capture(self, key: tuple, ids: torch.Tensor, keep_last: int | None) -> _Graph:
        while len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)
            self.stats.evicted += 1
        t0 = time.perf_counter()
        static_ids = ids.clone()
        graph, out = self.backend.capture(lambda: self.forward(static_ids, keep_last))
        g = self.graphs[key] = _Graph(graph, static_ids, out)
        self.stats.captures += 1
        self.stats.capture_s += time.perf_counter() - t0
        self.stats.keys.append(key)
        return g

    def clear(self) -> None:
        self.graphs.clear()
        self.calls.clear()


class _CudaGraphs:
    """Capture on a side stream after one warm-up call there, into one shared memory pool."""

    def __init__(self):
        self.pool = None
        self.stream = None

    def capture(self, fn: Callable[[], torch.Tensor]):
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
            self.stream = torch.cuda.Stream()
        # a warm-up call on the capture stream: its cuBLAS handle and workspace exist before
        # the capture, as PyTorch's documentation of CUDA graphs asks
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.stream):
            fn()
        torch.cuda.current_stream().wait_stream(self.stream)
        graph = torch.cuda.CUDAGraph()
        with _eager_mask_decisions(), torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
            out = fn()
        return graph, out

    @staticmethod
    def replay(graph) -> None:
        graph.replay()


@contextlib.contextmanager
def _eager_mask_decisions():
    """transformers' bidirectional-mask check as it answers in eager, while capturing: a
    forward without a padding mask and without a local-attention window needs no mask (eager
    reaches the same answer; under capture it would build one, see the module docstring)."""
    from transformers import masking_utils as mu

    native = mu._ignore_bidirectional_mask_sdpa      # present: replayable() checked it

    def ignore(padding_mask, kv_length, local_attention_size=None):
        if padding_mask is None and (local_attention_size is None
                                     or kv_length < local_attention_size):
            return True
        return native(padding_mask, kv_length, local_attention_size)

    mu._ignore_bidirectional_mask_sdpa = ignore
    try:
        yield
    finally:
        mu._ignore_bidirectional_mask_sdpa = native
