"""Config validation shared by the Snakefile (before any job) and every stage CLI.

* :func:`load_yaml` reads a YAML file; a syntax error names the file, line and column.
* :func:`validate_config` checks a whole config against ``workflow/schemas/config.schema.yaml``
  (types, ranges, unknown keys) and each method's settings against the names its type declares
  in :data:`fair_calib.names.registry.METHOD_SETTINGS`, then fills the schema's defaults. The
  cross-reference checks (a table naming an unknown model, two entries with one label, ...)
  live in :mod:`fair_calib.checks.references` (``check_config``), run by the Snakefile and by
  ``fair-calib cost``.
* :func:`parse_settings` is what a stage CLI does with its ``--settings`` JSON: it must parse,
  hold the sections the stage reads, and each section must pass the same schema as the config
  entry it came from. A CLI therefore refuses what the Snakefile would refuse, naming the key.

Every error is a :class:`ConfigError` with a one-line message that names the key (or file) and
says what is allowed; ``ConfigError.exit()`` prints it without a traceback.
"""
from __future__ import annotations

import copy
import json
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..names import registry

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "workflow" / "schemas" / "config.schema.yaml"

# Keys of a job's settings JSON that are copied from the top level of the config.
TOP_LEVEL_SETTINGS = ("seed", "device", "dtype", "data_dir", "data_source", "synthetic_dir")
# The environment keys among them: where and on what a job runs, not what it computes. The
# workflow passes them as the stage's `--runtime` JSON, outside its settings (the rerun
# trigger), so editing them reruns nothing (workflow/rules/common.smk).
ENV_SETTINGS = ("device", "data_dir", "data_source", "synthetic_dir")

# The sections each stage CLI reads from --settings (all other sections are optional), and the
# schema entry each section is checked against: a dict section `<key>` is an entry of
# `<schema section>` ("name" is the entry's name and not part of the entry).
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "make-data": (),
    "train-tiny": ("model",),
    "probe": ("seed", "model", "probe"),
    "prior": ("prior",),
    "calibrate": ("model", "method", "calibration"),
    "evaluate": ("model", "method", "bits", "task"),
    "trajectories": ("model", "method", "bits", "probe"),
    "diagnose": (),
    "report": (),
    "figures": (),
}
SECTION_SCHEMA = {"model": "models", "method": "methods", "bits": "bits", "probe": "probes",
                  "prior": "priors", "task": "tasks", "calibration": "calibration",
                  "corpus": "corpus"}
# Sections that are one entry of a named collection (the others are the section itself).
_NAMED = {"models", "methods", "bits", "probes", "priors", "tasks"}


class ConfigError(ValueError):
    """A config or settings error; the message names the key and what is allowed."""

    def exit(self, prefix: str = "") -> None:
        sys.exit(f"{prefix}{self}")


# ------------------------------------------------------------------------------ YAML
def load_yaml(path: str | Path) -> Any:
    """A YAML file's contents; a syntax error names the file, line and column."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found (relative paths are read from the current "
                          f"directory, {Path.cwd()})") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (a config is YAML)") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        what = f"{_yaml_context(err)}, {problem}" if getattr(err, "context", None) else problem
        raise ConfigError(f"{where}: YAML syntax error: {what}. Fix the file there "
                          "(mixing tabs and spaces, an unclosed bracket or quote, a missing "
                          "space after ':' are the usual causes).") from None


def _yaml_context(err) -> str:
    """PyYAML's context ("while parsing a flow mapping") with where that construct started: an
    unclosed bracket is found lines later, so the line that opened it is the one to fix."""
    start, found = getattr(err, "context_mark", None), getattr(err, "problem_mark", None)
    if start is None or (found is not None and (start.line, start.column) == (found.line, found.column)):
        return err.context
    return f"{err.context} started at line {start.line + 1}, column {start.column + 1}"


@lru_cache(maxsize=4)
def load_schema(path: str | Path | None = None) -> dict:
    return load_yaml(Path(path) if path else SCHEMA_PATH)


# ------------------------------------------------------------------------------ schema
def _path(parts: Iterable[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _allowed(schema: Mapping) -> list[str]:
    return sorted((schema or {}).get("properties", {}))


def _message(err, prefix: str) -> str:
    """One line for a jsonschema error: the key, the value, what is allowed."""
    where = _path(list(prefix.split(".") if prefix else []) + list(err.absolute_path))
    if err.validator == "additionalProperties" and err.validator_value is False:
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        keys = ", ".join(f"{where}.{k}" if where != "(top level)" else k for k in extra)
        return (f"config: unknown key {keys}; allowed keys here: {_allowed(err.schema)} "
                "(a misspelled key would otherwise be ignored)")
    if err.validator == "required":
        return f"config: {where}: {err.message}"
    if err.validator == "enum":
        return (f"config: {where} = {err.instance!r} is not valid; choose one of "
                f"{list(err.validator_value)}")
    value = err.instance
    shown = repr(value) if not isinstance(value, (dict, list)) or len(repr(value)) < 80 else "..."
    return f"config: {where} = {shown}: {err.message}"


def _validator(schema: Mapping):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema)


def _first_error(validator, instance):
    from jsonschema.exceptions import best_match

    errors = list(validator.iter_errors(instance))
    if not errors:
        return None
    # the deepest error names the most specific key
    return best_match(errors, key=lambda e: (-len(e.absolute_path),))


def schema_errors(instance: Any, schema: Mapping, prefix: str = "") -> str | None:
    err = _first_error(_validator(schema), instance)
    return None if err is None else _message(err, prefix)


def _set_defaults(instance: Any, schema: Mapping, root: Mapping) -> None:
    """Fill schema defaults into dicts, recursively (what snakemake.utils.validate does)."""
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref.startswith("#/"):
            node: Any = root
            for part in ref[2:].split("/"):
                node = node[part]
            schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
    if not isinstance(instance, dict):
        return
    props = schema.get("properties", {})
    for key, sub in props.items():
        if key not in instance and isinstance(sub, dict) and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance and isinstance(sub, dict):
            _set_defaults(instance[key], sub, root)
    addl = schema.get("additionalProperties")
    if isinstance(addl, dict):
        for key, val in instance.items():
            if key not in props:
                _set_defaults(val, addl, root)


# ------------------------------------------------------------------------------ methods
def method_settings_error(name: str, entry: Mapping, where: str = "methods") -> str | None:
    """An unknown setting of a methods entry, checked against its type's declared names."""
    mtype = entry.get("type")
    if mtype not in registry.METHOD_SETTINGS:
        if mtype in registry.METHOD_TYPES:
            return (f"config: {where}.{name}: method type {mtype!r} declares no settings; add "
                    "the names it reads to METHOD_SETTINGS in fair_calib/names/registry.py")
        return None  # an unknown type is reported by the cross-reference checks
    allowed = registry.method_setting_names(mtype)
    extra = sorted(set(entry) - set(allowed) - {"name"})
    if extra:
        keys = ", ".join(f"{where}.{name}.{k}" for k in extra)
        return (f"config: unknown key {keys} for a method of type {mtype!r}; allowed: "
                f"{sorted(allowed)} (declared in fair_calib/names/registry.py METHOD_SETTINGS)")
    calib_keys = _allowed(load_schema().get("properties", {}).get("calibration", {}))
    overrides = [(f"{where}.{name}.calibration", entry.get("calibration"))]
    by_family = entry.get("calibration_by_family") or {}
    for fam, val in by_family.items():
        if fam not in registry.FAMILIES:
            return (f"config: {where}.{name}.calibration_by_family.{fam}: unknown family; "
                    f"choose one of {sorted(registry.FAMILIES)}")
        overrides.append((f"{where}.{name}.calibration_by_family.{fam}", val))
    for key, val in overrides:
        extra = sorted(set(val or {}) - set(calib_keys)) if calib_keys else []
        if extra:
            return (f"config: unknown key {', '.join(f'{key}.{k}' for k in extra)}; allowed keys "
                    f"here: {calib_keys}")
    return None


def validate_config(cfg: dict, schema_path: str | Path | None = None,
                    set_defaults: bool = True) -> dict:
    """Check a whole config; raise ConfigError naming the first bad key. Fills defaults."""
    if not isinstance(cfg, dict):
        raise ConfigError("config: the config must be a mapping of keys at the top level")
    schema = load_schema(schema_path)
    msg = schema_errors(cfg, schema)
    if msg:
        raise ConfigError(msg)
    for name, entry in (cfg.get("methods") or {}).items():
        msg = method_settings_error(name, entry)
        if msg:
            raise ConfigError(msg)
    if set_defaults:
        _set_defaults(cfg, schema, schema)
    return cfg


# ------------------------------------------------------------------------------ stage CLIs
def _section_schema(schema: Mapping, key: str) -> dict | None:
    top = schema.get("properties", {}).get(SECTION_SCHEMA[key])
    if top is None:
        return None
    sub = top.get("additionalProperties") if SECTION_SCHEMA[key] in _NAMED else top
    if not isinstance(sub, dict):
        return None
    return {**sub, "$defs": schema.get("$defs", {})}


def check_settings(stage: str, settings: Any, schema_path: str | Path | None = None) -> dict:
    """The checks a stage CLI applies to its parsed --settings (see module docstring)."""
    if not isinstance(settings, dict):
        raise ConfigError(f"{stage} --settings: expected a JSON object, got {type(settings).__name__}")
    missing = [k for k in STAGE_SECTIONS.get(stage, ()) if k not in settings]
    if missing:
        raise ConfigError(
            f"{stage} --settings lacks {', '.join(repr(k) for k in missing)} (needs "
            f"{list(STAGE_SECTIONS[stage])}; the workflow passes them, see the rule's params in "
            "workflow/rules/)")
    schema = load_schema(schema_path)
    top = schema.get("properties", {})
    for key in TOP_LEVEL_SETTINGS:
        if settings.get(key) is not None and key in top:
            msg = schema_errors(settings[key], {**top[key], "$defs": schema.get("$defs", {})}, key)
            if msg:
                raise ConfigError(f"{stage} --settings: {msg}")
    for key in SECTION_SCHEMA:
        value = settings.get(key)
        if not isinstance(value, dict):
            continue
        sub = _section_schema(schema, key)
        if sub is None:
            continue
        if key == "model":  # --model-dir says where the model is: `source` may be absent
            sub = {**sub, "required": [r for r in sub.get("required", []) if r != "source"]}
        entry = {k: v for k, v in value.items() if k != "name"}
        if key == "bits" and value.get("name") == "fp" and not entry:
            continue  # the FP method's bits
        name = value.get("name")
        prefix = f"{SECTION_SCHEMA[key]}.{name}" if SECTION_SCHEMA[key] in _NAMED and name else SECTION_SCHEMA[key]
        msg = schema_errors(entry, sub, prefix)
        if msg:
            raise ConfigError(f"{stage} --settings: {msg}")
        if key == "method":
            msg = method_settings_error(name or "?", entry)
            if msg:
                raise ConfigError(f"{stage} --settings: {msg}")
    return settings


def parse_settings(text: str | None, stage: str = "stage") -> dict:
    """``--settings`` text (JSON, or ``@file.json``) parsed; errors are one line."""
    if text is None:
        raise ConfigError(f"{stage}: --settings is required (a JSON object)")
    source = "--settings"
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text()
        except OSError as err:
            raise ConfigError(f"{stage} --settings {text}: cannot read {path}: {err.strerror}") from None
        source = f"--settings file {path}"
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{stage} {source} is not valid JSON: {err.msg} at line {err.lineno} "
                          f"column {err.colno} (pass one JSON object, e.g. '{{\"seed\": 0}}', "
                          "quoted for the shell)") from None


# ------------------------------------------------------------------------------ data_dir
# Files under data_dir each reader opens (docs/data.md), by probe/calibration dataset and by
# lm-eval task name.
DATASET_FILES = {"gsm8k": ("gsm8k/train.jsonl",), "wikitext2": ("wikitext2/wiki.test.raw",)}
TASK_FILES = {
    "piqa": ("piqa/valid.jsonl", "piqa/valid-labels.lst"),
    "boolq": ("boolq/validation.jsonl",),
    "winogrande": ("winogrande/dev.jsonl",),
    "arc_easy": ("arc/arc_easy_test.jsonl",),
    "arc_challenge": ("arc/arc_challenge_test.jsonl",),
    "hellaswag": ("hellaswag/hellaswag_val_full.txt.bz2",),
    "truthfulqa_mc2": ("truthfulqa/mc_task.json",),
    "mmlu": ("mmlu/test", "mmlu/dev"),
    "humaneval": ("humaneval/HumanEval.jsonl.gz",),
    "gsm8k_cot": ("gsm8k/test.jsonl", "gsm8k/train.jsonl"),
    "gsm8k": ("gsm8k/test.jsonl", "gsm8k/train.jsonl"),
}


def data_needs(cfg: Mapping, probes: Iterable[str], tasks: Iterable[str],
               calib_datasets: Iterable[str]) -> list[tuple[str, str]]:
    """(config key, path under data_dir) of every offline file the run will read."""
    local = (cfg.get("data_source") or "local") == "local"
    needs: list[tuple[str, str]] = []
    if local:
        for p in sorted(probes):
            ds = cfg["probes"][p]["dataset"]
            needs += [(f"probes.{p}.dataset: {ds}", f) for f in DATASET_FILES.get(ds, ())]
        for ds in sorted(set(calib_datasets)):
            needs += [(f"calibration.dataset: {ds}", f) for f in DATASET_FILES.get(ds, ())]
    for t in sorted(tasks):
        task = cfg["tasks"][t]
        if task.get("kind") != "lm_eval":
            continue
        offline = task.get("offline")
        if offline is None:
            offline = local
        if offline:
            name = task.get("lm_eval_task", t)
            needs += [(f"tasks.{t} (lm_eval_task: {name})", f) for f in TASK_FILES.get(name, ())]
    return needs


def check_data(cfg: Mapping, probes: Iterable[str], tasks: Iterable[str],
               calib_datasets: Iterable[str]) -> None:
    """Every offline file the run will read exists, checked before any job."""
    needs = data_needs(cfg, probes, tasks, calib_datasets)
    if not needs:
        return
    data_dir = Path(cfg.get("data_dir") or "../shared/data").expanduser()
    if not data_dir.is_dir():
        keys = sorted({k for k, _ in needs})
        raise ConfigError(
            f"config: data_dir = {str(data_dir)!r} does not exist, and {', '.join(keys)} read it. "
            "Put the offline data sets there (layout: docs/data.md), point data_dir at them, "
            "or set data_source: hub on a machine that reaches the Hugging Face hub.")
    missing = [(k, f) for k, f in needs if not (data_dir / f).exists()]
    if missing:
        lines = "; ".join(f"{data_dir / f} (for {k})" for k, f in missing[:6])
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        raise ConfigError(
            f"config: data_dir = {str(data_dir)!r} lacks {lines}{more}. Add them in the layout "
            "of docs/data.md, or set data_source: hub on a machine that reaches the Hugging "
            "Face hub.")


def _override_key(task: str, entry: Mapping, model: str, family: str, key: str) -> str:
    """The config key a resolved task setting came from (by_model, then by_family, then base)."""
    if key in entry.get("by_model", {}).get(model, {}):
        return f"tasks.{task}.by_model.{model}.{key}"
    if key in entry.get("by_family", {}).get(family, {}):
        return f"tasks.{task}.by_family.{family}.{key}"
    return f"tasks.{task}.{key}"


def offline_task_error(cfg: Mapping, task: str, model: str) -> str | None:
    """Why ``task`` cannot run offline on ``model`` as configured (None if it can, or runs from
    the hub): no offline definition of its lm-eval task, or k-shot where the offline copy has no
    few-shot pool (the `train` split). The evaluation job would refuse it only after loading
    the model; this finds it from the config alone."""
    from ..evaluate.offline_data import (ARC_DEV_FILES, DREAM_TASKS, NO_OFFLINE_FEWSHOT_POOL,
                                         OC_TASKS, OFFLINE_TASKS)
    from ..evaluate.task_settings import resolve_task, use_by_model

    entry = cfg["tasks"][task]
    family = cfg["models"][model]["family"]
    t = resolve_task(task, entry, model, family, by_model=use_by_model(cfg))
    if t.get("kind") != "lm_eval":
        return None
    offline = t.get("offline")
    if offline is None:
        offline = (cfg.get("data_source") or "local") == "local"
    if not offline:
        return None
    name = t.get("lm_eval_task", task)
    remedy = f"set data_source: hub (or tasks.{task}.offline: false)"
    if name in OC_TASKS:     # the LLaDA authors' OpenCompass recipes: local copies, but ARC's dev
        dev = Path(cfg.get("data_dir") or "../shared/data") / ARC_DEV_FILES.get(name, "")
        if name in ARC_DEV_FILES and not dev.is_file():
            key = _override_key(task, entry, model, family, "lm_eval_task")
            return (f"config: {key} = {name!r} (model {model}) scores ARC's dev split; "
                    f"{dev} is missing (AI2's {dev.name}); {remedy}")
        return None
    if name in DREAM_TASKS:
        return None
    if name not in OFFLINE_TASKS:
        key = _override_key(task, entry, model, family, "lm_eval_task")
        return (f"config: {key} = {name!r} (model {model}) has no offline definition (offline "
                f"tasks: {', '.join(OFFLINE_TASKS)}); {remedy}")
    shots = t.get("num_fewshot") or 0
    if shots and name in NO_OFFLINE_FEWSHOT_POOL:
        key = _override_key(task, entry, model, family, "num_fewshot")
        return (f"config: {key} = {shots} (model {model}) needs {name}'s few-shot pool, the "
                f"`train` split, which the offline copy lacks; {remedy}, or 0-shot")
    return None


def check_offline_tasks(cfg: Mapping, pairs: Iterable[tuple[str, str]]) -> None:
    """Every (model, task) evaluation of the run can be honoured offline, before any job."""
    for model, task in sorted(set(pairs)):
        err = offline_task_error(cfg, task, model)
        if err:
            raise ConfigError(err)


# ------------------------------------------------------------------------------ model sources
def looks_like_local_path(source: str) -> bool:
    """A model ``source`` that is a folder, not a hub id (``org/name``)."""
    return (source.startswith(("/", "./", "../", "~")) or source.count("/") > 1
            or Path(source).expanduser().exists())


def missing_model_folder(source: str) -> str | None:
    """An error if ``source`` names a local folder that does not exist (else it would be
    taken for a hub id and fail with "Repo id must be in the form ...")."""
    if source in ("train", "convert") or not looks_like_local_path(source):
        return None
    if not Path(source).expanduser().is_dir():
        return f"model folder {source!r} does not exist"
    return None


def rebase_relative_paths(cfg: dict, workdir: str, start: str | None = None) -> dict:
    """Before the workflow moves into a config's own folder (``workdir``): the relative paths
    the config names outside it (``data_dir``, local model folders) rewritten relative to that
    folder, so they keep naming the same place. ``synthetic_dir`` stays as it is: the config's
    own corpus, inside its folder. ``start``: where relative paths were meant (the cwd)."""
    start = os.path.abspath(start or os.getcwd())
    target = os.path.join(start, workdir)

    def rebase(path: str) -> str:
        if os.path.isabs(os.path.expanduser(path)):
            return path
        return os.path.relpath(os.path.join(start, path), target)

    if cfg.get("data_dir"):
        cfg["data_dir"] = rebase(cfg["data_dir"])
    for entry in (cfg.get("models") or {}).values():
        source = entry.get("source", "")
        if source not in ("train", "convert") and looks_like_local_path(source):
            entry["source"] = rebase(source)
    return cfg


# ------------------------------------------------------------------------------ CLI
def checkout_config() -> Path:
    """``config/config.yaml`` of the checkout a command runs in (the current directory), the
    file Snakemake reads there -- not the installed package's checkout, which may be another
    clone sharing the environment."""
    path = Path("config") / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{Path.cwd() / path}: not found; run from the pipeline's checkout "
                          "(the folder with the Snakefile) or pass --base")
    return path


CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def _extra_config(path: str | Path) -> dict:
    """One ``--configfile`` file. A file that is not a config by its name (a ``.tex`` target)
    is almost always a target that ``--configfile`` took for a config, since it takes every word
    up to the next option: say that, instead of asking to fix the target's YAML."""
    try:
        extra = load_yaml(path)
        if not isinstance(extra, dict):
            raise ConfigError(f"{path}: a config file holds keys at the top level")
    except ConfigError:
        if Path(path).suffix.lower() in CONFIG_SUFFIXES:
            raise
        raise ConfigError(
            f"{path}: not a YAML config file; a target given after --configfile is read as "
            "one (it takes every word up to the next option): put the target first "
            "(snakemake TARGET --configfile FILE...) or end the files with -- "
            "(snakemake --configfile FILE... -- TARGET)") from None
    return extra


def merged_config(files: Iterable[str | Path], base: str | Path | None = None) -> dict:
    """``base`` (default: the current checkout's config/config.yaml) with ``files`` merged
    over it (Snakemake's rule: dicts key by key)."""
    def merge(a: dict, b: Mapping) -> dict:
        for k, v in b.items():
            a[k] = merge(dict(a[k]), v) if isinstance(v, Mapping) and isinstance(a.get(k), dict) else v
        return a

    extras = []
    for f in files:                     # the files named first: their errors name them
        extras.append(_extra_config(f))
    base = base or checkout_config()
    cfg = load_yaml(base) or {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"{base}: a config file holds keys at the top level")
    for extra in extras:
        cfg = merge(cfg, extra)
    return cfg
