#!/usr/bin/env bash
# The Python module on the GPU machine, in one call: build it with CUDA (and NCCL when found), run the pytest
# suite with torch on the GPU (CUDA tensors, streams, graph capture, opcheck, fp8, cupy when present, the
# FlashMLA comparison when .peers/flashmla is built), the DcpDecoder test over a torch NCCL group with the
# module's own NCCL and with torch's (MLADCP_NCCL_LIBRARY: the adoption path), the DCP example under torchrun
# on 1, 2 and all GPUs, and the host-overhead benchmark. Logs go to $OUT (default out/python).
#
#   here, once:          tools/gpu/prepare_python.sh        (wheels of nanobind and pytest into .whl/)
#                        tools/gpu/prepare_deps.sh          (third-party sources into .deps/)
#   on the GPU machine:  tools/gpu/run_python.sh [stage...]  stages: build flashmla test nccl dcp bench
#                        (default: all but flashmla, which builds FlashMLA from .peers/ for the drop-in checks
#                        of `test`, about 2 minutes); carry .whl and .deps (and .peers)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build test nccl dcp bench)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
out="${OUT:-$root/out/python}"
mkdir -p "$out"
build="$(realpath -m "${MLADCP_PY_BUILD:-$root/build/gpu-python}")"  # MLADCP_PY_BUILD: an existing build folder
status=()
note() { status+=("$1"); echo "== $1"; }

if ! python3 -c "import nanobind, pytest" 2>/dev/null; then
  python3 -m pip install --quiet --no-index --find-links "$root/.whl" nanobind pytest >"$out/pip.log" 2>&1 ||
    python3 -m pip install --quiet nanobind pytest >>"$out/pip.log" 2>&1
fi
if want build; then
  {
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLADCP_DEPS_DIR="$root/.deps" \
      -DMLADCP_WITH_CUDA=ON -DMLADCP_PYTHON=ON -DMLADCP_BUILD_TESTS=OFF -DMLADCP_BUILD_BENCH=OFF \
      -DMLADCP_BUILD_APPS=OFF -DMLADCP_BUILD_EXAMPLES=OFF "-DMLADCP_CUDA_GENCODE_PORTABLE=${MLADCP_GPU_ARCH:-}" &&
      ninja -C "$build" -j "$(nproc)" _mladcp mladcp_python_files
  } >"$out/build.log" 2>&1
  rc=$?
  note "build: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see build.log)")"
  [ $rc -eq 0 ] || { tail -n 30 "$out/build.log"; exit 1; }
fi
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
if want flashmla; then  # FlashMLA from the carried .peers/ (about 2 minutes), for the drop-in comparisons of `test`
  if [ -f "$root/.peers/build_flashmla.sh" ]; then
    timeout 300 bash "$root/.peers/build_flashmla.sh" >"$out/flashmla_build.log" 2>&1
    note "flashmla build: rc $? ($(tail -n 1 "$out/flashmla_build.log"))"
  else
    note "flashmla build: .peers/build_flashmla.sh missing (carry .peers)"
  fi
fi
[ -d "$root/.peers/flashmla" ] && export MLADCP_FLASHMLA_PATH="$root/.peers/flashmla"
if want test; then
  (cd tests/python && timeout 400 python3 -m pytest -q -p no:cacheprovider -rs -s .) >"$out/pytest.log" 2>&1
  note "pytest: $(grep -E '[0-9]+ (passed|failed|skipped)|rror' "$out/pytest.log" | tail -n 1)"
  grep -E "^(FAILED|ERROR|SKIPPED)|empty row:" "$out/pytest.log" | head -n 20
fi
# The NCCL of torch's libraries (the file mapped once torch is imported), for the runs that share it.
torch_nccl=$(python3 -c "import torch; print(next((l.split()[-1] for l in open('/proc/self/maps') if 'libnccl' in l), ''))" 2>/dev/null)
if want nccl; then
  nccl_test=test_cuda.py::test_dcp_decoder_over_a_one_rank_nccl_group
  (cd tests/python && timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -s "$nccl_test") >"$out/nccl_own.log" 2>&1
  note "nccl test, module's own NCCL: rc $? $(grep -E '[0-9]+ (passed|failed|skipped)' "$out/nccl_own.log" | tail -n 1)"
  grep -E "adopt=|Segmentation|Fatal" "$out/nccl_own.log"
  if [ -n "$torch_nccl" ]; then
    (cd tests/python && MLADCP_NCCL_LIBRARY="$torch_nccl" timeout 200 python3 -m pytest -q -p no:cacheprovider -rs -s "$nccl_test") \
      >"$out/nccl_torch.log" 2>&1
    note "nccl test, torch's NCCL $torch_nccl: rc $? $(grep -E '[0-9]+ (passed|failed|skipped)' "$out/nccl_torch.log" | tail -n 1)"
    grep -E "adopt=|Segmentation|Fatal" "$out/nccl_torch.log"
  else
    note "nccl test, torch's NCCL: not run (no libnccl mapped after import torch)"
  fi
fi
if want dcp; then
  gpus=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  for n in $(seq 1 "$gpus" | awk '$1 == 1 || $1 == 2 || $1 == '"$gpus"'' | sort -un); do
    for merge in a2a ag-rs; do
      timeout 120 torchrun --standalone --nproc-per-node "$n" examples/python/dcp_decode.py --heads 128 \
        --context 5000 --merge "$merge" --q-len 2 >"$out/dcp_${n}_${merge}.log" 2>&1
      note "torchrun x$n $merge: rc $? $(grep -c PASS "$out/dcp_${n}_${merge}.log") PASS $(grep -m1 -oE 'nccl/[a-z]+' "$out/dcp_${n}_${merge}.log")"
    done
    grep -m1 "rank 0: NCCL" "$out/dcp_${n}_a2a.log"
    if [ -n "$torch_nccl" ]; then  # torch's NCCL for the module too: the group's communicator is adopted
      MLADCP_NCCL_LIBRARY="$torch_nccl" timeout 120 torchrun --standalone --nproc-per-node "$n" \
        examples/python/dcp_decode.py --heads 128 --context 5000 --merge a2a --q-len 2 >"$out/dcp_${n}_a2a_torch_nccl.log" 2>&1
      note "torchrun x$n a2a, torch's NCCL: rc $? $(grep -c PASS "$out/dcp_${n}_a2a_torch_nccl.log") PASS"
      grep -m1 "rank 0: NCCL" "$out/dcp_${n}_a2a_torch_nccl.log"
    fi
  done
fi
if want bench; then
  timeout 200 python3 bench/python/host_overhead.py --json "$out/host_overhead.json" >"$out/host_overhead.md" 2>&1
  note "host overhead: rc $?"
  cat "$out/host_overhead.md"
fi
printf '%s\n' "${status[@]}"
