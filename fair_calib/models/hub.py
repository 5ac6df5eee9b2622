"""Hub checkpoints of LLaDA and Dream on transformers' own (native) classes.

The model authors ship their checkpoints with ``trust_remote_code`` modeling files written for
transformers 4.x. Both families are plain pre-norm decoders with bidirectional attention:
LLaDA is a Llama-style decoder (RMSNorm, RoPE, SwiGLU, no biases) under other names, Dream is
Qwen2 (q/k/v biases, GQA) with the hub's own names. A :class:`HubLayout` is the data that maps
one onto the other, in both directions:

* the hub ``config.json`` -> the native config's fields (every field the authors' forward
  reads is either translated or checked to hold the one value the native class implements; any
  other value is refused with the field's name, never silently approximated);
* the hub state-dict key names -> the native key names (prefix templates, ``{i}`` = block).

Loading runs no remote code, gives SDPA attention with a real padding mask and position ids,
and loads the safetensors shards in the target dtype without a float32 copy. LLaDA's
``rope_full_precision`` is honoured: q and k rotate in float32 as in the authors' forward. Only
the transformers versions of :data:`SUPPORTED_TRANSFORMERS` are accepted. The inverse
direction (:func:`save_hub_layout`) writes a native model in the hub's file layout, config field
names and key names: the toy real-layout checkpoints of the tests and of ``config/hub_layout.yaml``,
and the random 8B-shaped checkpoints of ``benchmarks/gpu_trained.py`` (its grid phase).
"""
from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn


class HubConfigError(ValueError):
    """A hub config.json the native mapping cannot reproduce exactly (names the field)."""


def rotary_in_model_dtype(cfg: dict) -> bool:
    """A layout whose authors rotate q and k in the model dtype, as transformers does."""
    return False


@dataclass(frozen=True)
class HubLayout:
    name: str
    model_types: tuple[str, ...]            # config.json ``model_type`` values this layout reads
    native_arch: str                        # "llama" | "qwen2": the transformers class it maps onto
    key_map: tuple[tuple[str, str], ...]    # (hub prefix, native prefix); ``{i}`` = block index
    to_native: Callable[[dict], dict]       # hub config.json -> native config kwargs
    to_hub: Callable[[Any], dict]           # native config -> hub config.json fields
    # For folders without tokenizer.json (Dream ships vocab.json + merges.txt and a remote-code
    # tokenizer class): the transformers class that builds the same tokenizer.
    tokenizer_class: str | None = None
    # hub config.json -> whether the authors' forward rotates q and k in float32 whatever the
    # model dtype (LLaDA's ``rope_full_precision``); False: rotary in the model dtype, as
    # transformers' native classes do.
    rotary_float32: Callable[[dict], bool] = rotary_in_model_dtype
    # True: the authors compute the rotary frequencies on the GPU the model runs on (LLaDA's
    # cache is built on ``cuda`` whenever one exists); transformers computes ``inv_freq`` once on
    # the CPU, and CPU and CUDA ``pow`` differ in the last bit for a few frequencies.
    rotary_on_device: bool = False

    # ------------------------------------------------------------------ key names
    @functools.cached_property
    def _hub_to_native(self) -> list[tuple[re.Pattern, str]]:
        return self._compile(forward=True)

    @functools.cached_property
    def _native_to_hub(self) -> list[tuple[re.Pattern, str]]:
        return self._compile(forward=False)

    def _compile(self, forward: bool) -> list[tuple[re.Pattern, str]]:
        rules = []
        for hub, native in self.key_map:
            src, dst = (hub, native) if forward else (native, hub)
            pattern = "^" + re.escape(src).replace(r"\{i\}", r"(\d+)")
            rules.append((re.compile(pattern), dst.replace("{i}", r"\1")))
        return rules

    def hub_key(self, native_key: str) -> str | None:
        for pattern, repl in self._native_to_hub:
            if pattern.match(native_key):
                return pattern.sub(repl, native_key, count=1)
        return None

    def key_mapping(self) -> dict[str, str]:
        """The mapping as regexes for ``from_pretrained(key_mapping=...)``."""
        return {p.pattern: r for p, r in self._hub_to_native}


# ---------------------------------------------------------------------------------- LLaDA
# Defaults of the authors' ``ModelConfig`` (configuration_llada.py) for the fields read here:
# a config.json that omits a field gets the value the authors' code would use.
_LLADA_DEFAULTS: dict[str, Any] = {
    "n_kv_heads": None, "mlp_ratio": 4, "mlp_hidden_size": None, "activation_type": "swiglu",
    "block_type": "sequential", "block_group_size": 1, "alibi": False, "rope": False,
    "multi_query_attention": None, "attention_layer_norm": False, "input_emb_norm": False,
    "layer_norm_type": "default", "layer_norm_with_affine": True, "rms_norm_eps": 1e-5,
    "max_sequence_length": 1024, "rope_theta": 10000.0, "include_qkv_bias": False,
    "include_bias": False, "bias_for_layer_norm": None, "scale_logits": False,
    "vocab_size": 50257, "embedding_size": 50304, "weight_tying": True, "eos_token_id": 50256,
    "pad_token_id": 50256, "mask_token_id": 50256, "rope_full_precision": True,
}

# The one value of each field that the Llama mapping reproduces exactly (LLaDA-8B's values).
_LLADA_REQUIRED: dict[str, Any] = {
    "block_type": "llama", "activation_type": "silu", "layer_norm_type": "rms", "rope": True,
    "alibi": False, "block_group_size": 1, "attention_layer_norm": False,
    "input_emb_norm": False, "scale_logits": False, "include_bias": False,
    "include_qkv_bias": False, "layer_norm_with_affine": True,
}


def _llada_field(cfg: dict, name: str) -> Any:
    return cfg[name] if name in cfg and cfg[name] is not None else _LLADA_DEFAULTS.get(name)


def _llada_kv_heads(cfg: dict) -> int:
    """``effective_n_kv_heads`` of the authors' config."""
    n_heads, n_kv = int(cfg["n_heads"]), _llada_field(cfg, "n_kv_heads")
    mqa = cfg.get("multi_query_attention")
    if n_kv is None:
        return 1 if mqa else n_heads
    if mqa is not None and int(n_kv) != (1 if mqa else n_heads):
        raise HubConfigError(f"config.json: n_kv_heads={n_kv} contradicts "
                             f"multi_query_attention={mqa}")
    return int(n_kv)


def _check_required(cfg: dict, required: dict[str, Any], family: str,
                    read: Callable[[dict, str], Any]) -> None:
    for key, want in required.items():
        got = read(cfg, key)
        if got != want:
            raise HubConfigError(
                f"config.json: {key}={got!r} is not supported by the native {family} mapping "
                f"(it reproduces {key}={want!r}, the released checkpoints' value); load this "
                f"checkpoint with loader: remote on a transformers version its code supports")


def _require_fields(cfg: dict, names: tuple[str, ...], family: str) -> None:
    missing = [n for n in names if n not in cfg]
    if missing:
        raise HubConfigError(f"config.json of a {family} checkpoint lacks {missing}")


def llada_to_native(cfg: dict) -> dict:
    _require_fields(cfg, ("d_model", "n_heads", "n_layers", "vocab_size"), "LLaDA")
    _check_required(cfg, _LLADA_REQUIRED, "LLaDA", _llada_field)
    if _llada_field(cfg, "bias_for_layer_norm"):
        raise HubConfigError("config.json: bias_for_layer_norm=True is not supported by the "
                             "native LLaDA mapping (RMSNorm without bias)")
    d_model, n_heads = int(cfg["d_model"]), int(cfg["n_heads"])
    if d_model % n_heads:
        raise HubConfigError(f"config.json: d_model={d_model} is not divisible by n_heads={n_heads}")
    hidden = _llada_field(cfg, "mlp_hidden_size") or _llada_field(cfg, "mlp_ratio") * d_model
    # The embedding and the head have ``embedding_size`` rows (padded vocabulary); the logits
    # the authors' forward returns have that many columns, and so do ours.
    rows = _llada_field(cfg, "embedding_size") or int(cfg["vocab_size"])
    return dict(
        vocab_size=int(rows), hidden_size=d_model, intermediate_size=int(hidden),
        num_hidden_layers=int(cfg["n_layers"]), num_attention_heads=n_heads,
        num_key_value_heads=_llada_kv_heads(cfg), head_dim=d_model // n_heads,
        hidden_act="silu", max_position_embeddings=int(_llada_field(cfg, "max_sequence_length")),
        rms_norm_eps=float(_llada_field(cfg, "rms_norm_eps")),
        rope_parameters={"rope_type": "default",
                         "rope_theta": float(_llada_field(cfg, "rope_theta"))},
        tie_word_embeddings=bool(_llada_field(cfg, "weight_tying")),
        attention_bias=False, mlp_bias=False, attention_dropout=0.0,
        pad_token_id=_llada_field(cfg, "pad_token_id"), eos_token_id=_llada_field(cfg, "eos_token_id"),
        bos_token_id=None,
    )


def llada_rotary_float32(cfg: dict) -> bool:
    """``rope_full_precision`` (default True, as in the released config.json): the authors'
    ``RotaryEmbedding.forward`` casts q and k to float32, rotates with float32 sin/cos and
    autocast off, and casts the result back to the model dtype."""
    return bool(_llada_field(cfg, "rope_full_precision"))


def llada_to_hub(native) -> dict:
    """The hub config.json fields of the authors' LLaDA for a native Llama config."""
    theta = (native.rope_parameters or {}).get("rope_theta", 10000.0)
    return {
        "architectures": ["LLaDAModelLM"], "model_type": "llada",
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "d_model": native.hidden_size, "n_heads": native.num_attention_heads,
        "n_kv_heads": native.num_key_value_heads, "n_layers": native.num_hidden_layers,
        "mlp_hidden_size": native.intermediate_size, "mlp_ratio": 4,
        "activation_type": "silu", "block_type": "llama", "block_group_size": 1,
        "alibi": False, "alibi_bias_max": 8.0, "rope": True, "rope_full_precision": True,
        "rope_theta": float(theta), "flash_attention": False, "attention_dropout": 0.0,
        "multi_query_attention": None, "attention_layer_norm": False,
        "attention_layer_norm_with_affine": True, "residual_dropout": 0.0,
        "embedding_dropout": 0.0, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "bias_for_layer_norm": False,
        "rms_norm_eps": native.rms_norm_eps, "max_sequence_length": native.max_position_embeddings,
        "include_qkv_bias": False, "include_bias": False, "scale_logits": False,
        "vocab_size": native.vocab_size, "embedding_size": native.vocab_size,
        "weight_tying": bool(native.tie_word_embeddings),
        "eos_token_id": native.eos_token_id, "pad_token_id": native.pad_token_id,
        "init_device": "meta", "init_fn": "mitchell", "init_std": 0.02,
        "init_cutoff_factor": None, "precision": "amp_bf16", "use_cache": False,
    }


LLADA_LAYOUT = HubLayout(
    name="llada", model_types=("llada",), native_arch="llama",
    key_map=(
        ("model.transformer.wte.", "model.embed_tokens."),
        ("model.transformer.ln_f.", "model.norm."),
        # The LM head; the block-internal down-projection below has the same last name.
        ("model.transformer.ff_out.", "lm_head."),
        ("model.transformer.blocks.{i}.attn_norm.", "model.layers.{i}.input_layernorm."),
        ("model.transformer.blocks.{i}.ff_norm.", "model.layers.{i}.post_attention_layernorm."),
        ("model.transformer.blocks.{i}.q_proj.", "model.layers.{i}.self_attn.q_proj."),
        ("model.transformer.blocks.{i}.k_proj.", "model.layers.{i}.self_attn.k_proj."),
        ("model.transformer.blocks.{i}.v_proj.", "model.layers.{i}.self_attn.v_proj."),
        ("model.transformer.blocks.{i}.attn_out.", "model.layers.{i}.self_attn.o_proj."),
        # SwiGLU: silu(ff_proj(x)) * up_proj(x), so ff_proj is the gate.
        ("model.transformer.blocks.{i}.ff_proj.", "model.layers.{i}.mlp.gate_proj."),
        ("model.transformer.blocks.{i}.up_proj.", "model.layers.{i}.mlp.up_proj."),
        ("model.transformer.blocks.{i}.ff_out.", "model.layers.{i}.mlp.down_proj."),
    ),
    to_native=llada_to_native, to_hub=llada_to_hub, rotary_float32=llada_rotary_float32,
    rotary_on_device=True,
)


# ---------------------------------------------------------------------------------- Dream
_DREAM_DEFAULTS: dict[str, Any] = {   # DreamConfig.__init__ defaults (configuration_dream.py)
    "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "hidden_act": "silu", "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "rope_theta": 10000.0, "rope_scaling": None,
    "mask_token_id": 151666, "pad_token_id": 151643,
}


def _dream_field(cfg: dict, name: str) -> Any:
    return cfg[name] if name in cfg else _DREAM_DEFAULTS.get(name)


def dream_to_native(cfg: dict) -> dict:
    scaling = _dream_field(cfg, "rope_scaling")
    if scaling not in (None, {}) and (scaling or {}).get("rope_type", scaling.get("type")) != "default":
        raise HubConfigError(f"config.json: rope_scaling={scaling!r} is not supported by the "
                             "native Dream mapping (the released checkpoints use none)")
    if _dream_field(cfg, "hidden_act") != "silu":
        raise HubConfigError(f"config.json: hidden_act={cfg.get('hidden_act')!r}; the native "
                             "Dream mapping reproduces 'silu'")
    kv = _dream_field(cfg, "num_key_value_heads") or _dream_field(cfg, "num_attention_heads")
    return dict(
        vocab_size=int(_dream_field(cfg, "vocab_size")),
        hidden_size=int(_dream_field(cfg, "hidden_size")),
        intermediate_size=int(_dream_field(cfg, "intermediate_size")),
        num_hidden_layers=int(_dream_field(cfg, "num_hidden_layers")),
        num_attention_heads=int(_dream_field(cfg, "num_attention_heads")),
        num_key_value_heads=int(kv), hidden_act="silu",
        max_position_embeddings=int(_dream_field(cfg, "max_position_embeddings")),
        rms_norm_eps=float(_dream_field(cfg, "rms_norm_eps")),
        rope_parameters={"rope_type": "default",
                         "rope_theta": float(_dream_field(cfg, "rope_theta"))},
        tie_word_embeddings=bool(_dream_field(cfg, "tie_word_embeddings")),
        # The authors' SDPA attention ignores ``use_sliding_window`` (it only warns), so every
        # layer attends to the whole sequence; so does ours, whatever the field says.
        use_sliding_window=False, attention_dropout=0.0,
        pad_token_id=_dream_field(cfg, "pad_token_id"), eos_token_id=cfg.get("eos_token_id"),
        bos_token_id=cfg.get("bos_token_id"),
    )


def dream_to_hub(native) -> dict:
    theta = (native.rope_parameters or {}).get("rope_theta", 10000.0)
    return {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "vocab_size": native.vocab_size, "hidden_size": native.hidden_size,
        "intermediate_size": native.intermediate_size,
        "num_hidden_layers": native.num_hidden_layers,
        "num_attention_heads": native.num_attention_heads,
        "num_key_value_heads": native.num_key_value_heads, "hidden_act": "silu",
        "max_position_embeddings": native.max_position_embeddings, "initializer_range": 0.02,
        "rms_norm_eps": native.rms_norm_eps, "use_cache": False,
        "tie_word_embeddings": bool(native.tie_word_embeddings), "rope_theta": float(theta),
        "rope_scaling": None, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": native.num_hidden_layers, "attention_dropout": 0.0,
        "bos_token_id": native.bos_token_id, "eos_token_id": native.eos_token_id,
        "pad_token_id": native.pad_token_id,
    }


DREAM_LAYOUT = HubLayout(
    name="dream", model_types=("Dream", "dream"), native_arch="qwen2",
    # Dream's names are Qwen2's own.
    key_map=(("model.", "model."), ("lm_head.", "lm_head.")),
    to_native=dream_to_native, to_hub=dream_to_hub, tokenizer_class="Qwen2Tokenizer",
)

LAYOUTS: dict[str, HubLayout] = {layout.name: layout for layout in (LLADA_LAYOUT, DREAM_LAYOUT)}


# ---------------------------------------------------------------------------------- loading
def _native_classes(arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    return {"llama": (LlamaConfig, LlamaForCausalLM),
            "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]


def read_hub_config(source: str) -> dict:
    """The raw config.json of a local folder or a hub id (the HF cache; offline with
    ``HF_HUB_OFFLINE=1``), without importing any remote code."""
    from transformers import PretrainedConfig
    try:
        cfg, _ = PretrainedConfig.get_config_dict(source)
    except OSError as err:
        raise FileNotFoundError(f"cannot read config.json of {source!r}: {err}") from None
    return cfg


def native_config(layout: HubLayout, hub_cfg: dict, source: str = "config.json"):
    mtype = hub_cfg.get("model_type")
    if mtype not in layout.model_types:
        raise HubConfigError(f"{source}: model_type={mtype!r} is not a {layout.name} checkpoint "
                             f"(expected one of {list(layout.model_types)})")
    config_cls, _ = _native_classes(layout.native_arch)
    cfg = config_cls(**layout.to_native(hub_cfg))
    # Both families attend bidirectionally (transformers builds a padding-only mask).
    cfg.is_causal = False
    cfg.use_cache = False
    return cfg


# The transformers versions whose native classes this mapping is written for (pyproject's
# ``transformers>=5.5,<6``): the config fields it sets (``rope_parameters``), the rotary and
# attention interfaces it hooks. Under 4.x the native classes read ``rope_theta`` instead and
# silently run with theta 10000; other majors are unchecked.
SUPPORTED_TRANSFORMERS = ((5, 5), (6, 0))         # [lowest, first unsupported)


class UnsupportedTransformersError(RuntimeError):
    """The installed transformers is outside the range the native mapping supports."""


def supported_transformers_text() -> str:
    (lo_major, lo_minor), (hi_major, _) = SUPPORTED_TRANSFORMERS
    return f">={lo_major}.{lo_minor},<{hi_major}"


def check_transformers_version(version: str | None = None) -> None:
    """Refuse, by name, a transformers the native loader does not support."""
    import transformers
    from packaging.version import InvalidVersion, Version

    version = transformers.__version__ if version is None else version
    try:
        release = Version(version).release[:2]
    except InvalidVersion:
        release = None
    lo, hi = SUPPORTED_TRANSFORMERS
    if release is None or not lo <= tuple(release) < hi:
        raise UnsupportedTransformersError(
            f"transformers {version} is not supported by the native LLaDA/Dream loader "
            f"(supported: transformers{supported_transformers_text()}, as in pyproject.toml); "
            f"under 4.x its classes ignore the checkpoints' rotary settings. Install a "
            f"supported version (loader: remote, the authors' own files, needs 4.x instead)")


def load_native_model(layout: HubLayout, source: str, dtype: torch.dtype,
                      hub_cfg: dict | None = None) -> nn.Module:
    """The checkpoint at ``source`` on the native class, every tensor accounted for
    (``hub_cfg``: its config.json when the caller has read it already)."""
    check_transformers_version()
    hub_cfg = read_hub_config(source) if hub_cfg is None else hub_cfg
    cfg = native_config(layout, hub_cfg, source)
    _, model_cls = _native_classes(layout.native_arch)
    float32_rotary = layout.rotary_float32(hub_cfg)
    attention = register_float32_rotary_attention() if float32_rotary else "sdpa"
    model, info = model_cls.from_pretrained(
        source, config=cfg, dtype=dtype, key_mapping=layout.key_mapping(),
        output_loading_info=True, attn_implementation=attention)
    _check_loading_info(info, source, layout, cfg)
    if float32_rotary or layout.rotary_on_device:
        use_authors_rotary(model, float32_rotary, layout.rotary_on_device)
    return model


# ---------------------------------------------------------------------------------- the authors' rotary
# LLaDA's ``RotaryEmbedding``. (1) ``rope_full_precision``: the authors compute
# ``(q * cos) + (rotate_half(q) * sin)`` on ``q.float()`` with float32 sin/cos and cast the
# result back (``.type_as(q)``); transformers' rotary module returns sin/cos in the model dtype
# and rotates in it. Two hooks reproduce the authors' arithmetic exactly, with no copy of
# transformers' attention code: the rotary module returns float32 sin/cos (so ``q * cos``
# promotes the bf16 q to float32, as ``q.float()`` does, and the whole rotation runs in float32),
# and the attention function casts the rotated q and k back to the value dtype before SDPA.
# (2) The authors build their sin/cos cache on the GPU when there is one
# (``_non_meta_init_device``): ``inv_freq = 1 / theta ** (arange(0, hd, 2) / hd)`` computed on
# CUDA differs from the CPU value in the last bit for a few frequencies (2-4 of 64 on an H100),
# so ``inv_freq`` is recomputed with their formula on the device the model runs on. In float32
# models on the CPU both are no-ops.
FLOAT32_ROTARY_ATTENTION = "sdpa_float32_rotary"


def register_float32_rotary_attention() -> str:
    """Register (idempotent) the attention implementation that takes float32-rotated q, k:
    transformers' SDPA attention and SDPA mask after casting q and k to v's dtype."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module, query, key, value, *args, **kwargs):
        return sdpa_attention_forward(module, query.to(value.dtype), key.to(value.dtype), value,
                                      *args, **kwargs)

    AttentionInterface.register(FLOAT32_ROTARY_ATTENTION, attention)
    AttentionMaskInterface.register(FLOAT32_ROTARY_ATTENTION, sdpa_mask)
    return FLOAT32_ROTARY_ATTENTION


def authors_inv_freq(theta: float, head_dim: int, device) -> torch.Tensor:
    """``RotaryEmbedding.get_rotary_embedding``'s frequencies, on ``device``, autocast off."""
    with torch.autocast(torch.device(device).type, enabled=False):
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float)
                                / head_dim))


@functools.cache
def _authors_rotary_class(base: type, float32: bool, on_device: bool) -> type:
    class AuthorsRotary(base):
        """``base``'s sin/cos with the authors' frequencies computed on the model's device
        (``on_device``) and returned in float32 whatever the hidden states' dtype (``float32``:
        they are computed in float32 already; only the final cast is skipped)."""
        authors_rotary = True

        def forward(self, x, position_ids, *args, **kwargs):
            if on_device and getattr(self, "_inv_freq_device", None) != self.inv_freq.device:
                theta = self.config.rope_parameters["rope_theta"]
                # In place: the buffer keeps its address (CUDA graphs replay from it).
                self.inv_freq.copy_(authors_inv_freq(theta, 2 * self.inv_freq.numel(),
                                                     self.inv_freq.device))
                self._inv_freq_device = self.inv_freq.device
            like = x.new_empty(0, dtype=torch.float32) if float32 else x  # device, dtype only
            return super().forward(like, position_ids, *args, **kwargs)

    AuthorsRotary.__name__ = AuthorsRotary.__qualname__ = f"Authors{base.__name__}"
    return AuthorsRotary


def use_authors_rotary(model: nn.Module, float32: bool, on_device: bool) -> None:
    """Make a native model compute its rotary as the authors' (see the section comment)."""
    if float32 and model.config._attn_implementation != FLOAT32_ROTARY_ATTENTION:
        raise ValueError(f"float32 rotary needs attn_implementation="
                         f"{FLOAT32_ROTARY_ATTENTION!r}, the model has "
                         f"{model.config._attn_implementation!r}")
    rotary = model.model.rotary_emb
    if not getattr(type(rotary), "authors_rotary", False):
        rotary.__class__ = _authors_rotary_class(type(rotary), float32, on_device)


def _check_loading_info(info: dict, source: str, layout: HubLayout, cfg) -> None:
    """A tensor the checkpoint lacks would stay randomly initialised, and one it has that the
    model lacks would be dropped: both are errors, named."""
    missing = [k for k in info.get("missing_keys", ()) if not
               (cfg.tie_word_embeddings and k == "lm_head.weight")]
    unexpected = [k for k in info.get("unexpected_keys", ()) if not k.endswith("rotary_emb.inv_freq")]
    mismatched = list(info.get("mismatched_keys", ()))
    problems = []
    if missing:
        problems.append(f"tensors missing from the checkpoint: {_names(missing, layout)}")
    if unexpected:
        problems.append(f"checkpoint tensors with no place in the model: {unexpected[:8]}")
    if mismatched:
        problems.append(f"tensors whose shape differs from config.json: {mismatched[:8]}")
    if problems:
        raise HubConfigError(f"{source} ({layout.name} layout): " + "; ".join(problems))


def _names(keys: list[str], layout: HubLayout) -> list[str]:
    return [f"{layout.hub_key(k) or k}" for k in keys[:8]] + (["..."] if len(keys) > 8 else [])


# ---------------------------------------------------------------------------------- writing
def save_hub_layout(model: nn.Module, layout: HubLayout, out_dir: str | Path,
                    max_shard_bytes: int = 2 * 1024 ** 3, extra_config: dict | None = None) -> Path:
    """Write a native model in the hub's layout: config.json with the authors' field names and
    ``auto_map``, safetensors shards with the authors' key names and their index."""
    from safetensors.torch import save_file
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    hub_cfg = {**layout.to_hub(model.config), **(extra_config or {})}
    hub_cfg["torch_dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    shards = _shard(state, layout, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for n, shard in enumerate(shards, 1):
        name = (f"model-{n:05d}-of-{len(shards):05d}.safetensors" if len(shards) > 1
                else "model.safetensors")
        save_file({k: v.contiguous() for k, v in shard.items()}, str(out / name),
                  metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
        total += sum(v.numel() * v.element_size() for v in shard.values())
    if len(shards) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(hub_cfg, indent=2))
    return out


def _shard(state: dict[str, torch.Tensor], layout: HubLayout, max_bytes: int) -> list[dict]:
    shards: list[dict] = [{}]
    size = 0
    for key, tensor in state.items():
        hub = layout.hub_key(key)
        if hub is None:
            raise KeyError(f"{layout.name} layout has no hub name for native tensor {key!r}")
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][hub] = tensor
        size += nbytes
    return shards


# ---------------------------------------------------------------------------------- tokenizer
def _hub_file(source: str, name: str) -> str | None:
    from transformers.utils import cached_file
    return cached_file(source, name, _raise_exceptions_for_missing_entries=False,
                       _raise_exceptions_for_connection_errors=False)


def load_hub_tokenizer(layout: HubLayout, source: str):
    """The checkpoint's tokenizer without remote code.

    A folder with ``tokenizer.json`` gets exactly that tokenizer (LLaDA ships one). Without
    it, the layout names the transformers class that builds the same tokenizer from
    ``vocab.json`` + ``merges.txt``: Dream's remote ``DreamTokenizer`` is Qwen2's byte-level BPE
    (NFC normalisation, the same pre-tokenizer pattern, no BOS added), which ``Qwen2Tokenizer``
    builds. Special tokens come from the folder's tokenizer_config.json either way.
    """
    import transformers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if _hub_file(source, "tokenizer.json"):
        return PreTrainedTokenizerFast.from_pretrained(source)
    if layout.tokenizer_class:
        return getattr(transformers, layout.tokenizer_class).from_pretrained(source)
    return AutoTokenizer.from_pretrained(source, trust_remote_code=False)
