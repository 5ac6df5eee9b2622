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
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import graphs, rotary


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
    # The (EOS, EoT) tokens LLaDA's generate.py options ``logits_eos_inf`` /
    # ``confidence_eos_eot_inf`` act on (ids 126081, 126348 in its code); None: no such options.
    eos_eot_tokens: tuple[str, str] | None = None
    # Hub families: the layout (``fair_calib.models.hub.LAYOUTS``) that maps the released
    # checkpoint onto a native transformers class; the paths above are the native ones.
    hub_layout: str | None = None
    # Module paths of the authors' own (remote-code) module tree, for ``loader: remote``.
    remote_paths: dict[str, str] = field(default_factory=dict)

    def resolve_mask_id(self, tokenizer, config_mask_id: int | None = None) -> int:
        """The checkpoint's ``mask_token_id`` (config.json) if it has one, else the adapter's
        id, else the tokenizer's id of ``mask_token``. A tokenizer that knows the mask token
        under another id contradicts the checkpoint: an error, not a guess."""
        known = config_mask_id if config_mask_id is not None else self.mask_id
        tok_id = None
        if tokenizer is not None:
            tok_id = tokenizer.convert_tokens_to_ids(self.mask_token)
            if tok_id == getattr(tokenizer, "unk_token_id", None) and self.mask_token != tokenizer.unk_token:
                tok_id = None
        if known is not None:
            if tok_id is not None and int(tok_id) != int(known):
                raise ValueError(f"adapter {self.name!r}: the tokenizer maps {self.mask_token!r} "
                                 f"to {tok_id}, the checkpoint's mask_token_id is {known}")
            return int(known)
        if tok_id is None:
            raise ValueError(f"adapter {self.name!r}: tokenizer has no mask token {self.mask_token!r}")
        return int(tok_id)


ADAPTERS: dict[str, FamilyAdapter] = {}


def register_adapter(adapter: FamilyAdapter) -> FamilyAdapter:
    ADAPTERS[adapter.name] = adapter
    return adapter


register_adapter(FamilyAdapter(
    name="llada",
    hub_ids=("GSAI-ML/LLaDA-8B-Base", "GSAI-ML/LLaDA-8B-Instruct", "GSAI-ML/LLaDA-1.5"),
    remote_code=True, mask_token="<|mdm_mask|>", mask_id=126336, logit_shift=False,
    # Loaded natively, LLaDA is a bidirectional Llama (``fair_calib.models.hub.LLADA_LAYOUT``).
    embed_path="model.embed_tokens", blocks_path="model.layers", final_norm_path="model.norm",
    head_path="lm_head", chat_template=True, hub_layout="llada",
    # The authors' tree: the LM head is ``transformer.ff_out`` and the down-projection inside
    # every block is also named ``ff_out``; paths are absolute, so the two never meet.
    remote_paths={"embed_path": "model.transformer.wte", "blocks_path": "model.transformer.blocks",
                  "final_norm_path": "model.transformer.ln_f",
                  "head_path": "model.transformer.ff_out"},
    decoding={"policy": "low_confidence", "steps": 256, "gen_length": 256, "block_length": 8,
              "temperature": 0.0, "cfg_scale": 0.0},
    likelihood={"estimator": "llada", "mc_num": 128, "batch_size": 8, "cfg_scale": 0.0,
                "exact_below": 2},
    eos_token="<|eot_id|>", pad_token="<|endoftext|>",
    eos_eot_tokens=("<|endoftext|>", "<|eot_id|>"),
))

register_adapter(FamilyAdapter(
    name="dream",
    hub_ids=("Dream-org/Dream-v0-Base-7B", "Dream-org/Dream-v0-Instruct-7B"),
    remote_code=True, mask_token="<|mask|>", mask_id=151666, logit_shift=True,
    embed_path="model.embed_tokens", blocks_path="model.layers", final_norm_path="model.norm",
    head_path="lm_head", chat_template=True, hub_layout="dream",
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
    # exact_below 2 (unlike Dream's own default, 0): no paper number rests on the tiny models,
    # and a single-token choice scored exactly has no MC noise and shares one forward with the
    # other choices of its question (docs/fidelity.md, exact mode)
    likelihood={"estimator": "dream", "mc_num": 16, "batch_size": 16, "eps": 1e-3,
                "exact_below": 2},
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
    # ids of the adapter's ``eos_eot_tokens`` (LLaDA's generate options), None where it has none
    eos_eot_ids: tuple[int, int] | None = None
    # repeated forwards replayed from CUDA graphs, once :meth:`replay_graphs` is called
    graphs: Any = field(default=None, repr=False, compare=False)
    # how the quantized linears compute (methods.load_quantized): {"arithmetic", "line"};
    # None for a full-precision model
    execution: dict | None = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        # transformers' rotary through the fused kernel where it gives the same bits (rotary.py)
        rotary.install()

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

    def replay_graphs(self, on: bool = True) -> None:
        """Replay repeated forwards (a generation's steps, an MC request's batches) from CUDA
        graphs (:mod:`graphs`: the same kernels, no host time). Only for a model that nothing
        modifies afterwards: a graph keeps the kernels and buffers of its capture."""
        me = weakref.ref(self)      # no reference cycle: the model's memory goes with it

        def forward(input_ids: torch.Tensor, keep_last: int | None) -> torch.Tensor:
            return me().logits(input_ids, None, keep_last, replay=False)
        self.graphs = graphs.GraphCache(forward) if on else None

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               keep_last: int | None = None, replay: bool = True) -> torch.Tensor:
        """Per-position logits aligned so that ``logits[:, i]`` predicts token ``i``.

        With left padding, pass the 2-D ``attention_mask``; position ids then count from the
        first real token, so a padded row computes the same function as the row alone: in
        float32 its logits equal the row's to float32 rounding (the batch's shape changes the
        kernels' reduction order, not the math); in bf16 that rounding is bf16's and GPU
        kernels chosen by batch shape round differently, so a row's logits, and tokens decoded
        from near-ties, can depend on its batch (docs/fidelity.md, padded batches). Pass
        ``None`` when no row is padded: attention then runs without a mask tensor (the fast
        kernels).
        ``keep_last=K`` returns only the last ``K`` positions' logits, and the LM head runs only
        there when the model supports it (``logits_to_keep``): decoding needs just the window.
        ``replay``: where :meth:`replay_graphs` is on, a repeated unmasked forward on CUDA
        replays its graph (the same logits, bit for bit).
        """
        if replay and self.graphs is not None and graphs.replayable(input_ids, attention_mask):
            return self.graphs(input_ids, keep_last)
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
        if not self.adapter.logit_shift:
            return logits if keep_last is None else logits[:, -keep_last:]
        if need is not None and need < length:
            window = logits[:, -need:]             # raw logits of positions [L-K-1, L)
            shifted, own, start = window[:, :-1], window[:, 1:], length - keep_last
        else:
            shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            own, start = logits, 0
            if keep_last is not None:
                shifted, own, start = shifted[:, -keep_last:], own[:, -keep_last:], length - keep_last
        return _first_token_own_logits(shifted, own, attention_mask, start)


def _first_token_own_logits(shifted: torch.Tensor, own: torch.Tensor,
                            attention_mask: torch.Tensor | None, start: int) -> torch.Tensor:
    """A shifted family reads position i's prediction from i-1; the first token of a sequence
    has no i-1 and reads its own (the authors' ``cat([logits[:, :1], logits[:, :-1]])``). With
    left padding a row's first real token would read the pad before it instead; give it its own
    logits, as the row alone does. In place, without a host sync."""
    if attention_mask is None:
        return shifted
    first = attention_mask.long().argmax(-1) - start          # window index of the first token
    width = shifted.shape[1]
    inside = (first >= 0) & (first < width)
    rows = torch.arange(shifted.shape[0], device=shifted.device)
    col = first.clamp(0, width - 1)
    own_rows, cur_rows = own[rows, col], shifted[rows, col]
    shifted[rows, col] = torch.where(inside[:, None], own_rows, cur_rows)
    return shifted


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


LOADERS = ("native", "remote")


def load_model(source: str | Path, family: str, dtype: str | torch.dtype = "float32",
               device: str = "cpu", trust_remote_code: bool | None = None,
               loader: str | None = None) -> LoadedModel:
    """Load a checkpoint (hub id, HF cache or local folder) through its family adapter.

    Hub families load ``native`` by default: the released checkpoint on transformers' own
    class (``fair_calib.models.hub``), no remote code run. ``loader="remote"`` runs the
    authors' modeling files instead (transformers 4.x only). Tiny families are native models.
    """
    adapter = get_adapter(family)
    source = str(source)
    local = Path(source).exists()
    first = Path(source).parts[0] if Path(source).parts else source
    if not local and ("/" not in source or source.startswith((".", "/")) or source.count("/") > 1
                      or Path(first).is_dir()):
        raise FileNotFoundError(f"model source {source!r} is neither an existing local folder "
                                f"nor a hub id of the form 'org/name'")
    loader = loader or "native"
    if loader not in LOADERS:
        raise ValueError(f"loader {loader!r} is not one of {list(LOADERS)}")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    try:
        if loader == "remote":
            model, tokenizer, config_mask = _load_remote(adapter, source, torch_dtype,
                                                         trust_remote_code)
            adapter = with_overrides(adapter, **adapter.remote_paths)
        elif adapter.hub_layout is not None:
            model, tokenizer, config_mask = _load_hub_native(adapter, source, torch_dtype)
        else:
            model, tokenizer, config_mask = _load_plain(source, torch_dtype)
    except Exception as err:
        # transformers / safetensors name no file for a truncated tokenizer.json or weights
        # file ("JSONDecodeError: ... (char 3000)"); find it and say how to regenerate it
        broken = corrupt_model_file(source) if local else None
        if broken is None:
            raise
        raise broken_model_error(source, *broken) from err
    model.to(device).eval()
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return _wrap(model, tokenizer, adapter, config_mask, source)


def corrupt_model_file(folder: str | Path) -> tuple[Path, str] | None:
    """The first file of a model folder that is truncated or not what its name says
    (``*.json``: config, tokenizer; ``*.safetensors``: header against the file size), and why."""
    from fair_calib.jobs.preflight import json_problem, safetensors_problem

    folder = Path(folder)
    if not folder.is_dir():
        return None
    for path in sorted(folder.iterdir()):
        check = {".json": json_problem, ".safetensors": safetensors_problem}.get(path.suffix)
        why = check(path) if check and path.is_file() else None
        if why:
            return path, why
    return None


def broken_model_error(folder: str | Path, path: Path, why: str):
    from fair_calib.jobs.io import CorruptFileError

    return CorruptFileError(
        f"{path}: corrupt or truncated ({why}). A model folder is one output: delete it whole "
        f"and run snakemake again to regenerate it (a trained or converted model), or download "
        f"it again (a hub checkpoint): rm -r {str(folder)!r}")


def load_model_entry(source: str | Path, entry: dict, dtype: str | torch.dtype = "float32",
                     device: str = "cpu") -> LoadedModel:
    """:func:`load_model` with the settings of a config ``models:`` entry."""
    return load_model(source, entry["family"], dtype, device,
                      trust_remote_code=entry.get("trust_remote_code"), loader=entry.get("loader"))


def _wrap(model, tokenizer, adapter: FamilyAdapter, config_mask: int | None,
          source: str | Path | None = None) -> LoadedModel:
    from fair_calib.models.finite import check_finite_weights

    # a checkpoint holding inf or NaN (written by hand, or by an older conversion) is refused
    check_finite_weights(model, str(source or "the model"),
                         "regenerate or replace these weights (nothing scored on them is meaningful)")
    mask_id = adapter.resolve_mask_id(tokenizer, config_mask)
    pad_id = tokenizer.pad_token_id
    if pad_id is None and adapter.pad_token:
        pad_id = tokenizer.convert_tokens_to_ids(adapter.pad_token)
    eos_id = tokenizer.convert_tokens_to_ids(adapter.eos_token) if adapter.eos_token else tokenizer.eos_token_id
    eos_eot = None
    if adapter.eos_eot_tokens and tokenizer is not None:
        eos_eot = tuple(int(tokenizer.convert_tokens_to_ids(t)) for t in adapter.eos_eot_tokens)
    return LoadedModel(model=model, tokenizer=tokenizer, adapter=adapter, mask_id=int(mask_id),
                       pad_id=int(pad_id if pad_id is not None else eos_id), eos_id=eos_id,
                       eos_eot_ids=eos_eot)


def _load_plain(source: str, torch_dtype):
    """An embedded tiny model (or any native transformers checkpoint)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    if (Path(source) / "fair_calib.json").is_file():
        # The embedded tiny model's word-level tokenizer, as saved. AutoTokenizer would force
        # the model type's own class for some types (qwen2), which rebuilds a byte-level BPE
        # and ignores tokenizer.json.
        tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
    else:
        tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    return model, tokenizer, None


def _load_hub_native(adapter: FamilyAdapter, source: str, torch_dtype):
    from .hub import LAYOUTS, load_hub_tokenizer, load_native_model, read_hub_config

    layout = LAYOUTS[adapter.hub_layout]
    hub_cfg = read_hub_config(source)
    model = load_native_model(layout, source, torch_dtype, hub_cfg)
    tokenizer = load_hub_tokenizer(layout, source)
    return model, tokenizer, hub_cfg.get("mask_token_id")


def _load_remote(adapter: FamilyAdapter, source: str, torch_dtype, trust: bool | None):
    """The authors' modeling files. They were written for transformers 4.x and fail to load
    under 5.x (``docs/fidelity.md`` lists how), so 5.x is refused up front."""
    import transformers
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    if not adapter.remote_code:
        raise ValueError(f"family {adapter.name!r} has no remote code; use loader: native")
    major = int(transformers.__version__.split(".")[0])
    if major >= 5:
        raise RuntimeError(
            f"loader: remote runs the {adapter.name} authors' modeling files, which do not load "
            f"under transformers {transformers.__version__} (they were written for 4.x; "
            f"4.57.1 loads them). Use loader: native (the default; numerically the same model, "
            f"see docs/fidelity.md), or run in an environment with transformers 4.57.1.")
    if trust is None:
        trust = source in adapter.hub_ids
    if not trust:
        raise PermissionError(
            f"{source!r} (family {adapter.name!r}) needs trust_remote_code for loader: remote, "
            f"which is only granted to {list(adapter.hub_ids)}; set trust_remote_code: true in "
            f"its config entry to allow it")
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=True)
    config = AutoConfig.from_pretrained(source, trust_remote_code=True)
    model = AutoModel.from_pretrained(source, config=config, torch_dtype=torch_dtype,
                                      trust_remote_code=True)
    return model, tokenizer, getattr(config, "mask_token_id", None)


def with_overrides(adapter: FamilyAdapter, **changes: Any) -> FamilyAdapter:
    return dataclasses.replace(adapter, **changes)
