"""Drop-in call shapes for engines that call FlashMLA or FlashInfer's MLA decode.

flash_mla_with_kvcache / get_mla_metadata (FlashMLA's dense decode):
  * get_mla_metadata(*args, **kwargs) returns (MlaSchedMeta(), None); mladcp plans inside the call, so the
    metadata is accepted and ignored (both the old tensor pair and the newer object are accepted too).
  * LSE: natural log, returned as [B, h_q, s_q] like FlashMLA. A row with no visible key: FlashMLA's
    convention, lse = +inf (mladcp.decode writes -inf), out = 0.
  * causal must be True when s_q > 1 (mladcp always applies the causal rule); sparse attention, attention
    sinks and extra caches are not supported (NotImplementedError).

trtllm_batch_decode_with_kv_cache_mla (FlashInfer, the call of vLLM's FLASHINFER_MLA backend):
  * scales: logits = <q, k> * bmm1_scale and out = softmax @ v * bmm2_scale, with one per-tensor cache scale;
    bf16 cache: softmax_scale = bmm1_scale (and out *= bmm2_scale when it is not 1); fp8 cache:
    kv_scale = bmm2_scale, softmax_scale = bmm1_scale / bmm2_scale (k_scale == v_scale, o_scale 1). Scales
    must be Python floats (a CUDA tensor would need a sync).
  * LSE base: FlashInfer's trtllm-gen kernels (backend "auto", "trtllm-gen") return log2; its CuTeDSL kernel
    (backend "cute-dsl", and every DCP call) returns ln. The call follows the backend named, as FlashInfer
    does; lse_base= overrides.
  * Empty rows: out = 0 and lse = -inf (FlashInfer writes the same LSE but leaves out unwritten).
  * DCP (enable_dcp=True, cp_world, cp_rank, causal_seqlens_kv_global): seq_lens are rank-local there and
    are not read; mladcp takes the global lengths (causal_seqlens_kv_global) and the shard
    Shard(cp_world, cp_rank, interleave 1) and derives the local lengths and the causal rule itself.
    return_lse=True is required, as in FlashInfer.
  * workspace_buffer is accepted and not used (mladcp keeps its own workspace per device); so are enable_pdl,
    is_var_seq, max_q_len and cute_dsl_impl, and skip_softmax_threshold_scale_factor (mladcp computes the
    exact softmax).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

from . import _frameworks as fw
from .api import Shard, decode


class MlaSchedMeta:
    """What get_mla_metadata returns: nothing to carry, mladcp plans inside each call."""

    have_initialized: bool = False

    def __repr__(self) -> str:
        return "MlaSchedMeta()"


def get_mla_metadata(*args: Any, **kwargs: Any) -> Tuple[MlaSchedMeta, None]:
    """FlashMLA-shaped: returns (MlaSchedMeta(), None); flash_mla_with_kvcache needs no precomputed schedule."""
    return MlaSchedMeta(), None


def flash_mla_with_kvcache(
    q: Any,
    k_cache: Any,
    block_table: Any,
    cache_seqlens: Any,
    head_dim_v: int,
    tile_scheduler_metadata: Any = None,
    num_splits: Any = None,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: Any = None,
    attn_sink: Any = None,
    extra_k_cache: Any = None,
    extra_indices_in_kvcache: Any = None,
    topk_length: Any = None,
    extra_topk_length: Any = None,
    *,
    kv_scale: float = 1.0,
    max_seq_len: int = 0,
    backend: Optional[str] = None,
    stream: Any = None,
) -> Tuple[Any, Any]:
    """FlashMLA-shaped dense decode: q [B, s_q, h_q, 576] bf16, k_cache [num_blocks, page_block_size, 1, 576]
    (or without the head dimension), block_table [B, max_blocks] int32, cache_seqlens [B] int32.
    Returns (out [B, s_q, h_q, 512] bf16, softmax_lse [B, h_q, s_q] fp32, natural log, +inf for empty rows).
    mladcp extensions: an fp8-e4m3 cache takes its per-tensor scale in kv_scale=; max_seq_len= bounds
    cache_seqlens (on a device the default is what the block table can address, which sizes the split-KV
    grid and workspace for that length)."""
    if head_dim_v != 512:
        raise ValueError(f"invalid_argument: head_dim_v={head_dim_v}: must be 512")
    for name, v in (("indices", indices), ("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                    ("extra_indices_in_kvcache", extra_indices_in_kvcache), ("topk_length", topk_length),
                    ("extra_topk_length", extra_topk_length)):
        if v is not None:
            raise NotImplementedError(f"unsupported: {name}: sparse attention, sinks and extra caches are not "
                                      "implemented by mladcp (dense decode only)")
    if getattr(q, "ndim", 0) != 4:
        raise ValueError("invalid_argument: q: expected [batch, seq_len_q, num_heads_q, 576]")
    s_q = int(q.shape[1])
    if s_q > 1 and not causal:
        raise ValueError(f"invalid_argument: causal=False with seq_len_q={s_q}: mladcp always applies the causal "
                         "rule (token t sees keys [0, len - s_q + t]); pass causal=True")
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** (-0.5)
    out, lse = decode(q, k_cache, block_table, cache_seqlens, softmax_scale=softmax_scale, q_len=s_q,
                      kv_scale=kv_scale, out_dtype="bf16", backend=backend, max_seq_len=max_seq_len,
                      stream=stream)
    # FlashMLA's empty row has lse = +inf; its LSE is [B, h_q, s_q].
    if fw.is_torch(lse):
        lse.masked_fill_(lse == -math.inf, math.inf)
        lse = lse.transpose(1, 2)
        if s_q > 1:
            lse = lse.contiguous()
    else:
        lse[lse == -math.inf] = math.inf
        lse = lse.transpose(0, 2, 1).copy() if s_q > 1 else lse.transpose(0, 2, 1)
    return out, lse


def trtllm_batch_decode_with_kv_cache_mla(
    query: Any,
    kv_cache: Any,
    workspace_buffer: Any,
    qk_nope_head_dim: int,
    kv_lora_rank: int,
    qk_rope_head_dim: int,
    block_tables: Any,
    seq_lens: Any,
    max_seq_len: int,
    sparse_mla_top_k: int = 0,
    out: Any = None,
    bmm1_scale: float = 1.0,
    bmm2_scale: float = 1.0,
    sinks: Any = None,
    skip_softmax_threshold_scale_factor: Any = None,
    enable_pdl: Any = None,
    backend: str = "auto",
    is_var_seq: bool = True,
    uses_shared_paged_kv_idx: bool = True,
    lse: Any = None,
    return_lse: bool = False,
    cute_dsl_impl: str = "auto",
    cum_seq_lens_q: Any = None,
    max_q_len: Optional[int] = None,
    enable_dcp: bool = False,
    cp_world: int = 1,
    cp_rank: int = 0,
    causal_seqlens_kv_global: Any = None,
    *,
    lse_base: Optional[str] = None,
    stream: Any = None,
) -> Any:
    """FlashInfer-shaped MLA decode: query [B, q_len, H, 576] bf16, kv_cache [num_pages, page_size, 576] or
    [num_pages, 1, page_size, 576] (bf16 or fp8-e4m3), block_tables [B, max_pages] int32, seq_lens [B]
    int32. Returns out [B, q_len, H, 512] bf16, or (out, lse) with return_lse=True; lse is [B * q_len, H]
    fp32 unless the caller passes lse ([B * q_len, H] or [B, q_len, H]). See the module docstring for the
    scales, the LSE base and DCP."""
    if kv_lora_rank != 512 or qk_rope_head_dim != 64:
        raise ValueError(f"invalid_argument: kv_lora_rank={kv_lora_rank}, qk_rope_head_dim={qk_rope_head_dim}: "
                         "mladcp implements MLA with 512 + 64")
    if sparse_mla_top_k:
        raise NotImplementedError("unsupported: sparse_mla_top_k: sparse MLA is not implemented by mladcp")
    if sinks is not None:
        raise NotImplementedError("unsupported: sinks: attention sinks are not implemented by mladcp")
    if not uses_shared_paged_kv_idx:
        raise NotImplementedError("unsupported: uses_shared_paged_kv_idx=False: MLA has one latent cache; separate "
                                  "K and V page indices are not implemented")
    if cum_seq_lens_q is not None:
        raise NotImplementedError("unsupported: cum_seq_lens_q: variable q_len per request is not implemented")
    if getattr(query, "ndim", 0) != 4:
        raise ValueError("invalid_argument: query: expected [batch, q_len, num_heads, 576]")
    q_len = int(query.shape[1])
    if getattr(kv_cache, "ndim", 0) == 4 and int(kv_cache.shape[1]) == 1 and int(kv_cache.shape[2]) != 1:
        kv_cache = kv_cache[:, 0]  # [num_pages, 1, page_size, 576] -> [num_pages, page_size, 576], a view
    b1 = _host_scale(bmm1_scale, "bmm1_scale")
    b2 = _host_scale(bmm2_scale, "bmm2_scale")
    fp8 = "float8" in str(getattr(kv_cache, "dtype", "")) or str(getattr(kv_cache, "dtype", "")) == "uint8"
    if fp8:
        kv_scale, softmax_scale, post_scale = b2, b1 / b2, 1.0
    else:
        kv_scale, softmax_scale, post_scale = 1.0, b1, b2
    shard = None
    global_lens = seq_lens
    max_len = int(max_seq_len) if max_seq_len else 0
    if enable_dcp:
        if not return_lse:
            raise ValueError("invalid_argument: enable_dcp=True requires return_lse=True (a DCP rank returns a "
                             "partial state: output and LSE)")
        if causal_seqlens_kv_global is None:
            raise ValueError("invalid_argument: enable_dcp=True requires causal_seqlens_kv_global (global lengths)")
        shard = Shard(int(cp_world), int(cp_rank), 1)
        global_lens = causal_seqlens_kv_global
        # max_seq_len is rank-local under DCP: a global length G has ceil(G / W) <= local + 1 positions on
        # rank 0, so G <= W * (max_seq_len + 1), capped by what the block table addresses.
        capacity = int(block_tables.shape[1]) * int(kv_cache.shape[1]) * int(cp_world)
        max_len = min(int(cp_world) * (int(max_seq_len) + 1), capacity) if max_seq_len else 0
    elif cp_world != 1 or cp_rank != 0 or causal_seqlens_kv_global is not None:
        raise ValueError("invalid_argument: cp_world, cp_rank and causal_seqlens_kv_global need enable_dcp=True")
    if lse_base is None:
        lse_base = "e" if (enable_dcp or backend == "cute-dsl") else "2"
    lse_arg: Any = False
    if return_lse:
        lse_arg = lse if lse is not None else fw.empty_like_framework(
            query, (int(query.shape[0]) * q_len, int(query.shape[2])), "fp32")
    o, l = decode(query, kv_cache, block_tables, global_lens, softmax_scale=softmax_scale, q_len=q_len,
                  kv_scale=kv_scale, out=out, lse=lse_arg, lse_base=lse_base, out_dtype="bf16", shard=shard,
                  max_seq_len=max_len, stream=stream)
    if post_scale != 1.0:
        if not fw.is_torch(o):
            raise NotImplementedError("unsupported: bmm2_scale != 1 with a bf16 cache needs torch tensors")
        o.mul_(post_scale)
    return (o, l) if return_lse else o


def _host_scale(x: Any, name: str) -> float:
    if isinstance(x, (int, float)):
        return float(x)
    if getattr(x, "is_cuda", False):
        raise ValueError(f"invalid_argument: {name}: a CUDA tensor would need a device-to-host sync; pass a float")
    return float(x)
