#!/usr/bin/env bash
# Installs the dependencies, builds the mladcp tool with the `release` preset and runs `mladcp demo`:
# MLA decode with LSE on the best available backend, checked against the fp64 oracle.
# Usage: tools/demo.sh [mladcp demo arguments]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/build.sh" release --target mladcp_cli
exec "$root/build/release/bin/mladcp" demo "$@"
