#!/usr/bin/env bash
# Installs the dependencies, builds everything with the `release` preset and runs every test.
# The output ends with CTest's summary line. Usage: tools/test.sh [extra ctest arguments, e.g. -L cli]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/build.sh" release
cd "$root"
log="$root/build/release/Testing/tools-test.log"
mkdir -p "$(dirname "$log")"
set +e
ctest --preset release -j "$(nproc)" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# CTest prints the lists of skipped and failed tests after its summary; repeat the summary last.
grep -E "^[0-9]+% tests passed" "$log" | tail -n 1 || echo "ctest exited with $rc before its summary"
exit "$rc"
