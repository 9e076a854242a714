#!/usr/bin/env bash
# launch-ssh-tmux.sh end to end on the test bed (tests/hosts/testbed.sh): two
# hosts sharing a "home" (this folder), each preparing its own workdir in a
# tmux session (--binary: the prebuilt meshtrain, so CI does not build twice),
# --env reaching the preparation and the ranks, the first host starting one
# mpirun over both; the run equals one process. An unreachable host fails the
# launch naming it, and the session already started on the other host is
# stopped (it waited for it forever). --max-restarts carries a run across a
# kill -9 on the second host. Skipped (exit 77, reason printed) only
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
# The pid of meshtrain on HOST (the rank there).
rank_pid() { local p; for p in $(bed_pids "$1"); do [ "$(cat /proc/$p/comm 2>/dev/null)" = meshtrain ] && echo "$p"; done | head -1; }
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

# --max-restarts: on the first attempt only, the rank on h2 stops before step
# 4 (after the checkpoint of step 2) and is killed -9 there; the typed loop
# on h1 restarts mpirun, which resumes from step 2 and reaches step 6.
"$BIN" train --config tiny.json "${S[@]}" --training_steps 6 --checkpoint_steps 2 --name one6 > one6.log 2>&1 ||
  bad "one process, 6 steps" "$(tail one6.log)"
cat > once <<WRAP
#!/bin/sh
if [ "\$OMPI_COMM_WORLD_RANK" = 1 ] && mkdir "$PWD/stalled-once" 2>/dev/null; then
  export MESHTRAIN_TEST_STALL_AT_STEP=4 MESHTRAIN_TEST_STALL_RANKS=1
fi
exec "$BIN" "\$@"
WRAP
chmod +x once
on_host_for 60 h1 "${L[@]}" --session mtr --binary "$PWD/once" --max-restarts 1 --hosts h1,h2 -- "${S[@]}" \
  --training_steps 6 --checkpoint_steps 2 --name tr --n_device_axis 2 1 1 > restart.log 2>&1 ||
  bad "ssh-tmux --max-restarts: launch" "$(tail restart.log)"
for _ in $(seq 600); do
  grep -q "stalls before step 4" home/h1/mt/runs/launch-logs/mtr/attempt-0/1/rank.1/stderr 2>/dev/null && break
  sleep 0.1
done
kill -9 "$(rank_pid h2)"
for _ in $(seq 900); do ls runs/tr/checkpoints/step_00000006 > /dev/null 2>&1 && break; sleep 0.2; done
pane=$(on_host h1 tmux capture-pane -p -J -S - -t mtr:0 2>/dev/null)
check "ssh-tmux --max-restarts: the run reaches step 6 after a kill -9 on h2" test -d runs/tr/checkpoints/step_00000006
# Step 2 is the last one logged: step 3's line waits for step 4 to be enqueued.
check "ssh-tmux --max-restarts: the restart is logged with its step" \
  grep -q "attempt 0 failed with mpirun exit [0-9]* after step 2" <<<"$pane"
grep -q "restart 1 of 1" <<<"$pane" || tail -20 <<<"$pane"
out=$(python3 "$SRC/tests/hosts/compare.py" runs/tr/metrics.jsonl runs/one6/metrics.jsonl) &&
  ok "ssh-tmux --max-restarts: = one uninterrupted process ($out)" || bad "ssh-tmux --max-restarts: losses" "$out"

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
