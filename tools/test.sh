#!/usr/bin/env bash
# The CI tiers, in order, each stopping the run when it fails:
#   1. format   every C++/CUDA source matches clang-format (tools/format.sh --check)
#   2. build    everything with the `release` preset, CUDA included when nvcc is found (tools/build.sh)
#   3. tests    every test (ctest); GPU tests skip without a GPU (the GPU tier is tools/gpu/run.sh)
# The output ends with a line on the skipped GPU tests and CTest's summary line.
# Usage: tools/test.sh [extra ctest arguments, e.g. -L cli]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
echo "== tier 1: format"
"$root/tools/format.sh" --check
echo "== tier 2: build"
"$root/tools/build.sh" release
echo "== tier 3: tests"
cd "$root"
log="$root/build/release/Testing/tools-test.log"
mkdir -p "$(dirname "$log")"
set +e
ctest --preset release -j "$(nproc)" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# CTest prints the lists of skipped and failed tests after its summary; repeat the summary last.
"$root/tools/gpu_skip_line.sh" "$root/build/release" "$log" || true
grep -E "^[0-9]+% tests passed" "$log" | tail -n 1 || echo "ctest exited with $rc before its summary"
exit "$rc"
