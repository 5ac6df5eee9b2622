"""What a method type requires of a model's widths, checked before any job.

A calibrate job that refuses its settings has already cost its finished outputs: Snakemake
deletes a job's old outputs before running it (a finished AWQ calibration is gone once
``group_size: 48`` meets a 64-wide model). So every shape constraint a method's job would
raise on is computed here from the config and the models' widths
(:mod:`fair_calib.checks.model_widths`, no weights loaded, no torch), for every calibration the run
plans (:func:`fair_calib.checks.plan.calib_cells`), and refused in one line naming the key, its value,
the model and the width:

* ``awq``: ``group_size`` (128; -1: one group per row) divides every linear's input width
  (``fair_calib.quant.groupwise._grouped``, ``methods.awq.auto_clip``); only where it quantizes
  weights (w_bits < 16). GPTQ takes any group size (a shorter last group, as AutoGPTQ does),
  so nothing is checked for it;
* ``duquant``: ``block_size`` (128) divides every linear's input width
  (``methods.duquant.DuQuantRotation``) and, with quantized activations in the authors'
  arithmetic, the attention head dim (its Hadamard on q/k);
* ``quarot``: the hidden width, head_dim and (with ``online_hadamard``, the default) the MLP
  width split into a Hadamard order times a power of two other than QuaRot's own tables
  (``quant.hadamard_orders.hadamard_split``), and the number of heads is a Hadamard order
  (the online rotation across heads on the o_proj input).

FlatQuant, FAIR-Calib, QDrop, RTN and SmoothQuant take any width. A method type with a new
constraint adds a function to :data:`CHECKS`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from fair_calib.checks.config import ConfigError
from fair_calib.checks.model_widths import Widths, model_widths
from fair_calib.quant.hadamard_orders import has_hadamard, hadamard_split

JOB = "its calibrate job would refuse it"


def _setting(m: Mapping[str, Any], key: str, default: int) -> tuple[int, str]:
    """(value, how it is shown): the method's setting, or its default (said so)."""
    return (int(m[key]), str(m[key])) if key in m else (default, f"{default} (the default)")


def _largest_divisor_up_to(n: int, limit: int) -> int:
    return max(d for d in range(1, min(n, max(limit, 1)) + 1) if n % d == 0)


def _divides_every_input(key: str, value: int, shown: str, w: Widths, what: str,
                         extra: str = "") -> str | None:
    """A refusal where ``value`` does not divide the input width of some linear group."""
    inputs = w.linear_inputs()
    for linears, width, where in inputs:
        if width % value:
            common = math.gcd(*(x for _, x, _ in inputs))
            widths = " and ".join(str(x) for x in sorted({x for _, x, _ in inputs}))
            return (f"config: {key} = {shown} does not divide the {width} input columns of "
                    f"{w.model}'s {linears} linears ({where}); {JOB}. Give {what} that divides "
                    f"{widths}, e.g. {_largest_divisor_up_to(common, value)}{extra}")
    return None


def awq_problem(name: str, m: Mapping[str, Any], bits: Mapping[str, Any], w: Widths) -> str | None:
    if int(bits.get("w_bits", 16)) >= 16:
        return None                      # weights not quantized: no groups are formed
    value, shown = _setting(m, "group_size", 128)
    if value <= 0:
        return None                      # -1: one group per row (the schema refuses 0)
    return _divides_every_input(f"methods.{name}.group_size", value, shown, w, "a group size",
                                " (or -1: one group per row)")


def duquant_problem(name: str, m: Mapping[str, Any], bits: Mapping[str, Any],
                    w: Widths) -> str | None:
    value, shown = _setting(m, "block_size", 128)
    problem = _divides_every_input(f"methods.{name}.block_size", value, shown, w, "a block size")
    authors = m.get("arithmetic", "authors") == "authors"
    if problem is None and authors and int(bits.get("a_bits", 16)) < 16 and \
            (value > w.head_dim or w.head_dim % value):
        # its Hadamard on the attention matmuls' q/k inputs works within one head
        return (f"config: methods.{name}.block_size = {shown} does not divide {w.model}'s "
                f"attention head dim {w.head_dim} (head_dim: {w.where['head_dim']}), which "
                f"DuQuant's Hadamard on q/k needs; {JOB}. Give a block size that divides "
                f"{w.head_dim}, e.g. {_largest_divisor_up_to(w.head_dim, value)}")
    return problem


def quarot_problem(name: str, m: Mapping[str, Any], bits: Mapping[str, Any],
                   w: Widths) -> str | None:
    online = bool(m.get("online_hadamard", True))
    rotated = [("residual stream rotation", w.hidden, f"hidden: {w.where['hidden']}"),
               ("per-head value rotation", w.head_dim, f"head_dim: {w.where['head_dim']}")]
    if online:
        rotated.append(("online down_proj rotation", w.intermediate,
                        f"intermediate: {w.where['intermediate']}"))
    for what, width, where in rotated:
        try:
            hadamard_split(width)
        except ValueError as err:
            return (f"config: methods.{name} (type quarot) on {w.model}: the {what} ({where}): "
                    f"{err}; {JOB}. Give the model another width")
    if online and w.heads > 1 and not has_hadamard(w.heads):
        orders = ", ".join(str(k) for k in range(1, 41) if has_hadamard(k))
        return (f"config: methods.{name}.online_hadamard (true) on {w.model}: no Hadamard "
                f"matrix of order {w.heads} (heads: {w.where['heads']}) for QuaRot's online "
                f"rotation across heads on the o_proj input; {JOB}. Set "
                f"methods.{name}.online_hadamard: false, or a head count with a Hadamard "
                f"matrix ({orders}, ...)")
    return None


Check = Callable[[str, Mapping[str, Any], Mapping[str, Any], Widths], "str | None"]
CHECKS: dict[str, Check] = {"awq": awq_problem, "duquant": duquant_problem,
                            "quarot": quarot_problem}


def method_shape_problems(cfg: Mapping[str, Any]) -> list[str]:
    """One refusal per planned calibration whose settings its job would refuse (see the
    module docstring); calibrations of models whose widths are unknown are not checked."""
    from fair_calib.checks.plan import base_method, calib_cells

    problems: dict[str, None] = {}
    widths: dict[str, Widths | None] = {}
    for model, run, bits in calib_cells(cfg):
        name = base_method(run)
        m = cfg["methods"][name]
        check = CHECKS.get(m["type"])
        if check is None:
            continue
        if model not in widths:
            widths[model] = model_widths(cfg, model)
        if widths[model] is None:
            continue
        problem = check(name, m, cfg["bits"].get(bits, {}), widths[model])
        if problem:
            problems[problem] = None
    return list(problems)


def check_method_shapes(cfg: Mapping[str, Any]) -> None:
    problems = method_shape_problems(cfg)
    if problems:
        raise ConfigError(problems[0])
