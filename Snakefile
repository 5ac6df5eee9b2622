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
from snakemake.utils import min_version, validate

min_version("9.20")


configfile: "config/config.yaml"


validate(config, "workflow/schemas/config.schema.yaml")


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/probe.smk"
include: "workflow/rules/prior.smk"
include: "workflow/rules/calibrate.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/diagnostics.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        expand("results/tables/{table}.tex", table=config["tables"]),
        expand("results/diagnostics/{model}.parquet", model=DIAG.get("models", []))
        if diag_enabled() else [],
