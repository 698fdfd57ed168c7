#!/usr/bin/env bash
# tools/deps.sh on a machine whose package index cannot be refreshed: apt-get fails, a package looks
# missing to dpkg; the script warns and exits 0 so that the build can go on with what is present.
set -uo pipefail
tools="$1"
fake="$(mktemp -d)"
trap 'rm -rf "$fake"' EXIT
printf '#!/bin/sh\necho "apt-get: network unreachable" >&2\nexit 100\n' > "$fake/apt-get"
printf '#!/bin/sh\nprintf "deinstall ok config-files"\n' > "$fake/dpkg-query"
printf '#!/bin/sh\nexec "$@"\n' > "$fake/sudo"
chmod +x "$fake"/*
out=$(PATH="$fake:$PATH" "$tools/deps.sh" some-package 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: tools/deps.sh exited with $rc"; exit 1; }
echo "$out" | grep -q "warning: apt-get update failed" || { echo "FAIL: no warning about apt-get update"; exit 1; }
echo PASS
