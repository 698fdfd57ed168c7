"""torch CPU tensors: zero-copy decode and merge, the custom ops (opcheck, torch.compile), the drop-in calls,
and bad torch inputs. Skipped when torch is not installed."""
import math

import numpy as np
import pytest
from conftest import make_case, reference, torch_or_skip

import mladcp

torch = torch_or_skip()


def as_torch(case):
    q = torch.from_numpy(case.q.view(np.int16)).view(torch.bfloat16)
    kv = torch.from_numpy(case.kv.view(np.int16)).view(torch.bfloat16)
    return q, kv, torch.from_numpy(case.block_table), torch.from_numpy(case.seq_lens)


def test_ops_are_registered():
    assert mladcp.torch_ops_registered
    for name in ("decode", "decode_out", "merge"):
        assert hasattr(torch.ops.mladcp, name)


@pytest.mark.parametrize("q_len", [1, 2])
def test_decode_torch_matches_reference_and_shares_memory(rng, q_len):
    case = make_case(rng, batch=3, heads=8, lens=(30, 1 + q_len, 0), q_len=q_len)
    q, kv, bt, sl = as_torch(case)
    out, lse = mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, q_len=q_len)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    ro, rl = reference(case)
    np.testing.assert_allclose(out.float().numpy(), ro, atol=2e-2)
    np.testing.assert_allclose(lse.numpy(), rl, atol=1e-4)
    # a caller buffer that is a strided view (every other head of a larger buffer): written in place
    big = torch.full((q.shape[0], 16, 512), float("nan"), dtype=torch.float32)
    view = big[:, 1::2]
    mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, q_len=q_len, out=view, lse=False)
    assert view.data_ptr() == big.data_ptr() + 512 * 4 and not torch.isnan(view).any()
    assert torch.isnan(big[:, 0::2]).all()
    np.testing.assert_allclose(view.numpy(), ro, atol=2e-3)
    # heads outside tokens (a transposed view) is a layout the kernel does not take: a clear error
    tbig = torch.full((8, q.shape[0], 512), 5.0)
    with pytest.raises(ValueError, match="out_stride_token"):
        mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, q_len=q_len, out=tbig.transpose(0, 1), lse=False)
    assert (tbig == 5.0).all()


def test_custom_ops_opcheck_and_results(rng):
    case = make_case(rng, batch=2, heads=4, lens=(20, 11), q_len=1)
    q, kv, bt, sl = as_torch(case)
    args = (q, kv, bt, sl, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0, "fp32")
    out, lse = torch.ops.mladcp.decode(*args)
    ro, rl = reference(case)
    np.testing.assert_allclose(out.numpy(), ro, atol=2e-3)
    np.testing.assert_allclose(lse.numpy(), rl, atol=1e-4)
    torch.library.opcheck(torch.ops.mladcp.decode.default, args)
    o = torch.empty(2, 4, 512, dtype=torch.bfloat16)
    l = torch.empty(2, 4)
    torch.library.opcheck(torch.ops.mladcp.decode_out.default,
                          (q, kv, bt, sl, o, l, case.scale, 1, 1.0, "2", "cpu", 1, 0, 1, "", 0))
    torch.ops.mladcp.decode_out(q, kv, bt, sl, o, l, case.scale, 1, 1.0, "2", "cpu", 1, 0, 1, "", 0)
    np.testing.assert_allclose(l.numpy(), rl / math.log(2.0), atol=1e-4)
    outs, lses = torch.randn(3, 2, 4, 64), torch.randn(3, 2, 4)
    torch.library.opcheck(torch.ops.mladcp.merge.default, (outs, lses, "e", "", ""))
    m, ml = torch.ops.mladcp.merge(outs, lses, "e", "", "")
    np.testing.assert_allclose(ml.numpy(), torch.logsumexp(lses, 0).numpy(), atol=1e-5)
    w = torch.softmax(lses, 0)
    np.testing.assert_allclose(m.numpy(), (w[..., None] * outs).sum(0).numpy(), atol=1e-5)


def test_torch_compile_traces_the_op(rng):
    case = make_case(rng, batch=2, heads=4, lens=(20, 11))
    q, kv, bt, sl = as_torch(case)

    def step(q, kv, bt, sl):
        out, lse = torch.ops.mladcp.decode(q, kv, bt, sl, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0, "fp32")
        return out * 2.0, lse

    try:
        compiled = torch.compile(step, fullgraph=True)
        out, lse = compiled(q, kv, bt, sl)
    except Exception as e:  # noqa: BLE001  (no C compiler for inductor, etc.)
        if "compiler" in str(e).lower() or "cpp" in str(e).lower():
            pytest.skip(f"torch.compile unavailable here: {e}")
        raise
    ro, rl = reference(case)
    np.testing.assert_allclose(out.numpy(), 2 * ro, atol=4e-3)


def test_drop_in_calls_with_torch(rng):
    case = make_case(rng, batch=2, heads=4, lens=(25, 0), q_len=1, block_size=32)
    q, kv, bt, sl = as_torch(case)
    q4 = q.view(2, 1, 4, 576)
    meta, _ = mladcp.get_mla_metadata(sl, 4, 1)
    out, lse = mladcp.flash_mla_with_kvcache(q4, kv.unsqueeze(2), bt, sl, 512, meta, None,
                                             softmax_scale=case.scale, causal=True)
    assert out.shape == (2, 1, 4, 512) and lse.shape == (2, 4, 1)
    ro, rl = reference(case)
    np.testing.assert_allclose(out.float().numpy().reshape(2, 4, 512), ro, atol=2e-2)
    assert torch.isposinf(lse[1]).all()
    o2, l2 = mladcp.trtllm_batch_decode_with_kv_cache_mla(q4, kv.unsqueeze(1), None, 128, 512, 64, bt, sl, 32,
                                                          bmm1_scale=case.scale, bmm2_scale=0.5, return_lse=True)
    np.testing.assert_allclose(o2.float().numpy().reshape(2, 4, 512), 0.5 * out.float().numpy().reshape(2, 4, 512),
                               atol=1e-2)
    assert torch.isneginf(l2[1]).all()
    np.testing.assert_allclose(l2[0].numpy(), rl[0] / math.log(2.0), atol=1e-4)  # trtllm-gen: log2


def test_bad_torch_inputs_raise_and_write_nothing(rng):
    case = make_case(rng, batch=2, heads=4, lens=(20, 11))
    q, kv, bt, sl = as_torch(case)
    out = torch.full((2, 4, 512), 3.0)
    lse = torch.full((2, 4), 3.0)
    bad = [
        (dict(q=q.float()), "q_dtype"),
        (dict(q=torch.zeros(2, 4, 1152, dtype=torch.bfloat16)[:, :, ::2]), "contiguous"),
        (dict(bt=bt.long()), "int32"),
        (dict(sl=sl[None]), "dimensions"),
        (dict(q=q.unsqueeze(0)), "q_len"),
        (dict(out=torch.full((2, 4, 512), 3.0, dtype=torch.float64)), "dtype"),
    ]
    for over, msg in bad:
        a = dict(q=q, kv=kv, bt=bt, sl=sl, out=out)
        a.update(over)
        with pytest.raises((ValueError, NotImplementedError), match=msg):
            mladcp.decode(a["q"], a["kv"], a["bt"], a["sl"], softmax_scale=case.scale, out=a["out"], lse=lse)
        assert (out == 3.0).all() and (lse == 3.0).all()


def test_dcp_decoder_refuses_a_group_it_cannot_use(tmp_path):
    """No torch.distributed group, or a group without NCCL (gloo): ValueError naming the way out."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    with pytest.raises(ValueError, match="not initialized"):
        mladcp.DcpDecoder()
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="NCCL group"):
            mladcp.DcpDecoder(dist.group.WORLD)
    finally:
        dist.destroy_process_group()


def test_fp8_torch_cache(rng):
    """A torch float8_e4m3fn cache written by write_kv_cache decodes like the oracle on its bits."""
    vals = torch.from_numpy(rng.standard_normal((70, 576)).astype(np.float32))
    cache = torch.full((3, 64, 576), float("nan")).to(torch.float8_e4m3fn)
    bt = torch.tensor([[2, 0]], dtype=torch.int32)
    slots = mladcp.compute_slot_mapping(torch.zeros(70, dtype=torch.int32), torch.arange(70), bt, 64)
    mladcp.write_kv_cache(vals[:, :512], vals[:, 512:], slots, cache, kv_scale=0.5)
    q = torch.randn(1, 16, 576).bfloat16()
    sl = torch.tensor([70], dtype=torch.int32)
    out, lse = mladcp.decode(q, cache, bt, sl, softmax_scale=0.07, kv_scale=0.5, out_dtype="fp32")
    ro, rl = mladcp.decode(q.view(torch.int16).numpy().view(np.uint16), cache.view(torch.uint8).numpy(), bt.numpy(),
                           sl.numpy(), softmax_scale=0.07, kv_scale=0.5, out_dtype="fp32", backend="cpu-reference")
    np.testing.assert_allclose(out.numpy(), ro, atol=2e-3)
    np.testing.assert_allclose(lse.numpy(), rl, atol=1e-4)
    o2, l2 = torch.ops.mladcp.decode(q, cache, bt, sl, 0.07, 1, 0.5, "e", "", 1, 0, 1, "", 0, "fp32")
    assert torch.equal(o2, out) and torch.equal(l2, lse)
    np.testing.assert_allclose((cache[2, :64].float() * 0.5).numpy(), vals[:64].numpy(), rtol=0.07, atol=0.02)


def test_readme_python_example_runs_on_cpu():
    """The README's torch example, with its tensors on the host instead of the GPU."""
    import os
    import re

    readme = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    example = next(b for b in blocks if "mladcp.decode(" in b)
    code = example.replace('device="cuda"', 'device="cpu"').replace("L, bs = 4, 16, 4096, 64", "L, bs = 2, 16, 256, 64")
    scope = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102
    out, lse, o, l = scope["out"], scope["lse"], scope["o"], scope["l"]
    assert out.shape == (2, 16, 512) and lse.shape == (2, 16)
    torch.testing.assert_close(l, lse + math.log(2.0))
    torch.testing.assert_close(o.float(), out.float(), atol=1e-2, rtol=1e-2)


# ---- the torch entry through torch's DLPack C exchange API (no capsules) against the capsule path ----------


@pytest.fixture
def exchange():
    """mladcp._frameworks.use_torch_exchange, restored after the test; skips where torch has no DLPack C
    exchange API (torch before 2.10) or MLADCP_NO_DLPACK_C_API is set."""
    import os

    from mladcp import _frameworks as fw

    if os.environ.get("MLADCP_NO_DLPACK_C_API"):
        pytest.skip("MLADCP_NO_DLPACK_C_API is set")
    if not fw.use_torch_exchange(True):
        pytest.skip("this torch has no DLPack C exchange API")
    yield fw.use_torch_exchange
    fw.use_torch_exchange(True)


def _both_paths(use, call):
    """(result or exception) of call() with the exchange path on, then off (the capsule path)."""
    results = []
    for on in (True, False):
        assert use(on) == on
        try:
            results.append(("ok", call()))
        except Exception as e:  # noqa: BLE001
            results.append((type(e), str(e)))
    use(True)
    return results


def test_decode_torch_exchange_path_matches_the_capsule_path(rng, exchange):
    from mladcp import _frameworks as fw

    assert fw._decode_torch is not None and mladcp._mladcp._torch_exchange_ready()
    case = make_case(rng, batch=3, heads=8, lens=(40, 3, 0), q_len=2, block_size=16)
    q, kv, bt, sl = as_torch(case)
    q4 = q.view(3, 2, 8, 576)
    cache8 = kv.float().clamp(-8, 8).nan_to_num(0.0).to(torch.float8_e4m3fn)
    big = torch.zeros(6, 16, 512)
    shard = mladcp.Shard(2, 1, 4)
    calls = [
        dict(),
        dict(q=q4),
        dict(kv_scale=1.0, lse_base="2", out_dtype="fp32"),
        dict(kv_scale=1, lse=False, backend="cpu-reference"),
        dict(kv=cache8, kv_scale=torch.tensor(0.25)),
        dict(out=big[:, 1::2], lse=torch.empty(6, 8)),
        dict(kv=cache8, kv_scale=0.125, split_policy="fill", max_seq_len=48),
        dict(shard=shard, stream=0, check_block_ids=False),
    ]
    for over in calls:
        a = dict(q=q, kv=kv, bt=bt, sl=sl)
        a.update(over)
        args = (a.pop("q"), a.pop("kv"), a.pop("bt"), a.pop("sl"))

        def call():
            out, lse = mladcp.decode(*args, softmax_scale=case.scale, q_len=2, **a)
            return out.clone(), None if lse is None else lse.clone()

        (k1, r1), (k2, r2) = _both_paths(exchange, call)
        assert k1 == k2 == "ok", (over, r1, r2)
        assert torch.equal(r1[0], r2[0]) and not torch.isnan(r1[0]).any(), over
        assert (r1[1] is None) == (r2[1] is None) and (r1[1] is None or torch.equal(r1[1], r2[1])), over
    # the torch entry takes the common call itself, and leaves anything else to the generic path
    out, lse = torch.empty(6, 8, 512), torch.empty(6, 8)
    entry = mladcp._mladcp._decode_torch
    assert entry(q, kv, bt, sl, out, lse, case.scale, 2, None, "e", None, None, None, 0, None, True) is True
    assert entry(case.q, kv, bt, sl, out, lse, case.scale, 2, None, "e", None, None, None, 0, None, True) is False
    assert entry(q, kv, bt, sl, out, lse, case.scale, 2, torch.tensor(1.0), "e", None, None, None, 0, None,
                 True) is False
    assert entry(q, kv, bt, sl, out, lse, "x", 2, None, "e", None, None, None, 0, None, True) is False
    o1, _ = mladcp.decode(q, kv.view(torch.int16).numpy().view(np.uint16), bt, sl, softmax_scale=case.scale, q_len=2,
                          out_dtype="fp32")  # torch and numpy together: the generic path
    assert torch.equal(o1, out)
    sub = torch.nn.Parameter(q, requires_grad=False)  # a subclass of torch.Tensor: the capsule path
    assert entry(sub, kv, bt, sl, out, lse, case.scale, 2, None, "e", None, None, None, 0, None, True) is False
    o2, _ = mladcp.decode(sub, kv, bt, sl, softmax_scale=case.scale, q_len=2, out_dtype="fp32")
    assert torch.equal(o2, out)


def test_bad_torch_inputs_raise_the_same_on_both_paths(rng, exchange):
    """Every refusal of the exchange path is the capsule path's: same exception type, same message, nothing
    written."""
    case = make_case(rng, batch=2, heads=4, lens=(20, 11), block_size=16)
    q, kv, bt, sl = as_torch(case)
    out = torch.full((2, 4, 512), 3.0)
    lse = torch.full((2, 4), 3.0)
    bad_bt = bt.clone()
    bad_bt[1, 0] = 10_000
    bad = [
        dict(q=q.double()),
        dict(q=q.view(1, 2, 1, 4, 576)),
        dict(q=torch.zeros(2, 4, 1152, dtype=torch.bfloat16)[:, :, ::2]),
        dict(q=q.unsqueeze(0)),
        dict(kv=kv[:1].expand(kv.shape[0], -1, -1)),
        dict(kv=kv.float()),
        dict(bt=bt.long()),
        dict(bt=bad_bt),
        dict(sl=sl[None]),
        dict(sl=sl[:1]),
        dict(out=torch.full((2, 4, 512), 3.0, dtype=torch.float64)),
        dict(out=torch.full((8, 2, 512), 3.0).transpose(0, 1)),
        dict(lse=torch.full((2, 5), 3.0)),
        dict(lse=torch.full((2, 4), 3, dtype=torch.int32)),
        dict(q_len=0),
        dict(q_len=17),
        dict(lse_base="x"),
        dict(lse_base=None),
        dict(split_policy="bad"),
        dict(backend="nope"),
        dict(backend="cuda"),
        dict(max_seq_len=-1),
        dict(kv_scale=0.5),
        dict(shard=mladcp.Shard(2, 0, 3)),
        dict(shard="not a shard"),
        dict(kv=np.zeros((kv.shape[0], 16, 576), np.float32)),
        dict(stream="bad"),
        dict(softmax_scale="x"),
        dict(check_block_ids="yes"),
    ]
    for over in bad:
        a = dict(q=q, kv=kv, bt=bt, sl=sl, out=out, lse=lse, softmax_scale=case.scale)
        a.update(over)
        args = (a.pop("q"), a.pop("kv"), a.pop("bt"), a.pop("sl"))
        (k1, m1), (k2, m2) = _both_paths(exchange, lambda: mladcp.decode(*args, **a))
        assert k1 is not str and k1 != "ok", (over, m1)
        assert (k1, m1) == (k2, m2), over
        assert (out == 3.0).all() and (lse == 3.0).all(), over


def test_without_a_usable_exchange_api_decode_takes_the_capsule_path(rng, monkeypatch):
    """A torch without __dlpack_c_exchange_api__ (before 2.10), or with a table the binding cannot read, leaves
    _decode_torch unset: decode and the ops take the capsule path and compute the same."""
    import os
    import types

    from mladcp import _frameworks as fw

    C = mladcp._mladcp
    case = make_case(rng, batch=2, heads=8, lens=(40, 5), block_size=16)
    q, kv, bt, sl = as_torch(case)
    ref_out, ref_lse = reference(case)
    try:
        # torch.Tensor as a torch without the attribute would have it
        monkeypatch.setattr(fw, "_TorchTensor", types.new_class("TensorWithoutExchangeApi"))
        assert fw.use_torch_exchange(True) is False
        monkeypatch.undo()
        assert fw._decode_torch is None and not C._torch_exchange_ready()
        # tables the binding refuses: none, a null or foreign address, a capsule of another name
        for api in (None, 0, "x", 1.5, torch._C._to_dlpack(torch.empty(0))):
            assert C._set_torch_exchange(torch.Tensor, api) is False, api
            assert not C._torch_exchange_ready()
        assert C._set_torch_exchange(None, None) is False
        out, lse = mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out_dtype="fp32")
        np.testing.assert_allclose(out.numpy(), ref_out, atol=2e-2)
        np.testing.assert_allclose(lse.numpy(), ref_lse, atol=1e-4)
        o2, l2 = torch.ops.mladcp.decode(q, kv, bt, sl, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0, "fp32")
        assert torch.equal(o2, out) and torch.equal(l2, lse)
    finally:
        monkeypatch.undo()
        fw.use_torch_exchange(not os.environ.get("MLADCP_NO_DLPACK_C_API"))


def test_exchange_path_at_import_follows_torch_and_the_environment():
    """Importing mladcp with torch turns the exchange path on where torch has the API, and
    MLADCP_NO_DLPACK_C_API=1 keeps it off."""
    import os
    import subprocess
    import sys

    code = ("import torch, mladcp; from mladcp import _frameworks as fw; "
            "print(fw._decode_torch is not None, mladcp._mladcp._torch_exchange_ready(), "
            "hasattr(torch.Tensor, '__dlpack_c_exchange_api__') or hasattr(torch.Tensor, '__c_dlpack_exchange_api__'))")
    env = {k: v for k, v in os.environ.items() if k != "MLADCP_NO_DLPACK_C_API"}
    lines = []
    for extra in ({}, {"MLADCP_NO_DLPACK_C_API": "1"}):
        p = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, p.stderr
        lines.append(p.stdout.split())
    has_api = lines[0][2] == "True"
    assert lines[0][:2] == [str(has_api)] * 2
    assert lines[1][:2] == ["False", "False"]
