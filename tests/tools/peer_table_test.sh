#!/usr/bin/env bash
# tools/gpu/peer_table.py on two rounds of RESULT lines: each side keeps its best median, the ratio and the
# geomean come from those, and a line of another shape is ignored.
set -uo pipefail
tools="$(cd "$1" && pwd)"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
cat >"$dir/peers.log" <<'LOG'
RESULT flashmla 128 16 1 65536 fixed 430.0 2500 600
RESULT mladcp 128 16 1 65536 fixed 484.0 2500 600
RESULT mladcp-nolse 128 16 1 65536 fixed 483.0 2500 600
RESULT flashmla 128 16 1 65536 fixed 440.0 2500 600
RESULT mladcp 128 16 1 65536 fixed 473.0 2500 600
RESULT mladcp 128 16 1 65536 fixed not-a-number
some other line
LOG
out="$(cd "$dir" && python3 "$tools/gpu/peer_table.py" peers.log)" || { echo "FAIL: peer_table.py exited $?"; exit 1; }
fail=0
# best medians: FlashMLA 430.0, mladcp 473.0 -> ratio 1.10
grep -q '| 430.0 | 473.0 | 1.10 |' <<<"$out" || { echo "FAIL: best medians not kept:"; echo "$out"; fail=1; }
grep -q 'geomean ratio (all, 1 configurations): 1.100' <<<"$out" || { echo "FAIL: geomean"; echo "$out"; fail=1; }
grep -q '484.0\|440.0' <<<"$out" && { echo "FAIL: a worse round's median is shown"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: peer_table keeps each side's best median over rounds"
exit $fail
