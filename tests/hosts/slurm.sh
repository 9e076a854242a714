#!/usr/bin/env bash
# A two-node SLURM 22.05 cluster on the test bed (tests/hosts/testbed.sh),
# sourced after it: munged on every host (one key, its socket in the host's
# private /tmp), slurmctld on h1, slurmd on every host, each inside its
# host's namespaces, so bed_down kills them with the rest. Config, state,
# spool and logs live under $BED/slurm; SLURM_CONF points the daemons and the
# clients at it, nothing in /etc is used.
#
#   source tests/hosts/testbed.sh; source tests/hosts/slurm.sh
#   bed_up DIR 2; slurm_up      # or exit 77 with the reason (no packages)
#   on_host h1 sbatch ...       # clients run on a host (its munge socket)
#   slurm_wait_job ID SECS      # until the job has left the queue for good
#
# Partitions, all over h1,h2: "low" (the default, PriorityTier 1), "graced"
# (PriorityTier 1, GraceTime=30: a preempted job's tasks get SIGTERM and 30 s
# to save before SLURM requeues it, as on clusters that let jobs save) and
# "high" (PriorityTier 10); PreemptType=preempt/partition_prio with
# PreemptMode=REQUEUE: a job in "high" requeues the "low" or "graced" job it
# needs the nodes of. Under `ip netns exec` SLURM needs cgroup/v1 (no cgroup is then
# made), proctrack/linuxproc and task/none.

slurm_up() {
  local p
  case ":$PATH:" in *:/usr/sbin:*) ;; *) PATH="$PATH:/usr/sbin" ;; esac  # the daemons
  for p in munged slurmctld slurmd sbatch srun scontrol sinfo; do
    command -v "$p" >/dev/null ||
      bed_skip "SLURM test cluster: '$p' is not installed (scripts/setup.sh installs slurmctld slurmd slurm-client munge)"
  done
  local S="$BED/slurm" k h
  mkdir -p "$S/state" "$S/log"
  chmod 700 "$S"
  # One munge key for every host (munged refuses a key others can read).
  dd if=/dev/urandom bs=1 count=1024 of="$S/munge.key" status=none
  chmod 400 "$S/munge.key"
  # cred_expire: a requeued job waits that long before it may start again
  # (default 120 s); 10 s keeps the tests short.
  cat >"$S/slurm.conf" <<CONF
ClusterName=mtbed
SlurmctldHost=h1($(bed_ip 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=/tmp/munge/munge.socket.2,cred_expire=10
StateSaveLocation=$S/state
SlurmdSpoolDir=/tmp/slurmd
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=/tmp/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait=10
MessageTimeout=10
SlurmdTimeout=60
SchedulerParameters=sched_interval=2,bf_interval=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName=h1 NodeAddr=$(bed_ip 1) CPUs=4 State=UNKNOWN
NodeName=h2 NodeAddr=$(bed_ip 2) CPUs=4 State=UNKNOWN
PartitionName=low Nodes=h1,h2 Default=YES PriorityTier=1 MaxTime=INFINITE State=UP
PartitionName=graced Nodes=h1,h2 PriorityTier=1 GraceTime=30 MaxTime=INFINITE State=UP
PartitionName=high Nodes=h1,h2 PriorityTier=10 MaxTime=INFINITE State=UP
CONF
  printf 'CgroupPlugin=cgroup/v1\nIgnoreSystemd=yes\n' >"$S/cgroup.conf"
  export SLURM_CONF="$S/slurm.conf"
  for k in $(seq "$BED_N"); do
    h="h$k"
    on_host "$h" mkdir -p /tmp/munge /tmp/slurmd
    on_host "$h" munged --force --socket=/tmp/munge/munge.socket.2 --key-file="$S/munge.key" \
      --pid-file=/tmp/munge/munged.pid --seed-file=/tmp/munge/munged.seed --log-file="$S/log/munged-$h.log" ||
      { echo "FAIL: munged on $h did not start: $(tail -3 "$S/log/munged-$h.log")"; exit 1; }
  done
  on_host h1 slurmctld -i ||
    { echo "FAIL: slurmctld on h1 did not start: $(tail -5 "$S/log/slurmctld.log")"; exit 1; }
  for k in $(seq "$BED_N"); do
    on_host "h$k" slurmd ||
      { echo "FAIL: slurmd on h$k did not start: $(tail -5 "$S/log/slurmd-h$k.log")"; exit 1; }
  done
  # Both nodes idle (bounded).
  local n=0
  for _ in $(seq 150); do
    n=$(on_host h1 sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$n" -ge "$BED_N" ] && return 0
    sleep 0.2
  done
  echo "FAIL: SLURM nodes not idle after 30 s: $(on_host h1 sinfo -N 2>&1 | tr '\n' ' ')"
  tail -5 "$S/log/slurmctld.log" "$S"/log/slurmd-*.log
  exit 1
}

# The e2e tests' start (tests/e2e/hosts_slurm*.sh, after common.sh): the bed
# of two hosts, SLURM on it, the tiny corpus and config, and S, the train
# flags every job of theirs shares.
slurm_e2e_setup() {
  bed_up "$WORK/bed" 2
  slurm_up
  prepare_corpus
  write_config tiny.json
  S=(--set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1 --checkpoint_steps 1000
     --set inference_config.max_tokens=0 --fresh)
}

# Preempts job ID (its output LOG) once it logged step 5: a job in "high"
# that needs both nodes. Sets preemptor_state and job_state, the last states
# of the two (slurm_wait_job).
slurm_preempt() {  # ID LOG
  local hid
  for _ in $(seq 300); do grep -q "Step 5," "$2" 2>/dev/null && break; sleep 0.2; done
  hid=$(on_host h1 sbatch --parsable -p high --nodes=2 --exclusive --wrap "srun hostname")
  preemptor_state=$(slurm_wait_job "$hid" 90)
  job_state=$(slurm_wait_job "$1" 120)
}

# A job's state and fields, from scontrol (it knows finished jobs for
# MinJobAge, 300 s by default).
slurm_job() { on_host h1 scontrol show job "$1" 2>/dev/null; }
slurm_state() { slurm_job "$1" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2; }

# Waits up to SECS for job ID to end for good (not PENDING/RUNNING/REQUEUED,
# ...); prints its last state.
slurm_wait_job() {
  local id="$1" secs="$2" st=""
  for _ in $(seq $((secs * 2))); do
    st=$(slurm_state "$id")
    case "$st" in
      COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE) break ;;
    esac
    sleep 0.5
  done
  echo "$st"
}
