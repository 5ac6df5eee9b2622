"""When a decoding row's output is final, so the decoder can stop it early (exactly).

Every released commit rule only ever fills masked positions: a committed token never changes
(a committed mask token, which the authors' decoders commit where it is the argmax, leaves its
position masked, so it is still open here).
A caller cuts a generated window at its first stop token (EOS / pad) and then, after decoding
to text, at the earliest stop string. So a row is final once

- every position before its first committed stop token is committed (what follows is cut), or
- the committed prefix before its first masked position decodes to text that already holds a
  complete stop string, in a part of the text later tokens cannot change (below), or
- nothing in it is masked any more.

Text that later tokens cannot change: ``decode(P)`` of the committed prefix ``P`` can still
change at its end when more tokens follow (byte-level BPE completes a UTF-8 character; a
clean-up removes a space before punctuation). Those changes reach back no further than the
text the last token added: the stable text is the common prefix of ``decode(P[:-1])`` and
``decode(P)``, less its last character when the last token added no visible text. A stop
string counts when it lies inside the stable text and no other stop string that starts
earlier could still be completed beyond it.

:class:`ExitTracker` reads the decoding window on the host. On a CUDA device the copy is
asynchronous and read one step later (after the next forward is queued), so checking adds no
GPU idle time; a finished row then takes part in one more forward, whose result is unused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch


@dataclass(frozen=True)
class StopRule:
    """What ends a row's output: ``stop_ids`` (the first one cuts the window), and per row
    ``until`` strings with the ``decode`` function the caller cuts them on (token ids ->
    text, the same the caller uses; without it stop strings are not checked)."""
    stop_ids: frozenset[int]
    until: Sequence[Sequence[str]] | None = None
    decode: Callable[[list[int]], str] | None = None
    # Whether a final row leaves the batch (the other rows then run a forward of fewer rows),
    # or the batch runs on at its full shape and stops once every row is final. Leaving is
    # exact only where a row's forward does not depend on the batch's shape: the tests show it
    # on the CPU, while on a GPU cuBLAS picks kernels by shape and bf16 near-ties can flip
    # (docs/fidelity.md). None: leave on the CPU, stop as a batch on any other device.
    drop_rows: bool | None = None


def stable_text(prefix: Sequence[int], decode: Callable[[list[int]], str]) -> str:
    """The part of ``decode(prefix)`` that no continuation of ``prefix`` can change."""
    if not prefix:
        return ""
    whole, before = decode(list(prefix)), decode(list(prefix[:-1]))
    n = 0
    for a, b in zip(whole, before):
        if a != b:
            break
        n += 1
    return whole[:n] if n < len(whole) else whole[:n - 1]


def stop_string_final(text: str, until: Sequence[str]) -> bool:
    """True when the earliest stop string of any continuation of ``text`` is already in it."""
    stops = [s for s in until if s]
    found = [j for j in (text.find(s) for s in stops) if j != -1]
    if not found:
        return False
    first = min(found)
    for s in stops:   # a stop starting before ``first`` and running past the text's end
        for i in range(max(0, len(text) - len(s) + 1), first):
            if s.startswith(text[i:]):
                return False
    return True


class ExitTracker:
    """Which rows of a decoding batch are final; see the module docstring."""

    def __init__(self, rule: StopRule, mask_id: int, device: torch.device | str) -> None:
        self.rule = rule
        self.mask_id = int(mask_id)
        # Read one step late where the copy is asynchronous (the decoder asks after queuing
        # the next forward rather than before it).
        self.lagged = torch.device(device).type == "cuda"
        self._seen: tuple[torch.Tensor, list[int], torch.cuda.Event | None] | None = None
        self._checked_prefix: dict[int, int] = {}     # row -> prefix length already found open

    def observe(self, window: torch.Tensor, rows: Sequence[int]) -> None:
        """The window ``[len(rows), K]`` after a step's commits (rows: original indices)."""
        if window.is_cuda:
            host = torch.empty(window.shape, dtype=window.dtype, pin_memory=True)
            host.copy_(window, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
            self._seen = (host, list(rows), event)
        else:
            self._seen = (window.to("cpu", copy=True), list(rows), None)

    def finished(self) -> list[int]:
        """Original indices of the rows found final at the last observation."""
        if self._seen is None:
            return []
        host, rows, event = self._seen
        self._seen = None
        if event is not None:
            event.synchronize()
        # First position per row that is masked or a stop token (vectorised: the window is
        # B x K tokens, checked at every step).
        is_stop = torch.isin(host, torch.tensor(sorted(self.rule.stop_ids), dtype=host.dtype))
        is_open = is_stop | (host == self.mask_id)
        first = is_open.to(torch.uint8).argmax(dim=1).tolist()
        done = []
        for j, (row, has_open) in enumerate(zip(rows, is_open.any(dim=1).tolist())):
            # nothing masked and no stop: complete; a stop before any mask: final
            if not has_open or bool(is_stop[j, first[j]]) or \
                    self._stops_before(row, host[j, :first[j]].tolist()):
                done.append(row)
        return done

    def _stops_before(self, row: int, prefix: list[int]) -> bool:
        """A settled stop string in the committed ``prefix`` (no stop token in it)."""
        rule = self.rule
        if rule.decode is None or rule.until is None or not prefix or not rule.until[row]:
            return False
        if self._checked_prefix.get(row) == len(prefix):
            return False       # same committed prefix as last time: nothing new to decode
        self._checked_prefix[row] = len(prefix)
        return stop_string_final(stable_text(prefix, rule.decode), rule.until[row])
