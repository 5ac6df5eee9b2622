"""Characters per token of the census's request texts, measured with real tokenizers (CPU).

    PYTHONPATH=. python benchmarks/census_token_ratio.py --tokenizer dream=QWEN.tiktoken \
        --tokenizer llada=LLAMA3.tokenizer.model [--data-dir DIR]

Every document of the offline copies (FAIR_CALIB_DATA_DIR) is turned into the texts
fair_calib/census.py counts (contexts with their few-shot prefixes, continuations, generation
prompts); each text is tokenized, and per (family, task) the ratio chars / tokens is printed
with the error of estimating a text's tokens as round(chars / ratio): mean and 95th percentile
of |estimate - exact| / exact over contexts/prompts, and the same for continuations in tokens.
The last line is CHARS_PER_TOKEN for fair_calib/census.py. Tokenizer files: a tokenizer.json,
or a .tiktoken rank file (tiktoken must be importable): Qwen's ``qwen.tiktoken`` (the ranks of
Qwen2's BPE, which Dream uses; shipped in the dashscope wheel) and LLaMA-3's
``tokenizer.model`` (llama-models wheel; a proxy for LLaDA's own tokenizer).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from fair_calib import census
from fair_calib.evaluate.offline_data import default_data_dir

MC_TASKS = ("piqa", "boolq", "winogrande", "arc_easy", "arc_challenge", "hellaswag",
            "truthfulqa_mc2", "mmlu")
SHOTS = {"winogrande": 5, "mmlu": 5, "gsm8k": 5, "gsm8k_cot": 8}


def texts(task: str, data_dir: Path) -> tuple[list[str], list[str]]:
    """(contexts or prompts, continuations) of a task, as the census builds them."""
    if task in census.GEN_TASKS:
        return census.gen_prompts(task, data_dir, SHOTS.get(task, 0)), []
    docs = census.mc_documents(task, data_dir, SHOTS.get(task, 0))
    return [d.context for d in docs], [c for d in docs for c in d.continuations]


def _err(xs: list[str], count, ratio: float) -> tuple[float, float, float]:
    """mean and p95 relative error of round(chars / ratio), and mean absolute error (tokens)."""
    rel, ab = [], []
    for x in xs:
        n = count(x)
        est = max(1, round(len(x) / ratio))
        rel.append(abs(est - n) / max(n, 1))
        ab.append(abs(est - n))
    rel.sort()
    return statistics.fmean(rel), rel[int(0.95 * (len(rel) - 1))], statistics.fmean(ab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", action="append", required=True, metavar="FAMILY=PATH")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    table: dict[str, dict[str, float]] = {}
    for family, path in census._tokenizer_args(args.tokenizer).items():
        count = census._load_tokenizer(path)
        chars = toks = 0
        table[family] = {}
        for task in MC_TASKS + census.GEN_TASKS:
            ctx, cont = texts(task, data_dir)
            c = sum(len(x) for x in ctx + cont)
            n = sum(count(x) for x in ctx + cont)
            ratio = c / n
            table[family][task] = round(ratio, 3)
            chars, toks = chars + c, toks + n
            e_ctx = _err(ctx, count, ratio)
            e_cont = _err(cont, count, ratio) if cont else (0.0, 0.0, 0.0)
            print(json.dumps({"family": family, "tokenizer": Path(path).name, "task": task,
                              "texts": len(ctx) + len(cont), "chars_per_token": round(ratio, 3),
                              "context_rel_err_mean": round(e_ctx[0], 4),
                              "context_rel_err_p95": round(e_ctx[1], 4),
                              "context_abs_err_tokens": round(e_ctx[2], 2),
                              "continuation_abs_err_tokens": round(e_cont[2], 2)}))
        table[family]["*"] = round(chars / toks, 3)
    print("CHARS_PER_TOKEN = " + json.dumps(table))


if __name__ == "__main__":
    main()
