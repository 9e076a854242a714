#!/usr/bin/env bash
# A command-line fuzzer (fixed seed, so every run tries the same cases): each
# case is a subcommand with flags drawn from the real ones and values of
# hostile kinds (negative, huge, empty, not a number, JSON escapes, unknown
# flags). A case passes when the command succeeds, or fails with exit 1..127
# and an error naming a flag, a config key or a file. A crash (signal), a hang
# (timeout) or an error that names nothing fails the suite. The config-file
# half of the fuzzer is the unit test config_fuzz_test.
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
"$BIN" train --config tiny.json --name base --training_steps 1 --checkpoint_steps 1 --eval_steps 1 \
  --set inference_config.max_tokens=0 --fresh > base.log 2>&1 || bad "base run" "$(tail base.log)"

# Each case starts the binary (MPI + libtorch), so the CLI half is kept small;
# MESHTRAIN_FUZZ_CASES=500 for a longer local run.
CASES="${MESHTRAIN_FUZZ_CASES:-24}"
python3 - "$CASES" > cases.txt <<'PY'
import json, random, sys
rng = random.Random(1123)
values = ["-1", "-5", "0", "1", "2", "-0.5", "1e400", "99999999999999999999", "", "abc", "a\\nb", "\"q\"",
          "runs", "nan", "inf", "4.5", "1e9", "--", "-"]
common = ["--training_steps", "--checkpoint_steps", "--eval_steps", "--train_batch_size", "--seed", "--name",
          "--output_dir", "--n_device_axis", "--set"]
sets = ["lr.max_lr", "model_config.n_head", "data_config.val_batch_size", "watchdog_seconds", "name",
        "inference_config.max_tokens", "max_nan_skips", "nan_policy", "no_such_key", "model_config"]
sub = {
    "train": common + ["--fresh"],
    "eval": common + ["--checkpoint", "--random_weights"],
    "generate": common + ["--checkpoint", "--prompt", "--max_tokens", "--top_k", "--temperature", "--random_weights"],
    "plan": common + ["--device-memory-gb", "--device", "--json"],
    "prepare-data": ["--input", "--output", "--vocab-size", "--tokenizer", "--val-fraction", "--seed"],
    "checkpoint inspect": [],
    "checkpoint export": ["--output"],
}
flags_without_value = {"--fresh", "--random_weights", "--json"}
for _ in range(int(sys.argv[1])):
    name = rng.choice(list(sub))
    args = name.split()
    if name in ("checkpoint inspect", "checkpoint export"):
        args.append(rng.choice(["runs/base/checkpoints/step_00000001", "nowhere", ""]))
    elif name == "prepare-data":
        args += ["--input", rng.choice(["corpus", "nowhere", ""]), "--output", rng.choice(["fuzzdata", ""])]
    else:
        args += ["--config", "tiny.json", "--name", "base", "--training_steps", "1", "--set",
                 "inference_config.max_tokens=2"]
    for _ in range(rng.randint(1, 3)):
        flag = rng.choice(sub[name] + ["--no_such_flag"]) if sub[name] else "--no_such_flag"
        args.append(flag)
        if flag in flags_without_value:
            continue
        if flag == "--set":
            args.append(rng.choice(sets) + "=" + rng.choice(values))
        elif flag == "--n_device_axis":
            args += [rng.choice(values) for _ in range(3)]
        else:
            args.append(rng.choice(values))
    print(json.dumps(args))
PY

names_something() {  # LOG ARGS_JSON: the error names a flag, a key or a file of the case
  python3 - "$1" "$2" "$SRC/src/main.cpp" <<'PY'
import json, re, sys
log = open(sys.argv[1], errors="replace").read()
args = json.loads(sys.argv[2])
words = [a.split("=")[0] for a in args if a.startswith("--") or "=" in a]
words += [a for a in args if "/" in a or a.endswith(".json")]
words += [w for a in args if "=" in a for w in [a.split("=")[0].split(".")[-1]]]
if args[0] == "checkpoint":
    words.append("dir")  # the positional's name in CLI11's messages
sub_words = {"train", "eval", "generate", "plan", "prepare-data", "checkpoint", "inspect", "export"}
words += [a for a in args if len(a) >= 3 and not a.startswith("-") and a not in sub_words]
# A real flag of meshtrain named in the message counts too (a missing one, a conflict).
known_flags = re.findall(r"--[a-z][a-z_-]+", open(sys.argv[3]).read())
words += [f for f in known_flags if f not in ("--no_such_flag",)]
sys.exit(0 if any(w and w in log for w in words) or re.search(r"config key|config file", log) else 1)
PY
}

i=0 clean=0 succeeded=0
while IFS= read -r line; do
  i=$((i + 1))
  mapfile -t argv < <(python3 -c "import json,sys; print('\n'.join(json.loads(sys.argv[1])))" "$line")
  timeout 60 "$BIN" "${argv[@]}" > "case$i.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    succeeded=$((succeeded + 1)) clean=$((clean + 1))
  elif [ $rc -eq 124 ]; then
    bad "case $i hung: $line"
  elif [ $rc -ge 128 ]; then
    bad "case $i crashed (rc $rc): $line" "$(tail -5 "case$i.log")"
  elif names_something "case$i.log" "$line"; then
    clean=$((clean + 1))
  else
    bad "case $i: the error names no flag, key or file: $line" "$(tail -5 "case$i.log")"
  fi
done < cases.txt
echo "cli fuzz: $i cases, $clean handled cleanly ($succeeded succeeded, $((clean - succeeded)) refused naming a flag/key/file)"
check "cli fuzz: every case handled cleanly" test "$clean" -eq "$i"

finish
