#!/usr/bin/env bash
# Faults across hosts on the test bed (tests/hosts/testbed.sh), through
# launch-mpirun.sh as a user runs it: the second host's network cut
# mid-run (link down) ends it in bounded time (mpirun hung after meshtrain's
# watchdog aborted its ranks when ssh had no keep-alive), and with
# --drop-unreachable the restart goes on without it at dp 1; --max-restarts
# carries a run across a kill -9 of the rank on the second host (the job ends
# naming the host and the signal) to its last step with the uninterrupted
# run's losses, and gives up early on a failure that repeats at the same step.
# Skipped (exit 77, reason printed) only where namespaces cannot be made.
source "$(dirname "$0")/common.sh" "$@"
source "$SRC/tests/hosts/testbed.sh"
bed_up "$WORK/bed" 2

prepare_corpus
write_config tiny.json
S=(--set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1 --set inference_config.max_tokens=0)
printf 'h1\nh2\n' > hostfile
launch() {  # SECS LOG ARGS... (launch-mpirun.sh on h1, 1 rank per host)
  local secs="$1" log="$2"
  shift 2
  on_host_for "$secs" h1 bash "$SRC/scripts/launch-mpirun.sh" --hostfile hostfile --ranks-per-host 1 --config tiny.json \
    --binary "$BIN" --connect-timeout 3 "$@" > "$log" 2>&1
}
# The pid of meshtrain on HOST (the rank there).
rank_pid() { local p; for p in $(bed_pids "$1"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = meshtrain ] && echo "$p"; done | head -1; }
wait_for() {  # LOG PATTERN: up to 60 s
  for _ in $(seq 600); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# The uninterrupted run the --max-restarts run below is compared with: the
# same mesh under mpirun on this machine, while the bed waits for timeouts.
"${MPIRUN[@]}" -np 2 "$BIN" train --config tiny.json "${S[@]}" --n_device_axis 2 1 1 --name straight \
  --training_steps 12 --checkpoint_steps 3 --fresh > straight.log 2>&1 &
straight=$!

# h2's cable pulled mid-run: the watchdog (5 s) ends rank 0, ssh's
# keep-alive ends h2's part, in bounded time (mpirun hung after meshtrain's
# watchdog aborted its ranks). With --max-restarts and --drop-unreachable the
# restart leaves h2 out and the run finishes on h1 at dp 1 from the newest
# checkpoint (slow steps: the cut comes mid-run).
launch 200 link.log --log-dir "$PWD/link-logs" --max-restarts 1 --drop-unreachable \
  --env MESHTRAIN_TEST_STEP_SLEEP_MS=100 -- "${S[@]}" --n_device_axis 2 1 1 --name link --training_steps 16 \
  --checkpoint_steps 4 --fresh --set watchdog_seconds=5 &
job=$!
wait_for link.log "Step 5," && bed_link h2 down
start=$(date +%s)
wait_for link.log "attempt 0 (started at step 0) failed"
took=$(($(date +%s) - start))
wait $job
rc=$?
bed_link h2 up
check "h2 cut off: attempt 0 ends in ${took} s, bounded" test $took -le 60
check "h2 cut off: the watchdog says rank 0 waited for its peer, the launcher names h2" \
  bash -c "grep -q 'watchdog: rank 0 .*made no progress' link.log && grep -q 'host h2 is not ready' link.log"
check "--drop-unreachable: the restart leaves h2 out, goes on at dp 1" grep -q \
  "left out unreachable host(s) h2; going on with 1 host(s) (h1): world 1, mesh dp 1 x pp 1 x tp 1 (was dp 2)" link.log
check "--drop-unreachable: resumed from a checkpoint and finished (rc $rc)" \
  bash -c "test $rc -eq 0 && grep -q 'training [1-9][0-9]* -> 16 steps' link.log && test -d runs/link/checkpoints/step_00000016"
[ $rc -eq 0 ] || tail -20 link.log

# --max-restarts across a kill -9: on the first attempt only, the rank on h2
# stops before step 8 (after the checkpoint of step 6) and is killed -9 there;
# the restart resumes from step 6 and the run reaches step 12 with the losses
# of a run never interrupted.
wait $straight || bad "uninterrupted run" "$(tail straight.log)"
cat > once <<WRAP
#!/bin/sh
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ] && mkdir "$PWD/stalled-once" 2>/dev/null; then
  export MESHTRAIN_TEST_STALL_AT_STEP=8 MESHTRAIN_TEST_STALL_RANKS=1
fi
exec "$BIN" "\$@"
WRAP
chmod +x once
on_host_for 240 h1 bash "$SRC/scripts/launch-mpirun.sh" --hostfile hostfile --ranks-per-host 1 --config tiny.json \
  --binary "$PWD/once" --connect-timeout 3 --log-dir "$PWD/restart-logs" --max-restarts 2 \
  -- "${S[@]}" --n_device_axis 2 1 1 --name restart --training_steps 12 --checkpoint_steps 3 --fresh \
  > restart.log 2>&1 &
job=$!
wait_for restart.log "rank 1 stalls before step 8" && kill -9 "$(rank_pid h2)"
start=$(date +%s)
wait_for restart.log "restart 1 of 2"
took=$(($(date +%s) - start))
wait $job
rc=$?
check "kill -9 on h2: the job ends and the restart begins ${took} s later" test $took -le 30
check "--max-restarts: the run ends 0 after a kill -9 (rc $rc)" test $rc -eq 0
check "kill -9 on h2: mpirun names the host and the signal" grep -q "on node h2 exited on signal 9" restart.log
# "after step 6": the last step logged. Step 7 ran, but a step's line is
# written once the next step is enqueued (the loop's deferred read), and
# step 8 never completed.
check "--max-restarts: the restart is logged with its cause and step" \
  bash -c "grep -q 'attempt 0 (started at step 0) failed with mpirun exit [0-9]* after step 6:.*h2' restart.log &&
           grep -q 'restart 1 of 2: resuming from step 6' restart.log"
check "--max-restarts: the second attempt resumed from step 6" grep -q "training 6 -> 12 steps" restart.log
out=$(python3 "$SRC/tests/hosts/compare.py" runs/restart/metrics.jsonl runs/straight/metrics.jsonl) &&
  ok "--max-restarts: losses and grad norms = the uninterrupted run ($out)" || bad "--max-restarts: losses differ" "$out"

# The same stall on every attempt: no progress, so the loop stops early.
start=$(date +%s)
launch 240 again.log --log-dir "$PWD/again-logs" --max-restarts 5 --env MESHTRAIN_TEST_STALL_AT_STEP=5 \
  --env MESHTRAIN_TEST_STALL_RANKS=1 -- "${S[@]}" --n_device_axis 2 1 1 --name again --training_steps 12 \
  --checkpoint_steps 3 --fresh --set watchdog_seconds=4
rc=$? took=$(($(date +%s) - start))
check "--max-restarts, same failure twice: gives up early (rc $rc, ${took} s)" test $rc -ne 0 -a $rc -ne 124
check "--max-restarts, same failure twice: says why after attempt 1" \
  grep -q "giving up: attempt 1 failed at step 3 like the one before it, with no newer checkpoint" again.log
[ $rc -ne 124 ] || tail -20 again.log

finish
