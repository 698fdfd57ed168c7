"""torch custom ops over the mladcp calls, registered with torch.library (schema, an implementation for
every device, and fake implementations, so that torch.compile traces them and CUDA graphs capture them):

  torch.ops.mladcp.decode(q, kv_cache, block_table, seq_lens, softmax_scale, q_len, kv_scale, lse_base,
                          backend, world, rank, interleave, split_policy, max_seq_len, out_dtype)
      -> (out, lse)                                        functional: allocates out and lse
  torch.ops.mladcp.decode_out(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale,
                              lse_base, backend, world, rank, interleave, split_policy, max_seq_len) -> ()
      writes the caller's out (and lse unless None): no allocation, the form an engine captures
  torch.ops.mladcp.merge(outs, lses, lse_base, out_lse_base, out_dtype) -> (out, lse)

Shapes and semantics are those of mladcp.decode / mladcp.merge. backend "" picks by device; out_dtype
"bf16" or "fp32" ("" for merge: the dtype of outs when bf16 or fp32, else fp32).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _frameworks as _fw
from . import _mladcp as _C



_to_dl = torch._C._to_dlpack  # the C-level DLPack export (Tensor.__dlpack__ adds Python checks)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: torch.Tensor) -> int:
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


_fp8 = getattr(torch, "float8_e4m3fn", None)


def _dl(t: Optional[torch.Tensor]):
    if t is None:
        return None
    if t.dtype is _fp8:  # fp8 crosses as its uint8 bits (DLPack's fp8 codes are recent in torch)
        t = t.view(torch.uint8)
    return _to_dl(t)


_shards = {}


def _shard(world: int, rank: int, interleave: int):
    key = (world, rank, interleave)
    s = _shards.get(key)
    if s is None:
        s = _shards[key] = _C.Shard(world, rank, interleave)
    return s


def _out_dtype(name: str) -> torch.dtype:
    if name == "bf16":
        return torch.bfloat16
    if name == "fp32":
        return torch.float32
    raise ValueError(f"invalid_argument: out_dtype={name!r}: accepted 'bf16' or 'fp32'")


def _merge_dtype(outs: torch.Tensor, name: str) -> torch.dtype:
    if name:
        return _out_dtype(name)
    return outs.dtype if outs.dtype in (torch.bfloat16, torch.float32) else torch.float32


_lib = None  # the torch.library.Library holding the ops (kept alive for the process)

_SCHEMAS = {
    "decode": "decode(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, float softmax_scale, int q_len, "
              "float kv_scale, str lse_base, str backend, int world, int rank, int interleave, str split_policy, "
              "int max_seq_len, str out_dtype) -> (Tensor, Tensor)",
    "decode_out": "decode_out(Tensor q, Tensor kv_cache, Tensor block_table, Tensor seq_lens, Tensor(a!) out, "
                  "Tensor(b!)? lse, float softmax_scale, int q_len, float kv_scale, str lse_base, str backend, "
                  "int world, int rank, int interleave, str split_policy, int max_seq_len) -> ()",
    "merge": "merge(Tensor outs, Tensor lses, str lse_base, str out_lse_base, str out_dtype) -> (Tensor, Tensor)",
}


def _run(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend, shard,
         split_policy, max_seq_len):
    fast = _fw._decode_torch  # torch's DLPack C exchange API when registered (no capsules), else capsules
    if fast is None or not fast(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base,
                                backend, shard, split_policy, max_seq_len, None, True):
        _C._decode(_dl(q), _dl(kv_cache), _dl(block_table), _dl(seq_lens), _dl(out), _dl(lse), softmax_scale, q_len,
                   kv_scale, lse_base, backend, shard, split_policy, max_seq_len, _stream(q), True)


def _decode(q, kv_cache, block_table, seq_lens, softmax_scale, q_len, kv_scale, lse_base, backend, world, rank,
            interleave, split_policy, max_seq_len, out_dtype):
    out = torch.empty(q.shape[:-1] + (512,), dtype=_out_dtype(out_dtype), device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    _run(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend,
         _shard(world, rank, interleave), split_policy, max_seq_len)
    return out, lse


def _decode_fake(q, kv_cache, block_table, seq_lens, softmax_scale, q_len, kv_scale, lse_base, backend, world, rank,
                 interleave, split_policy, max_seq_len, out_dtype):
    return (q.new_empty(q.shape[:-1] + (512,), dtype=_out_dtype(out_dtype)),
            q.new_empty(q.shape[:-1], dtype=torch.float32))


def _decode_out(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend,
                world, rank, interleave, split_policy, max_seq_len):
    _run(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend,
         _shard(world, rank, interleave), split_policy, max_seq_len)


def _decode_out_fake(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend,
                     world, rank, interleave, split_policy, max_seq_len):
    return None


def _merge(outs, lses, lse_base, out_lse_base, out_dtype):
    out = torch.empty(outs.shape[1:], dtype=_merge_dtype(outs, out_dtype), device=outs.device)
    lse = torch.empty(outs.shape[1:3], dtype=torch.float32, device=outs.device)
    _C._merge(_dl(outs), _dl(lses), _dl(out), _dl(lse), lse_base, out_lse_base or lse_base, _stream(outs))
    return out, lse


def _merge_fake(outs, lses, lse_base, out_lse_base, out_dtype):
    return (outs.new_empty(outs.shape[1:], dtype=_merge_dtype(outs, out_dtype)),
            outs.new_empty(outs.shape[1:3], dtype=torch.float32))


def register() -> bool:
    """Registers the ops once per process (torch.library.Library: define, a CompositeExplicitAutograd
    implementation for every device, and a fake implementation); returns True when they are registered.
    The low-level registration costs a few microseconds per call where torch.library.custom_op costs tens."""
    global _lib
    if _lib is not None:
        return True
    if not hasattr(torch.library, "register_fake"):
        return False
    lib = torch.library.Library("mladcp", "DEF")
    for name, impl, fake in (("decode", _decode, _decode_fake), ("decode_out", _decode_out, _decode_out_fake),
                             ("merge", _merge, _merge_fake)):
        lib.define(_SCHEMAS[name])
        lib.impl(name, impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"mladcp::{name}", fake, lib=lib)
    _lib = lib
    return True
