#!/usr/bin/env bash
# The binary as a user runs it: prepare data, train the tiny config (loss
# falls), evaluate, sample, train on 4 MPI ranks, and bad inputs fail clearly.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
check "prepare-data writes shards and a tokenizer" test -f data/tokenizer.json -a -d data/train -a -d data/val
write_config tiny.json

out=$("$BIN" train --config tiny.json --training_steps 40 --checkpoint_steps 20 --set lr.warmup_steps=5 \
      --set lr.end_steps=40 --fresh 2>&1)
rc=$?
check "train exits 0" test $rc -eq 0
[ $rc -eq 0 ] || bad "train output" "$out"
first=$(metric runs/tiny/metrics.jsonl loss | head -1)
last=$(metric runs/tiny/metrics.jsonl loss | tail -5 | python3 -c "import sys; v=[float(x) for x in sys.stdin]; print(sum(v)/len(v))")
check "loss falls ($first -> $last)" python3 -c "import sys; sys.exit(0 if $last < $first - 0.5 else 1)"
check "eval rows logged" test "$(metric runs/tiny/metrics.jsonl val_loss | wc -l)" -eq 2
# Every step's tokens/s is its own: the steps at a checkpoint (20, 40) are
# read back to back, and once got ~0 s (millions of tokens/s).
check "tokens/s of every step within 20x of the median (steps 20 and 40 included)" python3 -c "
import json, statistics, sys
v = {r['step']: r['tokens_per_sec'] for r in map(json.loads, open('runs/tiny/metrics.jsonl')) if 'tokens_per_sec' in r}
m = statistics.median(v.values())
sys.exit(0 if len(v) == 40 and all(0 < x < 20 * m for x in v.values()) else print(m, v[20], v[40], max(v.values())) or 1)"
check "console shows Step lines" grep -q "Step 40, Loss:" <<<"$out"
check "a sample is printed" grep -q "sample:" <<<"$out"
check "checkpoint written" test -f runs/tiny/checkpoints/latest
check "TensorBoard events written" compgen -G "runs/tiny/tb/events.out.tfevents.*" >/dev/null

out=$("$BIN" eval --config tiny.json 2>&1)
check "eval prints val_loss" grep -q "^val_loss " <<<"$out"
out=$("$BIN" generate --config tiny.json --prompt "The computer" --max_tokens 8 --temperature 0 2>&1)
check "generate continues the prompt" grep -q "^The computer" <<<"$out"

g1=$("$BIN" generate --config tiny.json --prompt "The computer" --max_tokens 12 --temperature 1 --top_k 0 2>/dev/null | tail -1)
g2=$("${MPIRUN[@]}" -np 2 "$BIN" generate --config tiny.json --n_device_axis 1 2 1 --prompt "The computer" \
     --max_tokens 12 --temperature 1 --top_k 0 2>/dev/null | tail -1)
check "sampling through a 2-stage pipeline equals one process ($g1)" test -n "$g1" -a "$g1" = "$g2"
g3=$("${MPIRUN[@]}" -np 2 "$BIN" generate --config tiny.json --n_device_axis 1 2 1 --prompt "The computer" \
     --set pipeline_schedule=interleaved --set virtual_stages=2 --max_tokens 12 --temperature 1 --top_k 0 \
     2>/dev/null | tail -1)
check "sampling through 2 interleaved stages of 2 chunks equals one process" test -n "$g1" -a "$g1" = "$g3"

out=$("${MPIRUN[@]}" -np 4 "$BIN" train --config tiny.json --n_device_axis 4 1 1 --name dp4 \
      --training_steps 6 --fresh 2>&1)
check "mpirun -np 4 --n_device_axis 4 1 1 trains" test $? -eq 0
check "dp4 logged 6 steps" test "$(metric runs/dp4/metrics.jsonl loss | wc -l)" -eq 6

# Zero-bubble: every row carries the measured forward : B : W lengths, and
# plans made with lengths far from them say which key takes the measured ones.
out=$("${MPIRUN[@]}" -np 2 "$BIN" train --config tiny.json --n_device_axis 1 2 1 --name zbv --training_steps 5 \
      --set pipeline_schedule=zbv --set "pipeline_pass_costs=[1, 5, 5]" --fresh 2>&1)
check "zbv trains on 2 stages" test $? -eq 0
check "zbv rows log pipeline_pass_costs [1, B, W]" python3 -c "
import json, sys
rows = [r['pipeline_pass_costs'] for r in map(json.loads, open('runs/zbv/metrics.jsonl')) if 'loss' in r]
sys.exit(0 if len(rows) == 5 and all(len(c) == 3 and c[0] == 1 and c[1] > 0 and c[2] > 0 for c in rows) else print(rows) or 1)"
check "zbv names the key that plans with the measured lengths" grep -q "set pipeline_pass_costs: \[1, " <<<"$out"

# Bad inputs: non-zero exit and a message naming the culprit.
expect_error() {  # NAME PATTERN CMD...
  local name="$1" pat="$2" out rc
  shift 2
  out=$("$@" 2>&1)
  rc=$?
  if [ $rc -ne 0 ] && grep -q -- "$pat" <<<"$out"; then ok "$name"; else bad "$name (rc $rc)" "$out"; fi
}
python3 -c "import json; c=json.load(open('tiny.json')); c['model_config']['n_heads']=4; json.dump(c,open('bad.json','w'))"
expect_error "unknown key named" "model_config.n_heads" "$BIN" train --config bad.json
expect_error "bad --set value named" "model_config.n_head" "$BIN" train --config tiny.json --set model_config.n_head=x
expect_error "mesh/world mismatch named" "n_device_axis" "$BIN" train --config tiny.json --n_device_axis 2 1 1
expect_error "missing data folder named" "nowhere/train" "$BIN" train --config tiny.json --set data_config.data_dir=nowhere
expect_error "missing config file named" "missing.json" "$BIN" train --config missing.json
expect_error "multi-rank error aborts every rank" "n_head" "${MPIRUN[@]}" -np 2 "$BIN" train --config tiny.json \
  --n_device_axis 1 1 2 --set model_config.n_head=3 --set model_config.model_dimension=63
finish
