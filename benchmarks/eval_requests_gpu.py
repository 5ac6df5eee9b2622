"""Documents/s of the likelihood scoring for MMLU-, BoolQ- and ARC-shaped requests at the
LLaDA-8B shape (random weights, bf16), per-request MC (before) vs exact mode (after).

    PYTHONPATH=. python benchmarks/eval_requests_gpu.py [--layers N] [--docs 3]

One JSON line per (request shape, mode). Settings are the authors' (eval_llada_lm_eval.sh):
MMLU 5-shot mc_num 1, 1 row; BoolQ/ARC mc_num 128, 8 rows. "before" is ``exact_below: 0``
(every request its own MC estimate, the cost of the previous code at the same rows);
"after" is the LLaDA default ``exact_below: 2`` (single-token targets exact, a question's
choices in one forward) and, for ARC, the optional ``exact_below: 7``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.shapes import SHAPES, build  # noqa: E402

# name -> (context tokens, choices, tokens per choice, mc_num, rows)
REQUESTS = {
    "mmlu": (600, 4, 1, 1, 1),       # 5-shot prompt, " A".." D"
    "boolq": (160, 2, 1, 128, 8),    # passage + question, " no" / " yes"
    "arc": (48, 4, 6, 128, 8),       # "Question: ...\nAnswer:", multi-token answers
}
MODES = {"mmlu": [0, 2], "boolq": [0, 2], "arc": [0, 2, 7]}


def ids(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, max(vocab - 1000, 11), (n, length), generator=g).tolist()


@torch.no_grad()
def docs_per_s(loaded, name: str, exact_below: int, docs: int, vocab: int) -> float:
    from fair_calib.evaluate.likelihood import likelihood_settings, score_requests

    ctx_len, n_choices, choice_len, mc_num, rows = REQUESTS[name]
    st = likelihood_settings(loaded.adapter.likelihood | {"estimator": "llada"},
                             {"mc_num": mc_num, "batch_size": rows, "exact_below": exact_below})
    documents = [(ids(1, ctx_len, vocab, 2 * d)[0], ids(n_choices, choice_len, vocab, 2 * d + 1))
                 for d in range(docs + 1)]
    def score(doc):
        ctx, choices = doc
        return score_requests(loaded, [(ctx, c) for c in choices], st, seed=0)
    score(documents[0])                                       # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for doc in documents[1:]:
        score(doc)
    torch.cuda.synchronize()
    return docs / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--docs", type=int, default=3)
    args = ap.parse_args()
    loaded = build("llada-8b", layers=args.layers)
    vocab = SHAPES["llada-8b"]["vocab_size"]
    for name in REQUESTS:
        for eb in MODES[name]:
            rate = docs_per_s(loaded, name, eb, args.docs, vocab)
            ctx_len, n_choices, choice_len, mc_num, rows = REQUESTS[name]
            print(json.dumps({"bench": "eval_requests", "request": name, "exact_below": eb,
                              "context": ctx_len, "choices": n_choices, "choice_len": choice_len,
                              "mc_num": mc_num, "rows": rows, "layers": args.layers,
                              "docs_per_s": round(rate, 3), "sec_per_doc": round(1 / rate, 4),
                              "gpu": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
