#!/usr/bin/env python3
"""Host time of one decode call from Python, against the same call made from C++.

For each configuration it times, per call and on the host only (on a GPU: the enqueue, the device runs
behind), with caller-provided out and lse as an engine passes them:
  cpp        Backend::decode in a C++ loop (the module's _time_cpp_decode: arguments parsed once)
  python     mladcp.decode(q, kv, block_table, seq_lens, softmax_scale=..., out=out, lse=lse)
  op         torch.ops.mladcp.decode_out(...) (torch tensors only)
and prints the overhead python - cpp and op - cpp in microseconds (median of --rounds rounds of --iters calls;
on a GPU the device is synchronized between rounds, outside the timed loops, so the launch queue never fills).

Usage: host_overhead.py [--device cuda|cpu] [--iters 200] [--rounds 30] [--json FILE]
"""
import argparse
import json
import statistics
import sys
import time

import numpy as np

import mladcp


def make(torch, device, heads, batch, ctx, bs=64):
    nb = (ctx + bs - 1) // bs
    q = torch.randn(batch, heads, 576, device=device).bfloat16()
    kv = torch.randn(batch * nb, bs, 576, device=device).bfloat16()
    bt = torch.arange(batch * nb, dtype=torch.int32, device=device).view(batch, nb)
    sl = torch.full((batch,), ctx, dtype=torch.int32, device=device)
    out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device=device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=device)
    return q, kv, bt, sl, out, lse


def per_call_us(fn, iters, rounds, sync):
    samples = []
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e6)
    sync()
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() and mladcp.cuda_built else "cpu")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    configs = [(16, 1, 64), (128, 4, 1024), (16, 64, 4096)] if device == "cuda" else [(16, 1, 64)]
    rows = []
    from mladcp import _frameworks as fw

    fw.torch_module()
    path = "DLPack C exchange API" if getattr(fw, "_decode_torch", None) is not None else "DLPack capsules"
    print(f"device {device}, {torch.cuda.get_device_name() if device == 'cuda' else 'host'}, mladcp "
          f"{mladcp.__version__}, torch {torch.__version__}, torch tensors through {path}, {args.rounds} rounds x "
          f"{args.iters} calls, median")
    print("| heads | batch | ctx | cpp us | python us | op us | python - cpp us | op - cpp us |")
    print("|---|---|---|---|---|---|---|---|")
    for heads, batch, ctx in configs:
        q, kv, bt, sl, out, lse = make(torch, device, heads, batch, ctx)
        scale = 1.0 / 192 ** 0.5
        stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
        mladcp.decode(q, kv, bt, sl, softmax_scale=scale, out=out, lse=lse)  # workspace, warm caches
        cpp_samples = []
        for _ in range(args.rounds):
            sync()
            cpp_samples.append(mladcp._mladcp._time_cpp_decode(q, kv, bt, sl, out, lse, scale, 1, "", stream,
                                                               args.iters) / 1e3)
        cpp = statistics.median(cpp_samples)
        py = per_call_us(lambda: mladcp.decode(q, kv, bt, sl, softmax_scale=scale, out=out, lse=lse),
                         args.iters, args.rounds, sync)
        op_fn = torch.ops.mladcp.decode_out
        op = per_call_us(lambda: op_fn(q, kv, bt, sl, out, lse, scale, 1, 1.0, "e", "", 1, 0, 1, "", 0),
                         args.iters, args.rounds, sync)
        rows.append(dict(heads=heads, batch=batch, ctx=ctx, device=device, cpp_us=cpp, python_us=py, op_us=op,
                         python_overhead_us=py - cpp, op_overhead_us=op - cpp))
        print(f"| {heads} | {batch} | {ctx} | {cpp:.2f} | {py:.2f} | {op:.2f} | {py - cpp:.2f} | {op - cpp:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
