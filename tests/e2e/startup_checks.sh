#!/usr/bin/env bash
# Start-up across ranks: a rank stopped before MPI initialisation is named by
# host and pid and the job ends (it hung forever when the watchdog started
# only after MPI_Init); ranks that do not see one run dir are refused before
# any training, naming the hosts and "shared storage" (the first checkpoint
# failed with a missing file a whole interval into training).
source "$(dirname "$0")/common.sh" "$@"

prepare_corpus
write_config tiny.json
T=(--config tiny.json --set lr.warmup_steps=2 --set lr.end_steps=40 --eval_steps 1 --set inference_config.max_tokens=0
   --n_device_axis 2 1 1 --fresh)
host=$(hostname)

# Rank 1 stops (SIGSTOP) before MPI_Init; rank 0 waits in MPI_Init.
start=$(date +%s)
MESHTRAIN_TEST_STALL_AT_STEP=init MESHTRAIN_TEST_STALL_RANKS=1 timeout 90 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" \
  --name early --training_steps 2 --set watchdog_seconds=4 > early.log 2>&1
rc=$? took=$(($(date +%s) - start))
check "rank stopped before MPI init: the job ends non-zero, not by the test's timeout (rc $rc, ${took} s)" \
  test $rc -ne 0 -a $rc -ne 124
check "rank stopped before MPI init: rank 0's watchdog names rank 1 by host and pid" \
  grep -Eq "watchdog: rank 0 .*stuck: rank 1 \(stopped in 'start-up'\) on host $host, pid [0-9]+" early.log
grep -q "stuck: rank 1" early.log || tail -20 early.log

# Rank 1 stopped before meshtrain even started (no heartbeat at all): rank 0
# still ends the job, saying rank 1 never reported.
cat > stopper <<WRAP
#!/bin/sh
[ "\$OMPI_COMM_WORLD_RANK" = 1 ] && kill -STOP \$\$
exec "$BIN" "\$@"
WRAP
chmod +x stopper
timeout 90 "${MPIRUN[@]}" -np 2 ./stopper train "${T[@]}" --name never --training_steps 2 --set watchdog_seconds=4 \
  > never.log 2>&1
rc=$?
check "rank stopped before it started: the job ends non-zero, not by the test's timeout (rc $rc)" \
  test $rc -ne 0 -a $rc -ne 124
check "rank stopped before it started: rank 0 says rank 1 never reported" \
  grep -q "watchdog: rank 0 .*no progress ever reported by rank(s) 1" never.log

# Two ranks, two run dirs (each rank its own --output_dir: an MPMD launch),
# as a local output_dir on two hosts would be.
timeout 90 "${MPIRUN[@]}" -np 1 "$BIN" train "${T[@]}" --name split --output_dir runsA --training_steps 2 \
  : -np 1 "$BIN" train "${T[@]}" --name split --output_dir runsB --training_steps 2 > split.log 2>&1
rc=$?
check "run dir not shared: refused (rc $rc)" test $rc -ne 0 -a $rc -ne 124
check "run dir not shared: says shared storage, names the host and rank that cannot see it" \
  grep -q "is not on shared storage.*cannot see: $host (rank 1)" split.log
grep -q "shared storage" split.log || tail -20 split.log
check "run dir not shared: refused before any training" bash -c "! grep -q 'Step 1' split.log && ! test -e runsA/split/metrics.jsonl"

# One shared run dir: the probe passes and is removed.
timeout 90 "${MPIRUN[@]}" -np 2 "$BIN" train "${T[@]}" --name shared --training_steps 1 > shared.log 2>&1
rc=$?
check "shared run dir: trains (rc $rc)" test $rc -eq 0
check "shared run dir: no probe file left" bash -c "! ls -a runs/shared | grep -q shared-storage-probe"

finish
