#!/usr/bin/env bash
# plan --search as a user runs it: the ranked table and the JSON of every mesh
# that fits (each divides N, fits the usable memory, best first), the seed's
# BigScience question (104B on 128 GPUs of 32 GB, 4 a node), the search's time
# at 4,096 GPUs, and the refusals (no mesh fits, an unknown preset, N not a
# multiple of the GPUs a node): each names its reason and exits non-zero.
source "$(dirname "$0")/common.sh" "$@"

MOE="$SRC/configs/jaxformer/moe1B.json"
BIG="$SRC/configs/published/bigscience-tr8-104b.json"

out=$("$BIN" plan --config "$MOE" --search --gpus 8 --gpu h100-sxm 2>&1)
check "search moe1B on 8 x h100-sxm exits 0" test $? -eq 0
echo "$out" | sed 's/^/       # /'
check "search prints the hardware and every assumption" grep -q "^assumed overlap: " <<<"$out"
check "search prints the ranked table's header" grep -q "^  #    dp   pp  tp  cp  ep zero  v  mbs recompute" <<<"$out"
check "search prints 10 rows at most" test "$(grep -cE '^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-3] ' <<<"$out")" -le 10
check "search counts what it planned" grep -qE "^[0-9]+ meshes planned: [0-9]+ fit" <<<"$out"

# The JSON: every candidate's fields, N GPUs each, within the usable memory, best first.
"$BIN" plan --config "$MOE" --search --gpus 64 --gpu h100-sxm --json > moe64.json 2> moe64.err
check "search --json moe1B on 64 exits 0" test $? -eq 0
check "search --json: candidates with every field, dividing N, fitting, ranked" python3 - moe64.json <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
c = j["candidates"]
assert c, "no candidates"
keys = ["dp", "pp", "tp", "cp", "ep", "zero_stage", "virtual_stages", "micro_batch_size", "recompute",
        "memory_gib", "tokens_per_sec", "mfu", "parts", "step_s"]
for x in c:
    missing = [k for k in keys if k not in x]
    assert not missing, missing
    assert x["dp"] * x["pp"] * x["tp"] * x["cp"] == j["gpus"] == 64, x
    assert x["tp"] <= 8, x
    assert x["memory_gib"] <= j["usable_memory_gib"] + 1e-9, x
    assert (x["dp"] * x["cp"]) % x["ep"] == 0, x
    assert 0 < x["mfu"] < 1, x
    assert abs(sum(x["parts"].values()) - x["step_s"]) < 1e-9 * x["step_s"] + 1e-12, x
ts = [x["tokens_per_sec"] for x in c]
assert ts == sorted(ts, reverse=True), "not ranked"
assert any(x["ep"] > 1 for x in c), "no expert parallelism tried"
print(f"       # moe1B on 64: {len(c)} meshes fit, best dp {c[0]['dp']} pp {c[0]['pp']} tp {c[0]['tp']} "
      f"ep {c[0]['ep']}: {c[0]['tokens_per_sec']:.0f} tokens/s, {j['seconds']:.2f} s")
PY

# The seed's question: BigScience's 104B on 128 GPUs of 32 GB, 4 a node, ZeRO-1 at most.
out=$("$BIN" plan --config "$BIG" --search --gpus 128 --gpu v100-32 --gpus-per-node 4 --zero-stages 0,1 2>&1)
check "search 104B on 128 x v100-32 exits 0" test $? -eq 0
echo "$out" | sed 's/^/       # /'
check "104B: tp 4 at most in the table" python3 -c "
import re, sys
rows = [l.split() for l in sys.argv[1].splitlines() if re.match(r'^ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-3] ', l)]
sys.exit(0 if rows and all(int(r[3]) <= 4 for r in rows) else 1)" "$out"
check "104B: the smallest pp that fits at tp 4" grep -qE "^smallest pp that fits, by tp:.*tp 4: pp [0-9]+" <<<"$out"
check "104B: tp 8 refused, one line a family, because it spans nodes" \
  grep -qE "^  tp 8 x pp [0-9]+: tp 8 spans nodes of 4 GPUs" <<<"$out"
check "104B: a tp 4 family refused for its memory" grep -qE "^  tp 4 x pp [0-9]+: needs at least [0-9.]+ GiB a rank" <<<"$out"

# Under a minute at 4,096 GPUs (the search times itself; the wall clock too).
start=$(date +%s.%N)
"$BIN" plan --config "$SRC/configs/published/megatron-gpt-1t.json" --search --gpus 4096 --gpu h100-sxm --json \
  > big4096.json 2> big4096.err
rc=$?
wall=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$start" "$(date +%s.%N)")
check "search 1T on 4096 x h100-sxm exits 0" test $rc -eq 0
echo "       # 1T on 4096: $(python3 -c "import json; j=json.load(open('big4096.json')); print(len(j['candidates']), 'fit of', j['evaluated'], 'planned,', round(j['seconds'], 1), 's searching')"), $wall s in all"
check "search at 4096 GPUs takes under a minute" python3 -c "import sys; sys.exit(0 if float('$wall') < 60 else 1)"

# Refusals: the reason named, a non-zero exit.
out=$("$BIN" plan --config "$BIG" --search --gpus 8 --gpu a100-40 2>&1)
rc=$?
check "no mesh fits: exit non-zero" test $rc -ne 0
check "no mesh fits: says so, with the families' reasons" grep -q "plan --search: no mesh of 8 GPUs fits (a100-40, 36 GiB usable); tp 1 x pp 1: needs at least" <<<"$out"
out=$("$BIN" plan --config "$MOE" --search --gpus 8 --gpu h900 2>&1)
rc=$?
check "unknown preset: exit non-zero" test $rc -ne 0
check "unknown preset: named, with the known ones" grep -q "unknown GPU preset 'h900'; known: h100-sxm, h200, a100-80, a100-40, v100-32" <<<"$out"
out=$("$BIN" plan --config "$MOE" --search --gpus 12 --gpu h100-sxm 2>&1)
rc=$?
check "12 GPUs of 8 a node: exit non-zero" test $rc -ne 0
check "12 GPUs of 8 a node: whole nodes only" grep -q "\-\-gpus 12 is not a multiple of --gpus-per-node 8" <<<"$out"
out=$("$BIN" plan --config "$MOE" --search --gpu h100-sxm 2>&1)
rc=$?
check "--search without --gpus: exit non-zero, named" test $rc -ne 0 -a -n "$(grep 'plan --search needs --gpus N' <<<"$out")"
out=$("$BIN" plan --config "$MOE" --zero-stages 1 2>&1)
rc=$?
check "--zero-stages without --search: exit non-zero, named" test $rc -ne 0 -a -n "$(grep 'applies to --search only' <<<"$out")"

finish
