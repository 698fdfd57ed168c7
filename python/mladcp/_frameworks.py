"""Framework helpers: which library a tensor comes from, allocating outputs like it, its current stream.

The C++ calls take any DLPack tensor; only allocation and the current CUDA stream need to know the
framework (torch, numpy, cupy).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Sequence

import numpy as np

from . import _mladcp as _C

_torch = None  # the torch module once imported by anyone
_raw_stream = None  # torch._C._cuda_getCurrentRawStream when present
_TorchTensor = None  # torch.Tensor (exact type) once torch is imported
_torch_to_dlpack = None  # torch._C._to_dlpack: a DLPack capsule without Tensor.__dlpack__'s Python checks
_torch_fp8 = None  # torch.float8_e4m3fn, exported as uint8 bits (DLPack's fp8 codes are recent in torch)
_torch_u8 = None
# _mladcp._decode_torch once torch.Tensor's DLPack C exchange API (torch 2.10 and later) is registered: the
# decode entry that reads torch tensors without capsules. None: the capsule path. MLADCP_NO_DLPACK_C_API=1
# keeps it off.
_decode_torch = None


def torch_module():
    """torch if it has been imported (by the caller or by mladcp), else None. Never imports it."""
    global _torch, _raw_stream, _TorchTensor, _torch_to_dlpack, _torch_fp8, _torch_u8
    if _torch is None:
        t = sys.modules.get("torch")
        if t is not None and hasattr(t, "Tensor"):
            _torch = t
            _raw_stream = getattr(getattr(t, "_C", None), "_cuda_getCurrentRawStream", None)
            _TorchTensor = t.Tensor
            _torch_to_dlpack = getattr(getattr(t, "_C", None), "_to_dlpack", None)
            _torch_fp8 = getattr(t, "float8_e4m3fn", None)
            _torch_u8 = t.uint8
            use_torch_exchange(not os.environ.get("MLADCP_NO_DLPACK_C_API"))
    return _torch


def use_torch_exchange(enable: bool = True) -> bool:
    """Turns the capsule-free torch path of decode on (when torch offers its DLPack C exchange API) or off;
    returns whether it is on. Both paths check and compute the same; the exchange API saves the capsules."""
    global _decode_torch
    api = None
    if enable and _TorchTensor is not None:
        api = getattr(_TorchTensor, "__dlpack_c_exchange_api__", None)
        if api is None:
            api = getattr(_TorchTensor, "__c_dlpack_exchange_api__", None)  # the name of its first release
    ok = api is not None and _C._set_torch_exchange(_TorchTensor, api)
    if not ok:
        _C._set_torch_exchange(None, None)
    _decode_torch = _C._decode_torch if ok else None
    return ok


def to_dl_plain(x: Any) -> Any:
    """to_dl for tensors that cannot be fp8 (queries, outputs, LSE, indices): one type test fewer."""
    if type(x) is _TorchTensor and _torch_to_dlpack is not None:
        return _torch_to_dlpack(x)
    if x is None:
        return None
    return as_dlpack(x)


def to_dl(x: Any) -> Any:
    """What the C++ calls receive for x: a DLPack capsule for a torch tensor (the fast C-level export;
    Tensor.__dlpack__ costs several microseconds of Python per tensor), numpy's ml_dtypes arrays as bits,
    anything else as is (nanobind reads its __dlpack__)."""
    if type(x) is _TorchTensor and _torch_to_dlpack is not None:
        if x.dtype is _torch_fp8:
            x = x.view(_torch_u8)
        return _torch_to_dlpack(x)
    if x is None:
        return None
    return as_dlpack(x)


def is_torch(x: Any) -> bool:
    t = torch_module()
    return t is not None and isinstance(x, t.Tensor)


def is_cupy(x: Any) -> bool:
    return type(x).__module__.startswith("cupy")


_NUMPY_BITS = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8}


def as_dlpack(x: Any) -> Any:
    """numpy arrays of the ml_dtypes types bfloat16 / float8_e4m3fn become uint16 / uint8 views (no copy),
    which the C++ side reads as bf16 / fp8-e4m3 bits. Everything else passes through."""
    if type(x) is np.ndarray and x.dtype.kind == "V":
        bits = _NUMPY_BITS.get(x.dtype.name)
        if bits is not None:
            return x.view(bits)
    return x


def current_stream(x: Any) -> int:
    """The cudaStream_t (as int) the caller's framework is currently issuing on for tensor x; 0 for host
    tensors (and for frameworks without a notion of current stream)."""
    t = _torch if _torch is not None else torch_module()
    if t is not None and isinstance(x, t.Tensor):
        if not x.is_cuda:
            return 0
        if _raw_stream is not None:
            return _raw_stream(x.get_device())
        return t.cuda.current_stream(x.device).cuda_stream
    if is_cupy(x):
        import cupy  # noqa: PLC0415

        with cupy.cuda.Device(x.device.id):
            return cupy.cuda.get_current_stream().ptr
    return 0


def stream_arg(stream: Any, like: Any) -> int:
    """An explicit stream= (int, torch.cuda.Stream, cupy stream) as int, or the current stream of `like`."""
    if stream is None:
        return current_stream(like)
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise ValueError(f"stream: expected an int (cudaStream_t), a torch.cuda.Stream or a cupy stream, got {type(stream)}")


def empty_like_framework(like: Any, shape: Sequence[int], dtype: str) -> Any:
    """A new uninitialized tensor of `shape` on the device of `like`, from the same framework.
    dtype: "bf16" or "fp32". numpy and cupy have no bfloat16: "bf16" there gives uint16 holding bf16 bits."""
    t = _torch if _torch is not None else torch_module()
    if t is not None and isinstance(like, t.Tensor):
        return t.empty(tuple(shape), dtype=t.bfloat16 if dtype == "bf16" else t.float32, device=like.device)
    if is_cupy(like):
        import cupy  # noqa: PLC0415

        with cupy.cuda.Device(like.device.id):
            return cupy.empty(tuple(shape), dtype=cupy.uint16 if dtype == "bf16" else cupy.float32)
    if dtype == "bf16":
        return np.empty(tuple(shape), dtype=np.uint16)
    return np.empty(tuple(shape), dtype=np.float32)


def default_out_dtype(like: Any) -> str:
    """bf16 for torch (which has the type), fp32 for numpy and cupy (which do not)."""
    return "bf16" if is_torch(like) else "fp32"


def stack(xs: Sequence[Any]) -> Any:
    """Stacks a sequence of tensors along a new first dimension with their framework (one copy)."""
    first = xs[0]
    if is_torch(first):
        return _torch.stack(list(xs))
    if is_cupy(first):
        import cupy  # noqa: PLC0415

        return cupy.stack(list(xs))
    return np.stack([as_dlpack(x) for x in xs])


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values -> bf16 bits (uint16), rounded to nearest even. For numpy users of bf16 tensors."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    out = rounded.astype(np.uint16)
    nan = np.isnan(np.asarray(x, dtype=np.float32))
    out[nan] = np.uint16(0x7FC0)
    return out


def from_bf16_bits(x: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) -> float32 values (exact)."""
    return (np.asarray(x, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
