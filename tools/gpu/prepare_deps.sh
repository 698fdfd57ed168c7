#!/usr/bin/env bash
# Copies the third-party sources the build needs into .deps/ (git-ignored) so that they travel with the
# working tree to a machine without network or Debian -dev packages (the GPU machine). CMake looks there
# through MLADCP_DEPS_DIR (default: <source>/.deps):
#   .deps/googletest/          GoogleTest sources (built in-tree)       from /usr/src/googletest
#   .deps/include/CLI/         CLI11 (header-only, the mladcp tool)     from /usr/include/CLI
#   .deps/include/nlohmann/    nlohmann-json (header-only)              from /usr/include/nlohmann
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
deps="$root/.deps"
for src in /usr/src/googletest /usr/include/CLI /usr/include/nlohmann; do
  if [ ! -d "$src" ]; then
    echo "prepare_deps.sh: $src is missing; install libgtest-dev libcli11-dev nlohmann-json3-dev" >&2
    exit 1
  fi
done
rm -rf "$deps/googletest" "$deps/include/CLI" "$deps/include/nlohmann"
mkdir -p "$deps/include"
cp -a /usr/src/googletest "$deps/googletest"
cp -a /usr/include/CLI "$deps/include/CLI"
cp -a /usr/include/nlohmann "$deps/include/nlohmann"
du -sh "$deps"
