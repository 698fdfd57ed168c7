#!/usr/bin/env bash
# One line on the GPU tests of the last ctest run: how many were skipped, and why (the skip message of
# the first skipped one, rerun verbosely). Prints nothing when no test is labeled gpu.
# Usage: tools/gpu_skip_line.sh <build dir> <ctest console log>
set -uo pipefail
build="$1"
log="$2"
mapfile -t gpu < <(ctest --test-dir "$build" -N -L '^gpu$' 2>/dev/null | sed -n 's/^ *Test *#[0-9]*: //p')
((${#gpu[@]})) || exit 0
# "<tab>  12 - Name (Skipped)": CTest's list of the tests that did not run.
n=0
first=""
while IFS=$'\t' read -r _ name; do
  for g in "${gpu[@]}"; do
    if [ "$name" = "$g" ]; then
      n=$((n + 1))
      [ -n "$first" ] || first="$name"
      break
    fi
  done
done < <(sed -n 's/^[[:space:]]*\([0-9]*\) - \(.*\) (Skipped)$/\1\t\2/p' "$log")
if ((n == 0)); then
  echo "GPU tests: all ${#gpu[@]} ran"
  exit 0
fi
# GoogleTest prints "<file>:<line>: Skipped" and then the message.
pattern="^$(printf '%s' "$first" | sed 's/[][\\.*^$(){}+?|]/\\&/g')\$"
reason=$(ctest --test-dir "$build" -R "$pattern" -V 2>/dev/null | awk '/: Skipped$/ { getline m; print m; exit }' |
  sed 's/^[0-9]*: //')
echo "GPU tests: ${n} of ${#gpu[@]} skipped${reason:+ (${reason})}; they run on a GPU machine (tools/gpu/run.sh)"
