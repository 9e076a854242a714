#!/usr/bin/env bash
# GPU results kept in the repository, without a GPU:
#  - scripts/gpu/gpu-summary.py on a faked gpu-check.sh output folder (step rows,
#    bench's and the anchors' JSON lines as they print them) writes
#    <date>-<device>-<commit>/ with summary.json (the ratios to the anchors,
#    every field bench printed, the step statuses), table.txt and
#    profile_<config>.txt, small text only; a second run never overwrites the
#    first; the commit comes from git, .git/HEAD by hand, or "nogit";
#  - scripts/gpu/perf-table.py renders the newest folder into a markdown file
#    between its markers, and --check fails on a stale file, passes on a fresh one;
#  - scripts/gpu/gpu-check.sh --bin with a faked binary, GPUs, mpirun and PyTorch
#    writes the results folder and runs cuda_test beside the binary at -np 1
#    and, with 2 GPUs, -np 2; without it, records that it did not; under
#    --time-limit a hung step is ended with its children and the results are
#    still written; --logs packs the logs;
#  - the repository's own docs/gpus.md is what perf-table.py gives from its
#    bench/results: the committed table can never go stale.
# The binary argument is not used.
# The checks' bash -c and Python snippets take their arguments as $1 ...:
# shellcheck disable=SC2016
source "$(dirname "$0")/common.sh" "$@"

SUMMARY="$SRC/scripts/gpu/gpu-summary.py"
TABLE="$SRC/scripts/gpu/perf-table.py"
# jtrue FILE 'STATEMENT; ...; EXPR': EXPR (Python, the file's JSON as s)
# holds after the statements; else print it.
jtrue() {
  python3 - "$1" "$2" <<'PY'
import json, sys
g = {"s": json.load(open(sys.argv[1]))}
*statements, expr = sys.argv[2].split("; ")
exec("\n".join(statements), g)
v = eval(expr, g)
if not v:
    print(f"   not true in {sys.argv[1]}: {sys.argv[2]}")
    sys.exit(1)
PY
}
has() { grep -qF -- "$2" "$1" || { echo "   '$2' not in $1:"; sed 's/^/   | /' "$1" | head -40; return 1; }; }

# A gpu-check.sh output folder: GPT-2 measured with a profile and both
# anchors, moe1B's bench failed, its compile anchor failed.
fake_out() {  # DIR
  mkdir -p "$1"
  printf '%s\t%s\t%s\t%s\n' \
    preflight ok 3 preflight.log  environment ok 1 environment.log  prebuilt ok 0 prebuilt.log \
    cuda_tests 'not run (no cuda_test beside --bin)' 0 '' \
    corpus ok 12 corpus.log  bench_gpt2-124m ok 95 bench_gpt2-124m.log \
    anchor_eager_gpt2-124m ok 61 anchor_eager_gpt2-124m.log \
    anchor_compile_gpt2-124m ok 120 anchor_compile_gpt2-124m.log \
    plan_moe1b-1gpu ok 2 plan_moe1b-1gpu.log  bench_moe1b-1gpu 'FAILED (exit 1)' 40 bench_moe1b-1gpu.log \
    anchor_eager_moe1b-1gpu ok 80 anchor_eager_moe1b-1gpu.log \
    anchor_compile_moe1b-1gpu 'FAILED (exit 137)' 300 anchor_compile_moe1b-1gpu.log > "$1/steps.tsv"
  printf '%s\n' 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0f0f0f0f-1111-2222-3333-444444444444)' \
    'name, memory.total [MiB], driver_version' 'NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06' \
    'torch 2.11.0+cu130 cuda 13.0 gpus 1' > "$1/environment.log"
  # bench: the model's estimate, then the measured step (a torn JSON line between).
  cat > "$1/bench_gpt2-124m.log" <<'EOF'
bench --device meta: gpt2-124m.json
{"gemm_tflop": 24.29, "attention_tflop": 2.16, "non_gemm_gb": 25.2, "kernels": 367, "host_syncs": 0, "est_step_ms": 63.1, "est_tokens_per_sec": 519019.0, "peak": "H100", "assumed": {"peak_tflops": 989.0, "bandwidth_tbps": 3.35, "gemm_efficiency": 0.75, "attention_efficiency": 0.25, "memory_efficiency": 0.4, "kernel_gap_us": 7.7}}
bench: 20 steps on 1 x NVIDIA H100 80GB HBM3 in 1.31 s, 32768 tokens per step
{"device": "NVIDIA H100 80GB HBM3", "torn
{"device": "NVIDIA H100 80GB HBM3", "attention_backend": "cudnn", "world": 1, "steps": 20, "seconds": 1.31, "tokens_per_step": 32768, "tokens_per_sec": 500000.0, "flops_per_token": 791000000.0, "tflops_per_device": 395.5, "peak_tflops": 989.0, "mfu": 0.4, "peak_memory_bytes": 32212254720, "peak_memory_kind": "allocated", "comm_bytes": {}, "comm_dtypes": {}, "profile": {"steps": 3, "step_ms": 75.4, "source": "cuda_kernels", "ms_per_step": {"gemm": 32.9, "attention": 8.9, "other": 28.5, "copy": 1.0}, "calls_per_step": {"gemm": 98, "attention": 24, "other": 236, "copy": 9}, "busy_ms_per_step": 71.3, "gap_ms_per_step": 4.1, "top": [{"name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "category": "gemm", "ms": 50.25, "calls": 72}, {"name": "rope_forward_kernel", "category": "other", "ms": 11.5, "calls": 36}], "trace": "/scratch/out/profile_gpt2-124m/trace.json"}, "last_loss": 7.25, "expert_parallel": 1, "all_to_all_seconds": 0.0, "all_to_all_share": 0.0, "paths": {"gemm": "cublaslt", "future_field": 3}}
EOF
  printf '%s\n' 'meshtrain bench: CUDA out of memory' > "$1/bench_moe1b-1gpu.log"
  echo '{"anchor": "eager", "device": "cuda", "tokens_per_sec": 250000.0, "pytorch_params": 124475904, "config": "gpt2-124m.json", "compile_mode": null}' \
    > "$1/anchor_eager_gpt2-124m.log"
  echo '{"anchor": "compile", "device": "cuda", "tokens_per_sec": 400000.0, "pytorch_params": 124475904, "config": "gpt2-124m.json"}' \
    > "$1/anchor_compile_gpt2-124m.log"
  echo '{"anchor": "eager", "device": "cuda", "tokens_per_sec": 60000.0, "pytorch_params": 1100000000, "config": "moe1b-1gpu.json"}' \
    > "$1/anchor_eager_moe1b-1gpu.log"
  echo 'Killed' > "$1/anchor_compile_moe1b-1gpu.log"
  # Large things a run leaves that must never reach the results folder.
  mkdir -p "$1/profile_gpt2-124m" "$1/data"
  head -c 300000 /dev/zero > "$1/profile_gpt2-124m/trace.json"
}

# --- gpu-summary.py ----------------------------------------------------------
fake_out out
python3 "$SUMMARY" out --results-root results --date 2026-12-01 --commit abc1234 > summary1.log 2>&1
rc=$?
check "gpu-summary.py exits 0 though steps failed (exit $rc)" test "$rc" -eq 0
R=results/2026-12-01-h100-80gb-hbm3-abc1234
check "results folder named <date>-<device slug>-<commit>" test -d "$R"
check "only summary.json, table.txt and one profile per config in it" \
  test "$(find "$R" -mindepth 1 -printf '%f\n' 2>/dev/null | sort | paste -sd' ')" = \
  "profile_gpt2-124m.txt profile_moe1b-1gpu.txt summary.json table.txt"
check "every file in it is small (< 16 KiB)" test -z "$(find "$R" -type f -size +16k)"
S="$R/summary.json"
check "summary: device, date, commit, torch" jtrue "$S" \
  's["device"] == "NVIDIA H100 80GB HBM3" and s["date"] == "2026-12-01" and s["commit"] == "abc1234" and s["torch"] == "2.11.0+cu130" and s["gpus"] == 1'
check "summary: tokens/s, MFU, TFLOP/s, peak memory, attention backend of GPT-2" jtrue "$S" \
  'c = s["configs"][0]; c["config"] == "gpt2-124m" and c["tokens_per_sec"] == 500000 and c["mfu"] == 0.4 and c["tflops_per_device"] == 395.5 and c["peak_memory_bytes"] == 32212254720 and c["attention_backend"] == "cudnn"'
check "summary: the anchors' tokens/s and the ratios (2.0 to eager, 1.25 to compile)" jtrue "$S" \
  'c = s["configs"][0]; c["eager_tokens_per_sec"] == 250000 and c["compile_tokens_per_sec"] == 400000 and abs(c["ratio_to_eager"] - 2.0) < 1e-12 and abs(c["ratio_to_compile"] - 1.25) < 1e-12 and c["anchors"]["compile"]["status"] == "ok"'
check "summary: the model's estimate and its fit to the profile" jtrue "$S" \
  'c = s["configs"][0]; c["est_tokens_per_sec"] == 519019 and c["model"]["kernels"] == 367 and abs(c["fitted"]["kernel_gap_us"] - 4.1e3 / 367) < 1e-9'
check "summary: fields it does not know are copied through (paths, the anchor's compile_mode)" jtrue "$S" \
  'c = s["configs"][0]; c["paths"] == {"gemm": "cublaslt", "future_field": 3} and "compile_mode" in c["anchors"]["eager"]'
check "summary: no path of that machine (the trace)" jtrue "$S" '"trace" not in s["configs"][0]["profile"]'
check "summary: the failed steps' statuses, no ratio where an anchor failed" jtrue "$S" \
  'st = {x["step"]: x["status"] for x in s["steps"]}; m = s["configs"][1]; st["bench_moe1b-1gpu"] == "FAILED (exit 1)" and st["anchor_compile_moe1b-1gpu"] == "FAILED (exit 137)" and m["status"] == "FAILED (exit 1)" and m["anchors"]["compile"]["status"] == "FAILED (exit 137)" and "ratio_to_compile" not in m and m["eager_tokens_per_sec"] == 60000 and s["ok"] is False'
check "summary: the CUDA tests left out by --bin are recorded, not a failure of their own" jtrue "$S" \
  '{"step": "cuda_tests", "status": "not run (no cuda_test beside --bin)", "seconds": 0} in s["steps"]'
check "OUT_DIR/summary.json written too, with the log names" jtrue out/summary.json \
  'any(x["log"] == "bench_gpt2-124m.log" for x in s["steps"]) and any(b.get("ratio_to_compile") == 1.25 for b in s["bench"])'
check "table.txt: the step table and GPT-2's row with its ratios" \
  bash -c 'grep -qE "^bench_moe1b-1gpu +FAILED \(exit 1\)" "$1" && grep -qE "^gpt2-124m \| NVIDIA H100 80GB HBM3 \| cudnn \| 500000 \| 519019 \| 395.5 \| 0.400 .*\| 2.000 \| 1.250$" "$1"' _ "$R/table.txt"
check "table.txt is what was printed" bash -c 'grep -qF "$(sed -n 2p "$1")" "$2" && grep -qF "$(tail -n 1 "$1")" "$2"' _ "$R/table.txt" summary1.log
check "profile_gpt2-124m.txt: ms per step by category, the gaps, the largest kernels" \
  bash -c 'grep -qE "^gemm +32\.90 +43\.6% +98$" "$1" && grep -qE "^gaps +4\.10 " "$1" && grep -qE "50\.25 +16\.75 +72 +gemm +sm90_xmma_gemm" "$1"' _ "$R/profile_gpt2-124m.txt"
check "profile_moe1b-1gpu.txt says none was recorded and why" has "$R/profile_moe1b-1gpu.txt" "none recorded (bench_moe1b-1gpu: FAILED (exit 1))"

# A second run of the same day, device and commit: a new folder, the first kept.
before="$(cat "$R"/* | sha256sum)"
sed -i 's/"tokens_per_sec": 500000.0/"tokens_per_sec": 520000.0/' out/bench_gpt2-124m.log
python3 "$SUMMARY" out --results-root results --date 2026-12-01 --commit abc1234 > summary2.log 2>&1
check "second run: written to <name>-2" jtrue "$R-2/summary.json" 's["configs"][0]["tokens_per_sec"] == 520000'
check "second run: the first folder unchanged" test "$(cat "$R"/* | sha256sum)" = "$before"
python3 "$SUMMARY" out --results-root results --date 2026-12-01 --commit abc1234 > summary3.log 2>&1
check "third run: <name>-3" test -f "$R-3/summary.json"

# The device from nvidia-smi when bench gave none; the commit without git.
mkdir -p repo/scripts/gpu gitless/bin
cp "$SUMMARY" repo/scripts/gpu/
ln -s "$(python3 -c 'import sys; print(sys.executable)')" gitless/bin/python3
fake_out out2
sed -i 's/^bench_gpt2-124m\tok/bench_gpt2-124m\tFAILED (exit 2)/' out2/steps.tsv
: > out2/bench_gpt2-124m.log
sed -i 's/NVIDIA H100 80GB HBM3/NVIDIA H200/' out2/environment.log
GITLESS=(env -i "PATH=$WORK/gitless/bin" "HOME=$WORK")
"${GITLESS[@]}" python3 repo/scripts/gpu/gpu-summary.py out2 --results-root results2 --date 2026-12-02 > nogit.log 2>&1
check "no git, no .git: device from nvidia-smi -L (h200), commit nogit" test -f results2/2026-12-02-h200-nogit/summary.json
mkdir -p repo/.git/refs/heads
echo 'ref: refs/heads/main' > repo/.git/HEAD
echo 0123456789abcdef0123456789abcdef01234567 > repo/.git/refs/heads/main
"${GITLESS[@]}" python3 repo/scripts/gpu/gpu-summary.py out2 --results-root results2 --date 2026-12-02 > githead.log 2>&1
check "no git command: the commit read from .git/HEAD by hand" jtrue results2/2026-12-02-h200-0123456/summary.json \
  's["commit_source"] == ".git/HEAD" and s["device_slug"] == "h200"'
echo 'feedbee dirty' > out2/COMMIT
"${GITLESS[@]}" python3 repo/scripts/gpu/gpu-summary.py out2 --results-root results2 --date 2026-12-02 --commit-file out2/COMMIT \
  > commitfile.log 2>&1
check "--commit-file (COMMIT beside a carried binary) comes first, its 'dirty' kept" \
  jtrue results2/2026-12-02-h200-feedbee/summary.json 's["commit"] == "feedbee" and s["uncommitted_changes"] is True'

# --- perf-table.py -------------------------------------------------------------
printf '%s\n' '# A README' 'before the table' '<!-- perf-table:begin -->' 'hand-typed, stale' \
  '<!-- perf-table:end -->' 'after the table' > README.md
python3 "$TABLE" --doc README.md --results-root empty-results --check > check0.log 2>&1
rc=$?
check "--check on a README whose section differs: exit 1 (exit $rc)" test "$rc" -eq 1
check "--check names the stale README" has check0.log "README.md is stale"
python3 "$TABLE" --doc README.md --results-root empty-results > write0.log 2>&1
check "no results folder: the text says so and names gpu-check.sh" \
  bash -c 'grep -q "No GPU result is recorded under" "$1" && grep -q "scripts/gpu/gpu-check.sh" "$1"' _ README.md
check "no results folder: --check passes once written" python3 "$TABLE" --doc README.md --results-root empty-results --check
mkdir -p results/2026-11-30-h200-0000000 results/notes
cp "$R/summary.json" results/2026-11-30-h200-0000000/   # older: never the newest
python3 "$TABLE" --doc README.md --results-root results > write1.log 2>&1
check "the newest folder (by date, then -3 after -2) is rendered" has README.md "2026-12-01-h100-80gb-hbm3-abc1234-3/"
check "the table: GPT-2's tokens/s, MFU, anchors, ratio, peak memory" \
  has README.md '| `gpt2-124m` | NVIDIA H100 80GB HBM3 | 2026-12-01 | `abc1234` | 520,000 | 40.0% | 250,000 | 400,000 | 1.300 | 30.0 GiB |'
check "the table: moe1B's failed bench and the steps not ok" \
  bash -c 'grep -qF "| \`moe1b-1gpu\`, FAILED (exit 1) |" "$1" && grep -q "Steps of that run not ok" "$1" && grep -qF "\`bench_moe1b-1gpu\` FAILED (exit 1)" "$1"' _ README.md
check "the text outside the markers is kept" \
  bash -c 'test "$(head -n 3 "$1")" = "$(printf "# A README\nbefore the table\n<!-- perf-table:begin -->")" && test "$(tail -n 2 "$1")" = "$(printf "<!-- perf-table:end -->\nafter the table")"' _ README.md
check "--check passes on the fresh README" python3 "$TABLE" --doc README.md --results-root results --check
python3 "$SUMMARY" out --results-root results --date 2026-12-03 --commit def5678 > summary4.log 2>&1
python3 "$TABLE" --doc README.md --results-root results --check > check1.log 2>&1
rc=$?
check "a newer results folder makes the README stale: --check exit 1 (exit $rc)" test "$rc" -eq 1
python3 "$TABLE" --doc README.md --results-root results > write2.log 2>&1
check "and rewriting it takes the newer folder" has README.md '| `def5678` | 520,000 |'
sed -i 's/| 520,000 |/| 520,001 |/' README.md
check "--check fails on a hand-edited number" bash -c '! python3 "$1" --doc README.md --results-root results --check 2>/dev/null' _ "$TABLE"
printf 'no markers\n' > nomarkers.md
python3 "$TABLE" --doc nomarkers.md --results-root results --check > nomarkers.log 2>&1
rc=$?
check "a README without the markers: exit 2, naming them (exit $rc)" bash -c '[ "$1" -eq 2 ] && grep -q "perf-table:begin" nomarkers.log' _ "$rc"

# --- gpu-check.sh --bin, faked ---------------------------------------------------
# Fakes: 2 GPUs (nvidia-smi), mpirun (records its arguments, runs the program
# once), ldd, PyTorch (PYTHON answers the torch one-liners and times the
# anchors), a meshtrain that prints bench's JSON lines, cuda_test beside it.
mkdir -p fake/scripts/gpu fakebin carry
cp "$SRC/scripts/gpu/gpu-check.sh" "$SUMMARY" fake/scripts/gpu/
printf '#!/bin/sh\necho "preflight stub: ok"\n' > fake/scripts/gpu/gpu-preflight.sh
cat > fakebin/nvidia-smi <<'EOF'
#!/bin/sh
[ "$1" = -L ] && for i in $(seq 0 $((${FAKE_GPUS:-2} - 1))); do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
[ "$1" = -L ] || echo "NVIDIA H100 80GB HBM3, 81559 MiB, 580.65.06"
EOF
cat > fakebin/mpirun <<'EOF'
#!/bin/sh
echo "mpirun $* MESHTRAIN_TEST_TMP=$MESHTRAIN_TEST_TMP" >> "$FAKE_LOG"
for last; do :; done
exec "$last"
EOF
printf '#!/bin/sh\necho "\tlibspdlog.so.1.10 => /usr/lib/libspdlog.so.1.10 (0x1)"\n' > fakebin/ldd
cat > fakebin/fakepy <<'EOF'
#!/usr/bin/env bash
case "$1" in
  */cpu-bench.py) k=eager t=250000.0; [[ " $* " == *" --compile "* ]] && k=compile t=400000.0
    echo "{\"anchor\": \"$k\", \"device\": \"cuda\", \"tokens_per_sec\": $t, \"pytorch_params\": 1}" ;;
  -c) if [[ "$2" == *__version__* ]]; then echo "torch 2.11.0+cu130 cuda 13.0 gpus 2"
      elif [[ "$2" == *torch* ]]; then echo "$FAKE_SITE"; else exec python3 "$@"; fi ;;
  *) exec python3 "$@" ;;
esac
EOF
cat > carry/meshtrain <<'EOF'
#!/usr/bin/env bash
case "$1" in
  prepare-data) while (($#)); do [ "$1" = --output ] && mkdir -p "$2" && echo '{}' > "$2/tokenizer.json"; shift; done ;;
  plan) [[ " $* " == *" --json "* ]] && echo '{"fits": true}' || echo "plan: fits" ;;
  bench) if [[ -n "${FAKE_SLOW_CONFIG:-}" && " $* " == *"$FAKE_SLOW_CONFIG"* && " $* " != *" --device meta "* ]]; then
           bash -c 'exec -a fake-slow-bench-child sleep 300'   # a child the time limit must end too
         fi
         if [[ " $* " == *" --device meta "* ]]; then
           echo '{"kernels": 367, "est_step_ms": 63.1, "est_tokens_per_sec": 519019.0, "assumed": {}}'
         else
           echo '{"device": "NVIDIA H100 80GB HBM3", "tokens_per_sec": 500000.0, "mfu": 0.4, "peak_memory_bytes": 1e9}'
         fi ;;
esac
EOF
printf '#!/bin/sh\necho "[  PASSED  ] 12 tests."\n' > carry/cuda_test
echo c0ffee1 > carry/COMMIT
chmod +x fakebin/* carry/* fake/scripts/gpu/*
FAKE_ENV=(env "PATH=$WORK/fakebin:$PATH" "PYTHON=$WORK/fakebin/fakepy" "FAKE_SITE=$WORK/site" "FAKE_LOG=$WORK/mpirun.log")
: > mpirun.log
day_before="$(date +%F)"
"${FAKE_ENV[@]}" bash fake/scripts/gpu/gpu-check.sh gc1 --bin carry/meshtrain --steps 2 --results-root gc-results > gc1.log 2>&1
rc=$?
day_after="$(date +%F)"
G="$(find gc-results -maxdepth 1 -name '*-h100-80gb-hbm3-c0ffee1' | head -n 1)"
check "gpu-check --bin: all steps pass with the fakes (exit $rc)" test "$rc" -eq 0
check "gpu-check --bin: results folder <today>-h100-80gb-hbm3-<COMMIT beside the binary>" \
  bash -c '[[ "$1" == gc-results/@($2|$3)-h100-80gb-hbm3-c0ffee1 ]] && test -f "$1/summary.json"' _ "$G" "$day_before" "$day_after"
check "gpu-check --bin: cuda_test beside the binary ran at -np 1 and, with 2 GPUs, -np 2" jtrue "$G/summary.json" \
  'st = {x["step"]: x["status"] for x in s["steps"]}; st.get("cuda_test_np1") == "ok" and st.get("cuda_test_np2") == "ok" and "cuda_test_np8" not in st and s["ok"] is True'
check "gpu-check --bin: mpirun got ctest's flags, -np 1 and 2, a scratch folder each" \
  bash -c 'grep -q -- "--oversubscribe --bind-to none .* -np 1 .*/carry/cuda_test MESHTRAIN_TEST_TMP=.*/cuda_test.np1$" "$1" && grep -q -- "-np 2 .*cuda_test.np2$" "$1" && [ "$(wc -l < "$1")" -eq 2 ]' _ mpirun.log
check "gpu-check --bin: the ratios in the kept summary" jtrue "$G/summary.json" \
  'c = s["configs"][0]; c["ratio_to_eager"] == 2.0 and c["ratio_to_compile"] == 1.25'
rm carry/cuda_test
: > mpirun.log
"${FAKE_ENV[@]}" FAKE_GPUS=8 bash fake/scripts/gpu/gpu-check.sh gc2 --bin carry/meshtrain --steps 2 --results-root gc-results \
  > gc2.log 2>&1
rc=$?
check "gpu-check --bin without cuda_test: still exit 0 (exit $rc)" test "$rc" -eq 0
check "gpu-check --bin without cuda_test: recorded as not run, nothing launched" \
  bash -c 'grep -qE "^cuda_tests +not run \(no cuda_test beside --bin\)" "$1" && [ ! -s mpirun.log ]' _ gc2.log
check "gpu-check: a second run of the day gets its own folder" test "$(find gc-results -maxdepth 1 -name '*-h100-80gb-hbm3-c0ffee1*' | wc -l)" -eq 2
printf '#!/bin/sh\necho "[  SKIPPED ] CUDA-only test: torch sees no CUDA device in this build/machine"\n' > carry/cuda_test
chmod +x carry/cuda_test
"${FAKE_ENV[@]}" FAKE_GPUS=1 bash fake/scripts/gpu/gpu-check.sh gc3 --bin carry/meshtrain --steps 2 --results-root gc-results \
  > gc3.log 2>&1
rc=$?
check "gpu-check: cuda_test skipping for want of a GPU fails the step and the run (exit $rc)" \
  bash -c '[ "$1" -ne 0 ] && grep -qE "^cuda_test_np1 +FAILED" "$2" && ! grep -q "^cuda_test_np2" "$2"' _ "$rc" gc3.log

# --time-limit: moe1B's bench hangs (a child sleeping 300 s); the step is ended
# with its child when the limit (less the reserve) is up, the steps after it
# are not run, the summary and results folder are still written; --logs packs
# the logs.
start=$(date +%s)
"${FAKE_ENV[@]}" FAKE_GPUS=1 FAKE_SLOW_CONFIG=moe1b-1gpu.json GPU_CHECK_RESERVE=2 bash fake/scripts/gpu/gpu-check.sh gc4 \
  --bin carry/meshtrain --steps 2 --results-root gc4-results --time-limit 16 --logs gc4-logs.tar.gz > gc4.log 2>&1
rc=$?
took=$(( $(date +%s) - start ))
check "--time-limit 16: done in time, non-zero (exit $rc, ${took}s)" bash -c '[ "$1" -ne 0 ] && [ "$2" -le 30 ]' _ "$rc" "$took"
check "--time-limit: no child of the ended step left running" bash -c '! pgrep -f "fake-slow-bench-[c]hild"'
G4="$(find gc4-results -mindepth 1 -maxdepth 1 -type d | head -n 1)"
check "--time-limit: the hung step timed out, the later ones not run, the earlier ones ok" jtrue "$G4/summary.json" \
  'st = {x["step"]: x["status"] for x in s["steps"]}; st["bench_gpt2-124m"] == "ok" and st["bench_moe1b-1gpu"] == "timed out (time limit)" and st["anchor_compile_moe1b-1gpu"] == "not run (time limit)" and st["anchor_eager_moe1b-1gpu"] == "not run (time limit)" and s["ok"] is False'
check "--time-limit: GPT-2's ratio still kept" jtrue "$G4/summary.json" 's["configs"][0]["ratio_to_compile"] == 1.25'
check "--time-limit: the table names the timed-out step" grep -qE "^bench_moe1b-1gpu +timed out \(time limit\)" gc4.log
check "--time-limit: no job-control notice in the output" bash -c '! grep -q "Terminated" gc4.log'
check "--logs: steps.tsv, summary.json and the step logs packed, no data or traces" bash -c \
  'l="$(tar -tzf gc4-logs.tar.gz)" && grep -qx steps.tsv <<<"$l" && grep -qx summary.json <<<"$l" && grep -q "bench_gpt2-124m.log$" <<<"$l" && ! grep -q data/ <<<"$l"'
"${FAKE_ENV[@]}" bash fake/scripts/gpu/gpu-check.sh gc5 --bin carry/meshtrain --time-limit 10 > gc5.log 2>&1
rc=$?
check "--time-limit at or under the reserve: refused, naming it (exit $rc)" \
  bash -c '[ "$1" -eq 2 ] && grep -q -- "--time-limit .10. must be whole seconds above GPU_CHECK_RESERVE" gc5.log' _ "$rc"

# --- the repository itself ---------------------------------------------------------
out="$(python3 "$TABLE" --results-root "$SRC/bench/results" --check 2>&1)"
rc=$?
check "the repository's table (docs/gpus.md, perf-table.py's default) is what bench/results gives (exit $rc: $out)" \
  test "$rc" -eq 0
check "the default file is docs/gpus.md" grep -q "docs/gpus.md is up to date" <<<"$out"
check "--readme still names the file (its old name)" python3 "$TABLE" --readme "$SRC/docs/gpus.md" \
  --results-root "$SRC/bench/results" --check
finish
