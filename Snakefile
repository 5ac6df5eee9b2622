# FAIR-Calib: the paper's pipeline at a glance.
#
#   make_data, train_tiny   the embedded default's corpus and tiny diffusion LMs
#   probe_shard -> prior    Stage I: random-commit teacher rollouts -> position prior w_bar
#   calibrate               Stage II: layer-wise (prior-weighted) calibration per method x bits
#   evaluate_shard -> gather_eval   benchmarks through lm-eval
#   trajectories -> diagnose        mechanistic diagnostics
#   table, figures                  LaTeX tables and PDF/PNG figures
#
# `snakemake --cores 2 results/tables/main.tex` runs the embedded default;
# `--configfile config/paper.yaml --profile profiles/slurm` runs the paper grid on a cluster.
import os
import sys

from snakemake.utils import min_version

from fair_calib.checks.config import ConfigError, load_yaml, validate_config

min_version("9.20")

# The config is checked before any job, by the package (the stage CLIs apply the same checks to
# their --settings): YAML syntax (file:line:column), types, ranges and unknown keys against
# workflow/schemas/config.schema.yaml, method settings against their type's declared names, then
# the cross-references (check_config in workflow/rules/common.smk). Errors are one line.
try:
    load_yaml(os.path.join(workflow.basedir, "config/config.yaml"))
except ConfigError as err:
    sys.exit(f"Error: {err}")


configfile: "config/config.yaml"


try:
    validate_config(config, os.path.join(workflow.basedir, "workflow/schemas/config.schema.yaml"))
except ConfigError as err:
    sys.exit(f"Error: {err}")


# A config's own folder (`workdir`: smoke.yaml's runs/smoke, hub_layout.yaml's runs/hub_layout):
# its resources/, results/ and logs/ live there, so it never overwrites the work of another
# config (the default's trained models, its tables). Relative data_dir and model folders keep
# pointing where they did. `snakemake --directory` takes precedence.
if config.get("workdir", ".") != "." and workflow.overwrite_workdir is None:
    from fair_calib.checks.config import rebase_relative_paths

    rebase_relative_paths(config, config["workdir"])
    workflow.workdir(config["workdir"])


# Jobs on `device: cuda` take a card slot (fair_calib/jobs/gpu_slots.py); how many share a card is
# the config's (the tiny default's jobs leave a card mostly idle), unless the environment says.
os.environ.setdefault("FAIR_CALIB_GPU_JOBS_PER_CARD", str(config.get("gpu_jobs_per_card", 1)))


# Another run in this directory: say so first (Snakemake's own message about incomplete files
# advises --rerun-incomplete, which would redo the files that run is writing).
# The lock is in the config's `workdir` (runs/smoke/.snakemake/ for smoke.yaml): the advice names
# that folder, and the unlock command carries this run's own config files.
LOCKED = any(os.scandir(".snakemake/locks")) if os.path.isdir(".snakemake/locks") else False
if workflow.is_main_process and "--unlock" not in sys.argv and LOCKED:
    from fair_calib.jobs.preflight import lock_note, unlock_command

    print(lock_note(
        os.path.relpath(os.path.abspath(".snakemake/locks"), workflow.workdir_init) + "/",
        unlock_command(workflow.config_settings.configfiles, workflow.config_settings.config_args,
                       workflow.workdir_init, workflow.overwrite_workdir)), file=sys.stderr)


# Path segments never contain "/": without this, `results/eval/{model}/{method}/{bits}/{task}.parquet`
# (gather_eval) also matches the shard files below it; the input function then fails, which
# Snakemake tolerates while planning but is fatal in a SLURM job step (--target-jobs).
wildcard_constraints:
    model="[^/]+",
    method="[^/]+",
    bits="[^/]+",
    task="[^/]+",
    probe="[^/]+",
    prior="[^/]+",


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/prior.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/diagnostics.smk"
include: "workflow/rules/report.smk"


# A table name not in the config (`results/tables/mian.tex`): say which tables there are, before
# the table rule's input function fails on it with a traceback.
if workflow.is_main_process:
    from fair_calib.jobs.preflight import unknown_table_target

    # (the command line's words: Snakemake's parsed targets are not known yet while parsing)
    problem = unknown_table_target(sys.argv[1:], config["tables"])
    if not problem:     # a file inside a model folder (a directory output): the folder instead
        from fair_calib.jobs.preflight import file_in_model_folder

        problem = file_in_model_folder(sys.argv[1:], config["models"])
    if problem:
        sys.exit(f"Error: {problem}")


# A corrupt or truncated intermediate under results/ (a full disk, a partial copy) is moved
# aside to <name>.corrupt (a calibration cell's meta.json with it, to meta.json.incomplete), so
# Snakemake finds it missing and reruns the job that writes it and what depends on it, instead
# of a later job failing on it. Not while another run holds the lock: its jobs may be reading
# these files. A dry run (or --summary, --dag, ...) only says what a run would move.
if workflow.is_main_process and "--unlock" not in sys.argv and not LOCKED:
    from fair_calib.jobs.preflight import (corrupt_intermediates, inspecting, move_aside_corrupt,
                                           report_line)

    dry = inspecting(sys.argv[1:], bool(workflow.output_settings.dryrun))
    for moved in (corrupt_intermediates if dry else move_aside_corrupt)("results"):
        print(report_line(*moved, dry_run=dry), file=sys.stderr)
    # outputs a run ended before recording (a full disk): Snakemake asks for --rerun-incomplete;
    # with no run holding the lock, say that it is safe
    if "--rerun-incomplete" not in sys.argv and "--ri" not in sys.argv:
        from fair_calib.jobs.preflight import incomplete_note, incomplete_outputs

        note = incomplete_note(incomplete_outputs())
        if note:
            print(note, file=sys.stderr)


# A job killed whole (its watcher too) leaves no line in its log; its command's exit status
# names the signal (fair_calib/jobs/failures.py, read by onerror below).
if workflow.is_main_process:
    from fair_calib.jobs.failures import record_shell_exits, report_metadata_errors

    record_shell_exits()
    report_metadata_errors()   # a full disk at .snakemake/: which job, and what to do


rule all:
    input:
        expand("results/tables/{table}.tex", table=config["tables"]),
        rules.figures.input,          # every figure: the diagnostics' and the floor sweep


# The end of a successful run: where the tables and figures are, and the main table in plain
# text (fair_calib/report/summary.py; not in dry runs or cluster job steps).
onsuccess:
    from fair_calib.report.summary import print_summary

    # in a config's own folder (`workdir`), its paths from where snakemake was started
    here = os.path.relpath(os.path.abspath("results"), workflow.workdir_init)
    print_summary(config, "results", shown=here)


# A failed job: one line each, what failed and what to do (the last line of its log, which the
# stage CLI writes after the traceback; fair_calib/jobs/failures.py). The traceback stays in the log.
# A run stopped by SIGTERM whose jobs all ended well: what finished and what did not start, and
# its exit here (143: jobs left; 0: none), before Snakemake's "At least one job did not complete
# successfully", which would not be true.
onerror:
    from fair_calib.jobs.failures import stop_lines, summary_lines

    for line in summary_lines(log):
        print(line, file=sys.stderr)
    stopped, status = stop_lines(workflow)
    for line in stopped:
        print(line, file=sys.stderr)
    if status is not None:
        logs = log if isinstance(log, (list, tuple)) else [log]
        print(f"Complete log(s): {', '.join(map(str, logs))}", file=sys.stderr)
        sys.exit(status)
