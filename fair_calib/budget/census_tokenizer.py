"""The census's tokenizers: the model's own where this machine has it, else a stand-in.

:func:`census_tokenizer` gives, per model of a config, the tokenizer its evaluation job would
load -- a tiny model's word-level tokenizer (built from the synthetic corpus exactly as
``train-tiny`` builds it, or read from the trained folder), a hub checkpoint's from its folder
or the Hugging Face cache (``fair_calib.models.hub.load_hub_tokenizer``, offline) -- or, where
none is on this machine (LLaDA-8B's and Dream-7B's live on the hub), :class:`StandInTokenizer`.

The stand-in counts a text's tokens as ``round(chars / ratio)`` with the characters-per-token
ratios of ``CHARS_PER_TOKEN`` (per family and lm-eval task, measured by
benchmarks/census_token_ratio.py with the closest tokenizers a package ships: Qwen2's BPE for
Dream -- the same ranks --, LLaMA-3's for LLaDA -- a proxy; per-document error there: mean
1-13%, 95th percentile 2-32%), each special token (BOS, chat headers) as one token, and renders
the Instruct models' chat templates as the released checkpoints' ``tokenizer_config.json``
write them (``CHAT_TEMPLATES``). A text's ids are runs counted up from a hash of each piece
between special tokens, so identical texts give identical ids (exact mode runs identical inputs
once) and others differ; a context's ids are never a prefix of its context + continuation's, so
a continuation is counted on its own, ``round(chars / ratio)`` (at least one). It adds no
special token of its own when asked to (``add_special_tokens``), as Dream's tokenizer.
"""
from __future__ import annotations

import re
import zlib
from pathlib import Path
from typing import Any, Mapping

# Characters per token, per family and lm-eval task (the longest name contained in the task's
# name applies: oc_mmlu_gen reads mmlu's; "*" any other), measured on every document of the
# offline copies with benchmarks/census_token_ratio.py (2026-11-27; Dream: qwen.tiktoken of the
# dashscope 2.0.2 wheel, Qwen2's BPE ranks; LLaDA: LLaMA-3's tokenizer.model of llama-models
# 0.3.0, a proxy). docs/benchmarks.md has the error table.
CHARS_PER_TOKEN: dict[str, dict[str, float]] = {
    "llada": {
        "piqa": 4.365, "boolq": 4.558, "winogrande": 4.887, "arc_easy": 5.063,
        "arc_challenge": 4.956, "hellaswag": 4.655, "truthfulqa_mc2": 4.217, "mmlu": 4.41,
        "gsm8k": 3.44, "gsm8k_cot": 3.335, "humaneval": 3.432, "humaneval_instruct": 3.58,
        "*": 4.299},
    "dream": {
        "piqa": 4.343, "boolq": 4.417, "winogrande": 4.887, "arc_easy": 5.043,
        "arc_challenge": 4.918, "hellaswag": 4.641, "truthfulqa_mc2": 4.054, "mmlu": 4.329,
        "gsm8k": 3.032, "gsm8k_cot": 3.124, "humaneval": 3.36, "humaneval_instruct": 3.512,
        "*": 4.174},
}

# The released Instruct checkpoints' chat templates (tokenizer_config.json of
# GSAI-ML/LLaDA-8B-Instruct: LLaMA-3's header turns after its BOS; Dream-org/Dream-v0-Instruct-7B:
# Qwen2's ChatML with its default system turn), without the tool-call branches no task uses.
CHAT_TEMPLATES = {
    "llada": (
        "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] "
        "+ '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
        "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
        "{{ content }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"),
    "dream": (
        "{% if messages[0]['role'] == 'system' %}{{ '<|im_start|>system\n' + "
        "messages[0]['content'] + '<|im_end|>\n' }}{% else %}"
        "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
        "{% for message in messages %}{% if not (message['role'] == 'system' and loop.first) %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
        "{% endif %}"),
}
SPECIAL_TOKENS = {   # (bos, eos, the others a template writes)
    "llada": ("<|startoftext|>", "<|eot_id|>", ("<|start_header_id|>", "<|end_header_id|>",
                                                "<|endoftext|>", "<|mdm_mask|>")),
    "dream": ("<|beginoftext|>", "<|endoftext|>", ("<|im_start|>", "<|im_end|>", "<|mask|>")),
}


def chars_per_token(family: str, task: str) -> float:
    ratios = CHARS_PER_TOKEN[family]
    known = [k for k in ratios if k != "*" and k in task]
    return ratios[max(known, key=len)] if known else ratios["*"]


class StandInTokenizer:
    """A tokenizer's interface (``__call__``, ``bos_token``, ``eos_token``,
    ``apply_chat_template``, ``convert_tokens_to_ids``) counting ``round(chars / ratio)`` tokens
    a text and one a special token."""

    def __init__(self, family: str, task: str):
        if family not in CHARS_PER_TOKEN:
            raise KeyError(f"census: no stand-in tokenizer for family {family!r} (known: "
                           f"{sorted(CHARS_PER_TOKEN)}); give its tokenizer with --tokenizer")
        self.family, self.ratio = family, chars_per_token(family, task)
        self.bos_token, self.eos_token, others = SPECIAL_TOKENS[family]
        self._special = {t: -(i + 1) for i, t in enumerate((self.bos_token, self.eos_token,
                                                             *others))}
        self._split = re.compile("(" + "|".join(re.escape(t) for t in self._special) + ")")
        self.eos_token_id = self._special[self.eos_token]
        self.chat_template = CHAT_TEMPLATES[family]
        self._template = None                   # compiled on first use
        self.name_or_path = f"stand-in-{family}"

    def _ids(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._split.split(text):
            if piece in self._special:
                ids.append(self._special[piece])
            elif piece:      # a run of ids from the piece's hash: equal pieces, equal ids
                base = zlib.crc32(piece.encode()) << 20
                ids += range(base, base + max(1, round(len(piece) / self.ratio)))
        return ids

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self._ids(text)}

    def convert_tokens_to_ids(self, token: str) -> int | None:
        return self._special.get(token)

    def apply_chat_template(self, messages, tokenize: bool = False,
                            add_generation_prompt: bool = False,
                            continue_final_message: bool = False, **_: Any) -> str:
        if self._template is None:
            import jinja2

            self._template = jinja2.Environment().from_string(self.chat_template)
        text = self._template.render(messages=messages, bos_token=self.bos_token,
                                     add_generation_prompt=add_generation_prompt)
        if continue_final_message:      # as transformers: cut after the last turn's content
            last = messages[-1]["content"].strip()
            text = text[:text.rindex(last) + len(last)]
        return text


# Model context when the checkpoint's config is not on this machine (config.json of the releases:
# LLaDA's max_sequence_length, Dream's max_position_embeddings).
STAND_IN_CONTEXT = {"llada": 4096, "dream": 131072}


def census_tokenizer(cfg: Mapping[str, Any], model: str, task: str, synthetic_dir: Path,
                     given: Mapping[str, str] | None = None) -> tuple[Any, int, str]:
    """``(tokenizer, model context, what it is)`` of ``model``'s evaluation: ``given``
    (``{model or family: tokenizer folder}``), the trained tiny model's or the one
    ``train-tiny`` builds, the checkpoint's (folder or Hugging Face cache), else the stand-in."""
    entry = cfg["models"][model]
    family = entry["family"]
    given = dict(given or {})
    folder = given.get(model) or given.get(family)
    if folder:
        return _folder_tokenizer(folder, family), _context(folder, family), f"{folder}"
    if entry.get("source") in ("train", "convert"):        # the embedded tiny models
        return _tiny_tokenizer(cfg, model, synthetic_dir)
    from fair_calib.models.adapters import get_adapter

    source = str(entry["source"])
    if get_adapter(family).hub_layout:
        tok = _cached_hub_tokenizer(family, source)
        if tok is not None:
            return tok, _context(source, family), f"{source}'s"
    return StandInTokenizer(family, task), STAND_IN_CONTEXT.get(family, 4096), "stand-in"


def _tiny_tokenizer(cfg, model: str, synthetic_dir: Path):
    from fair_calib.models.tiny.tokenizer import build_tokenizer
    from fair_calib.models.tiny.train import model_max_positions

    entry = cfg["models"][model]
    base = entry.get("convert_from", model)
    trained = Path("resources/models") / base
    if (trained / "tokenizer.json").is_file():
        tok = _folder_tokenizer(str(trained), cfg["models"][base]["family"])
        return tok, _context(str(trained), "tiny"), str(trained)
    train = cfg["models"][base].get("train") or {}
    return (build_tokenizer(Path(synthetic_dir) / "train.txt"), model_max_positions(train),
            "train-tiny's (from the synthetic corpus)")


def _folder_tokenizer(folder: str, family: str):
    if family.startswith("tiny-"):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder)
    from fair_calib.models.adapters import get_adapter
    from fair_calib.models.hub import LAYOUTS, load_hub_tokenizer

    return load_hub_tokenizer(LAYOUTS[get_adapter(family).hub_layout], folder)


def _cached_hub_tokenizer(family: str, source: str):
    """The checkpoint's tokenizer from its folder or the Hugging Face cache (never the hub);
    None where this machine has neither."""
    folder = Path(source)
    if not folder.is_dir():
        if source.count("/") != 1:
            return None
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "tokenizer_config.json")
        if not isinstance(cached, str):
            return None
        folder = Path(cached).parent
    try:
        return _folder_tokenizer(str(folder), family)
    except (OSError, ValueError):
        return None


def _context(source: str, family: str) -> int:
    """The checkpoint's context (``max_position_embeddings`` / ``max_sequence_length``)."""
    import json

    cfg_file = Path(source) / "config.json"
    if cfg_file.is_file():
        c = json.loads(cfg_file.read_text())
        for key in ("max_position_embeddings", "max_sequence_length", "n_positions"):
            if isinstance(c.get(key), int) and c[key] > 0:
                return c[key]
    return STAND_IN_CONTEXT.get(family, 4096)
