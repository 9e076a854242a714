#!/usr/bin/env bash
# What a newcomer meets in the first hour, as they would meet it:
# - prepare-data on a folder where most inputs are skipped prints one line per
#   reason (with the count and where the full list is), not one per file;
# - a sample ends at end-of-text unless inference_config.stop_at_eot is false,
#   and `generate` prints it once;
# - train --checkpoint DIR resumes from exactly that checkpoint and refuses a
#   folder that is not one;
# - metrics.jsonl keeps one row per step after a failed run is resumed, after a
#   resume from further back, and --fresh sets the old file aside.
source "$(dirname "$0")/common.sh" "$@"

# --- prepare-data: 3 fortune files among 56 inputs it skips for 4 reasons.
mkdir -p corpus
for f in computers cookie definitions; do
  cp "/usr/share/games/fortunes/$f" "/usr/share/games/fortunes/$f.dat" corpus/
  ln -s "$f" "corpus/$f.u8"
done
for i in $(seq 40); do printf 'a,b\n1,2\n' > "corpus/table$i.csv"; done
for i in $(seq 10); do : > "corpus/empty$i.txt"; done
"$BIN" prepare-data --input corpus --output data --vocab-size 320 > prep.log 2>&1
check "prepare-data exits 0" test $? -eq 0
lines=$(wc -l < prep.log)
check "prepare-data prints 5 lines for 56 skipped inputs ($lines)" test "$lines" -eq 5
check "one line per reason with its count: .dat" grep -q "skipped 3 inputs: fortune index file (.dat)" prep.log
check "one line per reason with its count: links" grep -q "skipped 3 inputs: duplicate of another input" prep.log
check "one line per reason with its count: CSV" grep -q "skipped 40 inputs: CSV" prep.log
check "one line per reason with its count: empty" grep -q "skipped 10 inputs: empty" prep.log
check "the summary names manifest.json as the list" grep -q "all listed in .*data/manifest.json" prep.log
listed=$(python3 -c "import json; print(len(json.load(open('data/manifest.json'))['skipped']))")
check "manifest.json lists all 56 skipped inputs ($listed)" test "$listed" -eq 56
"$BIN" prepare-data --input corpus --output data-v --vocab-size 320 -v > prep-v.log 2>&1
check "-v prints every skipped input" test "$(grep -c 'skipped corpus/' prep-v.log)" -eq 56
check "nothing says ERROR" bash -c "! grep -qi error prep.log prep-v.log"

mv data data-many
"$BIN" prepare-data --input corpus/computers corpus/cookie corpus/definitions --output data --vocab-size 320 \
  > /dev/null 2>&1
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=3 --set lr.end_steps=40 --checkpoint_steps 4 --eval_steps 1)

# --- Sampling stops at end-of-text. 1000 tokens at temperature 1 from a model
# that has seen a document end every ~60 tokens: end-of-text comes (it is
# drawn with p ~ 1/60 per token; the seed makes the draw the same every time).
"$BIN" train "${T[@]}" --name eot --training_steps 40 --set inference_config.max_tokens=0 --fresh > eot.log 2>&1 ||
  bad "train for the sampling test" "$(cat eot.log)"
G=(generate "${T[@]}" --name eot --prompt "The computer" --max_tokens 1000 --temperature 1 --top_k 0)
"$BIN" "${G[@]}" --set inference_config.stop_at_eot=false > full.txt 2> full.err
"$BIN" "${G[@]}" > stopped.txt 2> stopped.err
check "stop_at_eot false: the sample runs on past <|endoftext|>" grep -q "<|endoftext|>" full.txt
check "default: the sample is the text before the first <|endoftext|>" python3 - <<'PY'
import sys
full, stopped = open("full.txt").read(), open("stopped.txt").read()
head = full.split("<|endoftext|>")[0]
sys.exit(0 if "<|endoftext|>" in full and stopped.rstrip("\n") == head.rstrip("\n") and stopped.startswith("The computer") else 1)
PY
check "generate prints the sample once (stdout), not again in the log" bash -c "! grep -q 'sample:' stopped.err"

# --- One row per step: a run that fails at step 7 (NaN, nan_policy stop) after
# logging steps 1-6 and saving step 4, then resumed to 12.
rows_once() {  # FILE LAST: exactly one training row for each step 1..LAST, none after
  python3 - "$1" "$2" <<'PY'
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"loss"' in l]
sys.exit(0 if steps == list(range(1, int(sys.argv[2]) + 1)) else 1)
PY
}
MESHTRAIN_TEST_NAN_AT_STEP=7 "$BIN" train "${T[@]}" --name rows --training_steps 12 --set nan_policy=stop \
  --fresh > rows1.log 2>&1
check "the failing run stops at step 7 with 6 rows logged" rows_once runs/rows/metrics.jsonl 6
"$BIN" train "${T[@]}" --name rows --training_steps 12 > rows2.log 2>&1
check "resumed from step 4" grep -q "resumed from .*step_00000004" rows2.log
check "after the resume: one row per step 1..12" rows_once runs/rows/metrics.jsonl 12
check "the log says which rows were dropped" grep -q "dropped 2 row(s) after step 4" rows2.log

# --- train --checkpoint: back to step 8 of 12, train to 10. Steps 9 and 10
# equal the first run's (exact resume); rows 11, 12 are gone; step 12 is set aside.
loss_at() { python3 -c "
import json,sys
print([json.loads(l)['loss'] for l in open(sys.argv[1]) if '\"loss\"' in l and json.loads(l)['step']==int(sys.argv[2])])" "$1" "$2"; }
before="$(loss_at runs/rows/metrics.jsonl 9) $(loss_at runs/rows/metrics.jsonl 10)"
"$BIN" train "${T[@]}" --name rows --training_steps 10 --checkpoint runs/rows/checkpoints/step_00000008 > ck.log 2>&1
check "train --checkpoint exits 0" test $? -eq 0
check "train --checkpoint resumed from that checkpoint" grep -q "resumed from runs/rows/checkpoints/step_00000008 (step 8)" ck.log
after="$(loss_at runs/rows/metrics.jsonl 9) $(loss_at runs/rows/metrics.jsonl 10)"
check "steps 9-10 from step 8 equal the first run's ($after)" test "$before" = "$after"
check "after --checkpoint: one row per step 1..10" rows_once runs/rows/metrics.jsonl 10
check "the newer checkpoint is set aside" test -d runs/rows/checkpoints/step_00000012.superseded
expect_error() {  # NAME PATTERN CMD...
  local name="$1" pat="$2" out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$pat" <<<"$out"; then ok "$name"; else bad "$name (rc $rc)" "$out"; fi
}
expect_error "--checkpoint on the run's checkpoints folder: names the newest" \
  "is not a checkpoint .*did you mean runs/rows/checkpoints/step_00000010" \
  "$BIN" train "${T[@]}" --name rows --training_steps 10 --checkpoint runs/rows/checkpoints
expect_error "--checkpoint that does not exist" "nowhere" \
  "$BIN" train "${T[@]}" --name rows --checkpoint nowhere
expect_error "--checkpoint with --fresh" "excludes" \
  "$BIN" train "${T[@]}" --name rows --fresh --checkpoint runs/rows/checkpoints/step_00000008
expect_error "--checkpoint of another model: the changed key named" "model_config.model_dimension" \
  "$BIN" train "${T[@]}" --name rows --set model_config.model_dimension=32 --checkpoint runs/rows/checkpoints/step_00000008

# --- --fresh: the old file is set aside, the new one holds only the new run.
"$BIN" train "${T[@]}" --name rows --training_steps 3 --fresh > fresh.log 2>&1
check "--fresh: one row per step 1..3" rows_once runs/rows/metrics.jsonl 3
check "--fresh: the earlier rows kept as metrics.jsonl.superseded" rows_once runs/rows/metrics.jsonl.superseded 10
tb_aside() { compgen -G "runs/rows/tb.superseded/events.*" > /dev/null; }
check "--fresh: the earlier TensorBoard files kept in tb.superseded" tb_aside
finish
