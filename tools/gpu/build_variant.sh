#!/usr/bin/env bash
# Builds this tree's GPU test and peer bench (Release, sm_90a, as tools/gpu/run.sh builds them) here, on the machine
# without a GPU, and keeps them as variant NAME in build/var/NAME. Edit the sources, build a variant, repeat; then one
# GPU call tests and times them all without building there:
#
#   tools/gpu/build_variant.sh base        (the tree as it is)
#   ... edit src/cuda/... ...
#   tools/gpu/build_variant.sh try1
#   on the GPU machine (carry build/var and .deps):
#   MLADCP_GPU_VARIANT_DIRS="base=build/var/base try1=build/var/try1" MLADCP_PEERS_MLADCP_ONLY=1 \
#     MLADCP_VARIANT_POLICY=fp8 MLADCP_PEER_CONFIGS=tools/gpu/fp8_configs.txt tools/gpu/run.sh variants
#
# The folder also holds cuda_state_test and mladcp_gpu_bench, so that it serves as MLADCP_GPU_PREBUILT (tools/gpu/run.sh
# build test sanitize peers without building there). About 20 MB per variant (the carry limit is 64 MiB in all). Needs
# .deps (tools/gpu/prepare_deps.sh).
#
#   tools/gpu/build_variant.sh NAME COMMIT   the same for a commit's tree (a git worktree in build/wt/NAME, its own
#                                            build folder there), e.g. an experiment kept in history but reverted
#
# MLADCP_VARIANT_DEFINES="-DNAME=VALUE ..." adds definitions to the C++ and CUDA flags (a constant under test, e.g.
# -DMLADCP_BALANCED_OVERHEAD_TILES=3; the build folder is then build/gpu-variant-NAME); MLADCP_VARIANT_TIMELINE=1
# configures the per-CTA timeline (-DMLADCP_SM90_TIMELINE=ON: `mladcp_peer_bench --timeline`).
set -euo pipefail
[ $# -eq 1 ] || [ $# -eq 2 ] || { echo "usage: $0 NAME [COMMIT]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
src="$root"
if [ $# -eq 2 ]; then
  src="$root/build/wt/$1"
  [ -d "$src" ] && git -C "$root" worktree remove --force "$src"
  git -C "$root" worktree add --detach "$src" "$2" >/dev/null
fi
defines="${MLADCP_VARIANT_DEFINES:-}" timeline=OFF label=""
if [ "${MLADCP_VARIANT_TIMELINE:-0}" = 1 ]; then timeline=ON label=", timeline"; fi
label="${defines:+, $defines}$label"
build="$src/build/gpu-variant"
if [ -n "$label" ]; then build="$src/build/gpu-variant-$1"; fi  # its own flags: its own build folder
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLADCP_DEPS_DIR="$root/.deps" -DMLADCP_WITH_CUDA=ON \
  -DMLADCP_WITH_NCCL=OFF -DMLADCP_WITH_MPI=OFF -DMLADCP_BUILD_APPS=OFF -DMLADCP_BUILD_BENCH=ON -DMLADCP_BUILD_TESTS=ON \
  -DMLADCP_CUDA_GENCODE_PORTABLE= -DCMAKE_CXX_FLAGS="$defines" -DCMAKE_CUDA_FLAGS="$defines" \
  -DMLADCP_SM90_TIMELINE="$timeline" >/dev/null
ninja -C "$build" cuda_decode_test cuda_state_test mladcp_gpu_bench mladcp_peer_bench
dest="$root/build/var/$1"
mkdir -p "$dest"
cp "$build/tests/cuda/cuda_decode_test" "$build/tests/cuda/cuda_state_test" "$build/bench/gpu/mladcp_gpu_bench" \
  "$build/bench/gpu/mladcp_peer_bench" "$dest/"
stamp="$(git -C "$src" rev-parse --short HEAD)$(git -C "$src" diff --quiet HEAD || echo '+local')"
echo "$stamp (tools/gpu/build_variant.sh $1$label, $(date -u +%FT%TZ))" >"$dest/STAMP"
echo "$stamp -> $dest"
