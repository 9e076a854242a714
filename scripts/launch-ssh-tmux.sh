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
                                  [--ranks-per-host N] [--user USER] [--dry-run]
                                  [-- extra meshtrain train arguments]
       scripts/launch-ssh-tmux.sh (--hosts ... | --hostfile FILE) [--session NAME] --kill
       scripts/launch-ssh-tmux.sh --attach HOST [--session NAME] [--user USER]

On every host, in parallel, over ssh (passwordless ssh assumed, as mpirun needs):
  1. (re)create the tmux session NAME (an old one of that name is killed),
  2. in it: clone URL_OR_PATH into the workdir if absent, `git fetch` and
     `git reset --hard REF`, then scripts/setup.sh and scripts/build.sh meshtrain;
     success leaves the marker /tmp/meshtrain-ready-NAME on that host.
The MPI world spans all hosts: only the FIRST host starts the job. Its session
waits until every host has its ready marker (it checks the others over ssh,
which mpirun needs anyway), then runs
  mpirun --host h1:S,h2:S,... -np hosts*S build/meshtrain train --config FILE ...
which starts the ranks on all hosts (rank 0 on the first). The other hosts only
prepare. If a host fails to prepare it leaves /tmp/meshtrain-failed-NAME and the
first host gives up without starting mpirun; attach to see why.

  --hosts LIST         comma-separated host names or IPs (the first one runs mpirun)
  --hostfile FILE      one host per line instead ("#" comments allowed)
  --repo URL_OR_PATH   git repository to clone/fetch on each host
  --ref REF            commit, tag or remote branch to run (default: origin/main)
  --workdir DIR        checkout location on each host (default: ~/meshtrain)
  --session NAME       tmux session name (default: meshtrain)
  --config FILE        run config, relative to the workdir or absolute
  --ranks-per-host N   processes per host, normally its GPU count (default: 1)
  --user USER          ssh as USER@host
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
hosts_arg="" hostfile="" repo="" ref="origin/main" workdir="~/meshtrain" session="meshtrain"
config="" ranks_per_host=1 user="" dry_run=0 kill=0 attach=""
extra=()
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
ssh_opts=(-o BatchMode=yes -o ConnectTimeout=20)

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

# The lines sent to a host's shell, one command each.
remote_lines() {
  local host="$1" first="$2"
  local ready="/tmp/meshtrain-ready-$session" failed="/tmp/meshtrain-failed-$session"
  if ((kill)); then
    echo "tmux kill-session -t $session 2>/dev/null || true"
    echo "rm -f $ready $failed"
    return
  fi
  # The workdir is left unquoted for the tmux shell so "~" expands there.
  local prepare
  prepare="{ [ -d $workdir/.git ] || git clone $(sq "$repo") $workdir; } && cd $workdir"
  prepare+=" && git remote set-url origin $(sq "$repo") && git fetch --tags origin"
  prepare+=" && git reset --hard $(sq "$ref")"
  prepare+=" && scripts/setup.sh && scripts/build.sh meshtrain && touch $ready || touch $failed"
  echo "tmux kill-session -t $session 2>/dev/null || true"
  echo "rm -f $ready $failed"
  echo "tmux new-session -d -s $session bash"
  echo "tmux send-keys -t $session:0 $(sq "$prepare") C-m"
  if ((first)); then
    local others="" h spec="" np
    for h in "${hosts[@]}"; do
      spec+="${spec:+,}$h:$ranks_per_host"
      [ "$h" = "$host" ] || others+=" $h"
    done
    np=$((${#hosts[@]} * ranks_per_host))
    # Wait for every node's build before mpirun starts ranks on it.
    # Its own preparation ran just before in the same shell.
    local wait="ok=1; [ -e $ready ] || ok=0"
    if [ -n "$others" ]; then
      wait+="; for h in$others; do until ssh -o BatchMode=yes \$h test -e $ready; do"
      wait+=" if ssh -o BatchMode=yes \$h test -e $failed; then echo \"\$h failed to prepare\"; ok=0; break 2; fi;"
      wait+=" echo \"waiting for \$h\"; sleep 10; done; done"
    fi
    local mpi="mpirun --host $spec -np $np --map-by ppr:$ranks_per_host:node --bind-to none"
    mpi+=" \$([ \"\$(id -u)\" = 0 ] && echo --allow-run-as-root)"
    mpi+=" -x NCCL_DEBUG=\${NCCL_DEBUG:-WARN} -x OMP_NUM_THREADS=1"
    [ -n "${NCCL_SOCKET_IFNAME:-}" ] && mpi+=" -x NCCL_SOCKET_IFNAME=$(sq "$NCCL_SOCKET_IFNAME")"
    mpi+=" --wdir \$PWD --output-filename \$PWD/runs/launch-logs/$session"
    mpi+=" build/meshtrain train --config $(sq "$config")"
    local a
    for a in "${extra[@]}"; do mpi+=" $(sq "$a")"; done
    echo "tmux send-keys -t $session:0 $(sq "$wait; [ \$ok = 1 ] && $mpi") C-m"
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
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "launch-ssh-tmux.sh: ssh to ${hosts[$i]} failed" >&2; failed=1; }
done
((failed)) && exit 1
if ((kill)); then
  echo "killed tmux session '$session' on ${#hosts[@]} host(s)"
else
  echo "started: hosts prepare in tmux session '$session'; ${hosts[0]} then runs mpirun."
  echo "watch:   scripts/launch-ssh-tmux.sh --attach ${hosts[0]} --session $session"
fi
