"""The census of the grid's forwards: request arithmetic, a tiny synthetic task set end to end,
the Parquet output, and the GPU benchmark's shape selection (CPU side)."""
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from fair_calib import census, cost

# the benchmark scripts are not a package of the install: import them from the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

LLADA_CFG = census.JobSettings(family="llada", lm_eval_task="piqa", kind="mc", shots=0,
                               instruct=False, add_bos=False, estimator="llada", mc_num=128,
                               batch_size=8, guided=2, exact_below=2)
DREAM = census.JobSettings(family="dream", lm_eval_task="mmlu", kind="mc", shots=5,
                           instruct=False, add_bos=True, estimator="dream", mc_num=128,
                           batch_size=32, exact_below=2)


def test_mc_forwards_follow_the_estimators():
    # LLaDA with cfg: 128 // 8 = 16 forwards of 2 x 8 rows per choice, context + target tokens
    assert census.mc_forwards([(10, [3, 5])], LLADA_CFG) == Counter(
        {("mc", 16, 13): 16, ("mc", 16, 15): 16})
    # Dream, exact below 2: one-token choices of a question share one [ctx | MASK | EOS] input;
    # inputs of one (context, total) length are batched (here 2 inputs in one forward); a
    # two-token choice is sampled: 128 // 32 = 4 forwards of 32 rows, target + EOS
    docs = [(10, [1, 1, 1, 1]), (10, [1, 1]), (12, [1, 2])]
    assert census.mc_forwards(docs, DREAM) == Counter(
        {("exact", 2, 12): 1, ("exact", 1, 14): 1, ("mc", 32, 15): 4})
    # 70 one-token questions of one length: forwards of 32, 32 and 6 inputs
    assert census.mc_forwards([(5, [1, 1])] * 70, DREAM) == Counter(
        {("exact", 32, 7): 2, ("exact", 6, 7): 1})


def test_gen_forwards_batch_longest_first():
    st = census.JobSettings(family="llada", lm_eval_task="gsm8k", kind="generate", shots=5,
                            instruct=False, add_bos=False, batch_size=2, gen_length=256, steps=128)
    assert census.gen_forwards([100, 50, 70], st) == Counter(
        {("generate", 2, 356): 128, ("generate", 1, 306): 128})


def test_token_estimate_and_buckets():
    counter = census.TokenCounter()
    ratio = census.CHARS_PER_TOKEN["dream"]["piqa"]
    assert counter.count("abcd" * 10, "dream", "piqa") == round(40 / ratio)
    assert counter.count("abcd" * 10, "dream", "no-such-task") == round(
        40 / census.CHARS_PER_TOKEN["dream"]["*"])
    assert [census.bucket(n) for n in (1, 64, 65, 1984, 1985)] == [64, 64, 128, 1984, 2048]


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
    cfg = cost.load_config([repo_root / "config" / "paper.yaml"], repo_root / "config" / "config.yaml")
    cfg["tables"] = {"main": {"kind": "main", "models": ["llada-8b-base", "dream-7b-base"],
                              "methods": ["fp", "fair-calib"], "bits": "w4a4",
                              "tasks": ["piqa", "gsm8k_cot"]}}
    cfg["diagnostics"]["enabled"] = False
    return cfg


def test_grid_census_on_a_tiny_task_set(tiny_grid, tmp_path):
    data = _tiny_data(tmp_path / "data")
    per_cell = {}
    records = census.census(tiny_grid, data, per_cell=per_cell)
    assert len(per_cell) == 2 * 2 * 2                   # models x methods x tasks
    assert sum(per_cell.values()) == pytest.approx(sum(r["gpu_seconds"] for r in records))
    proj = cost.project(tiny_grid, records, per_cell)["census"]
    assert proj["evaluate_gpu_hours"] > 0 and "longest_job_hours" in proj
    total = Counter()
    for r in records:
        total[(r["family"], r["task"], r["request_class"], r["structure"])] += r["forwards"]
    # PIQA, LLaDA (cfg 0.5, 8 rows): 3 docs x 2 choices x 16 forwards of 16 rows, per run
    assert total[("llada", "piqa", "mc", "fp")] == total[("llada", "piqa", "mc", "transform")] == 96
    assert {r["rows"] for r in records if r["family"] == "llada" and r["task"] == "piqa"} == {16}
    # PIQA, Dream (32 rows, exact below 2; multi-token choices are sampled): 4 forwards a choice
    assert total[("dream", "piqa", "mc", "fp")] == 3 * 2 * 4
    # GSM8K: LLaDA-Base runs lm-eval's gsm8k 5-shot, 1024 steps; Dream gsm8k_cot 8-shot, 256
    assert total[("llada", "gsm8k_cot", "generate", "transform")] == 2 * 1024
    assert total[("dream", "gsm8k_cot", "generate", "fp")] == 2 * 256
    gen = [r for r in records if r["request_class"] == "generate"]
    assert all(r["rows"] == 1 and r["early_exit"] for r in gen)
    llada_gen = [r for r in gen if r["family"] == "llada"]
    assert {r["lm_eval_task"] for r in llada_gen} == {"gsm8k"}
    assert all(1024 < r["tokens_mean"] <= r["tokens"] for r in llada_gen)
    # the quantized forwards cost more or less than FP by the table's ratio, never nothing
    assert all(r["gpu_seconds"] > 0 for r in records)
    out = tmp_path / "census.parquet"
    census.write_census(records, out, tiny_grid, None)
    from fair_calib.io import read_parquet

    df, prov = read_parquet(out)
    assert len(df) == len(records) and list(df.columns) == list(census.CENSUS_COLUMNS)
    assert prov["token_counts"] == {"llada": "chars/ratio", "dream": "chars/ratio"}
    text = census.summary(records)
    assert "carry 90% of the grid's forwards" in text and "projected GPU time" in text


def test_census_honours_a_tasks_limit(tiny_grid, tmp_path):
    data = _tiny_data(tmp_path / "data")
    tiny_grid["tasks"]["piqa"]["limit"] = 2                 # lm-eval's first 2 documents
    records = census.census(tiny_grid, data)
    assert sum(r["forwards"] for r in records
               if r["family"] == "llada" and r["task"] == "piqa") == 2 * 2 * 2 * 16


def test_heavy_shapes_reach_the_share():
    recs = [{"family": "llada", "request_class": "mc", "rows": 8, "tokens": t, "forwards": n,
             "gpu_seconds": float(n)} for t, n in ((64, 50), (128, 30), (192, 15), (256, 5))]
    got = census.heavy_shapes(recs, "forwards", 0.9)
    assert [s["tokens"] for s in got] == [64, 128, 192]
    assert got[-1]["cumulative_share"] == pytest.approx(0.95)
    assert census.heavy_shapes(recs, "forwards", 0.9, family="dream") == []


def test_census_refuses_a_missing_data_folder(tiny_grid, tmp_path):
    with pytest.raises(FileNotFoundError, match="FAIR_CALIB_DATA_DIR"):
        census.census(tiny_grid, tmp_path / "absent")


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


def test_benchmark_default_shapes_are_the_paper_census(repo_root, shared_data_dir):
    from benchmarks import census_shapes_gpu as b

    cfg = cost.load_config([repo_root / "config" / "paper.yaml"], repo_root / "config" / "config.yaml")
    records = census.census(cfg, shared_data_dir)
    for family, shapes in b.DEFAULT_SHAPES.items():
        assert b.select_shapes(records, family) == shapes, family


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
