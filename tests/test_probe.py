"""Stage I probe: random-commit rollouts, reliability sums, sharding and determinism."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fair_calib.jobs import io
from fair_calib.probe import (PROBE_SCHEMA, minmax_over_masked, probe, run_cli, sample_seed,
                              shard_batches)

torch.set_num_threads(1)

WORDS = ["what", "is", "two", "plus", "three", "the", "answer", "a", "b", "c", "d", "e", "f",
         "g", "h", "one", "four", "five", "six", "seven"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("tiny-model")
    vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "[EOS]", "[MASK]"] + WORDS)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]",
                                  eos_token="[EOS]", mask_token="[MASK]")
    tok.save_pretrained(d)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=64, is_causal=False, use_cache=False,
                      pad_token_id=1, eos_token_id=2, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    model.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    qs = ["what is two plus three", "a b c", "what is the answer", "one four", "five six seven a",
          "d e f g h", "two", "three plus one is"]
    (d / "probe.jsonl").write_text("".join(json.dumps({"question": q}) + "\n" for q in qs))
    return d


def settings(synthetic_dir, **probe_kw):
    p = {"dataset": "synthetic", "n_samples": 7, "steps": 6, "gen_length": 10, "instruction": "answer",
         "batch_size": 2, "temperature": 0}
    p.update(probe_kw)
    return {"seed": 3, "device": "cpu", "dtype": "float32", "data_dir": "", "synthetic_dir": str(synthetic_dir),
            "model": {"name": "tiny", "family": "tiny-llada", "source": "train"}, "probe": p}


def test_minmax_over_masked():
    s = torch.tensor([[1.0, 3.0, 2.0, 9.0], [5.0, 5.0, 0.0, 1.0]], dtype=torch.float64)
    m = torch.tensor([[True, True, True, False], [True, True, False, False]])
    out = minmax_over_masked(s, m)
    assert torch.allclose(out, torch.tensor([[0.0, 1.0, 0.5, 0.0], [0.5, 0.5, 0.0, 0.0]], dtype=torch.float64))


def test_shard_batches_partition():
    all_ids = sorted(i for k in range(3) for b in shard_batches(10, 3, k, 3) for i in b)
    assert all_ids == list(range(10))
    assert shard_batches(10, 3, 1, 3) == [[3, 4, 5]]
    assert shard_batches(10, 3, 0, 3) == [[0, 1, 2], [9]]
    assert sample_seed(3, 1) != sample_seed(3, 2) and sample_seed(3, 1) == sample_seed(3, 1)
    with pytest.raises(ValueError, match="shard 3"):
        shard_batches(10, 3, 3, 3)


def test_probe_shards_equal_one_run_and_deterministic(tmp_path, model_dir, synthetic_dir):
    s = settings(synthetic_dir)
    one = tmp_path / "one.parquet"
    probe(s, model_dir, 0, 1, one)
    again = tmp_path / "again.parquet"
    run_cli(["--settings", json.dumps(s), "--model-dir", str(model_dir), "--shard", "0",
             "--num-shards", "1", "--out", str(again)])
    assert one.read_bytes() == again.read_bytes()            # data and provenance, bit for bit
    df, prov = io.read_parquet(one)
    assert list(df.columns) == [f.name for f in PROBE_SCHEMA]
    assert prov["config"] == s and prov["config_hash"] == io.config_hash(s)
    parts = []
    for k in range(3):
        path = tmp_path / f"shard-{k}.parquet"
        probe(s, model_dir, k, 3, path)
        parts.append(io.read_parquet(path)[0])
    gathered = pd.concat(parts).sort_values(["sample_id", "position"]).reset_index(drop=True)
    assert gathered.equals(df.sort_values(["sample_id", "position"]).reset_index(drop=True))
    # every window position committed exactly once; counts per step follow the block rule
    assert len(df) == 7 * 10 and sorted(df.sample_id.unique()) == list(range(7))
    counts = df.groupby(["sample_id", "commit_step"]).size().unstack(fill_value=0)
    assert (counts[sorted(counts.columns, reverse=True)].to_numpy() == [2, 2, 2, 2, 1, 1]).all()
    # a position masked at m steps has each rel in [0, m]; commit orders differ across samples
    m = 6 - df.commit_step + 1
    for col in ("rel_prob", "rel_negentropy", "rel_margin"):
        assert ((df[col] >= 0) & (df[col] <= m + 1e-9)).all()
    orders = df.pivot(index="sample_id", columns="position", values="commit_step")
    assert len({tuple(r) for r in orders.to_numpy()}) > 1
    # another seed changes the commit order
    other = tmp_path / "other.parquet"
    probe({**s, "seed": 4}, model_dir, 0, 1, other)
    assert not io.read_parquet(other)[0].commit_step.equals(df.commit_step)


def test_fixed_trajectory_and_policy_override(tmp_path, model_dir, synthetic_dir):
    path = tmp_path / "fixed.parquet"
    df = probe(settings(synthetic_dir, trajectory="fixed"), model_dir, 0, 1, path)
    orders = df.pivot(index="sample_id", columns="position", values="commit_step").to_numpy()
    assert (orders == orders[0]).all()                        # one commit order for all samples
    df = probe(settings(synthetic_dir, policy="entropy", n_samples=3), model_dir, 0, 1,
               tmp_path / "entropy.parquet")
    assert len(df) == 3 * 10 and df.groupby("sample_id").size().eq(10).all()
    with pytest.raises(ValueError, match="unknown decoding policy 'nope'"):
        probe(settings(synthetic_dir, policy="nope"), model_dir, 0, 1, tmp_path / "x.parquet")
    with pytest.raises(ValueError, match="probe.trajectory"):
        probe(settings(synthetic_dir, trajectory="odd"), model_dir, 0, 1, tmp_path / "y.parquet")


def test_reliability_sums_match_replayed_trajectory(tmp_path, model_dir, synthetic_dir):
    """Recompute rel_margin / rel_negentropy from a recorded trajectory of the same rollout."""
    from fair_calib.decoding import TrajectoryRecorder, generate
    from fair_calib.models.adapters import load_model
    from fair_calib.probe import encode_prompts, probe_policy

    s = settings(synthetic_dir, n_samples=2, batch_size=2)
    df = probe(s, model_dir, 0, 1, tmp_path / "p.parquet")
    loaded = load_model(model_dir, "tiny-llada")
    texts = [json.loads(l)["question"] + " answer" for l in
             (synthetic_dir / "probe.jsonl").read_text().splitlines()[:2]]
    prompts = encode_prompts(loaded, texts, instruct=False)
    rec = TrajectoryRecorder()
    gens = [torch.Generator().manual_seed(sample_seed(3, i, s["probe"]["dataset"])) for i in range(2)]
    generate(loaded, prompts, probe_policy(loaded, s["probe"]), generator=gens, recorder=rec)
    traj = rec.frame()
    cs = rec.commit_steps.numpy()[traj.sample_id.to_numpy(), traj.position.to_numpy()]
    assert np.array_equal(rec.commit_steps.numpy().reshape(-1), df.commit_step.to_numpy())
    traj = traj[traj.step.to_numpy() >= cs].copy()             # masked at that step
    traj["negent"] = -traj.entropy
    for score, col in (("margin", "rel_margin"), ("negent", "rel_negentropy")):
        g = traj.groupby(["sample_id", "step"])[score]
        lo, hi = g.transform("min"), g.transform("max")
        span = hi - lo
        traj["c"] = np.where(span > 1e-12, (traj[score] - lo) / span.where(span > 1e-12, 1.0), 0.5)
        expect = traj.groupby(["sample_id", "position"])["c"].sum().to_numpy()
        # The probe's vocabulary-wide passes run in float32 with float64 accumulation (speed),
        # the trajectory recorder's in float64: they agree to ~3e-10 per score. This untrained
        # model is near-uniform, so a step's entropies differ by only ~1e-6 and min-max
        # normalisation magnifies that rounding to ~1e-4. Counting a wrong step or position
        # would show as an error of order 0.1-1.
        assert np.allclose(df[col].to_numpy(), expect, rtol=0, atol=1e-3), col


def test_empty_shard_writes_empty_table(tmp_path, model_dir, synthetic_dir):
    path = tmp_path / "shard-1.parquet"
    df = probe(settings(synthetic_dir, n_samples=2, batch_size=2), model_dir, 1, 2, path)
    back, prov = io.read_parquet(path)
    assert len(df) == 0 and len(back) == 0 and list(back.columns) == [f.name for f in PROBE_SCHEMA]
    assert prov["shard"] == 1 and prov["num_shards"] == 2


def test_independent_streams_differ_across_corpora():
    """Random commits ignore the prompt: only a per-corpus stream keeps two corpora's
    frontier-hit terms from coinciding by construction."""
    assert sample_seed(0, 1, "gsm8k") != sample_seed(0, 1, "wikitext2")
    assert sample_seed(0, 1, "gsm8k") == sample_seed(0, 1, "gsm8k")
