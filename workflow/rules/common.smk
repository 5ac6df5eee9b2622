# Input functions, settings and resources shared by every stage's rules.
import json
import os
import re
import sys

from fair_calib import registry

PY = "python -m fair_calib.cli"


# ---------------------------------------------------------------- validation (before any job)
def _fail(key, value, valid):
    raise ValueError(f"config: {key} = {value!r} is not valid; choose one of {sorted(valid)}")


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
            raise ValueError(f"config: models.{name}.source = 'train' is only valid for tiny families")
        if m["source"] == "convert":
            _check_convert(cfg, name, m)
        elif "convert_from" in m:
            raise ValueError(f"config: models.{name}.convert_from is only read with source: convert")
    for name in cfg["bits"]:
        if not re.fullmatch(r"w\d+a\d+", name):
            raise ValueError(f"config: bits.{name}: names must look like w4a4 (weights/activations)")
    for name, m in cfg["methods"].items():
        if "@s" in name:  # reserved: `name@s<k>` is the run of method `name` with seed k
            raise ValueError(f"config: methods.{name}: method names must not contain '@s'")
        if m["type"] not in registry.METHOD_TYPES:
            _fail(f"methods.{name}.type", m["type"], registry.METHOD_TYPES)
        if "prior" in m and m["prior"] not in cfg["priors"]:
            _fail(f"methods.{name}.prior", m["prior"], cfg["priors"])
        if m["type"] == "fair_calib" and "prior" not in m and m.get("weighting") != "uniform":
            raise ValueError(f"config: methods.{name} (type fair_calib) needs a `prior` key "
                             f"(or weighting: uniform); choose one of {sorted(cfg['priors'])}")
    for name, p in cfg["priors"].items():
        if p["probe"] not in cfg["probes"]:
            _fail(f"priors.{name}.probe", p["probe"], cfg["probes"])
    for name, t in cfg["tasks"].items():
        if t["kind"] == "lm_eval" and "lm_eval_task" not in t:
            raise ValueError(f"config: tasks.{name} (kind lm_eval) needs `lm_eval_task`")
    for tname, t in cfg["tables"].items():
        if t["kind"] not in MEMORY_TABLES and "tasks" not in t:
            raise ValueError(f"config: tables.{tname} (kind {t['kind']}) needs `tasks`")
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
        raise ValueError("config: diagnostics need an FP method (a methods entry with type: fp) "
                         "as the teacher; add one, e.g. `fp: {type: fp, label: FP}`, or set "
                         "diagnostics.enabled: false")
    for name in cfg.get("resources", {}):
        if name != "default" and name not in RULES_WITH_RESOURCES:
            _fail(f"resources.{name}", name, ("default",) + RULES_WITH_RESOURCES)
    check_prior_ablation(cfg)


def check_prior_ablation(cfg):
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
            raise ValueError(f"config: prior_ablation.floors: {item} does not weight positions by "
                             "a prior (it needs a `prior` and weighting: prior)")
    if abl.get("reference") is not None and abl["reference"] not in cfg["methods"]:
        _fail("prior_ablation.reference", abl["reference"], cfg["methods"])
    for key, section in (("bits", "bits"), ("task", "tasks")):
        if abl.get(key) not in cfg[section]:
            _fail(f"prior_ablation.{key}", abl.get(key), cfg[section])


MEMORY_TABLES = ("calib_memory", "deploy_memory")
RULES_WITH_RESOURCES = ("make_data", "train_tiny", "convert_hub", "probe_shard", "prior", "calibrate",
                        "evaluate_shard", "gather_eval", "trajectories", "diagnose", "figures",
                        "table", "floor_sweep")
try:
    check_config(config)
except ValueError as err:  # one line, no traceback: the message names the key
    sys.exit(f"Error: {err}")


# ---------------------------------------------------------------- prior ablation (rule all)
ABLATION = config.get("prior_ablation", {})


def ablation_enabled():
    return ABLATION.get("enabled", True) and bool(ABLATION.get("models"))


def ablation_table():
    """prior_ablation's table, made by the `table` rule like a configured one: FP, then the
    compared methods, then the floor variants, on the ablation's task."""
    fp = [m for m in config["methods"] if config["methods"][m]["type"] == "fp"][:1]
    methods = list(dict.fromkeys(fp + ABLATION.get("methods", []) + ABLATION["floors"]))
    task = config["tasks"][ABLATION["task"]].get("label", ABLATION["task"])
    return {"kind": "main", "models": ABLATION["models"], "methods": methods,
            "bits": ABLATION["bits"], "tasks": [ABLATION["task"]],
            "caption": f"What FAIR-Calib's position prior does at {ABLATION['bits'].upper()}: "
                       f"the Stage I prior, uniform position weights, and the prior's floor "
                       f"(weight of the calibration positions outside the generation window) "
                       f"swept ({task}, accuracy, %)."}


if ablation_enabled():
    config["tables"]["prior_ablation"] = ablation_table()


# ---------------------------------------------------------------- grid
SEED_SEP = "@s"  # a method run with calibration seed k is the method wildcard `name@sk`


def base_method(method):
    """The config name of a method wildcard (`fair-calib@s1` -> `fair-calib`)."""
    return method.split(SEED_SEP, 1)[0]


def method_cfg(method):
    return config["methods"][base_method(method)]


def method_runs(method):
    """The method wildcards of a configured method: one per calibration seed of `seeds`
    (tables report mean ± std over them), else the method itself (the top-level seed)."""
    seeds = method_cfg(method).get("seeds")
    return [f"{method}{SEED_SEP}{s}" for s in seeds] if seeds else [method]


def run_seed(method):
    """The calibration seed of a method wildcard: its `@s<k>`, else the top-level seed."""
    _, sep, k = method.partition(SEED_SEP)
    return int(k) if sep else config["seed"]


def is_fp(method):
    return method_cfg(method)["type"] == "fp"


def bits_for(method, bits):
    """FP is a method like the others; its bits wildcard is the literal `fp`."""
    return "fp" if is_fp(method) else bits


def table_methods(t):
    extra = [t[k] for k in ("baseline", "method") if k in t] + [m for m, *_ in t.get("rows", [])]
    return list(dict.fromkeys(t["methods"] + extra))


def table_inputs(table):
    """The files a table is made from: eval rows, or calibration stats/meta for memory tables."""
    t = config["tables"][table]
    models = list(dict.fromkeys(t["models"] + ([t["model"]] if "model" in t else [])))
    # memory is a property of the method, not of the seed: its first run stands for it
    if t["kind"] == "calib_memory":
        return [f"{calib_dir(m, method_runs(x)[0], t['bits'])}/stats.parquet"
                for m in models for x in table_methods(t) if not is_fp(x)]
    if t["kind"] == "deploy_memory":
        return [f"{calib_dir(m, method_runs(x)[0], t['bits'])}/meta.json"
                for m in models for x in table_methods(t) if not is_fp(x)]
    return sorted({f"results/eval/{m}/{run}/{bits_for(x, t['bits'])}/{task}.parquet"
                   for m in models for x in table_methods(t) for run in method_runs(x)
                   for task in t["tasks"]})


# ---------------------------------------------------------------- paths of stage inputs
def trained(model):
    return config["models"][model]["source"] == "train"


def converted(model):
    return config["models"][model]["source"] == "convert"


def model_dir(model):
    src = config["models"][model]["source"]
    if src == "train":
        return f"resources/models/{model}"
    return f"resources/hub/{model}" if src == "convert" else src


def model_input(wc):
    """A trained tiny model or its hub-layout copy is a file input; a hub id or external
    folder is not tracked."""
    if trained(wc.model) or converted(wc.model):
        return [model_dir(wc.model)]
    return []


SYNTHETIC_FILES = ["train.txt", "calib.jsonl", "probe.jsonl", "facts.jsonl", "synth_mc.jsonl",
                   "synth_gen.jsonl", "manifest.json"]


def used_names():
    """Tasks, methods and probes some table or the diagnostics actually need (a config merged
    over the default keeps the default's unused entries; they must not add jobs)."""
    tasks, methods = set(), set()
    for t in config["tables"].values():
        tasks.update(t.get("tasks", []))
        methods.update(table_methods(t))
    diag = config.get("diagnostics", {})
    if diag.get("enabled", True):
        methods.update(diag.get("methods", []))
    priors = {config["methods"][m].get("prior") for m in methods} - {None}
    probes = {config["priors"][p]["probe"] for p in priors}
    if diag.get("enabled", True) and diag.get("models"):
        probes.add(diag.get("probe", "default"))
    return tasks, methods, probes


def uses_synthetic_data():
    """The synthetic corpus feeds the tiny models and any stage configured to read it."""
    tasks, methods, probes = used_names()
    datasets = [config["probes"][p]["dataset"] for p in probes if p in config["probes"]]
    calib = {calibration_entry(m)["dataset"] for m in methods if not is_fp(m)}
    return (any(d in ("synthetic", "facts") for d in datasets) or "synthetic" in calib
            or any(config["tasks"][t]["kind"].startswith("synthetic") for t in tasks))


def evaluated_pairs():
    """(model, task) of every evaluation some table asks for."""
    return [(m, t) for tab in config["tables"].values() for t in tab.get("tasks", [])
            for m in tab.get("models", []) + ([tab["model"]] if tab.get("model") else [])]


def check_used_data():
    """The offline files (data_dir) of every probe, calibration set and task the run uses
    exist: a missing folder fails here, before any job, not after minutes of training."""
    from fair_calib.config import ConfigError, check_data, check_offline_tasks

    tasks, methods, probes = used_names()
    calib = {calibration_entry(m)["dataset"] for m in methods if not is_fp(m)}
    calib |= {e.get("dataset") for m in methods if not is_fp(m)
              for e in config["methods"][m].get("calibration_by_family", {}).values()} - {None}
    try:
        check_offline_tasks(config, evaluated_pairs())
        check_data(config, [p for p in probes if p in config["probes"]], tasks, calib)
    except ConfigError as err:
        sys.exit(f"Error: {err}")
    from fair_calib.config import missing_model_folder

    models = {m for t in config["tables"].values() for m in t.get("models", []) + [t.get("model")]}
    diag = config.get("diagnostics", {})
    if diag.get("enabled", True):
        models |= set(diag.get("models", []))
    for m in sorted(models - {None}):
        err = missing_model_folder(config["models"][m]["source"])
        if err:
            sys.exit(f"Error: config: models.{m}.source: {err}")


def synthetic_inputs(wc=None):
    model = getattr(wc, "model", None)
    needed = uses_synthetic_data() or (model is not None and trained(model))
    return [os.path.join(config["synthetic_dir"], f) for f in SYNTHETIC_FILES] if needed else []


def calib_dir(model, method, bits):
    return f"results/calib/{model}/{method}/{bits}"


def prior_of(method):
    return method_cfg(method).get("prior")


# ---------------------------------------------------------------- settings passed to a stage
COMMON_KEYS = ("seed", "device", "dtype", "synthetic_dir")
DATA_KEYS = ("data_dir", "data_source")  # only in the settings of jobs that read external data


def reads_external_data(sections):
    """Whether a job with these settings sections reads data_dir / the hub."""
    probe, calib, task = (sections.get(k) or {} for k in ("probe", "calibration", "task"))
    return (probe.get("dataset") in ("gsm8k", "wikitext2") or calib.get("dataset") == "wikitext2"
            or task.get("kind") == "lm_eval")


def settings(**sections):
    """The exact config a job depends on, as JSON. A change here reruns that job only: so
    data_dir is in it only for jobs that read it, and run-time knobs (train.threads) never."""
    out = {k: config.get(k) for k in COMMON_KEYS}
    if reads_external_data(sections):
        out.update({k: config.get(k) for k in DATA_KEYS})
    out.update(sections)
    return json.dumps(out, sort_keys=True)


RUNTIME_TRAIN_KEYS = ("threads",)  # how fast, not what: passed on the command line instead


def model_entry(model):
    entry = {"name": model, **config["models"][model]}
    if "train" in entry:
        entry["train"] = {k: v for k, v in entry["train"].items() if k not in RUNTIME_TRAIN_KEYS}
    return entry


def train_threads(model):
    """train.threads of a tiny model (its torch threads), else the rule's threads."""
    return config["models"][model].get("train", {}).get("threads") or threads_for("train_tiny")


def method_entry(method):
    """The method's config under its wildcard name (`fair-calib@s1`: the table splits it into
    method and seed). `seeds` is left out: adding a seed must not rerun the existing runs."""
    return {"name": method, **{k: v for k, v in method_cfg(method).items() if k != "seeds"}}


def bits_entry(bits):
    return {"name": bits, **config["bits"][bits]} if bits != "fp" else {"name": "fp"}


def probe_entry(probe):
    return {"name": probe, **config["probes"][probe]}


def calibration_entry(method, model=None):
    """The calibration section with the method's overrides, and its per-family overrides
    (`calibration_by_family`, e.g. FlatQuant's 4096 tokens on LLaDA, 2048 on Dream)."""
    entry = method_cfg(method)
    out = {**config["calibration"], **entry.get("calibration", {})}
    if model is not None:
        out.update(entry.get("calibration_by_family", {}).get(config["models"][model]["family"], {}))
    return out


# ---------------------------------------------------------------- resources from config
def _res(rule, key, default=None):
    from fair_calib.job_resources import setting

    return setting(config.get("resources", {}), rule, key, default)


def resources_for(rule):
    """Resource table of a rule (fair_calib/job_resources.py): memory grows with `attempt` on
    retry, and a list value (gpu_model, gres, constraint, ...) names one value per attempt."""
    from fair_calib.job_resources import rule_resources

    return rule_resources(config.get("resources", {}), rule)


def threads_for(rule):
    return _res(rule, "threads", 1)


def log_path(rule, pattern):
    return f"logs/{rule}/{pattern}.log"


check_used_data()


# ---------------------------------------------------------------- console progress of long jobs
PROGRESS_SECONDS = 30  # FAIR_CALIB_PROGRESS_SECONDS overrides it at run time


def progress(job):
    """A shell prefix that prints, every PROGRESS_SECONDS, one line `[job] <the log's last
    progress line>` on the console while the job runs (its full output stays in the log), so
    minutes of training are not silent and parallel jobs stay readable: one prefixed line each."""
    return (f"( while sleep ${{{{FAIR_CALIB_PROGRESS_SECONDS:-{PROGRESS_SECONDS}}}}}; do l=$(tail -c 400 {{log}} 2>/dev/null | tr '\\r' '\\n'"
            f" | grep -v '^[[:space:]]*$' | tail -n 1); [ -n \"$l\" ] && echo \"[{job}] $l\"; done ) &"
            " _progress=$!; trap 'kill $_progress 2>/dev/null || true' EXIT; ")
