#!/usr/bin/env bash
# The Jaxformer way of launching on machines without a scheduler: ssh into every
# node in parallel, drive a tmux session there (so the job survives the ssh
# connection and anyone can attach to watch it), update the checkout, build,
# and start the run from the first node with one mpirun spanning all nodes.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/launch-ssh-tmux.sh (--hosts "h1,h2,..." | --hostfile FILE) --repo URL_OR_PATH
                                  --config FILE [--ref REF] [--workdir DIR] [--session NAME]
                                  [--ranks-per-host N] [--user USER] [--env K=V ...]
                                  [--binary PATH] [--connect-timeout S] [--prepare-timeout S]
                                  [--max-restarts N]
                                  [--dry-run]
                                  [-- extra meshtrain train arguments]
       scripts/launch-ssh-tmux.sh (--hosts ... | --hostfile FILE) [--session NAME] --kill
       scripts/launch-ssh-tmux.sh --attach HOST [--session NAME] [--user USER]

On every host, in parallel, over ssh (passwordless ssh assumed, as mpirun needs):
  1. (re)create the tmux session NAME (an old one of that name is killed),
  2. in it: export the --env variables, clone URL_OR_PATH into the host's
     workdir if absent, `git fetch` and `git reset --hard REF`, then
     scripts/setup.sh and scripts/build.sh meshtrain (not with --binary);
     success leaves the marker /tmp/meshtrain-ready-NAME-ID on that host (ID:
     this launch's, so an earlier launch's markers never count).
The MPI world spans all hosts: only the FIRST host starts the job. Its session
waits until every host has its ready marker (it checks the others over ssh,
which mpirun needs anyway), then runs one mpirun with one part per host:
  mpirun --host h1:S -np S --wdir W1 W1/build/meshtrain train --config FILE ... : --host h2:S ...
which starts the ranks on all hosts (rank 0 on the first). The other hosts only
prepare. Every wait is bounded and names the host it waited for: a host that
fails to prepare (it leaves /tmp/meshtrain-failed-NAME-ID), cannot be reached 3
times in a row, or is not ready after --prepare-timeout makes the first host
give up without starting mpirun; attach to see why. A host that cannot be
reached at launch makes the launcher stop the sessions it started, name the
host and exit 1.

Each host has its own workdir ("{host}" in --workdir is the host's name as
given), so hosts sharing an NFS home never clone and build in one folder. The
run dir must be shared by every host (meshtrain checks this at start-up):
pass -- --output_dir /shared/runs unless the config's output_dir is shared.

  --hosts LIST         comma-separated host names or IPs (the first one runs mpirun)
  --hostfile FILE      one host per line instead ("#" comments allowed)
  --repo URL_OR_PATH   git repository to clone/fetch on each host
  --ref REF            commit, tag or remote branch to run (default: origin/main)
  --workdir DIR        checkout location on each host; "{host}" becomes the
                       host's name (default: ~/meshtrain/{host})
  --session NAME       tmux session name (default: meshtrain)
  --config FILE        run config, relative to the workdir or absolute
  --ranks-per-host N   processes per host, normally its GPU count (default: 1)
  --user USER          ssh as USER@host
  --env K=V            export K=V on every host, for the preparation and every
                       rank (repeatable), e.g. --env MESHTRAIN_OFFLINE=1
  --binary PATH        run this prebuilt meshtrain (same path on every host)
                       instead of running setup.sh and building
  --connect-timeout S  seconds an ssh connection may take (default 10)
  --prepare-timeout S  seconds the first host waits for the others to prepare
                       (default 7200)
  --max-restarts N     when mpirun fails, start it again up to N times, resuming
                       from the newest checkpoint (--fresh dropped); stops early
                       when an attempt fails at the same step as the one before
                       with no newer checkpoint (default 0)
  --dry-run            print every command that would be sent over ssh, one per
                       line, prefixed by "HOST: ", and send nothing
  --kill               kill the tmux session (and so the job) on every host
  --attach HOST        exec `ssh -t HOST tmux attach -t NAME` to watch the run
  -h, --help           this text
  -- ARGS              passed to `meshtrain train` (e.g. -- --n_device_axis 8 2 2)

Example (the Jaxformer run, 8 hosts with 4 devices each):
  scripts/launch-ssh-tmux.sh --hostfile ips.txt --repo git@github.com:me/meshtrain.git \
      --ref origin/main --ranks-per-host 4 --config configs/moe1b.json \
      -- --n_device_axis 8 2 2 --name moe1B --checkpoint_steps 75 --eval_steps 10
USAGE
}

die() {
  echo "launch-ssh-tmux.sh: error: $*" >&2
  echo "Run 'scripts/launch-ssh-tmux.sh --help' for usage." >&2
  exit 2
}

need_value() {
  [ "$2" -ge 2 ] || die "$1 needs a value"
}

# POSIX single-quoting, so a string survives the remote shell unchanged; plain
# words stay bare so the printed commands remain readable.
sq() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,@+%-]+$ ]]; then
    printf '%s' "$1"
  else
    local s=${1//\'/\'\\\'\'}
    printf "'%s'" "$s"
  fi
}

# "~" stays literal: it is expanded by the shell on each host, not here.
# shellcheck disable=SC2088
hosts_arg="" hostfile="" repo="" ref="origin/main" workdir="~/meshtrain/{host}" session="meshtrain"
config="" ranks_per_host=1 user="" dry_run=0 kill=0 attach="" binary="" connect_timeout=10 prepare_timeout=7200
max_restarts=0
envs=() extra=()
while (($#)); do
  case "$1" in
    --hosts) need_value "$1" $#; hosts_arg="$2"; shift 2 ;;
    --hostfile) need_value "$1" $#; hostfile="$2"; shift 2 ;;
    --repo) need_value "$1" $#; repo="$2"; shift 2 ;;
    --ref) need_value "$1" $#; ref="$2"; shift 2 ;;
    --workdir) need_value "$1" $#; workdir="$2"; shift 2 ;;
    --session) need_value "$1" $#; session="$2"; shift 2 ;;
    --config) need_value "$1" $#; config="$2"; shift 2 ;;
    --ranks-per-host) need_value "$1" $#; ranks_per_host="$2"; shift 2 ;;
    --user) need_value "$1" $#; user="$2"; shift 2 ;;
    --env) need_value "$1" $#; envs+=("$2"); shift 2 ;;
    --binary) need_value "$1" $#; binary="$2"; shift 2 ;;
    --connect-timeout) need_value "$1" $#; connect_timeout="$2"; shift 2 ;;
    --prepare-timeout) need_value "$1" $#; prepare_timeout="$2"; shift 2 ;;
    --max-restarts) need_value "$1" $#; max_restarts="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --kill) kill=1; shift ;;
    --attach) need_value "$1" $#; attach="$2"; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1'" ;;
  esac
done

[[ "$session" =~ ^[A-Za-z0-9_.-]+$ ]] || die "--session must be letters, digits, '_', '.', '-'; got '$session'"
ssh_target() { if [ -n "$user" ]; then echo "$user@$1"; else echo "$1"; fi; }
[[ "$connect_timeout" =~ ^[1-9][0-9]*$ ]] || die "--connect-timeout must be a positive integer, got '$connect_timeout'"
[[ "$prepare_timeout" =~ ^[1-9][0-9]*$ ]] || die "--prepare-timeout must be a positive integer, got '$prepare_timeout'"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts must be a non-negative integer, got '$max_restarts'"
for kv in "${envs[@]}"; do
  [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env takes NAME=VALUE, got '$kv'"
done
# No prompts, bounded connects, keep-alives: here, in the first host's waits,
# and for mpirun's own ssh (a vanished host ends the job in ~15 s).
ssh_opts=(-o BatchMode=yes -o "ConnectTimeout=$connect_timeout" -o ServerAliveInterval=5 -o ServerAliveCountMax=3)

if [ -n "$attach" ]; then
  cmd=(ssh -t "$(ssh_target "$attach")" tmux attach -t "$session")
  if ((dry_run)); then echo "$attach: ${cmd[*]}"; exit 0; fi
  exec "${cmd[@]}"
fi

hosts=()
if [ -n "$hosts_arg" ]; then
  IFS=',' read -r -a hosts <<<"$hosts_arg"
elif [ -n "$hostfile" ]; then
  [ -f "$hostfile" ] || die "--hostfile '$hostfile' does not exist"
  mapfile -t hosts < <(sed -e 's/#.*//' "$hostfile" | awk 'NF { print $1 }')
else
  die "missing --hosts LIST or --hostfile FILE"
fi
((${#hosts[@]})) || die "no hosts given"
for h in "${hosts[@]}"; do
  [[ "$h" =~ ^[A-Za-z0-9_.:-]+$ ]] || die "bad host name '$h'"
done

# This launch's id (seconds and pid): it names the ready/failed markers on the hosts.
launch_id="$(date +%s)-$$"

host_workdir() { echo "${workdir//\{host\}/$1}"; }

# The lines sent to a host's shell, one command each.
remote_lines() {
  local host="$1" first="$2"
  # One pair of markers per launch (launch_id): a marker left by an earlier
  # launch of the same session can never pass for this one's.
  local ready="/tmp/meshtrain-ready-$session-$launch_id" failed="/tmp/meshtrain-failed-$session-$launch_id"
  local stale="/tmp/meshtrain-ready-$session-* /tmp/meshtrain-failed-$session-*"
  if ((kill)); then
    echo "tmux kill-session -t $session 2>/dev/null || true"
    echo "rm -f $stale"
    return
  fi
  # The workdir is left unquoted for the tmux shell so "~" expands there.
  local wd kv prepare="" build="scripts/setup.sh && scripts/build.sh meshtrain"
  wd="$(host_workdir "$host")"
  [ -n "$binary" ] && build="test -x $(sq "$binary")"
  for kv in "${envs[@]}"; do prepare+="export $(sq "$kv"); "; done
  prepare+="{ mkdir -p \$(dirname $wd) && { [ -d $wd/.git ] || git clone $(sq "$repo") $wd; } && cd $wd"
  prepare+=" && git remote set-url origin $(sq "$repo") && git fetch --tags origin"
  prepare+=" && git reset --hard $(sq "$ref")"
  prepare+=" && $build && touch $ready; } || { touch $failed; echo \"$host failed to prepare\"; }"
  echo "tmux kill-session -t $session 2>/dev/null || true"
  echo "rm -f $stale"
  echo "tmux new-session -d -s $session bash"
  echo "tmux send-keys -t $session:0 $(sq "$prepare") C-m"
  if ((first)); then
    local others="" h mpi_parts="" hw bin a args=""
    for h in "${hosts[@]}"; do [ "$h" = "$host" ] || others+=" $h"; done
    # Wait for every node's preparation before mpirun starts ranks on it,
    # bounded: a failed, unreachable (3 times in a row) or late host stops it.
    local ssh_line="ssh ${ssh_opts[*]}"
    local wait="ok=1; [ -e $ready ] || { echo \"$host (this host) failed to prepare\"; ok=0; }"
    if [ -n "$others" ]; then
      wait+="; end=\$((SECONDS + $prepare_timeout)); for h in$others; do miss=0; while [ \$ok = 1 ]; do"
      wait+=" $ssh_line \$h test -e $ready; r=\$?; [ \$r = 0 ] && break;"
      wait+=" if [ \$r = 255 ]; then miss=\$((miss + 1)); else miss=0; fi;"
      wait+=" if [ \$miss -ge 3 ]; then echo \"\$h cannot be reached over ssh (3 tries); not starting\"; ok=0; break; fi;"
      wait+=" if $ssh_line \$h test -e $failed; then echo \"\$h failed to prepare; not starting\"; ok=0; break; fi;"
      wait+=" if [ \$SECONDS -ge \$end ]; then echo \"\$h is not ready after $prepare_timeout s"
      wait+=" (no $ready); not starting\"; ok=0; break; fi;"
      wait+=" echo \"waiting for \$h to prepare ($ready)\"; sleep 5; done; done"
    fi
    local again="" again_parts=""
    for a in "${extra[@]}"; do
      args+=" $(sq "$a")"
      [ "$a" = --fresh ] || again+=" $(sq "$a")"  # a restart resumes
    done
    for h in "${hosts[@]}"; do
      hw="$(host_workdir "$h")"
      bin="$hw/build/meshtrain"
      [ -n "$binary" ] && bin="$(sq "$binary")"
      mpi_parts+="${mpi_parts:+ :} --host $h:$ranks_per_host -np $ranks_per_host --wdir $hw $bin train"
      mpi_parts+=" --config $(sq "$config")$args"
      again_parts+="${again_parts:+ :} --host $h:$ranks_per_host -np $ranks_per_host --wdir $hw $bin train"
      again_parts+=" --config $(sq "$config")$again"
    done
    local mpi="mpirun --bind-to none"
    mpi+=" \$([ \"\$(id -u)\" = 0 ] && echo --allow-run-as-root)"
    mpi+=" --mca plm_rsh_args $(sq "${ssh_opts[*]}")"
    mpi+=" -x NCCL_DEBUG=\${NCCL_DEBUG:-WARN} -x OMP_NUM_THREADS=1"
    [ -n "${NCCL_SOCKET_IFNAME:-}" ] && mpi+=" -x NCCL_SOCKET_IFNAME=$(sq "$NCCL_SOCKET_IFNAME")"
    for kv in "${envs[@]}"; do mpi+=" -x ${kv%%=*}"; done
    if ((max_restarts == 0)); then
      mpi+=" --output-filename \$PWD/runs/launch-logs/$session$mpi_parts"
      echo "tmux send-keys -t $session:0 $(sq "$wait; [ \$ok = 1 ] && $mpi") C-m"
      return
    fi
    # --max-restarts: a failed attempt starts again (without --fresh: train
    # resumes from the newest checkpoint); each logged with its step, and the
    # loop stops when an attempt fails at the same step as the one before it
    # with no newer checkpoint. Rank 0's log: LOGS/attempt-K/1/rank.0/stderr.
    local logs="\$PWD/runs/launch-logs/$session" n="$max_restarts"
    local loop="a=0; prev=; while :; do o=$logs/attempt-\$a;"
    loop+=" if [ \$a = 0 ]; then $mpi --output-filename \$o$mpi_parts; else $mpi --output-filename \$o$again_parts; fi;"
    loop+=" rc=\$?; [ \$rc = 0 ] && break;"
    loop+=" step=\$(grep -ho 'Step [0-9]*' \$o/1/rank.0/stderr 2>/dev/null | tail -1 | awk '{ print \$2 }');"
    loop+=" saved=\$(cat $logs/attempt-*/1/rank.0/stderr 2>/dev/null | grep -o 'saved checkpoint of step [0-9]*' | tail -1 | awk '{ print \$NF }');"
    loop+=" echo \"attempt \$a failed with mpirun exit \$rc after step \${step:-0}\";"
    loop+=" if [ \$a -ge $n ]; then echo \"giving up: all $n restart(s) used\"; break; fi;"
    loop+=" if [ \"\${step:-0}:\${saved:-0}\" = \"\$prev\" ]; then echo \"giving up: attempt \$a failed at step \${step:-0}"
    loop+=" like the one before it, with no newer checkpoint\"; break; fi;"
    loop+=" prev=\${step:-0}:\${saved:-0}; a=\$((a + 1));"
    loop+=" echo \"restart \$a of $n: resuming from the newest checkpoint (step \${saved:-0} saved so far)\"; done"
    echo "tmux send-keys -t $session:0 $(sq "$wait; [ \$ok = 1 ] && { $loop; }") C-m"
  fi
}

if ((!kill)); then
  [ -n "$repo" ] || die "missing --repo URL_OR_PATH"
  [ -n "$config" ] || die "missing --config FILE"
  [[ "$ranks_per_host" =~ ^[1-9][0-9]*$ ]] || die "--ranks-per-host must be a positive integer, got '$ranks_per_host'"
fi

if ((dry_run)); then
  first=1
  for h in "${hosts[@]}"; do
    while IFS= read -r line; do echo "$h: $line"; done < <(remote_lines "$h" "$first")
    first=0
  done
  exit 0
fi

run_host() {
  local host="$1" first="$2"
  remote_lines "$host" "$first" | ssh "${ssh_opts[@]}" "$(ssh_target "$host")" bash -s 2>&1 |
    sed -u "s|^|$host: |"
  return "${PIPESTATUS[1]}"
}

pids=()
first=1
for h in "${hosts[@]}"; do
  run_host "$h" "$first" &
  pids+=($!)
  first=0
done
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${hosts[$i]}")
done
if ((${#failed[@]})); then
  for h in "${failed[@]}"; do echo "launch-ssh-tmux.sh: ssh to $h failed (connect timeout ${connect_timeout} s)" >&2; done
  if ((!kill)); then
    # The sessions already started would wait for the failed host: stop them.
    for h in "${hosts[@]}"; do
      [[ " ${failed[*]} " == *" $h "* ]] && continue
      # shellcheck disable=SC2029  # the session name is expanded here on purpose
      ssh "${ssh_opts[@]}" "$(ssh_target "$h")" "tmux kill-session -t $session 2>/dev/null; rm -f /tmp/meshtrain-ready-$session-*" \
        </dev/null >/dev/null 2>&1 || true
    done
    echo "launch-ssh-tmux.sh: stopped the session '$session' on the other host(s); nothing runs" >&2
  fi
  exit 1
fi
if ((kill)); then
  echo "killed tmux session '$session' on ${#hosts[@]} host(s)"
else
  echo "started: hosts prepare in tmux session '$session'; ${hosts[0]} then runs mpirun."
  echo "watch:   scripts/launch-ssh-tmux.sh --attach ${hosts[0]} --session $session"
fi
