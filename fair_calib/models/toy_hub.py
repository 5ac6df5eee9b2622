"""Toy checkpoints in the released checkpoints' layout.

An embedded tiny model (a native bidirectional Llama / Qwen2 trained by
``fair_calib.models.tiny``) is written as the hub ships LLaDA or Dream: config.json with the
authors' field names, ``auto_map`` and ``mask_token_id``; sharded safetensors with the authors'
key names and their index; a tokenizer whose special tokens carry the family's names
(``<|mdm_mask|>``, ``<|eot_id|>``, ...). Every stage then reads it through the same code path
as a real checkpoint (``config/hub_layout.yaml``), which is how that path is exercised on CPU.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..jobs import io
from .hub import LAYOUTS, HubLayout, save_hub_layout
from .outliers import SITES, inject_outliers
from .tiny.tokenizer import BOS, EOS, MASK, PAD

# The tiny tokenizer's special tokens under each family's names. Dream's pad is its eos; the
# toy keeps them apart (its model was trained with a separate pad), under a Qwen pad name.
HUB_SPECIAL_TOKENS = {
    "llada": {MASK: "<|mdm_mask|>", EOS: "<|eot_id|>", PAD: "<|endoftext|>",
              BOS: "<|startoftext|>"},
    "dream": {MASK: "<|mask|>", EOS: "<|endoftext|>", PAD: "<|fim_pad|>",
              BOS: "<|beginoftext|>"},
}


def rename_special_tokens(tokenizer, names: dict[str, str]):
    """A copy of a fast tokenizer whose special tokens are renamed (same ids, same behaviour)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for old, new in names.items():
        vocab[new] = vocab.pop(old)
    for added in spec.get("added_tokens", []):
        added["content"] = names.get(added["content"], added["content"])
    spec["post_processor"] = _rename_in(spec.get("post_processor"), names)
    backend = Tokenizer.from_str(json.dumps(spec))
    specials = {attr: names.get(getattr(tokenizer, attr), getattr(tokenizer, attr))
                for attr in ("pad_token", "mask_token", "eos_token", "bos_token", "unk_token")}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, padding_side=tokenizer.padding_side,
        clean_up_tokenization_spaces=False, model_max_length=tokenizer.model_max_length,
        **specials)


def _rename_in(node, names: dict[str, str]):
    """Rename token strings anywhere in a post-processor spec (templates and special_tokens)."""
    if isinstance(node, dict):
        return {names.get(k, k): _rename_in(v, names) for k, v in node.items()}
    if isinstance(node, list):
        return [_rename_in(v, names) for v in node]
    if isinstance(node, str):
        return names.get(node, node)
    return node


def convert_tiny(src: str | Path, family: str, out_dir: str | Path,
                 max_shard_bytes: int = 256 * 1024, outliers: dict | None = None) -> Path:
    """Write the tiny model at ``src`` in ``family``'s hub layout at ``out_dir`` (atomically).

    Shards are small on purpose so the sharded-index path is the one exercised. ``outliers``
    (``channels``, ``scale``, ``seed``, ``sites``): give the model activation outliers first,
    function-preserving (``fair_calib.models.outliers``); what was done goes to
    ``outliers.json`` beside the weights."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from .adapters import get_adapter

    adapter = get_adapter(family)
    if adapter.hub_layout is None:
        raise ValueError(f"family {family!r} has no hub layout; choose one of "
                         f"{sorted(LAYOUTS)}")
    layout: HubLayout = LAYOUTS[adapter.hub_layout]
    model = AutoModelForCausalLM.from_pretrained(str(src))
    tokenizer = rename_special_tokens(PreTrainedTokenizerFast.from_pretrained(str(src)),
                                      HUB_SPECIAL_TOKENS[layout.name])
    mask_id = tokenizer.convert_tokens_to_ids(adapter.mask_token)
    record = None
    if outliers:
        record = inject_outliers(model, int(outliers["channels"]), float(outliers["scale"]),
                                 int(outliers.get("seed", 0)),
                                 tuple(outliers.get("sites", SITES)))
    from .finite import check_finite_weights

    check_finite_weights(model, f"{out_dir} (converted from {src})",
                         "nothing was written; lower outliers.scale" if outliers
                         else "nothing was written; retrain the source model")
    with io.atomic_dir(out_dir) as tmp:
        save_hub_layout(model, layout, tmp, max_shard_bytes=max_shard_bytes,
                        extra_config={"mask_token_id": int(mask_id),
                                      "pad_token_id": int(tokenizer.pad_token_id),
                                      "eos_token_id": int(tokenizer.eos_token_id)})
        tokenizer.save_pretrained(tmp)
        if record is not None:
            (Path(tmp) / "outliers.json").write_text(json.dumps(record, indent=1) + "\n")
    return Path(out_dir)


def run_cli(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="fair-calib convert-hub",
                                 description="write an embedded tiny model in a hub family's "
                                             "checkpoint layout")
    ap.add_argument("--src", required=True, help="tiny model folder (train-tiny output)")
    ap.add_argument("--family", required=True, help="hub family whose layout to write")
    ap.add_argument("--out", required=True, help="folder to write")
    ap.add_argument("--outliers", default="", help="JSON: channels, scale, seed, sites "
                                                   "(function-preserving activation outliers)")
    args = ap.parse_args(argv)
    out = convert_tiny(args.src, args.family, args.out,
                       outliers=json.loads(args.outliers) if args.outliers else None)
    print(json.dumps({"family": args.family, "out": str(out),
                      "files": sorted(p.name for p in out.iterdir())}))
