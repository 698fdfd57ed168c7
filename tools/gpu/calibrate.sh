#!/usr/bin/env bash
# The planner's calibration and the TP-realistic DCP grid, emulated on ONE GPU, in one call on the GPU
# machine (about 3 minutes on an H200 with the build; under a minute with prebuilt binaries):
#
#   here, once:             tools/gpu/prepare_deps.sh        (nlohmann-json, CLI11 into .deps/, git-ignored)
#   on the GPU machine:     tools/gpu/calibrate.sh [stage...]   stages: build calibrate grid validate (default: all)
#
#   build      Release build of mladcp_dcp_emulate and the mladcp tool (sm_90a only) in build/gpu-plan
#   calibrate  mladcp_dcp_emulate --calibrate: decode time over (heads, q_len, batch, keys, dtype) and both
#              merges on this GPU -> $OUT/<gpu>-<date>.json (collectives, fabrics and step overhead copied
#              from the shipped calibration: one GPU cannot measure NCCL). Commit it under data/calibration/.
#   grid       the emulated grid: heads per rank {16, 8, 32} x W {2, 4, 8} x T {1, 8, 64, 256} x context
#              {32K, 128K, 512K}, each row set against the planner's prediction -> $OUT/emulated-grid.{md,json}
#   validate   mladcp plan --validate of the measured rows with the new calibration -> $OUT/validation.md
#
# Environment: MLADCP_GPU_PREBUILT=dir (mladcp_dcp_emulate, and optionally mladcp, built elsewhere from this tree:
# the emulation needs only libcudart; carry the folder, e.g. build-gpu-plan/, which git ignores),
# CALIBRATION=file (the base calibration; default data/calibration/h200-2026-12-01.json), GRID_ARGS (extra
# arguments of the grid, e.g. "--samples 30"), BUDGET (seconds for the whole script, default 570), COMMIT (the
# commit recorded in the new calibration; default: git rev-parse of this tree).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build calibrate grid validate)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
budget="${BUDGET:-570}"
left() { echo $((budget - SECONDS)); }
out="${OUT:-$root/out/calibrate}"
mkdir -p "$out"
build="$root/build/gpu-plan"
base="${CALIBRATION:-$root/data/calibration/h200-2026-12-01.json}"
measured="$root/data/calibration/h200-measured-2026-12-01.json"
commit="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo '+local')}"
status=()
note() { status+=("$1"); echo "== $1"; }

bin="${MLADCP_GPU_PREBUILT:-$build/bin}"
if want build; then
  if [ -n "${MLADCP_GPU_PREBUILT:-}" ] && "$bin/mladcp_dcp_emulate" --help 2>&1 | grep -q usage; then
    note "build: prebuilt $bin"
  else
    bin="$build/bin"
    (
      echo "# $(date -u +%FT%TZ) commit $commit"
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
      cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLADCP_DEPS_DIR="$root/.deps" \
        -DMLADCP_WITH_CUDA=ON -DMLADCP_WITH_NCCL=OFF -DMLADCP_WITH_MPI=OFF -DMLADCP_BUILD_APPS=ON \
        -DMLADCP_BUILD_BENCH=ON -DMLADCP_BUILD_TESTS=OFF -DMLADCP_BUILD_EXAMPLES=OFF \
        "-DMLADCP_CUDA_GENCODE_PORTABLE=${MLADCP_GPU_ARCH:-}" &&
        ninja -C "$build" -j "$(nproc)" mladcp_dcp_emulate
      rc=$?
      # The tool only validates the new file; the calibration and the grid do not need it.
      [ $rc -eq 0 ] && { ninja -C "$build" -j "$(nproc)" mladcp_cli || echo "mladcp tool not built: validate skipped"; }
      exit $rc
    ) >"$out/build.log" 2>&1
    rc=$?
    note "build: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see build.log)") (${SECONDS}s)"
    [ $rc -eq 0 ] || { tail -n 30 "$out/build.log"; exit 1; }
  fi
fi

gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | tr 'A-Z ' 'a-z-' | sed 's/^nvidia-//')"
new="$out/${gpu:-gpu}-$(date -u +%F).json"

if want calibrate; then
  timeout "$(($(left) > 150 ? 150 : $(left)))" "$bin/mladcp_dcp_emulate" --calibrate "$new" --base "$base" \
    --commit "$commit" >"$out/calibrate.log" 2>&1
  rc=$?
  note "calibrate: $([ $rc -eq 0 ] && echo "ok -> $(basename "$new")" || echo "FAILED (rc $rc, see calibrate.log)")"
fi

if want grid; then
  # shellcheck disable=SC2086
  timeout "$(($(left) > 300 ? 300 : $(left) - 20))" "$bin/mladcp_dcp_emulate" --calibration "$base" \
    --markdown "$out/emulated-grid.md" --json "$out/emulated-grid.json" ${GRID_ARGS:-} >"$out/grid.log" 2>&1
  rc=$?
  note "grid: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see grid.log)")"
fi

if want validate && [ -f "$new" ] && ! "$bin/mladcp" version >/dev/null 2>&1; then
  note "validate: skipped (no mladcp tool in $bin); run here: mladcp plan --calibration $(basename "$new") --validate $measured"
elif want validate && [ -f "$new" ]; then
  "$bin/mladcp" plan --calibration "$new" --validate "$measured" >"$out/validation.md" 2>&1
  note "validate (new calibration vs the recorded rows): $(tail -n 1 "$out/validation.md")"
  "$bin/mladcp" plan --calibration "$new" --gpus 8 --context 32K,128K,512K --batch 1,8,64,256 --markdown \
    >"$out/plan-8gpu.md" 2>&1
fi

{
  echo "# calibrate.sh summary ($(date -u +%FT%TZ), commit $commit)"
  printf -- '- %s\n' "${status[@]}"
  echo
  [ -f "$out/emulated-grid.md" ] && cat "$out/emulated-grid.md"
} >"$out/summary.md"
cat "$out/summary.md"
