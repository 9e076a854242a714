#!/usr/bin/env bash
# A multi-host test bed on one machine, sourced by the tests/e2e/hosts_*.sh
# tests: N "hosts" h1..hN, each a network namespace (joined to the others by
# veth pairs on a bridge in a namespace of its own; addresses 10.77.X.K/24
# exist only inside them, nothing is added to this machine's own network)
# plus its own UTS namespace (hostname hK) and mount namespace (private /tmp,
# /dev/shm, and an /etc/hosts naming the hosts), with its own sshd. The rest of
# the file system is common to all, like an NFS home: the test's folder is the
# shared storage, /tmp is the local disk.
#
#   source tests/hosts/testbed.sh; bed_up DIR N   # or exit 77 with the reason
#   on_host h2 CMD...     run CMD on h2 (its namespaces, cwd kept)
#   on_host_for S h2 CMD  the same, killed after S seconds (timeout's rc 124)
#   ssh h2 CMD            as mpirun and the launchers do (bed's key and config)
#   bed_link h2 down|up   cut h2's network cable (mid-run faults)
#   bed_down              everything made is removed; also run by the EXIT trap
#
# ssh for the bed: $BED/bin/ssh (first on PATH inside and outside the hosts)
# uses the bed's own key, known_hosts and host names, never ~/.ssh.

BED="" BED_ID="" BED_N=0
BED_ANCHORS=() BED_UTS=()
BED_LOCK_FD=""

bed_skip() { echo "SKIP: multi-host test bed: $*"; exit 77; }

# Whether namespaces can be made here at all (root, ip netns, unshare).
bed_check() {
  [ "$(id -u)" = 0 ] || bed_skip "needs root to make network namespaces (running as uid $(id -u))"
  command -v ip >/dev/null || bed_skip "no 'ip' command (iproute2)"
  local probe="mtbprobe$$"
  ip netns add "$probe" 2>/dev/null || bed_skip "cannot make a network namespace (ip netns add failed)"
  ip netns del "$probe"
  unshare --uts --mount true 2>/dev/null || bed_skip "cannot make UTS/mount namespaces (unshare failed)"
  command -v /usr/sbin/sshd >/dev/null || {
    echo "FAIL: sshd is not installed: run scripts/setup.sh (it installs openssh-server for these tests)"
    exit 1
  }
}

# One test bed on this machine at a time, whichever checkout's tests make it
# (ctest's RESOURCE_LOCK covers one ctest only): a lock on a file in /run held
# by the test's shell alone. The hosts' processes do not inherit it, so a
# test killed outright frees it.
bed_lock() {
  local lock=/run/meshtrain-testbed.lock wait="${MESHTRAIN_BED_WAIT:-240}"
  exec {BED_LOCK_FD}>>"$lock"
  flock -n "$BED_LOCK_FD" && return 0
  echo "test bed: another test bed is up on this machine ($(cat "$lock.owner" 2>/dev/null)); waiting up to $wait s"
  flock -w "$wait" "$BED_LOCK_FD" ||
    { echo "FAIL: multi-host test bed: another one ($(cat "$lock.owner" 2>/dev/null)) held $lock for $wait s"; exit 1; }
}

bed_ns() { echo "mtb${BED_ID}$1"; }  # network namespace of host $1 (sw: the switch)
bed_ip() { echo "10.77.$((BED_ID % 250)).${1#h}"; }

bed_up() {
  BED="$1" BED_N="$2"
  bed_check
  # Each host mounts a private /tmp and /dev/shm (its local disk): a test bed
  # or a checkout there is invisible to the hosts.
  local p
  for p in "$BED" "$PWD"; do
    case "$(realpath -m "$p")/" in
      /tmp/* | /dev/shm/*)
        echo "FAIL: multi-host test bed: $p is under /tmp or /dev/shm, which every test host mounts privately," \
          "so the hosts cannot see it; build and test from a checkout outside /tmp"
        exit 1 ;;
    esac
  done
  bed_lock
  echo "pid $$, $BED" >/run/meshtrain-testbed.lock.owner
  # A free id: a bed left by a test killed outright keeps its namespaces.
  BED_ID=$(($$ % 250))
  while ip netns list | grep -q "^mtb${BED_ID}sw\b"; do BED_ID=$(((BED_ID + 1) % 250)); done
  trap bed_down EXIT
  rm -rf "$BED"
  mkdir -p "$BED/bin" "$BED/sshd"
  ssh-keygen -q -t ed25519 -N '' -f "$BED/id" -C meshtrain-testbed
  ssh-keygen -q -t ed25519 -N '' -f "$BED/hostkey" -C meshtrain-testbed-host
  cp "$BED/id.pub" "$BED/authorized_keys"
  echo "127.0.0.1 localhost" >"$BED/etc_hosts"
  : >"$BED/ssh_config"
  local k h
  for k in $(seq "$BED_N"); do
    echo "$(bed_ip $k) h$k" >>"$BED/etc_hosts"
    printf 'Host h%s\n  HostName %s\n' "$k" "$(bed_ip $k)" >>"$BED/ssh_config"
  done
  cat >>"$BED/ssh_config" <<CONF
Host *
  User root
  IdentityFile $BED/id
  IdentitiesOnly yes
  UserKnownHostsFile $BED/known_hosts
  StrictHostKeyChecking no
  LogLevel ERROR
CONF
  printf '#!/bin/sh\nexec /usr/bin/ssh -F %s "$@"\n' "$BED/ssh_config" >"$BED/bin/ssh"
  chmod +x "$BED/bin/ssh"
  export PATH="$BED/bin:$PATH"
  mkdir -p /run/sshd

  ip netns add "$(bed_ns sw)"
  ip -n "$(bed_ns sw)" link add br0 type bridge
  ip -n "$(bed_ns sw)" link set br0 up
  for k in $(seq "$BED_N"); do
    h="h$k"
    ip netns add "$(bed_ns $h)"
    ip link add "mtb${BED_ID}v$k" netns "$(bed_ns sw)" type veth peer name eth0 netns "$(bed_ns $h)"
    ip -n "$(bed_ns sw)" link set "mtb${BED_ID}v$k" master br0 up
    ip -n "$(bed_ns $h)" addr add "$(bed_ip $k)/24" dev eth0
    ip -n "$(bed_ns $h)" link set eth0 up
    ip -n "$(bed_ns $h)" link set lo up
    # The anchor holds the host's UTS and mount namespaces; everything run
    # on the host (sshd, and so mpirun's daemons and the ranks) joins them.
    ip netns exec "$(bed_ns $h)" unshare --uts --mount --propagation private bash -c "
      hostname $h
      mount -t tmpfs -o size=512m tmpfs /tmp && mount -t tmpfs -o size=512m tmpfs /dev/shm &&
      mount --bind $BED/etc_hosts /etc/hosts || exit 1
      exec sleep infinity" {BED_LOCK_FD}>&- &
    BED_ANCHORS+=($!)
    disown $!  # bed_down kills it: no "Killed" line from the shell
    cat >"$BED/sshd/$h.conf" <<CONF
ListenAddress $(bed_ip $k)
Port 22
HostKey $BED/hostkey
AuthorizedKeysFile $BED/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $BED/sshd/$h.pid
SetEnv PATH=$BED/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
LogLevel ERROR
CONF
  done
  for k in $(seq "$BED_N"); do
    h="h$k"
    for _ in $(seq 50); do [ "$(on_host "$h" hostname 2>/dev/null)" = "$h" ] && break; sleep 0.1; done
    # The host's UTS namespace names its processes, the anchor's death aside.
    BED_UTS[k - 1]="$(readlink "/proc/$(bed_anchor "$h")/ns/uts")"
    on_host "$h" /usr/sbin/sshd -f "$BED/sshd/$h.conf" -E "$BED/sshd/$h.log" ||
      { echo "FAIL: sshd on $h did not start: $(cat "$BED/sshd/$h.log")"; exit 1; }
  done
  for k in $(seq "$BED_N"); do
    for _ in $(seq 50); do on_host h1 ssh -o ConnectTimeout=2 "h$k" true 2>/dev/null && break; sleep 0.2; done
    on_host h1 ssh -o ConnectTimeout=2 "h$k" true || { echo "FAIL: cannot ssh from h1 to h$k"; exit 1; }
  done
}

# The anchor's pid of host $1.
bed_anchor() { echo "${BED_ANCHORS[$((${1#h} - 1))]}"; }

on_host() {
  local h="$1"
  shift
  # The anchor is bash's child `sleep`, exec'd: its pid is the one started.
  nsenter -t "$(bed_anchor "$h")" -u -m -n --wd="$PWD" -- "$@" {BED_LOCK_FD}>&-
}

on_host_for() {
  local secs="$1" h="$2"
  shift 2
  timeout "$secs" nsenter -t "$(bed_anchor "$h")" -u -m -n --wd="$PWD" -- "$@" {BED_LOCK_FD}>&-
}

bed_link() {  # HOST down|up
  ip -n "$(bed_ns "$1")" link set eth0 "$2"
}

# Every process that lives in a host's namespaces (its UTS namespace tells).
bed_pids() {
  local uts="${BED_UTS[$((${1#h} - 1))]:-}" p
  [ -n "$uts" ] || uts="$(readlink "/proc/$(bed_anchor "$1")/ns/uts" 2>/dev/null)" || return 0
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/ns/uts" 2>/dev/null)" = "$uts" ] && echo "${p#/proc/}"
  done
}

bed_down() {
  local k h pids left
  [ -n "$BED_ID" ] || return 0
  # Again until none is left: a daemon (slurmd starting a job) may fork
  # while the others are killed, and the anchor (in the list) goes first.
  for _ in $(seq 20); do
    left=0
    for k in $(seq "$BED_N"); do
      h="h$k"
      [ -n "${BED_ANCHORS[$((k - 1))]:-}" ] || continue
      mapfile -t pids < <(bed_pids "$h")
      ((${#pids[@]})) || continue
      left=1
      kill -9 "${pids[@]}" 2>/dev/null
    done
    ((left)) || break
    sleep 0.1
  done
  ((${#BED_ANCHORS[@]})) && kill -9 "${BED_ANCHORS[@]}" 2>/dev/null
  wait 2>/dev/null
  for k in $(seq "$BED_N"); do ip netns del "$(bed_ns "h$k")" 2>/dev/null; done
  ip netns del "$(bed_ns sw)" 2>/dev/null
  BED_ID=""
  return 0
}
