"""Tiny random diffusion LM helpers for the evaluation tests (no training, no downloads)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

WORDS = ("Question : Answer what is the colour of a an sky grass sun red blue green yellow "
         "+ = . , ? #### which animal bird dog cat fish is are").split() + [str(i) for i in range(20)]


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["[PAD]", "[MASK]", "[EOS]", "[UNK]"] + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="\u0001\u0001", cleanup=True)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", mask_token="[MASK]",
                                   eos_token="[EOS]", unk_token="[UNK]", padding_side="left")


def make_loaded(family: str = "tiny-llada", seed: int = 0, max_positions: int = 128):
    from transformers import LlamaConfig, LlamaForCausalLM

    from fair_calib.models.adapters import LoadedModel, get_adapter

    torch.manual_seed(seed)
    tok = make_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=max_positions, is_causal=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      bos_token_id=None)
    model = LlamaForCausalLM(cfg).eval()
    # Larger output weights: a random model with peaked, position-dependent predictions.
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return LoadedModel(model, tok, get_adapter(family), mask_id=tok.mask_token_id,
                       pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)


def write_synthetic(d: Path) -> Path:
    """Small synth_mc / synth_gen files in the make-data formats."""
    d.mkdir(parents=True, exist_ok=True)
    colours = ["red", "blue", "green", "yellow"]
    mc = []
    for thing, gold in [("sky", 1), ("grass", 2), ("sun", 3), ("sky", 1), ("grass", 2)]:
        mc.append({"query": f"Question : what is the colour of the {thing} ?\nAnswer:",
                   "choices": [f" {c}" for c in colours], "gold": gold})
    (d / "synth_mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mc))
    arith = [{"question": f"what is {a} + {b} ?", "answer": f"{a} + {b} = {a + b} .\n#### {a + b}"}
             for a, b in [(1, 2), (3, 4), (5, 6)]]
    (d / "synth_gen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in arith))
    return d


def data_dir() -> Path:
    env = os.environ.get("FAIR_CALIB_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def base_settings(task: dict, synthetic_dir=None, data=None) -> dict:
    return {"seed": 0, "device": "cpu", "dtype": "float32",
            "data_dir": str(data) if data else None,
            "synthetic_dir": str(synthetic_dir) if synthetic_dir else None,
            "model": {"name": "tiny-llada", "family": "tiny-llada", "source": "random",
                      "instruct": False},
            "method": {"name": "fp", "type": "fp"}, "bits": {"name": "fp"}, "task": task}
