# Mechanistic diagnostics: decoding trajectories of the FP teacher and of the quantized
# students (free-running and teacher-forced on the teacher's states), then the paper's metrics.
DIAG = config.get("diagnostics", {})


def diag_enabled():
    return DIAG.get("enabled", True) and bool(DIAG.get("models"))


def traj_inputs(wc):
    inputs = {"model": model_input(wc), "data": synthetic_inputs(wc)}
    if not is_fp(wc.method):
        inputs["calib"] = f"{calib_dir(wc.model, wc.method, wc.bits)}/meta.json"
        inputs["teacher"] = f"results/traj/{wc.model}/fp/fp.parquet"
    return inputs


rule trajectories:
    input:
        unpack(traj_inputs),
    output:
        "results/traj/{model}/{method}/{bits}.parquet",
    params:
        settings=lambda wc: settings(
            model=model_entry(wc.model),
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
        "OMP_NUM_THREADS={threads} {PY} trajectories --settings {params.settings:q}"
        " --model-dir {params.model_dir} {params.extra} --out {output} > {log} 2>&1"


def diag_trajs(model):
    fp = [m for m in config["methods"] if is_fp(m)][:1]
    students = [f"results/traj/{model}/{m}/{DIAG['bits']}.parquet" for m in DIAG.get("methods", [])]
    return [f"results/traj/{model}/{m}/fp.parquet" for m in fp] + students


rule diagnose:
    input:
        lambda wc: diag_trajs(wc.model),
    output:
        "results/diagnostics/{model}.parquet",
    log:
        "logs/diagnose/{model}.log",
    threads: threads_for("diagnose")
    resources:
        **resources_for("diagnose"),
    shell:
        "{PY} diagnose --inputs {input[1:]} --teacher {input[0]} --out {output} > {log} 2>&1"
