# Mechanistic diagnostics: decoding trajectories of the FP teacher and of the quantized
# students (free-running and teacher-forced on the teacher's states), then the paper's metrics.
DIAG = config.get("diagnostics", {})


def diag_enabled():
    return DIAG.get("enabled", True) and bool(DIAG.get("models"))


def traj_inputs(wc):
    inputs = {"model": model_input(wc), "data": synthetic_inputs(wc)}
    if not is_fp(wc.method):
        inputs["calib"] = f"{calib_dir(wc.model, wc.method, wc.bits)}/meta.json"
        inputs["teacher"] = f"results/traj/{wc.model}/{fp_method()}/fp.parquet"
    return inputs


rule trajectories:
    input:
        unpack(traj_inputs),
    output:
        "results/traj/{model}/{method}/{bits}.parquet",
    params:
        settings=lambda wc: settings(
            model=model_entry(wc.model, decoding=True),
            method=method_entry(wc.method),
            bits=bits_entry(wc.bits),
            probe=probe_entry(DIAG.get("probe", "default")),
            n_samples=DIAG.get("n_samples", 16),
        ),
        model_dir=lambda wc: model_dir(wc.model),
        extra=lambda wc, input: "" if is_fp(wc.method) else (
            f"--calib-dir {calib_dir(wc.model, wc.method, wc.bits)} --teacher {input.teacher}"),
    log:
        "logs/trajectories/{model}/{method}/{bits}.log",
    threads: threads_for("trajectories")
    resources:
        **resources_for("trajectories"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} trajectories --settings {params.settings:q} --runtime {RUNTIME:q}"
        " --model-dir {params.model_dir} {params.extra} --out {output} --log {log}"


def fp_method():
    """The FP teacher of the diagnostics: the first method of type fp, whatever its name
    (check_config refuses diagnostics without one, before any job)."""
    return next(m for m in config["methods"] if is_fp(m))


rule diagnose:
    input:
        teacher=lambda wc: f"results/traj/{wc.model}/{fp_method()}/fp.parquet",
        students=lambda wc: [f"results/traj/{wc.model}/{m}/{DIAG['bits']}.parquet"
                             for m in DIAG.get("methods", [])],
    output:
        "results/diagnostics/{model}.parquet",
    log:
        "logs/diagnose/{model}.log",
    threads: threads_for("diagnose")
    resources:
        **resources_for("diagnose"),
    shell:
        "{PY} diagnose --inputs {input.students} --teacher {input.teacher} --out {output} --log {log}"


FIGURE_EXTS = ["pdf", "png", "txt"]
FIGURE_NAMES = ["stability_lag_ccdf", "mse_prob_trace", "commit_flips", "post_commit_mismatch",
                "frontier_margin", "prior_curve"]


def figure_settings():
    from fair_calib.report.labels import plain_labels, prior_labels

    methods = DIAG.get("methods", [])
    return json.dumps({
        "fp": fp_method(),
        "methods": [fp_method()] + methods,
        "priors": sorted({prior_of(x) for x in methods} - {None}),
        "labels": {**{k: v for k, v in plain_labels(config).items() if k != "tasks"},
                   "priors": prior_labels(config, methods)},
        "cross_corpus": DIAG.get("cross_corpus", []),
    }, sort_keys=True)


# The diagnostics' figures; `figures` (report.smk) is every figure. Resources: resources.figures.
rule diagnostic_figures:
    input:
        diagnostics=expand("results/diagnostics/{model}.parquet", model=DIAG.get("models", [])),
        priors=lambda wc: [f"results/prior/{m}/{p}.parquet" for m in DIAG.get("models", [])
                           for p in sorted({prior_of(x) for x in DIAG.get("methods", [])} - {None})],
        cross_corpus=[f"results/prior/{pair[k]}.parquet" for pair in DIAG.get("cross_corpus", [])
                      for k in ("a", "b")],
    output:
        # each figure: PDF, PNG (caption in their metadata) and the caption sidecar .txt
        expand("results/figures/{name}_{model}.{ext}", name=FIGURE_NAMES,
               model=DIAG.get("models", []), ext=FIGURE_EXTS),
        # the models' FP lag CCDFs side by side: only where there are two to compare
        expand("results/figures/stability_lag_ccdf_models.{ext}", ext=FIGURE_EXTS)
        if len(DIAG.get("models", [])) > 1 else [],
        expand("results/figures/prior_cross_corpus.{ext}", ext=FIGURE_EXTS)
        if DIAG.get("cross_corpus") else [],
    params:
        settings=figure_settings(),
    log:
        "logs/figures/figures.log",
    threads: threads_for("figures")
    resources:
        **resources_for("figures"),
    shell:
        "{PY} figures --settings {params.settings:q} --inputs {input} --out-dir results/figures"
        " --log {log}"
