#!/usr/bin/env bash
# Why a SLURM job stopped, and what scripts/launch-slurm.sbatch makes of it,
# on the two-node SLURM cluster of the test bed (tests/hosts/slurm.sh), the
# script submitted as a user does (one rank per node):
#  - `scancel JOB`: the ranks save, the job ends CANCELLED and never comes
#    back (it was requeued and trained on);
#  - preemption from a partition without a GraceTime: SLURM requeues the
#    job, the ranks save, it comes back and ends with the uninterrupted
#    run's losses;
#  - preemption from a partition with GraceTime=30: SLURM signals the ranks
#    only, they save inside the grace time; the script requeues the job (it
#    ended COMPLETED at the step it reached), and it ends with the
#    uninterrupted run's losses;
#  - the time limit (SIGUSR1 before it) keeps requeueing: twice here, then
#    the run ends with the uninterrupted run's losses.
# Each is logged with its cause. Skipped (exit 77, reason printed) only where
# namespaces or the SLURM packages cannot be had.
source "$(dirname "$0")/common.sh" "$@"
source "$SRC/tests/hosts/testbed.sh"
source "$SRC/tests/hosts/slurm.sh"
slurm_e2e_setup
# The binary with slow steps (SLOW_MS each) while SLURM's restart count is
# below SLOW_ATTEMPTS (default 1): long enough to be stopped, later attempts quick.
cat > slow <<WRAP
#!/bin/sh
[ "\${SLURM_RESTART_COUNT:-0}" -lt "\${SLOW_ATTEMPTS:-1}" ] && export MESHTRAIN_TEST_STEP_SLEEP_MS="\$SLOW_MS"
exec "$BIN" "\$@"
WRAP
chmod +x slow
export MESHTRAIN_BINARY="$PWD/slow"
same() { python3 "$SRC/tests/hosts/compare.py" "$@"; }
submit() { on_host h1 sbatch --parsable --ntasks-per-node=1 "$@"; }
log_of() { echo "meshtrain-$1.out"; }
field() { slurm_job "$1" | grep -o "$2=[^ ]*" | cut -d= -f2; }
until_in_log() {  # LOG PATTERN: waits up to 60 s
  for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  return 1
}
headers() { grep -c "^launch-slurm.sbatch: job $1 " "$(log_of "$1")"; }

# The uninterrupted run (dp 2 under mpirun here: the same mesh and sums).
"${MPIRUN[@]}" -np 2 "$BIN" train --config tiny.json "${S[@]}" --training_steps 50 --name ref \
  --n_device_axis 2 1 1 > ref.log 2>&1 &
refs=$!
ref_done() {
  wait $refs 2>/dev/null
  test -d runs/ref/checkpoints/step_00000050 || bad "the uninterrupted run under mpirun" "$(tail -5 ref.log)"
}
# NAME: the run's losses and grad norms against the uninterrupted run's.
same_as_ref() {
  local out
  ref_done
  out=$(same "runs/$1/metrics.jsonl" runs/ref/metrics.jsonl 0) &&
    ok "$1: losses and grad norms = the uninterrupted run ($out)" ||
    { bad "$1: losses differ from the uninterrupted run" "$out"; grep -v "Step " "$(log_of "$2")" | tail -30; }
}

# --- scancel: the job ends, after the ranks saved.
id=$(SLOW_MS=300 submit "$SRC/scripts/launch-slurm.sbatch" tiny.json "${S[@]}" --training_steps 50 --name cancel \
  --n_device_axis 2 1 1)
log=$(log_of "$id")
until_in_log "$log" "Step 5," || bad "scancel: the job never reached step 5" "$(tail "$log")"
on_host h1 scancel "$id"
st=$(slurm_wait_job "$id" 60)
sleep 15  # cred_expire (10 s) + a scheduling pass: a requeued job would be back by now
st2=$(slurm_state "$id")
check "scancel: the job ends CANCELLED ($st, then $st2 after 15 s; restarts $(field "$id" Restarts))" \
  bash -c "test '$st' = CANCELLED -a '$st2' = CANCELLED -a '$(field "$id" Restarts)' = 0"
check "scancel: one attempt only, nothing trained after it ($(headers "$id") attempt(s))" test "$(headers "$id")" = 1
check "scancel: logged as a cancel, not requeued" \
  bash -c "grep -q 'SIGTERM: the job was cancelled (scancel' $log && grep -q 'not requeueing job $id: stopped by SIGTERM, cancelled' $log &&
           ! grep -q '^launch-slurm.sbatch: requeueing job' $log"
stop_step=$(grep -o 'stop requested (signal [0-9]*): step [0-9]* saved' "$log" | head -1 | awk '{print $(NF-1)}')
check "scancel: the ranks saved first (step ${stop_step:-none} of 50)" \
  bash -c "test -n '$stop_step' && test -d runs/cancel/checkpoints/step_$(printf %08d "${stop_step:-0}")"
[ "$st" = CANCELLED ] || grep -v "Step " "$log" | tail -20

# --- Preemption (PreemptMode=REQUEUE): at step 5 a job in "high" needs both
# nodes of a job in PART; with GraceTime=30 ("graced") SLURM signals only the
# ranks and would end the job COMPLETED once they exit.
plog=""  # the log of the last preempted job
preempted() {  # PART NAME
  local part="$1" n="$2" id st log
  id=$(SLOW_MS=200 submit -p "$part" "$SRC/scripts/launch-slurm.sbatch" tiny.json "${S[@]}" --training_steps 50 \
    --name "$n" --n_device_axis 2 1 1)
  log=$(log_of "$id")
  slurm_preempt "$id" "$log"
  st="$job_state"
  check "$n: the high-priority job ran ($preemptor_state; ${SECONDS} s into the test)" test "$preemptor_state" = COMPLETED
  check "$n: requeued and COMPLETED ($st, restarts $(field "$id" Restarts))" \
    bash -c "test '$st' = COMPLETED -a '$(field "$id" Restarts)' -ge 1"
  # (SLURM's SIGTERM, or the SIGUSR1 the script passes on through srun: whichever comes first.)
  check "$n: the ranks saved on the stop, the second attempt resumed from it" \
    bash -c "grep -qE 'stop requested \(signal (10|15)\): step [0-9]* saved' $log &&
             grep -q 'resumed from runs/$n/checkpoints/step_' $log && grep -q 'training [1-9][0-9]* -> 50 steps' $log"
  check "$n: the run reached step 50" test -d "runs/$n/checkpoints/step_00000050"
  same_as_ref "$n" "$id"
  plog="$log"
}
preempted low pre
log="$plog"
check "preempted, no GraceTime: logged as a preemption SLURM requeued" \
  bash -c "grep -q 'SIGTERM: preempted (SLURM has requeued the job' $log && grep -q 'DUE TO PREEMPTION' $log &&
           ! grep -qE 'cancelled|not requeueing|requeue .* failed' $log"
preempted graced grace
log="$plog"
check "preempted with GraceTime=30: the script requeued it, saying why" \
  bash -c "grep -q \"^launch-slurm.sbatch: requeueing job .*: preempted at .*(the partition's GraceTime\" $log &&
           ! grep -qE 'cancelled|not requeueing|requeue .* failed' $log &&
           test \$(grep -c '^launch-slurm.sbatch: done' $log) -eq 1"

# --- The time limit keeps requeueing: --time=2 with SIGUSR1 60 s before it
# (it comes 30 to 90 s into an attempt, hosts_slurm.sh), two attempts with
# 50 steps of 2 s, then a quick one.
id=$(SLOW_MS=2000 SLOW_ATTEMPTS=2 submit --time=2 --signal=B:USR1@60 "$SRC/scripts/launch-slurm.sbatch" tiny.json \
  "${S[@]}" --training_steps 50 --name tl --n_device_axis 2 1 1)
log=$(log_of "$id")
st=$(slurm_wait_job "$id" 420)
check "time limit: requeued at every limit, then COMPLETED ($st, restarts $(field "$id" Restarts); ${SECONDS} s into the test)" \
  bash -c "test '$st' = COMPLETED -a '$(field "$id" Restarts)' -ge 2"
check "time limit: each stop logged as the time limit and requeued ($(grep -c 'time limit near (SIGUSR1' "$log") of them)" \
  bash -c "test \$(grep -c 'time limit near (SIGUSR1, .* left)' $log) -ge 2 &&
           test \$(grep -c 'requeueing job $id: stopped by SIGUSR1 (timelimit)' $log) -ge 2 && ! grep -q cancelled $log"
check "time limit: the run reached step 50" test -d runs/tl/checkpoints/step_00000050
same_as_ref tl "$id"

finish
