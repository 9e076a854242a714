#!/usr/bin/env bash
# Hangs and crashes: SIGINT/SIGTERM honoured by every subcommand (generate,
# eval, prepare-data, bench, the end-of-run sample) promptly and leaving nothing
# half-written; a stuck rank named by the watchdog, in start-up too; numbers
# that would overflow or run for hours refused.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --checkpoint_steps 2 --eval_steps 1
   --set inference_config.max_tokens=0)
"$BIN" train "${T[@]}" --name base --training_steps 2 --fresh > base.log 2>&1 || bad "base run" "$(tail base.log)"

# PROGRAM... in the background; after WAIT_FOR appears in LOG, send SIG; the
# exit code and how long the process took to stop go into rc and took.
stop_with() {  # SIG LOG WAIT_FOR CMD...
  local sig="$1" log="$2" pattern="$3"
  shift 3
  "$@" > "$log" 2>&1 &
  local pid=$!
  if [ -z "$pattern" ]; then
    sleep 2
  else
    for _ in $(seq 600); do grep -q -- "$pattern" "$log" 2>/dev/null && break; sleep 0.1; done
    sleep 0.5
  fi
  local start
  start=$(date +%s.%N)
  kill "-$sig" $pid
  wait $pid
  rc=$?
  took=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$start" "$(date +%s.%N)")
}
prompt() { python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) < 10 else 1)" "$took"; }

# generate: 60000 tokens would take many minutes on this model.
stop_with INT gen.log "model:" "$BIN" generate "${T[@]}" --name base --max_tokens 60000 \
  --set inference_config.stop_at_eot=false
check "generate + SIGINT: rc 130 ($rc)" test $rc -eq 130
check "generate + SIGINT: says why" grep -q "stopped by SIGINT during sampling" gen.log
prompt && ok "generate + SIGINT: prompt (${took} s)" || bad "generate + SIGINT: took ${took} s"

# eval: 100000 validation batches.
stop_with TERM eval.log "model:" "$BIN" eval "${T[@]}" --name base --eval_steps 100000
check "eval + SIGTERM: rc 143 ($rc)" test $rc -eq 143
check "eval + SIGTERM: says why" grep -q "stopped by SIGTERM during evaluation" eval.log
prompt && ok "eval + SIGTERM: prompt (${took} s)" || bad "eval + SIGTERM: took ${took} s"

# prepare-data: a big vocabulary over every fortune file takes a while; no
# output and no temporary folder may be left.
mkdir -p bigcorpus
# Twenty copies: the streaming tokenizer gets through one in well under a second.
for i in $(seq 20); do mkdir -p bigcorpus/$i && cp /usr/share/games/fortunes/* bigcorpus/$i/ 2>/dev/null; done
stop_with INT prep.log "" "$BIN" prepare-data --input bigcorpus --output bigdata --vocab-size 20000
check "prepare-data + SIGINT: rc 130 ($rc)" test $rc -eq 130
prompt && ok "prepare-data + SIGINT: prompt (${took} s)" || bad "prepare-data + SIGINT: took ${took} s"
check "prepare-data + SIGINT: no output, no temporary folder" bash -c "! ls -d bigdata* 2>/dev/null"

# bench: 100000 timed steps.
stop_with INT bench.log "model:" "$BIN" bench --config tiny.json --name benchrun --steps 100000 --warmup 0
check "bench + SIGINT: rc 130 ($rc)" test $rc -eq 130
check "bench + SIGINT: says why" grep -q "stopped by SIGINT during bench" bench.log
prompt && ok "bench + SIGINT: prompt (${took} s)" || bad "bench + SIGINT: took ${took} s"

# The end-of-run sample: the checkpoint is saved first, the sample is dropped, exit 0.
stop_with TERM sample.log "saved checkpoint of step 3" "$BIN" train "${T[@]}" --name sample --training_steps 3 \
  --fresh --set inference_config.max_tokens=60000 --set inference_config.stop_at_eot=false
check "end-of-run sample + SIGTERM: exit 0 ($rc)" test $rc -eq 0
check "end-of-run sample + SIGTERM: says the sample was stopped" grep -q "stopped by SIGTERM during sampling" sample.log
prompt && ok "end-of-run sample + SIGTERM: prompt (${took} s)" || bad "end-of-run sample: took ${took} s"
check "end-of-run sample + SIGTERM: step 3 is saved" test -d runs/sample/checkpoints/step_00000003

# A stuck rank: rank 1 stops before step 3; the watchdog names it.
MESHTRAIN_TEST_STALL_AT_STEP=3 MESHTRAIN_TEST_STALL_RANKS=1 timeout 120 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" \
  --name stuck --n_device_axis 2 1 1 --training_steps 100 --checkpoint_steps 1000 --set watchdog_seconds=8 --fresh \
  > stuck.log 2>&1
rc=$?
check "stuck rank: job ends non-zero, not by the test's timeout (rc $rc)" test $rc -ne 0 -a $rc -ne 124
check "stuck rank: the watchdog names rank 1 and its phase" grep -q "stuck: rank 1 (stopped in 'train step 2')" stuck.log

# Numbers that do not fit, or that would run for hours.
"$BIN" train "${T[@]}" --name wd --set watchdog_seconds=1e10 > wd.log 2>&1
rc=$?
check "watchdog_seconds=1e10: refused naming the key (rc $rc)" bash -c "test $rc -ne 0 && test $rc -lt 128 && grep -q watchdog_seconds wd.log"
"$BIN" train "${T[@]}" --name big --training_steps 99999999999999999999 > big.log 2>&1
rc=$?
check "--training_steps 99999999999999999999: refused naming the flag (rc $rc)" \
  bash -c "test $rc -ne 0 && grep -q -- '--training_steps' big.log && grep -q 'does not fit' big.log"
"$BIN" generate "${T[@]}" --name base --set inference_config.max_tokens=1e9 > mt.log 2>&1
rc=$?
check "max_tokens=1e9: refused naming the key (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'inference_config.max_tokens' mt.log"
"$BIN" generate "${T[@]}" --name base --max_tokens 1000000000 > mt2.log 2>&1
rc=$?
check "--max_tokens 1000000000: refused (rc $rc)" bash -c "test $rc -ne 0 && grep -q 'max_tokens' mt2.log"

finish
