"""lm-eval's prompt templates compiled once per template, not once per document.

lm-eval 0.4's ``utils.apply_template`` compiles its Jinja template on every call
(``env.from_string(template).render(**doc)``), about four compiles a document: on a tiny model
that is a fifth of an evaluation's time. :func:`install` puts a version in its place that
compiles each template string once in lm-eval's own environment (its filters, its undefined
policy) and renders it as before, so every prompt and target is the same string
(``tests/evaluate/test_template_cache.py`` compares them on every task template we ship).
"""
from __future__ import annotations

import functools


def install() -> None:
    """Replace ``lm_eval.utils.apply_template`` by the compile-once version (idempotent). An
    lm-eval without ``utils.env`` keeps its own function: only slower, never different."""
    from lm_eval import utils

    if getattr(utils.apply_template, "compiles_once", False) or not hasattr(utils, "env"):
        return
    compiled = functools.lru_cache(maxsize=1024)(utils.env.from_string)

    def apply_template(template: str, doc: dict) -> str:
        return compiled(template).render(**doc)

    apply_template.compiles_once = True
    apply_template.compiled = compiled
    utils.apply_template = apply_template
