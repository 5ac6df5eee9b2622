"""Decoding policies as validated data.

A :class:`DecodePolicy` is built from a family adapter's ``decoding`` dict merged with overrides
and validated before any forward pass. The commit rule is chosen by the policy *name* (never by
the model family): ``low_confidence`` / ``random`` are semi-autoregressive block decoders with
per-step commit counts computed per row; ``origin`` / ``maskgit_plus`` / ``topk_margin`` /
``entropy`` follow a continuous timestep schedule ``linspace(1, eps, steps + 1)``;
``random_commit`` commits uniformly random masked positions (Stage I probing).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from fair_calib.names import registry

# Policies whose commit counts follow the block rule (base = n // steps, remainder first).
BLOCK_POLICIES = ("low_confidence", "random")
# Policies following the timestep schedule linspace(1, eps, steps + 1).
SCHEDULE_POLICIES = ("origin", "maskgit_plus", "topk_margin", "entropy")
# Model-independent commit order (positions uniformly at random among masked).
RANDOM_COMMIT_POLICIES = ("random_commit",)

# The policies implemented here (``fair_calib.names.registry.POLICIES`` names them for the config
# schema without importing torch; tests check the two agree).
POLICIES = BLOCK_POLICIES + SCHEDULE_POLICIES + RANDOM_COMMIT_POLICIES


@dataclass(frozen=True)
class DecodePolicy:
    name: str
    steps: int
    gen_length: int
    block_length: int | None = None   # None: one block spanning the whole window
    temperature: float = 0.0
    cfg_scale: float = 0.0
    alg_temp: float = 0.0
    eps: float = 1e-3
    top_p: float | None = None
    top_k: int | None = None
    # LLaDA generate.py's options (its Appendix B.4), off by default: ``logits_eos_inf`` sets
    # the EOS logit to -inf before the token choice; ``confidence_eos_eot_inf`` sets -inf where
    # its chained assignment puts it (see ``generate._block_tokens``). Block policies only.
    logits_eos_inf: bool = False
    confidence_eos_eot_inf: bool = False

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ derived quantities
    @property
    def block_len(self) -> int:
        return self.gen_length if self.block_length is None else int(self.block_length)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_len

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.num_blocks

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        if self.name not in POLICIES:
            raise ValueError(f"unknown decoding policy {self.name!r}; valid policies: "
                             f"{list(registry.POLICIES)}")
        for key in ("steps", "gen_length"):
            val = getattr(self, key)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"decoding {key} must be a positive integer, got {val!r}")
        if self.block_length is not None:
            bl = self.block_length
            if isinstance(bl, bool) or not isinstance(bl, int) or bl < 1:
                raise ValueError(f"decoding block_length must be a positive integer, got {bl!r}")
            if self.gen_length % bl != 0:
                raise ValueError(f"gen_length={self.gen_length} is not divisible by "
                                 f"block_length={bl}")
            if self.name not in BLOCK_POLICIES and bl != self.gen_length:
                raise ValueError(f"policy {self.name!r} decodes the whole window at once; "
                                 f"block_length={bl} must be unset or equal gen_length="
                                 f"{self.gen_length}")
        if self.steps % self.num_blocks != 0:
            raise ValueError(f"steps={self.steps} do not divide among {self.num_blocks} blocks "
                             f"(gen_length={self.gen_length}, block_length={self.block_len})")
        if not (self.temperature >= 0):
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not (self.cfg_scale >= 0):
            raise ValueError(f"cfg_scale must be >= 0, got {self.cfg_scale!r}")
        if self.cfg_scale > 0 and self.name not in BLOCK_POLICIES:
            raise ValueError(f"cfg_scale={self.cfg_scale} is only supported by the policies "
                             f"{list(BLOCK_POLICIES)}, not {self.name!r}")
        if not (self.alg_temp >= 0):
            raise ValueError(f"alg_temp must be >= 0, got {self.alg_temp!r}")
        if not (0 < self.eps < 1):
            raise ValueError(f"eps must lie in (0, 1), got {self.eps!r}")
        if self.top_p is not None and not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        for key in ("logits_eos_inf", "confidence_eos_eot_inf"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"decoding {key} must be true or false, got {getattr(self, key)!r}")
            if getattr(self, key) and self.name not in BLOCK_POLICIES:
                raise ValueError(f"decoding {key} is an option of LLaDA's generate (policies "
                                 f"{list(BLOCK_POLICIES)}), not of {self.name!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 1):
            raise ValueError(f"top_k must be a positive integer, got {self.top_k!r}")

    def check_context(self, prompt_length: int, max_context: int | None) -> None:
        """Raise if the longest prompt plus the generation window exceeds the model context."""
        if max_context is not None and prompt_length + self.gen_length > max_context:
            raise ValueError(f"prompt length {prompt_length} + gen_length {self.gen_length} = "
                             f"{prompt_length + self.gen_length} exceeds the model context "
                             f"max_position_embeddings={max_context}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = {f.name for f in dataclasses.fields(DecodePolicy)}


def make_policy(defaults: Mapping[str, Any] | Any, overrides: Mapping[str, Any] | None = None,
                **kwargs: Any) -> DecodePolicy:
    """Build a validated policy from an adapter's ``decoding`` dict plus overrides.

    ``defaults`` may be a dict, a :class:`~fair_calib.models.adapters.FamilyAdapter`, or a
    :class:`~fair_calib.models.adapters.LoadedModel` (its adapter's ``decoding`` is used). The
    policy name may be given as ``policy`` or ``name``. Overrides whose value is ``None`` are
    ignored, so a settings section can leave a key unset. Unknown keys raise ``ValueError``.
    """
    if hasattr(defaults, "adapter"):
        defaults = defaults.adapter
    if hasattr(defaults, "decoding"):
        defaults = defaults.decoding
    def canonical(d: Mapping[str, Any]) -> dict[str, Any]:
        d = dict(d)
        if "policy" in d:
            if "name" in d:
                raise ValueError("give the decoding policy as 'policy' or 'name', not both")
            d["name"] = d.pop("policy")
        return d

    merged = canonical(defaults or {})
    given: dict[str, Any] = {}
    for extra in (overrides or {}, kwargs):
        given.update(canonical({key: val for key, val in extra.items() if val is not None}))
    merged.update(given)
    unknown = sorted(set(merged) - _FIELDS)
    if unknown:
        raise ValueError(f"unknown decoding settings {unknown}; known: {sorted(_FIELDS | {'policy'})}")
    if "name" not in merged:
        raise ValueError(f"no decoding policy named; valid policies: {list(registry.POLICIES)}")
    name = merged["name"]
    if name not in POLICIES:
        raise ValueError(f"unknown decoding policy {name!r}; valid policies: "
                         f"{list(registry.POLICIES)}")
    # A block length inherited from a block policy's defaults means nothing to the others.
    if name not in BLOCK_POLICIES and "block_length" in merged and "block_length" not in given:
        merged.pop("block_length")
    for key in ("steps", "gen_length", "block_length", "top_k"):
        if isinstance(merged.get(key), float) and float(merged[key]).is_integer():
            merged[key] = int(merged[key])
    for key in ("temperature", "cfg_scale", "alg_temp", "eps", "top_p"):
        if isinstance(merged.get(key), int) and not isinstance(merged.get(key), bool):
            merged[key] = float(merged[key])
    return DecodePolicy(**merged)


def block_commit_counts(n_masked: int, steps: int) -> list[int]:
    """Tokens committed at each of ``steps`` steps for ``n_masked`` masked positions:
    ``base = n_masked // steps``; the first ``n_masked % steps`` steps commit one more."""
    base, rem = divmod(int(n_masked), int(steps))
    return [base + (1 if s < rem else 0) for s in range(int(steps))]


def schedule_commit_count(mean_masked: float, s: float, t: float, last: bool) -> int:
    """Tokens committed at one step of the timestep schedule (all remaining at the last)."""
    if last:
        return int(mean_masked)
    return int(mean_masked * (1 - s / t))
