"""mladcp.merge against a float64 formula (empty states, bases, layouts), Shard and slot mapping against the
sharding formulas, and the DCP identity: decoding every rank's shard and merging equals one decode of the
whole cache."""
import numpy as np
import pytest
from conftest import f32, make_case, reference

import mladcp


def merge_oracle(outs, lses, base):
    lses = np.where(np.isnan(lses) | np.isposinf(lses), -np.inf, lses.astype(np.float64))
    m = lses.max(axis=0)
    m_safe = np.where(np.isneginf(m), 0.0, m)
    w = np.power(2.0 if base == "2" else np.e, lses - m_safe)
    w = np.where(np.isneginf(lses), 0.0, w)
    s = w.sum(axis=0)
    safe_outs = np.where(w[..., None] == 0, 0.0, outs.astype(np.float64))
    out = np.where(s[..., None] > 0, (w[..., None] * safe_outs).sum(axis=0) / np.where(s > 0, s, 1)[..., None], 0.0)
    lse = np.where(s > 0, m_safe + np.log(np.where(s > 0, s, 1)) / (np.log(2.0) if base == "2" else 1.0), -np.inf)
    return out, lse


@pytest.mark.parametrize("base", ["e", "2"])
def test_merge_matches_formula_with_empty_states(rng, base):
    N, T, H, D = 4, 5, 3, 512
    outs = rng.standard_normal((N, T, H, D)).astype(np.float32)
    lses = (rng.standard_normal((N, T, H)) * 3).astype(np.float32)
    lses[1, 0, :] = -np.inf
    outs[1, 0, :] = np.nan  # an empty state's garbage must not leak
    lses[2, 1, 0] = np.inf
    outs[2, 1, 0] = np.nan
    lses[3, 2, 1] = np.nan
    lses[:, 4, 2] = -np.inf  # all empty
    outs[:, 4, 2] = np.nan
    out, lse = mladcp.merge(outs, lses, lse_base=base)
    ref_out, ref_lse = merge_oracle(outs, lses, base)
    assert out.dtype == np.float32 and out.shape == (T, H, D) and lse.shape == (T, H)
    assert not np.isnan(out).any()
    np.testing.assert_allclose(out, ref_out, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=1e-5)
    assert (out[4, 2] == 0).all() and np.isneginf(lse[4, 2])


def test_merge_list_input_base_conversion_bf16_and_strides(rng):
    T, H, D = 3, 2, 64
    a, b = (rng.standard_normal((T, H, D)).astype(np.float32) for _ in range(2))
    la, lb = (rng.standard_normal((T, H)).astype(np.float32) for _ in range(2))
    out, lse = mladcp.merge([a, b], [la, lb], lse_base="e", out_lse_base="2", out_dtype="bf16")
    ref_out, ref_lse = merge_oracle(np.stack([a, b]), np.stack([la, lb]), "e")
    assert out.dtype == np.uint16
    np.testing.assert_allclose(f32(out), ref_out, atol=2e-2)
    np.testing.assert_allclose(lse, ref_lse / np.log(2.0), atol=1e-5)
    # strided states: every other state of a larger stack, written into a view
    big = rng.standard_normal((4, T, H, D)).astype(np.float32)
    bl = rng.standard_normal((4, T, H)).astype(np.float32)
    dst = np.full((T, H, 2, D), 9.0, np.float32)
    mladcp.merge(big[::2], bl[::2], out=dst[:, :, 1], out_lse=False)
    np.testing.assert_allclose(dst[:, :, 1], merge_oracle(big[::2], bl[::2], "e")[0], atol=1e-5)
    assert (dst[:, :, 0] == 9.0).all()


def test_merge_bad_inputs_write_nothing(rng):
    outs = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    lses = rng.standard_normal((2, 3, 4)).astype(np.float32)
    out = np.full((3, 4, 8), 7.0, np.float32)
    for bad, msg in [(dict(lses=lses[:, :2]), "dimension"), (dict(lses=lses.astype(np.float64)), "dtype"),
                     (dict(lse_base="x"), "lse_base"), (dict(outs=outs[..., ::2]), "dimension")]:
        kw = dict(outs=outs, lses=lses, out=out)
        kw.update(bad)
        with pytest.raises(ValueError, match=msg):
            mladcp.merge(kw.pop("outs"), kw.pop("lses"), **kw)
        assert (out == 7.0).all()


@pytest.mark.parametrize("world,interleave", [(1, 1), (3, 1), (4, 2), (2, 4)])
def test_shard_helpers_follow_the_formulas(world, interleave):
    for rank in range(world):
        s = mladcp.Shard(world, rank, interleave)
        assert (s.world, s.rank, s.interleave) == (world, rank, interleave)
        owned = [p for p in range(200) if (p // interleave) % world == rank]
        for L in (0, 1, 7, 64, 199):
            assert s.local_len(L) == sum(1 for p in owned if p < L)
        for k, p in enumerate(owned):
            assert s.local_to_global(k) == p and s.global_to_local(p) == k and s.owner(p) == rank
        assert s.visible_keys(50, 3, 1) == s.local_len(50 - 3 + 1 + 1)
    with pytest.raises(ValueError, match="world"):
        mladcp.Shard(0, 0, 1)
    with pytest.raises(ValueError, match="interleave"):
        mladcp.Shard(2, 0, 0)
    with pytest.raises(ValueError, match="block_size"):
        mladcp.Shard(2, 0, 4).validate(6)


def test_slot_mapping_and_bad_indices():
    bs, W, I = 8, 2, 2
    bt = np.array([[5, 3, 9], [1, 0, 2]], np.int32)
    seq_ids = np.array([0, 0, 0, 1, 1], np.int32)
    pos = np.array([0, 2, 17, 5, 40], np.int64)
    for r in range(W):
        slots = mladcp.compute_slot_mapping(seq_ids, pos, bt, bs, mladcp.Shard(W, r, I), num_blocks=10)
        for n in range(5):
            p = int(pos[n])
            if (p // I) % W != r:
                assert slots[n] == -1
            else:
                vbo = p % (bs * W)
                assert slots[n] == bt[seq_ids[n], p // (bs * W)] * bs + (vbo // (W * I)) * I + vbo % I
    with pytest.raises(ValueError):
        mladcp.compute_slot_mapping(seq_ids, pos, bt, bs, mladcp.Shard(W, 0, I), num_blocks=4)  # id 5, 9 >= 4
    with pytest.raises(ValueError, match="int64"):
        mladcp.compute_slot_mapping(seq_ids, pos.astype(np.int32), bt, bs)


def test_write_kv_cache_bad_slot_writes_nothing(rng):
    cache = np.zeros((2, 4, 576), np.uint16)
    vals = mladcp.to_bf16_bits(rng.standard_normal((3, 576)).astype(np.float32))
    with pytest.raises(ValueError):
        mladcp.write_kv_cache(vals, None, np.array([0, 9, 1], np.int64), cache)
    assert (cache == 0).all()
    mladcp.write_kv_cache(vals, None, np.array([0, -1, 7], np.int64), cache)
    np.testing.assert_array_equal(cache[0, 0], vals[0])
    np.testing.assert_array_equal(cache[1, 3], vals[2])
    assert (cache[0, 1:] == 0).all() and (cache[1, :3] == 0).all()


@pytest.mark.parametrize("world,interleave,q_len", [(2, 1, 1), (3, 2, 2), (4, 1, 3)])
def test_dcp_shards_merge_to_the_full_decode(rng, world, interleave, q_len):
    """Each rank's cache is written through compute_slot_mapping + write_kv_cache from the same tokens; the
    merged per-rank decodes equal the single-rank decode of the whole cache (the DCP correctness condition),
    including ranks with empty shards."""
    B, H, bs = 3, 4, 8
    lens = np.array([45, 3, 19], np.int32)
    full = make_case(rng, batch=B, heads=H, lens=tuple(lens), q_len=q_len, block_size=bs)
    tokens = [f32(full.kv[full.block_table[b, p // bs], p % bs]) for b in range(B) for p in range(lens[b])]
    tokens = mladcp.to_bf16_bits(np.stack(tokens))
    seq_ids = np.concatenate([np.full(lens[b], b, np.int32) for b in range(B)])
    pos = np.concatenate([np.arange(lens[b], dtype=np.int64) for b in range(B)])
    nvb = max(mladcp.num_virtual_blocks(int(l), bs, world) for l in lens)
    vbt = np.arange(B * nvb, dtype=np.int32).reshape(B, nvb)[:, ::-1].copy()  # reversed ids per row
    outs, lses = [], []
    for r in range(world):
        shard = mladcp.Shard(world, r, interleave)
        cache = np.full((B * nvb, bs, 576), 0x7FC0, np.uint16)  # NaN where nothing is written
        slots = mladcp.compute_slot_mapping(seq_ids, pos, vbt, bs, shard, num_blocks=B * nvb)
        mladcp.write_kv_cache(tokens, None, slots, cache)
        o, l = mladcp.decode(full.q, cache, vbt, lens, softmax_scale=full.scale, q_len=q_len, shard=shard,
                             out_dtype="fp32")
        outs.append(o)
        lses.append(l)
    merged, merged_lse = mladcp.merge(outs, lses)
    ref_out, ref_lse = reference(full)
    np.testing.assert_allclose(merged, ref_out, atol=2e-3)
    np.testing.assert_allclose(merged_lse, ref_lse, atol=1e-4)
