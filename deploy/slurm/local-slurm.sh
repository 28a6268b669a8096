#!/usr/bin/env bash
# A single-node SLURM on this Debian/Ubuntu machine, for trying and testing deploy/slurm (run as root).
#
#   deploy/slurm/local-slurm.sh up     install slurm-wlm and munge if missing, write a slurm.conf sized to
#                                      this machine, start munged, slurmctld and slurmd, wait until the node
#                                      is idle
#   deploy/slurm/local-slurm.sh down   cancel the jobs still running, then stop the three daemons (by the
#                                      process ids in their pid files)
#   deploy/slurm/local-slurm.sh run COMMAND...
#                                      `up`, COMMAND with BUFFET_REQUIRE_SLURM=1 (the SLURM tests then fail
#                                      instead of skipping when no SLURM answers), then `down` whatever
#                                      happened; exits with COMMAND's status (1 if `up` failed)
#
# `up` and `down` are idempotent: `up` on a running SLURM only waits for the node, `down` on a stopped one
# does nothing.
# Without systemd the daemons are started directly. Not for production: one partition, no accounting,
# no cgroups.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
LOGS=/var/log/slurm
MUNGE_PID=/run/munge/munged.pid
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
WAIT_SECONDS=${LOCAL_SLURM_WAIT:-60}

say() { echo "local-slurm: $*" >&2; }
die() { say "$*"; exit 1; }

running() {  # running PIDFILE: the process named in PIDFILE is alive
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {
    command -v slurmctld >/dev/null && command -v munged >/dev/null && return
    say "installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge >/dev/null; } \
        || die "apt-get could not install slurm-wlm and munge; install them and run again"
}

munge_key() {
    [[ -s /etc/munge/munge.key ]] && return
    say "making a munge key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
}

write_conf() {  # this machine's CPUs and memory, as slurmd measures them
    local node host
    node=$(slurmd -C | head -n 1)
    host=$(hostname -s)
    mkdir -p /etc/slurm "$LOGS" /var/spool/slurmctld /var/spool/slurmd
    cat > "$CONF.new" <<EOF
# Written by deploy/slurm/local-slurm.sh: a single-node SLURM for testing.
ClusterName=buffet-local
SlurmctldHost=$host
AuthType=auth/munge
SlurmUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    mv "$CONF.new" "$CONF"
}

start_daemons() {
    mkdir -p /run/munge && chown munge:munge /run/munge
    running "$MUNGE_PID" || runuser -u munge -- munged
    running "$CTLD_PID" || slurmctld
    running "$SLURMD_PID" || slurmd
}

wait_for_idle_node() {
    local deadline=$((SECONDS + WAIT_SECONDS)) state=""
    while ((SECONDS < deadline)); do
        state=$(sinfo -h -o %T 2>/dev/null | head -n 1 || true)
        [[ $state == idle* || $state == mixed* || $state == allocated* ]] && { say "node $state"; return; }
        sleep 1
    done
    die "the node is not idle after ${WAIT_SECONDS} s (state: ${state:-no answer}); see $LOGS/slurmctld.log and $LOGS/slurmd.log"
}

stop() {  # stop PIDFILE NAME: SIGTERM to the process in PIDFILE, then wait for it to go
    local pid
    running "$1" || return 0
    pid=$(cat "$1")
    kill "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || { say "$2 stopped"; return; }; sleep 1; done
    die "$2 (process $pid) did not stop within 30 s"
}

up() {
    [[ $EUID -eq 0 ]] || die "run as root: it installs packages and starts system daemons"
    install_packages
    munge_key
    if ! running "$CTLD_PID"; then write_conf; fi
    start_daemons
    wait_for_idle_node
}

cancel_jobs() {  # cancel every job and wait for them to end, so none is left running without its daemons
    running "$CTLD_PID" || return 0
    local jobs
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    [[ -n $jobs ]] || return 0
    say "cancelling jobs: $(echo $jobs)"
    scancel $jobs || true
    for _ in $(seq 1 30); do [[ -z $(squeue -h -o %A 2>/dev/null) ]] && return; sleep 1; done
    say "jobs still listed after 30 s: $(squeue -h -o %A | tr '\n' ' ')"
}

down() {
    cancel_jobs
    stop "$SLURMD_PID" slurmd
    stop "$CTLD_PID" slurmctld
    stop "$MUNGE_PID" munged
}

run() {  # run COMMAND...: COMMAND between `up` and `down`, its exit status kept
    (($# > 0)) || die "usage: $0 run COMMAND..."
    # `down` in a subshell: its failure is reported but leaves the exit status to COMMAND
    trap '( down ) || say "could not take SLURM down; see $LOGS"' EXIT
    up
    local status=0
    BUFFET_REQUIRE_SLURM=1 "$@" || status=$?
    exit "$status"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    run) shift; run "$@" ;;
    *) die "usage: $0 up|down|run COMMAND..." ;;
esac
