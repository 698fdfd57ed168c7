#!/usr/bin/env bash
# Installs what the build needs (Debian 12 packages; apt-get only for those missing), then configures and
# builds mladcp with a CMake preset (CMakePresets.json). CUDA is built when nvcc is found.
# Usage: tools/build.sh [preset [cmake --build arguments...]]     preset: release (default), debug, cpu-only
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
preset="${1:-release}"
shift || true

"$root/tools/deps.sh" cmake ninja-build g++ libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev \
  libopenmpi-dev openmpi-bin

# The Python module (python/, built when nanobind is importable) and its pytest suite need a few PyPI
# packages; pip installs the missing ones. Without them (no network) the build goes on without Python.
if command -v python3 >/dev/null 2>&1; then
  py_missing=()
  for m in nanobind:nanobind scikit_build_core:scikit-build-core pytest:pytest numpy:numpy mpi4py:mpi4py; do
    python3 -c "import ${m%%:*}" >/dev/null 2>&1 || py_missing+=("${m##*:}")
  done
  if ((${#py_missing[@]})); then
    echo "tools/build.sh: pip installing ${py_missing[*]}" >&2
    python3 -m pip install --quiet --retries 1 --timeout 20 "${py_missing[@]}" ||
      echo "tools/build.sh: pip install failed; the Python module and its tests may be left out" >&2
  fi
fi

# The CUDA toolkit's usual home; CMake finds nvcc on PATH.
if [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

cd "$root"
cmake --preset "$preset"
cmake --build --preset "$preset" -j "$(nproc)" "$@"
