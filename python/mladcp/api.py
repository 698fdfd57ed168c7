"""The core calls: decode, merge, write_kv_cache, compute_slot_mapping, backends.

Shapes (B sequences, q_len query tokens each, T = B * q_len tokens, H heads):
  q            [T, H, 576] or [B, q_len, H, 576]   bf16  ([q_nope @ W_UK (512) | q_pe (64)])
  kv_cache     [num_blocks, block_size, 576] or [num_blocks, block_size, 1, 576]   bf16 or fp8-e4m3
  block_table  [B, max_blocks_per_seq] int32 (under DCP: virtual-block ids, see Shard)
  seq_lens     [B] int32, GLOBAL lengths including the q_len new tokens
  out          [T, H, 512] or [B, q_len, H, 512] (the layout of q)   bf16 or fp32
  lse          [T, H] or [B, q_len, H] fp32, ln (or log2) of the softmax denominator

Every tensor is read through DLPack without a copy (numpy, torch CPU/CUDA, cupy); strides are honoured
as long as the innermost dimension is contiguous, anything else raises ValueError. numpy has no bf16
or fp8 type: uint16 arrays are read as bf16 bits and uint8 arrays as fp8-e4m3 bits (ml_dtypes'
bfloat16 / float8_e4m3fn arrays are viewed that way). On CUDA the call is queued on the caller's current
stream (torch or cupy) or on `stream=`; it never synchronizes.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _frameworks as fw
from . import _mladcp as _C

Shard = _C.Shard
_DEFAULT_SHARD = _C.Shard()


def decode(
    q: Any,
    kv_cache: Any,
    block_table: Any,
    seq_lens: Any,
    *,
    softmax_scale: float,
    q_len: int = 1,
    kv_scale: Optional[float] = None,
    out: Any = None,
    lse: Union[bool, Any] = True,
    lse_base: str = "e",
    backend: Optional[str] = None,
    shard: Optional[Shard] = None,
    split_policy: Optional[str] = None,
    out_dtype: Optional[str] = None,
    max_seq_len: int = 0,
    stream: Any = None,
    check_block_ids: bool = True,
) -> Tuple[Any, Any]:
    """MLA decode attention over a paged latent cache, returning (out, lse).

    q [T, H, 576] or [B, q_len, H, 576] bf16; kv_cache [num_blocks, block_size, (1,) 576] bf16 or
    fp8-e4m3 (value = stored * kv_scale); block_table [B, max_blocks] int32; seq_lens [B] int32 (global
    lengths). Query token t of a sequence of length L sees keys [0, L - q_len + t] (causal rule, in
    global positions under DCP). s_j = softmax_scale * <q, c_j>.

    out: None (allocated like q, with `out_dtype` "bf16" or "fp32": bf16 for torch, fp32 for numpy
    and cupy) or a tensor [T, H, 512] / [B, q_len, H, 512] to write. lse: True (allocate [T, H] or
    [B, q_len, H] fp32), False (no LSE is computed; None is returned) or a tensor to write, in base
    `lse_base` ("e" or "2"). A row with no visible key gets out = 0 and lse = -inf.

    backend: "cpu", "cpu-reference" (host memory) or "cuda" (device memory); default by the device of q.
    shard: this rank's Shard under decode context parallelism (the cache holds only its positions).
    split_policy: "invariant" (default; bitwise batch invariant) or "fill" (device backends).
    max_seq_len: upper bound of seq_lens (0: the bound the block table can address on a device).

    Raises ValueError (bad shapes, dtypes, strides, devices, values), NotImplementedError (the backend
    cannot do it) or RuntimeError; nothing is written then.
    """
    if out is None or lse is True or lse is False:
        out, lse = _decode_outputs(q, out, lse, out_dtype)
    fast = fw._decode_torch
    if fast is not None and (stream is None or type(stream) is int) and fast(
        q, kv_cache, block_table, seq_lens, out, lse, softmax_scale, q_len, kv_scale, lse_base, backend, shard,
        split_policy, max_seq_len, stream, check_block_ids,
    ):
        # torch tensors, read through torch's DLPack C exchange API. False: not all torch tensors, or an
        # argument of another type (kv_scale other than None, float or int, ...): the paths below.
        return out, lse
    if fw._torch is None:
        fw.torch_module()
    if kv_scale is None:
        kv_scale = 1.0
    elif not isinstance(kv_scale, (float, int)):
        kv_scale = _host_float(kv_scale, "kv_scale")
    shard = shard if shard is not None else _DEFAULT_SHARD
    T = fw._TorchTensor
    if T is not None and type(q) is T and fw._torch_to_dlpack is not None:
        # torch fast path (the common engine call): C-level capsules, the raw current stream.
        td = fw._torch_to_dlpack
        if stream is None:
            s = fw._raw_stream(q.get_device()) if (q.is_cuda and fw._raw_stream is not None) else fw.current_stream(q)
        else:
            s = fw.stream_arg(stream, q)
        _C._decode(
            td(q), fw.to_dl(kv_cache), td(block_table) if type(block_table) is T else fw.to_dl(block_table),
            td(seq_lens) if type(seq_lens) is T else fw.to_dl(seq_lens), td(out) if type(out) is T else fw.to_dl(out),
            None if lse is None else (td(lse) if type(lse) is T else fw.to_dl(lse)), softmax_scale, q_len, kv_scale,
            lse_base, backend or "", shard, split_policy or "", max_seq_len, s, check_block_ids,
        )
        return out, lse
    dl = fw.to_dl_plain
    _C._decode(
        dl(q), fw.to_dl(kv_cache), dl(block_table), dl(seq_lens), dl(out), dl(lse), softmax_scale, q_len, kv_scale,
        lse_base, backend or "", shard, split_policy or "", max_seq_len, fw.stream_arg(stream, q), check_block_ids,
    )
    return out, lse


def _decode_outputs(q: Any, out: Any, lse: Any, out_dtype: Optional[str]) -> Tuple[Any, Any]:
    """decode's out (allocated like q when None) and lse (allocated when True, None when False)."""
    if fw._torch is None:
        fw.torch_module()
    if out is None:
        nd = getattr(q, "ndim", 0)
        if nd not in (3, 4):
            raise ValueError(f"invalid_argument: q: {nd} dimensions; expected [T, H, 576] or [B, q_len, H, 576]")
        dt = out_dtype or fw.default_out_dtype(q)
        if dt not in ("bf16", "fp32"):
            raise ValueError(f"invalid_argument: out_dtype={dt!r}: accepted 'bf16' or 'fp32'")
        out = fw.empty_like_framework(q, tuple(q.shape[:-1]) + (512,), dt)
    if lse is True:
        lse = fw.empty_like_framework(q, tuple(q.shape[:-1]), "fp32")
    elif lse is False:
        lse = None
    return out, lse


def merge(
    outs: Any,
    lses: Any,
    *,
    lse_base: str = "e",
    out: Any = None,
    out_lse: Union[bool, Any] = True,
    out_lse_base: Optional[str] = None,
    out_dtype: Optional[str] = None,
    stream: Any = None,
) -> Tuple[Any, Any]:
    """Merges N partial attention states by their LSE: out = sum_n w_n * outs[n], w_n = b^(lses[n] - lse).

    outs [N, T, H, D] (bf16, fp16 or fp32) and lses [N, T, H] fp32 in base `lse_base`; a sequence of N
    [T, H, D] / [T, H] tensors is stacked first (one copy). A state whose LSE is -inf, +inf or NaN is
    empty (weight exactly 0, whatever its output holds); all empty gives out = 0, lse = -inf.
    out: None (allocated [T, H, D], dtype `out_dtype`, default that of outs when bf16/fp32) or a tensor;
    out_lse: True (allocate [T, H] fp32), False, or a tensor, in base `out_lse_base` (default lse_base).
    Host tensors merge on the host, CUDA tensors on the device (on the current or given stream).
    """
    if isinstance(outs, (list, tuple)):
        outs = fw.stack(outs)
    if isinstance(lses, (list, tuple)):
        lses = fw.stack(lses)
    outs = fw.as_dlpack(outs)
    if out is None:
        if getattr(outs, "ndim", 0) != 4:
            raise ValueError("invalid_argument: outs: expected [N, T, H, D] (or a list of [T, H, D])")
        dt = out_dtype or _dtype_name(outs)
        if dt not in ("bf16", "fp32"):
            dt = "fp32"
        out = fw.empty_like_framework(outs, tuple(outs.shape[1:]), dt)
    if out_lse is True:
        out_lse = fw.empty_like_framework(outs, tuple(outs.shape[1:3]), "fp32")
    elif out_lse is False:
        out_lse = None
    to_dl = fw.to_dl
    _C._merge(to_dl(outs), to_dl(lses), to_dl(out), to_dl(out_lse), lse_base, out_lse_base or lse_base,
              fw.stream_arg(stream, outs))
    return out, out_lse


def write_kv_cache(
    kv_c: Any,
    k_pe: Any,
    slot_mapping: Any,
    kv_cache: Any,
    *,
    kv_scale: float = 1.0,
    stream: Any = None,
) -> None:
    """Stores N tokens' latent vectors in the paged cache: kv_cache[slot] = [kv_c | k_pe].

    kv_c [N, 512] and k_pe [N, 64] (bf16, fp16 or fp32; k_pe may be None when kv_c is [N, 576]);
    slot_mapping [N] int64 (block_id * block_size + offset, or -1 to skip: see compute_slot_mapping);
    kv_cache [num_blocks, block_size, (1,) 576] bf16 or fp8-e4m3 (stored = value / kv_scale, saturated).
    Host memory: every slot is checked first (ValueError, nothing written). CUDA: queued on the stream,
    no host read; a slot out of range is skipped like -1.
    """
    if k_pe is None:
        if getattr(kv_c, "shape", (0, 0))[-1] != 576:
            raise ValueError("invalid_argument: k_pe: None needs kv_c of shape [N, 576]")
        kv_c, k_pe = kv_c[:, :512], kv_c[:, 512:]
    to_dl = fw.to_dl
    _C._write_kv_cache(to_dl(kv_c), to_dl(k_pe), to_dl(slot_mapping), to_dl(kv_cache), float(kv_scale),
                       fw.stream_arg(stream, kv_c))


def compute_slot_mapping(
    seq_ids: Any,
    positions: Any,
    block_table: Any,
    block_size: int,
    shard: Optional[Shard] = None,
    num_blocks: int = 0,
) -> Any:
    """Cache slot of each new token on this rank, -1 where another rank of the DCP group owns it.

    seq_ids [N] int32 (row of block_table), positions [N] int64 (global position in the sequence),
    block_table [num_seqs, max_blocks] int32 of virtual-block ids (one id per block_size * world
    positions). Returns slot_mapping [N] int64. Host arrays go through the C++ host implementation
    (which checks every index: ValueError); torch CUDA tensors are computed with torch operations on
    the device (no check, no sync).
    """
    shard = shard if shard is not None else _DEFAULT_SHARD
    if fw.is_torch(seq_ids) and seq_ids.is_cuda:
        return _slot_mapping_torch(seq_ids, positions, block_table, block_size, shard)
    n = int(seq_ids.shape[0])
    if fw.is_torch(seq_ids):
        out = fw.torch_module().empty((n,), dtype=fw.torch_module().int64)
    else:
        out = np.empty((n,), dtype=np.int64)
    _C._compute_slot_mapping(seq_ids, positions, block_table, int(block_size), int(num_blocks), shard, out)
    return out


def _slot_mapping_torch(seq_ids, positions, block_table, block_size, shard):
    torch = fw.torch_module()
    w, r, i = shard.world, shard.rank, shard.interleave
    p = positions.to(torch.int64)
    vbs = block_size * w
    owner = torch.div(p, i, rounding_mode="floor") % w
    block = block_table[seq_ids.long(), torch.div(p, vbs, rounding_mode="floor")].to(torch.int64)
    vbo = p % vbs
    offset = torch.div(vbo, w * i, rounding_mode="floor") * i + vbo % i
    return torch.where(owner == r, block * block_size + offset, torch.full_like(p, -1))


def backends() -> List[dict]:
    """The capability table: one dict per built-in backend (name, device, built, available,
    can_return_lse_for_decode, native_lse_base, lse_base_selectable, q/kv/out dtypes, block sizes,
    head and q_len ranges, supports_dcp_interleave, cuda_graph_safe, deterministic)."""
    return _C._backends()


def best_available_backend() -> str:
    """"cuda" when this build has CUDA and a device is visible, else "cpu"."""
    return _C._best_available_backend()


def _dtype_name(x: Any) -> str:
    s = str(getattr(x, "dtype", ""))
    if "bfloat16" in s or s == "uint16":
        return "bf16"
    if "float32" in s:
        return "fp32"
    return s


def _host_float(x: Any, name: str) -> float:
    if getattr(x, "is_cuda", False):
        raise ValueError(
            f"invalid_argument: {name}: a CUDA tensor would need a device-to-host sync; pass a Python float"
        )
    return float(x)

