#!/usr/bin/env bash
# run_mpi_fault.sh <limit seconds> <survivors> <mpirun command...>
# Runs the DCP fault drill under `timeout` and passes when every survivor printed DCP_FAULT_OK (an
# error within its deadline) and the run ended on its own (no hang).
set -u
limit=$1
want=$2
shift 2
start=$(date +%s%N)
out=$(timeout -k 5 "$limit" "$@" 2>&1)
rc=$?
end=$(date +%s%N)
printf '%s\n' "$out"
got=$(printf '%s\n' "$out" | grep -c '^DCP_FAULT_OK')
printf 'fault drill: mpirun exit %d after %d ms; %d of %d survivors reported a bounded error\n' \
  "$rc" "$(((end - start) / 1000000))" "$got" "$want"
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
  echo "FAIL: the run did not end within ${limit} s (killed by timeout)"
  exit 1
fi
if [ "$got" -ne "$want" ]; then
  echo "FAIL: expected $want DCP_FAULT_OK lines"
  exit 1
fi
echo "PASS"
