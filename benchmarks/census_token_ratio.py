"""Characters per token of the census's request texts, measured with real tokenizers (CPU).

    PYTHONPATH=. python benchmarks/census_token_ratio.py --tokenizer dream=QWEN.tiktoken \
        --tokenizer llada=LLAMA3.tokenizer.model [--data-dir DIR]

Every document of the offline copies (FAIR_CALIB_DATA_DIR) is turned into the requests lm-eval
builds for the evaluation stage (fair_calib.census: contexts with their few-shot prefixes,
continuations, generation prompts); each text is tokenized, and per (family, task) the ratio chars / tokens is printed
with the error of estimating a text's tokens as round(chars / ratio): mean and 95th percentile
of |estimate - exact| / exact over contexts/prompts, and the same for continuations in tokens.
The last line is CHARS_PER_TOKEN for fair_calib/census_tokenizer.py. Tokenizer files: a tokenizer.json,
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
from fair_calib.census_tokenizer import StandInTokenizer
from fair_calib.evaluate.offline_data import default_data_dir

MC_TASKS = ("piqa", "boolq", "winogrande", "arc_easy", "arc_challenge", "hellaswag",
            "truthfulqa_mc2", "mmlu")
GEN_TASKS = ("gsm8k", "gsm8k_cot", "humaneval")
SHOTS = {"winogrande": 5, "mmlu": 5, "gsm8k": 5, "gsm8k_cot": 8}


def texts(task: str, data_dir: Path) -> tuple[list[str], list[str]]:
    """(contexts or prompts, continuations) of a task: the requests lm-eval builds for the
    evaluation stage (fair_calib.census), each context once."""
    settings = {"seed": 0, "model": {"name": "ratio", "family": "llada", "instruct": False},
                "task": {"name": task, "kind": "lm_eval", "lm_eval_task": task,
                         "num_fewshot": SHOTS.get(task, 0), "offline": True},
                "data_dir": str(data_dir), "census_stand_ins": True}
    lm = census.recording_lm(census.encoding_args(settings, StandInTokenizer("llada", task),
                                                   4096))
    reqs = census.evaluation_requests(settings, lm)
    if task in GEN_TASKS:
        return [a[0] for a in reqs["generate_until"]], []
    pairs = reqs["loglikelihood"]
    return list(dict.fromkeys(a[0] for a in pairs)), [a[1] for a in pairs]


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


def load_tokenizer(path: str):
    """A ``tokenizer.json`` (HF tokenizers) or a ``.tiktoken`` rank file (Qwen's pattern, or
    LLaMA-3's when the file name says llama): text -> its token count."""
    p = Path(path)
    if p.suffix == ".json":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(p))
        return lambda text: len(tok.encode(text, add_special_tokens=False).ids)
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    pat = TIKTOKEN_PATTERNS["llama3" if "llama" in p.name.lower() or p.name == "tokenizer.model"
                            else "qwen"]
    enc = tiktoken.Encoding(p.stem, pat_str=pat, mergeable_ranks=load_tiktoken_bpe(str(p)),
                            special_tokens={})
    return lambda text: len(enc.encode_ordinary(text))


TIKTOKEN_PATTERNS = {   # the pre-tokenizers of the two rank files (Qwen: single digits)
    "qwen": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    "llama3": r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", action="append", required=True, metavar="FAMILY=PATH")
    ap.add_argument("--data-dir", default=None)
    args = ap.parse_args()
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir()
    table: dict[str, dict[str, float]] = {}
    for family, path in census.tokenizer_args(args.tokenizer).items():
        count = load_tokenizer(path)
        chars = toks = 0
        table[family] = {}
        for task in MC_TASKS + GEN_TASKS:
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
