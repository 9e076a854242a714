#!/usr/bin/env bash
# What a fresh scripts/setup.sh prints: one line per install and a ready line,
# never what pip or apt print (pip's "ERROR: ... dependency resolver" lines
# after the deliberately incomplete CPU torch, root warnings, progress): those
# go to .deps/setup.log, shown only when an install fails. Every wheel is
# pinned and installed with --no-deps, the install that gives pip nothing to
# complain about. Runs a copy of setup.sh in a scratch checkout whose venv
# python is a stand-in: it reports an empty site-packages, records each pip
# call and prints pip's noise on both streams.
# Usage: bash tests/e2e/setup_quiet.sh BINARY SRC_DIR WORK_DIR
source "$(dirname "$0")/common.sh" "$@"

mkdir -p shims fake/scripts fake/.deps/venv/bin site
CALLS="$WORK/pip-calls.log"
cp "$SRC/scripts/setup.sh" fake/scripts/
# Every Debian package "installed"; apt-get must not run.
printf '#!/bin/sh\nprintf "install ok installed"\n' > shims/dpkg-query
printf '#!/bin/sh\necho "apt-get $*" >> "%s"\nexit 97\n' "$CALLS" > shims/apt-get
cat > fake/.deps/venv/bin/python <<SH
#!/bin/bash
case "\$*" in
  *sysconfig*) echo "$WORK/site" ;;
  "-c import "*) exit 1 ;;
  "-m pip "*)
    echo "\$*" >> "$CALLS"
    echo "WARNING: Running pip as the 'root' user can result in broken permissions"
    echo "ERROR: pip's dependency resolver does not currently take into account all the packages that are installed." >&2
    echo "torch 2.11.0 requires nvidia-nccl-cu13, which is not installed." >&2
    exit "\${PIP_EXIT:-0}" ;;
  *) exit 2 ;;
esac
SH
chmod +x shims/* fake/.deps/venv/bin/python
export PATH="$WORK/shims:$PATH"
unset MESHTRAIN_TORCH_PREFIX MESHTRAIN_OFFLINE

out="$(bash fake/scripts/setup.sh 2>&1)"
rc=$?
check "fresh set-up exits 0" test $rc -eq 0
lines=$(printf '%s\n' "$out" | wc -l)
check "fresh set-up prints 2 lines ($lines)" test "$lines" -eq 2
last_is_ready() { [[ "$(tail -n 1 <<<"$out")" == "setup: ready"* ]]; }
no_noise() { ! grep -qE 'ERROR|WARNING|requires' <<<"$out"; }
check "the last line says ready" last_is_ready
check "no ERROR or WARNING reaches the user" no_noise
check "pip's output is in .deps/setup.log" grep -q "dependency resolver" fake/.deps/setup.log
check "one pip call" test "$(wc -l < "$CALLS")" -eq 1
check "every pip install is --no-deps" bash -c "! grep -v -- '--no-deps' '$CALLS'"
check "every wheel pinned (name==version)" python3 - "$CALLS" <<'PY'
import sys
for line in open(sys.argv[1]):
    wheels = [a for a in line.split() if not a.startswith("-") and a not in ("pip", "install")]
    if not wheels or not all("==" in w for w in wheels):
        sys.exit(1)
PY
check "torch 2.11.0 among them" grep -q "torch==2.11.0" "$CALLS"
check "torch_prefix written" grep -q "$WORK/site/torch/share/cmake" fake/.deps/torch_prefix

# A failing install: non-zero, the end of pip's output and where the rest is.
out="$(PIP_EXIT=1 bash fake/scripts/setup.sh 2>&1)"
rc=$?
check "a failed pip install fails set-up" test $rc -ne 0
check "and shows pip's own message" grep -q "requires nvidia-nccl-cu13" <<<"$out"
check "and names the log" grep -q "fake/.deps/setup.log" <<<"$out"
finish
