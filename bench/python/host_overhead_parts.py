#!/usr/bin/env python3
"""Where the host time of a decode call from Python goes: micro-benchmarks of its parts (torch tensors).

Each line is the time per call of one loop (timeit, --number calls per sample, --rounds samples taken in
turn over all lines, median), on the host: on a GPU the enqueue, the device runs behind. With --batch 0
(the default) the call has no sequence, so Backend::decode does no work and `decode - cpp` is the host
time that Python adds (argument handling, the tensor crossing, the binding's checks and lookups);
--batch N --context L --heads H times a real call instead.

  cpp                       Backend::decode in a C++ loop (_time_cpp_decode: arguments parsed once)
  decode(out=, lse=)        mladcp.decode with caller buffers (the engine's call)
  decode(out=None, lse=True) the same, allocating out and lse
  _decode_torch(tensors)    the torch entry: tensors read through torch's DLPack C exchange API
  decode(...), capsule path mladcp.decode with the exchange path off (mladcp._frameworks.use_torch_exchange)
  _decode(6 capsules)       the binding's generic entry, each tensor as a torch._C._to_dlpack capsule
  6 x torch._C._to_dlpack   creating (and freeing) the six capsules alone
  op decode_out             torch.ops.mladcp.decode_out (the dispatcher's path)
Lines of the exchange path are left out where torch has no DLPack C exchange API (or mladcp predates it) and
under MLADCP_NO_DLPACK_C_API=1 (every line then takes the capsule path, as before the exchange path).

Usage: host_overhead_parts.py [--device cpu|cuda] [--batch 0] [--heads 16] [--context 64] [--number 2000]
       [--rounds 15] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import timeit

import mladcp
from mladcp import _frameworks as fw
from mladcp import _mladcp as _C


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--number", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import torch

    dev, B, H, L, bs = args.device, args.batch, args.heads, args.context, 64
    nb = max(1, (L + bs - 1) // bs)
    q = torch.randn(B, H, 576, device=dev).bfloat16()
    kv = torch.randn(max(1, B) * nb, bs, 576, device=dev).bfloat16()
    bt = torch.arange(B * nb, dtype=torch.int32, device=dev).view(B, nb)
    sl = torch.full((B,), L, dtype=torch.int32, device=dev)
    out = torch.empty(B, H, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(B, H, dtype=torch.float32, device=dev)
    scale = 1.0 / 192 ** 0.5
    stream = torch.cuda.current_stream().cuda_stream if dev == "cuda" else 0
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    shard = mladcp.Shard()
    td = torch._C._to_dlpack
    decode = mladcp.decode
    op = torch.ops.mladcp.decode_out

    # name: (call, whether the torch exchange path is on while it runs)
    lines = {
        "decode(out=, lse=)": (lambda: decode(q, kv, bt, sl, softmax_scale=scale, out=out, lse=lse), True),
        "decode(out=None, lse=True)": (lambda: decode(q, kv, bt, sl, softmax_scale=scale), True),
        "_decode_torch(tensors)": (lambda: _C._decode_torch(q, kv, bt, sl, out, lse, scale, 1, 1.0, "e", None, None,
                                                            None, 0, None, True), True),
        "decode(out=, lse=), capsule path": (lambda: decode(q, kv, bt, sl, softmax_scale=scale, out=out, lse=lse),
                                             False),
        "_decode(6 capsules)": (lambda: _C._decode(td(q), td(kv), td(bt), td(sl), td(out), td(lse), scale, 1, 1.0, "e",
                                                   "", shard, "", 0, stream, True), False),
        "6 x torch._C._to_dlpack": (lambda: (td(q), td(kv), td(bt), td(sl), td(out), td(lse)), False),
        "op decode_out": (lambda: op(q, kv, bt, sl, out, lse, scale, 1, 1.0, "e", "", 1, 0, 1, "", 0), True),
    }
    toggle = getattr(fw, "use_torch_exchange", None)  # absent before the exchange path: capsules only
    fw.torch_module()
    exchange = toggle is not None and not os.environ.get("MLADCP_NO_DLPACK_C_API") and toggle(True)
    if not exchange:
        lines = {k: (fn, False) for k, (fn, on) in lines.items() if "_decode_torch" not in k and "capsule path" not in k}
    decode(q, kv, bt, sl, softmax_scale=scale, out=out, lse=lse)  # backend, workspace
    samples = {k: [] for k in ["cpp"] + list(lines)}
    for _ in range(args.rounds):
        sync()
        samples["cpp"].append(_C._time_cpp_decode(q, kv, bt, sl, out, lse, scale, 1, "", stream, args.number) / 1e3)
        for name, (fn, on) in lines.items():
            if exchange:
                toggle(on)
            sync()
            samples[name].append(timeit.timeit(fn, number=args.number) / args.number * 1e6)
        if exchange:
            toggle(True)
    sync()
    med = {k: statistics.median(v) for k, v in samples.items()}
    print(f"device {dev}, mladcp {mladcp.__version__}, torch {torch.__version__}, q [{B}, {H}, 576], context {L}, "
          f"{args.rounds} rounds x {args.number} calls, median us per call, "
          f"torch tensors through {'the DLPack C exchange API' if exchange else 'capsules'}")
    print("| call | us | - cpp us |")
    print("|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v:.3f} | {v - med['cpp']:.3f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, batch=B, heads=H, context=L, us=med), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
