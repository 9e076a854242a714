#!/usr/bin/env bash
# The three launchers as a user meets them: shellcheck-clean, --help, clear
# errors, and the exact commands they would send for a two-host run. Nothing
# here needs ssh, tmux, SLURM or a second machine: dry runs and stand-in
# ssh/tmux/mpirun programs on PATH record what would have been run.
# Usage: bash tests/e2e/launchers.sh BINARY SRC_DIR WORK_DIR
set -uo pipefail

BINARY="${1:?usage: launchers.sh BINARY SRC_DIR WORK_DIR}"
SRC="${2:?usage: launchers.sh BINARY SRC_DIR WORK_DIR}"
WORK="${3:?usage: launchers.sh BINARY SRC_DIR WORK_DIR}"
rm -rf "$WORK"
mkdir -p "$WORK/bin"
MPI="$SRC/scripts/launch-mpirun.sh"
SSH="$SRC/scripts/launch-ssh-tmux.sh"
SLURM="$SRC/scripts/launch-slurm.sbatch"

passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   - $1"; }
bad() { failed=$((failed + 1)); echo "FAIL - $1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/       | /'; }

# expect_has NAME OUTPUT PATTERN...: every extended regex matches OUTPUT.
expect_has() {
  local name="$1" out="$2" p
  shift 2
  for p in "$@"; do
    grep -Eq -- "$p" <<<"$out" || { bad "$name: no match for /$p/" "$out"; return; }
  done
  ok "$name"
}
expect_lacks() {
  local name="$1" out="$2" p="$3"
  if grep -Eq -- "$p" <<<"$out"; then bad "$name: unexpected /$p/" "$out"; else ok "$name"; fi
}
# expect_fail NAME PATTERN CMD...: CMD exits non-zero and says PATTERN on stderr.
expect_fail() {
  local name="$1" p="$2" out rc
  shift 2
  out="$("$@" 2>&1 >/dev/null)"
  rc=$?
  if ((rc == 0)); then bad "$name: exit status 0"; return; fi
  grep -Eq -e "$p" <<<"$out" || { bad "$name: message lacks /$p/" "$out"; return; }
  ok "$name"
}

cd "$WORK" || exit 1
printf '# two nodes\nnode-a slots=4\n\nnode-b\n' >hosts.txt
echo '{}' >run.json

# --- static checks ---------------------------------------------------------
if command -v shellcheck >/dev/null; then
  for s in "$MPI" "$SSH" "$SLURM"; do
    if out="$(shellcheck "$s" 2>&1)"; then ok "shellcheck $(basename "$s")"; else bad "shellcheck $(basename "$s")" "$out"; fi
  done
else
  bad "shellcheck not installed (scripts/setup.sh installs it)"
fi
for s in "$MPI" "$SSH" "$SLURM"; do
  if out="$(bash "$s" --help 2>&1)" && grep -q Usage <<<"$out"; then
    ok "--help $(basename "$s")"
  else
    bad "--help $(basename "$s")" "$out"
  fi
done

# --- launch-mpirun.sh --------------------------------------------------------
expect_fail "mpirun: missing --hostfile" '--hostfile' bash "$MPI" --ranks-per-host 4 --config run.json
expect_fail "mpirun: missing --ranks-per-host" '--ranks-per-host' bash "$MPI" --hostfile hosts.txt --config run.json
expect_fail "mpirun: missing --config" '--config' bash "$MPI" --hostfile hosts.txt --ranks-per-host 4
expect_fail "mpirun: value missing" '--config needs a value' bash "$MPI" --hostfile hosts.txt --config
expect_fail "mpirun: unknown argument" "unknown argument '--bogus'" bash "$MPI" --bogus
expect_fail "mpirun: bad rank count" 'positive integer' bash "$MPI" --hostfile hosts.txt --ranks-per-host x --config run.json

out="$(env -u NCCL_SOCKET_IFNAME bash "$MPI" --hostfile hosts.txt --ranks-per-host 4 --config run.json \
  --binary "$BINARY" --log-dir "$WORK/logs" --dry-run -- --n_device_axis 2 2 2 --name two 2>&1)"
expect_has "mpirun: dry run command" "$out" \
  '^mpirun -np 8 ' '--host node-a:4.,node-b:4 ' '--map-by ppr:4:node' '-x NCCL_DEBUG=WARN' '-x OMP_NUM_THREADS=1' \
  "--mca plm_rsh_args -o\\\\ BatchMode=yes\\\\ -o\\\\ ConnectTimeout=10\\\\ -o\\\\ ServerAliveInterval=5" \
  "--output-filename $WORK/logs" "$BINARY train --config run.json --n_device_axis 2 2 2 --name two"
expect_lacks "mpirun: no NCCL_SOCKET_IFNAME unless set" "$out" 'NCCL_SOCKET_IFNAME'
if [ "$(id -u)" -eq 0 ]; then
  expect_has "mpirun: root gets --allow-run-as-root" "$out" '--allow-run-as-root'
fi
expect_lacks "mpirun: dry run creates no log dir" "$(ls)" '^logs$'
out="$(NCCL_SOCKET_IFNAME=eth0 bash "$MPI" --hostfile hosts.txt --ranks-per-host 1 --config run.json --dry-run 2>&1)"
expect_has "mpirun: NCCL_SOCKET_IFNAME forwarded" "$out" '^mpirun -np 2 ' '-x NCCL_SOCKET_IFNAME=eth0'
out="$(bash "$MPI" --hostfile hosts.txt --ranks-per-host 1 --config run.json --env A=1 --env B='x y' \
  --connect-timeout 4 --max-restarts 2 --log-dir L --dry-run -- --fresh 2>&1)"
expect_has "mpirun: --env, --connect-timeout, per-attempt logs" "$out" '-x A=1 -x B=x\\ y ' 'ConnectTimeout=4' \
  '--output-filename L/attempt-0 ' 'train --config run.json --fresh $'
expect_fail "mpirun: --env needs NAME=VALUE" "--env takes NAME=VALUE, got '1A=2'" bash "$MPI" --hostfile hosts.txt \
  --ranks-per-host 1 --config run.json --env 1A=2
expect_fail "mpirun: bad --max-restarts" 'max-restarts must be' bash "$MPI" --hostfile hosts.txt \
  --ranks-per-host 1 --config run.json --max-restarts x
expect_lacks "mpirun: no NUMA binding unless asked" "$out" '--bind-to numa'
out="$(bash "$MPI" --hostfile hosts.txt --ranks-per-host 8 --config run.json --numa 2 --dry-run 2>&1)"
expect_has "mpirun: --numa 2 binds 4 ranks per NUMA domain" "$out" '^mpirun -np 16 ' \
  '--map-by ppr:4:numa --bind-to numa '
expect_lacks "mpirun: --numa replaces --bind-to none" "$out" '--bind-to none'
expect_fail "mpirun: --numa must divide the ranks" '--numa 3 does not divide --ranks-per-host 8' bash "$MPI" \
  --hostfile hosts.txt --ranks-per-host 8 --config run.json --numa 3
expect_fail "mpirun: bad --numa" '--numa must be a positive integer' bash "$MPI" --hostfile hosts.txt \
  --ranks-per-host 8 --config run.json --numa x

# --- launch-ssh-tmux.sh --------------------------------------------------------
expect_fail "ssh-tmux: missing hosts" '--hosts' bash "$SSH" --repo r --config run.json
expect_fail "ssh-tmux: missing --repo" '--repo' bash "$SSH" --hosts a,b --config run.json
expect_fail "ssh-tmux: missing --config" '--config' bash "$SSH" --hosts a,b --repo r
expect_fail "ssh-tmux: unknown argument" "unknown argument '--nope'" bash "$SSH" --nope
expect_fail "ssh-tmux: missing hostfile" 'does not exist' bash "$SSH" --hostfile nowhere.txt --repo r --config run.json

ssh_args=(--repo https://example.org/meshtrain.git --ref v1.2 --workdir /opt/mt --session mtrun
  --config configs/tiny.json --ranks-per-host 4)
out="$(bash "$SSH" --hostfile hosts.txt "${ssh_args[@]}" --dry-run -- --n_device_axis 2 2 2 2>&1)"
for h in node-a node-b; do
  expect_has "ssh-tmux: $h prepares" "$out" \
    "^$h: tmux kill-session -t mtrun" "^$h: tmux new-session -d -s mtrun" \
    "^$h: tmux send-keys -t mtrun:0 .*git clone https://example.org/meshtrain.git /opt/mt" \
    "^$h: .*git fetch .*git reset --hard v1.2" "^$h: .*scripts/setup.sh && scripts/build.sh meshtrain"
done
n_mpirun="$(grep -c 'mpirun ' <<<"$out")"
if [ "$n_mpirun" = 1 ]; then ok "ssh-tmux: exactly one mpirun"; else bad "ssh-tmux: $n_mpirun mpirun lines" "$out"; fi
# shellcheck disable=SC2016  # $h is literal text in the typed command
expect_has "ssh-tmux: first host runs mpirun over both" "$out" \
  '^node-a: .*mpirun .* --host node-a:4 -np 4 --wdir /opt/mt /opt/mt/build/meshtrain train --config configs/tiny.json --n_device_axis 2 2 2 : --host node-b:4 -np 4 ' \
  '^node-a: .*ssh -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3 \$h test -e /tmp/meshtrain-ready-mtrun' \
  "^node-a: .*plm_rsh_args '\\\\''-o BatchMode=yes -o ConnectTimeout=10"
out2="$(bash "$SSH" --hosts node-a,node-b --repo r --config c.json --env MESHTRAIN_OFFLINE=1 --dry-run 2>&1)"
expect_has "ssh-tmux: per-host workdirs by default, --env exported and passed to mpirun" "$out2" \
  '^node-a: .*export MESHTRAIN_OFFLINE=1; .*git clone r ~/meshtrain/node-a' '^node-b: .*git clone r ~/meshtrain/node-b' \
  '^node-a: .*-x MESHTRAIN_OFFLINE '
out2="$(bash "$SSH" --hosts node-a,node-b "${ssh_args[@]}" --dry-run -- --n_device_axis 2 2 2 2>&1)"
# Each launch names its markers with its own id (seconds-pid): compare without it.
launch_ids() { sed -E 's/(meshtrain-(ready|failed)-mtrun)-[0-9]+-[0-9]+/\1-ID/g' <<<"$1"; }
if [ "$(launch_ids "$out")" = "$(launch_ids "$out2")" ]; then ok "ssh-tmux: --hosts equals --hostfile"
else bad "ssh-tmux: --hosts differs from --hostfile" "$out2"; fi
expect_has "ssh-tmux: markers named per launch, stale ones removed" "$out" \
  '^node-a: .*touch /tmp/meshtrain-ready-mtrun-[0-9]+-[0-9]+;' '^node-b: rm -f /tmp/meshtrain-ready-mtrun-\* '
if [ "$(grep -o 'meshtrain-ready-mtrun-[0-9]*-[0-9]*' <<<"$out" | sort -u)" != \
     "$(grep -o 'meshtrain-ready-mtrun-[0-9]*-[0-9]*' <<<"$out2" | sort -u)" ]; then
  ok "ssh-tmux: two launches use different markers"
else bad "ssh-tmux: two launches share a marker name" "$out2"; fi
out="$(bash "$SSH" --hosts node-a,node-b --session mtrun --kill --dry-run 2>&1)"
expect_has "ssh-tmux: --kill" "$out" '^node-a: tmux kill-session -t mtrun' '^node-b: tmux kill-session -t mtrun'
expect_lacks "ssh-tmux: --kill starts nothing" "$out" 'new-session|mpirun'
out="$(bash "$SSH" --attach node-b --session mtrun --user alice --dry-run 2>&1)"
expect_has "ssh-tmux: --attach" "$out" '^node-b: ssh -t alice@node-b tmux attach -t mtrun$'

# The real path, with stand-ins: ssh runs the script locally, tmux records the
# keys it would type, and the typed lines must be valid shell.
cat >"$WORK/bin/ssh" <<'STUB'
#!/usr/bin/env bash
while [ "${1:-}" = -o ]; do shift 2; done
host="$1"; shift
[ "$host" = broken ] && { echo "ssh: connect to host broken: refused" >&2; exit 255; }
HOST="$host" "$@"
STUB
cat >"$WORK/bin/tmux" <<'STUB'
#!/usr/bin/env bash
echo "$HOST tmux $*" >>"$STUB_LOG"
[ "$1" = send-keys ] && printf '%s\n' "$4" >>"$STUB_LOG.$HOST.typed"
exit 0
STUB
chmod +x "$WORK/bin/ssh" "$WORK/bin/tmux"
export STUB_LOG="$WORK/tmux.log"
out="$(PATH="$WORK/bin:$PATH" bash "$SSH" --hosts node-a,node-b "${ssh_args[@]}" -- --name "it's" 2>&1)"
rc=$?
log="$(cat "$STUB_LOG" 2>/dev/null)"
if ((rc == 0)); then ok "ssh-tmux: launch exits 0"; else bad "ssh-tmux: launch exit $rc" "$out"; fi
expect_has "ssh-tmux: both sessions created" "$log" '^node-a tmux new-session -d -s mtrun' '^node-b tmux new-session -d -s mtrun'
for h in node-a node-b; do
  if out="$(bash -n "$STUB_LOG.$h.typed" 2>&1)"; then ok "ssh-tmux: typed lines on $h parse"; else bad "ssh-tmux: typed lines on $h" "$out"; fi
done
expect_has "ssh-tmux: argument quoting survives" "$(cat "$STUB_LOG.node-a.typed")" "--name 'it'\\\\''s'"
rm -f "$STUB_LOG"*
out="$(PATH="$WORK/bin:$PATH" bash "$SSH" --hosts node-a,node-b "${ssh_args[@]}" --max-restarts 2 -- --fresh 2>&1)"
if out="$(bash -n "$STUB_LOG.node-a.typed" 2>&1)"; then ok "ssh-tmux --max-restarts: the typed loop parses"; else bad "ssh-tmux --max-restarts: typed loop" "$out"; fi
expect_has "ssh-tmux --max-restarts: restarts resume (no --fresh), log cause and step, stop early" \
  "$(cat "$STUB_LOG.node-a.typed")" 'attempt-\$a' '--config configs/tiny.json --fresh :' \
  'else mpirun .* --config configs/tiny.json :' 'restart \$a of 2' 'like the one before it, with no newer checkpoint'
out="$(PATH="$WORK/bin:$PATH" bash "$SSH" --hosts node-a,broken "${ssh_args[@]}" 2>&1)"
rc=$?
if ((rc != 0)) && grep -q 'ssh to broken failed' <<<"$out"; then
  ok "ssh-tmux: unreachable host fails the launch"
else
  bad "ssh-tmux: unreachable host (exit $rc)" "$out"
fi

# --- launch-slurm.sbatch -----------------------------------------------------
sb="$(cat "$SLURM")"
expect_has "slurm: #SBATCH lines: requeue, appended log per job id, SIGUSR1 before the limit" "$sb" '^#SBATCH --nodes=' \
  '^#SBATCH --ntasks-per-node=' '^#SBATCH --time=' '^#SBATCH --signal=B:USR1@120' '^#SBATCH --requeue' \
  '^#SBATCH --open-mode=append' '^#SBATCH --output=%x-%j.out' 'sbatch --array=1-10%1 scripts/launch-slurm.sbatch CONFIG'
expect_lacks "slurm: no GPU request by default (CPU-only clusters refuse it)" "$sb" '^#SBATCH --gpus'
expect_fail "slurm: missing CONFIG" 'CONFIG' env MESHTRAIN_DRY_RUN=1 bash "$SLURM"
expect_fail "slurm: missing config file" 'does not exist' env MESHTRAIN_DRY_RUN=1 bash "$SLURM" nowhere.json
expect_fail "slurm: unknown option" "unknown argument '--x'" env MESHTRAIN_DRY_RUN=1 bash "$SLURM" --x
out="$(MESHTRAIN_DRY_RUN=1 SLURM_SUBMIT_DIR="$WORK" bash "$SLURM" run.json --seed 3 2>&1)"
expect_has "slurm: dry run prints the launch line" "$out" \
  '^(srun --mpi=pmix|mpirun -np) .*build/meshtrain train --config run.json --seed 3'
out="$(MESHTRAIN_DRY_RUN=1 MESHTRAIN_LAUNCHER=srun SLURM_JOB_NUM_NODES=2 SLURM_NTASKS_PER_NODE='4(x2)' \
  SLURM_SUBMIT_DIR="$WORK" bash "$SLURM" run.json 2>&1)"
expect_has "slurm: srun over the allocation" "$out" \
  '^srun --mpi=pmix --kill-on-bad-exit=1 --nodes=2 --ntasks=8 --ntasks-per-node=4 build/meshtrain train --config run.json'
out="$(MESHTRAIN_DRY_RUN=1 MESHTRAIN_LAUNCHER=mpirun SLURM_JOB_NUM_NODES=2 SLURM_NTASKS_PER_NODE=4 \
  SLURM_SUBMIT_DIR="$WORK" bash "$SLURM" run.json 2>&1)"
expect_has "slurm: mpirun fallback" "$out" '^mpirun -np 8 --map-by ppr:4:node .*build/meshtrain train --config run.json'

# A stop signal reaches the ranks as SIGUSR1 (srun and mpirun forward it;
# SIGTERM would make them kill the ranks), the job waits for them to save and
# requeues itself -- unless SLURM says the SIGTERM was a cancel; a run that
# ends by itself is not requeued, unless SLURM says it was preempted inside a
# GraceTime. (The real cluster: e2e.hosts_slurm_stops.)
mkdir -p "$WORK/fake"
cat >"$WORK/fake/mpirun" <<'STUB'
#!/usr/bin/env bash
trap 'echo term >"$TERM_SEEN"; sleep 0.3; exit 0' TERM
trap 'echo usr1 >"$TERM_SEEN"; sleep 0.3; exit 0' USR1
echo started >"$TERM_SEEN.started"
[ -n "${FINISH_AT_ONCE:-}" ] && exit 0
while :; do sleep 0.1; done
STUB
# scontrol: `show job` answers $FAKE_JOB; anything else (requeue) is logged.
printf '#!/bin/sh\nif [ "$1" = show ]; then echo "$FAKE_JOB"; else echo "scontrol $*" >>"%s"; fi\n' \
  "$WORK/scontrol.log" >"$WORK/fake/scontrol"
# squeue -o %L: the job's time left, which tells what a SIGUSR1 meant.
printf '#!/bin/sh\necho "$FAKE_LEFT"\n' >"$WORK/fake/squeue"
chmod +x "$WORK/fake/mpirun" "$WORK/fake/scontrol" "$WORK/fake/squeue"
export TERM_SEEN="$WORK/term_seen"
# SIGUSR1 is "time limit near" only with little time left (it was printed on any).
# A preemption: SLURM has already counted the restart when the SIGTERM comes.
preempted_job="JobId=42 JobState=COMPLETING Reason=None Restarts=1 PreemptTime=None"
for sig_left in "TERM 19:58:00 SIGTERM: preempted (SLURM has requeued the job: restart 1, JobState COMPLETING)" \
  "USR1 1:30 time limit near (SIGUSR1, 1:30 left)" "USR1 19:58:00 SIGUSR1, not the time limit (19:58:00 left)"; do
  read -r sig left cause <<<"$sig_left"
  export FAKE_LEFT="$left" FAKE_JOB="$preempted_job"
  rm -f "$TERM_SEEN" "$TERM_SEEN.started" "$WORK/scontrol.log"
  PATH="$WORK/fake:$PATH" MESHTRAIN_LAUNCHER=mpirun MESHTRAIN_BINARY="$WORK/fake/mpirun" SLURM_JOB_ID=42 \
    SLURM_SUBMIT_DIR="$WORK" bash "$SLURM" run.json >"$WORK/slurm.out" 2>&1 &
  job=$!
  for _ in $(seq 50); do [ -e "$TERM_SEEN.started" ] && break; sleep 0.1; done
  kill -"$sig" "$job"
  wait "$job"
  rc=$?
  if ((rc == 0)) && [ "$(cat "$TERM_SEEN" 2>/dev/null)" = usr1 ] &&
    [ "$(cat "$WORK/scontrol.log" 2>/dev/null)" = "scontrol requeue 42" ] &&
    grep -qF "launch-slurm.sbatch: $cause: sent SIGUSR1" "$WORK/slurm.out"; then
    ok "slurm: SIG$sig ($left left) reaches the ranks as SIGUSR1, the job says '$cause', waits and requeues itself"
  else
    bad "slurm: SIG$sig (exit $rc, scontrol: $(cat "$WORK/scontrol.log" 2>/dev/null))" "$(cat "$WORK/slurm.out")"
  fi
done
# scancel: SLURM has marked the job COMPLETING, its restart count unchanged.
rm -f "$TERM_SEEN" "$TERM_SEEN.started" "$WORK/scontrol.log"
FAKE_JOB="JobId=42 JobState=COMPLETING Reason=None Restarts=0 PreemptTime=None" PATH="$WORK/fake:$PATH" \
  MESHTRAIN_LAUNCHER=mpirun MESHTRAIN_BINARY="$WORK/fake/mpirun" SLURM_JOB_ID=42 SLURM_SUBMIT_DIR="$WORK" \
  bash "$SLURM" run.json >"$WORK/slurm.out" 2>&1 &
job=$!
for _ in $(seq 50); do [ -e "$TERM_SEEN.started" ] && break; sleep 0.1; done
kill -TERM "$job"
wait "$job"
rc=$?
if ((rc == 0)) && [ "$(cat "$TERM_SEEN" 2>/dev/null)" = usr1 ] && [ ! -e "$WORK/scontrol.log" ] &&
  grep -qF "SIGTERM: the job was cancelled (scancel; JobState COMPLETING)" "$WORK/slurm.out" &&
  grep -q "not requeueing job 42: stopped by SIGTERM, cancelled" "$WORK/slurm.out"; then
  ok "slurm: scancel's SIGTERM: the ranks save (SIGUSR1), the job is not requeued, and says why"
else
  bad "slurm: scancel (exit $rc, scontrol: $(cat "$WORK/scontrol.log" 2>/dev/null))" "$(cat "$WORK/slurm.out")"
fi
# A run that ends by itself; then one whose ranks SLURM stopped inside a
# preemption's GraceTime (no signal to the script, PreemptTime set).
for job_now in "JobId=42 JobState=RUNNING Reason=None Restarts=0 PreemptTime=None" \
  "JobId=42 JobState=RUNNING Reason=None Restarts=0 PreemptTime=2026-11-28T08:33:47"; do
  rm -f "$WORK/scontrol.log"
  FAKE_JOB="$job_now" PATH="$WORK/fake:$PATH" MESHTRAIN_LAUNCHER=mpirun MESHTRAIN_BINARY="$WORK/fake/mpirun" \
    SLURM_JOB_ID=42 FINISH_AT_ONCE=1 SLURM_SUBMIT_DIR="$WORK" bash "$SLURM" run.json >"$WORK/slurm.out" 2>&1
  rc=$?
  if [[ "$job_now" == *PreemptTime=None ]]; then
    if ((rc == 0)) && [ ! -e "$WORK/scontrol.log" ] && grep -q 'done (exit 0)' "$WORK/slurm.out"; then
      ok "slurm: a run that ends by itself is not requeued"
    else
      bad "slurm: finished run (exit $rc)" "$(cat "$WORK/slurm.out")"
    fi
  elif ((rc == 0)) && [ "$(cat "$WORK/scontrol.log" 2>/dev/null)" = "scontrol requeue 42" ] &&
    grep -q "requeueing job 42: preempted at 2026-11-28T08:33:47 (the partition's GraceTime" "$WORK/slurm.out"; then
    ok "slurm: ranks stopped inside a preemption's GraceTime: the script requeues the job"
  else
    bad "slurm: GraceTime preemption (exit $rc)" "$(cat "$WORK/slurm.out")"
  fi
done

echo "$passed passed, $failed failed"
((failed == 0))
