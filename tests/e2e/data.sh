#!/usr/bin/env bash
# prepare-data on the inputs people have, as a user runs it: one plain text
# file, JSON Lines compressed with gzip, a user error that leaves nothing
# behind; then training on a blend of the two (data_config.datasets) and on
# nanoGPT's headerless train.bin/val.bin (data_config.format: "nanogpt").
source "$(dirname "$0")/common.sh" "$@"

# One plain text file, tiny-shakespeare style: paragraphs separated by blank lines.
python3 - <<'PY'
import gzip, json
docs = open("/usr/share/games/fortunes/computers", encoding="utf-8", errors="replace").read().split("\n%\n")
docs = [d.strip() for d in docs if d.strip()]
open("input.txt", "w").write("\n\n".join(docs) + "\n")
with gzip.open("docs.jsonl.gz", "wt") as f:
    for d in docs:
        f.write(json.dumps({"id": 1, "text": d}) + "\n")
PY
out=$("$BIN" prepare-data --input input.txt --output plain --vocab-size 320 --workers 2 2>&1)
rc=$?
check "prepare-data takes one plain text file" test $rc -eq 0
[ $rc -eq 0 ] || bad "prepare-data output" "$out"
check "its documents are paragraphs, some in val" python3 -c "
import json; m = json.load(open('plain/manifest.json'))
assert m['val']['documents'] >= 1 and m['train']['documents'] > 100, m"

out=$("$BIN" prepare-data --input docs.jsonl.gz --output jsonl --tokenizer plain/tokenizer.json 2>&1)
rc=$?
check "prepare-data takes gzip JSON Lines with an existing tokenizer" test $rc -eq 0
[ $rc -eq 0 ] || bad "prepare-data output" "$out"
check "the JSON syntax is not trained on" python3 -c "
import json; m = json.load(open('jsonl/manifest.json'))
assert m['files'][0]['format'] == 'jsonl' and m['vocab_size'] == 320, m"

out=$("$BIN" prepare-data --input docs.jsonl.gz --output wrongkey --vocab-size 300 --text-key body 2>&1)
rc=$?
check "a missing --text-key field fails" test $rc -ne 0
check "the error names the file, line and flag" grep -q "docs.jsonl.gz:1.*--text-key" <<<"$out"
check "nothing half-written" test ! -e wrongkey

write_config tiny.json
python3 - <<'PY'
import json
c = json.load(open("tiny.json"))
c["data_config"]["data_dir"] = "plain"
c["data_config"]["datasets"] = [{"path": "plain", "weight": 3}, {"path": "jsonl", "weight": 1}]
json.dump(c, open("blend.json", "w"), indent=1)
PY
out=$("$BIN" train --config blend.json --training_steps 3 --checkpoint_steps 3 --fresh 2>&1)
rc=$?
check "training on a blend of two datasets" test $rc -eq 0
[ $rc -eq 0 ] || bad "train output" "$out"

# nanoGPT's prepare.py output: raw uint16 tokens, no header.
mkdir -p nano
python3 - <<'PY'
import random, struct
rng = random.Random(0)
for name, n in (("train.bin", 20000), ("val.bin", 4000)):
    open("nano/" + name, "wb").write(struct.pack(f"<{n}H", *[rng.randrange(320) for _ in range(n)]))
PY
out=$("$BIN" train --config tiny.json --set data_config.data_dir=nano --set data_config.format=nanogpt \
      --training_steps 2 --checkpoint_steps 2 --fresh 2>&1)
rc=$?
check "training on nanoGPT's train.bin/val.bin" test $rc -eq 0
[ $rc -eq 0 ] || bad "train output" "$out"
out=$("$BIN" train --config tiny.json --set data_config.data_dir=nano --training_steps 2 --fresh 2>&1)
check "without format nanogpt the folder layout is explained" grep -q "nano" <<<"$out"

finish
