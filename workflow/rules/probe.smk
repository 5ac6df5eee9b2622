# Stage I, part 1: random-commit rollouts of the full-precision teacher, in shards that run
# as independent jobs (one SLURM job each on the cluster).

rule probe_shard:
    input:
        model=model_input,
        data=synthetic_inputs,
    output:
        "results/probe/{model}/{probe}/shard-{k}.parquet",
    params:
        settings=lambda wc: settings(model=model_entry(wc.model), probe=probe_entry(wc.probe)),
        model_dir=lambda wc: model_dir(wc.model),
        shards=lambda wc: config["probes"][wc.probe].get("shards", 1),
    log:
        "logs/probe/{model}/{probe}/shard-{k}.log",
    benchmark:
        "results/benchmarks/probe/{model}/{probe}/shard-{k}.tsv"
    threads: threads_for("probe_shard")
    resources:
        **resources_for("probe_shard"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} probe --settings {params.settings:q} --runtime {RUNTIME:q}"
        " --model-dir {params.model_dir} --shard {wildcards.k} --num-shards {params.shards}"
        " --out {output} --log {log}"
