"""mladcp: MLA decode attention that returns its log-sum-exp (LSE), and decode context parallelism (DCP).

Core calls (DLPack tensors from numpy, torch or cupy, read in place):
  decode(q, kv_cache, block_table, seq_lens, *, softmax_scale, ...) -> (out, lse)
  merge(outs, lses, *, lse_base="e", ...) -> (out, lse)
  write_kv_cache(kv_c, k_pe, slot_mapping, kv_cache, *, kv_scale=1.0)
  compute_slot_mapping(seq_ids, positions, block_table, block_size, shard=None) -> slot_mapping
  backends() -> list of capability dicts;  Shard(world, rank, interleave)
Drop-in call shapes: flash_mla_with_kvcache / get_mla_metadata (FlashMLA) and
trtllm_batch_decode_with_kv_cache_mla (FlashInfer), in mladcp.compat.
DCP over an engine's group: DcpDecoder (torch.distributed NCCL group, or an mpi4py communicator).
With torch installed, importing mladcp registers torch.ops.mladcp.decode / decode_out / merge
(set MLADCP_NO_TORCH=1 to skip importing torch).
"""
from __future__ import annotations

import os as _os

# torch first when it is installed. The extension has no NCCL dependency: it loads its own NCCL on first
# use (a private copy, docs/python.md), after torch's, so torch's libraries bind to the NCCL they were built
# with (a library loaded earlier under the soname libnccl.so.2 would be taken for theirs).
_torch = None
if not _os.environ.get("MLADCP_NO_TORCH"):
    try:
        import torch as _torch  # noqa: F401
    except ImportError:
        _torch = None

from . import _mladcp  # noqa: E402
from ._frameworks import from_bf16_bits, to_bf16_bits
from .api import (
    Shard,
    backends,
    best_available_backend,
    compute_slot_mapping,
    decode,
    merge,
    write_kv_cache,
)
from .compat import flash_mla_with_kvcache, get_mla_metadata, trtllm_batch_decode_with_kv_cache_mla
from .dcp import DcpDecoder, nccl_library
from . import _frameworks as _fw

_fw.torch_module()  # with torch imported: registers its DLPack C exchange API for decode (no capsules)

__version__: str = _mladcp.__version__
cuda_built: bool = _mladcp.cuda_built
num_virtual_blocks = _mladcp.num_virtual_blocks

__all__ = [
    "DcpDecoder",
    "Shard",
    "backends",
    "best_available_backend",
    "compute_slot_mapping",
    "cuda_built",
    "decode",
    "flash_mla_with_kvcache",
    "from_bf16_bits",
    "get_mla_metadata",
    "merge",
    "nccl_library",
    "num_virtual_blocks",
    "to_bf16_bits",
    "torch_ops_registered",
    "trtllm_batch_decode_with_kv_cache_mla",
    "write_kv_cache",
]


def _register_torch_ops() -> bool:
    if _os.environ.get("MLADCP_NO_TORCH") or _torch is None:
        return False
    from . import torch_ops  # noqa: PLC0415

    return torch_ops.register()


torch_ops_registered: bool = _register_torch_ops()
