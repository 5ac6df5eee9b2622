"""The CUDA-graph replay's policy (fair_calib.models.graphs) on the CPU, with a stand-in for
the graphs: which call runs eagerly, which captures, what a replay reads and returns, the
memory bound, and where replay never applies. That replay gives eager's logits bit for bit on
a GPU is checked by benchmarks/decode_graphs_gpu.py (docs/benchmarks.md)."""
import pytest
import torch

from fair_calib.models import graphs
from fair_calib.models.graphs import GraphCache


class FakeGraphs:
    """Capture runs the function once (as a CUDA capture records it); a replay recomputes it
    from the same (captured) buffers into the captured output."""

    def __init__(self):
        self.captured = 0

    def capture(self, fn):
        self.captured += 1
        out = fn()
        return (lambda: out.copy_(fn())), out

    @staticmethod
    def replay(graph):
        graph()


def counting_forward():
    calls = []

    def forward(ids, keep_last):
        calls.append((tuple(ids.shape), keep_last))
        x = ids.float().cumsum(-1)
        return x if keep_last is None else x[:, -keep_last:]
    return forward, calls


def test_first_call_eager_second_captures_then_replays_with_new_inputs():
    forward, calls = counting_forward()
    fake = FakeGraphs()
    cache = GraphCache(forward, backend=fake)
    ids = [torch.randint(0, 9, (1, 6), generator=torch.Generator().manual_seed(i))
           for i in range(4)]
    outs = [cache(x, 3) for x in ids]
    for x, y in zip(ids, outs):
        assert torch.equal(y, forward(x, 3))
    assert fake.captured == 1
    assert (cache.stats.eager, cache.stats.captures, cache.stats.replays) == (1, 1, 3)
    # replayed logits are copies: the next replay does not change what a caller kept
    kept = outs[2].clone()
    cache(ids[0], 3)
    assert torch.equal(outs[2], kept)


def test_keys_are_shape_and_window_and_at_most_max_graphs_are_kept():
    forward, _ = counting_forward()
    fake = FakeGraphs()
    cache = GraphCache(forward, max_graphs=2, backend=fake)
    a, b, c = torch.ones(1, 4, dtype=torch.long), torch.ones(1, 5, dtype=torch.long), \
        torch.ones(2, 4, dtype=torch.long)
    for x, k in ((a, 2), (a, 2), (a, None), (a, None), (b, 2), (b, 2), (c, 2), (c, 2)):
        assert torch.equal(cache(x, k), forward(x, k))
    assert fake.captured == 4 and cache.stats.evicted == 2 and len(cache.graphs) == 2
    assert list(cache.graphs) == [((1, 5), torch.long, "cpu", 2), ((2, 4), torch.long, "cpu", 2)]
    with pytest.raises(ValueError, match="capture_at=1"):
        GraphCache(forward, capture_at=1)


def test_replay_only_on_cuda_without_mask_or_gradients(monkeypatch):
    ids = torch.ones(1, 4, dtype=torch.long)
    assert not graphs.replayable(ids, None)                       # CPU
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    with torch.no_grad():
        assert graphs.replayable(ids, None)
        assert not graphs.replayable(ids, torch.ones_like(ids))   # a padding mask
        monkeypatch.setenv("FAIR_CALIB_GRAPHS", "off")
        assert not graphs.replayable(ids, None)
        monkeypatch.setenv("FAIR_CALIB_GRAPHS", "sometimes")
        with pytest.raises(ValueError, match="FAIR_CALIB_GRAPHS='sometimes'"):
            graphs.replayable(ids, None)
    monkeypatch.delenv("FAIR_CALIB_GRAPHS")
    assert not graphs.replayable(ids, None)                       # gradients on
    from transformers import masking_utils as mu

    monkeypatch.delattr(mu, "_ignore_bidirectional_mask_sdpa")   # a transformers without it
    with torch.no_grad():
        assert not graphs.replayable(ids, None)


def test_capture_takes_the_eager_mask_decision(monkeypatch):
    """Under capture transformers (<= 5.17) answers "mask needed" for a forward without a
    padding mask; while capturing, the check answers as eager does, and defers otherwise."""
    from transformers import masking_utils as mu

    calls = []

    def capturing_check(padding_mask, kv_length, local_attention_size=None):
        calls.append(padding_mask)
        return False                       # what 5.17 answers while a stream captures
    monkeypatch.setattr(mu, "_ignore_bidirectional_mask_sdpa", capturing_check)
    pad = torch.tensor([[0, 1, 1]], dtype=torch.bool)
    with graphs._eager_mask_decisions():
        assert mu._ignore_bidirectional_mask_sdpa(None, 8) is True
        assert mu._ignore_bidirectional_mask_sdpa(None, 8, 16) is True
        assert mu._ignore_bidirectional_mask_sdpa(None, 8, 4) is False     # local window
        assert mu._ignore_bidirectional_mask_sdpa(pad, 3) is False
    assert mu._ignore_bidirectional_mask_sdpa is capturing_check
    assert len(calls) == 2


def test_loaded_model_logits_unchanged_where_replay_does_not_apply():
    from fair_calib.quant.toy import tiny_random_loaded

    lm = tiny_random_loaded("llama", layers=1)
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = lm.logits(ids, keep_last=4)
        lm.replay_graphs()
        for _ in range(3):
            assert torch.equal(lm.logits(ids, keep_last=4), ref)
    assert lm.graphs.stats.captures == 0 and lm.graphs.stats.eager == 0
    lm.replay_graphs(False)
    assert lm.graphs is None
