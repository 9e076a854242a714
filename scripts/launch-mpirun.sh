#!/usr/bin/env bash
# Starts one meshtrain training run over the hosts of an MPI hostfile: one
# process per device, N per host, all started by a single mpirun.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/launch-mpirun.sh --hostfile FILE --ranks-per-host N --config FILE
                                [--binary PATH] [--log-dir DIR] [--dry-run]
                                [-- extra meshtrain train arguments]

Builds and runs (or with --dry-run only prints) the mpirun command that starts
`meshtrain train` with hosts x ranks-per-host processes, N on each host.

  --hostfile FILE       one host per line (OpenMPI syntax; "slots=" and "#"
                        comments are allowed, slots are set by --ranks-per-host)
  --ranks-per-host N    processes per host, normally its number of GPUs
  --config FILE         the run's JSON config (same path on every host)
  --binary PATH         meshtrain binary (default: <repo>/build/meshtrain)
  --log-dir DIR         per-rank stdout/stderr go to DIR/1/rank.K/
                        (default: runs/launch-logs/<date-time>)
  --dry-run             print the command, run nothing
  -h, --help            this text
  -- ARGS               passed to `meshtrain train`, e.g.
                        -- --n_device_axis 4 2 2 --set lr.max_lr=3e-4

Environment: NCCL_DEBUG (default WARN) and OMP_NUM_THREADS (default 1) are
exported to every rank, NCCL_SOCKET_IFNAME too when it is set.

Example:
  scripts/launch-mpirun.sh --hostfile hosts.txt --ranks-per-host 8 \
      --config configs/moe1b.json -- --n_device_axis 8 2 1
USAGE
}

die() {
  echo "launch-mpirun.sh: error: $*" >&2
  echo "Run 'scripts/launch-mpirun.sh --help' for usage." >&2
  exit 2
}

need_value() {
  [ "$2" -ge 2 ] || die "$1 needs a value"
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hostfile="" ranks_per_host="" config="" binary="$ROOT/build/meshtrain" log_dir="" dry_run=0
extra=()
while (($#)); do
  case "$1" in
    --hostfile) need_value "$1" $#; hostfile="$2"; shift 2 ;;
    --ranks-per-host) need_value "$1" $#; ranks_per_host="$2"; shift 2 ;;
    --config) need_value "$1" $#; config="$2"; shift 2 ;;
    --binary) need_value "$1" $#; binary="$2"; shift 2 ;;
    --log-dir) need_value "$1" $#; log_dir="$2"; shift 2 ;;
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

# Unique host names, in file order, without comments or slot counts.
mapfile -t hosts < <(sed -e 's/#.*//' "$hostfile" | awk 'NF { print $1 }' | awk '!seen[$0]++')
((${#hosts[@]})) || die "--hostfile '$hostfile' names no hosts"
np=$((${#hosts[@]} * ranks_per_host))
[ -n "$log_dir" ] || log_dir="$ROOT/runs/launch-logs/$(date +%Y%m%d-%H%M%S)"

cmd=(mpirun -np "$np" --hostfile "$hostfile" --map-by "ppr:${ranks_per_host}:node" --bind-to none)
# OpenMPI refuses root unless asked; containers often run as root.
[ "$(id -u)" -eq 0 ] && cmd+=(--allow-run-as-root)
cmd+=(-x "NCCL_DEBUG=${NCCL_DEBUG:-WARN}" -x "OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
[ -n "${NCCL_SOCKET_IFNAME:-}" ] && cmd+=(-x "NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME")
cmd+=(--output-filename "$log_dir")
cmd+=("$binary" train --config "$config" "${extra[@]}")

echo "launch-mpirun.sh: ${#hosts[@]} host(s) x $ranks_per_host rank(s) = $np processes"
printf '%q ' "${cmd[@]}"
echo
((dry_run)) && exit 0

command -v mpirun >/dev/null || die "mpirun not found on PATH (install openmpi-bin)"
[ -x "$binary" ] || die "binary '$binary' not found; build it with scripts/build.sh meshtrain"
mkdir -p "$log_dir"
exec "${cmd[@]}"
