"""Compare the native loaders and decoders with outputs of the model authors' own code.

The reference artifacts are produced outside this repository by running the authors' hub
modeling files (LLaDA: modeling_llada.py; Dream: modeling_dream.py + generation_utils.py)
under transformers 4.57.1 on toy checkpoints they saved themselves, plus ML-GSAI/LLaDA's
``generate.py`` and DreamLM/Dream's ``eval/eval.py`` decoding call (docs/fidelity.md says how).
This script reads such a folder and prints, for each check, the largest difference:

    python benchmarks/check_against_authors.py /path/to/authors_ref

Layout read: ``{llada,dream}/ckpt`` (checkpoints as the authors' code saved them),
``{llada,dream}/inputs.pt``, ``logits.pt``, ``llada/gqa``, ``{llada,dream}/sharp`` (head x50,
well separated decoding decisions) with ``logits_and_decode.pt``, ``dream/tok`` +
``dream/tok_ids.json``.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from fair_calib.decoding import generate, make_policy
from fair_calib.models.adapters import LoadedModel, get_adapter
from fair_calib.models.hub import LAYOUTS, load_hub_tokenizer, load_native_model

MASK, PAD = 500, 501


def _loaded(family: str, ckpt: Path, dtype=torch.float32) -> LoadedModel:
    model = load_native_model(LAYOUTS[family], str(ckpt), dtype).eval()
    return LoadedModel(model=model, tokenizer=None, adapter=get_adapter(family), mask_id=MASK,
                       pad_id=PAD, eos_id=PAD)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def check_logits(root: Path, family: str) -> dict[str, float]:
    d = root / family
    inputs, ref = torch.load(d / "inputs.pt"), torch.load(d / "logits.pt")
    lm = _loaded(family, d / "ckpt")
    shift = (lambda x: torch.cat([x[:, :1], x[:, :-1]], 1)) if family == "dream" else (lambda x: x)
    out = {}
    with torch.no_grad():
        for key in ("single", "batch"):
            out[f"{key} fp32 (rel)"] = _rel(lm.logits(inputs[key]), shift(ref[key]))
        mask = inputs["padded_attention_mask"]
        padded = lm.logits(inputs["padded"], attention_mask=mask)
        worst = 0.0
        for r, alone in enumerate(ref["padded_rows_unpadded"]):
            n = alone.shape[0]
            worst = max(worst, _rel(padded[r, -n:], shift(alone[None])[0]))
        out["padded rows vs authors' rows alone (rel)"] = worst
        bf = _loaded(family, d / "ckpt", torch.bfloat16)
        out["batch bf16 vs authors' bf16 (rel)"] = _rel(bf.logits(inputs["batch"]), shift(ref["batch_bf16"]))
        out["authors' bf16 vs fp32 (rel, the noise floor)"] = _rel(ref["batch_bf16"], ref["batch"])
    if family == "llada" and (d / "gqa").is_dir():
        g_in, g_ref = torch.load(d / "gqa" / "inputs.pt"), torch.load(d / "gqa" / "logits.pt")
        with torch.no_grad():
            out["gqa batch fp32 (rel)"] = _rel(_loaded(family, d / "gqa" / "ckpt").logits(g_in["batch"]),
                                               g_ref["batch"])
    return out


def check_decoding(root: Path, family: str) -> dict[str, bool]:
    out = {}
    for variant in ("sharp", "base"):
        d = root / family / variant if variant == "sharp" else root / family
        ref = torch.load(d / ("logits_and_decode.pt" if variant == "sharp" else "decode.pt"))
        if variant == "base" and family == "dream":
            ref = {f"gen_{k[5:]}" if k.startswith("eval_") else
                   (f"gen_{k[8:]}_topp095" if k.startswith("topp095_") else k): v
                   for k, v in ref.items()}
        result = _decode(family, d, ref)
        out.update({f"{variant}: {k}": v for k, v in result.items()})
    return out


def _decode(family: str, d: Path, ref: dict) -> dict[str, bool]:
    lm = _loaded(family, d / "ckpt")
    out = {}
    if family == "llada":
        pol = make_policy(lm, policy="low_confidence", steps=16, gen_length=16, block_length=8,
                          temperature=0.0)
        prompt = ref["gen_prompt"][0].tolist()
        got = generate(lm, [prompt], pol)
        out["generate.py low_confidence 16/16/8"] = got[0].tolist() == ref["gen_output"][0, len(prompt):].tolist()
        return out
    batch = torch.load(d / "inputs.pt")["batch"]
    for name, top_p in (("", None), ("_topp095", 0.95)):
        pol = make_policy(lm, steps=16, gen_length=16, top_p=top_p)   # eval.py's defaults
        for key, rows in (("p0", [0]), ("p1", [1]), ("batch01", [0, 1])):
            want = ref.get(f"gen_{key}{name}")
            if want is None:
                continue
            got = generate(lm, [batch[r].tolist() for r in rows], pol)
            out[f"eval.py entropy{name} {key}"] = torch.equal(got, want[:, -16:])
    return out


def check_tokenizer(root: Path) -> dict[str, bool]:
    tok = load_hub_tokenizer(LAYOUTS["dream"], str(root / "dream" / "tok"))
    cases = json.loads((root / "dream" / "tok_ids.json").read_text())["cases"]
    same = [tok(c["text"] if "text" in c else c["string"], add_special_tokens=False)["input_ids"]
            == c["ids_add_special_tokens_false"] for c in cases]
    return {f"Qwen2Tokenizer == DreamTokenizer on {len(cases)} strings": all(same),
            "mask id": tok.convert_tokens_to_ids("<|mask|>") == 599}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for family in ("llada", "dream"):
        results[f"{family} logits"] = check_logits(args.root, family)
        results[f"{family} decoding"] = check_decoding(args.root, family)
    results["dream tokenizer"] = check_tokenizer(args.root)
    print(json.dumps(results, indent=1))
    failed = [k for group in results.values() for k, v in group.items() if v is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
