#!/usr/bin/env bash
# SLURM for real: a two-node SLURM 22.05 cluster (tests/hosts/slurm.sh) on the
# test bed (tests/hosts/testbed.sh), `sbatch scripts/launch-slurm.sbatch` as
# a user submits it, with the script's defaults (CPU-only: no GPU request):
#  - across both nodes it trains and equals one process;
#  - a real --time limit: SIGUSR1 before it reaches every rank through srun
#    (no SIGKILL), they save and exit 0, the job requeues itself, and the run
#    ends with the uninterrupted run's losses (a requeued attempt kept
#    --fresh and started over: it never finished);
#  - preemption by a job in a higher-priority partition, with srun and with
#    the mpirun launcher: the ranks save, the job comes back and finishes
#    with the uninterrupted run's losses (under mpirun they were killed
#    before saving, and the next attempt started over);
#  - a requeued job's attempts are appended to one log named by its job id.
# Slow steps (MESHTRAIN_TEST_STEP_SLEEP_MS, first attempt only) cost no CPU.
# Skipped (exit 77,
# reason printed) only where namespaces or the SLURM packages cannot be had.
source "$(dirname "$0")/common.sh" "$@"
source "$SRC/tests/hosts/testbed.sh"
source "$SRC/tests/hosts/slurm.sh"
slurm_e2e_setup
export MESHTRAIN_BINARY="$BIN"
# The binary with slow steps on a job's first attempt (SLOW_MS each): long
# enough to be stopped, and the attempt after it quick.
cat > slowfirst <<WRAP
#!/bin/sh
[ "\${SLURM_RESTART_COUNT:-0}" = 0 ] && export MESHTRAIN_TEST_STEP_SLEEP_MS="\$SLOW_MS"
exec "$BIN" "\$@"
WRAP
chmod +x slowfirst
same() { python3 "$SRC/tests/hosts/compare.py" "$@"; }
# sbatch on h1 with the script's own #SBATCH lines, one rank per node.
submit() { on_host h1 sbatch --parsable --ntasks-per-node=1 "$@"; }
log_of() { echo "meshtrain-$1.out"; }
field() { slurm_job "$1" | grep -o "$2=[^ ]*" | cut -d= -f2; }

# The uninterrupted runs to compare with, while SLURM works: dp 2 under
# mpirun on this machine (the same mesh and sums), and one process.
"${MPIRUN[@]}" -np 2 "$BIN" train --config tiny.json "${S[@]}" --training_steps 50 --name ref \
  --n_device_axis 2 1 1 > ref.log 2>&1 &
refs=$!

# Across both nodes, the defaults (no GPUs asked for) plus --ntasks-per-node.
id=$(submit "$SRC/scripts/launch-slurm.sbatch" tiny.json "${S[@]}" --training_steps 4 --name sb --n_device_axis 2 1 1)
"$BIN" train --config tiny.json "${S[@]}" --training_steps 4 --name one > one.log 2>&1 || bad "one process" "$(tail one.log)"
st=$(slurm_wait_job "$id" 90)
check "sbatch across h1,h2 with the defaults: COMPLETED ($st, ${SECONDS} s into the test)" test "$st" = COMPLETED
check "sbatch: one rank on each node" grep -q "rank 1 on h2" "$(log_of "$id")"
[ "$st" = COMPLETED ] || tail -20 "$(log_of "$id")"
out=$(same runs/sb/metrics.jsonl runs/one/metrics.jsonl) && ok "sbatch across h1,h2 = one process ($out)" ||
  bad "sbatch across h1,h2 != one process" "$out"

# Preemption: 50 steps (slow in the first attempt) in the "low" partition; at
# step 5 a job in "high" needs both nodes. SLURM requeues the low job (its
# ranks get SIGTERM and KillWait to save); it comes back after the high job
# and finishes. With srun, and with the mpirun launcher (mpirun gets the
# SIGTERM too and killed the ranks 1 s later: nothing saved, the next attempt
# started over).
preempted() {  # LAUNCHER NAME
  local l="$1" n="$2" id st log out
  id=$(MESHTRAIN_LAUNCHER="$l" MESHTRAIN_BINARY="$PWD/slowfirst" SLOW_MS=200 submit "$SRC/scripts/launch-slurm.sbatch" \
    tiny.json "${S[@]}" --training_steps 50 --name "$n" --n_device_axis 2 1 1)
  log=$(log_of "$id")
  slurm_preempt "$id" "$log"
  st="$job_state"
  check "preempted job ($l): the high-priority job ran ($preemptor_state; ${SECONDS} s into the test)" \
    test "$preemptor_state" = COMPLETED
  check "preempted job ($l): preempted, requeued and COMPLETED ($st, restarts $(field "$id" Restarts))" \
    bash -c "test '$st' = COMPLETED -a '$(field "$id" Restarts)' -ge 1 && grep -q 'DUE TO PREEMPTION' $log"
  check "preempted job ($l): the ranks saved, the second attempt resumed from it" \
    bash -c "grep -q 'resumed from runs/$n/checkpoints/step_' $log && grep -q 'training [1-9][0-9]* -> 50 steps' $log"
  check "preempted job ($l): no 'time limit near', no requeue error (SLURM requeued it first)" \
    bash -c "! grep -qE 'time limit near|requeue .* failed|Job is pending execution' $log"
  check "preempted job ($l): the run reached step 50" test -d "runs/$n/checkpoints/step_00000050"
  wait $refs 2>/dev/null
  test -f runs/ref/checkpoints/step_00000050/model.json -o -d runs/ref/checkpoints/step_00000050 ||
    bad "the uninterrupted run under mpirun" "$(tail -5 ref.log)"
  out=$(same "runs/$n/metrics.jsonl" runs/ref/metrics.jsonl 0) &&
    ok "preempted job ($l): losses and grad norms = the uninterrupted run ($out)" ||
    { bad "preempted job ($l): losses differ from the uninterrupted run" "$out"; grep -v "Step " "$log" | tail -30; }
}
preempted srun pre
preempted mpirun prempi

# A real time limit: --time=2 with SIGUSR1 60 s before it. SLURM checks
# time limits every 30 s and sends the warning up to one period early, so it
# comes 30 to 90 s into an attempt: after the ranks have started (with
# --time=1 and @50 it once came 1 s in, before they could take it), and
# before 50 steps of 2 s end.
id=$(MESHTRAIN_BINARY="$PWD/slowfirst" SLOW_MS=2000 submit --time=2 --signal=B:USR1@60 "$SRC/scripts/launch-slurm.sbatch" \
  tiny.json "${S[@]}" --training_steps 50 --name tl --n_device_axis 2 1 1)
log=$(log_of "$id")
st=$(slurm_wait_job "$id" 240)
check "time limit: the job ends COMPLETED ($st, ${SECONDS} s into the test) after $(field "$id" Restarts) requeue(s)" \
  bash -c "test '$st' = COMPLETED -a '$(field "$id" Restarts)' -ge 1"
check "time limit: said so, SIGUSR1 reached both ranks through srun, which killed nothing" \
  bash -c "grep -q 'time limit near (SIGUSR1, .* left)' $log &&
           test \$(grep -c 'rank [01]\] warning: stop requested (signal 10): step [0-9]* saved, exiting' $log) -ge 2 &&
           ! grep -qE 'forcing job termination|DUE TO TIME LIMIT' $log"
stop_step=$(grep -o 'stop requested (signal 10): step [0-9]*' "$log" | head -1 | awk '{print $NF}')
check "time limit: requeued by the script, the next attempt resumed from step $stop_step (not --fresh)" \
  bash -c "grep -q 'requeueing job $id: stopped by SIGUSR1' $log &&
           grep -q 'dropping --fresh' $log && grep -q 'training $stop_step -> 50 steps' $log"
check "time limit: the run reached step 50" test -d runs/tl/checkpoints/step_00000050
out=$(same runs/tl/metrics.jsonl runs/ref/metrics.jsonl 0) &&
  ok "time limit: losses and grad norms = the uninterrupted run ($out)" ||
  { bad "time limit: losses differ from the uninterrupted run" "$out"; grep -v "Step " "$log" | tail -30; }
# One log per job id, every attempt appended (the first was overwritten, and
# non-array jobs were named NAME-ID_4294967294.out).
check "time limit: one log meshtrain-$id.out with every attempt's header" \
  bash -c "test \$(grep -c '^launch-slurm.sbatch: job $id ' $log) -eq \$(($(field "$id" Restarts) + 1)) &&
           test \$(ls meshtrain-*.out | wc -l) -eq 4"

# A stop that comes while the ranks are still starting (here a wrapper that
# sleeps first): the SIGUSR1 kills them before they can save. The job is
# requeued all the same, and the next attempt runs the run to its end.
cat > slowstart <<WRAP
#!/bin/sh
[ "\${SLURM_RESTART_COUNT:-0}" = 0 ] && sleep 30
exec "$BIN" "\$@"
WRAP
chmod +x slowstart
id=$(MESHTRAIN_BINARY="$PWD/slowstart" submit "$SRC/scripts/launch-slurm.sbatch" tiny.json "${S[@]}" \
  --training_steps 4 --name early --n_device_axis 2 1 1)
log=$(log_of "$id")
for _ in $(seq 300); do grep -q "^srun " "$log" 2>/dev/null && break; sleep 0.2; done
sleep 2
on_host h1 scancel --signal=USR1 --batch "$id"
st=$(slurm_wait_job "$id" 120)
check "stop while the ranks start: requeued, not failed, then COMPLETED ($st, restarts $(field "$id" Restarts))" \
  bash -c "test '$st' = COMPLETED -a '$(field "$id" Restarts)' -ge 1 && grep -q 'before saving (still starting?)' $log"
check "stop while the ranks start: the next attempt ran the run to its end" test -d runs/early/checkpoints/step_00000004
[ "$st" = COMPLETED ] || tail -20 "$log"

finish
