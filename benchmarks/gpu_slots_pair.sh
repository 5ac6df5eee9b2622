#!/bin/bash
# Two GPU jobs started together on a machine of two cards get a card each (GPU slots,
# fair_calib/gpu_slots.py), and the pair takes about the time of one job.
#
#   OUT=/tmp/slots bash benchmarks/gpu_slots_pair.sh [gpu_slot_job.py options]
#
# Runs benchmarks/gpu_slot_job.py once alone, then twice at once while nvidia-smi samples
# both cards every second; writes single.log, job-a.log, job-b.log, smi.csv under $OUT and
# prints the walls and their ratio (the bar: pair <= 1.2 x one).
set -u
OUT=${OUT:-/tmp/gpu-slots}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export FAIR_CALIB_GPU_LOCK_DIR=$PWD/.snakemake/gpu-slots
nvidia-smi -L
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"
now() { date +%s.%N; }

s=$(now)
python3 benchmarks/gpu_slot_job.py "$@" > "$OUT/single.log" 2>&1
e=$(now)
one=$(python3 -c "print(round($e - $s, 2))")

nvidia-smi --query-gpu=timestamp,index,pci.bus_id,utilization.gpu,memory.used \
    --format=csv -l 1 > "$OUT/smi.csv" &
smi=$!
s=$(now)
python3 benchmarks/gpu_slot_job.py "$@" > "$OUT/job-a.log" 2>&1 &
a=$!
python3 benchmarks/gpu_slot_job.py "$@" > "$OUT/job-b.log" 2>&1 &
b=$!
wait $a; ra=$?
wait $b; rb=$?
e=$(now)
kill $smi
pair=$(python3 -c "print(round($e - $s, 2))")

for f in single job-a job-b; do echo "== $f.log"; cat "$OUT/$f.log"; done
echo "== nvidia-smi while the pair ran (busiest sample per card)"
python3 - "$OUT/smi.csv" <<'EOF'
import csv, sys
best = {}
for row in csv.reader(open(sys.argv[1])):
    if len(row) < 5 or not row[1].strip().isdigit():
        continue
    util = int(row[3].strip().split()[0])
    card = row[1].strip()
    samples = best.setdefault(card, [0, 0, row])
    samples[1] += 1
    if util > samples[0]:
        samples[0], samples[2] = util, row
for card, (util, n, row) in sorted(best.items()):
    busy = sum(1 for r in csv.reader(open(sys.argv[1]))
               if len(r) >= 5 and r[1].strip() == card and r[3].strip().split()[0].isdigit()
               and int(r[3].strip().split()[0]) >= 50)
    print(f"card {card}: {busy}/{n} samples >= 50% busy; max {util}% ({','.join(x.strip() for x in row)})")
EOF
echo "exit codes: a=$ra b=$rb"
python3 -c "print(f'one job alone: $one s; two at once: $pair s; ratio {$pair / $one:.3f}')"
