"""
mladcp C++ core: MLA decode with LSE, merges, KV-cache writes, DCP (see the mladcp package)
"""

from collections.abc import Callable
from typing import Annotated

from numpy.typing import NDArray


__version__: str

cuda_built: bool

QK_DIM: int = 576

LATENT_DIM: int = 512

ROPE_DIM: int = 64

MAX_Q_LEN: int = 16

class Shard:
    """
    One rank's place in a DCP group: global position p lives on rank (p // interleave) % world.
    """

    def __init__(self, world: int = 1, rank: int = 0, interleave: int = 1) -> None: ...

    @property
    def world(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def interleave(self) -> int: ...

    def owner(self, position: int) -> int:
        """Rank that holds global position `position`."""

    def local_len(self, global_len: int) -> int:
        """
        Tokens of this rank among the first `global_len` global positions (may be 0).
        """

    def local_to_global(self, local_index: int) -> int:
        """Global position of this rank's local token `local_index`."""

    def global_to_local(self, position: int) -> int:
        """Local index of global position `position` on its owner rank."""

    def visible_keys(self, global_len: int, q_len: int, t: int) -> int:
        """
        Keys on this rank visible to query token t of a sequence of global length global_len (causal rule).
        """

    def num_local_blocks(self, global_len: int, block_size: int) -> int: ...

    def validate(self, block_size: int) -> None:
        """
        Raises ValueError unless block_size >= 1 and block_size % interleave == 0.
        """

    def __eq__(self, arg: Shard, /) -> bool: ...

    def __hash__(self) -> int: ...

    def __repr__(self) -> str: ...

def num_virtual_blocks(global_len: int, block_size: int, world: int) -> int: ...

def _decode(q: Annotated[NDArray, dict(writable=False)], kv_cache: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], seq_lens: Annotated[NDArray, dict(writable=False)], out: NDArray, lse: NDArray | None, softmax_scale: float, q_len: int, kv_scale: float, lse_base: str, backend: str, shard: Shard, split_policy: str, max_seq_len: int, stream: int, check_block_ids: bool) -> None: ...

def _decode_torch(q: object | None, kv_cache: object | None, block_table: object | None, seq_lens: object | None, out: object | None, lse: object | None, softmax_scale: object | None, q_len: object | None, kv_scale: object | None, lse_base: object | None, backend: object | None, shard: object | None, split_policy: object | None, max_seq_len: object | None, stream: object | None, check_block_ids: object | None) -> bool:
    """
    decode() for torch tensors through torch's DLPack C exchange API; False (nothing done) when an argument is not what it takes
    """

def _set_torch_exchange(tensor_type: object | None, api: object | None) -> bool:
    """
    Registers torch.Tensor's __dlpack_c_exchange_api__ for _decode_torch; False when unusable
    """

def _torch_exchange_ready() -> bool: ...

def _time_cpp_decode(q: Annotated[NDArray, dict(writable=False)], kv_cache: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], seq_lens: Annotated[NDArray, dict(writable=False)], out: NDArray, lse: NDArray | None, softmax_scale: float, q_len: int, backend: str, stream: int, iters: int) -> float: ...

def _merge(outs: Annotated[NDArray, dict(writable=False)], lses: Annotated[NDArray, dict(writable=False)], out: NDArray, out_lse: NDArray | None, lse_base: str, out_lse_base: str, stream: int) -> None: ...

def _write_kv_cache(kv_c: Annotated[NDArray, dict(writable=False)], k_pe: Annotated[NDArray, dict(writable=False)], slot_mapping: Annotated[NDArray, dict(writable=False)], kv_cache: NDArray, kv_scale: float, stream: int) -> None: ...

def _compute_slot_mapping(seq_ids: Annotated[NDArray, dict(writable=False)], positions: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], block_size: int, num_blocks: int, shard: Shard, out: NDArray) -> None: ...

def _backends() -> list: ...

def _workspace_info(device: int) -> tuple[int, int]:
    """
    (bytes held, buffers outgrown) of the decode workspace on a CUDA device
    """

def _best_available_backend() -> str: ...

def _device_count() -> int: ...

class _DcpDecoder:
    @staticmethod
    def from_mpi(handle: int, backend: str, merge: str, interleave: int, deadline_s: float, agree: bool) -> _DcpDecoder: ...

    @staticmethod
    def from_nccl_comm(comm_ptr: int, owner: str, device: int, stream: int, backend: str, merge: str, interleave: int, deadline_s: float) -> _DcpDecoder: ...

    @staticmethod
    def from_nccl_bootstrap(rank: int, world: int, broadcast: Callable[[object], bytes], device: int, stream: int, backend: str, merge: str, interleave: int, deadline_s: float) -> _DcpDecoder: ...

    def decode(self, q: Annotated[NDArray, dict(writable=False)], kv_cache: Annotated[NDArray, dict(writable=False)], block_table: Annotated[NDArray, dict(writable=False)], seq_lens: Annotated[NDArray, dict(writable=False)], out: NDArray, lse: NDArray | None, softmax_scale: float, q_len: int, kv_scale: float, lse_base: str, max_seq_len: int, stream: int, check_block_ids: bool) -> None: ...

    @property
    def world(self) -> int: ...

    @property
    def rank(self) -> int: ...

    @property
    def shard(self) -> Shard: ...

    @property
    def communicator(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def device(self) -> int: ...

    def abort(self, reason: str) -> None: ...

def _mpi_available() -> bool: ...

def _nccl_available() -> bool: ...

def _nccl_library() -> dict[str, object]: ...

def _nccl_library_shared_with(library: str) -> bool: ...
