"""The census of the grid's forwards: the paper grid cut to two tasks over tiny copies of their
data, refusals, the stand-in tokenizer, the Parquet output, and the GPU benchmark's shape
selection (CPU side). tests/evaluate/test_census_requests.py holds it against evaluate runs."""
import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from fair_calib.budget import census
from fair_calib.checks.references import load_config

# the benchmark scripts are not a package of the install: import them from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))


def _tiny_data(root):
    """Offline copies of two tasks in their original formats: 3 PIQA items, 2 GSM8K questions
    (and a train split of 6 for the 5-shot draw)."""
    (root / "piqa").mkdir(parents=True)
    items = [{"goal": f"Goal number {i}", "sol1": "a" * (10 + i), "sol2": "b" * 20} for i in range(3)]
    (root / "piqa" / "valid.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))
    (root / "piqa" / "valid-labels.lst").write_text("0\n1\n0\n")
    (root / "gsm8k").mkdir()
    q = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"}
         for i in range(6)]
    (root / "gsm8k" / "test.jsonl").write_text("".join(json.dumps(x) + "\n" for x in q[:2]))
    (root / "gsm8k" / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in q))
    return root


@pytest.fixture
def tiny_grid(repo_root):
    """The paper config cut to one table: two models x {FP, FAIR-Calib} x {PIQA, GSM8K}."""
    cfg = load_config([repo_root / "config" / "paper.yaml"], repo_root / "config" / "config.yaml")
    cfg["tables"] = {"main": {"kind": "main", "models": ["llada-8b-base", "dream-7b-base"],
                              "methods": ["fp", "fair-calib"], "bits": "w4a4",
                              "tasks": ["piqa", "gsm8k_cot"]}}
    cfg["diagnostics"]["enabled"] = False
    return cfg


def test_grid_census_on_a_tiny_task_set(tiny_grid, tmp_path):
    data = _tiny_data(tmp_path / "data")
    c = census.census(tiny_grid, data)
    assert len(c.cells) == 2 * 2 * 2                    # models x methods x tasks
    total = Counter()
    for r in c.records:
        total[(r["family"], r["task"], r["request_class"], r["structure"])] += r["forwards"]
    # PIQA, LLaDA (cfg 0.5, 8 rows): 3 docs x 2 choices x 16 forwards of 16 rows, per run
    assert total[("llada", "piqa", "mc", "fp")] == total[("llada", "piqa", "mc", "transform")] == 96
    assert {r["rows"] for r in c.records if r["family"] == "llada" and r["task"] == "piqa"} == {16}
    # PIQA, Dream (32 rows, exact below 2; multi-token choices are sampled): 4 forwards a choice
    assert total[("dream", "piqa", "mc", "fp")] == 3 * 2 * 4
    # GSM8K: LLaDA-Base runs lm-eval's gsm8k 5-shot, 1024 steps; Dream gsm8k_cot 8-shot, 256
    assert total[("llada", "gsm8k_cot", "generate", "transform")] == 2 * 1024
    assert total[("dream", "gsm8k_cot", "generate", "fp")] == 2 * 256
    gen = [r for r in c.records if r["request_class"] == "generate"]
    assert all(r["rows"] == 1 and r["early_exit"] for r in gen)
    llada_gen = [r for r in gen if r["family"] == "llada"]
    assert {r["lm_eval_task"] for r in llada_gen} == {"gsm8k"}
    # lm-eval's default 5 exemplars (~50 characters each) before the question, 1024 masks
    assert all(1024 + 60 < r["tokens_mean"] <= r["tokens"] for r in llada_gen)
    # one lm-eval run per (model, task): 3 x 2 choices, 2 questions
    assert c.requests[("llada-8b-base", "piqa")] == {"loglikelihood": 6}
    assert c.requests[("dream-7b-base", "gsm8k_cot")] == {"generate_until": 2}
    assert c.tokenizers == {"llada-8b-base": "stand-in", "dream-7b-base": "stand-in"}
    out = tmp_path / "census.parquet"
    census.write_census(c, out, tiny_grid)
    from fair_calib.jobs.io import read_parquet

    df, prov = read_parquet(out)
    assert len(df) == len(c.records) and list(df.columns) == list(census.CENSUS_COLUMNS)
    assert prov["token_counts"] == c.tokenizers
    text = census.summary(c)
    assert "carry 90% of the grid's forwards" in text and "loglikelihood 12" in text


def test_census_honours_a_tasks_limit(tiny_grid, tmp_path):
    data = _tiny_data(tmp_path / "data")
    tiny_grid["tasks"]["piqa"]["limit"] = 2                 # lm-eval's first 2 documents
    c = census.census(tiny_grid, data)
    assert sum(r["forwards"] for r in c.records
               if r["family"] == "llada" and r["task"] == "piqa") == 2 * 2 * 2 * 16


def test_census_refuses_a_missing_data_folder(tiny_grid, tmp_path):
    with pytest.raises(FileNotFoundError, match="FAIR_CALIB_DATA_DIR"):
        census.census(tiny_grid, tmp_path / "absent")


def test_census_refuses_what_it_cannot_count_by_name(tiny_grid, tmp_path):
    """A task without an offline definition (LAMBADA) or copy is named before anything runs."""
    data = _tiny_data(tmp_path / "data")
    tiny_grid["tasks"]["lambada"] = {"kind": "lm_eval", "lm_eval_task": "lambada_openai",
                                     "label": "LAMBADA"}
    tiny_grid["tables"]["main"]["tasks"].append("lambada")
    with pytest.raises(census.CensusError,
                       match=r"lambada \(lambada_openai\): no offline definition"):
        census.census(tiny_grid, data)
    tiny_grid["tables"]["main"]["tasks"].remove("lambada")
    shutil.rmtree(data / "piqa")
    with pytest.raises(census.CensusError, match=r"piqa \(piqa\): its offline copy"):
        census.census(tiny_grid, data)


def test_stand_in_tokenizer():
    from fair_calib.budget.census_tokenizer import StandInTokenizer, chars_per_token

    tok = StandInTokenizer("llada", "oc_mmlu_gen")
    assert tok.ratio == chars_per_token("llada", "mmlu") == 4.41
    assert chars_per_token("dream", "oc_arc_c_gen") == 4.174          # no measured ratio: "*"
    ids = tok("a" * 441)["input_ids"]
    assert len(ids) == 100 and ids == tok("a" * 441)["input_ids"]
    assert tok("b" * 441)["input_ids"] != ids
    text = tok.apply_chat_template([{"role": "user", "content": " Hi "}],
                                   add_generation_prompt=True)
    assert text == ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
    # 6 specials, one each; "user", "\n\nHi", "assistant" (2), "\n\n" by characters
    assert len(tok(text)["input_ids"]) == 6 + 1 + 1 + 2 + 1
    dream = StandInTokenizer("dream", "gsm8k")
    assert dream.apply_chat_template([{"role": "user", "content": "Q"}, {
        "role": "assistant", "content": "A: x"}], continue_final_message=True).endswith("A: x")
    assert dream.convert_tokens_to_ids("<|endoftext|>") == dream.eos_token_id


def test_heavy_shapes_reach_the_share():
    recs = [{"family": "llada", "request_class": "mc", "rows": 8, "tokens": t, "forwards": n,
             "gpu_seconds": float(n)} for t, n in ((64, 50), (128, 30), (192, 15), (256, 5))]
    got = census.heavy_shapes(recs, "forwards", 0.9)
    assert [s["tokens"] for s in got] == [64, 128, 192]
    assert got[-1]["cumulative_share"] == pytest.approx(0.95)
    assert census.heavy_shapes(recs, "forwards", 0.9, family="dream") == []



# ----------------------------------------------------------------------------- the GPU benchmark
def test_benchmark_shape_selection_and_entries():
    from benchmarks import census_shapes_gpu as b

    recs = [{"family": "llada", "request_class": c, "rows": r, "tokens": t, "forwards": n,
             "gpu_seconds": s} for c, r, t, n, s in (
                ("mc", 16, 64, 1000, 10.0), ("generate", 1, 1984, 100, 50.0),
                ("mc", 16, 128, 10, 1.0), ("exact", 32, 640, 1, 0.01))]
    assert b.select_shapes(recs, "llada") == [("generate", 1, 1984), ("mc", 16, 64)]
    assert b.select_shapes(recs, "llada", max_shapes=1) == [("generate", 1, 1984)]
    assert b.parse_shape("1x1984") == ("generate", 1, 1984)
    assert b.parse_shape("16X128") == ("mc", 16, 128)
    with pytest.raises(SystemExit, match="ROWSxTOKENS"):
        b.parse_shape("16-128")
    rec = b.record("dream-7b", "hadamard", "decode", 1, 1024, 0.02, 0.03, device="x")
    assert rec["ratio"] == 1.5 and rec["entry"] == ["decode", 1, 1024, 1.5, b.SOURCE]
    assert b.entries([rec]) == {"('dream', 'hadamard')": [("decode", 1, 1024, 1.5, b.SOURCE)]}
    json.dumps(rec)
    # every default shape runs on the real path (token counts multiple of 4) and is a bucket
    assert all(t % census.BUCKET == 0 for v in b.DEFAULT_SHAPES.values() for _, _, t in v)


def test_w8a8_is_priced_as_auto_runs_it(monkeypatch):
    """W8A8 runs on the int8 Triton GEMM under auto, so the census gives it its method's
    structure; with the cuBLAS GEMM auto keeps it on fake quantization; FP is FP."""
    cfg = {"methods": {"rtn": {"type": "rtn"}, "fp": {"type": "fp"},
                       "fair-calib": {"type": "fair_calib"}},
           "bits": {"w8a8": {"w_bits": 8, "a_bits": 8}, "w4a4": {"w_bits": 4, "a_bits": 4},
                    "w4a16": {"w_bits": 4, "a_bits": 16}}}
    monkeypatch.delenv("FAIR_CALIB_LOWBIT_GEMM", raising=False)
    assert census.structure(cfg, "rtn", "w8a8") == "plain"
    assert census.structure(cfg, "fair-calib", "w8a8") == "transform"
    assert census.structure(cfg, "fp", "w8a8") == "fp"
    assert census.structure(cfg, "rtn", "w4a16") == "fake"
    monkeypatch.setenv("FAIR_CALIB_LOWBIT_GEMM", "cublas")
    assert census.structure(cfg, "rtn", "w8a8") == "fake"
    assert census.structure(cfg, "rtn", "w4a4") == "plain"
