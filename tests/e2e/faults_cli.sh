#!/usr/bin/env bash
# Unclear or silent errors: nan_policy skip that never gives up, cross-checks
# that fail late, negative or empty CLI values, path flags parsed as JSON,
# JSON errors without context, messages cut at a NUL, eval/generate on random
# weights. Every refusal is non-zero, names the key or flag, writes nothing.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --checkpoint_steps 2 --eval_steps 1
   --set inference_config.max_tokens=0)
# refused NAME LOG PATTERN CMD...: CMD exits 1..127 and LOG matches PATTERN.
refused() {
  local name="$1" log="$2" pattern="$3"
  shift 3
  "$@" > "$log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 128 ] && grep -q -- "$pattern" "$log"; then ok "$name"; else bad "$name (rc $rc)" "$(cat "$log")"; fi
}

# nan_policy skip gives up after max_nan_skips in a row; step numbers match the log.
MESHTRAIN_TEST_NAN_AT_STEP=2-100 "$BIN" train "${T[@]}" --name nan --training_steps 20 --set max_nan_skips=3 \
  --fresh > nan.log 2>&1
rc=$?
check "nan skip: gives up non-zero (rc $rc)" test $rc -ne 0 -a $rc -lt 128
check "nan skip: names steps 2 to 4 and max_nan_skips" grep -q "steps 2 to 4 (3 in a row, max_nan_skips)" nan.log
check "nan skip: the skipped step's number is the logged one" grep -q "step 2: non-finite loss" nan.log
check "nan skip: step 1 was logged as step 1" grep -q '"step":1,' runs/nan/metrics.jsonl

# Cross-checks before any work: nothing is created.
refused "val_batch_size not a multiple of micro_batch_size: refused at once" vb.log "data_config.val_batch_size" \
  "$BIN" train "${T[@]}" --name vb --set data_config.val_batch_size=6 --fresh
check "val_batch_size: no run dir created" test ! -e runs/vb

# CLI values.
refused "--training_steps -5" neg1.log "--training_steps" "$BIN" train "${T[@]}" --name x --training_steps -5
refused "--top_k -7" neg2.log "--top_k" "$BIN" generate "${T[@]}" --top_k -7 --random_weights
refused "--temperature -0.5" neg3.log "--temperature" "$BIN" generate "${T[@]}" --temperature -0.5 --random_weights
refused "--device-memory-gb -5" neg4.log "--device-memory-gb" "$BIN" plan "${T[@]}" --device-memory-gb -5
refused "--name ''" empty1.log "--name" "$BIN" train "${T[@]}" --name ""
refused "--output_dir ''" empty2.log "--output_dir" "$BIN" train "${T[@]}" --output_dir ""
refused "--eval_steps x" nonint.log "--eval_steps" "$BIN" train "${T[@]}" --eval_steps x
check "nothing was created by the refused runs" test ! -e runs/x

# Path flags are taken literally, not parsed as JSON.
"$BIN" train "${T[@]}" --name 'lit\nname"q' --training_steps 1 --fresh > lit.log 2>&1
check "--name with a backslash and a quote: the run dir has exactly that name" test -d 'runs/lit\nname"q'
refused "a control character in name (from a JSON escape): refused" ctl.log "name must not contain control" \
  "$BIN" train "${T[@]}" --set 'name="a\nb"'

# JSON errors with file and key; messages not cut at a NUL.
python3 - <<'PY'
import json
c = json.load(open("tiny.json"))
text = json.dumps(c).replace('"max_lr": 0.003', '"max_lr": 1e400')
open("overflow.json", "w").write(text)
c["name"] = "a\u0000b"
json.dump(c, open("nul.json", "w"))
del c["name"]
c["model_config"]["x\u0000y"] = 1
json.dump(c, open("nulkey.json", "w"))
PY
refused "1e400: names the file and the key" ovf.log "overflow.json': config key 'lr.max_lr'" \
  "$BIN" train --config overflow.json
refused "a NUL in a value: the message goes past it" nul.log 'a\\0b' "$BIN" train --config nul.json --fresh
check "a NUL in a value: the key is named" grep -q "name must not contain control characters: byte 0x00" nul.log
refused "a NUL in a key: the message goes past it" nulkey.log "model_config.x\\\\0y" "$BIN" train --config nulkey.json

# eval/generate with no checkpoint: refused unless --random_weights.
refused "eval with no checkpoint: refused" ev.log "no checkpoint" "$BIN" eval "${T[@]}" --name nothing
refused "generate with no checkpoint: refused" gn.log "--random_weights" "$BIN" generate "${T[@]}" --name nothing
"$BIN" generate "${T[@]}" --name nothing --random_weights --max_tokens 2 > gn2.log 2>&1
check "generate --random_weights: runs (rc $?)" test $? -eq 0
# Speculative sampling (temperature > 0) through generate's sample path: it
# samples and logs the drafts accepted.
"$BIN" generate "${T[@]}" --name nothing --random_weights --max_tokens 8 --temperature 1 \
  --set model_config.mtp_depth=2 --set inference_config.speculative=true > gspec.log 2>&1
check "generate, speculative at temperature 1: runs (rc $?)" test $? -eq 0
check "generate, speculative at temperature 1: logs the drafts accepted" \
  grep -q "speculative decoding: [0-9]* of [0-9]* drafts accepted" gspec.log
check "eval/generate created no run dir" test ! -e runs/nothing

finish
