#!/usr/bin/env bash
# plan and bench as a user runs them: parameter counts of the shipped configs,
# the memory verdict, JSON lines that parse, and a short timed run.
source "$(dirname "$0")/common.sh" "$@"

# JSON field of the last line of $1 that parses as an object.
field() { python3 -c "
import json,sys
rows=[json.loads(l) for l in sys.argv[1].splitlines() if l.startswith('{')]
print(rows[-1][sys.argv[2]])" "$1" "$2"; }

out=$("$BIN" plan --config "$SRC/configs/moe1b.json" --device cuda 2>&1)
check "plan moe1b exits 0" test $? -eq 0
echo "$out" | sed 's/^/       # /'
check "plan moe1b prints total and active params" grep -q "parameters: .* total .* active per token" <<<"$out"
json=$("$BIN" plan --config "$SRC/configs/moe1b.json" --device cuda --json 2>&1)
total=$(field "$json" total_params)
active=$(field "$json" active_params)
echo "       # moe1b: total $total, active $active"
check "moe1b: ~1B active of a larger total" python3 -c "import sys; sys.exit(0 if $active < $total and 0.5e9 < $active < 2e9 else 1)"
# moe1b.json runs FSDP (zero_stage 3) as the Jaxformer run did: at rest a rank
# holds weights, gradients and moments of 1/dp of its stage's parameters.
check "moe1b plan is zero_stage 3" test "$(field "$json" zero_stage)" = 3
z0=$("$BIN" plan --config "$SRC/configs/moe1b.json" --device cuda --set zero_stage=0 --json 2>&1)
echo "       # moe1b per rank: zero_stage 3 weights $(field "$json" weights_bytes) B, zero_stage 0 $(field "$z0" weights_bytes) B"
check "moe1b zero_stage 3 weights, grads and moments are ~1/8 of zero_stage 0's" python3 -c "
import sys
w3, g3, o3, w0, g0, o0 = map(float, sys.argv[1:])
ok = all(0.124 < a / b <= 0.126 for a, b in ((w3, w0), (g3, g0), (o3, o0)))
sys.exit(0 if ok else 1)" "$(field "$json" weights_bytes)" "$(field "$json" grads_bytes)" "$(field "$json" optimizer_bytes)" \
  "$(field "$z0" weights_bytes)" "$(field "$z0" grads_bytes)" "$(field "$z0" optimizer_bytes)"

# The Jaxformer moe1B file exactly as published: Jaxformer's own counts, on its mesh 8 x 2 x 2.
json=$("$BIN" plan --config "$SRC/configs/jaxformer/moe1B.json" --json 2>&1)
check "plan jaxformer/moe1B.json exits 0" test $? -eq 0
echo "       # jaxformer moe1B: total $(field "$json" total_params), active $(field "$json" active_params)"
check "jaxformer moe1B: 949,248,384 parameters" test "$(field "$json" total_params)" = 949248384
check "jaxformer moe1B: 343,321,728 active" test "$(field "$json" active_params)" = 343321728
check "jaxformer moe1B: the built model agrees" test "$(field "$json" built_params) $(field "$json" built_active_params) $(field "$json" formula_checked)" = "949248384 343321728 True"
check "jaxformer moe1B: planned on the published mesh 8 x 2 x 2" test "$(field "$json" mesh)" = "[8, 2, 2]"
check "jaxformer moe1B: memory per rank reported" python3 -c "import sys; sys.exit(0 if 0 < $(field "$json" total_bytes) else 1)"
out=$("$BIN" plan --config "$SRC/configs/jaxformer/moe1B.json" 2>&1)
echo "$out" | sed 's/^/       # /'
check "jaxformer moe1B: text plan names both counts" grep -q "parameters: 949248384 total .* 343321728 active per token" <<<"$out"

out=$("$BIN" plan --config "$SRC/configs/gpt2-124m.json" --device cuda --device-memory-gb 80 2>&1)
check "plan gpt2-124m exits 0" test $? -eq 0
check "gpt2-124m: formula checked against the model built on the meta device" grep -q "formula checked against the built model: OK" <<<"$out"
check "gpt2-124m fits in 80 GiB" grep -q "fits in 80 GiB: yes" <<<"$out"
json=$("$BIN" plan --config "$SRC/configs/gpt2-124m.json" --device cuda --device-memory-gb 80 --json 2>&1)
total=$(field "$json" total_params)
echo "       # gpt2-124m: total $total"
check "gpt2-124m is 124M-ish" python3 -c "import sys; sys.exit(0 if 120e6 < $total < 130e6 else 1)"
check "gpt2-124m JSON says it fits" test "$(field "$json" fits)" = True
out=$("$BIN" plan --config "$SRC/configs/gpt2-124m.json" --device cuda --device-memory-gb 1 2>&1)
check "gpt2-124m does not fit in 1 GiB" grep -q "fits in 1 GiB: no" <<<"$out"
out=$("$BIN" plan --config "$SRC/configs/gpt2-124m.json" --n_device_axis 2 2 2 --set zero_stage=1 2>&1)
check "plan takes a mesh and --set" grep -q "mesh: dp 2 x pp 2 x tp 2" <<<"$out"
# 12 layers, pp 4 x 3 virtual stages, 8 microbatches: bubble 3 / (3 * 8 + 3).
il=(--n_device_axis 1 4 1 --set data_config.micro_batch_size=4 --set pipeline_schedule=interleaved)
out=$("$BIN" plan --config "$SRC/configs/gpt2-124m.json" "${il[@]}" --set virtual_stages=3 2>&1)
check "plan shows the interleaved bubble" grep -q "interleaved, 3 virtual stages per rank; bubble .* = 0.111" <<<"$out"
check "plan shows a rank's chunks" grep -q "stage 1: layers \[1, 2) \[5, 6) \[9, 10)" <<<"$out"
out=$("$BIN" plan --config "$SRC/configs/gpt2-124m.json" "${il[@]}" --set virtual_stages=5 2>&1)
check "plan refuses 12 layers in pp 4 x 5 virtual stages" grep -q "multiple of pp \* virtual_stages" <<<"$out"

prepare_corpus
write_config tiny.json
out=$("$BIN" plan --config tiny.json 2>&1)
check "tiny: formula checked against the built model" grep -q "formula checked against the built model: OK" <<<"$out"
out=$("$BIN" bench --config tiny.json --steps 3 --warmup 1 2>&1)
check "bench exits 0" test $? -eq 0
echo "$out" | grep -v '^\[' | sed 's/^/       # /'
tps=$(field "$out" tokens_per_sec)
check "bench JSON parses, tokens_per_sec > 0 ($tps)" python3 -c "import sys; sys.exit(0 if float('$tps') > 0 else 1)"
check "bench on CPU leaves MFU out" test "$(field "$out" mfu)" = None
# Which path each fused operator took (ops/paths.h): 3 timed steps of the tiny
# dense model, every RMSNorm by 16-byte vectors, none fallen back.
check "bench JSON paths: RMSNorm both ways, all by 16-byte vectors" python3 -c "
import json, sys
j = json.loads([l for l in sys.argv[1].splitlines() if l.startswith('{')][-1])
p = j['paths']
for op in ('rms_norm_fwd', 'rms_norm_bwd', 'cross_entropy_rows'):
    assert p[op]['fast'] > 0 and p[op]['fallback'] == 0, (op, p[op])
    assert p[op]['fast_paths'] == {'16-byte vectors': p[op]['fast']}, (op, p[op])
" "$out"
check "bench prints the fused operator paths" grep -q "fused operator paths" <<<"$out"
# device_config.cuda_graphs on the CPU: steps 2 and 3 checked, then eager.
out=$("$BIN" bench --config tiny.json --steps 2 --warmup 1 --set device_config.cuda_graphs=true 2>&1)
check "bench with cuda_graphs on CPU: checked, then eager" grep -q '"cuda_graphs":"eager"' <<<"$out"
check "bench with cuda_graphs: the check is logged" grep -q "steps 2 and 3 were checked for graph safety" <<<"$out"
out=$("$BIN" bench --config tiny.json --steps 2 --warmup 0 --peak-tflops 1 2>&1)
check "bench --peak-tflops gives an MFU" python3 -c "import sys; sys.exit(0 if float('$(field "$out" mfu)') > 0 else 1)"
check "bench leaves no run dir behind" test ! -e runs/bench

# bench --profile: the profiled steps' time by category, and a Chrome trace.
out=$("$BIN" bench --config tiny.json --steps 1 --warmup 1 --profile prof --profile-steps 2 2>&1)
check "bench --profile exits 0" test $? -eq 0
echo "$out" | grep -A8 '^profile:' | sed 's/^/       # /'
check "bench --profile prints the categories and the gaps" grep -q '^  gaps ' <<<"$out"
check "bench --profile: the trace is Chrome JSON with events" python3 -c "
import json; t = json.load(open('prof/trace_rank_00000.json')); assert len(t['traceEvents']) > 100"
check "bench --profile: JSON profile, GEMMs found, self times within the step" python3 -c "
import json, sys
p = [json.loads(l) for l in sys.argv[1].splitlines() if l.startswith('{')][-1]['profile']
assert p['steps'] == 2 and p['source'] == 'cpu_operators_self', p
ms = p['ms_per_step']
assert ms['gemm'] > 0 and ms['attention'] > 0, ms
assert abs(sum(ms.values()) - p['busy_ms_per_step']) < 1e-6
assert 0 < p['busy_ms_per_step'] <= p['step_ms'] * 1.01, p
assert any(t['name'] == 'aten::mm' and t['category'] == 'gemm' for t in p['top'])" "$out"
# comm_bytes: each axis's payload per step and rank. dp 2 all-reduces every
# fp32 gradient once per step (plus the step's few statistics); tp 2 moves
# activations instead, and the axes of size 1 move nothing.
params=$(field "$("$BIN" plan --config tiny.json --json 2>&1)" total_params)
out=$(timeout 300 "${MPIRUN[@]}" -np 2 "$BIN" bench --config tiny.json --n_device_axis 2 1 1 --steps 2 --warmup 1 2>&1)
check "bench on dp 2 exits 0" test $? -eq 0
comm=$(field "$out" comm_bytes)
echo "       # dp 2: comm_bytes $comm, $params parameters"
check "dp 2: dp moves 4 bytes per parameter per step, tp and pp nothing" python3 -c "
import ast, sys
c, p = ast.literal_eval(sys.argv[1]), int(sys.argv[2])
assert 4 * p <= c['dp'] <= 4 * p + 1024 and c['tp'] == 0 and c['pp'] == 0, (c, 4 * p)" "$comm" "$params"
out=$(timeout 300 "${MPIRUN[@]}" -np 2 "$BIN" bench --config tiny.json --n_device_axis 1 1 2 --steps 2 --warmup 1 2>&1)
comm=$(field "$out" comm_bytes)
echo "       # tp 2: comm_bytes $comm"
check "tp 2: tp moves bytes, dp and pp nothing" python3 -c "
import ast, sys
c = ast.literal_eval(sys.argv[1])
assert c['tp'] > 0 and c['dp'] == 0 and c['pp'] == 0, c" "$comm"

out=$("$BIN" bench --config tiny.json --steps 1 --warmup 0 --profile prof --profile-steps 0 2>&1)
check "bench --profile-steps 0 is refused, naming the flag" grep -q -- "--profile-steps" <<<"$out"
finish
