#!/usr/bin/env bash
# The "cuda" backend on one GPU, in one call on the GPU machine: build, GPU tests, compute-sanitizer
# (memcheck, racecheck, initcheck, synccheck on the small-shape subset CudaSanitize.*), and the decode
# benchmark. Logs go to $OUT (at most 8 files); a summary table is printed last.
#
#   here, once:          tools/gpu/prepare_deps.sh          (third-party sources into .deps/, git-ignored)
#   on the GPU machine:  tools/gpu/run.sh [stage...]        stages: build test bench sanitize (default: all),
#                                                           peers (FlashMLA side by side, see below),
#                                                           profile (Nsight Compute on three configurations),
#                                                           variants (compile-time variants of the Hopper kernel),
#                                                           peerprofile (Nsight Compute on FlashMLA's split kernel and mladcp's),
#                                                           timeline (the Hopper kernel's per-CTA timeline, below)
#
# peers: FlashMLA, a measuring instrument kept outside the project, side by side in the same call. Here:
#   cp -a ../shared/peers .peers && echo /.peers/ >> .git/info/exclude     (then carry ".peers")
# or, once FlashMLA was built and its extension saved (MLADCP_FLASHMLA_SAVE=1), a slim copy without its sources
# (14 MB instead of 30 MB of the 64 MiB carry): bench_flashmla.py, configs.txt and flashmla/flash_mla/ with the
# extension in it, named by MLADCP_PEERS_DIR.
# The stage builds it (.peers/build_flashmla.sh), runs its harness and mladcp_peer_bench on the same
# .peers/configs.txt (same cases, same method) and prints one table (tools/gpu/peer_table.py):
# FlashMLA µs, mladcp µs, ratio, TFLOP/s, GB/s, and the split policies against each other.
#
# Environment:
#   MLADCP_GPU_PREBUILT=dir  use the binaries in dir (cuda_decode_test, cuda_state_test, mladcp_gpu_bench),
#                            built elsewhere from this tree, when they start here; else build as usual
#   MLADCP_GPU_ARCH=flags    -gencode flags of the portable target (default: none, Hopper sm_90a only)
#   MLADCP_GPU_BENCH_ARGS    extra arguments of mladcp_gpu_bench (e.g. --quick)
#   MLADCP_GPU_BUDGET_S      seconds the whole script may take (default 540); later stages get what is left
#   MLADCP_PEERS_MLADCP_ONLY=1  peers stage without FlashMLA (iterations; a recorded ratio needs both)
#   MLADCP_FLASHMLA_PREBUILT=1  peers stage: reuse .peers/flashmla/flash_mla/cuda*.so when it imports (built by an
#                            earlier call of this machine kind and carried back; saves ~2 min); else build
#   MLADCP_FLASHMLA_SAVE=1   peers stage: copy the built extension to $OUT (to carry it next time)
#   MLADCP_PEERS_DIR=dir     peers stages: the peers folder (default .peers; a slim copy needs the extension inside)
#   MLADCP_PEER_ROUNDS       peers stage: rounds of FlashMLA then mladcp (default 2); the table keeps each one's best
#   MLADCP_PEER_POLICIES     peers stage: mladcp_peer_bench --policies (default default,invariant,nolse,splits,balanced)
#   MLADCP_GPU_PROFILE_CONFIGS  profile stage configurations (H,B,CTX,QLEN,KV ...)
#   MLADCP_PROFILE_SOURCE=1  profile stage: also the warp stall samples of every SASS instruction, one gzipped CSV per
#                            configuration ($OUT/profile_<n>_sass.csv.gz, Nsight Compute's source page)
#   MLADCP_PEERPROFILE_CONFIGS  peerprofile stage: configs.txt lines, one per line (default 128 h × 16 × 64K)
#   MLADCP_GPU_VARIANTS      variants stage: "NAME=-DMACRO=V[,-DMACRO2=V2] ..." (Hopper kernels rebuilt per variant)
#   MLADCP_VARIANT_POLICY    variants stage: the peer bench policy timed (default; fp8 for the fp8 kernel)
#   MLADCP_VARIANT_EXTRA=0   variants stage: time the peers' configurations only (not tools/gpu/extra_configs.txt)
#   MLADCP_GPU_VARIANT_DIRS  variants stage: "NAME=DIR ..." of binaries built elsewhere from edited trees
#                            (tools/gpu/build_variant.sh NAME: the GPU binaries in build/var/NAME;
#                            carry build/var): each variant's tests (MLADCP_VARIANT_TESTS, default Sm90*:CudaSanitize*)
#                            run, then it is timed as "mladcp-var-NAME"; no build on the GPU machine
#   MLADCP_GPU_NCCL=ON       build the NCCL communicator too (the Python module's DcpDecoder tests use it)
#   MLADCP_TIMELINE_BENCH=f  timeline stage: a mladcp_peer_bench built with -DMLADCP_SM90_TIMELINE=ON elsewhere (else it
#                            is built here in build/gpu-timeline)
#   MLADCP_TIMELINE_CONFIGS  timeline stage: configs.txt-style file (default tools/gpu/timeline_configs.txt)
#   MLADCP_TIMELINE_POLICIES timeline stage: mladcp_peer_bench --policies (default: default)
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"

stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(build test bench sanitize)
deadline=$(($(date +%s) + ${MLADCP_GPU_BUDGET_S:-540}))
left() { local l=$((deadline - $(date +%s) - ${1:-0})); echo $((l > 5 ? l : 5)); }  # seconds left, minus a reserve
cap() { local l; l=$(left "${2:-0}"); echo $((l < $1 ? l : $1)); }                 # min(limit, seconds left)
want() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }

out="${OUT:-$root/out/gpu}"
mkdir -p "$out"
build="$root/build/gpu"
bin=""  # folder holding the three executables
status=()
note() { status+=("$1"); echo "== $1"; }
commit="$(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo '+local')"

prebuilt_ok() {
  local pre="$1"
  [ -n "$pre" ] && [ -x "$pre/cuda_decode_test" ] && [ -x "$pre/cuda_state_test" ] && [ -x "$pre/mladcp_gpu_bench" ] &&
    "$pre/cuda_decode_test" --gtest_list_tests >/dev/null 2>&1
}

if want build; then
  rc=0
  {
    echo "# $(date -u +%FT%TZ) commit $commit"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
    nvcc --version 2>&1 | tail -n 1
  } >"$out/build.log" 2>&1
  if prebuilt_ok "${MLADCP_GPU_PREBUILT:-}"; then
    bin="$MLADCP_GPU_PREBUILT"
    { echo "using prebuilt binaries from $bin"; cat "$bin/STAMP" 2>/dev/null; } >>"$out/build.log"
    how="prebuilt $bin"
  else
    [ -n "${MLADCP_GPU_PREBUILT:-}" ] && echo "prebuilt binaries in '$MLADCP_GPU_PREBUILT' do not start here; building" >>"$out/build.log"
    {
      cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLADCP_DEPS_DIR="$root/.deps" \
        -DMLADCP_WITH_CUDA=ON "-DMLADCP_WITH_NCCL=${MLADCP_GPU_NCCL:-OFF}" -DMLADCP_WITH_MPI=OFF -DMLADCP_BUILD_APPS=OFF \
        -DMLADCP_BUILD_BENCH=ON -DMLADCP_BUILD_TESTS=ON -DMLADCP_CUDA_PTXAS_VERBOSE=ON \
        "-DMLADCP_CUDA_GENCODE_PORTABLE=${MLADCP_GPU_ARCH:-}" &&
        ninja -C "$build" -j "$(nproc)" cuda_decode_test cuda_state_test cuda_dcp_test mladcp_gpu_bench mladcp_peer_bench
    } >>"$out/build.log" 2>&1
    rc=$?
    bin="$build/gpu-bin"
    mkdir -p "$bin"
    for b in tests/cuda/cuda_decode_test tests/cuda/cuda_state_test tests/cuda/cuda_dcp_test bench/gpu/mladcp_gpu_bench \
      bench/gpu/mladcp_peer_bench; do
      [ -x "$build/$b" ] && cp "$build/$b" "$bin/"
    done
    how="built here"
  fi
  # Instruction mix of the bf16 split kernels (16 and 64 rows): tensor-core HMMA, ldmatrix, local memory.
  if [ $rc -eq 0 ] && command -v cuobjdump >/dev/null; then
    sass="$(mktemp)"
    cuobjdump -sass -arch sm_90a "$bin/cuda_decode_test" >"$sass" 2>/dev/null || true
    for k in 1 4; do
      awk -v k="mla_decode_split_kernelILi${k}ELb0" '/Function : / {f = index($0, k) > 0} f' "$sass" |
        grep -oE '^ +/\*[0-9a-f]+\*/ +[A-Z][A-Z0-9]*' | awk '{print $2}' | sort | uniq -c | sort -rn | head -n 24 |
        awk -v r=$((16 * k)) '{printf "sass (%d-row bf16 split kernel): %s %s\n", r, $2, $1}' >>"$out/build.log"
    done
    # The Hopper kernel: wgmma, bulk tensor copies, barriers, local memory.
    awk '/Function : / {f = index($0, "mla_decode_sm90_kernel") > 0} f' "$sass" |
      grep -oE '^ +/\*[0-9a-f]+\*/ +(@!?U?P[0-9T] +)?[A-Z][A-Z0-9.]*' | awk '{print $NF}' | sed 's/\..*//' |
      grep -E '^(HGMMA|UTMALDG|SYNCS|BAR|LDL|STL|USETMAXREG|WARPGROUP)$' | sort | uniq -c |
      awk '{printf "sass (Hopper kernel): %s %s\n", $2, $1}' >>"$out/build.log"
    rm -f "$sass"
  fi
  note "build: $([ $rc -eq 0 ] && echo ok || echo "FAILED (rc $rc, see build.log)") ($how)"
  grep -qE '[1-9][0-9]* bytes spill' "$out/build.log" && note "build: WARNING register spills (see build.log)"
  grep -E 'sass \((16|64)-row.*(HMMA|LDSM|BAR|LDL) |sass \(Hopper' "$out/build.log" | paste -sd ';' -
  [ $rc -eq 0 ] || { tail -n 40 "$out/build.log"; printf '%s\n' "${status[@]}"; exit 1; }
else
  bin="${MLADCP_GPU_PREBUILT:-$build/gpu-bin}"
fi

# Runs a gtest binary in N parallel shards; the log gets every shard's output, the summary line counts.
run_sharded() {
  local exe="$1" shards="$2" log="$3" i
  local dir
  dir="$(mktemp -d)"
  for ((i = 0; i < shards; ++i)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout "$(cap 240 60)" "$exe" --gtest_brief=0 >"$dir/$i.log" 2>&1 &
  done
  local rc=0
  for ((i = 0; i < shards; ++i)); do wait -n || rc=1; done
  cat "$dir"/*.log >>"$log"
  rm -rf "$dir"
  return $rc
}

if want test; then
  : >"$out/tests.log"
  t0=$(date +%s)
  run_sharded "$bin/cuda_decode_test" 16 "$out/tests.log"
  rc1=$?
  run_sharded "$bin/cuda_state_test" 4 "$out/tests.log"
  rc2=$?
  [ -x "$bin/cuda_dcp_test" ] && { run_sharded "$bin/cuda_dcp_test" 8 "$out/tests.log" || rc2=1; }
  passed=$(grep -c '^\[       OK \]' "$out/tests.log")
  failed=$(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$out/tests.log")
  skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z].*(' "$out/tests.log")
  note "tests: $passed passed, $failed failed, $skipped skipped in $(($(date +%s) - t0)) s (rc $rc1/$rc2)"
  [ "$failed" -gt 0 ] && grep -E '^\[  FAILED  \] [A-Za-z].*\(' "$out/tests.log" | head -n 20
fi

if want bench; then
  timeout "$(cap 240 10)" "$bin/mladcp_gpu_bench" --json "$out/bench.json" --md "$root/build/bench.md" ${MLADCP_GPU_BENCH_ARGS:-} \
    >"$out/bench.log" 2>&1
  rc=$?
  note "bench: rc $rc; $(tail -n 1 "$out/bench.log")"
fi

peers="${MLADCP_PEERS_DIR:-.peers}"
if want peers; then
  # FlashMLA and mladcp take turns (MLADCP_PEER_ROUNDS rounds, default 2: F M F M) and the table keeps each side's
  # best median: under the board's power cap the clock depends on what ran just before (docs/perf,
  # gpu-sm90-power-2026-12-02.md), so one side measured always first or always on a hotter GPU is biased.
  flashmla=0
  if [ -f "$peers/bench_flashmla.py" ] && [ -z "${MLADCP_PEERS_MLADCP_ONLY:-}" ]; then
    t0=$(date +%s)
    if { [ -n "${MLADCP_FLASHMLA_PREBUILT:-}" ] || [ ! -f "$peers/build_flashmla.sh" ]; } &&
      ls "$peers"/flashmla/flash_mla/cuda*.so >/dev/null 2>&1 &&
      (cd "$peers/flashmla" && python3 -c "import flash_mla.cuda") >"$out/peers.log" 2>&1; then
      note "peers: FlashMLA prebuilt extension (carried in $peers/flashmla/flash_mla) imports; not rebuilt"
    else
      timeout "$(cap 300 60)" bash "$peers/build_flashmla.sh" >"$out/peers.log" 2>&1
      note "peers: FlashMLA build rc $? in $(($(date +%s) - t0)) s"
    fi
    [ -n "${MLADCP_FLASHMLA_SAVE:-}" ] && cp "$peers"/flashmla/flash_mla/cuda*.so "$out/"
    flashmla=1
  else
    note "peers: FlashMLA not run ($peers/ missing, or MLADCP_PEERS_MLADCP_ONLY set); mladcp only"
    : >"$out/peers.log"
  fi
  for round in $(seq 1 "${MLADCP_PEER_ROUNDS:-2}"); do
    if [ $flashmla = 1 ]; then
      timeout "$(cap 200 30)" python3 "$peers/bench_flashmla.py" --configs "$peers/configs.txt" >>"$out/peers.log" 2>&1
      rc1=$?
      timeout "$(cap 120 30)" python3 "$peers/bench_flashmla.py" --configs tools/gpu/extra_configs.txt >>"$out/peers.log" 2>&1
      note "peers: round $round: FlashMLA harness rc $rc1 (extra configurations rc $?)"
    fi
    for cfgs in "${MLADCP_PEER_CONFIGS:-$peers/configs.txt}" tools/gpu/extra_configs.txt; do
      timeout "$(cap 200 10)" "$bin/mladcp_peer_bench" --configs "$cfgs" --policies "${MLADCP_PEER_POLICIES:-default,invariant,nolse,splits,balanced}" \
        >>"$out/peers.log" 2>&1
      note "peers: round $round: mladcp on $cfgs rc $?"
    done
  done
  python3 tools/gpu/peer_table.py "$out/peers.log" --md "$root/build/peers.md" --configs "$peers/configs.txt"
fi

if want variants; then
  # Compile-time variants of the Hopper kernels against the build above, in the same call: for each
  # "NAME=-DMACRO=V[,-DMACRO2=V2]" of MLADCP_GPU_VARIANTS, only the two Hopper kernels' objects are recompiled
  # with those definitions and mladcp_peer_bench relinked (the commands ninja would run), then timed on the
  # peers' configurations (MLADCP_VARIANT_POLICY, default "default"; "fp8" for the fp8 kernel) as
  # "mladcp-var-NAME"; the peers table is printed again with them. MLADCP_GPU_VARIANT_DIRS: the same for
  # variants built elsewhere (tools/gpu/build_variant.sh), whose Hopper tests run first.
  time_variant() {  # NAME BENCH: BENCH on the peers' configurations, its rows labelled as variant NAME
    local cfgs
    local list=("${MLADCP_PEER_CONFIGS:-$peers/configs.txt}")
    [ "${MLADCP_VARIANT_EXTRA:-1}" = 0 ] || list+=(tools/gpu/extra_configs.txt)
    for cfgs in "${list[@]}"; do
      timeout "$(cap 200 10)" "$2" --configs "$cfgs" --policies "${MLADCP_VARIANT_POLICY:-default}" 2>&1 |
        sed -E "s/^RESULT mladcp(-fp8)? /RESULT mladcp\1-var-$1 /" >>"$out/peers.log"
    done
  }
  cmds="$(ninja -C "$build" -t commands mladcp_peer_bench)"
  compile="$(grep -E '/sm90_decode_kernel.cu.o ' <<<"$cmds" | grep -- ' -c ' | head -n1)"
  compile_fp8="$(grep -E '/sm90_fp8_decode_kernel.cu.o ' <<<"$cmds" | grep -- ' -c ' | head -n1)"
  archive="$(grep 'ar qc src/cuda/libmladcp_cuda.a' <<<"$cmds" | head -n1)"
  link="$(grep -- '-o bench/gpu/mladcp_peer_bench' <<<"$cmds" | head -n1)"
  touch "$out/peers.log"
  for spec in ${MLADCP_GPU_VARIANTS:-}; do
    name="${spec%%=*}" defs="${spec#*=}"
    if (cd "$build" && eval "${compile/ -c / ${defs//,/ } -c }" && eval "${compile_fp8/ -c / ${defs//,/ } -c }" &&
      eval "$archive" && eval "$link") >>"$out/build.log" 2>&1; then
      time_variant "$name" "$build/bench/gpu/mladcp_peer_bench"
      note "variant $name ($defs): timed"
    else
      note "variant $name ($defs): build FAILED (see build.log)"
    fi
  done
  for spec in ${MLADCP_GPU_VARIANT_DIRS:-}; do
    name="${spec%%=*}" dir="${spec#*=}"
    if [ ! -x "$dir/mladcp_peer_bench" ]; then
      note "variant $name: no mladcp_peer_bench in $dir"
      continue
    fi
    if [ -x "$dir/cuda_decode_test" ]; then
      echo "## variant $name: $dir/cuda_decode_test" >>"$out/variants.log"
      timeout "$(cap 180 10)" "$dir/cuda_decode_test" --gtest_filter="${MLADCP_VARIANT_TESTS:-Sm90*:CudaSanitize*}" \
        >>"$out/variants.log" 2>&1
      vrc=$?
      note "variant $name ($dir): tests rc $vrc ($(grep -E '^\[  (PASSED|FAILED)  \]' "$out/variants.log" | tail -n 1))"
    fi
    time_variant "$name" "$dir/mladcp_peer_bench"
    note "variant $name ($dir): timed"
  done
  python3 tools/gpu/peer_table.py "$out/peers.log" --md "$root/build/peers.md" --configs "$peers/configs.txt"
fi

if want sanitize; then
  : >"$out/sanitizer.log"
  for tool in memcheck racecheck initcheck synccheck; do
    for exe in cuda_decode_test cuda_state_test; do
      echo "## compute-sanitizer --tool $tool $exe --gtest_filter=CudaSanitize.*" >>"$out/sanitizer.log"
      t0=$(date +%s)
      timeout "$(cap 120 5)" compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
        "$bin/$exe" --gtest_filter='CudaSanitize.*' >>"$out/sanitizer.log" 2>&1
      rc=$?
      note "sanitizer $tool $exe: $([ $rc -eq 0 ] && echo clean || echo "rc $rc") ($(($(date +%s) - t0)) s, $(grep -c '^\[       OK \]' "$out/sanitizer.log") ok so far)"
    done
  done
fi

if want profile; then
  ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)"
  : >"$out/profile.log"
  n=0
  for cfg in ${MLADCP_GPU_PROFILE_CONFIGS:-16,128,4096,1,bf16 128,64,4096,1,bf16 16,128,4096,1,fp8}; do
    echo "## ncu split kernel, --only $cfg" >>"$out/profile.log"
    rep=()
    [ -n "${MLADCP_PROFILE_SOURCE:-}" ] && rep=(-o "$out/profile_$n")
    timeout "$(cap 90 5)" "$ncu_bin" --clock-control none -k regex:'mla_decode_s(plit|m90)' --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
      --section SourceCounters "${rep[@]}" \
      "$bin/mladcp_gpu_bench" --only "$cfg" --reps 3 --warmup 2 --no-ceilings >>"$out/profile.log" 2>&1
    note "profile $cfg: rc $?"
    if [ -f "$out/profile_$n.ncu-rep" ]; then
      # Warp stall samples per SASS instruction (where the pair loop's warps wait), for reading offline.
      "$ncu_bin" --import "$out/profile_$n.ncu-rep" --page details >>"$out/profile.log" 2>&1
      timeout "$(cap 60 5)" "$ncu_bin" --import "$out/profile_$n.ncu-rep" --page source --csv --print-source sass \
        >"$out/profile_${n}_sass.csv" 2>&1 && gzip -f "$out/profile_${n}_sass.csv"
      rm -f "$out/profile_$n.ncu-rep"
    fi
    n=$((n + 1))
  done
fi

if want peerprofile; then
  # Nsight Compute on FlashMLA's split kernel and on mladcp's, same configuration, same sections, one file
  # (FlashMLA built here unless the peers stage did). Configurations: lines of the peers' configs.txt.
  ncu_bin="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n1)"
  sections=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables
    --section WarpStateStats --section InstructionStats --section SchedulerStats --section LaunchStats
    --metrics smsp__inst_executed.sum,sm__cycles_elapsed.avg.per_second,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct)
  : >"$out/peerprofile.log"
  if ! ls "$peers"/flashmla/flash_mla/cuda*.so >/dev/null 2>&1; then
    timeout "$(cap 300 60)" bash "$peers/build_flashmla.sh" >>"$out/peerprofile.log" 2>&1
    note "peerprofile: FlashMLA build rc $?"
  fi
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    cfg="$(mktemp)"
    echo "$line" >"$cfg"
    echo "## $line: FlashMLA" >>"$out/peerprofile.log"
    timeout "$(cap 120 5)" "$ncu_bin" --clock-control none -k regex:flash_fwd_splitkv_mla --launch-skip 2 --launch-count 1 \
      "${sections[@]}" python3 "$peers/bench_flashmla.py" --configs "$cfg" --reps 2 --warmup 1 >>"$out/peerprofile.log" 2>&1
    note "peerprofile FlashMLA $line: rc $?"
    echo "## $line: mladcp" >>"$out/peerprofile.log"
    timeout "$(cap 120 5)" "$ncu_bin" --clock-control none -k regex:'mla_decode_s(plit|m90)' --launch-skip 2 --launch-count 1 \
      "${sections[@]}" "$bin/mladcp_peer_bench" --configs "$cfg" --policies default --reps 2 --warmup 1 \
      >>"$out/peerprofile.log" 2>&1
    note "peerprofile mladcp $line: rc $?"
    rm -f "$cfg"
  done <<<"${MLADCP_PEERPROFILE_CONFIGS:-public 128 16 1 65536 fixed}"
fi

if want timeline; then
  # Where a CTA's time goes, without a profiler (src/cuda/sm90_timeline.cuh): one more call of each case with
  # %globaltimer marks per CTA (start, first scores, loop end, output written, first and last copy) and the
  # combine's span, printed as TIMELINE lines by mladcp_peer_bench --timeline.
  tbench="${MLADCP_TIMELINE_BENCH:-}"
  if [ -z "$tbench" ] || ! [ -x "$tbench" ]; then
    tbuild="$root/build/gpu-timeline"
    cmake -S "$root" -B "$tbuild" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMLADCP_DEPS_DIR="$root/.deps" \
      -DMLADCP_WITH_CUDA=ON -DMLADCP_WITH_NCCL=OFF -DMLADCP_WITH_MPI=OFF -DMLADCP_BUILD_APPS=OFF -DMLADCP_BUILD_TESTS=OFF \
      -DMLADCP_BUILD_EXAMPLES=OFF -DMLADCP_PYTHON=OFF -DMLADCP_BUILD_BENCH=ON -DMLADCP_SM90_TIMELINE=ON \
      "-DMLADCP_CUDA_GENCODE_PORTABLE=${MLADCP_GPU_ARCH:-}" >"$out/timeline.log" 2>&1 &&
      ninja -C "$tbuild" -j "$(nproc)" mladcp_peer_bench >>"$out/timeline.log" 2>&1
    note "timeline: build rc $?"
    tbench="$tbuild/bench/gpu/mladcp_peer_bench"
  fi
  timeout "$(cap 200 5)" "$tbench" --configs "${MLADCP_TIMELINE_CONFIGS:-tools/gpu/timeline_configs.txt}" \
    --policies "${MLADCP_TIMELINE_POLICIES:-default}" --timeline >>"$out/timeline.log" 2>&1
  note "timeline: rc $?"
  grep -E '^(TIMELINE|PAIRS)' "$out/timeline.log"
fi

{
  echo "# cuda backend on one GPU: summary ($(date -u +%FT%TZ), commit $commit)"
  echo
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader 2>&1
  echo
  printf -- '- %s\n' "${status[@]}"
  echo
  [ -f "$root/build/peers.md" ] && { want peers || want variants; } && cat "$root/build/peers.md"
  [ -f "$root/build/bench.md" ] && want bench && cat "$root/build/bench.md"
} >"$out/summary.md"
cat "$out/summary.md"
