# Stage I, part 2: gather the probe shards into the position prior w_bar. Every prior variant
# (components, lambda0 schedule, N_probe, sharpness score) reads the same shards.


def probe_shards(wc):
    probe = config["priors"][wc.prior]["probe"]
    n = config["probes"][probe].get("shards", 1)
    return [f"results/probe/{wc.model}/{probe}/shard-{k}.parquet" for k in range(n)]


rule prior:
    input:
        probe_shards,
    output:
        "results/prior/{model}/{prior}.parquet",
    params:
        settings=lambda wc: settings(
            prior={"name": wc.prior, **config["priors"][wc.prior]},
            probe=probe_entry(config["priors"][wc.prior]["probe"]),
        ),
    log:
        "logs/prior/{model}/{prior}.log",
    threads: threads_for("prior")
    resources:
        **resources_for("prior"),
    shell:
        "{PY} prior --settings {params.settings:q} --inputs {input} --out {output} --log {log}"
