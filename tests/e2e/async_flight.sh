#!/usr/bin/env bash
# Saving in the background and finding a hung collective: async_checkpoint
# (the same files as a synchronous save, kill -9 during a background write,
# a stop while a save is in flight), the collective flight recorder (a rank
# stopped with SIGSTOP mid-step is named with its op; `meshtrain flight`),
# the straggler report (a rank slowed by a test hook is named).
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=3 --set lr.end_steps=40 --eval_steps 1
   --set inference_config.max_tokens=0)
loss_at() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
v=[r['loss'] for r in rows if r.get('step')==int(sys.argv[2]) and 'loss' in r]
print(repr(v[-1]) if v else 'none')" "$1" "$2"; }
wait_for() {  # FILE TEXT: until FILE contains TEXT (max 60 s)
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
same_files() {  # DIR_A DIR_B: every safetensors file identical
  local n=0
  for f in "$1"/*.safetensors; do cmp -s "$f" "$2/$(basename "$f")" || return 1; n=$((n + 1)); done
  [ $n -gt 0 ]
}

# 1. The same run saved synchronously and in the background: same losses, same files.
"$BIN" train "${T[@]}" --name sync --training_steps 8 --checkpoint_steps 2 --set max_to_keep=10 --fresh > sync.log 2>&1 \
  || bad "sync run" "$(cat sync.log)"
"$BIN" train "${T[@]}" --name async --training_steps 8 --checkpoint_steps 2 --set max_to_keep=10 \
  --set async_checkpoint=true --fresh > async.log 2>&1 || bad "async run" "$(cat async.log)"
same=1
for s in 2 4 6 8; do
  same_files runs/sync/checkpoints/step_0000000$s runs/async/checkpoints/step_0000000$s || same=0
  [ "$(loss_at runs/async/metrics.jsonl $s)" = "$(loss_at runs/sync/metrics.jsonl $s)" ] || same=0
done
check "async_checkpoint: every checkpoint byte-identical to the sync run's, same losses" test $same -eq 1
check "async_checkpoint: manifests and trainer states equal but for the mode and the name" python3 -c "
import json
def load(run, s, f): return json.load(open(f'runs/{run}/checkpoints/step_{s:08d}/{f}'))
for s in (2, 4, 6, 8):
    a, b = load('sync', s, 'manifest.json'), load('async', s, 'manifest.json')
    a['files'].pop('trainer_state.json'); b['files'].pop('trainer_state.json')
    assert a == b, s
    a, b = load('sync', s, 'trainer_state.json'), load('async', s, 'trainer_state.json')
    for k in ('async_checkpoint', 'name'): a['config'].pop(k); b['config'].pop(k)
    assert a == b, s"
check "async_checkpoint: latest is the last step" grep -qx step_00000008 runs/async/checkpoints/latest
check "async_checkpoint: saves committed in the background" grep -q "written in the background" async.log
check "metrics.jsonl: checkpoint_blocked_seconds in both modes" bash -c \
  "grep -q '\"checkpoint_blocked_seconds\"' runs/sync/metrics.jsonl && grep -q '\"checkpoint_async\":true' runs/async/metrics.jsonl"

# 2. kill -9 while the background write of step 4 is in flight: step 2 stays
#    the newest checkpoint, and the resumed run continues exactly.
MESHTRAIN_TEST_CKPT_WRITE_DELAY=4:60 "$BIN" train "${T[@]}" --name k9 --training_steps 8 --checkpoint_steps 2 \
  --set async_checkpoint=true --fresh > k9.log 2>&1 &
pid=$!
wait_for k9.log "background write of checkpoint step 4 sleeps" || bad "k9: the write of step 4 never started" "$(cat k9.log)"
kill -9 $pid
wait $pid 2>/dev/null
check "kill -9 in a background write: latest still names step 2" grep -qx step_00000002 runs/k9/checkpoints/latest
check "kill -9 in a background write: step 4 exists only as a staging dir" bash -c \
  "ls -d runs/k9/checkpoints/step_00000004.tmp-* >/dev/null && test ! -e runs/k9/checkpoints/step_00000004"
"$BIN" train "${T[@]}" --name k9 --training_steps 8 --checkpoint_steps 2 --set async_checkpoint=true > k9b.log 2>&1
check "kill -9: the resume loads step 2" grep -q "resumed from .*step_00000002" k9b.log
same=1
for s in 3 4 5 6 7 8; do [ "$(loss_at runs/k9/metrics.jsonl $s)" = "$(loss_at runs/sync/metrics.jsonl $s)" ] || same=0; done
check "kill -9: steps 3-8 after the resume equal the uninterrupted run, bit for bit" test $same -eq 1
check "kill -9: the staging dir is gone after the next commit" bash -c "! ls -d runs/k9/checkpoints/*.tmp-* 2>/dev/null"

# 3. A stop (SIGUSR1 through mpirun) while the save of step 2 is in flight:
#    every rank waits for it, saves the current step, exits 0.
MESHTRAIN_TEST_CKPT_WRITE_DELAY=2:4 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name stop --n_device_axis 2 1 1 \
  --training_steps 100000 --checkpoint_steps 2 --set async_checkpoint=true --fresh > stop.log 2>&1 &
pid=$!
wait_for stop.log "background write of checkpoint step 2 sleeps" || bad "stop: the write never started" "$(cat stop.log)"
kill -USR1 $pid
wait $pid
rc=$?
check "stop during a background save: exit 0 ($rc)" test $rc -eq 0
check "stop during a background save: step 2 committed" test -f runs/stop/checkpoints/step_00000002/manifest.json
ck=$(cat runs/stop/checkpoints/latest 2>/dev/null)
check "stop during a background save: latest ($ck) is the stop's step, after 2" \
  bash -c "test -n '$ck' && test $((10#${ck#step_})) -gt 2 && test -f runs/stop/checkpoints/$ck/manifest.json"
check "stop during a background save: no staging dir left" bash -c "! ls -d runs/stop/checkpoints/*.tmp-* 2>/dev/null"

# 4. The flight recorder: rank 1 stops itself (SIGSTOP) after the backward
#    pass of step 3; the watchdog ends the job naming rank 1 and the op rank
#    0 waits in; rank 0's records are on disk; `meshtrain flight` compares.
MESHTRAIN_TEST_SIGSTOP_AT_STEP=3 MESHTRAIN_TEST_SIGSTOP_HOLD=1 MESHTRAIN_TEST_STALL_RANKS=1 timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" \
  --name hang --n_device_axis 2 1 1 --training_steps 100 --checkpoint_steps 1000 --set watchdog_seconds=6 --fresh \
  > hang.log 2>&1
rc=$?
check "SIGSTOP mid-step: job ends non-zero, not by the test's timeout (rc $rc)" test $rc -ne 0 -a $rc -ne 124
check "SIGSTOP mid-step: the watchdog names rank 1 and the op it never entered" \
  grep -Eq "flight recorder: rank 1 never entered [a-z_]+ op #[0-9]+ .*rank\(s\) 0 wait in [a-z_]+ op #[0-9]+ \([a-z_]+, step 3\)" hang.log
check "SIGSTOP mid-step: rank 0 wrote its flight records" test -f runs/hang/flight/rank_00000.json
"$BIN" flight runs/hang > flight.txt 2>&1
# (mpirun ends a job by SIGCONT then SIGTERM: the hold keeps rank 1 out of the
# op rank 0 waits in until it is killed, so that op stays the first diverging one.)
check "meshtrain flight: the first diverging op, rank 0 still in it" \
  bash -c "grep -q 'first diverging op: #' flight.txt && grep -Eq '^  [a-z_]+ \(in it\): rank\(s\) 0$' flight.txt"
"$BIN" flight runs/sync > flight_none.txt 2>&1
check "meshtrain flight: a run without records is an error naming it" \
  bash -c "! $BIN flight runs/sync >/dev/null 2>&1 && grep -q 'no flight records in runs/sync' flight_none.txt"

# 5. The straggler report: rank 1 sleeps 300 ms before every step.
MESHTRAIN_TEST_SLOW_RANK=1:300 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name slow --n_device_axis 2 1 1 \
  --training_steps 6 --checkpoint_steps 1000 --set log_every=2 --fresh > slow.log 2>&1 || bad "slow run" "$(cat slow.log)"
check "straggler: rank 1 named in the step rows at log steps" python3 -c "
import json
rows=[json.loads(l) for l in open('runs/slow/metrics.jsonl')]
named=[r['step'] for r in rows if r.get('slowest_rank')==1]
timed=[r['step'] for r in rows if 'step_time_median' in r]
assert timed==[2,4,6] and named==[2,4,6], (timed, named)"
check "straggler: the log says so" grep -q "straggler: rank 1 took" slow.log
MESHTRAIN_TEST_SLOW_RANK=1:300 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name slow2 --n_device_axis 2 1 1 \
  --training_steps 2 --checkpoint_steps 1000 --set log_every=2 --set straggler_threshold=100 --fresh > slow2.log 2>&1
check "straggler_threshold: a rank under it is not named" bash -c \
  "grep -q step_time_max runs/slow2/metrics.jsonl && ! grep -q slowest_rank runs/slow2/metrics.jsonl"

# 6. The keys are checked like the others.
for kv in flight_recorder_size=-1 straggler_threshold=-0.5 async_checkpoint=3; do
  key=${kv%%=*}
  "$BIN" train "${T[@]}" --name bad --set "$kv" > bad.log 2>&1
  rc=$?
  check "$kv: refused naming the key (rc $rc)" bash -c "test $rc -ne 0 && test $rc -lt 128 && grep -q $key bad.log"
done

finish
