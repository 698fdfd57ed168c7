// decode, merge, write_kv_cache, slot mapping, the backend table and Shard.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common.h"

namespace mladcp::py {

namespace {

// Token layout of a [T, H, X] or [B, q_len, H, X] tensor: number of tokens and the token stride.
// Size-1 dimensions carry arbitrary strides in some frameworks; they are ignored (0 = contiguous default).
struct Tokens {
  int64_t count = 0;
  int64_t stride = 0;
};

Tokens token_layout(const View& v, int token_dims, int q_len, const char* expected) {
  Tokens t;
  if (token_dims == 1) {
    t.count = v.shape[0];
    t.stride = v.shape[0] > 1 ? v.stride[0] : 0;
    return t;
  }
  // [B, q_len, ...]
  if (v.shape[1] != q_len)
    throw_invalid(std::string(v.name) + ": " + describe_shape(v) + " has " + std::to_string(v.shape[1]) +
                  " tokens per sequence in dimension 1 but q_len=" + std::to_string(q_len) + "; expected " + expected);
  t.count = v.shape[0] * v.shape[1];
  if (v.shape[1] == 1) {
    t.stride = v.shape[0] > 1 ? v.stride[0] : 0;
  } else {
    t.stride = v.stride[1];
    if (v.shape[0] > 1 && v.stride[0] != v.shape[1] * v.stride[1])
      throw_invalid(std::string(v.name) + ": " + describe_shape(v) +
                    ": the sequence stride must equal q_len × the token stride (tokens evenly spaced); expected " +
                    expected);
  }
  return t;
}

int64_t stride_or_default(const View& v, int dim) { return v.shape[dim] > 1 ? v.stride[dim] : 0; }

void check_size(const View& v, int dim, int64_t want, const char* what) {
  if (v.shape[dim] != want)
    throw_invalid(std::string(v.name) + ": " + describe_shape(v) + ": dimension " + std::to_string(dim) + " is " +
                  std::to_string(v.shape[dim]) + " but " + what + " is " + std::to_string(want));
}

LseBase lse_base_arg(std::string_view s, const char* name) {
  auto b = parse_lse_base(s);
  if (!b) throw_invalid(std::string(name) + "='" + std::string(s) + "': accepted 'e' (natural log) or '2' (log2)");
  return *b;
}

// ---- decode ---------------------------------------------------------------------------------------------

}  // namespace

DecodeCall parse_decode(const Tensor& q_t, const Tensor& kv_t, const Tensor& bt_t, const Tensor& sl_t,
                        const MutTensor& out_t, const std::optional<MutTensor>& lse_t, float softmax_scale, int q_len,
                        float kv_scale, const std::string& lse_base, const DcpShard& shard,
                        const std::string& split_policy, int64_t max_seq_len, bool check_block_ids) {
  const View q = view_of("q", q_t), kv = view_of("kv_cache", kv_t), bt = view_of("block_table", bt_t),
             sl = view_of("seq_lens", sl_t), out = view_of("out", out_t);
  View lse;
  if (lse_t) lse = view_of("lse", *lse_t);
  return parse_decode(q, kv, bt, sl, out, lse_t ? &lse : nullptr, softmax_scale, q_len, kv_scale, lse_base, shard,
                      split_policy, max_seq_len, check_block_ids);
}

DecodeCall parse_decode(const View& q, const View& kv, const View& bt, const View& sl, const View& out,
                        const View* lse_v, float softmax_scale, int q_len, float kv_scale, std::string_view lse_base,
                        const DcpShard& shard, std::string_view split_policy, int64_t max_seq_len,
                        bool check_block_ids) {
  const char* q_shape = "[T, H, 576] or [B, q_len, H, 576]";
  const char* out_shape = "[T, H, 512] or [B, q_len, H, 512]";
  const bool lse_t = lse_v != nullptr;
  const View& lse = lse_t ? *lse_v : q;  // read only when lse_t
  if (q_len < 1 || q_len > kMaxQLen)
    throw_invalid("q_len=" + std::to_string(q_len) + ": accepted 1.." + std::to_string(kMaxQLen));

  require_ndim(q, 3, 4, q_shape);
  require_float(q, {DType::kBF16, DType::kFP16, DType::kFP32});
  require_last_contiguous(q, q_shape);
  require_ndim(kv, 3, 4, "[num_blocks, block_size, 576] or [num_blocks, block_size, 1, 576]");
  require_float(kv, {DType::kBF16, DType::kFP8E4M3});
  require_last_contiguous(kv, "[num_blocks, block_size, 576]");
  require_ndim(bt, 2, 2, "[B, max_blocks_per_seq] int32");
  require_int32(bt);
  require_last_contiguous(bt, "[B, max_blocks_per_seq] int32 with contiguous rows");
  require_ndim(sl, 1, 1, "[B] int32");
  require_int32(sl);
  require_last_contiguous(sl, "[B] int32, contiguous");
  require_ndim(out, 3, 4, out_shape);
  require_float(out, {DType::kBF16, DType::kFP32});
  require_last_contiguous(out, out_shape);
  if (lse_t) {
    require_ndim(lse, 2, 3, "[T, H] or [B, q_len, H] fp32");
    require_float(lse, {DType::kFP32});
    require_last_contiguous(lse, "[T, H] or [B, q_len, H] fp32 with contiguous heads");
  }
  DecodeCall call;
  int& device = call.device;
  const Mem mem = call.mem = lse_t ? common_memory({&q, &kv, &bt, &sl, &out, &lse}, &device)
                                   : common_memory({&q, &kv, &bt, &sl, &out}, &device);

  check_size(q, q.ndim - 1, kQkDim, "the query width [q_nope·W_UK | q_pe]");
  const Tokens qt = token_layout(q, q.ndim - 2, q_len, q_shape);
  const int64_t H = q.shape[q.ndim - 2];
  if (qt.count % q_len != 0)
    throw_invalid("q: " + describe_shape(q) + ": " + std::to_string(qt.count) +
                  " tokens is not a multiple of q_len=" + std::to_string(q_len));
  const int64_t B = qt.count / q_len;
  if (kv.ndim == 4) check_size(kv, 2, 1, "the number of KV heads (MLA has one)");
  check_size(kv, kv.ndim - 1, kQkDim, "the latent width [kv_c | k_pe]");
  check_size(bt, 0, B, "the number of sequences (q tokens / q_len)");
  check_size(sl, 0, B, "the number of sequences (q tokens / q_len)");
  check_size(out, out.ndim - 1, kLatentDim, "the output width");
  check_size(out, out.ndim - 2, H, "the number of heads of q");
  const Tokens ot = token_layout(out, out.ndim - 2, q_len, out_shape);
  if (ot.count != qt.count)
    throw_invalid("out: " + describe_shape(out) + " holds " + std::to_string(ot.count) + " tokens but q holds " +
                  std::to_string(qt.count));
  Tokens lt;
  if (lse_t) {
    check_size(lse, lse.ndim - 1, H, "the number of heads of q");
    lt = token_layout(lse, lse.ndim - 1, q_len, "[T, H] or [B, q_len, H] fp32");
    if (lt.count != qt.count)
      throw_invalid("lse: " + describe_shape(lse) + " holds " + std::to_string(lt.count) + " tokens but q holds " +
                    std::to_string(qt.count));
  }
  for (const View* v : {&q, &kv, &bt, &out})
    for (int d = 0; d < v->ndim; ++d)
      if (v->shape[d] > INT32_MAX) throw_invalid(std::string(v->name) + ": dimension too large");

  MlaDecodeParams& p = call.params;
  p.num_seqs = int(B);
  p.q_len = q_len;
  p.num_heads = int(H);
  p.q = q.data;
  p.q_dtype = q.dtype;
  p.q_stride_token = qt.stride;
  p.q_stride_head = stride_or_default(q, q.ndim - 2);
  p.kv_cache = kv.data;
  p.kv_dtype = kv.dtype;
  p.kv_scale = kv_scale;
  p.num_blocks = int(kv.shape[0]);
  p.block_size = int(kv.shape[1]);
  p.kv_stride_block = stride_or_default(kv, 0);
  p.kv_stride_token = stride_or_default(kv, 1);
  p.block_table = static_cast<const int32_t*>(bt.data);
  p.max_blocks_per_seq = int(bt.shape[1]);
  p.block_table_stride = stride_or_default(bt, 0);
  p.seq_lens = static_cast<const int32_t*>(sl.data);
  p.softmax_scale = softmax_scale;
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.out_stride_token = ot.stride;
  p.out_stride_head = stride_or_default(out, out.ndim - 2);
  if (lse_t) {
    p.lse = static_cast<float*>(lse.data);
    p.lse_stride_token = lt.stride;
  }
  p.lse_base = lse_base_arg(lse_base, "lse_base");
  p.shard = shard;
  auto policy = parse_split_policy(split_policy);
  if (!policy)
    throw_invalid("split_policy='" + std::string(split_policy) + "': accepted 'invariant' (default) or 'fill'");
  p.split_policy = *policy;
  p.check_block_ids = check_block_ids;
  if (max_seq_len < 0 || max_seq_len > INT32_MAX)
    throw_invalid("max_seq_len=" + std::to_string(max_seq_len) + ": must be in [0, 2^31)");
  p.max_seq_len = int(max_seq_len);
  if (mem == Mem::kCuda && p.max_seq_len == 0) {
    // No host read of seq_lens on a device: bound the lengths by what the block table can address.
    const int64_t bound = int64_t(p.max_blocks_per_seq) * p.block_size * std::max(1, shard.world);
    p.max_seq_len = int(std::min<int64_t>(bound, INT32_MAX));
  }
  return call;
}

namespace {

// Runs a checked call on the backend `backend_name` ("" picks by memory) on `stream`.
void run_decode(const DecodeCall& call, std::string_view backend_name, void* stream) {
  const MlaDecodeParams& p = call.params;
  const Mem mem = call.mem;
  const int device = call.device;
  Backend& be = backend_for(backend_name, mem, device);
  DeviceGuard guard(mem == Mem::kCuda ? device : -1);
  ExecContext ctx;
  ctx.stream = stream;
  if (p.num_seqs > 0) {
    ctx.workspace_size = be.workspace_bytes(p);
    ctx.workspace = workspace(mem, device, ctx.workspace_size, ctx.stream, "decode");
  }
  Status s;
  if (mem == Mem::kHost) {
    nb::gil_scoped_release release;
    s = be.decode(p, ctx);
  } else {
    s = be.decode(p, ctx);
  }
  throw_if_error(s);
}

void decode(const Tensor& q_t, const Tensor& kv_t, const Tensor& bt_t, const Tensor& sl_t, const MutTensor& out_t,
            const std::optional<MutTensor>& lse_t, float softmax_scale, int q_len, float kv_scale,
            const std::string& lse_base, const std::string& backend_name, const DcpShard& shard,
            const std::string& split_policy, int64_t max_seq_len, uintptr_t stream, bool check_block_ids) {
  const DecodeCall call = parse_decode(q_t, kv_t, bt_t, sl_t, out_t, lse_t, softmax_scale, q_len, kv_scale, lse_base,
                                       shard, split_policy, max_seq_len, check_block_ids);
  run_decode(call, backend_name, reinterpret_cast<void*>(stream));
}

// A str argument (None: ""), as a view of its UTF-8 text (alive as long as the str).
bool str_or_none(nb::handle h, std::string_view* out) {
  if (h.is_none()) {
    *out = {};
    return true;
  }
  if (!PyUnicode_Check(h.ptr())) return false;
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(h.ptr(), &size);
  if (!text) {
    PyErr_Clear();
    return false;
  }
  *out = std::string_view(text, size_t(size));
  return true;
}

// decode() for torch tensors, read through torch's DLPack C exchange API: no capsule per tensor, one
// nanobind call of plain objects, the current stream asked from torch in C++. Returns False, having done
// nothing, unless q, kv_cache, block_table, seq_lens, out and lse (or None) are all exactly torch.Tensor,
// torch describes each and every other argument has the type _decode takes (kv_scale may be None for
// 1.0, backend and split_policy None for "", shard None for the default, stream None for the current
// stream of q's device): the caller then takes the generic path, which raises what it raises. Otherwise the checks,
// their order and their messages are those of _decode (the same parse_decode on the same views).
bool decode_torch(nb::handle q_h, nb::handle kv_h, nb::handle bt_h, nb::handle sl_h, nb::handle out_h, nb::handle lse_h,
                  nb::handle scale_h, nb::handle q_len_h, nb::handle kv_scale_h, nb::handle lse_base_h,
                  nb::handle backend_h, nb::handle shard_h, nb::handle policy_h, nb::handle max_seq_len_h,
                  nb::handle stream_h, nb::handle check_h) {
  PyObject* const objs[6] = {q_h.ptr(),  kv_h.ptr(),  bt_h.ptr(),
                             sl_h.ptr(), out_h.ptr(), lse_h.is_none() ? nullptr : lse_h.ptr()};
  DLTensorC dl[6];
  if (!torch_describe(objs, dl, 6)) return false;
  float softmax_scale = 0, kv_scale = 1;
  int q_len = 1;
  int64_t max_seq_len = 0;
  uintptr_t stream = 0;
  bool check_block_ids = true;
  std::string_view lse_base, backend, policy;
  DcpShard shard;
  // kv_scale: None (1.0) or a Python float or int; anything else (a tensor: decode refuses a CUDA one rather
  // than synchronize) is for the generic path.
  const bool kv_scale_number = PyFloat_Check(kv_scale_h.ptr()) || PyLong_Check(kv_scale_h.ptr());
  if (!nb::try_cast(scale_h, softmax_scale) || !nb::try_cast(q_len_h, q_len) ||
      !(kv_scale_h.is_none() || (kv_scale_number && nb::try_cast(kv_scale_h, kv_scale))) ||
      !PyUnicode_Check(lse_base_h.ptr()) || !str_or_none(lse_base_h, &lse_base) || !str_or_none(backend_h, &backend) ||
      !str_or_none(policy_h, &policy) || !nb::try_cast(max_seq_len_h, max_seq_len) ||
      !(stream_h.is_none() || nb::try_cast(stream_h, stream)) || !nb::try_cast(check_h, check_block_ids))
    return false;
  if (!shard_h.is_none() && !nb::try_cast(shard_h, shard)) return false;
  const View q = view_of("q", dl[0]), kv = view_of("kv_cache", dl[1]), bt = view_of("block_table", dl[2]),
             sl = view_of("seq_lens", dl[3]), out = view_of("out", dl[4]);
  View lse;
  if (objs[5]) lse = view_of("lse", dl[5]);
  const DecodeCall call = parse_decode(q, kv, bt, sl, out, objs[5] ? &lse : nullptr, softmax_scale, q_len, kv_scale,
                                       lse_base, shard, policy, max_seq_len, check_block_ids);
  void* s = reinterpret_cast<void*>(stream);
  if (stream_h.is_none() && call.mem == Mem::kCuda) s = torch_current_stream(call.device);
  run_decode(call, backend, s);
  return true;
}

// The C++ side of the host-overhead benchmark: the same call as decode(), parsed once, then `iters` calls
// of Backend::decode timed on the host (enqueue time on a device). Returns nanoseconds per call.
double time_cpp_decode(const Tensor& q_t, const Tensor& kv_t, const Tensor& bt_t, const Tensor& sl_t,
                       const MutTensor& out_t, const std::optional<MutTensor>& lse_t, float softmax_scale, int q_len,
                       const std::string& backend_name, uintptr_t stream, int iters) {
  DecodeCall call =
      parse_decode(q_t, kv_t, bt_t, sl_t, out_t, lse_t, softmax_scale, q_len, 1.0f, "e", DcpShard{}, "", 0, true);
  Backend& be = backend_for(backend_name, call.mem, call.device);
  DeviceGuard guard(call.mem == Mem::kCuda ? call.device : -1);
  ExecContext ctx;
  ctx.stream = reinterpret_cast<void*>(stream);
  ctx.workspace_size = be.workspace_bytes(call.params);
  ctx.workspace = workspace(call.mem, call.device, ctx.workspace_size, ctx.stream, "decode");
  nb::gil_scoped_release release;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) throw_if_error(be.decode(call.params, ctx));
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / std::max(1, iters);
}

// ---- merge ----------------------------------------------------------------------------------------------

void merge(const Tensor& outs_t, const Tensor& lses_t, const MutTensor& out_t,
           const std::optional<MutTensor>& out_lse_t, const std::string& in_base, const std::string& out_base,
           uintptr_t stream) {
  View outs = view_of("outs", outs_t), lses = view_of("lses", lses_t), out = view_of("out", out_t), out_lse;
  if (out_lse_t) out_lse = view_of("out_lse", *out_lse_t);
  require_ndim(outs, 4, 4, "[N, T, H, D]");
  require_float(outs, {DType::kBF16, DType::kFP16, DType::kFP32});
  require_last_contiguous(outs, "[N, T, H, D]");
  require_ndim(lses, 3, 3, "[N, T, H] fp32");
  require_float(lses, {DType::kFP32});
  require_last_contiguous(lses, "[N, T, H] fp32 with contiguous heads");
  require_ndim(out, 3, 3, "[T, H, D]");
  require_float(out, {DType::kBF16, DType::kFP16, DType::kFP32});
  require_last_contiguous(out, "[T, H, D]");
  if (out_lse_t) {
    require_ndim(out_lse, 2, 2, "[T, H] fp32");
    require_float(out_lse, {DType::kFP32});
    require_last_contiguous(out_lse, "[T, H] fp32 with contiguous heads");
  }
  int device = -1;
  const Mem mem =
      out_lse_t ? common_memory({&outs, &lses, &out, &out_lse}, &device) : common_memory({&outs, &lses, &out}, &device);
  for (int d = 0; d < 3; ++d) check_size(lses, d, outs.shape[d], "the matching dimension of outs [N, T, H, D]");
  for (int d = 0; d < 3; ++d) check_size(out, d, outs.shape[d + 1], "the matching dimension of outs [N, T, H, D]");
  if (out_lse_t)
    for (int d = 0; d < 2; ++d)
      check_size(out_lse, d, outs.shape[d + 1], "the matching dimension of outs [N, T, H, D]");

  MergeParams p;
  p.num_states = int(outs.shape[0]);
  p.num_tokens = int(outs.shape[1]);
  p.num_heads = int(outs.shape[2]);
  p.head_dim = int(outs.shape[3]);
  p.in_out = outs.data;
  p.in_dtype = outs.dtype;
  // Strides of size-1 dimensions are ignored; a 0 takes the contiguous default.
  p.in_stride_state = stride_or_default(outs, 0);
  p.in_stride_token = stride_or_default(outs, 1);
  p.in_stride_head = stride_or_default(outs, 2);
  p.in_lse = static_cast<const float*>(lses.data);
  p.lse_stride_state = stride_or_default(lses, 0);
  p.lse_stride_token = stride_or_default(lses, 1);
  p.in_base = lse_base_arg(in_base, "lse_base");
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.out_stride_token = stride_or_default(out, 0);
  p.out_stride_head = stride_or_default(out, 1);
  if (out_lse_t) {
    p.out_lse = static_cast<float*>(out_lse.data);
    p.out_lse_stride_token = stride_or_default(out_lse, 0);
  }
  p.out_base = lse_base_arg(out_base, "out_lse_base");
  Status s;
  if (mem == Mem::kHost) {
    nb::gil_scoped_release release;
    s = merge_states_host(p);
  } else {
    Backend& be = backend_for("cuda", mem, device);
    DeviceGuard guard(device);
    ExecContext ctx;
    ctx.stream = reinterpret_cast<void*>(stream);
    s = be.merge(p, ctx);
  }
  throw_if_error(s);
}

// ---- cache write and slot mapping -----------------------------------------------------------------------

void write_kv_cache(const Tensor& kv_c_t, const Tensor& k_pe_t, const Tensor& slots_t, const MutTensor& cache_t,
                    float kv_scale, uintptr_t stream) {
  View kv_c = view_of("kv_c", kv_c_t), k_pe = view_of("k_pe", k_pe_t), slots = view_of("slot_mapping", slots_t),
       cache = view_of("kv_cache", cache_t);
  require_ndim(kv_c, 2, 2, "[N, 512]");
  require_float(kv_c, {DType::kBF16, DType::kFP16, DType::kFP32});
  require_last_contiguous(kv_c, "[N, 512]");
  require_ndim(k_pe, 2, 2, "[N, 64]");
  require_float(k_pe, {DType::kBF16, DType::kFP16, DType::kFP32});
  require_last_contiguous(k_pe, "[N, 64]");
  require_ndim(slots, 1, 1, "[N] int64");
  require_int64(slots);
  require_last_contiguous(slots, "[N] int64, contiguous");
  require_ndim(cache, 3, 4, "[num_blocks, block_size, 576] or [num_blocks, block_size, 1, 576]");
  require_float(cache, {DType::kBF16, DType::kFP8E4M3});
  require_last_contiguous(cache, "[num_blocks, block_size, 576]");
  int device = -1;
  const Mem mem = common_memory({&kv_c, &k_pe, &slots, &cache}, &device);
  check_size(kv_c, 1, kLatentDim, "the latent width");
  check_size(k_pe, 1, kRopeDim, "the rope width");
  check_size(k_pe, 0, kv_c.shape[0], "the number of tokens of kv_c");
  check_size(slots, 0, kv_c.shape[0], "the number of tokens of kv_c");
  if (cache.ndim == 4) check_size(cache, 2, 1, "the number of KV heads (MLA has one)");
  check_size(cache, cache.ndim - 1, kQkDim, "the latent width [kv_c | k_pe]");
  if (k_pe.dtype != kv_c.dtype)
    throw_invalid(std::string("k_pe: dtype ") + dtype_name(k_pe.dtype) + " differs from kv_c's " +
                  dtype_name(kv_c.dtype));

  CacheWriteParams p;
  p.num_tokens = int(kv_c.shape[0]);
  p.kv_c = kv_c.data;
  p.k_pe = k_pe.data;
  p.src_dtype = kv_c.dtype;
  p.kv_c_stride = stride_or_default(kv_c, 0);
  p.k_pe_stride = stride_or_default(k_pe, 0);
  p.slot_mapping = static_cast<const int64_t*>(slots.data);
  p.kv_cache = cache.data;
  p.cache_dtype = cache.dtype;
  p.kv_scale = kv_scale;
  p.num_blocks = int(cache.shape[0]);
  p.block_size = int(cache.shape[1]);
  p.kv_stride_block = stride_or_default(cache, 0);
  p.kv_stride_token = stride_or_default(cache, 1);
  Status s;
  if (mem == Mem::kHost) {
    nb::gil_scoped_release release;
    s = write_kv_cache_host(p);
  } else {
    DeviceGuard guard(device);
    s = write_kv_cache_device(p, reinterpret_cast<void*>(stream));
  }
  throw_if_error(s);
}

void compute_slot_mapping(const Tensor& seq_ids_t, const Tensor& positions_t, const Tensor& bt_t, int block_size,
                          int num_blocks, const DcpShard& shard, const MutTensor& out_t) {
  View seq_ids = view_of("seq_ids", seq_ids_t), positions = view_of("positions", positions_t),
       bt = view_of("block_table", bt_t), out = view_of("slot_mapping", out_t);
  require_ndim(seq_ids, 1, 1, "[N] int32");
  require_int32(seq_ids);
  require_last_contiguous(seq_ids, "[N] int32, contiguous");
  require_ndim(positions, 1, 1, "[N] int64");
  require_int64(positions);
  require_last_contiguous(positions, "[N] int64, contiguous");
  require_ndim(bt, 2, 2, "[num_seqs, max_blocks_per_seq] int32");
  require_int32(bt);
  require_last_contiguous(bt, "[num_seqs, max_blocks_per_seq] int32 with contiguous rows");
  require_ndim(out, 1, 1, "[N] int64");
  require_int64(out);
  require_last_contiguous(out, "[N] int64, contiguous");
  const Mem mem = common_memory({&seq_ids, &positions, &bt, &out}, nullptr);
  if (mem != Mem::kHost) throw_invalid("slot_mapping: the C++ slot mapping runs on host memory");
  check_size(positions, 0, seq_ids.shape[0], "the number of tokens of seq_ids");
  check_size(out, 0, seq_ids.shape[0], "the number of tokens of seq_ids");
  SlotMappingParams p;
  p.num_tokens = int(seq_ids.shape[0]);
  p.seq_ids = static_cast<const int32_t*>(seq_ids.data);
  p.positions = static_cast<const int64_t*>(positions.data);
  p.block_table = static_cast<const int32_t*>(bt.data);
  p.num_seqs = int(bt.shape[0]);
  p.max_blocks_per_seq = int(bt.shape[1]);
  p.block_table_stride = stride_or_default(bt, 0);
  p.block_size = block_size;
  p.num_blocks = num_blocks;
  p.shard = shard;
  p.slot_mapping = static_cast<int64_t*>(out.data);
  throw_if_error(compute_slot_mapping_host(p));
}

// ---- backend table --------------------------------------------------------------------------------------

nb::list dtype_list(const std::vector<DType>& ds) {
  nb::list l;
  for (DType d : ds) l.append(nb::str(dtype_name(d)));
  return l;
}

nb::list backends() {
  int devices = 0;
  if (!device_count(&devices).ok()) devices = 0;
  nb::list result;
  for (const KnownBackend& k : all_known_backends()) {
    const BackendCapabilities& c = k.capabilities;
    nb::dict d;
    d["name"] = c.name;
    d["description"] = c.description;
    d["device"] = c.device == Device::kCuda ? "cuda" : "host";
    d["built"] = k.built;
    d["available"] = k.built && (c.device == Device::kHost || devices > 0);
    d["can_return_lse_for_decode"] = c.can_return_lse_for_decode;
    d["native_lse_base"] = lse_base_name(c.native_lse_base);
    d["lse_base_selectable"] = c.lse_base_selectable;
    d["q_dtypes"] = dtype_list(c.q_dtypes);
    d["kv_dtypes"] = dtype_list(c.kv_dtypes);
    d["out_dtypes"] = dtype_list(c.out_dtypes);
    nb::list bs;
    for (int b : c.block_sizes) bs.append(b);
    d["block_sizes"] = bs;
    d["min_heads"] = c.min_heads;
    d["max_heads"] = c.max_heads;
    d["min_q_len"] = c.min_q_len;
    d["max_q_len"] = c.max_q_len;
    d["supports_dcp_interleave"] = c.supports_dcp_interleave;
    d["cuda_graph_safe"] = c.cuda_graph_safe;
    d["deterministic"] = c.deterministic;
    result.append(d);
  }
  return result;
}

DcpShard make_shard(int world, int rank, int interleave) {
  if (world < 1) throw_invalid("Shard.world=" + std::to_string(world) + ": must be >= 1");
  if (rank < 0 || rank >= world)
    throw_invalid("Shard.rank=" + std::to_string(rank) + ": must be in [0, world=" + std::to_string(world) + ")");
  if (interleave < 1) throw_invalid("Shard.interleave=" + std::to_string(interleave) + ": must be >= 1");
  return DcpShard{world, rank, interleave};
}

}  // namespace

void register_ops(nb::module_& m) {
  using namespace nb::literals;
  nb::class_<DcpShard>(m, "Shard",
                       "One rank's place in a DCP group: global position p lives on rank (p // interleave) % world.")
      .def(
          "__init__",
          [](DcpShard* s, int world, int rank, int interleave) {
            new (s) DcpShard(make_shard(world, rank, interleave));
          },
          "world"_a = 1, "rank"_a = 0, "interleave"_a = 1)
      .def_ro("world", &DcpShard::world)
      .def_ro("rank", &DcpShard::rank)
      .def_ro("interleave", &DcpShard::interleave)
      .def(
          "owner", [](const DcpShard& s, int64_t p) { return sharding::owner(p, s.world, s.interleave); }, "position"_a,
          "Rank that holds global position `position`.")
      .def(
          "local_len",
          [](const DcpShard& s, int64_t len) { return sharding::local_len(len, s.world, s.rank, s.interleave); },
          "global_len"_a, "Tokens of this rank among the first `global_len` global positions (may be 0).")
      .def(
          "local_to_global",
          [](const DcpShard& s, int64_t k) { return sharding::local_to_global(k, s.world, s.rank, s.interleave); },
          "local_index"_a, "Global position of this rank's local token `local_index`.")
      .def(
          "global_to_local",
          [](const DcpShard& s, int64_t p) { return sharding::global_to_local(p, s.world, s.interleave); },
          "position"_a, "Local index of global position `position` on its owner rank.")
      .def(
          "visible_keys",
          [](const DcpShard& s, int64_t global_len, int q_len, int t) {
            return sharding::visible_local_keys(global_len, q_len, t, s);
          },
          "global_len"_a, "q_len"_a, "t"_a,
          "Keys on this rank visible to query token t of a sequence of global length global_len (causal rule).")
      .def(
          "num_local_blocks",
          [](const DcpShard& s, int64_t len, int block_size) { return sharding::num_local_blocks(len, block_size, s); },
          "global_len"_a, "block_size"_a)
      .def(
          "validate", [](const DcpShard& s, int block_size) { throw_if_error(validate_shard(s, block_size)); },
          "block_size"_a, "Raises ValueError unless block_size >= 1 and block_size % interleave == 0.")
      .def("__eq__",
           [](const DcpShard& a, const DcpShard& b) {
             return a.world == b.world && a.rank == b.rank && a.interleave == b.interleave;
           })
      .def("__hash__", [](const DcpShard& s) { return (int64_t(s.world) * 1000003 + s.rank) * 1000003 + s.interleave; })
      .def("__repr__", [](const DcpShard& s) {
        return "Shard(world=" + std::to_string(s.world) + ", rank=" + std::to_string(s.rank) +
               ", interleave=" + std::to_string(s.interleave) + ")";
      });
  m.def(
      "num_virtual_blocks",
      [](int64_t len, int block_size, int world) { return sharding::num_virtual_blocks(len, block_size, world); },
      "global_len"_a, "block_size"_a, "world"_a);

  m.def("_decode", &decode, "q"_a, "kv_cache"_a, "block_table"_a, "seq_lens"_a, "out"_a, "lse"_a.none(),
        "softmax_scale"_a, "q_len"_a, "kv_scale"_a, "lse_base"_a, "backend"_a, "shard"_a, "split_policy"_a,
        "max_seq_len"_a, "stream"_a, "check_block_ids"_a);
  // Every argument accepts None (a wrong one returns False: the generic path reports it).
  m.def("_decode_torch", &decode_torch, "q"_a.none(), "kv_cache"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(),
        "out"_a.none(), "lse"_a.none(), "softmax_scale"_a.none(), "q_len"_a.none(), "kv_scale"_a.none(),
        "lse_base"_a.none(), "backend"_a.none(), "shard"_a.none(), "split_policy"_a.none(), "max_seq_len"_a.none(),
        "stream"_a.none(), "check_block_ids"_a.none(),
        "decode() for torch tensors through torch's DLPack C exchange API; False (nothing done) when an argument "
        "is not what it takes");
  m.def("_set_torch_exchange", &set_torch_exchange, "tensor_type"_a.none(), "api"_a.none(),
        "Registers torch.Tensor's __dlpack_c_exchange_api__ for _decode_torch; False when unusable");
  m.def("_torch_exchange_ready", &torch_exchange_ready);
  m.def("_time_cpp_decode", &time_cpp_decode, "q"_a, "kv_cache"_a, "block_table"_a, "seq_lens"_a, "out"_a,
        "lse"_a.none(), "softmax_scale"_a, "q_len"_a, "backend"_a, "stream"_a, "iters"_a);
  m.def("_merge", &merge, "outs"_a, "lses"_a, "out"_a, "out_lse"_a.none(), "lse_base"_a, "out_lse_base"_a, "stream"_a);
  m.def("_write_kv_cache", &write_kv_cache, "kv_c"_a, "k_pe"_a, "slot_mapping"_a, "kv_cache"_a, "kv_scale"_a,
        "stream"_a);
  m.def("_compute_slot_mapping", &compute_slot_mapping, "seq_ids"_a, "positions"_a, "block_table"_a, "block_size"_a,
        "num_blocks"_a, "shard"_a, "out"_a);
  m.def("_backends", &backends);
  m.def("_workspace_info", &workspace_info, "device"_a,
        "(bytes held, buffers outgrown) of the decode workspace on a CUDA device");
  m.def("_best_available_backend", &best_available_backend);
  m.def("_device_count", []() -> int {
    int n = 0;
    return device_count(&n).ok() ? n : 0;
  });
}

}  // namespace mladcp::py
