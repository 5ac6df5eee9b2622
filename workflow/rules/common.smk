# Input functions, settings and resources shared by every stage's rules.
import json
import os
import re
import sys

from fair_calib.names import registry

PY = "python -m fair_calib.cli"


# ---------------------------------------------------------------- validation (before any job)
# check_config: the cross-references the schema cannot express (fair_calib/checks/references.py, shared
# with `fair-calib cost`), then labels that would print two rows or columns of one name.
from fair_calib.checks.references import MEMORY_TABLES, check_config


try:
    check_config(config)
except ValueError as err:  # one line, no traceback: the message names the key
    sys.exit(f"Error: {err}")
if workflow.is_main_process:
    from fair_calib.checks.references import config_notes

    # shards beyond the work they split (jobs that do nothing), mc_num where nothing is sampled
    for note in config_notes(config):
        print(note, file=sys.stderr)


def check_environment():
    """A device / dtype this machine cannot run (`device: cuda` without CUDA) is refused here,
    before any job: Snakemake deletes a job's previous outputs before running it, so a job
    that fails on it would destroy finished work first. A dry run only says so; a cluster run
    (its jobs run on GPU nodes, not here) is checked by each job's stage CLI instead."""
    from fair_calib.jobs.environment import environment_problem, runs_locally

    if not workflow.is_main_process or "--unlock" in sys.argv or config["device"] == "cpu":
        return
    problem = environment_problem(config["device"], config.get("dtype"))
    if problem is None or not runs_locally(sys.argv[1:]):
        return
    if workflow.output_settings.dryrun:
        print(f"Note: config: {problem} A run on this machine is refused.", file=sys.stderr)
    else:
        sys.exit(f"Error: config: {problem}")


check_environment()


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


def table_bits(t, method):
    """The bits a table's row of ``method`` runs at: ``method_bits`` (main tables), else ``bits``."""
    return t.get("method_bits", {}).get(method, t["bits"])


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
    return sorted({f"results/eval/{m}/{run}/{bits_for(x, table_bits(t, x))}/{task}.parquet"
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
    """A trained tiny model or its hub-layout copy is a file input (weights changed in place
    move its timestamp forward, fair_calib/jobs/model_tracking.py); a local folder is tracked by the
    record of its weights' content id; a hub id by name."""
    if trained(wc.model) or converted(wc.model):
        return [model_dir(wc.model)]
    from fair_calib.jobs.model_tracking import record_path

    record = record_path(wc.model)
    return [str(record)] if record.is_file() else []


def local_models():
    """(name, folder, written by the pipeline) of every model in use whose weights are on disk
    here: trained, converted (and what they convert), local folders; not hub ids."""
    from fair_calib.checks.config import looks_like_local_path

    names = {m for t in config["tables"].values() for m in t.get("models", []) + [t.get("model")]}
    diag = config.get("diagnostics", {})
    if diag.get("enabled", True):
        names |= set(diag.get("models", []))
    names |= {config["models"][m]["convert_from"] for m in names - {None}
              if config["models"][m]["source"] == "convert"}
    out = []
    for m in sorted(names - {None}):
        src = config["models"][m]["source"]
        if src in ("train", "convert") or looks_like_local_path(src):
            out.append((m, os.path.expanduser(model_dir(m)), src in ("train", "convert")))
    return out


def sync_model_content():
    """Weights changed in place replan the jobs that read them (fair_calib/jobs/model_tracking.py);
    not while another run holds the lock (its jobs may be writing a model)."""
    if not workflow.is_main_process or "--unlock" in sys.argv or LOCKED:
        return
    from fair_calib.jobs.model_tracking import sync_models

    for change in sync_models(local_models()):
        print(change.note(), file=sys.stderr)


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
    from fair_calib.checks.config import ConfigError, check_data, check_offline_tasks

    tasks, methods, probes = used_names()
    calib = {calibration_entry(m)["dataset"] for m in methods if not is_fp(m)}
    calib |= {e.get("dataset") for m in methods if not is_fp(m)
              for e in config["methods"][m].get("calibration_by_family", {}).values()} - {None}
    try:
        check_offline_tasks(config, evaluated_pairs())
        check_data(config, [p for p in probes if p in config["probes"]], tasks, calib)
    except ConfigError as err:
        sys.exit(f"Error: {err}")
    from fair_calib.checks.config import missing_model_folder

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
# A job's settings (its `params`, Snakemake's rerun trigger) hold what changes its output and
# nothing else. Three kinds of keys stay out of them:
#   display keys (label, latex_label, group; captions): read by the table and figures jobs
#     only, so a label edit re-renders those and reruns nothing else;
#   environment keys (device, data_dir, data_source, synthetic_dir; threads and resources):
#     where and how fast a job runs, not what it computes. They reach the stage as `--runtime`
#     in the shell command: Snakemake's code trigger compares the command's template
#     (`{RUNTIME:q}`), not its value, so editing them reruns nothing;
#   a model's `decoding` override: read by the diagnostics' trajectories only.
COMMON_KEYS = ("seed", "dtype")
from fair_calib.checks.config import ENV_SETTINGS as ENV_KEYS  # device, data_dir, data_source, synthetic_dir
DISPLAY_KEYS = ("label", "latex_label", "group")


def runtime_env():
    """The environment keys, as the JSON every stage's `--runtime` receives."""
    return json.dumps({k: config.get(k) for k in ENV_KEYS}, sort_keys=True)


RUNTIME = runtime_env()  # a global: shell commands read it as {RUNTIME:q}, outside params


def settings(**sections):
    """The exact config a job depends on, as JSON. A change here reruns that job only."""
    out = {k: config.get(k) for k in COMMON_KEYS}
    out.update(sections)
    return json.dumps(out, sort_keys=True)


RUNTIME_TRAIN_KEYS = ("threads",)  # how fast, not what: passed on the command line instead


def _without(entry, keys):
    return {k: v for k, v in entry.items() if k not in keys}


def model_entry(model, decoding=False):
    """The model's config without its display keys; its `decoding` override only where it is
    read (trajectories: `decoding=True`), so it never retrains or re-evaluates the model."""
    entry = {"name": model, **_without(config["models"][model], DISPLAY_KEYS)}
    if not decoding:
        entry.pop("decoding", None)
    if entry.get("source") == "train":   # resolved: a default written out reruns nothing
        from fair_calib.checks.method_defaults import resolved_train

        entry["train"] = resolved_train(entry.get("train"))
    if "train" in entry:
        entry["train"] = _without(entry["train"], RUNTIME_TRAIN_KEYS)
    return entry


def train_threads(model):
    """train.threads of a tiny model (its torch threads), else the rule's threads."""
    return config["models"][model].get("train", {}).get("threads") or threads_for("train_tiny")


def method_entry(method):
    """The method's config under its wildcard name (`fair-calib@s1`: the table splits it into
    method and seed), with its type's defaults resolved (fair_calib/checks/method_defaults.py: writing
    a default explicitly gives the same settings and reruns nothing). `seeds` is left out:
    adding a seed must not rerun the existing runs; `label` too (display only)."""
    from fair_calib.checks.method_defaults import resolved_method

    entry = resolved_method(_without(method_cfg(method), ("seeds",) + DISPLAY_KEYS))
    return {"name": method, **entry}


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
    from fair_calib.jobs.job_resources import setting

    return setting(config.get("resources", {}), rule, key, default)


def resources_for(rule):
    """Resource table of a rule (fair_calib/jobs/job_resources.py): memory grows with `attempt` on
    retry, and a list value (gpu_model, gres, constraint, ...) names one value per attempt."""
    from fair_calib.jobs.job_resources import rule_resources

    return rule_resources(config.get("resources", {}), rule)


def threads_for(rule):
    return _res(rule, "threads", 1)


def log_path(rule, pattern):
    return f"logs/{rule}/{pattern}.log"


check_used_data()
sync_model_content()


# ---------------------------------------------------------------- console progress of long jobs
PROGRESS_SECONDS = 30  # FAIR_CALIB_PROGRESS_SECONDS overrides it at run time


def progress(job):
    """A shell prefix that prints, every PROGRESS_SECONDS, one line `[job] <the log's last
    progress line>` on the console while the job runs (its full output stays in the log), so
    minutes of training are not silent and parallel jobs stay readable: one prefixed line each."""
    return (f"( while sleep ${{{{FAIR_CALIB_PROGRESS_SECONDS:-{PROGRESS_SECONDS}}}}}; do l=$(tail -c 400 {{log}} 2>/dev/null | tr '\\r' '\\n'"
            f" | grep -v '^[[:space:]]*$' | tail -n 1); [ -n \"$l\" ] && echo \"[{job}] $l\"; done ) &"
            " _progress=$!; trap 'kill $_progress 2>/dev/null || true' EXIT; ")
