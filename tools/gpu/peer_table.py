#!/usr/bin/env python3
"""One table from the RESULT lines of the peer harness and of mladcp_peer_bench (same configs.txt).

Usage: peer_table.py RESULTS_FILE... [--md OUT.md] [--configs CONFIGS.txt]  (the sets' names: CONFIGS.txt, default
.peers/configs.txt, and tools/gpu/extra_configs.txt)
Lines read: RESULT <who> h b s_q ctx variant median_us GB/s TFLOP/s (who: flashmla, mladcp, mladcp-<policy>,
mladcp-var-<name>: a compile-time variant of the kernel, shown as its own column against the default;
mladcp-fp8*: the same case on an fp8 cache, shown with the bf16 default's time over its own). A case measured in
several rounds (tools/gpu/run.sh peers) keeps its best median, the same rule for every column.
Prints, per configuration: FlashMLA µs, mladcp µs (default policy), ratio mladcp/FlashMLA (< 1: mladcp faster),
mladcp TFLOP/s and GB/s, the other policies' µs and the default's excess over the best policy; then the geomean
ratio of each configuration set.
"""
import math
import sys


def main():
    args = sys.argv[1:]
    md_out = None
    if "--md" in args:
        i = args.index("--md")
        md_out = args[i + 1]
        del args[i:i + 2]
    configs = ".peers/configs.txt"
    if "--configs" in args:
        i = args.index("--configs")
        configs = args[i + 1]
        del args[i:i + 2]
    res = {}  # (h, b, s_q, ctx, variant) -> {who: (us, gbs, tflops)}
    order = []
    for path in args:
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) != 10 or p[0] != "RESULT":
                    continue
                key = (int(p[2]), int(p[3]), int(p[4]), int(p[5]), p[6])
                if key not in res:
                    res[key] = {}
                    order.append(key)
                row = (float(p[7]), float(p[8]), float(p[9]))
                if p[1] not in res[key] or row[0] < res[key][p[1]][0]:  # several rounds: the best median
                    res[key][p[1]] = row
    sets = {}
    for cfg_path in (configs, "tools/gpu/extra_configs.txt"):
        try:
            with open(cfg_path) as f:
                for line in f:
                    p = line.split("#", 1)[0].split()
                    if len(p) >= 6:
                        sets.setdefault((int(p[1]), int(p[2]), int(p[3]), int(p[4]), p[5]), p[0])
        except OSError:
            pass
    names = {w for r in res.values() for w in r}
    policies = sorted(w for w in names if w.startswith("mladcp-") and w != "mladcp-nolse" and
                      not w.startswith("mladcp-var-") and not w.startswith("mladcp-fp8"))
    fp8 = sorted(w for w in names if w.startswith("mladcp-fp8"))  # fp8 cache: bf16 default µs ÷ fp8 µs
    kernel_variants = sorted(w for w in names if w.startswith("mladcp-var-"))  # compile-time kernel variants
    head = ["set", "h", "b", "s_q", "ctx", "variant", "FlashMLA µs", "mladcp µs", "ratio", "mladcp TFLOP/s",
            "mladcp GB/s"] + [f"{p[7:]} µs" for p in policies] + ["default vs best", "no-LSE µs"]
    head += [f"{v[11:]} µs (÷ default)" for v in kernel_variants]
    head += [f"{v[7:]} µs (bf16 ÷ fp8, GB/s)" for v in fp8]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = {}
    for key in order:
        r = res[key]
        if "mladcp" not in r:
            continue
        us, gbs, tf = r["mladcp"]
        f = r.get("flashmla")
        ratio = us / f[0] if f else float("nan")
        s = sets.get(key, "")
        if f:
            ratios.setdefault(s, []).append(ratio)
        best = min([us] + [r[p][0] for p in policies if p in r])
        row = [s, *map(str, key[:4]), key[4], f"{f[0]:.1f}" if f else "-", f"{us:.1f}",
               f"{ratio:.2f}" if f else "-", f"{tf:.1f}", f"{gbs:.0f}"]
        row += [f"{r[p][0]:.1f}" if p in r else "-" for p in policies]
        row += [f"{(us / best - 1) * 100:+.1f}%", f"{r['mladcp-nolse'][0]:.1f}" if "mladcp-nolse" in r else "-"]
        row += [f"{r[v][0]:.1f} ({r[v][0] / us:.3f})" if v in r else "-" for v in kernel_variants]
        row += [f"{r[v][0]:.1f} ({us / r[v][0]:.2f}×, {r[v][1]:.0f})" if v in r else "-" for v in fp8]
        lines.append("| " + " | ".join(row) + " |")
    for s, v in sorted(ratios.items()):
        g = math.exp(sum(math.log(x) for x in v) / len(v))
        lines.append(f"\ngeomean ratio ({s or 'all'}, {len(v)} configurations): {g:.3f}; "
                     f"mladcp faster on {sum(x < 1 for x in v)}")
    text = "\n".join(lines) + "\n"
    print(text)
    if md_out:
        with open(md_out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
