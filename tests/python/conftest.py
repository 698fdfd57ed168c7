"""Shared helpers of the Python tests: random paged MLA cases with NaN-poisoned unused memory.

Run from a CMake build (CTest sets PYTHONPATH=<build>/python) or after `pip install .`.
"""
from __future__ import annotations

import os
import secrets
import zlib
from dataclasses import dataclass

import numpy as np
import pytest

import mladcp

QK, LAT = 576, 512
BF16_NAN = np.uint16(0x7FC0)


def bf16(x: np.ndarray) -> np.ndarray:
    return mladcp.to_bf16_bits(np.asarray(x, dtype=np.float32))


def f32(bits: np.ndarray) -> np.ndarray:
    return mladcp.from_bf16_bits(bits)


@dataclass
class Case:
    q: np.ndarray  # [T, H, 576] bf16 bits
    kv: np.ndarray  # [num_blocks, block_size, 576] bf16 bits, NaN wherever no sequence reads
    block_table: np.ndarray  # [B, max_blocks] int32, unused entries hold huge ids
    seq_lens: np.ndarray  # [B] int32
    q_len: int
    block_size: int
    scale: float


def make_case(rng: np.random.Generator, batch=3, heads=8, lens=(37, 64, 1), q_len=1, block_size=16,
              spare_blocks=3) -> Case:
    """A random case: sequences of the given lengths, a permuted block table with spare (NaN) blocks and
    huge ids in unused entries, NaN in every cache slot past a sequence's length."""
    lens = np.array(lens[:batch] if len(lens) >= batch else list(lens) + [lens[-1]] * (batch - len(lens)), np.int32)
    max_blocks = max(1, int(max((int(l) + block_size - 1) // block_size for l in lens)) + 1)
    need = [(int(l) + block_size - 1) // block_size for l in lens]
    num_blocks = sum(need) + spare_blocks
    perm = rng.permutation(num_blocks)
    kv = np.full((num_blocks, block_size, QK), BF16_NAN, np.uint16)
    bt = np.full((batch, max_blocks), 2_000_000_000, np.int32)
    k = 0
    for b in range(batch):
        for i in range(need[b]):
            blk = int(perm[k])
            k += 1
            bt[b, i] = blk
            n = min(block_size, int(lens[b]) - i * block_size)
            kv[blk, :n] = bf16(rng.standard_normal((n, QK)))
    q = bf16(rng.standard_normal((batch * q_len, heads, QK)))
    return Case(q, kv, bt, lens, q_len, block_size, float(1.0 / np.sqrt(192.0)))


def reference(case: Case, out_dtype="fp32", lse_base="e", shard=None, kv=None, kv_scale=None):
    """The oracle: the cpu-reference backend (fp64 accumulation) on the same inputs."""
    return mladcp.decode(case.q, case.kv if kv is None else kv, case.block_table, case.seq_lens,
                         softmax_scale=case.scale, q_len=case.q_len, out_dtype=out_dtype, lse_base=lse_base,
                         backend="cpu-reference", shard=shard, kv_scale=kv_scale)


def numpy_oracle(case: Case):
    """An independent float64 implementation of MLA decode with LSE (natural log) for small cases."""
    T, H, _ = case.q.shape
    q = f32(case.q).astype(np.float64)
    out = np.zeros((T, H, LAT))
    lse = np.full((T, H), -np.inf)
    for t in range(T):
        b, i = divmod(t, case.q_len)
        visible = int(case.seq_lens[b]) - case.q_len + i + 1 if case.seq_lens[b] > 0 else 0
        if visible <= 0:
            continue
        rows = [f32(case.kv[case.block_table[b, j // case.block_size], j % case.block_size]) for j in range(visible)]
        c = np.stack(rows).astype(np.float64)  # [n, 576]
        s = case.scale * (q[t] @ c.T)  # [H, n]
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        den = p.sum(axis=1, keepdims=True)
        out[t] = (p / den) @ c[:, :LAT]
        lse[t] = (m + np.log(den))[:, 0]
    return out, lse


def tolerance(out_dtype: str) -> float:
    return 2e-2 if out_dtype == "bf16" else 2e-3


_BASE_SEED = int(os.environ.get("MLADCP_TEST_SEED", secrets.randbits(31)))


@pytest.fixture
def rng(request):
    """Fresh random inputs on every run; a failure prints the seed (rerun with MLADCP_TEST_SEED=<base>)."""
    seed = _BASE_SEED ^ zlib.crc32(request.node.name.encode())
    print(f"MLADCP_TEST_SEED={_BASE_SEED} (test seed {seed})")
    return np.random.default_rng(seed)


def torch_or_skip():
    if os.environ.get("MLADCP_NO_TORCH"):
        pytest.skip("MLADCP_NO_TORCH is set", allow_module_level=True)
    return pytest.importorskip("torch", reason="torch is not installed")
