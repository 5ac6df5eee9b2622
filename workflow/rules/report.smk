# Tables (LaTeX, booktabs, laid out like the paper's) and figures (PDF + PNG), generated from
# the Parquet files alone.


def labels():
    """Display strings (plain `label`, LaTeX `latex_label`) of the config's names."""
    from fair_calib.report.labels import display_labels

    return display_labels(config)


def table_fp_method(table):
    """The FP reference of a table: its FP method (whatever its name), else the config's."""
    t = config["tables"][table]
    fps = [m for m in table_methods(t) if is_fp(m)] or [m for m in config["methods"] if is_fp(m)]
    return fps[0] if fps else "fp"


rule table:
    input:
        lambda wc: table_inputs(wc.table),
    output:
        tex="results/tables/{table}.tex",
        # the printed cells with their uncertainty (value, err, err_kind, n_seeds, bold)
        cells="results/tables/{table}.parquet",
    params:
        settings=lambda wc: json.dumps(
            {"table": {"name": wc.table, **config["tables"][wc.table]}, "labels": labels(),
             "fp_method": table_fp_method(wc.table)},
            sort_keys=True,
        ),
    log:
        "logs/table/{table}.log",
    threads: threads_for("table")
    resources:
        **resources_for("table"),
    shell:
        "{PY} report --settings {params.settings:q} --inputs {input} --out {output.tex}"
        " --cells-out {output.cells} --log {log}"


def floor_sweep_inputs(wc=None):
    """Eval rows of every seed of the swept methods and the reference, and the priors whose
    provenance gives each swept method's floor."""
    reference = [ABLATION["reference"]] if ABLATION.get("reference") else []
    methods = list(dict.fromkeys(ABLATION["floors"] + reference))
    return {
        "evals": [f"results/eval/{m}/{run}/{ABLATION['bits']}/{ABLATION['task']}.parquet"
                  for m in ABLATION["models"] for x in methods for run in method_runs(x)],
        "priors": sorted({f"results/prior/{m}/{prior_of(x)}.parquet"
                          for m in ABLATION["models"] for x in ABLATION["floors"]}),
    }


rule floor_sweep:
    input:
        unpack(floor_sweep_inputs),
    output:
        expand("results/figures/floor_sweep.{ext}", ext=FIGURE_EXTS),
    params:
        settings=lambda wc: json.dumps(
            {"models": ABLATION["models"], "floors": ABLATION["floors"],
             "reference": ABLATION.get("reference"), "task": ABLATION["task"],
             "bits": ABLATION["bits"], "priors": {x: prior_of(x) for x in ABLATION["floors"]},
             "labels": labels()}, sort_keys=True),
    log:
        "logs/floor_sweep/floor_sweep.log",
    threads: threads_for("floor_sweep")
    resources:
        **resources_for("floor_sweep"),
    shell:
        "{PY} floor-sweep --settings {params.settings:q} --evals {input.evals}"
        " --priors {input.priors} --out-dir results/figures --log {log}"


localrules:
    figures,


rule figures:
    """`snakemake figures`: every figure the config makes (results/figures/), the diagnostics'
    and the prior ablation's floor sweep; a job of its own for neither (a target only)."""
    input:
        rules.diagnostic_figures.output if diag_enabled() else [],
        rules.floor_sweep.output if ablation_enabled() else [],
