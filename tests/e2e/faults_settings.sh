#!/usr/bin/env bash
# Silently wrong settings and unclear failures (issue 28, classes 5 and 6):
# a warmup longer than the schedule, duplicate config keys, --val-fraction 0,
# flags a plain export would ignore, a run started --init-from-hf then used
# with its own config; NaN weights when sampling, pipes and devices as inputs,
# a garbage tokenizer, an overflowing --max-shard-size, an unknown subcommand,
# a checkpoints path that is a file. Issue 47: an end-of-text id outside the
# vocabulary, generate without a tokenizer, non-finite weights to resume or
# start from, a model or batch beyond the memory, a config that is an array
# or nested 200,000 deep, --init-from-hf on a run that has checkpoints. Each
# refusal names the key, flag, file or tensor.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --checkpoint_steps 2 --eval_steps 1
   --set inference_config.max_tokens=0)
# refused NAME LOG PATTERN CMD...: CMD exits 1..123 (not a timeout or signal) and LOG matches PATTERN.
refused() {
  local name="$1" log="$2" pattern="$3"
  shift 3
  timeout 60 "$@" > "$log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -q -- "$pattern" "$log"; then ok "$name"; else bad "$name (rc $rc)" "$(cat "$log")"; fi
}
no_trace() { ! grep -qE 'Exception raised from|frame #[0-9]|stoll' "$1"; }

# --- Settings that were silently wrong.
refused "lr.warmup_steps > lr.end_steps: refused naming both" lr.log "lr.warmup_steps (50) must be <= lr.end_steps (40)" \
  "$BIN" train "${T[@]}" --name lr --set lr.warmup_steps=50 --training_steps 1
check "the refused lr run created nothing" test ! -e runs/lr
python3 - <<'PY'
text = open("tiny.json").read()
open("dup.json", "w").write(text.replace('"n_head": 4,', '"n_head": 4, "n_head": 2,', 1))
open("dup2.json", "w").write(text.replace('{', '{"name": "first", "name": "second",', 1))
PY
check "dup.json really has a duplicate" grep -q '"n_head": 4, "n_head": 2' dup.json
refused "a key given twice in a config: refused naming the key and the file" dup.log \
  "config file 'dup.json': key 'model_config.n_head' is given twice" "$BIN" train --config dup.json --name dup
refused "a top-level key given twice: refused naming it" dup2.log "key 'name' is given twice" \
  "$BIN" plan --config dup2.json
refused "--val-fraction 0: refused naming the flag" vf.log "--val-fraction must be in (0, 1)" \
  "$BIN" prepare-data --input corpus --output vf --vocab-size 300 --val-fraction 0
check "--val-fraction 0: no output" test ! -e vf
"$BIN" prepare-data --input corpus --output vf2 --vocab-size 300 --val-fraction 0.0001 > vf2.log 2>&1
check "a tiny --val-fraction still gives at least one validation document (README)" python3 -c "
import json,sys; m=json.load(open('vf2/manifest.json')); sys.exit(0 if m['val']['documents'] >= 1 else 1)"

"$BIN" train "${T[@]}" --name base --training_steps 2 --fresh > base.log 2>&1 || bad "base run" "$(tail base.log)"
CK=runs/base/checkpoints/step_00000002
refused "--max-shard-size on a plain export: refused naming the flag" mss.log "--max-shard-size applies to --format hf" \
  "$BIN" checkpoint export $CK --output plain.safetensors --max-shard-size 1MB
refused "--tokenizer on a plain export: refused naming the flag" tok.log "--tokenizer applies to --format hf" \
  "$BIN" checkpoint export $CK --output plain.safetensors --tokenizer data/tokenizer.json
check "the refused exports wrote nothing" bash -c "! ls plain.safetensors* 2>/dev/null"
refused "--max-shard-size overflow: names the flag and the value" ovf.log "--max-shard-size '99999999999999999999GB'" \
  "$BIN" checkpoint export $CK --format hf --output hfo --max-shard-size 99999999999999999999GB
check "--max-shard-size overflow: no bare 'stoll'" no_trace ovf.log
refused "--max-shard-size 9999999999GB (product overflows): refused" ovf2.log "too large" \
  "$BIN" checkpoint export $CK --format hf --output hfo --max-shard-size 9999999999GB

# A run started from a Hugging Face model (whose model differs from the config file's) is then used with the file.
LLAMA=(--set model_config.mlp_activation=swiglu --set model_config.n_kv_head=2 --set model_config.tie_embeddings=false)
"$BIN" train "${T[@]}" "${LLAMA[@]}" --name llama --training_steps 2 --fresh > llama.log 2>&1 || bad "llama run" "$(tail llama.log)"
"$BIN" checkpoint export runs/llama/checkpoints/step_00000002 --format hf --output hf_llama > hfx.log 2>&1 \
  || bad "export --format hf" "$(cat hfx.log)"
"$BIN" train "${T[@]}" --name fromhf --training_steps 2 --init-from-hf hf_llama --fresh > fromhf.log 2>&1
check "train --init-from-hf: trains (rc $?)" test -d runs/fromhf/checkpoints/step_00000002
"$BIN" eval "${T[@]}" --name fromhf > fromhf-eval.log 2>&1
check "eval with the run's own config after --init-from-hf: works (rc $?)" grep -q '^val_loss ' fromhf-eval.log
check "eval: says the model comes from the checkpoint" grep -q "initialised from the Hugging Face model" fromhf-eval.log
"$BIN" train "${T[@]}" --name fromhf --training_steps 4 > fromhf-resume.log 2>&1
check "train resumes the --init-from-hf run with its own config (rc $?)" grep -q "resumed from .*step_00000002" fromhf-resume.log
check "the resumed run reached step 4" test -d runs/fromhf/checkpoints/step_00000004
"$BIN" generate "${T[@]}" --name fromhf --max_tokens 3 --prompt "The" > fromhf-gen.log 2>&1
check "generate on the --init-from-hf run with its own config (rc $?)" test $? -eq 0
"$BIN" eval "${T[@]}" --name base > base-eval.log 2>&1
check "an ordinary run still evaluates (no HF model involved)" grep -q '^val_loss ' base-eval.log

# --- Unclear failures.
MESHTRAIN_TEST_NAN_WEIGHTS_AT_STEP=2 "$BIN" train "${T[@]}" --name nanw --training_steps 2 \
  --set inference_config.max_tokens=3 --fresh > nanw.log 2>&1
rc=$?
check "NaN weights at the end-of-run sample: the run still exits 0 (rc $rc)" test $rc -eq 0
check "NaN weights: the failed sample is a warning naming NaN" grep -q "sample at step 2 failed.*NaN or infinite" nanw.log
check "NaN weights: no C++ stack trace" no_trace nanw.log
refused "generate from a checkpoint with NaN weights: a clear error naming the checkpoint" nang.log \
  "weights of checkpoint runs/nanw/checkpoints/step_00000002 hold NaN" \
  "$BIN" generate "${T[@]}" --checkpoint runs/nanw/checkpoints/step_00000002 --max_tokens 3
check "generate from NaN weights: no C++ stack trace" no_trace nang.log

# The same from a checkpoint whose weights were made NaN by hand (checksums redone), without the hook.
cp -r runs/base runs/poison
python3 - runs/poison/checkpoints/step_00000002 <<'PY' || bad "poisoning the checkpoint"
import json, os, struct, sys
d = sys.argv[1]
table = []
for i in range(256):
    c = i
    for _ in range(8): c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b: c = table[(c ^ x) & 0xFF] ^ (c >> 8)
    return "crc32c:%08x" % (c ^ 0xFFFFFFFF)
m = json.load(open(f"{d}/manifest.json"))
f = f"{d}/rank_00000.safetensors"
b = bytearray(open(f, "rb").read())
assert crc32c(b) == m["files"]["rank_00000.safetensors"]["checksum"], "this crc32c differs from meshtrain's"
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
for k, v in h.items():
    if k.startswith("model.") and v["dtype"] == "F32":
        s, e = v["data_offsets"]
        b[8 + n + s:8 + n + e] = b"\x00\x00\xc0\x7f" * ((e - s) // 4)
open(f, "wb").write(b)
m["files"]["rank_00000.safetensors"]["checksum"] = crc32c(b)
json.dump(m, open(f"{d}/manifest.json", "w"))
PY
refused "generate from a hand-poisoned checkpoint: a clear error naming it" poison.log \
  "weights of checkpoint runs/poison/checkpoints/step_00000002 hold NaN" \
  "$BIN" generate "${T[@]}" --name poison --max_tokens 3
check "generate from a hand-poisoned checkpoint: no C++ stack trace" no_trace poison.log
refused "generate --temperature 0 (argmax) from it: refused too, not NaN text" poison0.log "hold NaN" \
  "$BIN" generate "${T[@]}" --name poison --max_tokens 3 --temperature 0

mkfifo fifo
refused "a FIFO as --input: refused naming it and why" fifo.log "--input fifo is a FIFO (named pipe), not a regular file" \
  "$BIN" prepare-data --input fifo --output f1 --vocab-size 300
refused "/dev/zero as --input: refused naming it" zero.log "/dev/zero is a character device" \
  "$BIN" prepare-data --input /dev/zero --output f2 --vocab-size 300
refused "/dev/zero as --tokenizer: refused naming it" ztok.log "/dev/zero is a character device" \
  "$BIN" prepare-data --input corpus --output f3 --tokenizer /dev/zero
refused "a FIFO as --config: refused (no hang)" zcfg.log "fifo is a FIFO" "$BIN" plan --config fifo
mkdir withfifo && cp corpus/computers withfifo/ && mkfifo withfifo/pipe
timeout 60 "$BIN" prepare-data --input withfifo --output f4 --vocab-size 300 > f4.log 2>&1
check "a FIFO inside an input folder: skipped with the reason (rc $?)" \
  bash -c "test -f f4/manifest.json && grep -q 'pipe' f4/manifest.json && grep -q 'a FIFO' f4/manifest.json && grep -q 'skipped' f4.log"
check "no raw filesystem error in any of them" bash -c "! grep -q 'filesystem error' fifo.log zero.log ztok.log zcfg.log f4.log"

{ printf "\x89PNG\r\n"; head -c 4000 /dev/urandom; } > garbage.tiktoken
printf 'hello world\nthis is text\n' > text.tiktoken
: > empty.tiktoken
for g in garbage text empty; do
  refused "a $g tokenizer file: says it is not a tokenizer and what is accepted" "tok-$g.log" \
    "$g.tiktoken is not a tokenizer meshtrain reads.*Accepted: a tiktoken file" \
    "$BIN" prepare-data --input corpus --output t1 --tokenizer "$g.tiktoken"
done
check "a garbage tokenizer: no sha256 / 'pattern is unknown' talk" bash -c "! grep -q 'pattern is unknown' tok-garbage.log"

refused "an unknown subcommand: named, with the valid ones" sub.log "unknown subcommand 'trian'; valid: train, eval" \
  "$BIN" trian --config tiny.json
refused "an unknown checkpoint subcommand: named" sub2.log "unknown 'checkpoint' subcommand 'exprt'; valid: inspect, export" \
  "$BIN" checkpoint exprt $CK

mkdir -p runs/cpfile && echo "not a folder" > runs/cpfile/checkpoints
refused "a 'checkpoints' path that is a file: refused at start-up naming it" cp.log "checkpoint folder runs/cpfile/checkpoints" \
  "$BIN" train "${T[@]}" --name cpfile --training_steps 4 --checkpoint_steps 4
check "... before any step was trained" bash -c "! grep -q '\"loss\"' runs/cpfile/metrics.jsonl 2>/dev/null"
check "... and the file in the way is untouched" grep -q "not a folder" runs/cpfile/checkpoints
mkdir -p runs/mfile/metrics.jsonl
refused "a metrics.jsonl that is a folder: refused at start-up naming it" mf.log "metrics file runs/mfile/metrics.jsonl is a directory" \
  "$BIN" train "${T[@]}" --name mfile --training_steps 2

# --- Issue 47: settings that were silently wrong, crashes without a message.
refused "eot_token at vocab_size with document_masking: refused naming both keys" eot.log \
  "data_config.eot_token (320) must be below model_config.vocab_size (320)" \
  "$BIN" train "${T[@]}" --name eot --set data_config.document_masking=true --set data_config.eot_token=320
cp -r data data_eot
python3 - <<'PY'
import json
m = json.load(open("data_eot/manifest.json")); m["eot"] = m["vocab_size"] + 5
json.dump(m, open("data_eot/manifest.json", "w"))
PY
refused "a manifest whose eot is outside its vocabulary: refused naming the file" eot2.log \
  "dataset manifest data_eot/manifest.json: \"eot\" 325 is not a token of its vocabulary" \
  "$BIN" train "${T[@]}" --name eot2 --set data_config.document_masking=true --set data_config.data_dir=data_eot --fresh

cp -r data data_notok && rm data_notok/tokenizer.json
refused "generate without the data's tokenizer.json: an error naming it, not an empty exit 0" notok.log \
  "generate: there is no tokenizer to encode the prompt and decode the sample: data_notok/tokenizer.json is missing" \
  "$BIN" generate "${T[@]}" --name base --set data_config.data_dir=data_notok --max_tokens 3 --prompt "The"

# Non-finite weights to resume: the checkpoint is skipped naming the tensor, never trained on as skipped steps.
cp -r runs/nanw runs/nanresume
"$BIN" train "${T[@]}" --name nanresume --training_steps 4 > nanresume.log 2>&1
rc=$?
check "resume of a run whose only checkpoint holds NaN: refused (rc $rc), naming the tensor" \
  bash -c "test $rc -eq 1 && grep -q \"none can be read\" nanresume.log &&
           grep -qE \"weights of checkpoint runs/nanresume/checkpoints/step_00000002 hold NaN or inf: tensor 'model\\.[a-z_.0-9]+' has [0-9]+ non-finite\" nanresume.log"
check "... no step trained on it, nothing saved over it" \
  bash -c "! grep -q 'nan_policy' nanresume.log && test ! -e runs/nanresume/checkpoints/step_00000004"
# A run whose step 4 was saved with NaN weights (the test hook), step 2 good.
MESHTRAIN_TEST_NAN_WEIGHTS_AT_STEP=4 "$BIN" train "${T[@]}" --name nanolder --training_steps 4 --fresh \
  > nanolder0.log 2>&1
"$BIN" train "${T[@]}" --name nanolder --training_steps 6 > nanolder.log 2>&1
rc=$?
check "a NaN checkpoint newer than a good one: skipped naming the tensor, the good one resumes (rc $rc)" \
  bash -c "test $rc -eq 0 && grep -q 'skipping checkpoint runs/nanolder/checkpoints/step_00000004: .*hold NaN or inf: tensor' nanolder.log &&
           grep -q 'resumed from runs/nanolder/checkpoints/step_00000002' nanolder.log"
check "... and the NaN one is kept as evidence (renamed by the save of its step)" \
  test -d runs/nanolder/checkpoints/step_00000004.unreadable
"$BIN" checkpoint export runs/base/checkpoints/step_00000002 --format hf --output hf_nan > hfnan.log 2>&1 ||
  bad "export for the NaN HF model" "$(cat hfnan.log)"
python3 - hf_nan <<'PY'
import json, struct, sys, glob
f = sorted(glob.glob(sys.argv[1] + "/*.safetensors"))[0]
b = bytearray(open(f, "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
k = sorted(k for k, v in h.items() if k != "__metadata__" and v["dtype"] == "F32")[0]
s, e = h[k]["data_offsets"]; b[8 + n + s:8 + n + s + 4] = b"\x00\x00\xc0\x7f"
open(f, "wb").write(b); print(k)
PY
refused "--init-from-hf with a NaN weight: refused naming the tensor" hfnan2.log "holds NaN or inf (1 of" \
  "$BIN" train "${T[@]}" --name hfnan --training_steps 2 --init-from-hf hf_nan --fresh

# A model or a batch beyond the memory: refused naming the keys, not an allocator's stack trace.
refused "d 65536: refused before any allocation, naming the key" mem.log "model_config.model_dimension 65536" \
  "$BIN" train "${T[@]}" --name mem --set model_config.model_dimension=65536 --fresh
check "d 65536: says how much it needs and has" grep -q "this config needs .* GiB per rank (meshtrain plan" mem.log
check "d 65536: no C++ stack trace" no_trace mem.log
refused "vocab_size 3e9 (beyond 32-bit token ids): refused naming the key" vocab.log \
  "model_config.vocab_size (3000000000) must be <= 2147483648" \
  "$BIN" train "${T[@]}" --name vocab --set model_config.vocab_size=3000000000 --fresh
refused "generate with d 65536: refused too" memg.log "model_config.model_dimension 65536" \
  "$BIN" generate "${T[@]}" --name base --set model_config.model_dimension=65536 --random_weights --prompt x

# Config files that are not a config.
echo '[{"name": "x"}]' > array.json
refused "a JSON array as the config: blamed on the file, not on a flag" arr.log \
  "config file 'array.json' holds a JSON array, not an object" \
  "$BIN" train --config array.json --name arr --training_steps 3
check "... not on --set or a flag" bash -c "! grep -q -- '--set' arr.log"
python3 -c "open('deep.json','w').write('{\"model_config\": ' + '['*200000 + ']'*200000 + '}')"
refused "a config nested 200,000 deep: refused naming the file (no segfault)" deep.log \
  "config file 'deep.json' nests values more than 64 levels deep" "$BIN" plan --config deep.json

# --init-from-hf on a run that already has checkpoints: it resumes them (the same model), not "a different model".
"$BIN" train "${T[@]}" --name fromhf --training_steps 6 --init-from-hf hf_llama > fromhf-again.log 2>&1
rc=$?
check "--init-from-hf again on the run: resumes its checkpoint (rc $rc)" \
  bash -c "test $rc -eq 0 && grep -q 'resumed from runs/fromhf/checkpoints/step_00000004' fromhf-again.log &&
           ! grep -q 'different model' fromhf-again.log && test -d runs/fromhf/checkpoints/step_00000006"

finish
