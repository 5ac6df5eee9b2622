"""A model's widths, read without loading its weights (or torch), for the checks that run before
any job (``fair_calib.checks.method_shapes``): a tiny model's from its config entry (``train``, the
trainer's defaults where it leaves one out), a hub-layout copy's (``source: convert``) from the
model it copies, a checkpoint's from its ``config.json`` where that is on disk (a local folder,
or a hub id already in the local Hugging Face cache), its fields read as the native loader maps
them (``fair_calib.models.hub``). None where the widths cannot be known cheaply: the job then
meets them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

# LLaDA's ``ModelConfig`` default where config.json leaves ``mlp_hidden_size`` out
# (fair_calib.models.hub._LLADA_DEFAULTS).
LLADA_MLP_RATIO = 4


@dataclass(frozen=True)
class Widths:
    """hidden, intermediate (the MLP's inner width), heads and head_dim of one model, with
    where each was read (a config key, or ``<folder>/config.json: <field>``)."""
    model: str
    hidden: int
    intermediate: int
    heads: int
    head_dim: int
    where: Mapping[str, str] = field(default_factory=dict)

    def linear_inputs(self) -> list[tuple[str, int, str]]:
        """(the linears that read it, input width, where the width comes from) of every linear
        group of a block: the attention and MLP inputs (hidden), o_proj's (heads x head_dim),
        down_proj's (intermediate)."""
        o_where = (self.where["hidden"] if self.heads * self.head_dim == self.hidden
                   else f"{self.where['heads']} x {self.where['head_dim']}")
        return [("q/k/v and gate/up", self.hidden, self.where["hidden"]),
                ("o_proj", self.heads * self.head_dim, o_where),
                ("down_proj", self.intermediate, self.where["intermediate"])]


def tiny_widths(name: str, key: str, train: Mapping[str, Any] | None) -> Widths:
    """A tiny model's widths from its ``train`` entry (``key``: where that entry is)."""
    from fair_calib.models.tiny.defaults import DEFAULT_TRAIN

    given = train or {}
    t = {**DEFAULT_TRAIN, **given}

    def where(k):
        return f"{key}.train.{k}" if k in given else f"{key}.train.{k} (default {t[k]})"
    hidden, heads = int(t["hidden"]), int(t["heads"])
    return Widths(name, hidden, int(t["intermediate"]), heads, hidden // heads,
                  {"hidden": where("hidden"), "intermediate": where("intermediate"),
                   "heads": where("heads"), "head_dim": f"{key}.train.hidden / heads"})


def config_json_widths(name: str, family: str, path: Path) -> Widths | None:
    """Widths from a checkpoint's config.json as the native loader maps them: LLaDA's field
    names (``d_model``, ``n_heads``, ``mlp_hidden_size`` else ``mlp_ratio`` x ``d_model``),
    Dream's (Qwen2's; head_dim is hidden_size / heads there). None where the file is unreadable
    or lacks a field (the loader then names what is wrong)."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
        if family == "llada":
            hidden, heads = int(cfg["d_model"]), int(cfg["n_heads"])
            mlp = cfg.get("mlp_hidden_size")
            inter = int(mlp) if mlp else int((cfg.get("mlp_ratio") or LLADA_MLP_RATIO) * hidden)
            fields = {"hidden": "d_model", "heads": "n_heads",
                      "intermediate": "mlp_hidden_size" if mlp else "mlp_ratio x d_model",
                      "head_dim": "d_model / n_heads"}
        elif family == "dream":
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            inter = int(cfg["intermediate_size"])
            fields = {"hidden": "hidden_size", "heads": "num_attention_heads",
                      "intermediate": "intermediate_size",
                      "head_dim": "hidden_size / num_attention_heads"}
        else:
            return None
        head_dim = hidden // heads
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
        return None
    return Widths(name, hidden, inter, heads, head_dim,
                  {k: f"{path}: {v}" for k, v in fields.items()})


def checkpoint_config(source: str) -> Path | None:
    """The config.json of a local checkpoint folder, or of a hub id in the local cache."""
    from fair_calib.checks.config import looks_like_local_path

    if looks_like_local_path(source):
        path = Path(source).expanduser() / "config.json"
        return path if path.is_file() else None
    if source.count("/") != 1:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    hit = try_to_load_from_cache(source, "config.json")
    return Path(hit) if isinstance(hit, str) else None


def model_widths(cfg: Mapping[str, Any], model: str) -> Widths | None:
    """The widths of ``cfg["models"][model]`` (see the module docstring), or None."""
    entry = cfg["models"][model]
    source = entry.get("source")
    if source == "convert":             # the trained model it writes in a hub layout
        src = entry.get("convert_from")
        base = cfg["models"].get(src) or {}
        if base.get("source") != "train":
            return None
        return tiny_widths(model, f"models.{src}", base.get("train"))
    if source == "train":
        return tiny_widths(model, f"models.{model}", entry.get("train"))
    path = checkpoint_config(str(source))
    return None if path is None else config_json_widths(model, entry.get("family", ""), path)
