"""CUDA tensors (torch): decode against the cpu-reference oracle, the caller's current stream and stream=,
CUDA-graph capture and replay, the workspace rule under capture, opcheck on the device, device mismatches, the
drop-in calls against FlashMLA itself when it is importable (MLADCP_FLASHMLA_PATH or on sys.path), and cupy.
Skipped without a GPU, a CUDA build of mladcp, or torch with CUDA."""
import math
import os
import sys

import numpy as np
import pytest
from conftest import make_case, reference, torch_or_skip

import mladcp

torch = torch_or_skip()


def assert_gpu_close(got, want):
    """The cuda backend's accuracy (docs/cuda.md, Precision): probabilities enter P·V as bf16, so an output
    element carries up to 2^-9 of its row's largest value; checked at 2^-8 relative plus 2^-8 of the output
    scale, as the C++ GPU tests do."""
    np.testing.assert_allclose(got, want, rtol=2.0**-8, atol=2.0**-8 * float(np.abs(want).max()))
if not (mladcp.cuda_built and torch.cuda.is_available()):
    pytest.skip("no GPU, or mladcp/torch built without CUDA", allow_module_level=True)


def cuda_case(case, device="cuda"):
    def bf(a):
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).to(device)

    return (bf(case.q), bf(case.kv), torch.from_numpy(case.block_table).to(device),
            torch.from_numpy(case.seq_lens).to(device))


def test_workspace_is_never_allocated_during_capture(rng):
    """A call that needs more workspace than any call before it in this process, inside a capture: it must
    refuse (and say why) instead of allocating."""
    small = make_case(rng, batch=1, heads=16, lens=(64,), block_size=64)
    mladcp.decode(*cuda_case(small), softmax_scale=small.scale)  # creates the backend outside capture
    torch.cuda.synchronize()
    case = make_case(rng, batch=4, heads=128, lens=(16000,) * 4, q_len=1, block_size=64, spare_blocks=0)
    q, kv, bt, sl = cuda_case(case)
    out = torch.empty(q.shape[0], 128, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(q.shape[0], 128, device="cuda")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError) as err:
        with torch.cuda.graph(g):
            mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out, lse=lse)
    text = str(err.value) + str(err.value.__cause__ or "") + str(err.value.__context__ or "")
    assert "warm-up" in text or "capture" in text, text
    torch.cuda.synchronize()


@pytest.mark.parametrize("q_len", [1, 3])
@pytest.mark.parametrize("out_dtype", ["bf16", "fp32"])
def test_cuda_decode_matches_reference(rng, q_len, out_dtype):
    case = make_case(rng, batch=4, heads=16, lens=(300, 1 + q_len, 0, 129), q_len=q_len, block_size=64)
    q, kv, bt, sl = cuda_case(case)
    out, lse = mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, q_len=q_len, out_dtype=out_dtype)
    assert out.is_cuda and lse.is_cuda
    ro, rl = reference(case)
    torch.cuda.synchronize()
    assert_gpu_close(out.float().cpu().numpy(), ro)
    np.testing.assert_allclose(lse.cpu().numpy(), rl, atol=1e-3)


def test_current_stream_explicit_stream_and_graph_replay(rng):
    case = make_case(rng, batch=3, heads=16, lens=(200, 64, 5), block_size=64)
    q, kv, bt, sl = cuda_case(case)
    out = torch.full((3, 16, 512), float("nan"), device="cuda")
    lse = torch.full((3, 16), float("nan"), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the current stream
        torch.cuda._sleep(50_000_000)  # the decode must queue behind this on `side`
        mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out, lse=lse)
    side.synchronize()
    ro, rl = reference(case)
    assert_gpu_close(out.cpu().numpy(), ro)
    other = torch.cuda.Stream()
    out2 = torch.full_like(out, float("nan"))
    mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out2, lse=False, stream=other)
    other.synchronize()
    assert torch.equal(out2, out)  # deterministic, same kernel
    # Graph capture: warm-up once, capture on torch's capture stream, replay with new query values.
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out, lse=lse)
    case2 = make_case(rng, batch=3, heads=16, lens=(200, 64, 5), block_size=64)
    q.copy_(cuda_case(case2)[0])
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    case.q = case2.q
    ro2, rl2 = reference(case)
    assert_gpu_close(out.cpu().numpy(), ro2)
    np.testing.assert_allclose(lse.cpu().numpy(), rl2, atol=1e-3)


def test_workspace_is_allocated_once_and_reused(rng):
    case = make_case(rng, batch=2, heads=64, lens=(3000, 2000), block_size=64)
    q, kv, bt, sl = cuda_case(case)
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 64, device="cuda")
    mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out, lse=lse)
    held = mladcp._mladcp._workspace_info(q.get_device())
    for _ in range(20):
        mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out, lse=lse)
    assert mladcp._mladcp._workspace_info(q.get_device()) == held
    torch.cuda.synchronize()


def test_custom_ops_on_cuda(rng):
    case = make_case(rng, batch=2, heads=16, lens=(100, 30), block_size=64)
    q, kv, bt, sl = cuda_case(case)
    args = (q, kv, bt, sl, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0, "bf16")
    torch.library.opcheck(torch.ops.mladcp.decode.default, args)
    o = torch.empty(2, 16, 512, dtype=torch.bfloat16, device="cuda")
    l = torch.empty(2, 16, device="cuda")
    torch.library.opcheck(torch.ops.mladcp.decode_out.default,
                          (q, kv, bt, sl, o, l, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0))
    outs, lses = torch.randn(3, 2, 16, 512, device="cuda"), torch.randn(3, 2, 16, device="cuda")
    torch.library.opcheck(torch.ops.mladcp.merge.default, (outs, lses, "e", "", ""))
    m, ml = torch.ops.mladcp.merge(outs, lses, "e", "", "fp32")
    torch.testing.assert_close(ml, torch.logsumexp(lses, 0), atol=1e-5, rtol=1e-5)
    # the op under graph capture
    torch.ops.mladcp.decode_out(q, kv, bt, sl, o, l, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0)
    g = torch.cuda.CUDAGraph()
    o.zero_()
    with torch.cuda.graph(g):
        torch.ops.mladcp.decode_out(q, kv, bt, sl, o, l, case.scale, 1, 1.0, "e", "", 1, 0, 1, "", 0)
    g.replay()
    torch.cuda.synchronize()
    ro, rl = reference(case)
    np.testing.assert_allclose(o.float().cpu().numpy(), ro, atol=2e-2)


def test_device_mismatch_and_fp8_cache(rng):
    case = make_case(rng, batch=2, heads=16, lens=(70, 9), block_size=64)
    q, kv, bt, sl = cuda_case(case)
    out = torch.full((2, 16, 512), 3.0, device="cuda")
    with pytest.raises(ValueError, match="same device"):
        mladcp.decode(q, kv, bt.cpu(), sl, softmax_scale=case.scale, out=out, lse=False)
    with pytest.raises(ValueError, match="host memory"):
        mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale, out=out, lse=False, backend="cpu")
    assert (out == 3.0).all()
    # fp8 cache written on the device by write_kv_cache, decoded on the device and by the oracle on the host
    vals = torch.randn(79, 576, device="cuda")
    cache = torch.zeros(4, 64, 576, dtype=torch.float8_e4m3fn, device="cuda")
    bt8 = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="cuda")
    seq_ids = torch.tensor([0] * 70 + [1] * 9, dtype=torch.int32, device="cuda")
    pos = torch.cat([torch.arange(70), torch.arange(9)]).to("cuda")
    slots = mladcp.compute_slot_mapping(seq_ids, pos, bt8, 64)
    mladcp.write_kv_cache(vals[:, :512], vals[:, 512:], slots, cache, kv_scale=0.5)
    o8, l8 = mladcp.decode(q, cache, bt8, sl, softmax_scale=case.scale, kv_scale=0.5, out_dtype="fp32")
    host_cache = cache.cpu().view(torch.uint8).numpy()
    ro, rl = mladcp.decode(case.q, host_cache, bt8.cpu().numpy(), case.seq_lens, softmax_scale=case.scale,
                           kv_scale=0.5, out_dtype="fp32", backend="cpu-reference")
    assert_gpu_close(o8.cpu().numpy(), ro)
    np.testing.assert_allclose(l8.cpu().numpy(), rl, atol=1e-3)


@pytest.mark.parametrize("adopt", [True, False])
def test_dcp_decoder_over_a_one_rank_nccl_group(rng, tmp_path, adopt):
    """DcpDecoder on a torch.distributed NCCL group of one rank, beside torch's own NCCL: adopting torch's
    communicator where the rule allows it (torch's NCCL is the module's library instance), else creating its
    own; equals mladcp.decode; tensors on another device than the communicator's are refused and nothing is
    written; the step is captured in a CUDA graph and replayed."""
    import torch.distributed as dist

    from mladcp.dcp import _torch_nccl_owner

    if not mladcp._mladcp._nccl_available():
        pytest.skip("this build of mladcp has no NCCL communicator")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", torch.cuda.current_device()))
    try:
        dec = mladcp.DcpDecoder(adopt_communicator=adopt, merge="a2a")
        info = mladcp.nccl_library()
        shared = mladcp._mladcp._nccl_library_shared_with(_torch_nccl_owner(torch))
        print(f"adopt={adopt}: torch NCCL {torch.cuda.nccl.version()}, mladcp NCCL {info['version']} "
              f"({info['path']}), shared: {shared}; {dec.adoption}")
        assert info["loaded"] and info["private_copy"], info
        if not (adopt and shared):
            assert not dec.adopted, dec.adoption
        assert (dec.world, dec.rank, dec.communicator, dec.backend) == (1, 0, "nccl", "cuda")
        case = make_case(rng, batch=3, heads=16, lens=(500, 2, 0), q_len=2, block_size=64)
        q, kv, bt, sl = cuda_case(case)
        out, lse = dec.decode(q, kv, bt, sl, softmax_scale=case.scale, q_len=2, lse=True, out_dtype="fp32")
        torch.cuda.synchronize()
        ro, rl = reference(case)
        assert_gpu_close(out.cpu().numpy(), ro)
        np.testing.assert_allclose(lse.cpu().numpy(), rl, atol=1e-3)
        host_out = np.full((6, 16, 512), 3.0, np.float32)
        with pytest.raises(ValueError, match="communicator"):
            dec.decode(case.q, case.kv, case.block_table, case.seq_lens, softmax_scale=case.scale, q_len=2,
                       out=host_out)
        assert (host_out == 3.0).all()
        # The whole step captured in a CUDA graph (after the warm-up above) and replayed on new queries.
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dec.decode(q, kv, bt, sl, softmax_scale=case.scale, q_len=2, out=out, lse=lse)
        case2 = make_case(rng, batch=3, heads=16, lens=(500, 2, 0), q_len=2, block_size=64)
        q.copy_(cuda_case(case2)[0])
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        case.q = case2.q
        ro2, rl2 = reference(case)
        assert_gpu_close(out.cpu().numpy(), ro2)
        np.testing.assert_allclose(lse.cpu().numpy(), rl2, atol=1e-3)
        # torch's own collectives still work beside the module's NCCL.
        x = torch.full((4,), 2.0, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        assert (x == 2.0).all()
        del dec
    finally:
        torch.cuda.synchronize()
        dist.destroy_process_group()


def _flash_mla():
    path = os.environ.get("MLADCP_FLASHMLA_PATH")
    if path:
        sys.path.insert(0, path)
    try:
        import flash_mla  # noqa: PLC0415
    except ImportError:
        pytest.skip("FlashMLA is not importable (build ../shared/peers/flashmla, set MLADCP_FLASHMLA_PATH)")
    return flash_mla


@pytest.mark.parametrize("s_q", [1, 2])
def test_flash_mla_drop_in_against_flashmla(rng, s_q):
    flash_mla = _flash_mla()
    case = make_case(rng, batch=4, heads=64, lens=(900, 0, 65, 3000), q_len=s_q, block_size=64)
    q, kv, bt, sl = cuda_case(case)
    q4, kv4 = q.view(4, s_q, 64, 576), kv.unsqueeze(2)
    meta, splits = flash_mla.get_mla_metadata(sl, s_q * 64, 1)
    ref_out, ref_lse = flash_mla.flash_mla_with_kvcache(q4, kv4, bt, sl, 512, meta, splits,
                                                        softmax_scale=case.scale, causal=True)
    m2, s2 = mladcp.get_mla_metadata(sl, s_q * 64, 1)
    out, lse = mladcp.flash_mla_with_kvcache(q4, kv4, bt, sl, 512, m2, s2, softmax_scale=case.scale, causal=True)
    torch.cuda.synchronize()
    assert out.shape == ref_out.shape and lse.shape == ref_lse.shape and out.dtype == ref_out.dtype
    nonempty = [0, 2, 3]
    torch.testing.assert_close(out[nonempty].float(), ref_out[nonempty].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[nonempty], ref_lse[nonempty], atol=1e-3, rtol=1e-4)
    print("empty row: FlashMLA lse", ref_lse[1].flatten()[:2].tolist(), "out max", ref_out[1].abs().max().item(),
          "| mladcp lse", lse[1].flatten()[:2].tolist())
    torch.testing.assert_close(lse[1], ref_lse[1])  # the empty row's convention
    assert (out[1] == 0).all()


def test_cupy_tensors(rng):
    cupy = pytest.importorskip("cupy", reason="cupy is not installed")
    case = make_case(rng, batch=2, heads=16, lens=(80, 33), block_size=64)
    q, kv = cupy.asarray(case.q), cupy.asarray(case.kv)
    bt, sl = cupy.asarray(case.block_table), cupy.asarray(case.seq_lens)
    out, lse = mladcp.decode(q, kv, bt, sl, softmax_scale=case.scale)
    cupy.cuda.get_current_stream().synchronize()
    ro, rl = reference(case)
    assert_gpu_close(cupy.asnumpy(out), ro)
    np.testing.assert_allclose(cupy.asnumpy(lse), rl, atol=1e-3)
    assert math.isfinite(float(cupy.asnumpy(lse).max()))
