#!/usr/bin/env bash
# Faults that would lose data, as an operator hits them: a changed model on
# resume, every checkpoint unreadable, an incomplete manifest, a stale
# `latest`, corrupt checkpoints given to export/inspect, two runs in one run
# dir, a half-written metrics.jsonl line, a full disk, a file-size limit
# (`ulimit -f`: SIGXFSZ killed train with no message, issue 47), inputs
# prepare-data cannot read (a link loop, no permission) and --workers 5000.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --checkpoint_steps 2 --eval_steps 1
   --set inference_config.max_tokens=0)
tree_sum() { find "$1" -type f -print0 | sort -z | xargs -0 sha1sum | sha1sum; }
py() { python3 -c "$@"; }

"$BIN" train "${T[@]}" --name base --training_steps 4 --fresh > base.log 2>&1 || bad "base run" "$(tail base.log)"

# --- A changed model on resume is refused, naming each key and both values.
cp -r runs/base runs/shape
before=$(tree_sum runs/shape/checkpoints)
"$BIN" train "${T[@]}" --name shape --training_steps 6 --set model_config.n_head=2 --set model_config.blocks=1 \
  > shape.log 2>&1
rc=$?
check "changed model: refused (rc $rc)" test $rc -ne 0
check "changed model: names n_head and both values" grep -q "model_config.n_head: 4 in the checkpoint, 2 now" shape.log
check "changed model: names blocks (fewer layers)" grep -q "model_config.blocks: 2 in the checkpoint, 1 now" shape.log
check "changed model: checkpoints untouched" test "$(tree_sum runs/shape/checkpoints)" = "$before"
"$BIN" train "${T[@]}" --name shape --training_steps 6 --set lr.max_lr=0.001 --seed 7 > shape2.log 2>&1
check "resumable key (lr) and a warned one (seed): resumes" test $? -eq 0
check "the non-resumable, non-model key is warned about" grep -q "changed config key: seed" shape2.log
check "the resumable key is not warned about" bash -c "! grep -q 'changed config key: lr' shape2.log"

# --- Every checkpoint unreadable: refuse (unless --fresh), never delete or overwrite.
cp -r runs/base runs/allbad
for f in runs/allbad/checkpoints/step_*/rank_00000.safetensors; do
  py "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-3]^=0xff; open(p,'wb').write(b)" "$f"
done
before=$(tree_sum runs/allbad/checkpoints)
"$BIN" train "${T[@]}" --name allbad --training_steps 6 > allbad.log 2>&1
rc=$?
check "all checkpoints unreadable: refused (rc $rc)" test $rc -ne 0
check "all checkpoints unreadable: says --fresh and names them" \
  bash -c "grep -q -- '--fresh' allbad.log && grep -q step_00000004 allbad.log && grep -q step_00000002 allbad.log"
check "all checkpoints unreadable: nothing changed" test "$(tree_sum runs/allbad/checkpoints)" = "$before"
"$BIN" train "${T[@]}" --name allbad --training_steps 4 --set max_to_keep=1 --fresh > allbad2.log 2>&1
check "--fresh over unreadable checkpoints: trains (rc $?)" grep -q "saved checkpoint of step 4" allbad2.log
check "--fresh: the unreadable checkpoints are kept (set aside, not overwritten nor pruned)" \
  bash -c "test -d runs/allbad/checkpoints/step_00000002.unreadable && test -d runs/allbad/checkpoints/step_00000004.unreadable"
"$BIN" checkpoint inspect runs/allbad/checkpoints/step_00000004 > allbad-inspect.log 2>&1
check "--fresh: the new step 4 is a readable checkpoint" test $? -eq 0

# --- An incomplete manifest (optimizer entries gone) is skipped for the previous checkpoint.
cp -r runs/base runs/partial
py "
import json,sys
p='runs/partial/checkpoints/step_00000004/manifest.json'
m=json.load(open(p))
m['tensors']={k:v for k,v in m['tensors'].items() if not k.startswith('optim.')}
json.dump(m,open(p,'w'))"
"$BIN" train "${T[@]}" --name partial --training_steps 6 > partial.log 2>&1
check "incomplete manifest: resumes (rc $?)" grep -q "resumed from .*step_00000002" partial.log
check "incomplete manifest: warns naming the missing optimizer tensor" grep -q "incomplete: it has no tensor 'optim" partial.log

# --- `latest` lagging behind (a crash between rename and update): the newest complete step wins.
cp -r runs/base runs/stale
echo step_00000002 > runs/stale/checkpoints/latest
"$BIN" train "${T[@]}" --name stale --training_steps 6 > stale.log 2>&1
check "stale latest: resumes from the newest step" grep -q "resumed from .*step_00000004" stale.log

# --- export and inspect verify checksums.
cp -r runs/base runs/corrupt
f=runs/corrupt/checkpoints/step_00000004/rank_00000.safetensors
py "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-3]^=0xff; open(p,'wb').write(b)" "$f"
"$BIN" checkpoint export runs/corrupt/checkpoints/step_00000004 --output out.safetensors > ex.log 2>&1
rc=$?
check "export of a corrupt checkpoint: refused naming the file (rc $rc)" \
  bash -c "test $rc -ne 0 && grep -q 'rank_00000.safetensors is corrupt' ex.log"
check "export of a corrupt checkpoint: no output file" bash -c "! ls out.safetensors* 2>/dev/null"
"$BIN" checkpoint inspect runs/corrupt/checkpoints/step_00000004 > in.log 2>&1
rc=$?
check "inspect of a corrupt checkpoint: refused (rc $rc)" bash -c "test $rc -ne 0 && grep -q checksum in.log"

# --- Two runs in one run dir: the second is refused, naming the holder.
"$BIN" train "${T[@]}" --name shared --training_steps 100000 --checkpoint_steps 1000 --fresh > shared1.log 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q '"loss"' runs/shared/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
"$BIN" train "${T[@]}" --name shared --training_steps 100000 --checkpoint_steps 1000 > shared2.log 2>&1
rc=$?
kill -TERM $pid; wait $pid
check "second run in a locked run dir: refused (rc $rc)" test $rc -ne 0
check "second run: names the holder's host and pid" grep -q "in use by another run (host .*, pid $pid)" shared2.log
check "first run: unharmed, saved on SIGTERM" grep -q "saved, exiting" shared1.log

# --- A half-written metrics.jsonl line is cut before appending.
cp -r runs/base runs/metrics
printf '{"step": 5, "loss": 3.1' >> runs/metrics/metrics.jsonl
"$BIN" train "${T[@]}" --name metrics --training_steps 6 > metrics.log 2>&1
check "partial metrics line: run goes on (rc $?)" grep -q "partial last line" metrics.log
check "metrics.jsonl: every line is JSON" py "
import json
for l in open('runs/metrics/metrics.jsonl'): json.loads(l)"

# --- A full disk (a small tmpfs, where this machine lets us mount one).
mkdir -p small
if mount -t tmpfs -o size=4m tmpfs small 2>/dev/null; then
  "$BIN" train "${T[@]}" --set output_dir=small/runs --name full --training_steps 30 --fresh > full.log 2>&1
  rc=$?
  check "full disk: the run fails (rc $rc) with a message" bash -c "test $rc -ne 0 && grep -qiE 'space|disk|write' full.log"
  ok_dirs=1
  for d in small/runs/full/checkpoints/step_*; do
    [ -d "$d" ] || continue
    "$BIN" checkpoint inspect "$d" > /dev/null 2>&1 || ok_dirs=0
  done
  check "full disk: every checkpoint left under a final name verifies" test $ok_dirs -eq 1
  umount small
else
  echo "note - full disk case not run: this machine does not allow mounting a tmpfs (needs root and CAP_SYS_ADMIN)"
fi

# --- A file-size limit below a checkpoint's size (ulimit -f, set by batch
# systems): an error naming the file and the limit, like a full disk; it was
# a death by SIGXFSZ (rc 153) with no message.
# A limit below the checkpoint's tensors is refused before anything runs;
# one a few KB short of its file (the tensors fit, not the safetensors
# header beside them) fails at the write, naming the file and the limit.
# Output goes through a pipe: a log file would be cut at the limit too.
ck_bytes=$(stat -c %s runs/base/checkpoints/step_00000004/rank_00000.safetensors)
limit_kb=$((ck_bytes / 2048))
(ulimit -f "$limit_kb"; exec "$BIN" train "${T[@]}" --name fsize --training_steps 2 --fresh) 2>&1 | cat > fsize.log
rc=${PIPESTATUS[0]}
check "file-size limit below a checkpoint: refused before training (rc $rc)" \
  bash -c "test $rc -eq 1 && grep -q 'above the file-size limit (ulimit -f) of $((limit_kb * 1024)) bytes' fsize.log"
check "... nothing trained, nothing saved" bash -c "! grep -q 'Step 1,' fsize.log && test ! -e runs/fsize/checkpoints"
# (MPI's own start-up files need ~4 MB: a model whose checkpoint is larger.)
W=(--set model_config.model_dimension=128)
"$BIN" train "${T[@]}" "${W[@]}" --name wide --training_steps 2 --fresh > wide.log 2>&1 || bad "wide run" "$(tail wide.log)"
wide_bytes=$(stat -c %s runs/wide/checkpoints/step_00000002/rank_00000.safetensors)
limit_kb=$(((wide_bytes - 6000) / 1024))
(ulimit -f "$limit_kb"; exec "$BIN" train "${T[@]}" "${W[@]}" --name fsize3 --training_steps 2 --fresh) 2>&1 |
  cat > fsize3.log
rc=${PIPESTATUS[0]}
check "a write past the file-size limit: exit 1, not a death by SIGXFSZ (rc $rc)" test $rc -eq 1
check "... leaving no checkpoint nor staging folder" bash -c "! ls -d runs/fsize3/checkpoints/step_* 2>/dev/null"
check "... naming the file and the limit" \
  grep -q "cannot write .*: File too large (the file-size limit, ulimit -f, is $((limit_kb * 1024)) bytes" fsize3.log
(ulimit -f 1; exec "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name fsize2 --n_device_axis 2 1 1 --training_steps 2 \
  --fresh) 2>&1 | cat > fsize2.log
rc=${PIPESTATUS[0]}
check "file-size limit under mpirun: non-zero (rc $rc), and meshtrain says what failed" \
  bash -c "test $rc -ne 0 && grep -q 'file-size limit (ulimit -f)' fsize2.log"

# --- Inputs prepare-data cannot read: named with the reason, never a raw filesystem error.
mkdir -p loops && cp corpus/computers loops/ && ln -s b loops/a && ln -s a loops/b
"$BIN" prepare-data --input loops --output loops_out --vocab-size 300 > loops.log 2>&1
check "a link loop in an input folder: skipped with the reason (rc $?)" \
  bash -c "grep -q 'a symbolic link loop' loops_out/manifest.json && ! grep -q 'filesystem error' loops.log"
if command -v setpriv >/dev/null && [ "$(id -u)" = 0 ]; then
  # As root every file is readable: an unprivileged user meets the permission.
  mkdir -p locked && cp corpus/computers locked/ && cp corpus/cookie locked/secret && chmod 000 locked/secret
  chmod 777 . locked
  setpriv --reuid=65534 --regid=65534 --clear-groups "$BIN" prepare-data --input locked/secret --output locked_out1 \
    --vocab-size 300 > locked1.log 2>&1
  rc=$?
  check "an unreadable --input: refused with the reason (rc $rc)" \
    bash -c "test $rc -eq 1 && grep -q \"input 'locked/secret' cannot be read: Permission denied\" locked1.log"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$BIN" prepare-data --input locked --output locked_out2 \
    --vocab-size 300 > locked2.log 2>&1
  check "an unreadable file in an input folder: skipped with the reason (rc $?)" \
    bash -c "grep -q 'cannot be read: Permission denied' locked_out2/manifest.json"
else
  echo "note - unreadable inputs not tried: needs root and setpriv to run prepare-data as another user"
fi
"$BIN" prepare-data --input corpus --output many --vocab-size 300 --workers 5000 > many.log 2>&1
rc=$?
check "--workers 5000: refused naming the flag and the cores (rc $rc), nothing written" \
  bash -c "test $rc -eq 1 && grep -q -- '--workers 5000 is more than 4 per core' many.log && test ! -e many"

finish
