#!/usr/bin/env bash
# tools/gpu_skip_line.sh counts the GPU tests in CTest's list of skipped tests and names the reason.
set -uo pipefail
tools="$1"
build="$2"
first=$(ctest --test-dir "$build" -N -L '^gpu$' | sed -n 's/^ *Test *#[0-9]*: //p' | head -n 1)
[ -n "$first" ] || { echo "no GPU tests in this build: nothing to check"; echo PASS; exit 0; }
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
printf '90%% tests passed, 0 tests failed out of 3\n\nThe following tests did not run:\n\t  7 - %s (Skipped)\n\t  8 - some.host.test (Skipped)\n' "$first" > "$log"
out=$("$tools/gpu_skip_line.sh" "$build" "$log")
echo "$out"
echo "$out" | grep -Eq "^GPU tests: 1 of [0-9]+ skipped" || { echo "FAIL: unexpected line"; exit 1; }
echo PASS
