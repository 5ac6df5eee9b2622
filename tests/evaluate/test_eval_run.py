"""evaluate()/gather() end to end on a tiny random model with local task YAMLs (offline)."""
import json
import math

import pandas as pd
import pytest

from fair_calib.jobs import io
from fair_calib.evaluate import run
from tiny_eval_helpers import base_settings, make_loaded

MC_TASK = {"name": "synth_mc", "kind": "synthetic_mc", "mc_num": 4, "batch_size": 4, "limit": None}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_synth_mc_runs_offline_through_simple_evaluate(tmp_path, synthetic_dir, tiny_llada):
    settings = base_settings(MC_TASK, synthetic_dir)
    out = tmp_path / "eval" / "synth_mc.parquet"
    df = run.evaluate(settings, None, None, out, loaded=tiny_llada)
    back, prov = io.read_parquet(out)
    assert list(back.columns) == [f.name for f in run.EVAL_SCHEMA]
    row = back.set_index("metric").loc["acc,none"]
    assert row["n"] == 5 and row["chance"] == pytest.approx(0.25)
    assert 0.0 <= row["value"] <= 1.0 and (row["model"], row["method"], row["bits"], row["task"]) == \
        ("tiny-llada", "fp", "fp", "synth_mc")
    assert json.loads(row["settings"]) == settings and prov["config"] == settings
    raw = io.read_json(run.raw_json_path(out))
    assert raw["lm_eval"]["results"]["synth_mc"]["acc,none"] == pytest.approx(row["value"])
    per_doc = raw["per_doc"]["metrics"]["acc,none"]["synth_mc"]
    assert sorted(per_doc, key=int) == ["0", "1", "2", "3", "4"]
    # Re-running gives identical numbers (seeded MC estimates).
    df2 = run.evaluate(settings, None, None, tmp_path / "again.parquet", loaded=tiny_llada)
    pd.testing.assert_frame_equal(df, df2)


def test_mc_scores_follow_the_model(tmp_path, synthetic_dir, tiny_llada):
    """acc = 1 where the gold choice is the argmax of the model's own estimates."""
    from fair_calib.evaluate.lm import DiffusionLM
    from lm_eval.api.instance import Instance

    lm = DiffusionLM(tiny_llada, likelihood={"mc_num": 4, "batch_size": 4})
    rows = [json.loads(x) for x in (synthetic_dir / "synth_mc.jsonl").read_text().splitlines()]
    expected = []
    for r in rows:
        reqs = [Instance("loglikelihood", {}, (r["query"], c), i) for i, c in enumerate(r["choices"])]
        lls = [ll for ll, _ in lm.loglikelihood(reqs)]
        expected.append(float(max(range(len(lls)), key=lls.__getitem__) == r["gold"]))
    settings = base_settings(MC_TASK, synthetic_dir)
    df = run.evaluate(settings, None, None, tmp_path / "o.parquet", loaded=tiny_llada)
    assert df.set_index("metric").loc["acc,none", "value"] == pytest.approx(sum(expected) / len(expected))


def test_shard_and_gather_equal_one_run(tmp_path, synthetic_dir, tiny_llada):
    settings = base_settings(MC_TASK, synthetic_dir)
    one = run.evaluate(settings, None, None, tmp_path / "one.parquet", loaded=tiny_llada)
    shards = []
    for k in range(2):
        p = tmp_path / f"shard-{k}.parquet"
        part = run.evaluate(settings, None, None, p, shard=k, num_shards=2, loaded=tiny_llada)
        assert int(part["n"].iloc[0]) == (3 if k == 0 else 2)
        shards.append(p)
    gathered = run.gather(shards, tmp_path / "all.parquet")
    pd.testing.assert_frame_equal(one, gathered)
    back, _ = io.read_parquet(tmp_path / "all.parquet")
    pd.testing.assert_frame_equal(one, back)
    with pytest.raises(ValueError, match="two shards"):
        run.gather([shards[0], shards[0]], tmp_path / "dup.parquet")


def test_stderr_is_recomputed_not_averaged():
    per_doc = {"metrics": {"acc,none": {"a": {"0": 1.0, "1": 0.0}, "b": {"0": 1.0, "1": 1.0}}},
               "chance": {"a": {"0": 0.5, "1": 0.5}, "b": {"0": 0.25, "1": 0.25}}}
    (row,) = run.summarize(per_doc)
    assert row["n"] == 4 and row["value"] == 0.75 and row["chance"] == pytest.approx(0.375)
    assert row["stderr"] == pytest.approx(math.sqrt(0.25 / 4))   # sample var 0.25, n = 4


def test_synth_gen_generates_through_the_decoder(tmp_path, synthetic_dir, tiny_llada):
    task = {"name": "synth_gen", "kind": "synthetic_gen", "gen_length": 8, "steps": 8,
            "block_length": 8, "batch_size": 2, "limit": None}
    settings = base_settings(task, synthetic_dir)
    out = tmp_path / "arith.parquet"
    df = run.evaluate(settings, None, None, out, loaded=tiny_llada)
    row = df.set_index("metric").loc["exact_match,strict-match"]
    assert row["n"] == 3 and row["chance"] == 0.0 and 0.0 <= row["value"] <= 1.0
    # The generated strings are what the model decodes (left padding, truncation at EOS/until).
    from fair_calib.decoding import generate, make_policy
    from fair_calib.evaluate.lm import DiffusionLM

    lm = DiffusionLM(tiny_llada, decoding={"gen_length": 8, "steps": 8, "block_length": 8})
    pol = make_policy(tiny_llada.adapter.decoding, {"gen_length": 8, "steps": 8, "block_length": 8})
    assert lm.policy() == pol
    prompt = "Question: what is 1 + 2 ?\nAnswer:"
    from lm_eval.api.instance import Instance
    got = lm.generate_until([Instance("generate_until", {}, (prompt, {"until": ["Question:"]}), 0),
                             Instance("generate_until", {}, ("what", {"until": []}), 1)])
    ids = tiny_llada.tokenizer(prompt)["input_ids"]
    from fair_calib.evaluate.lm import request_generator
    ref = generate(tiny_llada, [ids], pol, [request_generator(0, "gen", ids)])[0].tolist()
    assert got[0] == lm.postprocess(ref, ["Question:"])
    assert len(got) == 2


def test_postprocess_cuts_at_eos_and_until(tiny_llada):
    from fair_calib.evaluate.lm import DiffusionLM

    lm = DiffusionLM(tiny_llada)
    tok = tiny_llada.tokenizer
    ids = tok("3 + 4 = 7 . Question : what", add_special_tokens=False)["input_ids"]
    assert lm.postprocess(ids, ["Question"]) == "3 + 4 = 7. "
    ids2 = ids[:4] + [tiny_llada.eos_id] + ids[4:]
    assert lm.postprocess(ids2, []) == "3 + 4 ="


def test_cli_with_saved_model_dir(tmp_path, synthetic_dir):
    loaded = make_loaded("tiny-llada", seed=1)
    model_dir = tmp_path / "model"
    loaded.model.save_pretrained(model_dir)
    loaded.tokenizer.save_pretrained(model_dir)
    settings = base_settings({**MC_TASK, "limit": 2}, synthetic_dir)
    out = tmp_path / "cli" / "synth_mc.parquet"
    run.run_cli(["--settings", json.dumps(settings), "--model-dir", str(model_dir), "--out", str(out)])
    df, _ = io.read_parquet(out)
    assert int(df.set_index("metric").loc["acc,none", "n"]) == 2
    direct = run.evaluate(settings, None, None, tmp_path / "direct.parquet", loaded=loaded)
    assert df.set_index("metric").loc["acc,none", "value"] == direct.set_index("metric").loc["acc,none", "value"]
    run.run_cli(["--gather", "--inputs", str(out), "--out", str(tmp_path / "g.parquet")])
    g, _ = io.read_parquet(tmp_path / "g.parquet")
    pd.testing.assert_frame_equal(g, df)


def test_offline_mode_follows_task_then_data_source():
    s = base_settings({"name": "piqa", "kind": "lm_eval"})
    assert run.is_offline(s)                                   # data_source unset: local
    assert not run.is_offline({**s, "data_source": "hub"})
    assert run.is_offline({**s, "data_source": "hub", "task": {**s["task"], "offline": True}})
    assert not run.is_offline({**s, "task": {**s["task"], "offline": False}})
    assert run.is_offline({**s, "data_source": "hub", "task": MC_TASK})   # synthetic: always local
    assert run.lm_eval_task_name({"name": "arc-e", "kind": "lm_eval", "lm_eval_task": "arc_easy"}) == "arc_easy"
    with pytest.raises(ValueError, match="unknown task kind"):
        run.lm_eval_task_name({"name": "x", "kind": "bogus"})
    assert run.shard_indices(10, 7, 1, 3) == [1, 4]
    assert run.shard_indices(10, None, 0, 4) == [0, 4, 8]


@pytest.mark.parametrize("family,seed,until", [("tiny-llada", 1, ["Answer"]),
                                               ("tiny-dream", 1, ["the 15", "is"])])
def test_generate_until_early_exit_gives_the_full_runs_strings(family, seed, until):
    """Stop strings end rows early (the random models repeat words); the strings are those of
    the full run, and the steps saved are recorded per document."""
    from fair_calib.evaluate.lm import DiffusionLM
    from lm_eval.api.instance import Instance

    model = make_loaded(family, seed=seed)
    prompts = ["Question: what is 1 + 2 ?\nAnswer:", "what", "a b c", "which animal is a dog ?",
               "Question : what is the colour of the sky ?\nAnswer:"]
    outs = {}
    for early in (False, True):
        lm = DiffusionLM(model, decoding={"gen_length": 16, "steps": 16, "block_length": 8},
                         early_exit=early, gen_batch_size=1)
        reqs = [Instance("generate_until", {}, (p, {"until": until}), i, metadata=("t", i, 1))
                for i, p in enumerate(prompts)]
        outs[early] = (lm.generate_until(reqs), lm.decode_steps)
    assert outs[True][0] == outs[False][0]
    assert outs[False][1] == {("t", i): [16, 16] for i in range(len(prompts))}
    run_steps = [outs[True][1][("t", i)] for i in range(len(prompts))]
    assert all(full == 16 and 1 <= ran <= 16 for ran, full in run_steps)
    assert sum(ran for ran, _ in run_steps) < 16 * len(prompts)


def test_eval_outputs_record_decoding_steps(tmp_path, synthetic_dir, tiny_llada):
    task = {"name": "synth_gen", "kind": "synthetic_gen", "gen_length": 8, "steps": 8,
            "block_length": 8, "batch_size": 2, "limit": None}
    frames = {}
    for early in (True, False):
        settings = base_settings({**task, "early_exit": early}, synthetic_dir)
        out = tmp_path / f"gen-{early}.parquet"
        frames[early] = run.evaluate(settings, None, None, out, loaded=tiny_llada)
        raw = io.read_json(run.raw_json_path(out))
        steps = raw["per_doc"]["steps"]["synth_gen"]
        assert sorted(steps, key=int) == ["0", "1", "2"] and all(f == 8 for _, f in steps.values())
        back, _ = io.read_parquet(out)
        assert int(back["decode_steps_full"].iloc[0]) == 3 * 8
        assert int(back["decode_steps"].iloc[0]) == sum(r for r, _ in steps.values())
    for col in ("value", "stderr", "n"):
        assert frames[True][col].tolist() == frames[False][col].tolist()
    assert (frames[False]["decode_steps"] == 24).all()
    # a task that decodes nothing records no steps
    mc = run.evaluate(base_settings(MC_TASK, synthetic_dir), None, None, tmp_path / "mc.parquet",
                      loaded=tiny_llada)
    assert (mc["decode_steps"] == 0).all() and (mc["decode_steps_full"] == 0).all()


def test_gathered_shards_sum_the_decoding_steps(tmp_path, synthetic_dir, tiny_llada):
    task = {"name": "synth_gen", "kind": "synthetic_gen", "gen_length": 8, "steps": 8,
            "block_length": 8, "batch_size": 2, "limit": None}
    settings = base_settings(task, synthetic_dir)
    one = run.evaluate(settings, None, None, tmp_path / "one.parquet", loaded=tiny_llada)
    shards = [tmp_path / f"shard-{k}.parquet" for k in range(2)]
    for k, p in enumerate(shards):
        run.evaluate(settings, None, None, p, shard=k, num_shards=2, loaded=tiny_llada)
    gathered = run.gather(shards, tmp_path / "all.parquet")
    pd.testing.assert_frame_equal(one, gathered)
    assert int(gathered["decode_steps_full"].iloc[0]) == 3 * 8

def test_fewshot_examples_are_lm_evals_default_draw(tmp_path, synthetic_dir, tiny_llada,
                                                    monkeypatch):
    """k-shot examples come from lm-eval's sampler seeded with its default 1234 (what the
    authors' scripts run with), not the config seed: lm-eval draws ``Random(1234).sample(pool,
    k)`` per document in document order; a shard draws as a separate process does."""
    import random

    import lm_eval

    from fair_calib.evaluate.run import FEWSHOT_SEED

    assert FEWSHOT_SEED == 1234
    import inspect
    assert inspect.signature(lm_eval.simple_evaluate).parameters["fewshot_random_seed"].default \
        == FEWSHOT_SEED
    docs = [{"query": f"Question : what is item {i} ?\nAnswer:",
             "choices": [" red", " blue", " green", " yellow"], "gold": i % 4} for i in range(8)]
    (synthetic_dir / "synth_mc.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n")
    contexts = {}
    real = lm_eval.simple_evaluate

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        contexts.update({s["doc_id"]: s["arguments"][0][0] for s in res["samples"]["synth_mc"]})
        return res

    monkeypatch.setattr(lm_eval, "simple_evaluate", spy)

    def expected(doc_ids, seed):
        rnd = random.Random(seed)      # lm-eval's ContextSampler: one generator, doc order
        out = {}
        for i in doc_ids:
            shots = rnd.sample(docs, 2)
            out[i] = "".join(d["query"] + d["choices"][d["gold"]] + "\n\n" for d in shots) + \
                docs[i]["query"]
        return out

    task = {**MC_TASK, "num_fewshot": 2}
    settings = {**base_settings(task, synthetic_dir), "seed": 7}
    run.evaluate(settings, None, None, tmp_path / "all.parquet", loaded=tiny_llada)
    assert contexts == expected(range(8), 1234)
    assert contexts != expected(range(8), 7) and contexts != expected(range(8), 0)
    contexts.clear()
    run.evaluate(settings, None, None, tmp_path / "s1.parquet", shard=1, num_shards=2,
                 loaded=tiny_llada)
    assert contexts == expected([1, 3, 5, 7], 1234)


def test_early_exit_under_escape_until_stops_at_the_eos_token():
    """Dream's eval.py text rule (whole window decoded, split at the EOS text, no stop
    strings): a row is final once everything before its first EOS token is committed. The
    random model's frequent word "the" is made the EOS so rows end early. One row a batch: a
    batch of several under Dream's count rule runs until its last row is final."""
    from fair_calib.evaluate.lm import DiffusionLM
    from lm_eval.api.instance import Instance

    model = make_loaded("tiny-dream", seed=1)
    model.tokenizer.eos_token = "the"
    prompts = ["Question: what is 1 + 2 ?\nAnswer:", "what", "a b c", "which animal is a dog ?"]
    outs = {}
    for early in (False, True):
        lm = DiffusionLM(model, decoding={"gen_length": 16, "steps": 16}, escape_until=True,
                         early_exit=early, gen_batch_size=1)
        reqs = [Instance("generate_until", {}, (p, {"until": ["is"]}), i, metadata=("t", i, 1))
                for i, p in enumerate(prompts)]
        outs[early] = (lm.generate_until(reqs), lm.decode_steps)
    assert outs[True][0] == outs[False][0]
    assert sum(ran for ran, _ in outs[True][1].values()) < 16 * len(prompts)
