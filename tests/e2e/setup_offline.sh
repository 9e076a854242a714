#!/usr/bin/env bash
# scripts/setup.sh without the network: with MESHTRAIN_OFFLINE=1 or
# MESHTRAIN_TORCH_PREFIX it must install nothing, succeed when everything is
# there, and name what is missing otherwise. Runs a copy of setup.sh in a
# scratch checkout whose .deps holds links to the real venv; stand-in apt-get,
# sudo, pip, curl and wget on PATH record any call and fail, a stand-in
# dpkg-query decides which Debian packages "are installed", and pip gets an
# index that does not exist.
# Usage: bash tests/e2e/setup_offline.sh BINARY SRC_DIR WORK_DIR
source "$(dirname "$0")/common.sh" "$@"

mkdir -p shims fake/scripts
CALLS="$WORK/network-calls.log"
: > "$CALLS"
for tool in apt-get apt sudo pip pip3 curl wget; do
  printf '#!/bin/sh\necho "%s $*" >> "%s"\nexit 97\n' "$tool" "$CALLS" > "shims/$tool"
done
# dpkg-query: "installed" unless the package is listed in $MISSING_PKGS.
cat > shims/dpkg-query <<'SH'
#!/bin/sh
pkg=""; for a in "$@"; do pkg="$a"; done
case " ${MISSING_PKGS:-} " in *" $pkg "*) exit 1 ;; esac
printf 'install ok installed'
SH
chmod +x shims/*
cp "$SRC/scripts/setup.sh" fake/scripts/
export PATH="$WORK/shims:$PATH" PIP_NO_INDEX=1 PIP_INDEX_URL=http://127.0.0.1:9/simple
unset MESHTRAIN_TORCH_PREFIX MESHTRAIN_OFFLINE

REAL_VENV="$(cd "$SRC/.deps/venv" 2>/dev/null && pwd -P)"
if [ -z "$REAL_VENV" ]; then
  bad "the real venv exists" "$SRC/.deps/venv is missing: run scripts/setup.sh first"
  finish
fi
fresh_deps() { rm -rf fake/.deps; mkdir -p fake/.deps; [ "${1:-}" = empty ] || ln -s "$REAL_VENV" fake/.deps/venv; }
no_calls() { [ ! -s "$CALLS" ]; }
runs() {  # NAME EXPECT(0|fail) OUTPUT_MUST_CONTAIN -- env assignments...
  local name="$1" want="$2" needle="$3"
  shift 4
  : > "$CALLS"
  local out rc
  out="$(env "$@" bash fake/scripts/setup.sh 2>&1)"
  rc=$?
  if [ "$want" = 0 ] && [ "$rc" -ne 0 ]; then bad "$name: exits 0" "$out"; return; fi
  if [ "$want" = fail ] && [ "$rc" -eq 0 ]; then bad "$name: fails" "$out"; return; fi
  if [ -n "$needle" ] && [[ "$out" != *"$needle"* ]]; then bad "$name: says '$needle'" "$out"; return; fi
  if ! no_calls; then bad "$name: touches no network tool" "$(cat "$CALLS")"; return; fi
  ok "$name"
}

# 1. Everything present, offline: silent success, torch_prefix written.
fresh_deps
runs "offline, all present" 0 "" -- MESHTRAIN_OFFLINE=1
check "offline, all present: torch_prefix names the venv's torch" \
  grep -q "/torch/share/cmake$" fake/.deps/torch_prefix
out="$(MESHTRAIN_OFFLINE=1 bash fake/scripts/setup.sh 2>&1)"
check "offline, all present: prints nothing" test -z "$out"

# 2. Everything present, online: still nothing installed.
fresh_deps
runs "online, all present" 0 "" -- MESHTRAIN_OFFLINE=

# 3. Offline without the venv: a clear error naming the venv, nothing created.
fresh_deps empty
runs "offline, no venv" fail ".deps/venv is missing and MESHTRAIN_OFFLINE=1" -- MESHTRAIN_OFFLINE=1
check "offline, no venv: no venv created" test ! -e fake/.deps/venv

# 4. Offline with a required Debian package missing: named, apt-get never run.
fresh_deps
runs "offline, libspdlog-dev missing" fail "libspdlog-dev" -- MESHTRAIN_OFFLINE=1 MISSING_PKGS=libspdlog-dev

# 5. Offline with only optional packages missing: a warning, success.
fresh_deps
runs "offline, fortunes/shellcheck missing" 0 "optional" -- MESHTRAIN_OFFLINE=1 "MISSING_PKGS=fortunes shellcheck"
runs "offline, ccache/git/python3-venv missing" 0 "optional" -- MESHTRAIN_OFFLINE=1 \
  "MISSING_PKGS=ccache git python3-venv"

# 6. MESHTRAIN_TORCH_PREFIX: no network even with packages missing, no venv needed.
fresh_deps empty
mkdir -p prefix/Torch
touch prefix/Torch/TorchConfig.cmake
runs "torch prefix, all present" 0 "" -- "MESHTRAIN_TORCH_PREFIX=$WORK/prefix"
check "torch prefix: torch_prefix written" grep -qx "$WORK/prefix" fake/.deps/torch_prefix
check "torch prefix: no venv created" test ! -e fake/.deps/venv
runs "torch prefix, package missing" fail "MESHTRAIN_TORCH_PREFIX is set" -- \
  "MESHTRAIN_TORCH_PREFIX=$WORK/prefix" MISSING_PKGS=libgtest-dev
runs "torch prefix without TorchConfig.cmake" fail "TorchConfig.cmake" -- "MESHTRAIN_TORCH_PREFIX=$WORK/nowhere"

finish
