#!/usr/bin/env bash
# launch-ssh-tmux.sh end to end on the test bed (tests/hosts/testbed.sh): two
# hosts sharing a "home" (this folder), each preparing its own workdir in a
# tmux session (--binary: the prebuilt meshtrain, so CI does not build twice),
# --env reaching the preparation and the ranks, the first host starting one
# mpirun over both; the run equals one process. An unreachable host fails the
# launch naming it, and the session already started on the other host is
# stopped (it waited for it forever). Skipped (exit 77, reason printed) only
# where namespaces cannot be made.
source "$(dirname "$0")/common.sh" "$@"
source "$SRC/tests/hosts/testbed.sh"
bed_up "$WORK/bed" 2
command -v tmux >/dev/null || { bad "tmux is not installed: run scripts/setup.sh"; finish; }

prepare_corpus
write_config tiny.json
# The repository the hosts clone: the config, with absolute (shared) paths.
mkdir repo
python3 - tiny.json repo/run.json "$PWD" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["data_config"]["data_dir"] = sys.argv[3] + "/data"
c["output_dir"] = sys.argv[3] + "/runs"
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
git -C repo init -q -b main && git -C repo add run.json &&
  git -C repo -c user.name=t -c user.email=t@t commit -qm config || bad "test repository"
S=(--set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1 --checkpoint_steps 100
   --set inference_config.max_tokens=0 --training_steps 4 --fresh)
"$BIN" train --config tiny.json "${S[@]}" --name one > one.log 2>&1 || bad "one process" "$(tail one.log)"

cat > envbin <<WRAP
#!/bin/sh
echo "\$MT_PROBE" > "$PWD/env.\$(hostname).\$\$"
exec "$BIN" "\$@"
WRAP
chmod +x envbin
L=(bash "$SRC/scripts/launch-ssh-tmux.sh" --repo "$PWD/repo" --workdir "$PWD/home/{host}/mt" --session mtt
   --config run.json --binary "$PWD/envbin" --env MT_PROBE=hello --connect-timeout 3 --prepare-timeout 60)
on_host_for 60 h1 "${L[@]}" --hosts h1,h2 -- "${S[@]}" --name tm --n_device_axis 2 1 1 > launch.log 2>&1
rc=$?
check "ssh-tmux: launch exits 0 (rc $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -20 launch.log
# The run goes on in tmux: wait for its last step (bounded).
for _ in $(seq 900); do
  n=$(grep -c '"loss"' runs/tm/metrics.jsonl 2>/dev/null)
  [ "${n:-0}" -ge 4 ] && break
  sleep 0.2
done
for _ in $(seq 100); do ls runs/tm/checkpoints/step_00000004 > /dev/null 2>&1 && break; sleep 0.2; done
check "ssh-tmux: each host cloned its own workdir in the shared home" test -d home/h1/mt/.git -a -d home/h2/mt/.git
check "ssh-tmux: --env reaches the ranks on both hosts" bash -c "cat env.h1.* env.h2.* 2>/dev/null | grep -qx hello"
out=$(python3 "$SRC/tests/hosts/compare.py" runs/tm/metrics.jsonl runs/one/metrics.jsonl) &&
  ok "ssh-tmux: the run over h1,h2 = one process ($out)" ||
  { bad "ssh-tmux: the run" "$out"; on_host h1 tmux capture-pane -p -t mtt:0 | tail -20; }

# One host that does not answer: the launch fails naming it, and h1's session
# (which would wait for it) is stopped.
dead=$(bed_ip 9)
start=$(date +%s)
on_host_for 60 h1 "${L[@]}" --session mtdead --hosts "h1,$dead" -- "${S[@]}" --name dead > dead.log 2>&1
rc=$? took=$(($(date +%s) - start))
check "ssh-tmux, unreachable host: exit 1 in ${took} s (rc $rc)" test $rc -eq 1 -a $took -le 20
check "ssh-tmux, unreachable host: named" grep -q "ssh to $dead failed" dead.log
if on_host h1 tmux has-session -t mtdead 2>/dev/null; then bad "ssh-tmux, unreachable host: h1's session still runs"
else ok "ssh-tmux, unreachable host: h1's session stopped"; fi

finish
