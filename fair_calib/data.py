"""Data sources for probing and calibration.

Two places hold data: the *synthetic dir* (written by ``fair-calib make-data`` for the embedded
tiny default) and the external *data dir* (offline copies of WikiText-2, GSM8K and the
benchmarks, in the formats of ``shared/data/README.md``). On a connected machine the paper
configuration can read from the Hugging Face hub instead (``source: hub``).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

DATA_HELP = ("Point `data_dir` in the config (or FAIR_CALIB_DATA_DIR) at a folder holding the "
             "offline copies described in docs/data.md (wikitext2/, gsm8k/, ...), or set "
             "`source: hub` on a machine that reaches the Hugging Face hub.")


def resolve_dir(path: str | Path, what: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(f"{what} {str(p)!r} does not exist. {DATA_HELP}")
    return p


def _need_file(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"missing data file {str(path)!r}. {DATA_HELP}")
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    with open(_need_file(Path(path))) as f:
        return [json.loads(line) for line in f if line.strip()]


def _gsm8k_questions(data_dir: str | Path, split: str, source: str) -> list[str]:
    if source == "hub":
        from datasets import load_dataset

        return list(load_dataset("openai/gsm8k", "main", split=split)["question"])
    rows = read_jsonl(resolve_dir(data_dir, "data_dir") / "gsm8k" / f"{split}.jsonl")
    return [r["question"] for r in rows]


def _wikitext_paragraphs(data_dir: str | Path, source: str, split: str = "test") -> list[str]:
    if source == "hub":
        from datasets import load_dataset

        lines = load_dataset("wikitext", "wikitext-2-raw-v1", split=split)["text"]
    else:
        raw = _need_file(resolve_dir(data_dir, "data_dir") / "wikitext2" / "wiki.test.raw")
        lines = raw.read_text(encoding="utf-8").replace("\r\n", "\n").split("\n")
    # Paragraphs, without the " = Heading = " lines.
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("=")]


def probe_prompts(dataset: str, data_dir: str | Path, synthetic_dir: str | Path, n: int,
                  instruction: str | None = None, source: str = "local") -> list[str]:
    """The first ``n`` probing prompts of ``dataset`` (deterministic order).

    ``synthetic`` / ``gsm8k``: questions followed by the zero-shot CoT instruction;
    ``facts`` / ``wikitext2``: text prefixes (the second corpus of the cross-corpus check).
    """
    suffix = f" {instruction}" if instruction else ""
    if dataset == "synthetic":
        rows = read_jsonl(resolve_dir(synthetic_dir, "synthetic_dir") / "probe.jsonl")
        texts = [r["question"] + suffix for r in rows]
    elif dataset == "gsm8k":
        texts = [q + suffix for q in _gsm8k_questions(data_dir, "train", source)]
    elif dataset == "facts":
        texts = [r["text"] for r in read_jsonl(resolve_dir(synthetic_dir, "synthetic_dir") / "facts.jsonl")]
    elif dataset == "wikitext2":
        texts = _wikitext_paragraphs(data_dir, source)
    else:
        raise ValueError(f"probe.dataset: unknown dataset {dataset!r}; valid: "
                         "['synthetic', 'gsm8k', 'facts', 'wikitext2']")
    if len(texts) < n:
        raise ValueError(f"probe dataset {dataset!r} has {len(texts)} prompts, {n} requested")
    return texts[:n]


def calibration_texts(dataset: str, data_dir: str | Path, synthetic_dir: str | Path,
                      source: str = "local") -> list[str]:
    """Documents the calibration windows are cut from."""
    if dataset == "synthetic":
        return [r["text"] for r in read_jsonl(resolve_dir(synthetic_dir, "synthetic_dir") / "calib.jsonl")]
    if dataset == "wikitext2":
        # Offline copies hold the raw test split (the train split is on the hub only).
        return _wikitext_paragraphs(data_dir, source, split="train" if source == "hub" else "test")
    raise ValueError(f"calibration.dataset: unknown dataset {dataset!r}; valid: ['synthetic', 'wikitext2']")


def calibration_batch(tokenizer, texts: list[str], n_samples: int, seq_len: int,
                      seed: int) -> torch.Tensor:
    """``n_samples`` random windows of ``seq_len`` tokens from the concatenated texts.

    The GPTQ/FlatQuant convention: join the corpus, tokenize once, cut windows at seeded random
    offsets. Raises if the corpus is shorter than one window.
    """
    joiner = f" {tokenizer.eos_token} " if tokenizer.eos_token else "\n\n"
    ids = tokenizer(joiner.join(texts), add_special_tokens=False,
                    return_tensors="pt")["input_ids"][0]
    if ids.numel() <= seq_len:
        raise ValueError(f"calibration corpus has {ids.numel()} tokens; need more than seq_len={seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, ids.numel() - seq_len, (n_samples,), generator=gen)
    return torch.stack([ids[s:s + seq_len] for s in starts.tolist()])
