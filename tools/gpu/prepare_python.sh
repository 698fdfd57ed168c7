#!/usr/bin/env bash
# Downloads the wheels the Python module's build and tests need (nanobind, pytest and its dependencies, all
# pure Python; exceptiongroup and tomli matter only below Python 3.11) into .whl/ (git-ignored), so that they
# travel with the working tree to the GPU machine, which has torch and numpy but no network.
# tools/gpu/run_python.sh installs them from there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mkdir -p "$root/.whl"
python3 -m pip download --quiet --only-binary=:all: --no-deps -d "$root/.whl" \
  nanobind pytest iniconfig pluggy packaging pygments exceptiongroup tomli typing_extensions
ls -la "$root/.whl"
