"""mladcp.decode from numpy: against the cpu-reference oracle and an independent float64 oracle, layouts and
strides read in place, empty rows, fp8 caches, and bad inputs that raise and write nothing."""
import numpy as np
import pytest
from conftest import BF16_NAN, f32, make_case, numpy_oracle, reference, tolerance

import mladcp


def rel_err(a, b):
    return float(np.linalg.norm((a - b).ravel()) / max(np.linalg.norm(b.ravel()), 1e-30))


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("out_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("backend", ["cpu", "cpu-reference"])
def test_decode_matches_oracles(rng, q_len, out_dtype, backend):
    case = make_case(rng, batch=3, heads=8, lens=(37, 64, 3), q_len=q_len)
    out, lse = mladcp.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale,
                             q_len=q_len, out_dtype=out_dtype, backend=backend)
    assert out.shape == (case.q.shape[0], 8, 512) and lse.shape == (case.q.shape[0], 8)
    assert out.dtype == (np.float32 if out_dtype == "fp32" else np.uint16) and lse.dtype == np.float32
    got = out if out_dtype == "fp32" else f32(out)
    assert np.isfinite(got).all() and np.isfinite(lse).all()
    ref_out, ref_lse = numpy_oracle(case)
    assert rel_err(got, ref_out) < tolerance(out_dtype)
    assert np.abs(lse - ref_lse).max() < 1e-3
    o2, l2 = reference(case, out_dtype=out_dtype)
    assert np.abs(lse - l2).max() < 1e-3


def test_lse_base_2_and_no_lse(rng):
    case = make_case(rng)
    _, lse_e = reference(case)
    out2, lse_2 = mladcp.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale,
                                lse_base="2")
    np.testing.assert_allclose(lse_2, lse_e / np.log(2.0), rtol=1e-5, atol=1e-5)
    out3, none = mladcp.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, lse=False)
    assert none is None
    np.testing.assert_array_equal(out3, out2)


def test_four_dim_layout_and_caller_buffers(rng):
    """q [B, q_len, H, 576] gives out [B, q_len, H, 512] and lse [B, q_len, H]; caller buffers are written in full."""
    case = make_case(rng, batch=2, heads=4, lens=(40, 23), q_len=2)
    q4 = case.q.reshape(2, 2, 4, 576)
    out = np.full((2, 2, 4, 512), np.nan, np.float32)
    lse = np.full((2, 2, 4), np.nan, np.float32)
    o, l = mladcp.decode(q4, case.kv[:, :, None, :], case.block_table, case.seq_lens, softmax_scale=case.scale,
                         q_len=2, out=out, lse=lse)
    assert o is out and l is lse
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    ro, rl = reference(case)
    np.testing.assert_allclose(out.reshape(4, 4, 512), ro, atol=2e-3)
    np.testing.assert_allclose(lse.reshape(4, 4), rl, atol=1e-4)


def test_strided_views_are_read_in_place(rng):
    """Head and token strides of views into larger buffers (q, cache, block table, out, lse) are honoured;
    the padding around the views stays untouched."""
    case = make_case(rng, batch=3, heads=6, lens=(50, 17, 33), q_len=1)
    T, H = case.q.shape[:2]
    qbig = np.full((T, 2 * H, 576), BF16_NAN, np.uint16)
    qbig[:, ::2] = case.q
    q_view = qbig[:, ::2]  # head stride 1152
    kvbig = np.full((case.kv.shape[0], case.kv.shape[1], 2, 576), BF16_NAN, np.uint16)
    kvbig[:, :, 1] = case.kv
    kv_view = kvbig[:, :, 1]  # token stride 1152
    btbig = np.full((3, case.block_table.shape[1] + 5), -7, np.int32)
    btbig[:, : case.block_table.shape[1]] = case.block_table
    bt_view = btbig[:, : case.block_table.shape[1]]
    outbig = np.full((T, H, 2, 512), -123.0, np.float32)
    out_view = outbig[:, :, 0]
    lsebig = np.full((T, H + 3), -123.0, np.float32)
    lse_view = lsebig[:, 1 : H + 1]
    mladcp.decode(q_view, kv_view, bt_view, case.seq_lens, softmax_scale=case.scale, out=out_view, lse=lse_view)
    ro, rl = reference(case)
    np.testing.assert_allclose(out_view, ro, atol=2e-3)
    np.testing.assert_allclose(lse_view, rl, atol=1e-4)
    assert (outbig[:, :, 1] == -123.0).all() and (lsebig[:, 0] == -123.0).all() and (lsebig[:, H + 1 :] == -123.0).all()


def test_empty_rows_write_zero_and_minus_inf(rng):
    case = make_case(rng, batch=3, heads=4, lens=(0, 20, 0))
    out = np.full((3, 4, 512), np.nan, np.float32)
    lse = np.full((3, 4), np.nan, np.float32)
    mladcp.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, out=out, lse=lse)
    assert (out[0] == 0).all() and (out[2] == 0).all()
    assert np.isneginf(lse[0]).all() and np.isneginf(lse[2]).all()
    assert np.isfinite(out[1]).all() and np.isfinite(lse[1]).all()


def test_fp8_cache_written_by_write_kv_cache(rng):
    """An fp8-e4m3 cache (uint8 bits) filled by write_kv_cache from fp32 values with a scale decodes like the
    reference on the same cache."""
    B, H, L, bs = 2, 4, 45, 16
    nb = (L + bs - 1) // bs
    cache = np.full((B * nb + 1, bs, 576), 0x7F, np.uint8)  # 0x7f is NaN in e4m3
    bt = np.arange(B * nb, dtype=np.int32).reshape(B, nb)
    vals = rng.standard_normal((B * L, 576)).astype(np.float32) * 3
    seq_ids = np.repeat(np.arange(B, dtype=np.int32), L)
    pos = np.tile(np.arange(L, dtype=np.int64), B)
    slots = mladcp.compute_slot_mapping(seq_ids, pos, bt, bs)
    mladcp.write_kv_cache(vals[:, :512], vals[:, 512:], slots, cache, kv_scale=0.5)
    q = mladcp.to_bf16_bits(rng.standard_normal((B, H, 576)).astype(np.float32))
    sl = np.full(B, L, np.int32)
    out, lse = mladcp.decode(q, cache, bt, sl, softmax_scale=0.05, kv_scale=0.5, out_dtype="fp32")
    ro, rl = mladcp.decode(q, cache, bt, sl, softmax_scale=0.05, kv_scale=0.5, out_dtype="fp32",
                           backend="cpu-reference")
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ro, atol=2e-3)
    np.testing.assert_allclose(lse, rl, atol=1e-4)
    # The stored values are the fp8 rounding of value / scale: decode of one key returns ~ its latent.
    out1, _ = mladcp.decode(q[:1], cache, bt[:1], np.array([1], np.int32), softmax_scale=0.05, kv_scale=0.5,
                            out_dtype="fp32")
    np.testing.assert_allclose(out1[0, 0], vals[0, :512], rtol=0.07, atol=0.02)


def _bad_call(case, **over):
    args = dict(q=case.q, kv_cache=case.kv, block_table=case.block_table, seq_lens=case.seq_lens)
    kw = dict(softmax_scale=case.scale)
    for k, v in over.items():
        (args if k in args else kw)[k] = v
    return args, kw


BAD = {
    "q_fp32": (dict(q="fp32"), "q_dtype=fp32"),
    "q_two_dims": (dict(q="2d"), "q: 2 dimensions"),
    "q_last_dim_strided": (dict(q="strided"), "last dimension must be contiguous"),
    "q_broadcast": (dict(q="broadcast"), "broadcast"),
    "q_width": (dict(q="width"), "576"),
    "block_table_int64": (dict(block_table="int64"), "expected int32"),
    "seq_lens_float": (dict(seq_lens="float"), "expected int32"),
    "block_id_out_of_range": (dict(block_table="huge"), "block id out of range"),
    "seq_len_too_long": (dict(seq_lens="long"), "blocks"),
    "q_len_zero": (dict(q_len=0), "q_len=0"),
    "q_len_not_dividing": (dict(q_len=2), "multiple of q_len"),
    "bad_lse_base": (dict(lse_base="10"), "lse_base"),
    "bad_backend": (dict(backend="nope"), "unknown"),
    "bad_scale": (dict(softmax_scale=-1.0), "softmax_scale"),
    "kv_scale_on_bf16": (dict(kv_scale=2.0), "kv_scale"),
    "bad_split_policy": (dict(split_policy="sometimes"), "split_policy"),
    "out_wrong_heads": (dict(out="heads"), "number of heads"),
    "lse_wrong_dtype": (dict(lse="f64"), "dtype"),
    "shard_rank": (dict(shard="bad"), "rank"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_inputs_raise_and_write_nothing(rng, name):
    case = make_case(rng, batch=3, heads=4, lens=(20, 33, 7))
    over, message = BAD[name]
    T, H = case.q.shape[:2]
    out = np.full((T, H, 512), -5.0, np.float32)
    lse = np.full((T, H), -5.0, np.float32)
    args, kw = _bad_call(case)
    kw.update(out=out, lse=lse)
    for k, v in over.items():
        if k == "q":
            args["q"] = {
                "fp32": lambda: f32(case.q),
                "2d": lambda: case.q.reshape(T * H, 576),
                "strided": lambda: np.repeat(case.q, 2, axis=2)[:, :, ::2],
                "broadcast": lambda: np.broadcast_to(case.q[:1], case.q.shape),
                "width": lambda: case.q[:, :, :512],
            }[v]()
        elif k == "block_table":
            bt = case.block_table.astype(np.int64) if v == "int64" else case.block_table.copy()
            if v == "huge":
                bt[1, 0] = case.kv.shape[0]
            args["block_table"] = bt
        elif k == "seq_lens":
            args["seq_lens"] = (case.seq_lens.astype(np.float32) if v == "float" else
                                np.array([20, case.block_table.shape[1] * case.block_size + 1, 7], np.int32))
        elif k == "out":
            kw["out"] = np.full((T, H + 1, 512), -5.0, np.float32)
            out = kw["out"]
        elif k == "lse":
            kw["lse"] = np.full((T, H), -5.0, np.float64)
            lse = kw["lse"]
        elif k == "shard":
            kw["shard"] = None
            with pytest.raises(ValueError, match="rank"):
                mladcp.Shard(2, 2, 1)
            return
        else:
            kw[k] = v
    with pytest.raises((ValueError, NotImplementedError)) as err:
        mladcp.decode(args["q"], args["kv_cache"], args["block_table"], args["seq_lens"], **kw)
    assert message in str(err.value), str(err.value)
    assert (out == -5.0).all() and (lse == -5.0).all(), "a failed call wrote its output"


def test_caller_buffer_on_error_is_untouched_for_every_output_position(rng):
    """The contract holds per element: a valid call writes every element, an invalid one none."""
    case = make_case(rng, batch=2, heads=3, lens=(5, 9))
    out = np.full((2, 3, 512), np.nan, np.float32)
    lse = np.full((2, 3), np.nan, np.float32)
    mladcp.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, out=out, lse=lse)
    assert not np.isnan(out).any() and not np.isnan(lse).any()
