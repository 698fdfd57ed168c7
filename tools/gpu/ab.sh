#!/usr/bin/env bash
# A/B of builds of mladcp_peer_bench in one call on the GPU machine: the builds take turns, round after round, on the
# same configurations (default policy unless MLADCP_AB_POLICY), and the table gives each build's median of its
# rounds' medians and its ratio to the first build. Taking turns matters: the board runs at its power limit, so the
# clock depends on what ran just before, and two binaries timed one after the other in a single pass differ by a few
# per cent for that alone (docs/perf/gpu-sm90-power-2026-12-02.md).
#
#   tools/gpu/ab.sh CONFIGS ROUNDS NAME=BENCH [NAME=BENCH ...]
#   e.g. (binaries from tools/gpu/build_variant.sh, carried):
#   tools/gpu/ab.sh tools/gpu/extra_configs.txt 3 base=build/var/base/mladcp_peer_bench new=build/var/new/mladcp_peer_bench
#
# Log: $OUT/ab.log (every RESULT line, relabelled with the build's name); the table is printed.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: $0 CONFIGS ROUNDS NAME=BENCH [NAME=BENCH ...]" >&2; exit 2; }
configs="$1" rounds="$2"
shift 2
out="${OUT:-out/gpu}"
mkdir -p "$out"
log="$out/ab.log"
: >"$log"
for ((r = 1; r <= rounds; ++r)); do
  for spec in "$@"; do
    name="${spec%%=*}" bench="${spec#*=}"
    timeout 300 "$bench" --configs "$configs" --policies "${MLADCP_AB_POLICY:-default}" 2>&1 |
      sed -E "s/^RESULT mladcp(-[a-z0-9-]+)? /RESULT $name /" >>"$log"
  done
done
names=()
for spec in "$@"; do names+=("${spec%%=*}"); done
python3 - "$log" "${names[@]}" <<'PY'
import collections
import sys

log, names = sys.argv[1], sys.argv[2:]
runs = collections.defaultdict(lambda: collections.defaultdict(list))  # config -> build -> [median µs per round]
order = []
for line in open(log):
    f = line.split()
    if len(f) == 10 and f[0] == "RESULT" and f[1] in names:
        key = " ".join(f[2:7])
        if key not in runs:
            order.append(key)
        runs[key][f[1]].append(float(f[7]))
head = "| h b s_q ctx variant | " + " | ".join(f"{n} µs" for n in names) + " | " + \
    " | ".join(f"{n} / {names[0]}" for n in names[1:]) + " |"
print(head)
print("|" + "---|" * (1 + 2 * len(names) - 1))
for key in order:
    med = {}
    for n in names:
        v = sorted(runs[key].get(n, []))
        med[n] = v[len(v) // 2] if v else float("nan")
    cells = [f"{med[n]:.1f}" for n in names] + [f"{med[n] / med[names[0]]:.3f}" for n in names[1:]]
    print(f"| {key} | " + " | ".join(cells) + " |")
PY
