#!/usr/bin/env bash
# DCP on all GPUs of the machine over NCCL (2, 4 or 8), in one call: build, the NCCL/DCP GPU tests, the check
# against single-GPU decode (both merge modes, eager and CUDA graph, empty shards, q_len 2, fp8), and the
# timing grid (T in {1, 8, 64}, context 32K and 128K, H = 128, both merge modes, eager and CUDA graph,
# W = 2 against W = 1). Logs go to $OUT (at most 8 files); a summary table is printed last.
#
#   here, once:             tools/gpu/run_dcp.sh prepare     (third-party sources into .deps/, git-ignored)
#   on the GPU machine:     tools/gpu/run_dcp.sh [stage...]  stages: build test check grid (default: all), tp16
#
# tp16 (not in the default): the TP-realistic grid, 16 heads per GPU before the gather (H = 16 x GPUs: DeepSeek-V3
# at TP 8 has 16 heads per rank), T in {1, 8, 64}, context 32K and 128K, A2A, against TP attention (16 heads over
# the whole cache on each GPU). HEADS_PER_RANK=8 or 32 changes the 16. The one-GPU emulation of the same grid,
# up to W = 8 and 512K: tools/gpu/calibrate.sh.
#
# The whole run fits one 10-minute device call: stages share BUDGET seconds (default 570) and a stage
# that no longer fits is skipped and says so. Stages can also be split over calls on a warm machine
# (the build directory build/gpu-dcp stays): e.g. "build test", then "check grid".
#
# Under mpirun (one process per GPU) when the machine has MPI, else one process with one thread per GPU.
# NVLink SHARP / multicast stays off (NCCL_NVLS_ENABLE=0) on shared machines.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

if [ "${1:-}" = prepare ]; then
  tools/gpu/prepare_deps.sh
  # nccl.h for a machine whose NCCL library comes without its header (a pip wheel, say).
  mkdir -p .deps/nccl/include
  for h in /usr/local/cuda/include/nccl.h /usr/include/nccl.h; do
    [ -f "$h" ] && cp "$h" .deps/nccl/include/ && break
  done
  du -sh .deps
  exit 0
fi

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build test check grid)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

out="${OUT:-$root/out/dcp-gpu}"
mkdir -p "$out"
build="$root/build/gpu-dcp"
bin="$build/bin"
# Every GPU of the machine (2 on nvidia-h200-x2, 4 or 8 on the larger kinds); GPUS=N overrides.
gpus="${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || echo 2)}"
[ "$gpus" -ge 2 ] 2>/dev/null || gpus=2
status=()  # "stage: result" lines for the summary
note() { status+=("$1"); echo "== $1"; }
budget="${BUDGET:-570}"
# Seconds a stage may take: at most $1, and what is left of the budget minus $2 for the stages after it.
allow() { local left=$((budget - SECONDS - $2)); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"

# NCCL: the CUDA toolkit's or the system's; else the one in the Python environment (nvidia-nccl wheel).
nccl_args=()
if [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  wheel="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
  if [ -n "$wheel" ] && ls "$wheel"/lib/libnccl.so* >/dev/null 2>&1; then
    inc="$wheel/include"
    [ -f "$inc/nccl.h" ] || inc="$root/.deps/nccl/include"
    lib="$(ls "$wheel"/lib/libnccl.so* | head -n1)"
    nccl_args=(-DNCCL_INCLUDE_DIR="$inc" -DNCCL_LIBRARY="$lib")
    export LD_LIBRARY_PATH="$wheel/lib:${LD_LIBRARY_PATH:-}"
  fi
fi

# mpirun when MPI is there and the build has it (marker written at configure); else one process.
use_mpi() { command -v mpirun >/dev/null 2>&1 && [ -f "$build/mladcp-mpi-on" ]; }
launch_mode() { use_mpi && echo "mpirun -np $gpus (one process per GPU)" || echo "one process, one thread per GPU"; }

if want build; then
  {
    echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>&1
    nvidia-smi topo -m 2>&1 | head -n 8
    nvcc --version 2>&1 | tail -n 1
    { command -v mpirun >/dev/null && mpirun --version 2>&1 | head -n 1; } || echo "mpirun: not found"
    mkdir -p "$build"
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLADCP_DEPS_DIR="$root/.deps" \
      -DMLADCP_WITH_CUDA=ON -DMLADCP_WITH_NCCL=ON -DMLADCP_BUILD_BENCH=ON "${nccl_args[@]}" | tee "$build/configure.log"
    rc=${PIPESTATUS[0]}
    rm -f "$build/mladcp-mpi-on"
    grep -q 'mladcp: .*MPI=ON' "$build/configure.log" && touch "$build/mladcp-mpi-on"
    targets=(nccl_communicator_test dcp_gpu_test mladcp_dcp_gpu_bench)
    ninja -C "$build" -t targets all 2>/dev/null | grep -q '^mladcp_cli:' && targets+=(mladcp_cli)
    [ "$rc" -eq 0 ] && ninja -C "$build" -j "$(nproc)" "${targets[@]}"
  } >"$out/build.log" 2>&1
  rc=$?
  note "build: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see build.log)"); launch: $(launch_mode)"
  [ $rc -eq 0 ] || { tail -n 40 "$out/build.log"; printf '%s\n' "${status[@]}"; exit 1; }
fi

if want test && [ "$(allow 300 200)" -lt 30 ]; then
  note "tests: skipped, out of time (${SECONDS}s used of ${budget}s)"
elif want test; then
  timeout "$(allow 300 200)" ctest --test-dir "$build" -L nccl --output-on-failure >"$out/tests.log" 2>&1
  rc=$?
  note "tests (ctest -L nccl): $(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -n 1) (rc $rc)"
fi

if want check && [ "$(allow 150 100)" -lt 20 ]; then
  note "check: skipped, out of time (${SECONDS}s used of ${budget}s)"
elif want check; then
  t_check="$(allow 150 100)"
  {
    echo "# launch: $(launch_mode)"
    timeout "$t_check" $(use_mpi && echo "mpirun -np $gpus --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH") \
      "$bin/mladcp_dcp_gpu_bench" $(use_mpi || echo "--gpus $gpus") --check
    echo "rc=$?"
    # The tool's DCP command on the cuda backend, both merge modes, when this build has it.
    if [ -x "$bin/mladcp" ] && "$bin/mladcp" dcp --help 2>/dev/null | grep -q -- '--backend'; then
      for merge in a2a ag-rs; do
        echo "## mladcp dcp --backend cuda --check --merge $merge"
        if use_mpi; then
          timeout 60 mpirun -np "$gpus" --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH \
            "$bin/mladcp" dcp --backend cuda --check --merge "$merge"
        else
          timeout 60 "$bin/mladcp" dcp --backend cuda --gpus "$gpus" --check --merge "$merge"
        fi
        echo "rc=$?"
      done
    fi
  } >"$out/check.log" 2>&1
  note "check: $(grep -E '^check: ' "$out/check.log" | tail -n 1 || echo 'no result') [$(grep -c '^rc=0' "$out/check.log") of $(grep -c '^rc=' "$out/check.log") runs rc=0]"
fi

if want grid && [ "$(allow 300 5)" -lt 30 ]; then
  note "grid: skipped, out of time (${SECONDS}s used of ${budget}s)"
elif want grid; then
  t_grid="$(allow 300 5)"
  {
    echo "# launch: $(launch_mode)"
    timeout "$t_grid" $(use_mpi && echo "mpirun -np $gpus --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH") \
      "$bin/mladcp_dcp_gpu_bench" $(use_mpi || echo "--gpus $gpus") --grid --markdown "$out/grid.md" --json "$out/grid.json"
    echo "rc=$?"
    # 512K context where the shards fit comfortably (4 GPUs and more: 64 sequences of 512K are 38 GB of KV).
    t_long="$(allow 150 60)"
    if [ "$gpus" -ge 4 ] && [ "$t_long" -ge 40 ]; then
      echo "## context 524288"
      timeout "$t_long" $(use_mpi && echo "mpirun -np $gpus --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH") \
        "$bin/mladcp_dcp_gpu_bench" $(use_mpi || echo "--gpus $gpus") --tokens 1,8,64 --context 524288 --merge both \
        --markdown "$out/grid-512k.md"
      echo "rc=$?"
    fi
    # Eager cost of non-blocking NCCL (each call's enqueue is polled for): the same step on blocking
    # communicators, when time remains.
    t_blocking="$(allow 90 5)"
    if [ "$t_blocking" -ge 40 ]; then
      echo "## blocking NCCL communicators (eager comparison)"
      timeout "$t_blocking" $(use_mpi && echo "mpirun -np $gpus --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH") \
        "$bin/mladcp_dcp_gpu_bench" $(use_mpi || echo "--gpus $gpus") --blocking-comm --tokens 8,64 --context 32768 \
        --merge a2a --no-baselines
      echo "rc=$?"
    fi
  } >"$out/grid.log" 2>&1
  note "grid: $(grep '^rc=' "$out/grid.log" | tr '\n' ' ')"
fi

if want tp16 && [ "$(allow 240 5)" -lt 30 ]; then
  note "tp16: skipped, out of time (${SECONDS}s used of ${budget}s)"
elif want tp16; then
  hpr="${HEADS_PER_RANK:-16}"
  {
    echo "# launch: $(launch_mode); $hpr heads per rank, H = $((hpr * gpus))"
    timeout "$(allow 240 5)" $(use_mpi && echo "mpirun -np $gpus --allow-run-as-root --oversubscribe -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH") \
      "$bin/mladcp_dcp_gpu_bench" $(use_mpi || echo "--gpus $gpus") --heads $((hpr * gpus)) --tokens 1,8,64 \
      --context 32768,131072 --merge a2a --markdown "$out/tp$hpr.md" --json "$out/tp$hpr.json"
    echo "rc=$?"
  } >"$out/tp$hpr.log" 2>&1
  note "tp16 ($hpr heads per rank): $(grep '^rc=' "$out/tp$hpr.log" | tr '\n' ' ')"
fi

{
  echo "# DCP on $gpus GPUs: summary ($(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo
  printf -- '- %s\n' "${status[@]}"
  echo
  [ -f "$out/check.log" ] && grep -E '^\| ' "$out/check.log" | head -n 60 && echo
  [ -f "$out/grid.md" ] && cat "$out/grid.md"
  for f in "$out"/tp*.md; do [ -f "$f" ] && cat "$f"; done
} >"$out/summary.md"
cat "$out/summary.md"
