"""The backend table, the package version, and the FlashMLA- / FlashInfer-shaped calls against mladcp.decode
on the same data (numpy; the torch and CUDA variants are in test_torch.py and test_cuda.py)."""
import math
import os
import re

import numpy as np
import pytest
from conftest import make_case, reference

import mladcp


def test_version_is_the_cpp_version():
    here = os.path.dirname(os.path.abspath(__file__))
    text = open(os.path.join(here, "..", "..", "CMakeLists.txt")).read()
    assert mladcp.__version__ == re.search(r"project\(mladcp VERSION ([0-9.]+)", text).group(1)


def test_backends_table():
    table = {b["name"]: b for b in mladcp.backends()}
    assert list(table)[:3] == ["cpu-reference", "cpu", "cuda"]
    for name in ("cpu-reference", "cpu"):
        b = table[name]
        assert b["built"] and b["available"] and b["device"] == "host"
        assert b["can_return_lse_for_decode"] and b["native_lse_base"] in ("e", "2")
        assert "bf16" in b["q_dtypes"] and set(b["kv_dtypes"]) >= {"bf16", "fp8_e4m3"}
        assert b["min_q_len"] == 1 and b["max_q_len"] >= 1 and b["max_heads"] >= 128
    assert table["cuda"]["built"] == mladcp.cuda_built and table["cuda"]["device"] == "cuda"
    assert mladcp.best_available_backend() in ("cpu", "cuda")


def test_flash_mla_shape_matches_decode(rng):
    case = make_case(rng, batch=3, heads=8, lens=(40, 0, 17), q_len=2, block_size=16)
    q4 = case.q.reshape(3, 2, 8, 576)
    meta, splits = mladcp.get_mla_metadata(case.seq_lens, 2 * 8, 1)
    assert splits is None
    out, lse = mladcp.flash_mla_with_kvcache(q4, case.kv[:, :, None, :], case.block_table, case.seq_lens, 512,
                                             meta, splits, softmax_scale=case.scale, causal=True)
    assert out.shape == (3, 2, 8, 512) and lse.shape == (3, 8, 2)  # FlashMLA's [B, h_q, s_q]
    ro, rl = mladcp.decode(q4, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, q_len=2,
                           out_dtype="bf16")
    np.testing.assert_array_equal(out, ro)
    rl = rl.transpose(0, 2, 1)
    assert np.isposinf(lse[1]).all() and np.isneginf(rl[1]).all()  # empty sequence: FlashMLA writes +inf
    np.testing.assert_array_equal(lse[[0, 2]], rl[[0, 2]])
    with pytest.raises(ValueError, match="causal"):
        mladcp.flash_mla_with_kvcache(q4, case.kv, case.block_table, case.seq_lens, 512, meta, None, causal=False)
    with pytest.raises(NotImplementedError, match="sparse"):
        mladcp.flash_mla_with_kvcache(q4, case.kv, case.block_table, case.seq_lens, 512, meta, None, causal=True,
                                      indices=np.zeros((3, 2, 4), np.int32))


@pytest.mark.parametrize("backend,base", [("auto", "2"), ("trtllm-gen", "2"), ("cute-dsl", "e")])
def test_flashinfer_shape_matches_decode(rng, backend, base):
    case = make_case(rng, batch=2, heads=4, lens=(33, 9), q_len=1, block_size=32)
    q4 = case.q.reshape(2, 1, 4, 576)
    kv4 = case.kv[:, None]  # [num_pages, 1, page_size, 576]
    out, lse = mladcp.trtllm_batch_decode_with_kv_cache_mla(
        q4, kv4, None, 128, 512, 64, case.block_table, case.seq_lens, int(case.seq_lens.max()),
        bmm1_scale=case.scale, backend=backend, return_lse=True)
    ro, rl = mladcp.decode(q4, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, out_dtype="bf16",
                           lse_base=base)
    np.testing.assert_array_equal(out, ro)
    assert lse.shape == (2, 4)  # FlashInfer's default [B * q_len, H]
    np.testing.assert_allclose(lse, rl.reshape(2, 4), rtol=1e-6)
    only_out = mladcp.trtllm_batch_decode_with_kv_cache_mla(
        q4, kv4, None, 128, 512, 64, case.block_table, case.seq_lens, 64, bmm1_scale=case.scale)
    np.testing.assert_array_equal(only_out, ro)


def test_flashinfer_dcp_arguments_map_onto_the_shard(rng):
    """enable_dcp / cp_world / cp_rank / causal_seqlens_kv_global = decode of that shard with global lengths
    (the rank-local seq_lens are not read); LSE in natural log, as FlashInfer's DCP kernel returns it."""
    W, bs = 2, 16
    case = make_case(rng, batch=2, heads=4, lens=(41, 30), q_len=2, block_size=bs)
    q4 = case.q.reshape(2, 2, 4, 576)
    for r in range(W):
        shard = mladcp.Shard(W, r, 1)
        local = np.array([shard.local_len(int(l)) for l in case.seq_lens], np.int32)
        out, lse = mladcp.trtllm_batch_decode_with_kv_cache_mla(
            q4, case.kv, None, 128, 512, 64, case.block_table, local, int(local.max()), bmm1_scale=case.scale,
            return_lse=True, enable_dcp=True, cp_world=W, cp_rank=r, causal_seqlens_kv_global=case.seq_lens,
            backend="cute-dsl")
        ro, rl = mladcp.decode(q4, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, q_len=2,
                               shard=shard, out_dtype="bf16")
        np.testing.assert_array_equal(out, ro)
        np.testing.assert_array_equal(lse, rl.reshape(4, 4))
    with pytest.raises(ValueError, match="return_lse"):
        mladcp.trtllm_batch_decode_with_kv_cache_mla(
            q4, case.kv, None, 128, 512, 64, case.block_table, case.seq_lens, 64, enable_dcp=True, cp_world=2,
            causal_seqlens_kv_global=case.seq_lens)
    with pytest.raises(ValueError, match="enable_dcp"):
        mladcp.trtllm_batch_decode_with_kv_cache_mla(
            q4, case.kv, None, 128, 512, 64, case.block_table, case.seq_lens, 64, cp_world=2)


def test_flashinfer_fp8_scales(rng):
    """fp8 cache: bmm1_scale = sm_scale * k_scale, bmm2_scale = v_scale (k_scale == v_scale = the cache scale)."""
    B, H, L, bs, scale = 2, 4, 40, 32, 0.25
    nb = (L + bs - 1) // bs
    cache = np.zeros((B * nb, bs, 576), np.uint8)
    bt = np.arange(B * nb, dtype=np.int32).reshape(B, nb)
    vals = rng.standard_normal((B * L, 576)).astype(np.float32)
    slots = mladcp.compute_slot_mapping(np.repeat(np.arange(B, dtype=np.int32), L),
                                        np.tile(np.arange(L, dtype=np.int64), B), bt, bs)
    mladcp.write_kv_cache(vals, None, slots, cache, kv_scale=scale)
    q4 = mladcp.to_bf16_bits(rng.standard_normal((B, 1, H, 576)).astype(np.float32))
    sl = np.full(B, L, np.int32)
    out, lse = mladcp.trtllm_batch_decode_with_kv_cache_mla(
        q4, cache, None, 128, 512, 64, bt, sl, L, bmm1_scale=0.07 * scale, bmm2_scale=scale, return_lse=True,
        lse_base="e")
    ro, rl = mladcp.decode(q4, cache, bt, sl, softmax_scale=0.07, kv_scale=scale, out_dtype="bf16")
    np.testing.assert_array_equal(out, ro)
    np.testing.assert_allclose(lse, rl.reshape(B, H), rtol=1e-6)
    assert math.isfinite(float(lse.max()))


def test_type_stubs_match_the_extension():
    """Every function and class the extension's .pyi declares exists, and every callable of the extension is
    declared (the stub ships with the package next to py.typed)."""
    pkg = os.path.dirname(mladcp.__file__)
    stub = open(os.path.join(pkg, "_mladcp.pyi")).read()
    declared = set(re.findall(r"^(?:def|class) (\w+)", stub, re.M))
    assert declared and os.path.exists(os.path.join(pkg, "py.typed"))
    for name in declared:
        assert hasattr(mladcp._mladcp, name), name
    callables = {n for n in dir(mladcp._mladcp) if not n.startswith("__") and callable(getattr(mladcp._mladcp, n))}
    assert callables <= declared, callables - declared
