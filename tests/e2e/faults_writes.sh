#!/usr/bin/env bash
# Writes that could destroy what meshtrain did not make (issue 28, classes 1
# and 3): prepare-data into its own inputs, a user's folder, a checkpoint or a
# dataset; checkpoint export over the checkpoint it reads, a user's file or a
# folder; leftovers of killed runs; run names that escape output_dir; a run
# pointed at a checkpoint no resume reads (a staging folder, which its next
# save would remove, or one set aside as *.superseded / *.unreadable); a
# `latest` in the way of every save (issue 47). Every refusal is non-zero,
# names the path and leaves every byte as it was.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1
   --set inference_config.max_tokens=0)
tree_sum() { find "$1" -print0 | sort -z | xargs -0 -I{} sh -c 'if [ -f "{}" ]; then sha1sum "{}"; else echo "{}"; fi' | sha1sum; }
# refused NAME LOG PATTERN CMD...: CMD exits 1..127 and LOG matches PATTERN.
refused() {
  local name="$1" log="$2" pattern="$3"
  shift 3
  timeout 60 "$@" > "$log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$pattern" "$log"; then ok "$name"; else bad "$name (rc $rc)" "$(cat "$log")"; fi
}
# A pid that is surely no live process: one that just exited.
dead_pid() { sh -c 'echo $$'; }
P=(prepare-data --vocab-size 300)

"$BIN" train "${T[@]}" --name base --training_steps 2 --checkpoint_steps 2 --fresh > base.log 2>&1 \
  || bad "base run" "$(tail base.log)"
CK=runs/base/checkpoints/step_00000002

# --- prepare-data never writes into its own inputs.
cp -r corpus in1
sum=$(tree_sum in1)
refused "prepare-data: --output = its --input folder: refused" same.log "is the same as the --input" \
  "$BIN" "${P[@]}" --input in1 --output in1
refused "prepare-data: --output inside its --input: refused" inside.log "inside the --input" \
  "$BIN" "${P[@]}" --input in1 --output in1/out
mkdir -p wrap && cp -r corpus wrap/texts
wsum=$(tree_sum wrap)
refused "prepare-data: --output containing its --input: refused" contains.log "contains the --input" \
  "$BIN" "${P[@]}" --input wrap/texts --output wrap
refused "prepare-data: --output containing an input file: refused" contains2.log "contains the --input" \
  "$BIN" "${P[@]}" --input wrap/texts/computers --output wrap
ln -s in1 link1
refused "prepare-data: --output a link to its --input: refused" link.log "--input" \
  "$BIN" "${P[@]}" --input in1 --output link1
check "inputs untouched by the refused runs" test "$(tree_sum in1)" = "$sum" -a "$(tree_sum wrap)" = "$wsum"
# An earlier output that now holds the inputs (the user put them there).
"$BIN" "${P[@]}" --input corpus --output ds1 > ds1.log 2>&1 || bad "ds1" "$(cat ds1.log)"
cp -r corpus ds1/texts
dsum=$(tree_sum ds1)
refused "prepare-data: an earlier output holding the --input: refused" ds1b.log "contains the --input" \
  "$BIN" "${P[@]}" --input ds1/texts --output ds1
check "the earlier output and the inputs in it: untouched" test "$(tree_sum ds1)" = "$dsum"

# --- Folders prepare-data did not make are never replaced.
mkdir user && echo '{"project": "mine"}' > user/manifest.json && echo "my notes" > user/notes.txt
usum=$(tree_sum user)
refused "prepare-data: a user's folder with a foreign manifest.json: refused" user.log "not prepare-data's" \
  "$BIN" "${P[@]}" --input corpus --output user
check "the user's folder: untouched" test "$(tree_sum user)" = "$usum"
csum=$(tree_sum runs/base)
refused "prepare-data: a checkpoint step folder: refused" ck.log "meshtrain checkpoint" \
  "$BIN" "${P[@]}" --input corpus --output $CK
refused "prepare-data: a folder inside a checkpoint: refused" ck2.log "is inside" \
  "$BIN" "${P[@]}" --input corpus --output $CK/more
check "the run and its checkpoint: untouched" test "$(tree_sum runs/base)" = "$csum"
dsum=$(tree_sum data)
refused "prepare-data: a folder inside a dataset (data/train): refused" inds.log "meshtrain dataset" \
  "$BIN" "${P[@]}" --input corpus --output data/train
check "the dataset: untouched" test "$(tree_sum data)" = "$dsum"
cp -r data ds2 && echo "keep me" > ds2/README.txt && echo x > ds2/train/stray.bin
d2sum=$(tree_sum ds2)
refused "prepare-data: an earlier output with a user's file in it: refused naming the file" ds2.log "README.txt" \
  "$BIN" "${P[@]}" --input corpus --output ds2
rm ds2/README.txt
refused "prepare-data: an earlier output with a stray shard: refused naming it" ds2b.log "stray.bin" \
  "$BIN" "${P[@]}" --input corpus --output ds2
check "the earlier outputs with foreign files: untouched" test -f ds2/train/stray.bin
echo "text" > plainfile
refused "prepare-data: --output an existing file: refused" file.log "not a folder" \
  "$BIN" "${P[@]}" --input corpus --output plainfile
cp -r data ds3
"$BIN" "${P[@]}" --input corpus --output ds3 --seed 5 > ds3.log 2>&1
check "prepare-data: an earlier output of its own is still replaced" grep -q '"seed": 5' ds3/manifest.json

# --- Leftovers of killed prepare-data runs are named and removed by the next run.
dp=$(dead_pid) dp2=$(dead_pid)
mkdir -p "ds4.tmp-$dp/train" "ds4.tmp-$$/train" "ds4.tmp-$dp2"
echo '{}' > "ds4.tmp-$dp/tokenizer.json"; echo x > "ds4.tmp-$dp/train/train_000000.bin"
echo x > "ds4.tmp-$$/tokenizer.json"          # a live pid (this script): another run's
echo "mine" > "ds4.tmp-$dp2/notes.txt"  # not prepare-data's staging
"$BIN" "${P[@]}" --input corpus --output ds4 > ds4.log 2>&1
check "prepare-data after a killed run: succeeds (rc $?)" test -f ds4/manifest.json
check "the dead run's leftover: removed and named" bash -c "test ! -e ds4.tmp-$dp && grep -q 'removed .*ds4.tmp-$dp' ds4.log"
check "a live run's staging: kept" test -f "ds4.tmp-$$/tokenizer.json"
check "a folder that is not prepare-data's staging: kept" test -f "ds4.tmp-$dp2/notes.txt"
# A real kill -9 in the middle of a run (a corpus large enough to catch it).
mkdir big && for i in 1 2 3 4 5 6; do for f in corpus/*; do cp "$f" "big/$(basename "$f").$i"; done; done
"$BIN" prepare-data --input big --output ds5 --vocab-size 300 --workers 1 --shard-tokens 2000 > ds5a.log 2>&1 &
pid=$!
for _ in $(seq 400); do ls -d ds5.tmp-* > /dev/null 2>&1 && break; sleep 0.02; done
kill -9 $pid; wait $pid 2> /dev/null
if ls -d ds5.tmp-* > /dev/null 2>&1; then
  "$BIN" "${P[@]}" --input corpus --output ds5 > ds5b.log 2>&1
  check "kill -9 mid prepare-data: the next run removes its OUT.tmp-PID and names it" \
    bash -c "! ls -d ds5.tmp-* 2>/dev/null && grep -q 'removed .*ds5.tmp-$pid' ds5b.log && test -f ds5/manifest.json"
else
  echo "note - the killed prepare-data finished before the kill: its leftover case is covered above"
fi

# --- checkpoint export writes nowhere near what it reads, nor over a user's file.
csum=$(tree_sum runs/base)
refused "export --output a shard of the checkpoint: refused" ex1.log "inside the checkpoint" \
  "$BIN" checkpoint export $CK --output $CK/rank_00000.safetensors
refused "export --output the checkpoint's manifest: refused" ex2.log "inside the checkpoint" \
  "$BIN" checkpoint export $CK --output $CK/manifest.json
refused "export --output the checkpoint folder: refused" ex3.log "is the checkpoint folder" \
  "$BIN" checkpoint export $CK --output $CK
check "export into the checkpoint folder: no raw 'Is a directory'" bash -c "! grep -q 'Is a directory' ex3.log"
refused "export --format hf --output inside the checkpoint: refused" ex4.log "inside the checkpoint" \
  "$BIN" checkpoint export $CK --format hf --output $CK/hf
refused "export --output the run's checkpoints folder (contains it): refused" ex5.log "contains the checkpoint" \
  "$BIN" checkpoint export $CK --output runs/base/checkpoints
check "the checkpoint after the refused exports: byte for byte the same" test "$(tree_sum runs/base)" = "$csum"
check "no stray *.tmp anywhere" bash -c "! find . -name '*.tmp*' -not -path './ds4.tmp-*' | grep -q ."
dsum=$(tree_sum data)
refused "export --output inside a dataset: refused" ex6.log "meshtrain dataset" \
  "$BIN" checkpoint export $CK --output data/model.safetensors
refused "export --format hf --output inside the dataset it reads the tokenizer from: refused" ex7.log "meshtrain dataset" \
  "$BIN" checkpoint export $CK --format hf --output data/hf
check "the dataset: untouched" test "$(tree_sum data)" = "$dsum"
echo "my notes" > notes.txt
refused "export --output a user's file: refused" ex8.log "not an earlier meshtrain export" \
  "$BIN" checkpoint export $CK --output notes.txt
check "the user's file: untouched" grep -q "my notes" notes.txt
mkdir outdir
refused "export --output a folder: refused, naming a file to give" ex9.log "is a folder" \
  "$BIN" checkpoint export $CK --output outdir
"$BIN" checkpoint export $CK --output model.safetensors > ex10.log 2>&1
check "export: writes (rc $?)" test -f model.safetensors
"$BIN" checkpoint export $CK --output model.safetensors > ex11.log 2>&1
check "export over its own earlier export: replaced (rc $?)" test $? -eq 0
dp=$(dead_pid) dp2=$(dead_pid)
cp model.safetensors "model.safetensors.tmp-$dp"
cp model.safetensors "model.safetensors.tmp"  # an older build's staging name
echo "mine" > "model.safetensors.tmp-$dp2"
"$BIN" checkpoint export $CK --output model.safetensors > ex12.log 2>&1
check "export after a killed export: its leftovers removed and named" \
  bash -c "test ! -e model.safetensors.tmp-$dp -a ! -e model.safetensors.tmp && grep -q 'removed .*model.safetensors.tmp-$dp' ex12.log"
check "a file that is not an export's staging: kept" test -f "model.safetensors.tmp-$dp2"

# --- Run names are one folder inside output_dir.
for n in '../../escaped' '..' '.' "$PWD/abs" 'a/b' 'x/..'; do
  refused "--name '$n': refused naming the key" "name.log" "name (--name) must be a single folder name" \
    "$BIN" train "${T[@]}" --name "$n" --training_steps 1
done
refused "--set name=../x: refused" name2.log "name (--name)" "$BIN" train "${T[@]}" --set 'name=../x' --training_steps 1
python3 -c "
import json; c=json.load(open('tiny.json')); c['name']='../../x'; json.dump(c, open('badname.json','w'))"
refused "\"name\": \"../../x\" in the file: refused" name3.log "name (--name)" "$BIN" eval --config badname.json
check "no run dir was made outside output_dir, nor output_dir made a run dir" bash -c \
  "test ! -e ../escaped -a ! -e metrics.jsonl -a ! -e checkpoints -a ! -e runs/metrics.jsonl -a ! -e runs/checkpoints \
   -a ! -e runs/a -a ! -e runs/x -a ! -e x -a ! -e abs"
"$BIN" train "${T[@]}" --name 'ok name.v2' --training_steps 1 --fresh > okname.log 2>&1
check "a plain name with a space and dots: trains" test -d 'runs/ok name.v2/checkpoints'

# --- A run is never pointed at a checkpoint no resume reads: a staging folder
# (its next save removed it as a leftover), or one set aside.
cp -r runs/base runs/pointed
R=runs/pointed/checkpoints
cp -r $R/step_00000002 $R/step_00000003.tmp-99999  # a killed save's leftover, manifest and all
cp -r $R/step_00000002 $R/step_00000004.superseded
cp -r $R/step_00000002 $R/step_00000005.unreadable
psum=$(tree_sum runs/pointed)
refused "train --checkpoint a staging folder: refused naming it" stg.log \
  "checkpoint $R/step_00000003.tmp-99999: it is a staging folder" \
  "$BIN" train "${T[@]}" --name pointed --training_steps 6 --checkpoint_steps 2 --checkpoint $R/step_00000003.tmp-99999
refused "train --checkpoint a *.superseded checkpoint: refused naming it" sup.log "set aside as superseded" \
  "$BIN" train "${T[@]}" --name pointed --training_steps 6 --checkpoint_steps 2 --checkpoint $R/step_00000004.superseded
refused "eval --checkpoint a *.unreadable checkpoint: refused naming it" unr.log "set aside as unreadable" \
  "$BIN" eval "${T[@]}" --name pointed --checkpoint $R/step_00000005.unreadable
check "the refused runs trained nothing and touched no byte" test "$(tree_sum runs/pointed)" = "$psum"
"$BIN" train "${T[@]}" --name pointed --training_steps 4 --checkpoint_steps 2 > pointed.log 2>&1
check "the run resumes from its newest real checkpoint (step 2) and goes on ($?)" \
  bash -c "grep -q 'resumed from $R/step_00000002' pointed.log && test -d $R/step_00000004"

# --- `latest` in the way of every save: refused at start-up, not after training.
cp -r runs/base runs/latestdir
rm runs/latestdir/checkpoints/latest && mkdir -p runs/latestdir/checkpoints/latest/keep
echo mine > runs/latestdir/checkpoints/latest/keep/notes
lsum=$(tree_sum runs/latestdir/checkpoints)
refused "checkpoints/latest a folder: refused at start-up naming it" latest.log \
  "checkpoint pointer runs/latestdir/checkpoints/latest is a directory" \
  "$BIN" train "${T[@]}" --name latestdir --training_steps 4 --checkpoint_steps 2
check "... before any step, the checkpoints as they were" \
  bash -c "test '$(tree_sum runs/latestdir/checkpoints)' = '$lsum' && ! grep -q 'Step 3,' latest.log"

finish
