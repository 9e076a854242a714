#!/usr/bin/env bash
# Monitoring never reports on data it could not read (issue 47):
#  - the straggler report of a healthy 2-rank run: a checkpoint step (whose
#    statistics are read right after the step before's) is measured as a
#    step, not as the near-zero moment between two reads, so no rank is
#    named there;
#  - a rank frozen for 8 s (SIGSTOP ... SIGCONT) is named, with its time;
#  - `meshtrain flight` on a truncated, garbage or foreign flight file: an
#    error naming the file, never "no rank lags on any axis".
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1
   --set inference_config.max_tokens=0)

# --- A healthy run, a checkpoint every 2 steps, the report at every step.
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name healthy --n_device_axis 2 1 1 --training_steps 12 \
  --checkpoint_steps 2 --set log_every=1 --set straggler_threshold=1.0 --fresh > healthy.log 2>&1 ||
  bad "healthy run" "$(tail healthy.log)"
check "healthy run: checkpoint steps are timed as steps, not as the moment between two reads" python3 -c "
import json, statistics
rows = [json.loads(l) for l in open('runs/healthy/metrics.jsonl')]
t = {r['step']: r['step_time_median'] for r in rows if 'step_time_median' in r}
assert sorted(t) == list(range(1, 13)), sorted(t)
other = statistics.median(v for s, v in t.items() if s % 2)
low = {s: v for s, v in t.items() if s % 2 == 0 and v < 0.3 * other}
assert not low, ('checkpoint steps near zero', low, 'other steps', other)"
check "healthy run: no straggler named (threshold 100%)" \
  bash -c "! grep -q 'straggler:' healthy.log && ! grep -q slowest_rank runs/healthy/metrics.jsonl"

# --- Rank 1 frozen for 8 s in its own work: it stops itself (SIGSTOP) after
# the backward pass of step 10, outside any collective (a test hook, so the
# stop never lands inside one, where every rank waits alike), and the test
# lets it go on 8 s later. Rank 0 waits inside the next collective meanwhile.
MESHTRAIN_TEST_SIGSTOP_AT_STEP=10 MESHTRAIN_TEST_STALL_RANKS=1 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name frozen \
  --n_device_axis 2 1 1 --training_steps 20 --checkpoint_steps 1000 --set log_every=1 --fresh > frozen.log 2>&1 &
job=$!
stopped=""
for _ in $(seq 600); do
  rank1=$(sed -n 4p runs/frozen/heartbeats/rank_00001 2>/dev/null)
  [ -n "$rank1" ] && [ "$(awk '{print $3}' "/proc/$rank1/stat" 2>/dev/null)" = T ] && { stopped=1; break; }
  sleep 0.1
done
if [ -n "$stopped" ]; then
  sleep 8
  kill -CONT "$rank1"
else
  bad "frozen rank: rank 1 never stopped itself" "$(tail frozen.log)"
  kill $job
fi
wait $job || bad "frozen run" "$(tail frozen.log)"
check "frozen rank: named in the row of step 10, with its 10.5 s (2.5 s the hook sleeps + 8 s stopped)" python3 -c "
import json
rows = [json.loads(l) for l in open('runs/frozen/metrics.jsonl')]
hit = [r['step'] for r in rows if r.get('slowest_rank') == 1 and r['step_time_max'] >= 10]
assert hit == [10], [(r['step'], r.get('slowest_rank'), r.get('step_time_max')) for r in rows if r.get('step_time_max', 0) > 1]"
check "frozen rank: the log says so" grep -q "straggler: rank 1 took [0-9.]* s per step outside collectives" frozen.log

# --- meshtrain flight on records it cannot read.
# A real record, from a stop of a 2-rank run, then damaged in turn.
MESHTRAIN_TEST_STEP_SLEEP_MS=100 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name rec --n_device_axis 2 1 1 \
  --training_steps 1000 --checkpoint_steps 1000 --fresh > rec.log 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "Step 3," rec.log 2>/dev/null && break; sleep 0.1; done
kill -USR1 $job
wait $job
check "a stopped run wrote its flight records" test -f runs/rec/flight/rank_00000.json
"$BIN" flight runs/rec > rec-flight.txt 2>&1
check "meshtrain flight on whole records: rc 0, no lag" bash -c "grep -q 'no rank lags on any axis' rec-flight.txt"
record=$(cat runs/rec/flight/rank_00000.json)
for kind in truncated garbage foreign; do
  rm -rf fl && mkdir -p fl/flight
  case $kind in
    truncated) printf '%s' "${record:0:$((${#record} / 2))}" > fl/flight/rank_00000.json ;;
    garbage) head -c 3000 /dev/urandom > fl/flight/rank_00000.json ;;
    foreign) echo '{"axes": ["dp"], "records": 7}' > fl/flight/rank_00000.json ;;
  esac
  "$BIN" flight fl > "fl-$kind.log" 2>&1
  rc=$?
  check "meshtrain flight, the only flight file $kind: an error naming it (rc $rc)" \
    bash -c "test $rc -eq 1 && grep -q 'fl/flight/rank_00000.json cannot be read' fl-$kind.log"
  check "meshtrain flight, the only flight file $kind: never 'no rank lags'" \
    bash -c "! grep -q 'no rank lags' fl-$kind.log"
done

finish
