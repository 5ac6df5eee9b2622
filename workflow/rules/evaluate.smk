# Benchmark evaluation through lm-eval, split into document shards (independent jobs) and
# gathered per task.


def eval_inputs(wc):
    inputs = {"model": model_input(wc), "data": synthetic_inputs(wc)}
    if not is_fp(wc.method):
        inputs["calib"] = f"{calib_dir(wc.model, wc.method, wc.bits)}/meta.json"
    return inputs


from fair_calib.evaluate.task_settings import check_task_overrides, resolve_task, use_by_model

check_task_overrides(config, registry.FAMILIES)


def task_entry(task, model):
    """The task's settings for this model: entry < by_family < by_model (the authors' scripts
    differ per family, task and instruct setup)."""
    resolved = resolve_task(task, config["tasks"][task], model, config["models"][model]["family"],
                            by_model=use_by_model(config))
    for key in DISPLAY_KEYS:  # display only: the table reads them, no evaluation reruns
        resolved.pop(key, None)
    return resolved


def task_shards(task, model):
    return task_entry(task, model).get("shards", 1)


rule evaluate_shard:
    input:
        unpack(eval_inputs),
    output:
        "results/eval/{model}/{method}/{bits}/{task}/shard-{k}.parquet",
    params:
        settings=lambda wc: settings(
            model=model_entry(wc.model),
            method=method_entry(wc.method),
            bits=bits_entry(wc.bits),
            task=task_entry(wc.task, wc.model),
        ),
        model_dir=lambda wc: model_dir(wc.model),
        calib=lambda wc: "" if is_fp(wc.method) else f"--calib-dir {calib_dir(wc.model, wc.method, wc.bits)}",
        shards=lambda wc: task_shards(wc.task, wc.model),
    log:
        "logs/evaluate/{model}/{method}/{bits}/{task}/shard-{k}.log",
    benchmark:
        "results/benchmarks/evaluate/{model}/{method}/{bits}/{task}/shard-{k}.tsv"
    threads: threads_for("evaluate_shard")
    resources:
        **resources_for("evaluate_shard"),
    shell:
        "OMP_NUM_THREADS={threads} {PY} evaluate --settings {params.settings:q} --runtime {RUNTIME:q}"
        " --model-dir {params.model_dir} {params.calib}"
        " --shard {wildcards.k} --num-shards {params.shards} --out {output} --log {log}"


localrules:
    gather_eval,


rule gather_eval:
    input:
        lambda wc: [
            f"results/eval/{wc.model}/{wc.method}/{wc.bits}/{wc.task}/shard-{k}.parquet"
            for k in range(task_shards(wc.task, wc.model))
        ],
    output:
        "results/eval/{model}/{method}/{bits}/{task}.parquet",
    log:
        "logs/gather_eval/{model}/{method}/{bits}/{task}.log",
    threads: threads_for("gather_eval")
    resources:
        **resources_for("gather_eval"),
    params:
        # One shard is already the whole result: copy it rather than start Python.
        command=lambda wc, input, output: (
            f"cp {input[0]} {output}" if len(input) == 1
            else f"{PY} evaluate --gather --inputs {' '.join(input)} --out {output}"),
    shell:
        "{params.command} > {log} 2>&1"
