"""DcpDecoder: one decode context parallel (DCP) step per call, over an engine's process group.

Every rank of a group of W holds 1/W of each sequence's latent cache (global position p on rank
(p // interleave) % W, see Shard) and H/W of the query heads. decode() runs the whole step: all-gather of
the query over the group, decode of all H heads over the local shard with LSE, and the merge of the W
partial states (one all-to-all, or LSE all-gather + reduce-scatter), and writes this rank's H/W heads.

Communicators:
  * torch.distributed NCCL group (GPU ranks, one GPU per process): adopts the group's own NCCL
    communicator when torch exposes it (ProcessGroupNCCL._comm_ptr()), otherwise creates a new NCCL
    communicator whose unique id is broadcast over the group. Known defect (H200 machine, torch 2.11 with
    its bundled NCCL, mladcp built against the system NCCL 2.28): in a process that imported torch, the
    first NCCL call of the module crashed (segmentation fault), adopted or bootstrapped; see docs/python.md.
  * mpi4py communicator (CPU ranks; host tensors).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

from . import _frameworks as fw
from . import _mladcp as _C


class DcpDecoder:
    """DcpDecoder(group=None, *, mpi_comm=None, backend=None, merge="a2a", interleave=1, deadline_s=60.0,
    adopt_communicator=True, device=None)

    group: a torch.distributed process group with the NCCL backend (None: the default group);
    mpi_comm: an mpi4py communicator instead (host memory, backend "cpu" by default). merge: "a2a" or
    "ag-rs". A peer that stalls makes a step fail with RuntimeError (timeout) after deadline_s on every
    rank. Every rank must call decode with the same shapes.
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
            return
        self._impl, self.adopted = _torch_decoder(group, backend or "", merge, int(interleave), float(deadline_s),
                                                  adopt_communicator, device)

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
    if adopt:
        ptr = _torch_comm_ptr(torch, dist, group, dev)
        if ptr:
            return _C._DcpDecoder.from_nccl_comm(ptr, dev, stream, backend, merge, interleave, deadline_s), True
    rank = dist.get_rank(group)
    world = dist.get_world_size(group)
    src = dist.get_global_rank(group, 0) if hasattr(dist, "get_global_rank") else 0

    def broadcast(unique_id):
        box = [bytes(unique_id) if rank == 0 else None]
        dist.broadcast_object_list(box, src=src, group=group, device=torch.device("cuda", dev))
        return box[0]

    impl = _C._DcpDecoder.from_nccl_bootstrap(rank, world, broadcast, dev, stream, backend, merge, interleave,
                                              deadline_s)
    return impl, False


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
