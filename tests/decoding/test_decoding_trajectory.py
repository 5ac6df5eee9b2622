"""Trajectory recording and teacher forcing on recorded trajectories."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fair_calib.jobs import io
from fair_calib.decoding import (TRAJECTORY_SCHEMA, TrajectoryRecorder, generate, make_policy,
                                 record_trajectory, teacher_force)

from decoding_helpers import tiny_llama


@pytest.mark.parametrize("family,policy,extra", [
    ("tiny-llada", "low_confidence", {"block_length": 4}),
    ("tiny-llada", "low_confidence", {"block_length": 8, "cfg_scale": 1.0}),
    ("tiny-dream", "entropy", {}),
])
def test_record_and_replay(tmp_path, llada_tiny, dream_tiny, prompts, family, policy, extra):
    model = llada_tiny if family == "tiny-llada" else dream_tiny
    pol = make_policy(model, {"policy": policy, "steps": 4, "gen_length": 8, **extra})
    tokens, commit_steps, df = record_trajectory(model, prompts, pol, sample_ids=[10, 11, 12])
    assert torch.equal(tokens, generate(model, prompts, pol))
    io.write_parquet(df, tmp_path / "traj.parquet", TRAJECTORY_SCHEMA, provenance={"x": 1})
    back, prov = io.read_parquet(tmp_path / "traj.parquet")
    assert list(back.columns) == [f.name for f in TRAJECTORY_SCHEMA] and prov == {"x": 1}
    assert len(df) == 3 * 4 * 8
    assert sorted(df.step.unique().tolist()) == [1, 2, 3, 4]
    com = df[df.committed]
    # every (sample, position) is committed exactly once, at its recorded step, with its token
    assert len(com) == 3 * 8 and not com.duplicated(["sample_id", "position"]).any()
    row = com.sample_id.to_numpy() - 10
    assert np.array_equal(com.token.to_numpy(), tokens.numpy()[row, com.position.to_numpy()])
    assert np.array_equal(com.step.to_numpy(), commit_steps.numpy()[row, com.position.to_numpy()])
    assert (df[~df.committed].token == -1).all()
    # greedy policies commit the argmax: the replayed states reproduce the teacher's decisions
    assert (com.top1 == com.token).all()
    assert np.allclose(df.p_commit, df.p_ref)
    assert ((df.margin >= 0) & (df.margin <= 1)).all() and (df.entropy >= -1e-12).all()
    assert df.p_commit.notna().all()
    # p_alt: the best other token; where the reference (final) token is the argmax, the second
    final = tokens.numpy()[df.sample_id.to_numpy() - 10, df.position.to_numpy()]
    top = df.top1.to_numpy() == final
    assert top.any() and np.allclose(df.p_alt[top], (df.p_ref - df.margin)[top], atol=1e-12)
    assert (df.p_alt[~top] >= df.p_ref[~top]).all()


def test_live_recorder_matches_replay(llada_tiny, prompts):
    pol = make_policy(llada_tiny, {"steps": 8, "gen_length": 8, "block_length": 4})
    ref = torch.randint(0, 30, (3, 8), generator=torch.Generator().manual_seed(0))
    live = TrajectoryRecorder(reference=ref)
    tokens = generate(llada_tiny, prompts, pol, recorder=live)
    a = live.frame()
    b = teacher_force(llada_tiny, prompts, tokens, live.commit_steps, reference=ref, batch_size=2)
    assert a[["sample_id", "step", "position", "committed", "token", "top1"]].equals(
        b[["sample_id", "step", "position", "committed", "token", "top1"]])
    for col in ("p_ref", "margin", "entropy", "p_alt"):
        assert np.allclose(a[col], b[col], atol=1e-6)
    cs = live.commit_steps.numpy()[a.sample_id.to_numpy(), a.position.to_numpy()]
    known = a.step.to_numpy() <= cs        # at and after the commit the live p_commit is exact
    assert np.allclose(a.p_commit[known], b.p_commit[known], atol=1e-6)
    assert a.p_commit[~known].isna().all()


def test_teacher_force_other_model(llada_tiny, prompts):
    pol = make_policy(llada_tiny, {"steps": 8, "gen_length": 8, "block_length": 8})
    tokens, cs, teacher = record_trajectory(llada_tiny, prompts, pol)
    student = tiny_llama("tiny-llada", seed=7)
    st = teacher_force(student, prompts, tokens, cs)
    assert st[["committed", "token"]].equals(teacher[["committed", "token"]])
    assert not np.array_equal(st.top1.to_numpy(), teacher.top1.to_numpy())
    assert not np.allclose(st.p_ref, teacher.p_ref)
    with pytest.raises(ValueError, match="commit steps must lie in 1..3"):
        teacher_force(student, prompts, tokens, cs, steps=3)
