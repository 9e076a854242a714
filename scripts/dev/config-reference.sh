#!/usr/bin/env bash
# Rewrites docs/config-reference.md from the code (the config schema, the
# defaults, the choice tables, the resume rules and src/config/key_docs.cpp):
# builds tests/tools/config_reference (it links mt_config only, no libtorch)
# and runs it. ctest unit.config_reference fails while the committed file
# differs from what this writes.
# Usage: scripts/dev/config-reference.sh [--check]
# Env: BUILD_DIR (default build).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${BUILD_DIR:-$ROOT/build}"
"$ROOT/scripts/build.sh" config_reference >/dev/null
if [ "${1:-}" = "--check" ]; then
  exec "$BUILD/tests/config_reference" --check "$ROOT/docs/config-reference.md"
fi
exec "$BUILD/tests/config_reference" --output "$ROOT/docs/config-reference.md"
