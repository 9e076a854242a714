#!/usr/bin/env bash
# Issue 28, classes 2 and 4, as an operator hits them:
#  - data made by another tokenizer is never trained on silently: a resume on
#    another tokenizer's data (refused naming both; --allow-tokenizer-change
#    continues with a warning), a blend of two tokenizers, a stray shard of
#    another tokenizer, prepare-data run again over the data of a running train;
#    data without a fingerprint (nanoGPT) still trains, with a note;
#  - --init-from-hf accounts for every tensor of the files: a layer config.json
#    does not declare, an extra or missing tensor, a short embedding, an integer
#    dtype are each refused naming the tensor and file; vocabulary padding for
#    tp is not a mismatch.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus  # data/: tokenizer A (vocab 320)
mkdir -p corpus2
for f in art education food; do cp "/usr/share/games/fortunes/$f" corpus2/; done
"$BIN" prepare-data --input corpus2 --output data2 --vocab-size 320 > prepare2.log 2>&1 || bad "prepare data2" "$(cat prepare2.log)"
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --checkpoint_steps 2 --eval_steps 1
   --set inference_config.max_tokens=0)
tree_sum() { find "$1" -type f -print0 | sort -z | xargs -0 sha1sum | sha1sum; }
fp() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokenizer_fingerprint'])" "$1"; }
expect_error() {  # NAME LOG PATTERN... : the command's log holds every pattern (fixed strings)
  local name="$1" log="$2" p
  shift 2
  for p in "$@"; do grep -qF -- "$p" "$log" || { bad "$name (no '$p')" "$(cat "$log")"; return; }; done
  ok "$name"
}

FA=$(fp data/manifest.json)
FB=$(fp data2/manifest.json)
check "prepare-data records a fingerprint per tokenizer (same size, other text: $FA vs $FB)" \
  test -n "$FA" -a -n "$FB" -a "$FA" != "$FB"
check "every shard header carries it; llm.c's magic, version, count and size untouched" python3 - "$FA" data/train/*.bin data/val/*.bin <<'PY'
import os, struct, sys
fp = int(sys.argv[1], 16)
for p in sys.argv[2:]:
    h = struct.unpack("<256i", open(p, "rb").read(1024))
    assert h[0] == 20240520 and h[1] == 1 and os.path.getsize(p) == 1024 + 2 * h[2], p
    assert h[3] == 0x4D544650 and (h[4] & 0xFFFFFFFF) | (h[5] & 0xFFFFFFFF) << 32 == fp, p
    assert not any(h[6:]), p
PY

# --- Resume on data of another tokenizer of the same size.
"$BIN" train "${T[@]}" --name base --training_steps 2 --fresh > base.log 2>&1 || bad "base run" "$(tail base.log)"
check "trainer_state.json records the data's tokenizer" \
  test "$(fp runs/base/checkpoints/step_00000002/trainer_state.json)" = "$FA"
cp -r runs/base runs/swap
before=$(tree_sum runs/swap/checkpoints)
"$BIN" train "${T[@]}" --name swap --training_steps 4 --set data_config.data_dir=data2 > swap.log 2>&1
rc=$?
check "resume on another tokenizer's data: refused (rc $rc)" test $rc -ne 0
expect_error "resume refusal names both fingerprints, both data dirs and the flag" swap.log "$FA" "$FB" "(data)" \
  "(data2)" "--allow-tokenizer-change"
check "refused resume: checkpoints untouched, no step trained" \
  test "$(tree_sum runs/swap/checkpoints)" = "$before" -a ! -e runs/swap/checkpoints/step_00000004
"$BIN" train "${T[@]}" --name swap --training_steps 4 --set data_config.data_dir=data2 --allow-tokenizer-change \
  > swap2.log 2>&1
check "--allow-tokenizer-change: continues (rc $?)" grep -q "saved checkpoint of step 4" swap2.log
expect_error "--allow-tokenizer-change: warns naming both" swap2.log "$FA" "$FB" "continuing because of --allow-tokenizer-change"
check "the new checkpoint records the new tokenizer" test "$(fp runs/swap/checkpoints/step_00000004/trainer_state.json)" = "$FB"
"$BIN" train "${T[@]}" --name base --training_steps 4 > same.log 2>&1
check "resume on the same data: resumes without a tokenizer warning" \
  bash -c "grep -q 'resumed from' same.log && ! grep -q 'was trained on data of tokenizer' same.log"

# --- A blend of two tokenizers.
python3 - <<'PY'
import json
c = json.load(open("tiny.json"))
c["data_config"]["datasets"] = [{"path": "data", "weight": 1}, {"path": "data2", "weight": 1}]
json.dump(c, open("blend.json", "w"), indent=1)
PY
"$BIN" train --config blend.json --name blend --training_steps 2 --fresh > blend.log 2>&1
rc=$?
check "blend of two tokenizers: refused (rc $rc)" test $rc -ne 0
expect_error "blend refusal names both datasets and fingerprints" blend.log "data2 by tokenizer $FB" "data was made by tokenizer $FA"
check "blend refusal: nothing trained" test ! -e runs/blend/metrics.jsonl

# --- A stray shard of another tokenizer in the data folder.
cp -r data data3
cp data2/train/train_000000.bin data3/train/train_000001.bin
"$BIN" train "${T[@]}" --name stray --set data_config.data_dir=data3 --training_steps 2 --fresh > stray.log 2>&1
rc=$?
check "stray shard of another tokenizer: refused (rc $rc)" test $rc -ne 0
expect_error "stray shard refusal names the shard and both fingerprints" stray.log "data3/train/train_000001.bin" "$FA" "$FB"
# One without any fingerprint (an llm.c file) among fingerprinted ones.
python3 - <<'PY'
import struct
open("data3/train/train_000001.bin", "wb").write(struct.pack("<256i", 20240520, 1, 5000, *[0] * 253) + bytes(10000))
PY
"$BIN" train "${T[@]}" --name stray --set data_config.data_dir=data3 --training_steps 2 --fresh > stray2.log 2>&1
check "stray unmarked shard: refused (rc $?)" grep -qF "data3/train/train_000001.bin carries no tokenizer fingerprint" stray2.log

# --- Data without a fingerprint trains, with a one-line note.
mkdir -p nano
python3 - <<'PY'
import random, struct
rng = random.Random(0)
for name, n in (("train.bin", 20000), ("val.bin", 4000)):
    open("nano/" + name, "wb").write(struct.pack(f"<{n}H", *[rng.randrange(320) for _ in range(n)]))
PY
"$BIN" train "${T[@]}" --name nano --set data_config.data_dir=nano --set data_config.format=nanogpt \
  --training_steps 2 --fresh > nano.log 2>&1
check "nanoGPT data (no fingerprint) trains (rc $?)" grep -q "saved checkpoint of step 2" nano.log
check "... with a one-line note that it cannot be checked" test "$(grep -c 'cannot be checked' nano.log)" -eq 1

# --- prepare-data run again over the data_dir of a running train: the train stops, non-zero.
# NAME: a long train on a copy of data/ named NAME, in the background ($pid),
# once it has logged 3 steps.
train_on_copy() {
  cp -r data "$1"
  "$BIN" train "${T[@]}" --name "$1" --set data_config.data_dir="$1" --training_steps 100000 \
    --checkpoint_steps 100000 --fresh > "$1.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    [ "$(cat "runs/$1/metrics.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.2
  done
}
# WHAT: waits up to 2 minutes for that train to stop by itself (rc: its exit code).
stops_by_itself() {
  for _ in $(seq 600); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
  if kill -0 $pid 2>/dev/null; then kill $pid; bad "the train kept running on $1"; fi
  wait $pid
  rc=$?
}
train_on_copy live
"$BIN" prepare-data --input corpus2 --output live --vocab-size 320 > live-prepare.log 2>&1
check "prepare-data over a running train's data_dir runs (rc $?)" test -f live/manifest.json
stops_by_itself "replaced data"
check "the running train stops non-zero (rc $rc)" test $rc -ne 0 -a $rc -ne 143
check "... naming the replaced shard" grep -qE "live/(train|val)/[a-z]+_000000.bin (changed on disk|cannot be opened)" live.log
steps=$(wc -l < runs/live/metrics.jsonl)
check "... within a step or two of the change ($steps rows)" test "$steps" -lt 1000

# --- A shard rewritten in place with its size and modification time kept (a
# restored backup, cp -p over it): the stat check passes; the block checksums
# taken at the first read stop the run, naming the shard (issue 47).
train_on_copy inplace
shard=$(ls inplace/train/*.bin | head -1)
python3 - "$shard" <<'PY'
import os, sys
p = sys.argv[1]; st = os.stat(p)
with open(p, "r+b") as f:  # every token after the header becomes token 7, in place
    f.seek(1024); n = st.st_size - 1024; f.write(b"\x07\x00" * (n // 2))
os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
st2 = os.stat(p)
assert (st2.st_size, st2.st_mtime_ns, st2.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
PY
stops_by_itself "a shard rewritten in place"
check "shard rewritten in place, same size and time: the train stops non-zero (rc $rc)" test $rc -ne 0 -a $rc -ne 143
check "... naming the shard and why" grep -q "shard $shard changed on disk since training first read it (rewritten in place" inplace.log

# --- Hugging Face import accounts for every tensor (a GELU Llama exported here).
"$BIN" checkpoint export runs/base/checkpoints/step_00000002 --format hf --output hf > export.log 2>&1 \
  || bad "export --format hf" "$(cat export.log)"
spoil() {  # OUT PYTHON-BODY: a copy of hf/ whose model.safetensors tensors t (name -> [dtype, shape, bytes]) are changed
  rm -rf "$1"
  cp -r hf "$1"
  python3 - "$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
path, body = sys.argv[1], sys.argv[2]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + n])
meta = head.pop("__metadata__", None)
t = {k: [v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]] for k, v in head.items()}
L = max(int(k.split(".")[2]) for k in t if k.startswith("model.layers.")) + 1
exec(body)
out, off, blob = {}, 0, b""
if meta: out["__metadata__"] = meta
for k, (d, s, b) in t.items():
    out[k] = {"dtype": d, "shape": s, "data_offsets": [off, off + len(b)]}
    off += len(b); blob += b
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)
PY
}
hf_refused() {  # NAME DIR PATTERN...
  local name="$1" dir="$2"
  shift 2
  "$BIN" train "${T[@]}" --name "hf_$dir" --training_steps 1 --fresh --init-from-hf "$dir" > "$dir.log" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then bad "$name: imported (rc 0)" "$(tail "$dir.log")"; return; fi
  expect_error "$name: refused naming the tensor and file" "$dir.log" "$@"
  check "$name: no run started" test ! -e "runs/hf_$dir/metrics.jsonl"
}
"$BIN" train "${T[@]}" --name hf_ok --training_steps 1 --fresh --init-from-hf hf > hf_ok.log 2>&1
check "the exported model imports (rc $?)" grep -q "initialised the model from the Hugging Face weights" hf_ok.log
spoil extra_layer 'for k in [k for k in t if k.startswith(f"model.layers.{L-1}.")]: t[k.replace(f"layers.{L-1}.", f"layers.{L}.")] = t[k]'
hf_refused "a layer past num_hidden_layers" extra_layer "model.layers.4.input_layernorm.weight (model.safetensors)" "not declared"
spoil extra_tensor 't["model.layers.0.self_attn.q_norm.weight"] = ["F32", [64], bytes(256)]'
hf_refused "an extra tensor" extra_tensor "model.layers.0.self_attn.q_norm.weight (model.safetensors): extra tensor"
spoil missing 'del t["model.norm.weight"]'
hf_refused "a missing tensor" missing "model.norm.weight: missing"
spoil short_embed 'e = t["model.embed_tokens.weight"]; e[1] = [e[1][0] - 1, e[1][1]]; e[2] = e[2][:-4 * e[1][1]]'
hf_refused "an embedding shorter than vocab_size" short_embed "model.embed_tokens.weight (model.safetensors): shape [319, 64], config.json implies [320, 64]"
spoil int_dtype 't["model.norm.weight"][0] = "I32"'
hf_refused "an integer dtype" int_dtype "model.norm.weight (model.safetensors): dtype I32"

# tp pads the vocabulary (321 -> 322 rows): HF's 321 rows are the unpadded shape, not a mismatch.
"$BIN" train "${T[@]}" --name odd --training_steps 2 --fresh --set model_config.vocab_size=321 > odd.log 2>&1 \
  || bad "vocab 321 run" "$(tail odd.log)"
"$BIN" checkpoint export runs/odd/checkpoints/step_00000002 --format hf --output hf_odd > export_odd.log 2>&1
"${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name odd_tp --training_steps 1 --fresh --init-from-hf hf_odd \
  --n_device_axis 1 1 2 > odd_tp.log 2>&1
check "an odd vocabulary imports on tp 2 (padded rows, rc $?)" grep -q "initialised the model from the Hugging Face weights" odd_tp.log

finish
