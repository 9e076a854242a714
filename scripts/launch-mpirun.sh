#!/usr/bin/env bash
# Starts one meshtrain training run over the hosts of an MPI hostfile: one
# process per device, N per host, all started by a single mpirun; with
# --max-restarts, a failed job is started again and resumes from its newest
# checkpoint.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/launch-mpirun.sh --hostfile FILE --ranks-per-host N --config FILE
                                [--binary PATH] [--log-dir DIR] [--env K=V ...]
                                [--connect-timeout S] [--max-restarts N] [--numa K]
                                [--drop-unreachable] [--dry-run]
                                [-- extra meshtrain train arguments]

Builds and runs (or with --dry-run only prints) the mpirun command that starts
`meshtrain train` with hosts x ranks-per-host processes, N on each host.

  --hostfile FILE       one host per line (OpenMPI syntax; "slots=" and "#"
                        comments are allowed; the slots are --ranks-per-host,
                        whatever the file says)
  --ranks-per-host N    processes per host, normally its number of GPUs
  --config FILE         the run's JSON config (same path on every host)
  --binary PATH         meshtrain binary (default: <repo>/build/meshtrain)
  --log-dir DIR         per-rank stdout/stderr go to DIR/1/rank.K/, mpirun's
                        own output to DIR/mpirun.log (with restarts:
                        DIR/attempt-K/...) (default: runs/launch-logs/<date-time>)
  --env K=V             set K=V for every rank on every host (repeatable)
  --connect-timeout S   seconds an ssh connection to a host may take (default
                        10); a connected host silent for 3 x 5 s is dropped
  --max-restarts N      when the job fails, start it again up to N times; each
                        attempt resumes from the newest checkpoint of the run
                        (a --fresh is dropped after the first). Stops early
                        when an attempt fails at the same step as the one
                        before with no newer checkpoint (default 0)
  --drop-unreachable    a host that cannot be reached over ssh at the start
                        or at a restart is left out and the run goes on with
                        the other hosts: a smaller dp (pp, tp and cp kept, read
                        from --n_device_axis, --set or the config), passed as
                        -- --n_device_axis DP PP TP; the newest checkpoint is
                        resharded. Without it such a host stops the launch
  --numa K              bind each rank to the NUMA domain of its GPU: the K
                        domains of a host take ranks-per-host / K ranks each,
                        in local-rank order (mpirun --map-by ppr:M:numa
                        --bind-to numa). Local rank i drives GPU i, so this is
                        the GPU's domain when the GPUs are numbered domain by
                        domain, as on HGX/DGX boxes (GPUs 0-3 on domain 0,
                        4-7 on domain 1: --numa 2); `nvidia-smi topo -m`
                        shows the affinity. K must divide ranks-per-host.
                        Default: no binding (--bind-to none)
  --dry-run             print the command, run nothing
  -h, --help            this text
  -- ARGS               passed to `meshtrain train`, e.g.
                        -- --n_device_axis 4 2 2 --set lr.max_lr=3e-4

Before starting, every host other than this one is checked over ssh (bounded
by --connect-timeout): reachable, with the binary and the config at their
paths; a host that is not is named and nothing starts (with
--drop-unreachable, a host that cannot be reached is left out instead).

The run dir (output_dir/name) must be on storage every host sees at the same
path (meshtrain checks this at start-up): pass -- --output_dir /shared/runs.

Environment: NCCL_DEBUG (default WARN) and OMP_NUM_THREADS (default 1) are
exported to every rank, NCCL_SOCKET_IFNAME too when it is set.

Example:
  scripts/launch-mpirun.sh --hostfile hosts.txt --ranks-per-host 8 \
      --config configs/moe1b.json --max-restarts 3 -- --n_device_axis 8 2 1
USAGE
}

die() {
  echo "launch-mpirun.sh: error: $*" >&2
  echo "Run 'scripts/launch-mpirun.sh --help' for usage." >&2
  exit 2
}
say() { echo "launch-mpirun.sh: $*" >&2; }

need_value() {
  [ "$2" -ge 2 ] || die "$1 needs a value"
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hostfile="" ranks_per_host="" config="" binary="$ROOT/build/meshtrain" log_dir="" dry_run=0
connect_timeout=10 max_restarts=0 drop_unreachable=0 numa=""
envs=() extra=()
while (($#)); do
  case "$1" in
    --hostfile) need_value "$1" $#; hostfile="$2"; shift 2 ;;
    --ranks-per-host) need_value "$1" $#; ranks_per_host="$2"; shift 2 ;;
    --config) need_value "$1" $#; config="$2"; shift 2 ;;
    --binary) need_value "$1" $#; binary="$2"; shift 2 ;;
    --log-dir) need_value "$1" $#; log_dir="$2"; shift 2 ;;
    --env) need_value "$1" $#; envs+=("$2"); shift 2 ;;
    --connect-timeout) need_value "$1" $#; connect_timeout="$2"; shift 2 ;;
    --max-restarts) need_value "$1" $#; max_restarts="$2"; shift 2 ;;
    --drop-unreachable) drop_unreachable=1; shift ;;
    --numa) need_value "$1" $#; numa="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1'" ;;
  esac
done

[ -n "$hostfile" ] || die "missing --hostfile FILE"
[ -n "$ranks_per_host" ] || die "missing --ranks-per-host N"
[ -n "$config" ] || die "missing --config FILE"
[ -f "$hostfile" ] || die "--hostfile '$hostfile' does not exist"
[ -f "$config" ] || die "--config '$config' does not exist"
[[ "$ranks_per_host" =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-host must be a positive integer, got '$ranks_per_host'"
[[ "$connect_timeout" =~ ^[1-9][0-9]*$ ]] || die "--connect-timeout must be a positive integer, got '$connect_timeout'"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts must be a non-negative integer, got '$max_restarts'"
if [ -n "$numa" ]; then
  [[ "$numa" =~ ^[1-9][0-9]*$ ]] || die "--numa must be a positive integer (NUMA domains per host), got '$numa'"
  ((ranks_per_host % numa == 0)) || die "--numa $numa does not divide --ranks-per-host $ranks_per_host"
fi
for kv in "${envs[@]}"; do
  [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env takes NAME=VALUE, got '$kv'"
done

# Unique host names, in file order, without comments or slot counts.
mapfile -t hosts < <(sed -e 's/#.*//' "$hostfile" | awk 'NF { print $1 }' | awk '!seen[$0]++')
((${#hosts[@]})) || die "--hostfile '$hostfile' names no hosts"
[ -n "$log_dir" ] || log_dir="$ROOT/runs/launch-logs/$(date +%Y%m%d-%H%M%S)"

# ssh without prompts, bounded connects, and keep-alives: a host that drops
# packets fails in --connect-timeout s, one that vanishes mid-run in ~15 s.
ssh_opts=(-o BatchMode=yes -o "ConnectTimeout=$connect_timeout" -o ServerAliveInterval=5 -o ServerAliveCountMax=3)
# The mpirun command over the current hosts (--drop-unreachable shrinks them).
build_cmd() {
  local h spec=""
  np=$((${#hosts[@]} * ranks_per_host))
  # --host h:N gives every host N slots whatever the hostfile says.
  for h in "${hosts[@]}"; do spec+="${spec:+,}$h:$ranks_per_host"; done
  if [ -n "$numa" ]; then
    cmd=(mpirun -np "$np" --host "$spec" --map-by "ppr:$((ranks_per_host / numa)):numa" --bind-to numa)
  else
    cmd=(mpirun -np "$np" --host "$spec" --map-by "ppr:${ranks_per_host}:node" --bind-to none)
  fi
  # OpenMPI refuses root unless asked; containers often run as root.
  [ "$(id -u)" -eq 0 ] && cmd+=(--allow-run-as-root)
  cmd+=(--mca plm_rsh_args "${ssh_opts[*]}")
  cmd+=(-x "NCCL_DEBUG=${NCCL_DEBUG:-WARN}" -x "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
  [ -n "${NCCL_SOCKET_IFNAME:-}" ] && cmd+=(-x "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME")
  for kv in "${envs[@]}"; do cmd+=(-x "$kv"); done
}
build_cmd

# The meshtrain command of attempt K (0: the first): a restart resumes, so
# it drops --fresh.
train_args() {
  local a
  printf '%s\0' "$binary" train --config "$config"
  for a in "${extra[@]}"; do
    [ "$1" -gt 0 ] && [ "$a" = --fresh ] && continue
    printf '%s\0' "$a"
  done
}
attempt_dir() { if ((max_restarts)); then echo "$log_dir/attempt-$1"; else echo "$log_dir"; fi; }

echo "launch-mpirun.sh: ${#hosts[@]} host(s) x $ranks_per_host rank(s) = $np processes"
mapfile -d '' -t targs < <(train_args 0)
printf '%q ' "${cmd[@]}" --output-filename "$(attempt_dir 0)" "${targs[@]}"
echo
((dry_run)) && exit 0

command -v mpirun >/dev/null || die "mpirun not found on PATH (install openmpi-bin)"
[ -x "$binary" ] || die "binary '$binary' not found; build it with scripts/build.sh meshtrain"

# Every other host, in parallel: reachable, and the binary and config there.
is_local() {
  [ "$1" = localhost ] || [ "$1" = 127.0.0.1 ] || [ "$1" = "$(hostname)" ] || [ "$1" = "$(hostname -s)" ] ||
    ip -o addr show 2>/dev/null | awk '{ split($4, a, "/"); print a[1] }' | grep -qxF "$1"
}
# Sets unreachable_hosts (ssh could not connect: exit 255) and failed (every
# host that is not ready); returns 1 when any host is not ready.
preflight() {
  local h dir pids=() names=() i rc check
  unreachable_hosts=() failed=()
  dir="$(mktemp -d)"
  # Relative paths are taken from this directory on every host, as mpirun does.
  check="cd $(printf '%q' "$PWD") || exit 3; test -x $(printf '%q' "$binary") || { echo 'no binary $binary'; exit 3; }"
  check+="; test -f $(printf '%q' "$config") || { echo 'no config $config'; exit 3; }"
  for h in "${hosts[@]}"; do
    is_local "$h" && continue
    # shellcheck disable=SC2029  # $check is built here on purpose, with quoted paths
    ssh "${ssh_opts[@]}" "$h" "$check" >"$dir/$h" 2>&1 </dev/null &
    pids+=($!) names+=("$h")
  done
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    ((rc)) || continue
    say "host ${names[$i]} is not ready (checked over ssh, connect timeout ${connect_timeout} s): $(tr '\n' ' ' <"$dir/${names[$i]}")"
    failed+=("${names[$i]}")
    ((rc == 255)) && unreachable_hosts+=("${names[$i]}")
  done
  rm -rf "$dir"
  ((${#failed[@]} == 0))
}

# The mesh [dp, pp, tp] the run asks for: the last -- --n_device_axis, else
# the last -- --set device_config.n_device_axis=[...], else the config's.
mesh_of() {
  local i flag="" set=""
  for ((i = 0; i < ${#extra[@]}; i++)); do
    case "${extra[$i]}" in
      --n_device_axis) flag="${extra[*]:i+1:3}" ;;
      --set) [[ "${extra[i + 1]:-}" == device_config.n_device_axis=* ]] && set="${extra[i + 1]#*=}" ;;
    esac
  done
  if [ -n "$flag" ]; then echo "$flag"
  elif [ -n "$set" ]; then tr -d '[] ' <<<"$set" | tr ',' ' '
  else
    python3 -c 'import json, sys
print(*json.load(open(sys.argv[1])).get("device_config", {}).get("n_device_axis", [1, 1, 1]))' "$config"
  fi
}

# device_config.context_parallel of the run: the last -- --set, else the config's (1).
cp_of() {
  local i set=""
  for ((i = 0; i < ${#extra[@]}; i++)); do
    if [ "${extra[$i]}" = --set ] && [[ "${extra[i + 1]:-}" == device_config.context_parallel=* ]]; then
      set="${extra[i + 1]#*=}"
    fi
  done
  if [ -n "$set" ]; then echo "$set"
  else
    python3 -c 'import json, sys
print(json.load(open(sys.argv[1])).get("device_config", {}).get("context_parallel", 1))' "$config"
  fi
}

# --drop-unreachable: leaves out the hosts preflight could not reach and
# passes the smaller dp (pp, tp and cp kept); fails when that is impossible.
drop_hosts() {
  local h keep=() dp pp tp cp world new_dp i args=()
  for h in "${hosts[@]}"; do [[ " ${unreachable_hosts[*]} " == *" $h "* ]] || keep+=("$h"); done
  read -r dp pp tp < <(mesh_of) || true
  cp="$(cp_of)" || true
  [[ "$dp$pp$tp$cp" =~ ^[0-9]+$ ]] || { say "cannot read the mesh [dp, pp, tp] and context_parallel of the run to shrink it"; return 1; }
  world=$((${#keep[@]} * ranks_per_host))
  if ((world == 0 || world % (pp * tp * cp))); then
    say "cannot leave out ${unreachable_hosts[*]}: the ${world} rank(s) left are not a multiple of pp x tp x cp = $pp x $tp x $cp"
    return 1
  fi
  new_dp=$((world / (pp * tp * cp)))
  local cp_note=""
  if ((cp > 1)); then cp_note=" x cp $cp"; fi
  hosts=("${keep[@]}")
  # -- --n_device_axis wins over --set and the config: replace it.
  for ((i = 0; i < ${#extra[@]}; i++)); do
    if [ "${extra[$i]}" = --n_device_axis ]; then i=$((i + 3)); continue; fi
    args+=("${extra[$i]}")
  done
  extra=("${args[@]}" --n_device_axis "$new_dp" "$pp" "$tp")
  build_cmd
  say "--drop-unreachable: left out unreachable host(s) ${unreachable_hosts[*]}; going on with ${#hosts[@]}" \
    "host(s) (${hosts[*]}): world $world, mesh dp $new_dp x pp $pp x tp $tp${cp_note} (was dp $dp)"
}

# preflight; with --drop-unreachable, hosts it could not reach are left out
# (a host that answers but lacks the binary or config still stops the launch).
hosts_ready() {
  preflight && return 0
  ((drop_unreachable)) && ((${#unreachable_hosts[@]} == ${#failed[@]})) || return 1
  drop_hosts
}
hosts_ready || { say "nothing started"; exit 1; }

# What an attempt's log says: the newest checkpoint saved, the step it
# started from, the last step trained, and the first error line.
# (grep finding nothing must not end this script: set -e and pipefail hold.)
last_saved() { { grep -ho 'saved checkpoint of step [0-9]*' "$@" 2>/dev/null || true; } | awk '{ s = $NF } END { print s + 0 }'; }
started_at() { { grep -ho 'training [0-9]* -> ' "$1" 2>/dev/null || true; } | awk '{ print $2; exit }'; }
# The last step logged, else the step the attempt resumed from: a step's line
# is written once the next step is enqueued, so an attempt that fails in its
# second step logs none.
last_step() {
  { grep -ho 'Step [0-9]*' "$1" 2>/dev/null || true; } | awk -v s="$(started_at "$1")" '{ s = $NF } END { print s + 0 }'
}
first_error() {
  local p line
  for p in 'exited on signal|watchdog:|\[error\]|not ready' 'terminated|aborted|Killed|error'; do
    line="$({ grep -h -m1 -E "$p" "$1" 2>/dev/null || true; } | head -c 300)" || true
    [ -n "$line" ] && { echo "$line"; return; }
  done
  return 0
}

# A stop request (SIGTERM, SIGINT, SIGUSR1 to this script) goes to mpirun as
# SIGUSR1, which it forwards to every rank: they save and exit 0. No restart follows.
mpi_pid="" stopping=0
on_stop() {
  stopping=1
  [ -n "$mpi_pid" ] && kill -USR1 "$mpi_pid" 2>/dev/null
  return 0
}
trap on_stop TERM INT USR1

# What mpirun prints when it tears the job down.
abort_pattern='job has been aborted|mpirun noticed that|ORTE has lost communication|MPI_ABORT was invoked'
abort_grace=20 unreachable=0
prev_step=-1 prev_saved=-1
for ((k = 0; ; k++)); do
  dir="$(attempt_dir "$k")"
  mkdir -p "$dir"
  log="$dir/mpirun.log"
  mapfile -d '' -t targs < <(train_args "$k")
  : >"$log"  # before tail opens it
  "${cmd[@]}" --output-filename "$dir" "${targs[@]}" >"$log" 2>&1 &
  mpi_pid=$!
  tail -n +1 -f --pid="$mpi_pid" "$log" &
  tail_pid=$!
  # mpirun can wait forever for a host it cannot reach to confirm the end of
  # the job (the ranks there are gone or cut off): once it says the job is
  # aborted, it has abort_grace s to finish, then it is killed.
  aborted_at=0 rc=""
  while kill -0 "$mpi_pid" 2>/dev/null; do
    sleep 1 &
    wait $! 2>/dev/null || true  # a trapped signal ends it early
    if ((aborted_at == 0)) && grep -qE "$abort_pattern" "$log"; then aborted_at=$SECONDS; fi
    if ((aborted_at > 0 && SECONDS - aborted_at > abort_grace)); then
      say "mpirun still runs ${abort_grace} s after the job was aborted (a host it cannot reach?): killing it"
      kill -TERM "$mpi_pid" 2>/dev/null || true
      sleep 2
      kill -KILL "$mpi_pid" 2>/dev/null || true
      unreachable=1
      break
    fi
  done
  set +e
  wait "$mpi_pid"
  rc=$?
  wait "$tail_pid" 2>/dev/null
  set -e
  if ((unreachable)); then
    ((rc == 0)) && rc=1
    # Name the host (a restart checks the hosts anyway).
    ((max_restarts == 0 || stopping || k >= max_restarts)) && { preflight || true; }
    unreachable=0
  fi
  mpi_pid=""
  ((rc == 0)) && exit 0
  ((max_restarts == 0 || stopping)) && exit "$rc"
  saved="$(last_saved "$log_dir"/attempt-*/mpirun.log)"
  step="$(last_step "$log")"
  cause="$(first_error "$log")"
  say "attempt $k (started at step $(started_at "$log")) failed with mpirun exit $rc after step $step:" \
    "${cause:-no error line in $log}"
  if ((step == prev_step && saved == prev_saved)); then
    say "giving up: attempt $k failed at step $step like the one before it, with no newer checkpoint"
    exit "$rc"
  fi
  if ((k >= max_restarts)); then
    say "giving up: all $max_restarts restart(s) used"
    exit "$rc"
  fi
  prev_step=$step prev_saved=$saved
  hosts_ready || { say "restart $((k + 1)): a host is not ready; giving up"; exit 1; }
  if ((saved > 0)); then from="step $saved (the newest checkpoint)"; else from="the newest checkpoint of the run dir (this launch saved none)"; fi
  say "restart $((k + 1)) of $max_restarts: resuming from $from"
done
