"""Cross-reference checks of a config, which its JSON schema cannot express: a table naming an
unknown model, a method of an unregistered type, a prior naming an unknown probe, two entries
one table would print under the same label, a label that is not one trimmed line
(``label_text``), a method setting its job would refuse on a model's widths
(``method_shapes``), ... Torch-free: the Snakefile runs them at parse
time (workflow/rules/common.smk), before any job, and ``fair-calib cost`` on the config it
projects. Every error is a one-line :class:`fair_calib.checks.config.ConfigError` naming the key."""
from __future__ import annotations

import re
import sys

from fair_calib.names import registry
from fair_calib.checks.config import ConfigError, merged_config, validate_config
from fair_calib.evaluate.task_settings import resolve_task, use_by_model
from fair_calib.checks.label_text import check_label_text
from fair_calib.checks.method_shapes import check_method_shapes

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
    if m.get("outliers"):
        _check_outliers(cfg, name, m["outliers"])


def _check_outliers(cfg, name, outliers):
    """What the convert job would refuse (fair_calib/models/outliers.py), refused here: a scale
    that is not a finite number (it would write inf and NaN weights), more channels than a
    site's width (the job fails after Snakemake has deleted the finished conversion)."""
    import math

    from fair_calib.checks.model_widths import model_widths

    key = f"models.{name}.outliers"
    scale = outliers.get("scale")
    if not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ConfigError(f"config: {key}.scale = {scale!r} is not a finite number; give the "
                          f"outlier channels' magnitude over the model's own, e.g. 30")
    w = model_widths(cfg, name)
    if w is None:
        return
    # the sites' widths: the norm's (hidden), v_proj's output (kv heads x head_dim: the tiny
    # models have as many kv heads as heads), up_proj's output (intermediate)
    widths = {"norm": (w.hidden, w.where["hidden"]),
              "v_o": (w.heads * w.head_dim, f"{w.where['heads']} x {w.where['head_dim']}"),
              "up_down": (w.intermediate, w.where["intermediate"])}
    sites = outliers.get("sites") or list(widths)
    channels = outliers.get("channels")
    over = [s for s in sites if s in widths and channels > widths[s][0]]
    if over:
        at_most = min(widths[s][0] for s in sites if s in widths)
        said = ", ".join(f"{s}: {widths[s][0]} ({widths[s][1]})" for s in sites if s in widths)
        raise ConfigError(f"config: {key}.channels = {channels} exceeds the model's widths "
                          f"({said}); at most {at_most}")


def check_config(cfg):
    """Cross-reference checks the JSON schema cannot express. Every error names the key."""
    for name, m in cfg["models"].items():
        if m["family"] not in registry.FAMILIES:
            _fail(f"models.{name}.family", m["family"], registry.FAMILIES)
        if m["source"] == "train" and not m["family"].startswith("tiny-"):
            raise ConfigError(f"config: models.{name}.source = 'train' is only valid for tiny families")
        if m["source"] == "convert":
            _check_convert(cfg, name, m)
        else:
            for key in ("convert_from", "outliers"):
                if key in m:
                    raise ConfigError(f"config: models.{name}.{key} is only read with "
                                      "source: convert")
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
    check_method_shapes(cfg)
    check_limits(cfg)


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
    """Every label is one line of trimmed text that fits a table column, and no table or
    figure prints two models, methods or tasks under one label (a label absent is the entry's
    name)."""
    check_label_text(cfg)
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


def load_config(configfiles, base=None) -> dict:
    """The config Snakemake runs: ``base`` (default: ``config/config.yaml`` of the checkout
    this runs in, the current directory) with each of ``configfiles`` merged over it in turn,
    checked as the Snakefile checks it before any job, the schema's defaults filled. A missing
    or non-YAML file or an invalid config raises a one-line :class:`ConfigError` naming the
    file or key."""
    return validated(merged_config(configfiles, base))


def _check_method_bits(cfg, tname, t) -> None:
    """A main table's ``method_bits`` names its own methods and defined bits; a weight-only
    method type (gptq, awq) is never asked for quantized activations."""
    from ..names.registry import WEIGHT_ONLY_TYPES

    mb = t.get("method_bits", {})
    for key in ("significance", "reference"):
        if key in t and t["kind"] != "main":
            raise ConfigError(f"config: tables.{tname}.{key}: only main tables take it "
                              f"(kind {t['kind']})")
    if "reference" in t and t["reference"] not in t["methods"]:
        _fail(f"tables.{tname}.reference", t["reference"], t["methods"])
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

# ---------------------------------------------------------------- limits the plan can know
# A job that fails on a size its config asked for has already cost its finished outputs:
# Snakemake deletes a job's old outputs before running it. So every size that can be compared
# with its source from the config alone is compared here, before any job.
SYNTHETIC_PROMPTS = {"synthetic": "n_probe", "facts": "n_facts"}      # probe dataset -> corpus key
SYNTHETIC_ITEMS = {"synthetic_mc": "n_mc", "synthetic_gen": "n_gen"}  # task kind -> corpus key
CORPUS_KEYS = {"n_probe": "corpus.n_probe", "n_facts": "corpus.n_facts",
               "n_mc": "corpus.n_mc_items", "n_gen": "corpus.n_gen_items"}
STORED_ACTIVATIONS = 2   # a block's inputs and its targets, held for every calibration window


def corpus_sizes(cfg) -> dict:
    """The synthetic corpus's sizes as make-data builds them (its defaults, the config's keys)."""
    from fair_calib.models.tiny.corpus import DEFAULT_CORPUS, normalise_corpus_settings

    given = normalise_corpus_settings(cfg.get("corpus"))
    sizes = {**DEFAULT_CORPUS, **given}
    if "n_eval_items" in given:
        sizes["n_mc"] = given.get("n_mc", given["n_eval_items"])
        sizes["n_gen"] = given.get("n_gen", given["n_eval_items"])
    return sizes


def used_methods(cfg) -> set:
    """Methods some job of the run computes: the tables', the diagnostics', the ablation's."""
    used = set()
    for t in cfg["tables"].values():
        used.update(t.get("methods", []))
        used.update(t[k] for k in ("baseline", "method") if k in t)
        used.update(row[0] for row in t.get("rows", []))
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True) and diag.get("models"):
        used.update(diag.get("methods", []))
    abl = cfg.get("prior_ablation", {})
    if abl.get("enabled", True) and abl.get("models"):
        used.update(abl.get("methods", []) + abl.get("floors", []))
        used.update([abl["reference"]] if abl.get("reference") else [])
    return used & set(cfg["methods"])


def used_priors(cfg) -> set:
    priors = {cfg["methods"][m].get("prior") for m in used_methods(cfg)} - {None}
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True) and diag.get("models"):
        priors.update(pair[k].split("/")[1] for pair in diag.get("cross_corpus", [])
                      for k in ("a", "b"))
    return priors & set(cfg["priors"])


def _prompts_of(cfg, dataset):
    """How many prompts a probe dataset holds, where the config says it (the synthetic
    corpus), with the key that says it; (None, None) for offline data (data_dir)."""
    key = SYNTHETIC_PROMPTS.get(dataset)
    return (corpus_sizes(cfg)[key], CORPUS_KEYS[key]) if key else (None, None)


def check_limits(cfg):
    """Sizes against their sources: a prior's n_probe against its probe's samples, a probe's
    and the diagnostics' samples against the prompts, a CPU calibration's stored activations
    against the calibrate job's declared memory."""
    probes = set()
    for name in sorted(used_priors(cfg)):
        prior = cfg["priors"][name]
        probe = cfg["probes"][prior["probe"]]
        probes.add(prior["probe"])
        if prior.get("n_probe") is not None and prior["n_probe"] > probe["n_samples"]:
            raise ConfigError(
                f"config: priors.{name}.n_probe = {prior['n_probe']} is more than the "
                f"{probe['n_samples']} samples of its probe (probes.{prior['probe']}.n_samples); "
                f"lower n_probe, or raise the probe's n_samples")
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True) and diag.get("models"):
        dprobe = diag.get("probe", "default")
        have, key = _prompts_of(cfg, cfg["probes"][dprobe]["dataset"])
        n = diag.get("n_samples", 16)
        if have is not None and n > have:
            raise ConfigError(
                f"config: diagnostics.n_samples = {n} is more than the {have} prompts of the "
                f"probe's dataset ({cfg['probes'][dprobe]['dataset']}: {key}); lower "
                f"diagnostics.n_samples, or raise {key}")
    for name in sorted(probes):
        probe = cfg["probes"][name]
        have, key = _prompts_of(cfg, probe["dataset"])
        if have is not None and probe["n_samples"] > have:
            raise ConfigError(
                f"config: probes.{name}.n_samples = {probe['n_samples']} is more than the {have} "
                f"prompts of its dataset ({probe['dataset']}: {key}); lower n_samples, or "
                f"raise {key}")
    check_calibration_memory(cfg)


def hidden_size(cfg, model):
    """A model's hidden width where the config says it (a trained tiny model, or a hub-layout
    copy of one); None for a checkpoint the config does not describe."""
    entry = cfg["models"][model]
    if entry["source"] == "convert":
        entry = cfg["models"].get(entry.get("convert_from"), {})
    return (entry.get("train") or {}).get("hidden") if entry.get("source") == "train" else None


def calibration_floor_mb(n_samples, seq_len, hidden, bytes_per_value=4):
    """A lower bound of what a calibration holds: every window's block inputs and targets
    (float32 on CPU), n_samples x seq_len x hidden values each; the model, the next block's
    inputs and the optimiser come on top."""
    return STORED_ACTIVATIONS * n_samples * seq_len * hidden * bytes_per_value / 2**20


def check_calibration_memory(cfg):
    """A CPU calibration whose stored activations alone exceed resources.calibrate.mem_mb is
    refused: it would swap for hours or be killed, not fail fast."""
    from fair_calib.jobs.job_resources import setting

    if cfg.get("device", "cpu") != "cpu":
        return       # activations live on the GPU, whose memory no resource declares
    table = cfg.get("resources", {})
    declared = setting(table, "calibrate", "mem_mb", 2000)
    models = {m for t in cfg["tables"].values() for m in t.get("models", []) + [t.get("model")]}
    diag = cfg.get("diagnostics", {})
    if diag.get("enabled", True):
        models |= set(diag.get("models", []))
    abl = cfg.get("prior_ablation", {})
    if abl.get("enabled", True):
        models |= set(abl.get("models", []))
    for method in sorted(used_methods(cfg)):
        m = cfg["methods"][method]
        if m["type"] == "fp":
            continue
        for model in sorted(models - {None}):
            hidden = hidden_size(cfg, model)
            calib = {**cfg["calibration"], **m.get("calibration", {}),
                     **m.get("calibration_by_family", {}).get(cfg["models"][model]["family"], {})}
            if not hidden:
                continue
            need = calibration_floor_mb(calib["n_samples"], calib["seq_len"], hidden)
            if need > declared:
                raise ConfigError(
                    f"config: calibration.n_samples = {calib['n_samples']} x seq_len "
                    f"{calib['seq_len']} on {model} (hidden {hidden}) stores at least "
                    f"{need:,.0f} MB of block inputs and targets (methods.{method}), more than "
                    f"resources.calibrate.mem_mb = {declared}; lower n_samples or raise mem_mb")


def shard_notes(cfg) -> list[str]:
    """Shard counts beyond the work they split (shards that compute nothing): one note each."""
    notes = []
    sizes = corpus_sizes(cfg)
    for name, t in cfg["tasks"].items():
        shards = [(f"tasks.{name}.shards", t.get("shards", 1), t.get("limit"))]
        for section in ("by_family", "by_model"):
            for key, over in (t.get(section) or {}).items():
                if "shards" in over:
                    shards.append((f"tasks.{name}.{section}.{key}.shards", over["shards"],
                                   over.get("limit", t.get("limit"))))
        items = sizes.get(SYNTHETIC_ITEMS.get(t["kind"], ""))
        for key, n, limit in shards:
            cap = [x for x in (items, limit if isinstance(limit, int) else None) if x]
            if cap and n > min(cap):
                notes.append(f"Note: config: {key} = {n} splits {min(cap)} items; "
                             f"{n - min(cap)} of its shards per model and method evaluate "
                             "nothing (each still a job)")
    for name, p in cfg["probes"].items():
        size = p.get("batch_size") or 8       # the schema's default
        batches = -(-p["n_samples"] // size)
        if p.get("shards", 1) > batches:
            notes.append(f"Note: config: probes.{name}.shards = {p['shards']} splits "
                         f"{batches} batches of {size} samples; "
                         f"{p['shards'] - batches} of its shards probe nothing (each still a job)")
    return notes


def mc_num_notes(cfg) -> list[str]:
    """``mc_num`` set on a task whose every answer is scored exactly: a synthetic multiple-choice
    task (one-word answers) evaluated only by models whose tokenizer makes a word one token and
    whose estimator enumerates a one-token target (``exact_below`` >= 2). The Monte-Carlo
    sample count then changes nothing; one note per key that sets it."""
    from fair_calib.checks.plan import eval_cells

    by_model = use_by_model(cfg)
    evaluated: dict[str, set] = {}
    for model, _, _, task in eval_cells(cfg):
        evaluated.setdefault(task, set()).add(model)
    notes = []
    for name, t in cfg["tasks"].items():
        if t["kind"] != "synthetic_mc" or name not in evaluated:
            continue
        keys = [(f"tasks.{name}.mc_num", None, t)] + [
            (f"tasks.{name}.{section}.{key}.mc_num", (section, key), over)
            for section in ("by_family", "by_model") for key, over in (t.get(section) or {}).items()]
        for key, scope, over in keys:
            if "mc_num" not in over:
                continue
            models = sorted(m for m in evaluated[name]
                            if scope is None
                            or (scope[0] == "by_family" and cfg["models"][m]["family"] == scope[1])
                            or (scope[0] == "by_model" and m == scope[1]))
            exact = [m for m in models if _scores_one_token_exactly(cfg, name, m, by_model)]
            if models and exact == models:
                below = sorted({_exact_below(cfg, name, m, by_model) for m in models})
                notes.append(f"Note: config: {key} = {over['mc_num']} has no effect: every "
                             f"answer of {t.get('label', name)} ({name}) is one token, which "
                             f"{_and(models)} score exactly (exact_below "
                             f"{'/'.join(map(str, below))}), drawing no Monte-Carlo samples; "
                             "the key can go")
    return notes


def _and(names) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _exact_below(cfg, task, model, by_model) -> int:
    family = cfg["models"][model]["family"]
    resolved = resolve_task(task, cfg["tasks"][task], model, family, by_model=by_model)
    return int(resolved.get("exact_below", registry.EXACT_BELOW.get(family, 0)))


def _scores_one_token_exactly(cfg, task, model, by_model) -> bool:
    return (cfg["models"][model]["family"] in registry.WORD_TOKENIZER_FAMILIES
            and _exact_below(cfg, task, model, by_model) >= 2)


def config_notes(cfg) -> list[str]:
    """Every note on a valid config: settings that make jobs compute nothing or nothing new."""
    return shard_notes(cfg) + mc_num_notes(cfg)


def run_cli(argv: list[str] | None = None) -> None:
    """``fair-calib check-config [FILE...]``: YAML syntax (file:line:column), types, ranges,
    unknown keys and method settings of config/config.yaml with FILEs merged over it, as
    ``snakemake --configfile FILE...`` would read them (Snakemake's own message for a YAML
    syntax error in a --configfile names no line), and the cross-references and labels
    (fair_calib.checks.references); the offline data and the machine are checked by ``snakemake -n``."""
    import argparse

    ap = argparse.ArgumentParser(prog="fair-calib check-config", description=run_cli.__doc__)
    ap.add_argument("files", nargs="*", help="config files merged over config/config.yaml")
    ap.add_argument("--base", default=None,
                    help="the base config (default: config/config.yaml of the current directory)")
    a = ap.parse_args(argv)
    try:
        cfg = validated(merged_config(a.files, a.base))
    except ConfigError as err:
        sys.exit(f"error: {err}")
    for note in config_notes(cfg):
        print(note, file=sys.stderr)
    print(f"ok: {', '.join(['config/config.yaml', *a.files]) if not a.base else a.base}")
