"""DcpDecoder: one decode context parallel (DCP) step per call, over an engine's process group.

Every rank of a group of W holds 1/W of each sequence's latent cache (global position p on rank
(p // interleave) % W, see Shard) and H/W of the query heads. decode() runs the whole step: all-gather of
the query over the group, decode of all H heads over the local shard with LSE, and the merge of the W
partial states (one all-to-all, or LSE all-gather + reduce-scatter), and writes this rank's H/W heads.

Communicators:
  * torch.distributed NCCL group (GPU ranks, one GPU per process). The module calls its own NCCL, loaded on
    first use as a private copy (docs/python.md, "NCCL next to torch"), so by default it creates a new NCCL
    communicator whose unique id is broadcast over the group. It adopts the group's own communicator
    (ProcessGroupNCCL._comm_ptr()) only when torch's NCCL is the very library instance the module calls
    (see _choose_adoption); `DcpDecoder.adoption` says what was chosen and why.
  * mpi4py communicator (CPU ranks; host tensors).
"""
from __future__ import annotations

import os
from typing import Any, Optional, Tuple, Union

from . import _frameworks as fw
from . import _mladcp as _C


class DcpDecoder:
    """DcpDecoder(group=None, *, mpi_comm=None, backend=None, merge="a2a", interleave=1, deadline_s=60.0,
    adopt_communicator=True, device=None)

    group: a torch.distributed process group with the NCCL backend (None: the default group);
    mpi_comm: an mpi4py communicator instead (host memory, backend "cpu" by default). merge: "a2a" or
    "ag-rs". A peer that stalls makes a step fail with RuntimeError (timeout) after deadline_s on every
    rank. Every rank must call decode with the same shapes. adopt_communicator: use the torch group's own
    NCCL communicator where the rule of _choose_adoption allows it (else a new one is created); the
    attributes `adopted` and `adoption` say what was chosen and why.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        mpi_comm: Any = None,
        backend: Optional[str] = None,
        merge: str = "a2a",
        interleave: int = 1,
        deadline_s: float = 60.0,
        adopt_communicator: bool = True,
        device: Optional[int] = None,
        agree_on_validation: bool = True,
    ) -> None:
        if mpi_comm is not None:
            if group is not None:
                raise ValueError("invalid_argument: pass either group (torch.distributed) or mpi_comm (mpi4py)")
            from mpi4py import MPI  # noqa: PLC0415

            if not isinstance(mpi_comm, MPI.Comm):
                raise ValueError(f"invalid_argument: mpi_comm: expected an mpi4py MPI.Comm, got {type(mpi_comm)}")
            self._impl = _C._DcpDecoder.from_mpi(MPI._handleof(mpi_comm), backend or "", merge, int(interleave),
                                                 float(deadline_s), bool(agree_on_validation))
            self.adopted = False
            self.adoption = "mpi4py communicator"
            return
        self._impl, self.adopted, self.adoption = _torch_decoder(group, backend or "", merge, int(interleave),
                                                                 float(deadline_s), adopt_communicator, device)

    @property
    def world(self) -> int:
        return self._impl.world

    @property
    def rank(self) -> int:
        return self._impl.rank

    @property
    def shard(self) -> Any:
        """This rank's Shard(world, rank, interleave)."""
        return self._impl.shard

    @property
    def communicator(self) -> str:
        """"mpi" or "nccl"."""
        return self._impl.communicator

    @property
    def backend(self) -> str:
        return self._impl.backend

    def decode(
        self,
        q: Any,
        kv_cache: Any,
        block_table: Any,
        seq_lens: Any,
        *,
        softmax_scale: float,
        q_len: int = 1,
        kv_scale: Optional[float] = None,
        out: Any = None,
        lse: Union[bool, Any] = False,
        lse_base: str = "e",
        out_dtype: Optional[str] = None,
        max_seq_len: int = 0,
        stream: Any = None,
        check_block_ids: bool = True,
    ) -> Tuple[Any, Any]:
        """One DCP step for this rank. q [T, H/W, 576] bf16 (this rank's heads); kv_cache, block_table (virtual
        blocks) and seq_lens (GLOBAL lengths, the same on every rank) as in mladcp.decode. Returns
        (out [T, H/W, 512], lse [T, H/W] or None); lse=True or a tensor returns the merged LSE."""
        if out is None:
            dt = out_dtype or fw.default_out_dtype(q)
            out = fw.empty_like_framework(q, tuple(q.shape[:-1]) + (512,), dt)
        if lse is True:
            lse = fw.empty_like_framework(q, tuple(q.shape[:-1]), "fp32")
        elif lse is False:
            lse = None
        to_dl = fw.to_dl
        self._impl.decode(to_dl(q), to_dl(kv_cache), to_dl(block_table), to_dl(seq_lens), to_dl(out), to_dl(lse),
                          float(softmax_scale), int(q_len), float(kv_scale if kv_scale is not None else 1.0),
                          lse_base, int(max_seq_len), fw.stream_arg(stream, q), bool(check_block_ids))
        return out, lse

    def abort(self, reason: str = "aborted by the caller") -> None:
        """Tears the communicator down (an adopted one is left to its owner); later steps raise."""
        self._impl.abort(reason)


def nccl_library() -> dict:
    """The NCCL the module's communicator calls: {"loaded", "error", "path", "version", "private_copy"}.
    The module loads it on the first call of this function or of a DcpDecoder over a torch group (a private
    copy, see docs/python.md), so call it after torch has loaded its own NCCL (import torch first)."""
    return dict(_C._nccl_library())


def _torch_decoder(group, backend, merge, interleave, deadline_s, adopt, device):
    torch = fw.torch_module()
    if torch is None:
        import torch  # noqa: PLC0415
    import torch.distributed as dist  # noqa: PLC0415

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("invalid_argument: group: torch.distributed is not initialized (init_process_group first), "
                         "or pass mpi_comm= for CPU ranks")
    group = group if group is not None else dist.group.WORLD
    pg_backend = str(dist.get_backend(group)).lower()
    if "nccl" not in pg_backend:
        raise ValueError(f"invalid_argument: group: backend {pg_backend!r}; DcpDecoder over torch.distributed needs "
                         "an NCCL group (GPU tensors); use mpi_comm= (mpi4py) for CPU ranks")
    if not _C._nccl_available():
        raise NotImplementedError("unsupported: this build of mladcp has no NCCL communicator")
    dev = torch.cuda.current_device() if device is None else int(device)
    stream = torch.cuda.current_stream(dev).cuda_stream
    nccl = nccl_library()  # loads the module's NCCL (after torch's, which the group already loaded)
    if not nccl["loaded"]:
        raise RuntimeError(f"unavailable: {nccl['error']}")
    owner = _torch_nccl_owner(torch)
    shared = bool(owner) and _C._nccl_library_shared_with(owner)
    ptr = _torch_comm_ptr(torch, dist, group, dev) if adopt and shared else 0
    adopted, reason = _choose_adoption(adopt, shared, ptr)
    if adopted:
        impl = _C._DcpDecoder.from_nccl_comm(ptr, owner, dev, stream, backend, merge, interleave, deadline_s)
        return impl, True, reason
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    src = dist.get_global_rank(group, 0) if hasattr(dist, "get_global_rank") else 0

    def broadcast(unique_id):
        box = [bytes(unique_id) if rank == 0 else None]
        dist.broadcast_object_list(box, src=src, group=group, device=torch.device("cuda", dev))
        return box[0]

    impl = _C._DcpDecoder.from_nccl_bootstrap(rank, world, broadcast, dev, stream, backend, merge, interleave,
                                              deadline_s)
    return impl, False, reason


def _choose_adoption(requested: bool, shared: bool, comm_ptr: int) -> Tuple[bool, str]:
    """The rule for a torch NCCL group: (adopt, reason). An ncclComm_t is valid only in the NCCL library
    instance that created it, so torch's communicator is adopted only when adoption is requested, torch's
    NCCL is the very library instance this module calls (`shared`: mladcp._mladcp._nccl_library_shared_with
    on torch's libtorch_cuda.so), and torch exposes the communicator (`comm_ptr` != 0). Otherwise the
    module creates its own communicator, its unique id broadcast over the group."""
    if not requested:
        return False, "own communicator: adoption not requested"
    if not shared:
        return False, ("own communicator: torch's NCCL is another library than the module's "
                       "(set MLADCP_NCCL_LIBRARY to torch's libnccl.so.2 to share it)")
    if not comm_ptr:
        return False, "own communicator: torch does not expose its communicator (ProcessGroupNCCL._comm_ptr)"
    return True, "adopted torch's communicator: torch and the module call the same NCCL"


def _torch_nccl_owner(torch) -> str:
    """The file of torch's library that calls NCCL (libtorch_cuda.so), or "" when there is none."""
    path = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib", "libtorch_cuda.so")
    return os.path.realpath(path) if os.path.exists(path) else ""


def _torch_comm_ptr(torch, dist, group, dev) -> int:
    """The ncclComm_t of a ProcessGroupNCCL as int, or 0 when torch does not expose it."""
    try:
        pg = group._get_backend(torch.device("cuda", dev))
        # The communicator is created lazily by the first collective on the device.
        warm = torch.zeros(1, device=torch.device("cuda", dev))
        dist.all_reduce(warm, group=group)
        torch.cuda.synchronize(dev)
        return int(pg._comm_ptr())
    except (AttributeError, RuntimeError, TypeError):
        return 0
