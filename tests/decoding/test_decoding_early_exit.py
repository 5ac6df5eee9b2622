"""Early exit: a row stopped once its output is final decodes exactly what the full run does."""
from __future__ import annotations

import pytest
import torch

from fair_calib.decoding import StopRule, decode, make_policy
from fair_calib.decoding.early_exit import ExitTracker, stable_text, stop_string_final
from fair_calib.decoding.generate import COUNTED_SCHEDULE_POLICIES
from fair_calib.decoding.trajectory import CommitRecorder

from decoding_helpers import MASK_ID, tiny_llama

POLICIES = [
    ("low_confidence", 0.0, {"block_length": 4}),
    ("low_confidence", 0.0, {}),
    ("random", 0.9, {"block_length": 4}),
    ("random_commit", 0.0, {}),
    ("random_commit", 1.0, {}),
    ("entropy", 0.0, {}),
    ("entropy", 0.7, {"top_p": 0.9}),
    ("topk_margin", 0.0, {}),
    ("maskgit_plus", 0.8, {"alg_temp": 0.3}),
    ("origin", 0.5, {}),
]


def _generators(kind: str, seed: int, n: int):
    """Per-row generators, one batch-wide generator, or torch's global RNG (seeded here)."""
    if kind == "per_row":
        return [torch.Generator().manual_seed(seed + r) for r in range(n)]
    if kind == "one":
        return torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return None


def _cut(row: list[int], stop_ids: set[int]) -> list[int]:
    """The row up to and including its first stop token (what a caller keeps)."""
    for i, tok in enumerate(row):
        if tok in stop_ids:
            return row[:i + 1]
    return row


def _final_step(row: list[int], commit_t: list[int], steps: int, stop_ids: set[int]) -> int:
    """The step (1-based, in the order run) after which everything up to the row's first stop
    token is committed: where early exit must stop the row on the CPU."""
    n = len(_cut(row, stop_ids))
    return max(steps - t + 1 for t in commit_t[:n])


def _expected_steps(tokens: torch.Tensor, commit_t: torch.Tensor, steps: int,
                    stop_ids: set[int]) -> list[int]:
    return [_final_step(tokens[r].tolist(), commit_t[r].tolist(), steps, stop_ids)
            for r in range(tokens.shape[0])]


def _stops_that_split_the_batch(tokens: torch.Tensor, commit_t: torch.Tensor, steps: int) -> set[int]:
    """Two stop tokens from the full run's output with which rows end early, at different
    steps (the first such pair in token order), so the test exercises dropping rows."""
    found = sorted(set(tokens.reshape(-1).tolist()))
    for i, a in enumerate(found):
        for b in found[i + 1:]:
            want = _expected_steps(tokens, commit_t, steps, {a, b})
            if min(want) < steps and len(set(want)) > 1:
                return {a, b}
    raise AssertionError("no pair of stop tokens ends rows at different steps")


def _full_run(model, pol, generators):
    """The full run's tokens and commit steps, and stop tokens that split its batch."""
    rec = CommitRecorder()
    full = decode(model, PROMPTS, pol, generators, recorder=rec)
    assert full.steps == [pol.steps] * len(PROMPTS)
    return full.tokens, rec.commit_steps, _stops_that_split_the_batch(
        full.tokens, rec.commit_steps, pol.steps)


def _assert_same_as_full(early, tokens, commit_t, pol, stop_ids, what):
    for r in range(tokens.shape[0]):
        want = _cut(tokens[r].tolist(), stop_ids)
        assert early.tokens[r].tolist()[:len(want)] == want, (what, r)
    # On the CPU a row stops right after the step that makes it final; under Dream's count
    # rule the batch keeps its shape and stops once its last row is final (the count is a mean
    # over every row's masked positions).
    want_steps = _expected_steps(tokens, commit_t, pol.steps, stop_ids)
    if pol.name in COUNTED_SCHEDULE_POLICIES and len(want_steps) > 1:
        want_steps = [max(want_steps)] * len(want_steps)
    assert early.steps == want_steps, what


PROMPTS = [[3, 7, 1, 9, 2], [4, 4], [8, 1, 6, 2, 5, 3, 1, 7], [2, 9, 9]]


@pytest.mark.parametrize("policy,temperature,extra", POLICIES)
@pytest.mark.parametrize("gen_kind", ["per_row", "one", "global"])
def test_early_exit_equals_the_full_run(llada_tiny, dream_tiny, policy, temperature, extra, gen_kind):
    for model in (llada_tiny, dream_tiny):
        pol = make_policy(model, {"policy": policy, "steps": 8, "gen_length": 16,
                                  "temperature": temperature, **extra})
        tokens, commit_t, stop_ids = _full_run(model, pol, _generators(gen_kind, 5, len(PROMPTS)))
        early = decode(model, PROMPTS, pol, _generators(gen_kind, 5, len(PROMPTS)),
                       stop=StopRule(frozenset(stop_ids)))
        _assert_same_as_full(early, tokens, commit_t, pol, stop_ids,
                             (policy, model.adapter.name, gen_kind))


@pytest.mark.parametrize("policy,temperature,extra", POLICIES)
def test_batch_that_keeps_its_shape_stops_when_every_row_is_final(llada_tiny, dream_tiny, policy,
                                                                  temperature, extra):
    """``drop_rows=False`` (the default off the CPU): no forward of fewer rows, the same cut
    outputs, and every row runs until the last row is final."""
    for model in (llada_tiny, dream_tiny):
        pol = make_policy(model, {"policy": policy, "steps": 8, "gen_length": 16,
                                  "temperature": temperature, **extra})
        tokens, commit_t, stop_ids = _full_run(model, pol, _generators("one", 5, len(PROMPTS)))
        early = decode(model, PROMPTS, pol, _generators("one", 5, len(PROMPTS)),
                       stop=StopRule(frozenset(stop_ids), drop_rows=False))
        last = max(_expected_steps(tokens, commit_t, pol.steps, stop_ids))
        assert early.steps == [last] * len(PROMPTS), (policy, model.adapter.name)
        for r in range(tokens.shape[0]):
            want = _cut(tokens[r].tolist(), stop_ids)
            assert early.tokens[r].tolist()[:len(want)] == want, (policy, model.adapter.name, r)


def test_rows_leave_the_batch_only_on_the_cpu_by_default(monkeypatch):
    """Where the StopRule does not say, rows leave the batch on the CPU only."""
    import importlib
    gen = importlib.import_module("fair_calib.decoding.generate")
    seen = []
    real = gen._ActiveRows.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        seen.append(self.drop_rows)
    monkeypatch.setattr(gen._ActiveRows, "__init__", spy)
    model = tiny_llama()
    pol = make_policy(model, {"policy": "low_confidence", "steps": 4, "gen_length": 8})
    decode(model, PROMPTS, pol, stop=StopRule(frozenset({1})))
    decode(model, PROMPTS, pol, stop=StopRule(frozenset({1}), drop_rows=False))
    assert seen == [True, False]
    # Dream's count is a mean over every row's masked positions: several rows keep the batch's
    # shape, on the CPU too; one row alone leaves (and so ends) it
    seen.clear()
    dream = tiny_llama("tiny-dream")
    for policy in ("entropy", "topk_margin", "maskgit_plus", "origin"):
        pol = make_policy(dream, {"policy": policy, "steps": 4, "gen_length": 8})
        decode(dream, PROMPTS, pol, stop=StopRule(frozenset({1})))
        decode(dream, PROMPTS[:1], pol, stop=StopRule(frozenset({1})))
    assert seen == [False, True] * 3 + [True, True]


def test_rows_finishing_early_leave_masks_after_their_stop(llada_tiny):
    pol = make_policy(llada_tiny, {"policy": "low_confidence", "steps": 8, "gen_length": 16,
                                   "block_length": 4})
    tokens, _, stop_ids = _full_run(llada_tiny, pol, None)
    early = decode(llada_tiny, PROMPTS, pol, stop=StopRule(frozenset(stop_ids)))
    for r in range(len(PROMPTS)):
        row, n = early.tokens[r].tolist(), len(_cut(tokens[r].tolist(), stop_ids))
        assert MASK_ID not in row[:n]
        if n <= 12:      # final before its last block was decoded
            assert row[-1] == MASK_ID


def test_early_exit_with_guidance_and_padding():
    """Classifier-free guidance (two forwards per step), left-padded rows dropped."""
    model = tiny_llama("tiny-llada", seed=3)
    pol = make_policy(model, {"policy": "low_confidence", "steps": 8, "gen_length": 16,
                              "block_length": 8, "cfg_scale": 0.5})
    tokens, commit_t, stop_ids = _full_run(model, pol, None)
    early = decode(model, PROMPTS, pol, stop=StopRule(frozenset(stop_ids)))
    _assert_same_as_full(early, tokens, commit_t, pol, stop_ids, "cfg")


@pytest.mark.parametrize("family,policy,extra", [
    ("llada", "low_confidence", {"block_length": 4}),
    ("dream", "entropy", {}),
    ("dream", "maskgit_plus", {"temperature": 0.5, "top_p": 0.9}),
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_early_exit_on_the_hub_layouts(family, policy, extra, dtype, tmp_path):
    """The released layouts, read through the hub loader (tests/fixtures/hub_checkpoints.py)."""
    from fair_calib.models.adapters import load_model

    from fixtures.hub_checkpoints import dream_checkpoint, llada_checkpoint

    (llada_checkpoint if family == "llada" else dream_checkpoint)(tmp_path / "m")
    model = load_model(tmp_path / "m", family, dtype=dtype)
    pol = make_policy(model, {"policy": policy, "steps": 8, "gen_length": 16, **extra})
    tokens, commit_t, stop_ids = _full_run(model, pol, _generators("per_row", 2, len(PROMPTS)))
    early = decode(model, PROMPTS, pol, _generators("per_row", 2, len(PROMPTS)),
                   stop=StopRule(frozenset(stop_ids)))
    _assert_same_as_full(early, tokens, commit_t, pol, stop_ids, (family, policy, dtype))


@pytest.mark.parametrize("policy,extra", [("low_confidence", {"block_length": 4}),
                                          ("entropy", {}), ("origin", {"temperature": 0.5})])
def test_lagged_check_as_on_a_gpu(llada_tiny, dream_tiny, policy, extra, monkeypatch):
    """The check a CUDA device runs: the window read one step late, after the next forward is
    queued; the same tokens, each finished row one forward later (never past the schedule)."""
    import importlib

    gen_module = importlib.import_module("fair_calib.decoding.generate")  # the package's
    # ``generate`` attribute is the function

    def lagged_tracker(*args):
        tracker = ExitTracker(*args)
        tracker.lagged = True
        return tracker

    for model in (llada_tiny, dream_tiny):
        pol = make_policy(model, {"policy": policy, "steps": 8, "gen_length": 16, **extra})
        tokens, commit_t, stop_ids = _full_run(model, pol, _generators("per_row", 7, len(PROMPTS)))
        with monkeypatch.context() as m:
            m.setattr(gen_module, "ExitTracker", lagged_tracker)
            early = decode(model, PROMPTS, pol, _generators("per_row", 7, len(PROMPTS)),
                           stop=StopRule(frozenset(stop_ids)))
        for r in range(len(PROMPTS)):
            want = _cut(tokens[r].tolist(), stop_ids)
            assert early.tokens[r].tolist()[:len(want)] == want, (policy, r)
        want = [min(s + 1, pol.steps) for s in _expected_steps(tokens, commit_t, pol.steps,
                                                                stop_ids)]
        if policy in COUNTED_SCHEDULE_POLICIES:          # the batch keeps its shape
            want = [max(want)] * len(want)
        assert early.steps == want


@pytest.mark.parametrize("family,policy,extra,mask_bias", [
    ("tiny-llada", "low_confidence", {"block_length": 4}, 1.3),
    ("tiny-dream", "entropy", {}, 1.0),
    ("tiny-dream", "maskgit_plus", {"temperature": 0.8}, 2.0),
])
def test_early_exit_with_a_model_that_predicts_the_mask(family, policy, extra, mask_bias):
    """Mask tokens committed, as the authors' decoders commit an argmax that is the mask: such a
    position is still open, so a row is final only once every position before its stop holds
    a token; the cut outputs equal the full run's, masks left in them included."""
    model = tiny_llama(family, mask_bias=mask_bias)     # the mask some positions' argmax
    pol = make_policy(model, {"policy": policy, "steps": 8, "gen_length": 16, **extra})
    full = decode(model, PROMPTS, pol, _generators("per_row", 3, len(PROMPTS)))
    assert bool((full.tokens == MASK_ID).any())          # masks left in the output
    for stop in sorted(set(full.tokens.reshape(-1).tolist()) - {MASK_ID})[:5]:
        early = decode(model, PROMPTS, pol, _generators("per_row", 3, len(PROMPTS)),
                       stop=StopRule(frozenset({stop})))
        for r in range(len(PROMPTS)):
            want = _cut(full.tokens[r].tolist(), {stop})
            assert early.tokens[r].tolist()[:len(want)] == want, (family, policy, stop, r)


def test_recording_turns_early_exit_off(llada_tiny):
    """Diagnostics need every step: with a recorder, every row runs the whole schedule."""
    pol = make_policy(llada_tiny, {"policy": "low_confidence", "steps": 8, "gen_length": 16})
    tokens, _, stop_ids = _full_run(llada_tiny, pol, None)
    rec = CommitRecorder()
    recorded = decode(llada_tiny, PROMPTS, pol, recorder=rec, stop=StopRule(frozenset(stop_ids)))
    assert recorded.steps == [8] * len(PROMPTS)
    assert torch.equal(recorded.tokens, tokens)
    assert int(rec.commit_steps.min()) >= 1      # every position committed at some step


# ---------------------------------------------------------------- stop strings


def _bytes_decode(vocab: dict[int, bytes]):
    """A byte-level decoder (as GPT-2/Qwen/LLaDA's): concatenated bytes, invalid UTF-8 replaced."""
    return lambda ids: b"".join(vocab[i] for i in ids).decode("utf-8", errors="replace")


def _cleanup_decode(vocab: dict[int, str]):
    """Words joined by spaces, then the clean-up that glues punctuation to the word before."""
    return lambda ids: " ".join(vocab[i] for i in ids if vocab[i]).replace(" .", ".").replace(" ?", "?")


def test_stable_text_excludes_what_a_later_token_can_change():
    e_acute = "é".encode()                     # two bytes, split over two tokens
    byte_vocab = {0: b"ab", 1: e_acute[:1], 2: e_acute[1:], 3: b"\n\n"}
    dec = _bytes_decode(byte_vocab)
    assert stable_text([0, 1], dec) == "ab"        # the half character may still change
    assert stable_text([0, 1, 2], dec) == "ab"     # whole now, but it is the last token's text
    assert stable_text([0, 1, 2, 3], dec) == "abé"
    words = {0: "Answer", 1: "7", 2: ".", 3: "Question", 4: ""}
    dec = _cleanup_decode(words)
    # "Answer 7" -> "Answer 7." : the text the last token added (with the space before it,
    # which a later "." would remove) is not stable
    assert stable_text([0, 1], dec) == "Answer"
    assert stable_text([0, 1, 2], dec) == "Answer 7"
    # a last token that adds no text leaves the text's last character open
    assert stable_text([0, 1, 4], dec) == "Answer "
    for prefix in ([0, 1], [0, 1, 2], [0, 1, 2, 3], [0, 1, 4]):
        s = stable_text(prefix, dec)
        for more in ([2], [3], [2, 3], [4, 2]):
            assert dec(prefix + more).startswith(s), (prefix, more)


def test_stop_string_final_needs_the_earliest_stop_settled():
    assert stop_string_final("7. Question", ["Question"])
    assert not stop_string_final("7. Quest", ["Question"])
    assert stop_string_final("a\n\nb", ["\n\n", "Question"])
    # "xy" is complete, but "axyz" starting earlier could still be completed
    assert not stop_string_final("axy", ["xy", "axyz"])
    assert stop_string_final("axyb", ["xy", "axyz"])
    assert not stop_string_final("anything", [])


def test_tracker_stops_on_a_settled_stop_string():
    words = {0: "Answer", 1: "7", 2: ".", 3: "Question", 4: ":", 5: "what"}
    dec = _cleanup_decode(words)
    rule = StopRule(frozenset({9}), [["Question"], ["Question"], []], dec)
    tracker = ExitTracker(rule, MASK_ID, "cpu")
    window = torch.tensor([[0, 1, 2, 3, 4, MASK_ID],     # "Answer 7. Question :": final
                           [0, 1, 2, 3, MASK_ID, 5],     # "Question" is the last token: open
                           [0, 9, MASK_ID, 1, 1, 1]])    # stop token after a committed prefix
    tracker.observe(window, [0, 1, 2])
    assert tracker.finished() == [0, 2]
