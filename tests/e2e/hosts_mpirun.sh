#!/usr/bin/env bash
# Across hosts, for real, on the test bed (tests/hosts/testbed.sh: two network
# namespaces with their own sshd, hostname, /tmp and /dev/shm): mpirun over
# both hosts equals one process (pp split across the hosts, losses and
# gradient norms); launch-mpirun.sh end to end (dp x tp across the hosts =
# one process) with a hostfile of slots=1 and --ranks-per-host 2, --env
# reaching every rank; an unreachable host named within the connect timeout,
# or left out with --drop-unreachable (the run goes on at a smaller dp); a
# run dir on each host's local disk refused at start-up naming the host.
# Skipped (exit 77, reason printed) only where namespaces cannot be made.
source "$(dirname "$0")/common.sh" "$@"
source "$SRC/tests/hosts/testbed.sh"
bed_up "$WORK/bed" 2

prepare_corpus
write_config tiny.json
S=(--set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1 --checkpoint_steps 100
   --set inference_config.max_tokens=0 --training_steps 4 --fresh)
# shellcheck disable=SC2054  # commas inside an MCA value
X=(mpirun --allow-run-as-root --bind-to none --mca btl self,vader,tcp --mca btl_vader_single_copy_mechanism none)
same() { python3 "$SRC/tests/hosts/compare.py" "$@"; }

"$BIN" train --config tiny.json "${S[@]}" --name one > one.log 2>&1 || bad "one process" "$(tail one.log)"

# pp 2: one stage per host.
on_host_for 120 h1 "${X[@]}" --host h1:1,h2:1 -np 2 "$BIN" train --config tiny.json "${S[@]}" --name pp \
  --n_device_axis 1 2 1 > pp.log 2>&1
rc=$?
check "mpirun over h1,h2: pp 2 trains (rc $rc)" test $rc -eq 0
out=$(same runs/pp/metrics.jsonl runs/one/metrics.jsonl) && ok "pp across hosts = one process ($out)" ||
  bad "pp across hosts != one process" "$out"

# dp 2 x tp 2, two ranks per host, through launch-mpirun.sh (one mpirun): the
# hostfile says slots=1, --ranks-per-host says 2 (it failed with "not enough
# slots"); --env reaches every rank on every host.
printf 'h1 slots=1\nh2 slots=1\n' > hostfile
cat > envbin <<WRAP
#!/bin/sh
echo "\$MT_PROBE" > "$PWD/env.\$(hostname).\$\$"
exec "$BIN" "\$@"
WRAP
chmod +x envbin
on_host_for 120 h1 bash "$SRC/scripts/launch-mpirun.sh" --hostfile hostfile --ranks-per-host 2 --config tiny.json \
  --binary "$PWD/envbin" --env MT_PROBE=hello --log-dir "$PWD/lm-logs" --connect-timeout 3 \
  -- "${S[@]}" --name lm --n_device_axis 2 1 2 > lm.log 2>&1
rc=$?
check "launch-mpirun.sh --ranks-per-host 2 over slots=1: trains (rc $rc)" test $rc -eq 0
[ $rc -eq 0 ] || tail -15 lm.log
check "launch-mpirun.sh: ranks 2, 3 on h2" bash -c "grep -q 'rank 2 on h2' lm.log && grep -q 'rank 3 on h2' lm.log"
check "launch-mpirun.sh --env: every rank on both hosts has it" \
  bash -c "test \$(cat env.h1.* env.h2.* 2>/dev/null | grep -c '^hello$') -eq 4"
out=$(same runs/lm/metrics.jsonl runs/one/metrics.jsonl) && ok "launch-mpirun.sh: dp x tp across hosts = one process ($out)" ||
  bad "launch-mpirun.sh: dp x tp across hosts != one process" "$out"

# A host that does not answer: named within the connect timeout, nothing started.
printf 'h1\n%s\n' "$(bed_ip 9)" > hostfile.dead
start=$(date +%s)
on_host_for 60 h1 bash "$SRC/scripts/launch-mpirun.sh" --hostfile hostfile.dead --ranks-per-host 1 --config tiny.json \
  --binary "$BIN" --log-dir "$PWD/dead-logs" --connect-timeout 3 -- "${S[@]}" --name dead > dead.log 2>&1
rc=$? took=$(($(date +%s) - start))
check "unreachable host: launch fails (rc $rc) in ${took} s (connect timeout 3 s)" test $rc -ne 0 -a $rc -ne 124 -a $took -le 15
check "unreachable host: named, nothing started" \
  bash -c "grep -q 'host $(bed_ip 9) is not ready' dead.log && grep -q 'nothing started' dead.log && ! test -e runs/dead"

# --drop-unreachable: the same dead host is left out and the run goes on with
# h1 alone, its dp shrunk to fit (dp 2 x tp 2 over 4 ranks -> dp 1 x tp 2).
on_host_for 120 h1 bash "$SRC/scripts/launch-mpirun.sh" --hostfile hostfile.dead --ranks-per-host 2 --config tiny.json \
  --binary "$BIN" --log-dir "$PWD/drop-logs" --connect-timeout 3 --drop-unreachable \
  -- "${S[@]}" --name drop --n_device_axis 2 1 2 > drop.log 2>&1
rc=$?
check "--drop-unreachable: the run goes on without the dead host (rc $rc)" test $rc -eq 0
check "--drop-unreachable: logs the host left out and the new world and mesh" grep -q \
  "left out unreachable host(s) $(bed_ip 9); going on with 1 host(s) (h1): world 2, mesh dp 1 x pp 1 x tp 2 (was dp 2)" drop.log
[ $rc -eq 0 ] || tail -15 drop.log
out=$(same runs/drop/metrics.jsonl runs/one/metrics.jsonl) && ok "--drop-unreachable: dp 1 x tp 2 = one process ($out)" ||
  bad "--drop-unreachable: != one process" "$out"

# ... unless the ranks left cannot hold pp x tp: refused, naming why.
on_host_for 60 h1 bash "$SRC/scripts/launch-mpirun.sh" --hostfile hostfile.dead --ranks-per-host 1 --config tiny.json \
  --binary "$BIN" --log-dir "$PWD/nodrop-logs" --connect-timeout 3 --drop-unreachable \
  -- "${S[@]}" --name nodrop --n_device_axis 1 2 1 > nodrop.log 2>&1
rc=$?
check "--drop-unreachable, pp 2 on one rank left: refused (rc $rc), nothing started" \
  bash -c "test $rc -eq 1 && grep -q 'the 1 rank(s) left are not a multiple of pp x tp x cp = 2 x 1 x 1' nodrop.log &&
           grep -q 'nothing started' nodrop.log && ! test -e runs/nodrop"

# output_dir on each host's own /tmp: refused at start-up, naming h2.
on_host_for 120 h1 "${X[@]}" --host h1:1,h2:1 -np 2 "$BIN" train --config tiny.json "${S[@]}" --name local \
  --output_dir /tmp/runs --n_device_axis 2 1 1 > local.log 2>&1
rc=$?
check "run dir on local disks: refused (rc $rc)" test $rc -ne 0 -a $rc -ne 124
check "run dir on local disks: names h2 and shared storage, before training" \
  bash -c "grep -q 'not on shared storage.*cannot see: h2 (rank 1)' local.log && ! grep -q 'Step 1' local.log"

finish
