"""Diagnostics on hand-made trajectories with hand-computed values."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fair_calib import diagnostics as D

T = 4  # steps 4..1, window of 2 positions


def frame(rows):
    """rows: (sample, step, pos, committed, token, top1, p_commit, p_ref, margin)"""
    df = pd.DataFrame(rows, columns=["sample_id", "step", "position", "committed", "token",
                                     "top1", "p_commit", "p_ref", "margin"])
    df["entropy"] = 0.5
    df["p_alt"] = np.nan
    return df


# Teacher, sample 0: pos0 commits token 7 at step 4, pos1 commits 9 at step 2.
# Teacher, sample 1: pos0 commits 5 at step 3, pos1 commits 6 at step 1.
TEACHER = frame([
    # s  t  i  c      tok top1 p_commit p_ref margin
    (0, 4, 0, True, 7, 7, 0.6, 0.6, 0.3),
    (0, 4, 1, False, -1, 3, 0.2, 0.2, 0.1),
    (0, 3, 0, False, -1, 7, 0.9, 0.9, 0.5),
    (0, 3, 1, False, -1, 9, 0.4, 0.4, 0.1),
    (0, 2, 0, False, -1, 7, 0.9, 0.9, 0.5),
    (0, 2, 1, True, 9, 9, 0.7, 0.7, 0.4),
    (0, 1, 0, False, -1, 7, 1.0, 1.0, 0.9),
    (0, 1, 1, False, -1, 9, 0.8, 0.8, 0.6),
    (1, 4, 0, False, -1, 5, 0.5, 0.5, 0.2),
    (1, 4, 1, False, -1, 6, 0.3, 0.3, 0.1),
    (1, 3, 0, True, 5, 5, 0.6, 0.6, 0.2),
    (1, 3, 1, False, -1, 6, 0.3, 0.3, 0.1),
    (1, 2, 0, False, -1, 5, 0.7, 0.7, 0.4),
    (1, 2, 1, False, -1, 6, 0.5, 0.5, 0.2),
    (1, 1, 0, False, -1, 5, 0.8, 0.8, 0.6),
    (1, 1, 1, True, 6, 6, 0.6, 0.6, 0.3),
])

# Student (free-running), sample 0: pos0 commits 7 at step 4 but top1 oscillates:
#   top1 at steps 4,3,2,1 = 7, 2, 7, 7  -> lag 2 (last disagreement at step 3, j=1 -> k=2)
#   post-commit steps 3,2,1: disagree 1/3, not never.
# pos1 commits 8 (false: teacher has 9) at step 3; top1 at 3,2,1 = 8, 9, 9
#   -> lag: disagree at steps 2 and 1 -> never stable, lag = t_c = 3; post-commit 2/2 disagree,
#      never_agree.
# Student sample 1: pos0 commits 5 at step 4, top1 5,5,5,5 -> lag 0, disagree 0.
# pos1 commits 6 at step 1 -> lag 0 (top1 6 at step 1), no post-commit steps (excluded).
STUDENT = frame([
    (0, 4, 0, True, 7, 7, 0.5, 0.5, 0.1),
    (0, 4, 1, False, -1, 3, 0.1, 0.1, 0.1),
    (0, 3, 0, False, -1, 2, 0.4, 0.4, 0.1),
    (0, 3, 1, True, 8, 8, 0.6, 0.2, 0.2),
    (0, 2, 0, False, -1, 7, 0.7, 0.7, 0.3),
    (0, 2, 1, False, -1, 9, 0.3, 0.5, 0.1),
    (0, 1, 0, False, -1, 7, 0.8, 0.8, 0.5),
    (0, 1, 1, False, -1, 9, 0.2, 0.6, 0.3),
    (1, 4, 0, True, 5, 5, 0.5, 0.5, 0.2),
    (1, 4, 1, False, -1, 6, 0.3, 0.3, 0.1),
    (1, 3, 0, False, -1, 5, 0.6, 0.6, 0.2),
    (1, 3, 1, False, -1, 6, 0.3, 0.3, 0.1),
    (1, 2, 0, False, -1, 5, 0.7, 0.7, 0.4),
    (1, 2, 1, False, -1, 6, 0.5, 0.5, 0.2),
    (1, 1, 0, False, -1, 5, 0.8, 0.8, 0.6),
    (1, 1, 1, True, 6, 6, 0.6, 0.6, 0.3),
])

# Teacher-forced student frame on the teacher's states: only rows at teacher commits matter.
# p_alt = the best probability of a token other than the teacher's.
# Sample 0: at (4,0) top1 7 (ok, p_alt 0.3), at (2,1) top1 4 (flip, p_alt 0.5)
# Sample 1: at (3,0) top1 1 (flip, p_alt 0.3), at (1,1) top1 1 with 0.45 while the teacher's
#   token 6 (0.2) is only third (margin p1 - p2 = 0.05: p2 is another token's 0.4)
FORCED = frame([
    (0, 4, 0, True, 7, 7, 0.6, 0.6, 0.3),
    (0, 4, 1, False, -1, 3, 0.2, 0.2, 0.1),
    (0, 2, 1, True, 9, 4, 0.3, 0.3, 0.2),
    (1, 3, 0, True, 5, 1, 0.2, 0.2, 0.1),
    (1, 1, 1, True, 6, 1, 0.2, 0.2, 0.05),
]).assign(p_alt=[0.3, 0.8, 0.5, 0.3, 0.45])


def test_stability_lag_values():
    lag = D.stability_lag(STUDENT).set_index(["sample_id", "position"])
    assert lag.loc[(0, 0), "lag"] == 2 and lag.loc[(0, 0), "stable"]
    assert lag.loc[(0, 1), "lag"] == 3 and not lag.loc[(0, 1), "stable"]
    assert lag.loc[(1, 0), "lag"] == 0 and lag.loc[(1, 1), "lag"] == 0
    assert lag.loc[(1, 1), "stable"]
    # teacher: every top1 equals its final token -> all lags 0
    assert (D.stability_lag(TEACHER)["lag"] == 0).all()


def test_ccdf():
    xs, cc = D.ccdf([2, 3, 0, 0])
    assert xs.tolist() == [0, 1, 2, 3]
    assert cc.tolist() == [0.5, 0.5, 0.25, 0.0]


def test_mse_prob_trace_and_first_false_commit():
    tr = D.mse_prob_trace(STUDENT, TEACHER).set_index(["sample_id", "step"])["mse_prob"]
    # sample 0, step 3: pos0 (0.4-0.9)^2=0.25, pos1 (0.2-0.4)^2=0.04 -> 0.145
    assert tr.loc[(0, 3)] == pytest.approx(0.145)
    # sample 0, step 1: (0.8-1.0)^2=0.04, (0.6-0.8)^2=0.04 -> 0.04
    assert tr.loc[(0, 1)] == pytest.approx(0.04)
    # sample 1, step 4: (0.5-0.5)^2=0 and (0.3-0.3)^2=0
    assert tr.loc[(1, 4)] == pytest.approx(0.0)
    ffc = D.first_false_commit(STUDENT, TEACHER)
    assert ffc.loc[0] == 3 and math.isnan(ffc.loc[1])


def test_commit_step_flips():
    flips = D.commit_step_flips(FORCED, TEACHER)
    assert flips.to_dict() == {0: 1, 1: 2}
    with pytest.raises(ValueError, match="misses"):
        D.commit_step_flips(FORCED.iloc[:-1], TEACHER)


def test_post_commit_mismatch():
    pcm = D.post_commit_mismatch(STUDENT).set_index("sample_id")
    # sample 0: pos0 1/3, pos1 2/2 -> mean (1/3+1)/2; never: pos1 only -> 0.5
    assert pcm.loc[0, "mean_disagree_rate"] == pytest.approx((1 / 3 + 1) / 2)
    assert pcm.loc[0, "never_agree_rate"] == pytest.approx(0.5)
    # sample 1: only pos0 has post-commit steps, all agree
    assert pcm.loc[1, "mean_disagree_rate"] == 0.0 and pcm.loc[1, "n_positions"] == 1


def test_frontier_margin():
    fm = D.frontier_margin(FORCED, TEACHER, kind="prob").set_index("sample_id")["frontier_margin"]
    assert fm.loc[0] == pytest.approx((0.3 - 0.2) / 2)
    assert fm.loc[1] == pytest.approx((-0.1 - 0.25) / 2)
    # logit margin: log p(x) - log p(best other token)
    fm = D.frontier_margin(FORCED, TEACHER).set_index("sample_id")["frontier_margin"]
    assert fm.loc[0] == pytest.approx((math.log(0.6 / 0.3) + math.log(0.3 / 0.5)) / 2)
    assert fm.loc[1] == pytest.approx((math.log(0.2 / 0.3) + math.log(0.2 / 0.45)) / 2)
    exact = FORCED.assign(margin_ref=[1.0, 0.0, -1.0, -2.0, -4.0])
    fm2 = D.frontier_margin(exact, TEACHER).set_index("sample_id")["frontier_margin"]
    assert fm2.loc[0] == pytest.approx(0.0) and fm2.loc[1] == pytest.approx(-3.0)
    with pytest.raises(ValueError, match="lacks columns \\['p_alt'\\]"):
        D.frontier_margin(FORCED.drop(columns="p_alt"), TEACHER)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_frontier_margin_is_exact_whatever_the_teachers_rank(seed):
    """Brute force: the paper's margin logit(x) - max_{v != x} logit(v) (and the probability
    version) from the full logits, with the teacher's token at ranks 0, 1, 2, 5 and 11."""
    import torch

    from fair_calib.decoding import step_stats

    g = torch.Generator().manual_seed(seed)
    ranks = [0, 1, 2, 5, 11]
    logits = 3 * torch.randn(1, len(ranks), 12, generator=g)
    order = logits[0].argsort(-1, descending=True)
    x = torch.stack([order[i, r] for i, r in enumerate(ranks)]).unsqueeze(0)
    st = step_stats(logits, x, alternative_to=x)
    steps = list(range(len(ranks), 0, -1))        # position i committed at step T - i
    teacher = frame([(0, t, i, True, int(x[0, i]), int(x[0, i]), 1.0, 1.0, 0.0)
                     for i, t in enumerate(steps)])
    forced = frame([(0, t, i, True, int(x[0, i]), int(st["top1"][0, i]), 0.0,
                     float(st["probs"][0][0, i]), float(st["margin"][0, i]))
                    for i, t in enumerate(steps)]).assign(p_alt=st["p_alt"][0].numpy())
    want_logit, want_prob = [], []
    for i in range(len(ranks)):
        xi = int(x[0, i])
        row = logits[0, i].double()
        p = torch.softmax(row, -1)
        want_logit.append(float(row[xi] - max(row[v] for v in range(12) if v != xi)))
        want_prob.append(float(p[xi] - max(p[v] for v in range(12) if v != xi)))
    got = D.frontier_margin(forced, teacher)["frontier_margin"].iloc[0]
    assert got == pytest.approx(np.mean(want_logit), abs=1e-9)
    got = D.frontier_margin(forced, teacher, kind="prob")["frontier_margin"].iloc[0]
    assert got == pytest.approx(np.mean(want_prob), abs=1e-12)
    # the old approximation p(x) + margin for the best alternative misses at ranks >= 2
    px = forced.p_ref.to_numpy()
    approx = np.where(forced.top1 == forced.token, px - forced.margin, px + forced.margin)
    assert not np.allclose(px - approx, want_prob, atol=1e-6)


def test_curve_correlation():
    a = [1.0, 2.0, 3.0, 4.0]
    sp, pe = D.curve_correlation(a, [1.0, 4.0, 9.0, 16.0])
    assert sp == pytest.approx(1.0) and pe < 1.0 and pe > 0.9
    sp, pe = D.curve_correlation(a, [4.0, 3.0, 2.0, 1.0])
    assert sp == pytest.approx(-1.0) and pe == pytest.approx(-1.0)
    pa_ = pd.DataFrame({"position": [0, 1, 2, 3], "w_bar": a})
    pb_ = pd.DataFrame({"position": [3, 2, 1, 0], "w_bar": [4.0, 3.0, 2.0, 1.0]})
    assert D.prior_correlation(pa_, pb_)[0] == pytest.approx(1.0)


def test_double_commit_rejected():
    bad = STUDENT.copy()
    bad.loc[(bad.sample_id == 1) & (bad.step == 2) & (bad.position == 0), "committed"] = True
    with pytest.raises(ValueError, match="more than once"):
        D.stability_lag(bad)


def test_diagnose_cli(tmp_path):
    from fair_calib.jobs.io import read_parquet, write_parquet

    t = TEACHER.assign(mode="free")
    s = pd.concat([STUDENT.assign(mode="free"), FORCED.assign(mode="forced")])
    tp = tmp_path / "traj" / "m" / "fp" / "fp.parquet"
    sp = tmp_path / "traj" / "m" / "rtn" / "w4a4.parquet"
    write_parquet(t, tp, D.TRAJECTORY_SCHEMA)
    write_parquet(s, sp, D.TRAJECTORY_SCHEMA)
    out = tmp_path / "diag.parquet"
    D.run_cli(["diagnose", "--inputs", str(sp), "--teacher", str(tp), "--out", str(out)])
    df, prov = read_parquet(out)
    assert set(df.columns) == {"model", "method", "bits", "metric", "x", "value", "std", "n"}
    r = df[(df.method == "rtn") & (df.bits == "w4a4")].set_index("metric")
    flips = r.loc["commit_flips"]
    assert flips["value"] == pytest.approx(1.5) and flips["std"] == pytest.approx(np.std([1, 2], ddof=1))
    assert flips["n"] == 2
    assert r.loc["stability_lag", "value"] == pytest.approx(5 / 4)
    assert r.loc["false_commit_rate", "value"] == pytest.approx(0.5)
    ccdf = df[(df.method == "rtn") & (df.metric == "stability_lag_ccdf")].sort_values("x")
    assert ccdf["value"].tolist() == [0.5, 0.5, 0.25, 0.0]
    f = df[df.method == "fp"].set_index("metric")
    assert f.loc["mse_prob_mean", "value"] == 0.0
    assert "commit_flips" not in f.index  # teacher file has no forced rows
    assert prov["teacher"] == str(tp)


# ----------------------------------------------------------------------------- recording
class _Tok:
    """Character-level stand-in tokenizer (ids 0..29)."""

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [ord(c) % 30 for c in text[:6]]}


def _tiny(seed):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fair_calib.models.adapters import LoadedModel, get_adapter

    cfg = LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                      is_causal=False, use_cache=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return LoadedModel(model=model, tokenizer=_Tok(), adapter=get_adapter("tiny-llada"),
                       mask_id=39, pad_id=38, eos_id=37)


def test_trajectories_cli_and_diagnose(tmp_path, monkeypatch):
    """Record the teacher, the teacher against itself, and a different student; the teacher
    against itself has no flips, no false commit and zero mse_prob."""
    from fair_calib import data
    from fair_calib.jobs.io import read_parquet
    from fair_calib.models import adapters

    models = {"teacher": _tiny(0), "student": _tiny(1)}
    monkeypatch.setattr(adapters, "load_model", lambda src, fam, dtype, dev, **kw: models[Path(src).name])
    monkeypatch.setattr(data, "probe_prompts",
                        lambda ds, dd, sd, n, instr, source="local": [f"q{i} abc{i}" for i in range(n)])
    settings = json.dumps({"seed": 0, "device": "cpu", "dtype": "float32", "n_samples": 3,
                           "model": {"family": "tiny-llada",
                                     "decoding": {"steps": 4, "gen_length": 8, "block_length": 4}},
                           "probe": {"dataset": "synthetic"}})
    tp = tmp_path / "traj" / "m" / "fp" / "fp.parquet"
    D.run_cli(["trajectories", "--settings", settings, "--model-dir", str(tmp_path / "teacher"),
               "--out", str(tp)])
    self_p = tmp_path / "traj" / "m" / "self" / "w4a4.parquet"
    st_p = tmp_path / "traj" / "m" / "student" / "w4a4.parquet"
    for name, out in (("teacher", self_p), ("student", st_p)):
        D.run_cli(["trajectories", "--settings", settings, "--model-dir", str(tmp_path / name),
                   "--teacher", str(tp), "--out", str(out)])
    t, _ = read_parquet(tp)
    assert set(t["mode"]) == {"free"} and len(t) == 3 * 4 * 8
    s, _ = read_parquet(st_p)
    assert (s["mode"] == "forced").sum() == 3 * 4 * 8 and (s["mode"] == "free").sum() == 3 * 4 * 8
    out = tmp_path / "diag.parquet"
    D.run_cli(["diagnose", "--inputs", str(self_p), str(st_p), "--teacher", str(tp),
               "--out", str(out)])
    df, _ = read_parquet(out)
    me = df[df.method == "self"].set_index("metric")
    assert me.loc["commit_flips", "value"] == 0 and me.loc["false_commit_rate", "value"] == 0
    assert me.loc["mse_prob_mean", "value"] == pytest.approx(0.0, abs=1e-12)
    assert me.loc["frontier_margin", "value"] > 0   # the teacher's own argmax: positive margin
    st = df[df.method == "student"].set_index("metric")
    assert st.loc["commit_flips", "value"] > 0 and st.loc["mse_prob_mean", "value"] > 0
    assert set(df.method) == {"fp", "self", "student"}


def test_schema_is_decoding_schema_plus_mode():
    from fair_calib.decoding import TRAJECTORY_SCHEMA as DEC

    assert D.TRAJECTORY_SCHEMA.remove(D.TRAJECTORY_SCHEMA.get_field_index("mode")).equals(DEC)
    assert tuple(DEC.names) == D.TRAJ_COLUMNS


def _random_traj(seed, n=4, T=6, K=5, vocab=3):
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(n):
        cs = rng.integers(1, T + 1, size=K)
        tok = rng.integers(0, vocab, size=K)
        for t in range(T, 0, -1):
            for i in range(K):
                c = cs[i] == t
                rows.append((s, t, i, bool(c), int(tok[i]) if c else -1, int(rng.integers(0, vocab)),
                             0.5, 0.5, 0.1))
    return frame(rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lag_and_mismatch_match_brute_force(seed):
    df = _random_traj(seed)
    lag = D.stability_lag(df).set_index(["sample_id", "position"])
    pcm = D.post_commit_mismatch(df).set_index("sample_id")
    per_sample = {}
    for (s, i), g in df.groupby(["sample_id", "position"]):
        g = g.sort_values("step", ascending=False)
        tc = int(g.loc[g.committed, "step"].iloc[0])
        x = int(g.loc[g.committed, "token"].iloc[0])
        seq = g.loc[g.step <= tc, "top1"].tolist()       # j = 0..tc-1
        k = next(k for k in range(len(seq) + 1) if all(v == x for v in seq[k:]))
        expect = k if (not seq or seq[-1] == x) else tc  # censored: R + 1 = tc
        assert lag.loc[(s, i), "lag"] == expect
        assert lag.loc[(s, i), "stable"] == (seq[-1] == x)
        post = seq[1:]
        if post:
            dis = [v != x for v in post]
            per_sample.setdefault(s, []).append((np.mean(dis), all(dis)))
    for s, vals in per_sample.items():
        assert pcm.loc[s, "mean_disagree_rate"] == pytest.approx(np.mean([v[0] for v in vals]))
        assert pcm.loc[s, "never_agree_rate"] == pytest.approx(np.mean([v[1] for v in vals]))
