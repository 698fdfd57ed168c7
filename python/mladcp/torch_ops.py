"""torch custom ops over the mladcp calls, registered with torch.library (with fake implementations, so
that torch.compile traces them and CUDA graphs capture them):

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

from . import _mladcp as _C

_registered = False


_to_dl = torch._C._to_dlpack  # the C-level DLPack export (Tensor.__dlpack__ adds Python checks)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _stream(t: torch.Tensor) -> int:
    if not t.is_cuda:
        return 0
    if _raw_stream is not None:
        return _raw_stream(t.get_device())
    return torch.cuda.current_stream(t.device).cuda_stream


def _dl(t: Optional[torch.Tensor]):
    return None if t is None else _to_dl(t)


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


def register() -> bool:
    """Registers the ops once per process; returns True when they are (torch >= 2.4)."""
    global _registered
    if _registered:
        return True
    if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        return False

    @torch.library.custom_op("mladcp::decode", mutates_args=())
    def decode(
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        softmax_scale: float,
        q_len: int,
        kv_scale: float,
        lse_base: str,
        backend: str,
        world: int,
        rank: int,
        interleave: int,
        split_policy: str,
        max_seq_len: int,
        out_dtype: str,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty(q.shape[:-1] + (512,), dtype=_out_dtype(out_dtype), device=q.device)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        _C._decode(_dl(q), _dl(kv_cache), _dl(block_table), _dl(seq_lens), _dl(out), _dl(lse), softmax_scale, q_len,
                   kv_scale, lse_base, backend, _shard(world, rank, interleave), split_policy, max_seq_len, _stream(q),
                   True)
        return out, lse

    @decode.register_fake
    def _(q, kv_cache, block_table, seq_lens, softmax_scale, q_len, kv_scale, lse_base, backend, world, rank,
          interleave, split_policy, max_seq_len, out_dtype):
        out = q.new_empty(q.shape[:-1] + (512,), dtype=_out_dtype(out_dtype))
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        return out, lse

    @torch.library.custom_op("mladcp::decode_out", mutates_args=("out", "lse"))
    def decode_out(
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        lse: Optional[torch.Tensor],
        softmax_scale: float,
        q_len: int,
        kv_scale: float,
        lse_base: str,
        backend: str,
        world: int,
        rank: int,
        interleave: int,
        split_policy: str,
        max_seq_len: int,
    ) -> None:
        _C._decode(_dl(q), _dl(kv_cache), _dl(block_table), _dl(seq_lens), _dl(out), _dl(lse), softmax_scale, q_len,
                   kv_scale, lse_base, backend, _shard(world, rank, interleave), split_policy, max_seq_len, _stream(q),
                   True)

    @decode_out.register_fake
    def _(q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend, world,
          rank, interleave, split_policy, max_seq_len):
        return None

    @torch.library.custom_op("mladcp::merge", mutates_args=())
    def merge(
        outs: torch.Tensor, lses: torch.Tensor, lse_base: str, out_lse_base: str, out_dtype: str
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        out = torch.empty(outs.shape[1:], dtype=_merge_dtype(outs, out_dtype), device=outs.device)
        lse = torch.empty(outs.shape[1:3], dtype=torch.float32, device=outs.device)
        _C._merge(_dl(outs), _dl(lses), _dl(out), _dl(lse), lse_base, out_lse_base or lse_base, _stream(outs))
        return out, lse

    @merge.register_fake
    def _(outs, lses, lse_base, out_lse_base, out_dtype):
        return (outs.new_empty(outs.shape[1:], dtype=_merge_dtype(outs, out_dtype)),
                outs.new_empty(outs.shape[1:3], dtype=torch.float32))

    _registered = True
    return True
