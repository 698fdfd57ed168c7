#!/usr/bin/env bash
# The README's shell blocks run the tool by its path (build/release/bin/mladcp): `mladcp` alone is not
# on PATH after tools/demo.sh or tools/build.sh.
set -uo pipefail
readme="$1"
bad=$(awk '/^```sh/ {in_sh = 1; next} /^```/ {in_sh = 0} in_sh && $1 == "mladcp" {print NR ": " $0}' "$readme")
if [ -n "$bad" ]; then
  echo "FAIL: README shell lines run a bare mladcp:"
  echo "$bad"
  exit 1
fi
echo PASS
