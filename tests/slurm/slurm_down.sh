#!/usr/bin/env bash
# Stop the localhost test cluster started by slurm_up.sh (by PID files; never by process name).
#   FAIR_CALIB_SLURM_STATE   state folder (default /tmp/fair-calib-slurm)
#   FAIR_CALIB_SLURM_KEEP_MUNGE=1  leave munged running
#   FAIR_CALIB_SLURM_PURGE=1       remove the state folder afterwards
set -uo pipefail
STATE="${FAIR_CALIB_SLURM_STATE:-/tmp/fair-calib-slurm}"
log() { echo "[slurm_down] $*" >&2; }

stop_pidfile() {  # name pidfile
    local name="$1" pf="$2" pid
    [ -s "$pf" ] || { log "$name: no pid file"; return 0; }
    pid="$(cat "$pf")"
    if ! kill -0 "$pid" 2>/dev/null; then log "$name: not running"; rm -f "$pf"; return 0; fi
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        log "$name ($pid) ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null
    fi
    rm -f "$pf"
    log "$name ($pid) stopped"
}

if [ -f "$STATE/slurm.conf" ] && command -v scancel >/dev/null; then
    # cancel leftover jobs of the test cluster before the daemons go away
    SLURM_CONF="$STATE/slurm.conf" timeout 10 scancel --full --quiet -u "$(id -un)" 2>/dev/null || true
    # let slurmd kill the jobs' processes before it goes away (else they are orphaned)
    for _ in $(seq 1 60); do
        left="$(SLURM_CONF="$STATE/slurm.conf" timeout 10 squeue -h -t R,CG,S,PD 2>/dev/null | wc -l)"
        [ "${left:-0}" -eq 0 ] && break
        sleep 0.5
    done
fi
stop_pidfile slurmd "$STATE/run/slurmd.pid"
stop_pidfile slurmctld "$STATE/run/slurmctld.pid"
if [ "${FAIR_CALIB_SLURM_KEEP_MUNGE:-0}" != 1 ]; then
    stop_pidfile munged /run/munge/munged.pid
fi
# the /etc/slurm/slurm.conf link slurm_up.sh made (only if it points into our state folder)
if [ -L /etc/slurm/slurm.conf ] && [ "$(readlink /etc/slurm/slurm.conf)" = "$STATE/slurm.conf" ]; then
    rm -f /etc/slurm/slurm.conf
fi
if [ "${FAIR_CALIB_SLURM_PURGE:-0}" = 1 ]; then
    rm -rf "$STATE"
    log "removed $STATE"
fi
