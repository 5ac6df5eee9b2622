"""Model families as data.

An adapter says everything the pipeline must know about a family of diffusion LMs: how to
load it, its mask token, whether its logits are shifted, where its transformer blocks, final
norm, embedding and LM head live, its special tokens, whether it uses a chat template, and its
default decoding policy. Quantization, probing, decoding and evaluation code read the adapter and
never branch on a family name; adding a family is one entry in ``ADAPTERS``.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class FamilyAdapter:
    name: str
    # Hub ids this family covers; ``trust_remote_code`` is granted only to these (or by an
    # explicit ``trust_remote_code: true`` in the model's config entry).
    hub_ids: tuple[str, ...]
    remote_code: bool
    mask_token: str
    mask_id: int | None          # None: look ``mask_token`` up in the tokenizer
    logit_shift: bool            # True: logits at i-1 predict token i (Dream, tiny-dream)
    embed_path: str              # dotted paths inside the loaded model
    blocks_path: str
    final_norm_path: str
    head_path: str
    chat_template: bool          # Instruct models format prompts with the tokenizer's template
    decoding: dict[str, Any] = field(default_factory=dict)  # default policy and its settings
    likelihood: dict[str, Any] = field(default_factory=dict)  # MC likelihood estimator settings
    eos_token: str | None = None
    pad_token: str | None = None

    def resolve_mask_id(self, tokenizer) -> int:
        if self.mask_id is not None:
            return self.mask_id
        mid = tokenizer.convert_tokens_to_ids(self.mask_token)
        if mid is None or mid == tokenizer.unk_token_id:
            raise ValueError(f"adapter {self.name!r}: tokenizer has no mask token {self.mask_token!r}")
        return int(mid)


ADAPTERS: dict[str, FamilyAdapter] = {}


def register_adapter(adapter: FamilyAdapter) -> FamilyAdapter:
    ADAPTERS[adapter.name] = adapter
    return adapter


register_adapter(FamilyAdapter(
    name="llada",
    hub_ids=("GSAI-ML/LLaDA-8B-Base", "GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-1.5"),
    remote_code=True, mask_token="<|mdm_mask|>", mask_id=126336, logit_shift=False,
    embed_path="model.transformer.wte", blocks_path="model.transformer.blocks",
    final_norm_path="model.transformer.ln_f",
    # LLaDA's LM head is ``transformer.ff_out``; the down-projection inside every block is also
    # named ``ff_out``. Paths here are absolute, so the two are never confused.
    head_path="model.transformer.ff_out",
    chat_template=True,
    decoding={"policy": "low_confidence", "steps": 256, "gen_length": 256, "block_length": 8,
              "temperature": 0.0, "cfg_scale": 0.0},
    likelihood={"estimator": "llada", "mc_num": 128, "batch_size": 8, "cfg_scale": 0.0,
                "exact_below": 2},
    eos_token="<|eot_id|>", pad_token="<|endoftext|>",
))

register_adapter(FamilyAdapter(
    name="dream",
    hub_ids=("Dream-org/Dream-v0-Base-7B", "Dream-org/Dream-v0-Instruct-7B"),
    remote_code=True, mask_token="<|mask|>", mask_id=151666, logit_shift=True,
    embed_path="model.embed_tokens", blocks_path="model.layers", final_norm_path="model.norm",
    head_path="lm_head", chat_template=True,
    decoding={"policy": "entropy", "steps": 256, "gen_length": 256, "temperature": 0.0,
              "alg_temp": 0.0, "eps": 1e-3},
    likelihood={"estimator": "dream", "mc_num": 128, "batch_size": 32, "eps": 1e-3,
                "exact_below": 0},
    eos_token="<|endoftext|>", pad_token="<|endoftext|>",
))

# The embedded tiny families: plain transformers Llama / Qwen2 classes with bidirectional
# attention (``is_causal=False``), trained by ``fair_calib.models.tiny``.
register_adapter(FamilyAdapter(
    name="tiny-llada", hub_ids=(), remote_code=False, mask_token="[MASK]", mask_id=None,
    logit_shift=False, embed_path="model.embed_tokens", blocks_path="model.layers",
    final_norm_path="model.norm", head_path="lm_head", chat_template=False,
    decoding={"policy": "low_confidence", "steps": 16, "gen_length": 16, "block_length": 8,
              "temperature": 0.0, "cfg_scale": 0.0},
    likelihood={"estimator": "llada", "mc_num": 16, "batch_size": 16, "cfg_scale": 0.0,
                "exact_below": 2},
    eos_token="[EOS]", pad_token="[PAD]",
))

register_adapter(FamilyAdapter(
    name="tiny-dream", hub_ids=(), remote_code=False, mask_token="[MASK]", mask_id=None,
    logit_shift=True, embed_path="model.embed_tokens", blocks_path="model.layers",
    final_norm_path="model.norm", head_path="lm_head", chat_template=False,
    decoding={"policy": "entropy", "steps": 16, "gen_length": 16, "temperature": 0.0,
              "alg_temp": 0.0, "eps": 1e-3},
    likelihood={"estimator": "dream", "mc_num": 16, "batch_size": 16, "eps": 1e-3},
    eos_token="[EOS]", pad_token="[PAD]",
))


def get_adapter(family: str) -> FamilyAdapter:
    try:
        return ADAPTERS[family]
    except KeyError:
        raise KeyError(f"unknown model family {family!r}; registered: {sorted(ADAPTERS)}") from None


def get_module(root: nn.Module, dotted: str) -> nn.Module:
    """Resolve an absolute dotted path (``model.layers``) below ``root``."""
    mod = root
    for part in dotted.split("."):
        if not hasattr(mod, part):
            raise AttributeError(f"{type(root).__name__} has no module at {dotted!r} (missing {part!r})")
        mod = getattr(mod, part)
    return mod


@dataclass
class LoadedModel:
    """A model with its tokenizer and adapter; ``logits`` is the one forward everyone calls."""
    model: nn.Module
    tokenizer: Any
    adapter: FamilyAdapter
    mask_id: int
    pad_id: int
    eos_id: int | None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def blocks(self) -> nn.ModuleList:
        return get_module(self.model, self.adapter.blocks_path)

    @property
    def head(self) -> nn.Module:
        return get_module(self.model, self.adapter.head_path)

    @property
    def final_norm(self) -> nn.Module:
        return get_module(self.model, self.adapter.final_norm_path)

    @property
    def embed(self) -> nn.Module:
        return get_module(self.model, self.adapter.embed_path)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               keep_last: int | None = None) -> torch.Tensor:
        """Per-position logits aligned so that ``logits[:, i]`` predicts token ``i``.

        With left padding, pass the 2-D ``attention_mask``; position ids then count from the
        first real token, so a padded row gives the same logits as the row alone. Pass ``None``
        when no row is padded: attention then runs without a mask tensor (the fast kernels).
        ``keep_last=K`` returns only the last ``K`` positions' logits, and the LM head runs only
        there when the model supports it (``logits_to_keep``): decoding needs just the window.
        """
        kwargs: dict[str, Any] = {}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
            if _accepts(self.model, "position_ids") and not bool(attention_mask.all()):
                kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        length = input_ids.shape[1]
        # A shifted family needs one more position: the prediction for i comes from i-1.
        need = None if keep_last is None else keep_last + int(self.adapter.logit_shift)
        if need is not None and need < length and _accepts(self.model, "logits_to_keep", strict=True):
            kwargs["logits_to_keep"] = need
        out = self.model(input_ids=input_ids, **kwargs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        if need is not None and need < length:
            logits = logits[:, -need:]
            return logits[:, :-1] if self.adapter.logit_shift else logits
        if self.adapter.logit_shift:
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits if keep_last is None else logits[:, -keep_last:]


@functools.lru_cache(maxsize=64)
def _forward_params(model_type: type) -> tuple[frozenset, bool]:
    params = inspect.signature(model_type.forward).parameters
    return frozenset(params), any(p.kind is p.VAR_KEYWORD for p in params.values())


def _accepts(model: nn.Module, name: str, strict: bool = False) -> bool:
    """Whether ``model.forward`` takes ``name``. LLaDA's remote code takes no ``position_ids``
    (its padded rows then keep absolute positions, as in the authors' own batched decoding).
    ``strict``: a ``**kwargs`` catch-all does not count (it may silently ignore the key)."""
    names, var_kw = _forward_params(type(model))
    return name in names or (var_kw and not strict)


def _trust_remote_code(adapter: FamilyAdapter, source: str, explicit: bool | None) -> bool:
    if explicit is not None:
        return explicit
    return adapter.remote_code and source in adapter.hub_ids


def load_model(source: str | Path, family: str, dtype: str | torch.dtype = "float32",
               device: str = "cpu", trust_remote_code: bool | None = None) -> LoadedModel:
    """Load a checkpoint (hub id or local folder) through its family adapter."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    adapter = get_adapter(family)
    source = str(source)
    if Path(source).exists() is False and "/" not in source:
        raise FileNotFoundError(f"model source {source!r} is neither a local folder nor a hub id")
    trust = _trust_remote_code(adapter, source, trust_remote_code)
    if adapter.remote_code and not trust and not Path(source).exists():
        raise PermissionError(
            f"{source!r} (family {family!r}) needs trust_remote_code, which is only granted to "
            f"{list(adapter.hub_ids)}; set trust_remote_code: true in its config entry to allow it")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    if (Path(source) / "fair_calib.json").is_file():
        # An embedded tiny model (``fair_calib.models.tiny``): load its word-level tokenizer as
        # saved. AutoTokenizer would force the model type's own class for some types (qwen2),
        # which rebuilds a byte-level BPE and ignores tokenizer.json.
        from transformers import PreTrainedTokenizerFast
        tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust)
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust)
    loader = AutoModel if adapter.remote_code else AutoModelForCausalLM
    model = loader.from_pretrained(source, config=config, dtype=torch_dtype,
                                   trust_remote_code=trust)
    model.to(device).eval()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    mask_id = adapter.resolve_mask_id(tokenizer)
    pad_id = tokenizer.pad_token_id
    if pad_id is None and adapter.pad_token:
        pad_id = tokenizer.convert_tokens_to_ids(adapter.pad_token)
    eos_id = tokenizer.convert_tokens_to_ids(adapter.eos_token) if adapter.eos_token else tokenizer.eos_token_id
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, mask_id=int(mask_id),
                       pad_id=int(pad_id if pad_id is not None else eos_id), eos_id=eos_id)


def with_overrides(adapter: FamilyAdapter, **changes: Any) -> FamilyAdapter:
    return dataclasses.replace(adapter, **changes)
