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
        " --cells-out {output.cells} > {log} 2>&1"
