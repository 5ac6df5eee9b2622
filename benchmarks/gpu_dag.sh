#!/usr/bin/env bash
# The whole DAG on a lent GPU: the pipeline as Snakemake runs it (config/gpu_dag.yaml), random
# weights at the real LLaDA-8B / Dream-7B widths, every job's wall time and card in its log.
#   benchmarks/gpu_dag.sh wheels     CPU machine: .whl/, what the lent machine lacks (Python 3.12)
#   benchmarks/gpu_dag.sh data       CPU machine: .gpu_dag_data/, real documents of each length
#   benchmarks/gpu_dag.sh run        lent machine, repo root: wheels, checkpoints, DAG, summary
#   benchmarks/gpu_dag.sh run --cpu-smoke   the same DAG at tiny widths on the CPU (fake quant)
# .whl/ and .gpu_dag_data/ are never committed (.git/info/exclude): name both in the device
# tool's `carry`. Environment: GPU_DAG_LAYERS (blocks a checkpoint, default 4; smoke 2),
# GPU_DAG_JOBS (GPU jobs at once, 4; smoke 2), GPU_DAG_DEADLINE (seconds after the start at which
# Snakemake is stopped so the summary still comes back from a 10-minute call, 540; smoke 1500),
# GPU_DAG_RUN (/tmp/gpu_dag_run, emptied first), GPU_DAG_SITE (/tmp/site), FAIR_CALIB_DATA_DIR
# (.gpu_dag_data), OUT (the device tool's folder: summary.md, jobs.json, logs_tail.txt,
# snakemake.log and the tables are copied there).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
PY=${PYTHON:-python3}

# What the lent machine's Python lacks (it has torch, triton, transformers, tokenizers, numpy,
# pandas, pyarrow, ...), at the project environment's versions; typing-extensions and fsspec are
# shipped for the versions pydantic and datasets need. pulp (Snakemake's ILP scheduler, 16 MB)
# is left out: the run uses `--scheduler greedy`.
WHEELS="annotated-types==0.8.0 argparse-dataclass==2.0.0 chardet==6.0.0.post1 conda-inject==1.3.2
configargparse==1.9.0 dataproperty==1.1.1 datasets==5.2.0 defusedxml==0.7.1 dill==0.4.1
docutils==0.22.4 dpath==2.2.0 evaluate==0.4.6 fastjsonschema==2.22.3 fsspec==2026.9.0
gitdb==4.0.12
gitpython==3.2.1 greenlet==3.5.6 humanfriendly==10.0 immutables==0.21 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 jupyter-core==5.9.1 lm-eval==0.4.13 mbstrdecoder==1.1.5
more-itertools==11.2.1 multiprocess==0.70.19 nbformat==5.11.1 nltk==3.10.4 pathvalidate==3.3.1
platformdirs==4.14.8 pydantic==2.14.4 pydantic-core==2.50.5 pytablewriter==1.2.1
referencing==0.37.0 rpds-py==2026.9.1 smart-open==7.7.1 smmap==5.0.3 snakemake==9.27.1
snakemake-interface-common==1.23.0 snakemake-interface-executor-plugins==9.4.0
snakemake-interface-logger-plugins==2.1.0 snakemake-interface-report-plugins==1.3.0
snakemake-interface-scheduler-plugins==2.0.2 snakemake-interface-storage-plugins==4.4.1
sqlalchemy==2.0.58 sqlmodel==0.0.37 tabledata==1.3.5 tcolorpy==0.1.7 tenacity==9.2.1
throttler==1.2.3 traitlets==5.16.1 typepy==1.3.5 typing-extensions==4.16.0
typing-inspection==0.4.5 yte==1.9.4"
# Published as source only (pure Python): built into wheels here.
SDIST_ONLY="connection-pool==0.0.3 rouge-score==0.1.2 sqlitedict==2.1.0 word2number==1.1"
PLATFORMS="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
--platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
--platform manylinux_2_5_x86_64 --platform manylinux1_x86_64"

wheels() {
    rm -rf .whl && mkdir .whl
    # shellcheck disable=SC2086
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $PLATFORMS -d .whl $WHEELS
    # shellcheck disable=SC2086
    $PY -m pip wheel -q --no-deps -w .whl $SDIST_ONLY
    local bad
    bad=$(ls .whl | grep -v -E -- '-([a-z0-9]+\.)*(py3|py312|cp312)(\.[a-z0-9]+)*-(none|cp312|abi3)-(any|manylinux[0-9_a-z.]*x86_64)\.whl$' || true)
    [ -z "$bad" ] || { echo "error: wheels the lent machine (CPython 3.12, x86-64) cannot install: $bad" >&2; exit 1; }
    local dup
    dup=$(ls .whl | sed 's/-[0-9].*//' | tr 'A-Z_.' 'a-z--' | sort | uniq -d)
    [ -z "$dup" ] || { echo "error: two versions of: $dup" >&2; exit 1; }
    echo "wheelhouse .whl/: $(ls .whl | wc -l) wheels, $(du -sb .whl | cut -f1) bytes ($(du -sh .whl | cut -f1))"
}

data() {
    $PY benchmarks/gpu_dag.py data --src "${FAIR_CALIB_SOURCE_DATA:-../shared/data}" \
        --out "${FAIR_CALIB_DATA_DIR:-.gpu_dag_data}"
    echo "data folder: $(du -sh "${FAIR_CALIB_DATA_DIR:-.gpu_dag_data}" | cut -f1)"
}

install_wheels() {
    local site=$1
    [ -d .whl ] || { echo "error: .whl/ is missing: run 'benchmarks/gpu_dag.sh wheels' on the CPU machine and name .whl in carry" >&2; exit 1; }
    rm -rf "$site"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$site" .whl/*.whl
}

# The run folder: the workflow's files (Snakefile, rules, configs, profiles), the checkpoints
# and every output; the package itself is imported from the repo (PYTHONPATH).
prepare_run() {
    local run=$1
    rm -rf "$run" && mkdir -p "$run/bin"
    cp -r Snakefile workflow config profiles "$run/"
    # The rules call `python`: the interpreter this script runs, by its own path (a symlink
    # would hide a virtual environment's pyvenv.cfg from it).
    printf '#!/bin/sh\nexec %q "$@"\n' "$(command -v "$PY")" > "$run/bin/python"
    chmod +x "$run/bin/python"
}

run() {
    local smoke=0
    [ "${1:-}" = "--cpu-smoke" ] && smoke=1
    local run=${GPU_DAG_RUN:-/tmp/gpu_dag_run} site=${GPU_DAG_SITE:-/tmp/site}
    local data=${FAIR_CALIB_DATA_DIR:-.gpu_dag_data}
    [ -f "$data/manifest.json" ] || { echo "error: $data/manifest.json is missing: run 'benchmarks/gpu_dag.sh data' on the CPU machine and name $data in carry" >&2; exit 1; }
    data=$(cd "$data" && pwd)
    local layers=${GPU_DAG_LAYERS:-4} jobs=${GPU_DAG_JOBS:-4} configs="config/gpu_dag.yaml"
    export FAIR_CALIB_LOWBIT=auto
    if [ $smoke = 1 ]; then
        layers=${GPU_DAG_LAYERS:-2} jobs=${GPU_DAG_JOBS:-2}
        configs="config/gpu_dag.yaml config/gpu_dag_cpu.yaml"
        export FAIR_CALIB_LOWBIT=fake
    else
        install_wheels "$site"
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
    prepare_run "$run"
    export PATH="$run/bin:$PATH" FAIR_CALIB_GPU_SLOTS=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 \
        HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$run/hf" TOKENIZERS_PARALLELISM=false
    {
        echo "layers $layers, GPU jobs at once $jobs, FAIR_CALIB_LOWBIT=$FAIR_CALIB_LOWBIT, configs: $configs"
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
        $PY benchmarks/gpu_dag.py check-env
    } | tee "$run/env.txt"
    $PY -c "import snakemake, lm_eval, datasets, fair_calib" || { echo "error: snakemake, lm-eval, datasets or fair_calib does not import (see above)" >&2; exit 1; }
    local smoke_flag=""
    [ $smoke = 0 ] || smoke_flag=--smoke
    $PY benchmarks/gpu_dag.py checkpoints --data "$data" --out "$run/models" --layers "$layers" \
        $smoke_flag | tee -a "$run/env.txt"
    local deadline=${GPU_DAG_DEADLINE:-540}
    [ $smoke = 0 ] || deadline=${GPU_DAG_DEADLINE:-1500}
    local budget=$(( deadline - SECONDS )) rc=0
    [ "$budget" -ge 60 ] || { echo "error: only $budget s left before GPU_DAG_DEADLINE for Snakemake" >&2; exit 1; }
    echo "snakemake: $budget s left before the deadline (GPU_DAG_DEADLINE)"
    # shellcheck disable=SC2086
    (cd "$run" && timeout -s INT -k 20 "$budget" $PY -m snakemake --configfile $configs \
        --config data_dir="$data" --cores "$(nproc)" --resources gpu="$jobs" \
        --scheduler greedy --keep-going --rerun-incomplete \
        --prioritize results/prior/llada-gpu-dag/default.parquet \
        results/prior/dream-gpu-dag/default.parquet) 2>&1 | tee "$run/snakemake.log" \
        || rc=$?
    $PY benchmarks/gpu_dag.py summary --run "$run" ${OUT:+--out "$OUT"}
    [ -z "${OUT:-}" ] || cp "$run/snakemake.log" "$OUT/"
    echo "snakemake exit status: $rc"
    return "$rc"
}

case "${1:-}" in
    wheels) wheels ;;
    data) data ;;
    run) shift; run "$@" ;;
    *) echo "usage: benchmarks/gpu_dag.sh wheels | data | run [--cpu-smoke]" >&2; exit 2 ;;
esac
