#!/usr/bin/env bash
# Installs the dependencies, builds everything with the `release` preset and runs every test.
# The output ends with CTest's summary. Usage: tools/test.sh [extra ctest arguments, e.g. -L cli]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/build.sh" release
cd "$root"
exec ctest --preset release -j "$(nproc)" "$@"
