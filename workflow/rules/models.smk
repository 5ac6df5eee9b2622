# The embedded default's data and models: a deterministic synthetic corpus and two tiny
# diffusion LMs trained on it (skipped entirely when every model comes from the hub or disk).

rule make_data:
    output:
        [os.path.join(config["synthetic_dir"], f) for f in SYNTHETIC_FILES],
    params:
        settings=settings(corpus=config.get("corpus", {})),
        # derived from the output (not a rerun trigger): synthetic_dir is an environment key
        out=lambda wc, output: os.path.dirname(output[0]),
    log:
        "logs/make_data/make_data.log",
    threads: threads_for("make_data")
    resources:
        **resources_for("make_data"),
    shell:
        "{PY} make-data --settings {params.settings:q} --runtime {RUNTIME:q} --out {params.out} --log {log}"


rule train_tiny:
    input:
        synthetic_inputs,
    output:
        directory("resources/models/{model}"),
    params:
        settings=lambda wc: settings(model=model_entry(wc.model)),
        data=lambda wc, input: os.path.dirname(input[0]),  # derived: not a rerun trigger
    log:
        "logs/train_tiny/{model}.log",
    benchmark:
        "results/benchmarks/train_tiny/{model}.tsv"
    threads: lambda wc: train_threads(wc.model)
    resources:
        **resources_for("train_tiny"),
    shell:
        # --threads: train.threads, outside the settings (a thread count does not retrain)
        progress("train_tiny {wildcards.model}") +
        "OMP_NUM_THREADS={threads} {PY} train-tiny --threads {threads} --settings {params.settings:q}"
        " --runtime {RUNTIME:q}"
        " --data {params.data} --out {output} --log {log}"


rule convert_hub:
    """A trained tiny model written in a hub family's checkpoint layout (config.json field
    names, safetensors key names, special tokens): the real-checkpoint code path on CPU."""
    input:
        lambda wc: f"resources/models/{config['models'][wc.model]['convert_from']}",
    output:
        directory("resources/hub/{model}"),
    params:
        family=lambda wc: config["models"][wc.model]["family"],
        outliers=lambda wc: json.dumps(config["models"][wc.model].get("outliers") or {},
                                       sort_keys=True),
    log:
        "logs/convert_hub/{model}.log",
    threads: 1
    resources:
        **resources_for("convert_hub"),
    shell:
        "{PY} convert-hub --src {input} --family {params.family} --outliers {params.outliers:q}"
        " --out {output} --log {log}"
