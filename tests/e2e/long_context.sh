#!/usr/bin/env bash
# Long context as a user runs it: document masking on prepared data (the eot
# from its manifest), context parallelism over mpirun ranks equal to one
# process, a checkpoint saved at cp 2 resumed at cp 1 (and inspected), plan's
# cp split and exchange bytes, bench's cp traffic, and the refusals.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
common=(--set data_config.document_masking=true --set training_steps=6 --set checkpoint_steps=3
        --set eval_steps=1 --set log_every=1 --set inference_config.max_tokens=0 --set lr.warmup_steps=2)

out=$("$BIN" train --config tiny.json "${common[@]}" --set name=one --fresh 2>&1)
check "document masking trains on one process (eot from the data's manifest)" test $? -eq 0
out=$("${MPIRUN[@]}" -np 2 "$BIN" train --config tiny.json "${common[@]}" --set name=cp2 \
      --set device_config.context_parallel=2 --fresh 2>&1)
check "cp 2 trains under mpirun (exit 0)" test $? -eq 0 || printf '%s\n' "$out" | tail -20
check "the log names the mesh with cp" grep -q "mesh: dp 1 x pp 1 x tp 1 x cp 2" <<<"$out"
same_curve() {  # A B KEY TOL: the rows of two runs' metrics.jsonl agree
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import json, sys
a, b, key, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
rows = lambda f: {r["step"]: r[key] for r in map(json.loads, open(f)) if key in r and "step" in r}
ra, rb = rows(a), rows(b)
assert ra and ra.keys() == rb.keys(), (sorted(ra), sorted(rb))
worst = max(abs(ra[s] - rb[s]) / max(1.0, abs(ra[s])) for s in ra)
assert worst <= tol, (key, worst)
print(key, "worst difference", worst)
PY
}
check "cp 2 losses = one process (1e-5)" same_curve runs/one/metrics.jsonl runs/cp2/metrics.jsonl loss 1e-5
check "cp 2 gradient norms = one process (1e-5)" same_curve runs/one/metrics.jsonl runs/cp2/metrics.jsonl grad_norm 1e-5
check "cp 2 validation loss = one process" same_curve runs/one/metrics.jsonl runs/cp2/metrics.jsonl val_loss 1e-5

out=$("$BIN" checkpoint inspect runs/cp2/checkpoints/step_00000003 2>&1)
check "checkpoint inspect shows the cp split" grep -q "saved on mesh dp 1 x pp 1 x tp 1 x cp 2" <<<"$out"
# Resume the cp 2 run from its step-3 checkpoint on one process: the rest
# equals the uninterrupted one-process run.
out=$("$BIN" train --config tiny.json "${common[@]}" --set name=cp2 \
      --checkpoint runs/cp2/checkpoints/step_00000003 2>&1)
check "a cp 2 checkpoint resumes at cp 1" test $? -eq 0
check "resumed at cp 1: the losses of steps 4-6 = one process" python3 - <<'PY'
import json
rows = lambda f: {r["step"]: r["loss"] for r in map(json.loads, open(f)) if "loss" in r and "step" in r}
a, b = rows("runs/one/metrics.jsonl"), rows("runs/cp2/metrics.jsonl")
for s in (4, 5, 6):
    assert abs(a[s] - b[s]) <= 1e-5 * max(1, abs(a[s])), (s, a[s], b[s])
PY

out=$("$BIN" plan --config tiny.json --set device_config.context_parallel=4 --set device_config.n_device_axis=[2,1,1] \
      --set data_config.document_masking=true 2>&1)
check "plan shows the cp split" grep -q "mesh: dp 2 x pp 1 x tp 1 x cp 4" <<<"$out"
check "plan shows the exchange per rank" grep -qE "context parallel: each sequence in 8 chunks, 2 per rank \(4 ranks\).*exchange [0-9.]+ GiB" <<<"$out"
json=$("$BIN" plan --config tiny.json --set device_config.context_parallel=2 --json 2>&1 | tail -n 1)
check "plan --json: context_parallel and cp_exchange_bytes" python3 -c "
import json, sys
j = json.loads(sys.argv[1]); assert j['context_parallel'] == 2 and j['cp_exchange_bytes'] > 0, j" "$json"

out=$("${MPIRUN[@]}" -np 2 "$BIN" bench --config tiny.json --steps 2 --set device_config.context_parallel=2 \
      --set data_config.T=64 --set model_config.T=64 2>&1)
check "bench at cp 2 reports the cp traffic and its share of the step" python3 -c "
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith('{')]
assert rows and rows[-1]['comm_bytes'].get('cp', 0) > 0, rows[-1:]
assert rows[-1]['context_parallel'] == 2 and 0 < rows[-1]['cp_exchange_share'] < 1, rows[-1]" "$out"

refused() {  # NAME EXPECTED... -- ARGS: exits non-zero and names every EXPECTED
  local name="$1" expected=() args=()
  shift
  while [ "$1" != "--" ]; do expected+=("$1"); shift; done
  shift
  out=$("$@" 2>&1)
  local rc=$? e
  [ $rc -ne 0 ] || { bad "$name (exit 0)" "$out"; return; }
  for e in "${expected[@]}"; do grep -qF "$e" <<<"$out" || { bad "$name (no '$e')" "$out"; return; }; done
  ok "$name"
}
refused "cp that does not split T is refused" "device_config.context_parallel = 3" "data_config.T (32)" -- \
  "$BIN" train --config tiny.json --set device_config.context_parallel=3 --fresh
refused "cp with the wrong number of ranks is refused" "context_parallel" "mpirun -np 2" -- \
  "$BIN" train --config tiny.json --set device_config.context_parallel=2 --fresh
mkdir -p bare && cp -r data/train data/val bare/
refused "document masking without an eot in the data names eot_token" "data_config.eot_token" "bare" -- \
  "$BIN" train --config tiny.json --set data_config.document_masking=true --set data_config.data_dir=bare --fresh
refused "a negative eot_token below -1 is refused" "data_config.eot_token" -- \
  "$BIN" train --config tiny.json --set data_config.eot_token=-2 --fresh
finish
