#!/usr/bin/env python3
"""One layer's DCP decode step from Python, as an engine calls it, checked against one rank's decode of the
whole cache.

CPU ranks over MPI (mpi4py):
    mpirun -np 4 --allow-run-as-root --oversubscribe python3 examples/python/dcp_decode.py
GPU ranks over NCCL (torch.distributed, one GPU per process):
    torchrun --nproc-per-node 2 examples/python/dcp_decode.py

Every rank makes the same sequences (same seed), writes the positions it owns into its own paged cache
(compute_slot_mapping + write_kv_cache: 1/W of every sequence), and holds H/W query heads. DcpDecoder.decode
then runs the step: all-gather of q, decode of all H heads over the local shard with LSE, merge of the W
partial states. Each rank compares its H/W output heads with mladcp.decode of the unsharded cache.
"""
import argparse
import os
import sys

import numpy as np

import mladcp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=16, help="H, all query heads (H/W per rank)")
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--context", type=int, default=500, help="length of the longest sequence")
    ap.add_argument("--q-len", type=int, default=1)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--interleave", type=int, default=1)
    ap.add_argument("--merge", default="a2a", choices=["a2a", "ag-rs"])
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    gpu = "LOCAL_RANK" in os.environ and "OMPI_COMM_WORLD_RANK" not in os.environ
    if gpu:
        import torch
        import torch.distributed as dist

        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        decoder = mladcp.DcpDecoder(interleave=args.interleave, merge=args.merge)
        nccl = mladcp.nccl_library()
        print(f"rank {decoder.rank}: NCCL {nccl['version']} ({nccl['path']}) beside torch's "
              f"{'.'.join(map(str, torch.cuda.nccl.version()))}: {decoder.adoption}", flush=True)
        to_dev = lambda a: torch.from_numpy(a).cuda()  # noqa: E731
        bf16 = lambda a: torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()  # noqa: E731
        host = lambda t: t.float().cpu().numpy()  # noqa: E731
    else:
        from mpi4py import MPI

        decoder = mladcp.DcpDecoder(mpi_comm=MPI.COMM_WORLD, interleave=args.interleave, merge=args.merge)
        to_dev = bf16 = lambda a: a  # noqa: E731
        host = lambda a: a  # noqa: E731
    W, r = decoder.world, decoder.rank
    H, B, bs, ql = args.heads, args.batch, args.block_size, args.q_len
    if H % W:
        print(f"--heads {H} must be a multiple of the world size {W}", file=sys.stderr)
        return 2

    # The same global data on every rank.
    rng = np.random.default_rng(args.seed)
    lens = np.array([args.context] + list(rng.integers(ql, args.context + 1, B - 1)), np.int32)
    lens[-1] = min(lens[-1], W * args.interleave - 1) if B > 2 else lens[-1]  # a short sequence: some empty shards
    lens = np.maximum(lens, ql).astype(np.int32)
    tokens = mladcp.to_bf16_bits(rng.standard_normal((int(lens.sum()), 576)).astype(np.float32))
    seq_ids = np.repeat(np.arange(B, dtype=np.int32), lens)
    positions = np.concatenate([np.arange(n, dtype=np.int64) for n in lens])
    q_all = mladcp.to_bf16_bits(rng.standard_normal((B * ql, H, 576)).astype(np.float32))
    scale = 1.0 / np.sqrt(192.0)

    # This rank's cache: virtual blocks of bs * W positions, one id per block, bs tokens of each on every rank.
    nvb = max(mladcp.num_virtual_blocks(int(n), bs, W) for n in lens)
    block_table = (np.arange(B * nvb, dtype=np.int32).reshape(B, nvb) * 7 % (B * nvb)).astype(np.int32)
    cache = np.full((B * nvb, bs, 576), 0x7FC0, np.uint16)  # NaN where this rank holds nothing
    slots = mladcp.compute_slot_mapping(seq_ids, positions, block_table, bs, decoder.shard, num_blocks=B * nvb)
    mladcp.write_kv_cache(tokens, None, slots, cache)
    print(f"rank {r}/{W}: {int((slots >= 0).sum())} of {len(slots)} tokens in this rank's cache", flush=True)

    # The step, on this rank's H/W heads.
    hl = H // W
    q_local = np.ascontiguousarray(q_all[:, r * hl:(r + 1) * hl])
    out, lse = decoder.decode(bf16(q_local), bf16(cache), to_dev(block_table), to_dev(lens), softmax_scale=scale,
                              q_len=ql, out_dtype="fp32", lse=True)

    # Reference: one rank's decode of the whole (unsharded) cache.
    full_bt = np.zeros((B, (int(lens.max()) + bs - 1) // bs), np.int32)
    full_cache = np.zeros((B * full_bt.shape[1], bs, 576), np.uint16)
    for b in range(B):
        full_bt[b] = np.arange(b * full_bt.shape[1], (b + 1) * full_bt.shape[1])
    full_slots = mladcp.compute_slot_mapping(seq_ids, positions, full_bt, bs)
    mladcp.write_kv_cache(tokens, None, full_slots, full_cache)
    ref_out, ref_lse = mladcp.decode(bf16(q_all), bf16(full_cache), to_dev(full_bt), to_dev(lens),
                                     softmax_scale=scale, q_len=ql, out_dtype="fp32")
    ref_out, ref_lse = host(ref_out)[:, r * hl:(r + 1) * hl], host(ref_lse)[:, r * hl:(r + 1) * hl]
    err = float(np.abs(host(out) - ref_out).max())
    lse_err = float(np.abs(host(lse) - ref_lse).max())
    ok = err < 2e-3 and lse_err < 1e-3
    print(f"rank {r}: heads {r * hl}..{(r + 1) * hl - 1}, {decoder.communicator}/{decoder.backend}, "
          f"max |out - ref| {err:.2e}, max |lse - ref| {lse_err:.2e}: {'PASS' if ok else 'FAIL'}", flush=True)
    if gpu:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
