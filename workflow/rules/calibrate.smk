# Stage II: layer-wise calibration of one model x method x bit width. Finished blocks are
# saved as they complete, so a killed job resumes from the last finished block; meta.json is
# written last and is the job's completion marker.


def calibrate_inputs(wc):
    inputs = {"model": model_input(wc), "data": synthetic_inputs(wc)}
    prior = prior_of(wc.method)
    if prior:
        inputs["prior"] = f"results/prior/{wc.model}/{prior}.parquet"
    return inputs


rule calibrate:
    input:
        unpack(calibrate_inputs),
    output:
        params="results/calib/{model}/{method}/{bits}/params.safetensors",
        meta="results/calib/{model}/{method}/{bits}/meta.json",
        stats="results/calib/{model}/{method}/{bits}/stats.parquet",
    params:
        settings=lambda wc: settings(
            model=model_entry(wc.model),
            method=method_entry(wc.method),
            bits=bits_entry(wc.bits),
            calibration=calibration_entry(wc.method, wc.model),
            seed=run_seed(wc.method),
        ),
        model_dir=lambda wc: model_dir(wc.model),
        prior=lambda wc, input: f"--prior {input.prior}" if "prior" in input.keys() else "",
        out_dir=lambda wc: calib_dir(wc.model, wc.method, wc.bits),
    log:
        "logs/calibrate/{model}/{method}/{bits}.log",
    benchmark:
        "results/benchmarks/calibrate/{model}/{method}/{bits}.tsv"
    threads: threads_for("calibrate")
    resources:
        **resources_for("calibrate"),
    shell:
        progress("calibrate {wildcards.model}/{wildcards.method}/{wildcards.bits}") +
        "OMP_NUM_THREADS={threads} {PY} calibrate --settings {params.settings:q} --runtime {RUNTIME:q}"
        " --model-dir {params.model_dir} {params.prior} --out-dir {params.out_dir} --log {log}"
