#!/usr/bin/env bash
# Bring up a single-node SLURM cluster on localhost (munged + slurmctld + slurmd) for tests/CI.
#
#   tests/slurm/slurm_up.sh            # idempotent; prints the state folder
#   source "${FAIR_CALIB_SLURM_STATE:-/tmp/fair-calib-slurm}/env.sh"   # exports SLURM_CONF
#   tests/slurm/slurm_down.sh
#
# Needs root (installs Debian's slurmctld, slurmd, slurm-client and munge with apt-get when
# missing, runs the daemons as root / munge). No systemd: the daemons are started directly and
# stopped by their PID files.
# Environment:
#   FAIR_CALIB_SLURM_STATE      state folder (default /tmp/fair-calib-slurm)
#   FAIR_CALIB_SLURM_PARTITION  partition name (default "cpu")
#   FAIR_CALIB_SLURM_MIN_JOB_AGE  seconds a finished job stays visible to squeue/scontrol
#                               (default 7200; the executor plugin needs >= 3x its initial
#                               status wait when it polls with squeue)
#   FAIR_CALIB_SLURM_UP_TIMEOUT seconds to wait for the node to become idle (default 90)
set -euo pipefail

STATE="${FAIR_CALIB_SLURM_STATE:-/tmp/fair-calib-slurm}"
PARTITION="${FAIR_CALIB_SLURM_PARTITION:-cpu}"
MIN_JOB_AGE="${FAIR_CALIB_SLURM_MIN_JOB_AGE:-7200}"
UP_TIMEOUT="${FAIR_CALIB_SLURM_UP_TIMEOUT:-90}"
t0=$(date +%s.%N)

log() { echo "[slurm_up] $*" >&2; }
die() { echo "[slurm_up] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (starts munged/slurmctld/slurmd)"

# ---- 1. packages (idempotent) ---------------------------------------------------------------
# The daemons, the client commands and munge, without recommends: slurm-wlm would bring 43
# packages (every plugin and its -dev package), these 8 (docs/benchmarks.md: install times).
PKGS=(slurmctld slurmd slurm-client munge)
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v munged >/dev/null || ! command -v sinfo >/dev/null; then
    log "installing ${PKGS[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "${PKGS[@]}" >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 \
             && apt-get install -y -q --no-install-recommends "${PKGS[@]}" >/dev/null; } \
        || die "apt-get install ${PKGS[*]} failed"
fi

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

mkdir -p "$STATE"/{ctld,spool,log,run}
CONF="$STATE/slurm.conf"
ENVFILE="$STATE/env.sh"

# ---- already up? ------------------------------------------------------------------------------
if alive "$STATE/run/slurmctld.pid" && alive "$STATE/run/slurmd.pid" \
    && SLURM_CONF="$CONF" sinfo -h -o '%T' 2>/dev/null | grep -Eq '^(idle|mixed|allocated)'; then
    log "already running (state $STATE)"
    echo "$STATE"
    exit 0
fi

# ---- 2. munge ---------------------------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
    log "creating munge key"
    install -d -o munge -g munge -m 0700 /etc/munge
    if command -v mungekey >/dev/null; then
        mungekey --create --keyfile=/etc/munge/munge.key --force
    else
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    fi
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge 2>/dev/null || true
if ! (echo ok | munge 2>/dev/null | unmunge >/dev/null 2>&1); then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged --force \
        || die "munged failed to start (see /var/log/munge/munged.log)"
    for _ in $(seq 1 50); do
        echo ok | munge 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    echo ok | munge | unmunge >/dev/null || die "munge round trip fails"
fi

# ---- 3. slurm.conf ----------------------------------------------------------------------------
HOST="$(hostname -s)"
NCPU="$(nproc)"
TOTAL_MB="$(free -m | awk '/^Mem:/ {print $2}')"
MARGIN_MB=$(( TOTAL_MB / 8 > 1024 ? TOTAL_MB / 8 : 1024 ))
REAL_MB=$(( TOTAL_MB - MARGIN_MB ))
[ "$REAL_MB" -gt 1000 ] || die "too little memory ($TOTAL_MB MB)"

cat > "$CONF" <<EOF
# written by tests/slurm/slurm_up.sh -- single-node localhost test cluster
ClusterName=faircalib
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=60
KillWait=5
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU RealMemory=$REAL_MB State=UNKNOWN
PartitionName=$PARTITION Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF
# The executor's job step (snakemake-executor-plugin-slurm-jobstep) strips every SLURM_* variable
# before its nested `srun`, so SLURM_CONF does not reach it: srun inside a job reads the default
# /etc/slurm/slurm.conf. Point that at our file unless a real configuration lives there.
SYS_CONF=/etc/slurm/slurm.conf
if [ -e "$SYS_CONF" ] && [ ! -L "$SYS_CONF" ]; then
    cmp -s "$SYS_CONF" "$CONF" || die "$SYS_CONF exists and is not ours; refusing to replace it"
else
    mkdir -p /etc/slurm
    ln -sfn "$CONF" "$SYS_CONF"
fi
printf 'export SLURM_CONF=%q\nexport FAIR_CALIB_SLURM_PARTITION=%q\n' "$CONF" "$PARTITION" > "$ENVFILE"

# ---- 4. daemons -------------------------------------------------------------------------------
export SLURM_CONF="$CONF"
if ! alive "$STATE/run/slurmctld.pid"; then
    log "starting slurmctld"
    # -c: clean start (no saved jobs from an earlier test cluster); -i: ignore state errors
    slurmctld -c -i -f "$CONF" || die "slurmctld failed; see $STATE/log/slurmctld.log"
fi
if ! alive "$STATE/run/slurmd.pid"; then
    log "starting slurmd"
    slurmd -f "$CONF" || die "slurmd failed; see $STATE/log/slurmd.log"
fi

# ---- 5. wait for the node -----------------------------------------------------------------------
deadline=$(( $(date +%s) + UP_TIMEOUT ))
state=""
while :; do
    state="$(sinfo -h -n "$HOST" -o '%T' 2>/dev/null | head -n1 || true)"
    case "$state" in idle|mixed|allocated) break ;; esac
    if [ "$(date +%s)" -ge "$deadline" ]; then
        tail -n 20 "$STATE/log/slurmctld.log" "$STATE/log/slurmd.log" >&2 || true
        die "node $HOST not idle after ${UP_TIMEOUT}s (sinfo state: '${state:-none}')"
    fi
    sleep 0.5
done
t1=$(date +%s.%N)
log "up: node $HOST ($NCPU CPUs, ${REAL_MB} MB) partition $PARTITION state $state;" \
    "started in $(awk "BEGIN {printf \"%.1f\", $t1 - $t0}") s; source $ENVFILE"
echo "$STATE"
