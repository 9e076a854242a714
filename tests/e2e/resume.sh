#!/usr/bin/env bash
# Never lose a run: exact resume, resume on another mesh, preemption signals,
# kill -9 at random moments, corrupt checkpoints, NaN policy, dead and hung ranks.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=3 --set lr.end_steps=40 --checkpoint_steps 4 --eval_steps 1
   --set inference_config.max_tokens=0)
loss_at() { python3 -c "
import json,sys
rows=[json.loads(l) for l in open(sys.argv[1])]
v=[r['loss'] for r in rows if r.get('step')==int(sys.argv[2]) and 'loss' in r]
print(repr(v[-1]) if v else 'none')" "$1" "$2"; }

# The reference: 12 steps straight.
"$BIN" train "${T[@]}" --name straight --training_steps 12 --fresh > straight.log 2>&1 || bad "straight run" "$(cat straight.log)"

# Exact resume: 8 steps, then 4 more from the checkpoint = 12 straight, bit for bit.
"$BIN" train "${T[@]}" --name resumed --training_steps 8 --fresh > r1.log 2>&1
"$BIN" train "${T[@]}" --name resumed --training_steps 12 > r2.log 2>&1
check "resume logs it resumed" grep -q "resumed from .*step_00000008" r2.log
same=1
for s in 9 10 11 12; do
  [ "$(loss_at runs/resumed/metrics.jsonl $s)" = "$(loss_at runs/straight/metrics.jsonl $s)" ] || same=0
done
check "8 + 4 resumed steps equal 12 straight, bit for bit" test $same -eq 1

# Reshard: 8 steps on dp=2 ranks, resume on one process, close to straight.
# dp=2 sums gradients in another order (~1e-7 apart); the tiny model's loss
# spike at step 12 (grad norm ~17 at lr 3e-3) amplifies that to ~3e-4 on some
# CPUs' kernels. Bit-exact resume is checked above on one mesh; resharding is
# checked at 1e-5 on short runs by tests/dist (ckpt_reshard_test, zero_test).
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name reshard --training_steps 8 --n_device_axis 2 1 1 --fresh > rs1.log 2>&1
"$BIN" train "${T[@]}" --name reshard --training_steps 12 --n_device_axis 1 1 1 > rs2.log 2>&1
check "dp 2 -> 1 reshard continues like the straight run" python3 -c "
import sys
a=[float(x) for x in sys.argv[1:5]]; b=[float(x) for x in sys.argv[5:9]]
sys.exit(0 if all(abs(x-y)<1e-3 for x,y in zip(a,b)) else 1)" \
  $(for s in 9 10 11 12; do loss_at runs/reshard/metrics.jsonl $s; done) \
  $(for s in 9 10 11 12; do loss_at runs/straight/metrics.jsonl $s; done)

# Preemption: SIGTERM mid-run -> checkpoint of the current step, exit 0, resume.
wait_steps() {  # FILE N: until FILE has N training rows (max 60 s)
  for _ in $(seq 600); do
    [ -f "$1" ] && [ "$(grep -c '"loss"' "$1")" -ge "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
"$BIN" train "${T[@]}" --name term --training_steps 100000 --checkpoint_steps 1000 --fresh > term.log 2>&1 &
pid=$!
wait_steps runs/term/metrics.jsonl 3
kill -TERM $pid
wait $pid
check "SIGTERM: exit 0" test $? -eq 0
ck=$(cat runs/term/checkpoints/latest 2>/dev/null)
check "SIGTERM: a checkpoint of the current step ($ck)" test -n "$ck"
n=$((10#${ck#step_}))
"$BIN" train "${T[@]}" --name term --training_steps $((n + 2)) --checkpoint_steps 1000 > term2.log 2>&1
check "SIGTERM: resumes at step $n and continues" grep -q "Step $((n + 2)), Loss" term2.log

# mpirun forwards SIGUSR1 to its ranks: every rank stops at the same step,
# agreed every stop_check_steps steps (the signal comes near step 3).
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name usr1 --n_device_axis 2 1 1 --training_steps 100000 \
  --checkpoint_steps 1000 --set stop_check_steps=6 --fresh > usr1.log 2>&1 &
pid=$!
wait_steps runs/usr1/metrics.jsonl 3
kill -USR1 $pid
wait $pid
check "SIGUSR1 through mpirun: exit 0 with a checkpoint" test $? -eq 0 -a -f runs/usr1/checkpoints/latest
ck=$(cat runs/usr1/checkpoints/latest 2>/dev/null)
check "SIGUSR1 with stop_check_steps 6: saved at a multiple of 6 ($ck)" test $((10#${ck#step_} % 6)) -eq 0

# kill -9 at random moments (while training and while saving: a checkpoint
# every 2 steps), then resume: it always works and continues like the straight run.
ok_trials=0
for trial in $(seq 10); do
  rm -rf runs/k9
  "$BIN" train "${T[@]}" --name k9 --training_steps 12 --checkpoint_steps 2 > "k9-$trial.log" 2>&1 &
  pid=$!
  sleep "$(python3 -c "import random; print(round(random.uniform(0.3, 2.0), 2))")"
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  saved=$(cat runs/k9/checkpoints/latest 2>/dev/null || echo none)
  if "$BIN" train "${T[@]}" --name k9 --training_steps 12 --checkpoint_steps 2 > "k9-$trial-resume.log" 2>&1 &&
     [ "$(loss_at runs/k9/metrics.jsonl 12)" = "$(loss_at runs/straight/metrics.jsonl 12)" ]; then
    ok_trials=$((ok_trials + 1))
    echo "     trial $trial: killed with latest=$saved, resumed to step 12"
  else
    bad "kill -9 trial $trial (latest=$saved)" "$(tail -5 "k9-$trial-resume.log")"
  fi
done
check "kill -9: 10 of 10 trials resumed and reached the straight run's step-12 loss" test $ok_trials -eq 10

# A corrupted newest checkpoint is refused; the previous one is used.
"$BIN" train "${T[@]}" --name corrupt --training_steps 8 --fresh > c1.log 2>&1
f=$(ls runs/corrupt/checkpoints/step_00000008/*.safetensors | head -1)
python3 -c "
import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-5]^=0xff; open(p,'wb').write(b)" "$f"
"$BIN" train "${T[@]}" --name corrupt --training_steps 10 > c2.log 2>&1
check "corrupt checkpoint: exit 0" test $? -eq 0
check "corrupt checkpoint: refused with a warning naming it" grep -q "step_00000008" c2.log
check "corrupt checkpoint: resumed from the previous one" grep -q "resumed from .*step_00000004" c2.log

# NaN policy.
MESHTRAIN_TEST_NAN_AT_STEP=2 "$BIN" train "${T[@]}" --name nanskip --training_steps 5 --fresh > n1.log 2>&1
check "nan_policy skip: exit 0" test $? -eq 0
check "nan_policy skip: the step is logged as skipped" grep -q "update skipped" n1.log
MESHTRAIN_TEST_NAN_AT_STEP=2 "$BIN" train "${T[@]}" --name nanstop --training_steps 5 --set nan_policy=stop --fresh \
  > n2.log 2>&1
rc=$?
check "nan_policy stop: exit non-zero naming the step" test $rc -ne 0 -a "$(grep -c 'non-finite loss or gradient at step 2' n2.log)" -ge 1

# A dead rank: mpirun ends the job; the other rank does not hang.
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name dead --n_device_axis 2 1 1 --training_steps 100000 \
  --checkpoint_steps 1000 --fresh > dead.log 2>&1 &
pid=$!
wait_steps runs/dead/metrics.jsonl 2
victim=$(pgrep -f "meshtrain train.*--name dead" | grep -v "^$pid$" | tail -1)
start=$(date +%s)
kill -9 "$victim"
wait $pid
rc=$?
took=$(($(date +%s) - start))
check "dead rank: job exits non-zero (rc $rc) within 60 s (${took} s)" test $rc -ne 0 -a $took -lt 60

# A hung rank (SIGSTOP): the others' watchdog aborts the job.
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name hung --n_device_axis 2 1 1 --training_steps 100000 \
  --checkpoint_steps 1000 --set watchdog_seconds=5 --fresh > hung.log 2>&1 &
pid=$!
wait_steps runs/hung/metrics.jsonl 2
victim=$(pgrep -f "meshtrain train.*--name hung" | grep -v "^$pid$" | tail -1)
start=$(date +%s)
kill -STOP "$victim"
wait $pid
rc=$?
took=$(($(date +%s) - start))
kill -9 "$victim" 2>/dev/null
check "hung rank: watchdog names the stuck phase" grep -q "watchdog: rank .* no progress" hung.log
check "hung rank: job exits non-zero (rc $rc) within 60 s (${took} s)" test $rc -ne 0 -a $took -lt 60

# Export: one unsharded safetensors file with the model's tensors.
"$BIN" checkpoint export runs/straight/checkpoints/step_00000012 --output straight.safetensors > ex.log 2>&1
check "export writes a safetensors file" test -s straight.safetensors
out=$("$BIN" checkpoint inspect runs/straight/checkpoints/step_00000012 2>&1)
check "inspect lists the embedding" grep -q "model.embed.weight" <<<"$out"
finish
