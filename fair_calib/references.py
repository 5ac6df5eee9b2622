"""Cross-reference checks of a config, which its JSON schema cannot express: a table naming an
unknown model, a method of an unregistered type, a prior naming an unknown probe, two entries
one table would print under the same label, ... Torch-free: the Snakefile runs them at parse
time (workflow/rules/common.smk), before any job, and ``fair-calib cost`` on the config it
projects. Every error is a one-line :class:`fair_calib.config.ConfigError` naming the key."""
from __future__ import annotations

import re

from fair_calib import registry
from fair_calib.config import ConfigError, validate_config

MEMORY_TABLES = ("calib_memory", "deploy_memory")
RULES_WITH_RESOURCES = ("make_data", "train_tiny", "convert_hub", "probe_shard", "prior", "calibrate",
                        "evaluate_shard", "gather_eval", "trajectories", "diagnose", "figures",
                        "table", "floor_sweep")


def _fail(key, value, valid):
    raise ConfigError(f"config: {key} = {value!r} is not valid; choose one of {sorted(valid)}")


def _check_convert(cfg, name, m):
    """source: convert writes a trained tiny model in a hub family's checkpoint layout."""
    if m["family"] not in registry.HUB_FAMILIES:
        _fail(f"models.{name}.family (source: convert)", m["family"], registry.HUB_FAMILIES)
    src = m.get("convert_from")
    trained_models = [k for k, v in cfg["models"].items() if v["source"] == "train"]
    if src not in trained_models:
        _fail(f"models.{name}.convert_from", src, trained_models)


def check_config(cfg):
    """Cross-reference checks the JSON schema cannot express. Every error names the key."""
    for name, m in cfg["models"].items():
        if m["family"] not in registry.FAMILIES:
            _fail(f"models.{name}.family", m["family"], registry.FAMILIES)
        if m["source"] == "train" and not m["family"].startswith("tiny-"):
            raise ConfigError(f"config: models.{name}.source = 'train' is only valid for tiny families")
        if m["source"] == "convert":
            _check_convert(cfg, name, m)
        elif "convert_from" in m:
            raise ConfigError(f"config: models.{name}.convert_from is only read with source: convert")
    for name, b in cfg["bits"].items():
        if not re.fullmatch(r"w\d+a\d+", name):
            raise ConfigError(f"config: bits.{name}: names must look like w4a4 (weight bits, "
                              f"activation bits; 16 means not quantized: w4a16 is weight-only)")
        if name != f"w{b['w_bits']}a{b['a_bits']}":
            raise ConfigError(f"config: bits.{name} holds w_bits: {b['w_bits']}, a_bits: "
                              f"{b['a_bits']}; its name must say them: w{b['w_bits']}a{b['a_bits']} "
                              "(tables print the name)")
    for name, m in cfg["methods"].items():
        if "@s" in name:  # reserved: `name@s<k>` is the run of method `name` with seed k
            raise ConfigError(f"config: methods.{name}: method names must not contain '@s'")
        if m["type"] not in registry.METHOD_TYPES:
            _fail(f"methods.{name}.type", m["type"], registry.METHOD_TYPES)
        if "prior" in m and m["prior"] not in cfg["priors"]:
            _fail(f"methods.{name}.prior", m["prior"], cfg["priors"])
        if m["type"] == "fair_calib" and "prior" not in m and m.get("weighting") != "uniform":
            raise ConfigError(f"config: methods.{name} (type fair_calib) needs a `prior` key "
                             f"(or weighting: uniform); choose one of {sorted(cfg['priors'])}")
    for name, p in cfg["priors"].items():
        if p["probe"] not in cfg["probes"]:
            _fail(f"priors.{name}.probe", p["probe"], cfg["probes"])
    for name, t in cfg["tasks"].items():
        if t["kind"] == "lm_eval" and "lm_eval_task" not in t:
            raise ConfigError(f"config: tasks.{name} (kind lm_eval) needs `lm_eval_task`")
    for tname, t in cfg["tables"].items():
        if t["kind"] not in MEMORY_TABLES and "tasks" not in t:
            raise ConfigError(f"config: tables.{tname} (kind {t['kind']}) needs `tasks`")
        for key in ("models", "methods", "tasks"):
            for item in t.get(key, []):
                if item not in cfg[key]:
                    _fail(f"tables.{tname}.{key}", item, cfg[key])
        for key, section in (("model", "models"), ("baseline", "methods"), ("method", "methods")):
            if key in t and t[key] not in cfg[section]:
                _fail(f"tables.{tname}.{key}", t[key], cfg[section])
        for method, *_ in t.get("rows", []):
            if method not in cfg["methods"]:
                _fail(f"tables.{tname}.rows", method, cfg["methods"])
        if t["bits"] not in cfg["bits"]:
            _fail(f"tables.{tname}.bits", t["bits"], cfg["bits"])
        _check_method_bits(cfg, tname, t)
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True) and diag:
        for item in diag.get("models", []):
            if item not in cfg["models"]:
                _fail("diagnostics.models", item, cfg["models"])
        for item in diag.get("methods", []):
            if item not in cfg["methods"]:
                _fail("diagnostics.methods", item, cfg["methods"])
        if diag.get("bits") and diag["bits"] not in cfg["bits"]:
            _fail("diagnostics.bits", diag["bits"], cfg["bits"])
        if diag.get("probe") and diag["probe"] not in cfg["probes"]:
            _fail("diagnostics.probe", diag["probe"], cfg["probes"])
        for i, pair in enumerate(diag.get("cross_corpus", [])):
            for k in ("a", "b"):
                model, prior = pair[k].split("/")
                if model not in cfg["models"]:
                    _fail(f"diagnostics.cross_corpus[{i}].{k} (model)", model, cfg["models"])
                if prior not in cfg["priors"]:
                    _fail(f"diagnostics.cross_corpus[{i}].{k} (prior)", prior, cfg["priors"])
    # the offline data a run reads: checked_data() below, once the used names are known
    if diag.get("enabled", True) and diag.get("models") and not any(
            m["type"] == "fp" for m in cfg["methods"].values()):
        raise ConfigError("config: diagnostics need an FP method (a methods entry with type: fp) "
                         "as the teacher; add one, e.g. `fp: {type: fp, label: FP}`, or set "
                         "diagnostics.enabled: false")
    for name in cfg.get("resources", {}):
        if name != "default" and name not in RULES_WITH_RESOURCES:
            _fail(f"resources.{name}", name, ("default",) + RULES_WITH_RESOURCES)
    check_labels(cfg)
    check_shapes(cfg)
    check_prior_ablation(cfg)


def check_prior_ablation(cfg):
    """prior_ablation names known models, methods, bits and a task; its floor variants weight
    positions by a prior."""
    abl = cfg.get("prior_ablation", {})
    if not (abl.get("enabled", True) and abl.get("models")):
        return
    for item in abl["models"]:
        if item not in cfg["models"]:
            _fail("prior_ablation.models", item, cfg["models"])
    for key in ("methods", "floors"):
        for item in abl.get(key, []):
            if item not in cfg["methods"]:
                _fail(f"prior_ablation.{key}", item, cfg["methods"])
    for item in abl.get("floors", []):
        if "prior" not in cfg["methods"][item] or cfg["methods"][item].get("weighting") == "uniform":
            raise ConfigError(f"config: prior_ablation.floors: {item} does not weight positions "
                              "by a prior (it needs a `prior` and weighting: prior)")
    if abl.get("reference") is not None and abl["reference"] not in cfg["methods"]:
        _fail("prior_ablation.reference", abl["reference"], cfg["methods"])
    for key, section in (("bits", "bits"), ("task", "tasks")):
        if abl.get(key) not in cfg[section]:
            _fail(f"prior_ablation.{key}", abl.get(key), cfg[section])


def _check_window(key, d):
    """A decoding window splits into whole blocks, and the steps among them."""
    gen, block, steps = d.get("gen_length"), d.get("block_length"), d.get("steps")
    if gen and block and gen % block:
        raise ConfigError(f"config: {key}.block_length = {block} does not divide gen_length = "
                          f"{gen} (the window is decoded in whole blocks)")
    if gen and block and steps and steps % (gen // block):
        raise ConfigError(f"config: {key}.steps = {steps} do not divide among the "
                          f"{gen // block} blocks of gen_length {gen} / block_length {block}")


def check_shapes(cfg):
    """Settings whose numbers must fit together, which a job would only find at run time."""
    for name, m in cfg["models"].items():
        train = m.get("train") or {}
        if train.get("hidden") and train.get("heads") and train["hidden"] % train["heads"]:
            raise ConfigError(f"config: models.{name}.train.heads = {train['heads']} does not "
                              f"divide hidden = {train['hidden']}")
        if m.get("decoding"):
            _check_window(f"models.{name}.decoding", m["decoding"])
    for name, t in cfg["tasks"].items():
        _check_window(f"tasks.{name}", t)
        for section in ("by_family", "by_model"):
            for key, over in (t.get(section) or {}).items():
                _check_window(f"tasks.{name}.{section}.{key}", {**t, **over})


def _label(cfg, section, name, key="label"):
    """What is printed for an entry: its ``label`` (or ``latex_label``, in the tables), else
    its name."""
    entry = cfg[section][name]
    return entry.get(key) or entry.get("label", name)


def _first_clash(cfg, section, names, where, key="label"):
    """Two entries of ``section`` among ``names`` (printed together by ``where``) with one label."""
    seen = {}
    for name in dict.fromkeys(names):
        if name not in cfg.get(section, {}):
            continue
        label = _label(cfg, section, name, key)
        if label in seen:
            raise ConfigError(
                f"config: {section}.{seen[label]}.{key} and {section}.{name}.{key} are both "
                f"{label!r}; {where} would print two of them under one name. Give them "
                "different labels.")
        seen[label] = name


def check_labels(cfg):
    """No table or figure prints two models, methods or tasks under one label (a label absent
    is the entry's name)."""
    for tname, t in cfg["tables"].items():
        where = f"tables.{tname}"
        for key in ("label", "latex_label"):        # the figures' and the LaTeX tables' names
            _first_clash(cfg, "models", t.get("models", []) + [t[k] for k in ("model",) if k in t],
                         where, key)
            _first_clash(cfg, "methods", t.get("methods", []) + [t[k] for k in ("baseline", "method")
                                                                  if k in t], where, key)
            _first_clash(cfg, "tasks", t.get("tasks", []), where, key)
        rows = [row[1] if len(row) > 1 else _label(cfg, "methods", row[0])
                for row in t.get("rows", []) if row[0] in cfg["methods"]]
        dup = sorted({r for r in rows if rows.count(r) > 1})
        if dup:
            raise ConfigError(f"config: tables.{tname}.rows: the row label {dup[0]!r} is given "
                              "twice; give each row its own label.")
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True):
        _first_clash(cfg, "models", diag.get("models", []), "the diagnostics' figures")
        fps = [m for m, e in cfg["methods"].items() if e.get("type") == "fp"][:1]
        _first_clash(cfg, "methods", fps + diag.get("methods", []), "the diagnostics' figures")


def validated(cfg):
    """Everything the Snakefile checks before any job, for a CLI that reads a whole config
    (``fair-calib cost``): schema (types, ranges, unknown keys, defaults filled), the
    cross-references and labels above, and the tasks' per-family/per-model overrides."""
    from fair_calib.evaluate.task_settings import check_task_overrides

    validate_config(cfg)
    check_config(cfg)
    try:
        check_task_overrides(cfg, registry.FAMILIES)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return cfg


def _check_method_bits(cfg, tname, t) -> None:
    """A main table's ``method_bits`` names its own methods and defined bits; a weight-only
    method type (gptq, awq) is never asked for quantized activations."""
    from .registry import WEIGHT_ONLY_TYPES

    mb = t.get("method_bits", {})
    if mb and t["kind"] != "main":
        raise ConfigError(f"config: tables.{tname}.method_bits: only main tables take it "
                          f"(kind {t['kind']})")
    for method, bits in mb.items():
        if method not in t["methods"]:
            _fail(f"tables.{tname}.method_bits", method, t["methods"])
        if bits not in cfg["bits"]:
            _fail(f"tables.{tname}.method_bits.{method}", bits, cfg["bits"])
    for method in t["methods"]:
        mtype = cfg["methods"].get(method, {}).get("type")
        bits = mb.get(method, t["bits"])
        if mtype in WEIGHT_ONLY_TYPES and int(cfg["bits"][bits]["a_bits"]) < 16:
            raise ConfigError(f"config: tables.{tname}: method {method} (type {mtype}) is "
                              f"weight-only but runs at {bits}; give it a_bits 16 bits (e.g. "
                              f"w4a16) in tables.{tname}.method_bits")
