// The "cuda" backend: validation, the split plan and the launches (host code).
#include "cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "core/lse_math.h"
#include "core/validate.h"
#include "cuda/cuda_capabilities.h"
#include "cuda/cuda_status.h"
#include "cuda/decode_kernels.h"
#include "cuda/decode_plan.h"
#include "cuda/sm90_decode.h"
#include "cuda/state_kernels.h"

namespace mladcp {

using detail::invalid;

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Per-device facts the launches need, read once per device (outside any stream capture: the first
// decode on a device must not be captured... it may be, since none of this is a stream operation).
struct DeviceState {
  Status status;
  size_t smem_optin = 0;
  size_t smem_per_sm = 0;  // shared memory of one SM (bounds the resident split CTAs)
  int sm_count = 0;
  bool sm90 = false;           // compute capability 9.0 and the Hopper decode kernel is ready
  bool sm90_fp8 = false;       // compute capability 9.0 and the Hopper fp8 decode kernel is ready
  int64_t sm90_pair_ctas = 0;  // Hopper decode CTAs resident at once in clusters of two (the pair merge)
  int64_t sm90_quad_ctas = 0;  // and in clusters of four
};

Status device_state(int device, DeviceState* out) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<DeviceState>> states;
  std::lock_guard<std::mutex> lock(mu);
  if (device < 0) return invalid("device=", device, ": no current CUDA device");
  if (size_t(device) >= states.size()) states.resize(size_t(device) + 1);
  if (!states[size_t(device)]) {
    auto s = std::make_unique<DeviceState>();
    int optin = 0;
    s->status = cuda_status(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                            "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)");
    s->smem_optin = size_t(optin);
    int per_sm = 0, sms = 0;
    if (s->status.ok())
      s->status = cuda_status(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
                              "cudaDeviceGetAttribute(MaxSharedMemoryPerMultiprocessor)");
    if (s->status.ok())
      s->status = cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                              "cudaDeviceGetAttribute(MultiProcessorCount)");
    s->smem_per_sm = size_t(per_sm);
    s->sm_count = sms;
    if (s->status.ok()) s->status = cuda_impl::prepare_decode_kernels(s->smem_optin);
    int major = 0, minor = 0;
    if (s->status.ok() && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess && major == 9 &&
        minor == 0 && cuda_impl::sm90_decode_smem_bytes() <= s->smem_optin)
      s->sm90 = cuda_impl::set_sm90_decode_smem() == cudaSuccess;
    if (s->sm90) {
      s->sm90_pair_ctas = cuda_impl::sm90_cluster_ctas(2);
      s->sm90_quad_ctas = cuda_impl::sm90_cluster_ctas(4);
    }
    if (s->status.ok() && major == 9 && minor == 0 && cuda_impl::sm90_fp8_decode_smem_bytes(32) <= s->smem_optin)
      s->sm90_fp8 = cuda_impl::set_sm90_fp8_decode_smem() == cudaSuccess;
    (void)cudaGetLastError();  // a failed probe leaves the portable kernels in charge
    states[size_t(device)] = std::move(s);
  }
  *out = *states[size_t(device)];
  return out->status;
}

Status current_device_state(DeviceState* out) {
  int device = -1;
  MLADCP_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  return device_state(device, out);
}

}  // namespace

Status check_cuda_decode_layout(const MlaDecodeParams& p) {
  if (p.max_seq_len <= 0)
    return invalid("max_seq_len=", p.max_seq_len,
                   ": the cuda backend sizes its grid from it without reading seq_lens; pass an upper bound of "
                   "seq_lens (> 0)");
  if (!aligned(p.q, 16)) return invalid("q: address must be 16-byte aligned");
  if (p.q_stride_token % 8 || p.q_stride_head % 8 || p.q_stride_group % 8)
    return invalid("q strides (token ", p.q_stride_token, ", head ", p.q_stride_head, ", group ", p.q_stride_group,
                   "): must be multiples of 8 elements (16-byte rows)");
  const int64_t kv_align = p.kv_dtype == DType::kFP8E4M3 ? 16 : 8;
  if (p.kv_cache && !aligned(p.kv_cache, 16)) return invalid("kv_cache: address must be 16-byte aligned");
  if (p.kv_stride_block % kv_align || p.kv_stride_token % kv_align)
    return invalid("kv strides (block ", p.kv_stride_block, ", token ", p.kv_stride_token, "): must be multiples of ",
                   kv_align, " elements (16-byte rows)");
  if (!aligned(p.out, 16)) return invalid("out: address must be 16-byte aligned");
  if (p.out_stride_token % 8 || p.out_stride_head % 8 || p.out_stride_group % 8)
    return invalid("out strides (token ", p.out_stride_token, ", head ", p.out_stride_head, ", group ",
                   p.out_stride_group, "): must be multiples of 8 elements");
  if (p.lse && !aligned(p.lse, 4)) return invalid("lse: address must be 4-byte aligned");
  return Status::Ok();
}

namespace {

// Which split kernel a call runs and what it costs an SM.
struct KernelChoice {
  int rows_per_cta = 16;
  int kv_stages = 2;
  bool sm90 = false;      // the Hopper bf16 kernel (64 rows per CTA)
  bool sm90_fp8 = false;  // the Hopper fp8 kernel (16 or 32 rows per CTA)
  size_t smem = 0;        // dynamic shared memory per CTA
};

// The Hopper kernel takes bf16 calls with more than opt.portable_max_rows_on_hopper (8) query rows per sequence
// (H · q_len, packed 64 per CTA, the rest of the CTA's rows empty) whose pages its copies handle: with the
// balanced schedule it reads 16-row sequences (16 heads, DeepSeek-V3 at TP 8) 10-16% faster than the portable
// 16-row kernel, two CTAs per SM (docs/perf/gpu-sm90-fp8-2026-12-01.md); at 32 rows up to 1.3x
// (docs/perf/dcp-emulated-grid-2026-12-01.md). Fewer rows and other pages run the portable kernel.
// fp8 caches with at most opt.hopper_fp8_max_rows (32) query rows per sequence take the Hopper fp8 kernel (16
// or 32 rows per CTA, any page size; more rows in chunks of 32 when the option is raised); with more rows, the
// Hopper kernel (converting the fp8 tiles in its ring) on the pages its copies handle; the others the portable
// kernel.
KernelChoice choose_kernel(const MlaDecodeParams& p, const DeviceState& dev, const CudaBackendOptions& opt) {
  KernelChoice k;
  const bool fp8 = p.kv_dtype == DType::kFP8E4M3;
  const int rows = p.num_heads * p.q_len;
  if (fp8 && opt.hopper_kernel && !opt.single_stage && dev.sm90_fp8 && rows <= opt.hopper_fp8_max_rows) {
    k.sm90_fp8 = true;
    k.rows_per_cta = rows <= 16 ? 16 : 32;
    k.smem = cuda_impl::sm90_fp8_decode_smem_bytes(k.rows_per_cta);
    return k;
  }
  k.sm90 = opt.hopper_kernel && !opt.single_stage && dev.sm90 && p.num_blocks >= 1 &&
           rows > (fp8 ? opt.hopper_fp8_max_rows : opt.portable_max_rows_on_hopper) &&
           cuda_impl::sm90_decode_block_size_ok(p.block_size);
  if (k.sm90) {
    k.rows_per_cta = 64;
    k.smem = cuda_impl::sm90_decode_smem_bytes();
    return k;
  }
  k.rows_per_cta = cuda_plan::rows_per_cta(rows);
  if (opt.single_stage || cuda_impl::decode_smem_bytes(k.rows_per_cta, fp8, 2) > dev.smem_optin) k.kv_stages = 1;
  k.smem = cuda_impl::decode_smem_bytes(k.rows_per_cta, fp8, k.kv_stages);
  return k;
}

// Split CTAs the device runs at once for this kernel: SMs × CTAs per SM, the latter bounded by
// shared memory (1 KiB per CTA is reserved by the runtime) and by the kernels' register budget
// (at most two: the 16-row kernel is built for two per SM, the others for one).
int64_t wave_ctas(const KernelChoice& k, const DeviceState& dev) {
  size_t per_sm = dev.smem_per_sm / (k.smem + 1024);
  per_sm = per_sm < 1 ? 1 : (per_sm > 2 ? 2 : per_sm);
  return int64_t(dev.sm_count) * int64_t(per_sm);
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options) : caps_(cuda_backend_capabilities()), opt_(options) {}

  const BackendCapabilities& capabilities() const override { return caps_; }

  size_t workspace_bytes(const MlaDecodeParams& p) const override {
    if (p.num_seqs <= 0 || p.num_heads <= 0 || p.q_len <= 0 || p.max_seq_len <= 0 || p.shard.world < 1 ||
        p.shard.interleave < 1)
      return 0;
    // Only kFillDevice's split length depends on the device (its wave, and the kernel's rows per CTA).
    // (Other policies: the plan does not depend on the device; with the fused merge asked for, the counters are
    // reserved in case the Hopper kernel runs, sized for the narrowest row chunks.)
    if (p.split_policy != SplitPolicy::kFillDevice)
      return cuda_plan::make_plan(p, 0, 0, cuda_plan::Schedule::kSplits, opt_.fused_merge).workspace_bytes;
    DeviceState dev;
    if (!current_device_state(&dev).ok()) return 0;  // decode() reports the device error
    const KernelChoice kc = choose_kernel(p, dev, opt_);
    return plan_on_device(p, kc, dev).workspace_bytes;
  }

  Status decode(const MlaDecodeParams& in, const ExecContext& ctx) override {
    MLADCP_RETURN_IF_ERROR(validate_decode(in, caps_));
    if (in.num_seqs == 0) return Status::Ok();
    const MlaDecodeParams p = with_default_strides(in);
    MLADCP_RETURN_IF_ERROR(check_cuda_decode_layout(p));
    DeviceState dev;
    MLADCP_RETURN_IF_ERROR(current_device_state(&dev));
    const bool fp8 = p.kv_dtype == DType::kFP8E4M3;
    const KernelChoice kc = choose_kernel(p, dev, opt_);
    const int rows = kc.rows_per_cta;
    if (kc.smem > dev.smem_optin)
      return Status::Unsupported(detail::cat("num_heads=", p.num_heads, ", q_len=", p.q_len,
                                             ", kv_dtype=", dtype_name(p.kv_dtype), ": the kernel for ", rows,
                                             " query rows needs ", kc.smem,
                                             " bytes of shared memory per block; this device allows ", dev.smem_optin));
    const cuda_plan::DecodePlan plan = plan_on_device(p, kc, dev);
    if (plan.grid > std::numeric_limits<int32_t>::max() ||
        int64_t(p.num_seqs) * plan.rows_per_seq > std::numeric_limits<int32_t>::max())
      return invalid("num_seqs=", p.num_seqs, ", max_seq_len=", p.max_seq_len, ": ", plan.grid,
                     " CTAs exceed one launch; split the batch");
    if (plan.workspace_bytes > 0) {
      if (!ctx.workspace || ctx.workspace_size < plan.workspace_bytes)
        return invalid("workspace: ", ctx.workspace_size, " bytes at ", ctx.workspace, ", but this call needs ",
                       plan.workspace_bytes,
                       " (workspace_bytes(params), split_policy=", split_policy_name(p.split_policy), ")");
      if (!aligned(ctx.workspace, 256)) return invalid("workspace: address must be 256-byte aligned");
    }

    cuda_impl::DecodeKernelParams k;
    k.num_seqs = p.num_seqs;
    k.q_len = p.q_len;
    k.num_heads = p.num_heads;
    k.head_group_size = p.head_group_size;
    k.rows_per_seq = plan.rows_per_seq;
    k.rows_per_cta = plan.rows_per_cta;
    k.row_chunks = plan.row_chunks;
    k.split_len = plan.split_len;
    k.max_splits = plan.max_splits;
    k.parts = plan.parts;
    k.whole_short = plan.whole_short;
    k.kv_stages = kc.kv_stages;
    k.sm90 = kc.sm90;
    k.sm90_fp8 = kc.sm90_fp8;
    k.sm_count = dev.sm_count;
    k.copy_queries = opt_.copy_queries;
    k.q = static_cast<const uint16_t*>(p.q);
    k.q_stride_token = p.q_stride_token;
    k.q_stride_head = p.q_stride_head;
    k.q_stride_group = p.q_stride_group;
    k.kv = static_cast<const uint8_t*>(p.kv_cache);
    k.kv_stride_block = p.kv_stride_block;
    k.kv_stride_token = p.kv_stride_token;
    k.num_blocks = p.num_blocks;
    k.block_size = p.block_size;
    for (int sh = 0; sh < 31; ++sh)
      if ((1 << sh) == p.block_size) k.block_shift = sh;
    k.block_table = p.block_table;
    k.block_table_stride = p.block_table_stride;
    k.max_blocks_per_seq = p.max_blocks_per_seq;
    k.seq_lens = p.seq_lens;
    k.max_seq_len = p.max_seq_len;
    k.score_scale_log2 = float(double(p.softmax_scale) * double(p.kv_scale) * double(lse::kLog2e));
    k.out_scale = p.kv_scale;
    k.out = p.out;
    k.out_fp32 = p.out_dtype == DType::kFP32;
    k.out_stride_token = p.out_stride_token;
    k.out_stride_head = p.out_stride_head;
    k.out_stride_group = p.out_stride_group;
    k.lse = p.lse;
    k.lse_base2 = p.lse_base == LseBase::k2;
    k.lse_stride_token = p.lse_stride_token;
    k.lse_stride_group = p.lse_stride_group;
    k.shard = p.shard;
    k.pair_merge = plan.pair_merge;
    k.cluster_parts = plan.cluster_parts;
    if (plan.workspace_bytes > 0) {
      uint8_t* ws = static_cast<uint8_t*>(ctx.workspace);
      if (plan.parts > 0) k.ws_record = reinterpret_cast<cuda_plan::BalancedRecord*>(ws + plan.ws_record_offset);
      k.ws_lse = reinterpret_cast<float*>(ws + plan.ws_lse_offset);
      k.ws_o = reinterpret_cast<float*>(ws + plan.ws_o_offset);
      k.fused_merge = plan.fused_merge;
      if (plan.fused_merge) k.ws_counter = reinterpret_cast<int*>(ws + plan.ws_counter_offset);
      if (plan.ws_merges_offset > 0) k.ws_merges = reinterpret_cast<int*>(ws + plan.ws_merges_offset);
    }
    return cuda_impl::launch_decode(k, fp8, plan.grid, ctx.stream);
  }

  Status merge(const MergeParams& in, const ExecContext& ctx) override {
    MLADCP_RETURN_IF_ERROR(validate(in));
    return cuda_impl::launch_merge(with_default_strides(in), ctx.stream);
  }

  Status rescale(const RescaleParams& p, const ExecContext& ctx) override {
    MLADCP_RETURN_IF_ERROR(validate(p));
    return cuda_impl::launch_rescale(p, ctx.stream);
  }

 private:
  // kFillDevice's schedule: both Hopper kernels run the balanced schedule as well as splits (the fp8 16/32-row
  // kernel, left to choose, with a higher bar: Schedule::kAutoManyWaves); the portable one splits.
  cuda_plan::Schedule schedule(const KernelChoice& kc) const {
    if (kc.sm90_fp8 && opt_.fill_schedule == cuda_plan::Schedule::kAuto) return cuda_plan::Schedule::kAutoManyWaves;
    return kc.sm90 || kc.sm90_fp8 ? opt_.fill_schedule : cuda_plan::Schedule::kSplits;
  }

  // The plan of a call on this device for kernel `kc` (the same in workspace_bytes and decode): the fused and pair
  // merges only on the Hopper 64-row kernel, the pair merge only where its clusters fit.
  cuda_plan::DecodePlan plan_on_device(const MlaDecodeParams& p, const KernelChoice& kc, const DeviceState& dev) const {
    return cuda_plan::make_plan(p, wave_ctas(kc, dev), kc.rows_per_cta, schedule(kc), kc.sm90 && opt_.fused_merge,
                                kc.sm90 && opt_.pair_merge ? dev.sm90_pair_ctas : 0,
                                kc.sm90 && opt_.pair_merge && opt_.balanced_quads ? dev.sm90_quad_ctas : 0,
                                opt_.balanced_clusters);
  }

  BackendCapabilities caps_;
  CudaBackendOptions opt_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(CudaBackendOptions{}); }
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

Status write_kv_cache_cuda(const CacheWriteParams& in, void* stream) {
  CacheWriteParams p = in;
  if (p.num_tokens < 0) return invalid("num_tokens=", p.num_tokens, ": must be >= 0");
  if (p.src_dtype != DType::kBF16 && p.src_dtype != DType::kFP16 && p.src_dtype != DType::kFP32)
    return invalid("src_dtype=", dtype_name(p.src_dtype), ": accepted bf16, fp16, fp32");
  if (p.cache_dtype != DType::kBF16 && p.cache_dtype != DType::kFP8E4M3)
    return invalid("cache_dtype=", dtype_name(p.cache_dtype), ": accepted bf16, fp8_e4m3");
  if (!(std::isfinite(p.kv_scale) && p.kv_scale > 0.0f))
    return invalid("kv_scale=", p.kv_scale, ": must be finite and > 0");
  if (p.cache_dtype == DType::kBF16 && p.kv_scale != 1.0f)
    return invalid("kv_scale=", p.kv_scale, ": only fp8_e4m3 caches take a scale (use 1.0)");
  if (p.block_size < 1) return invalid("block_size=", p.block_size, ": must be >= 1");
  if (p.num_blocks < 0) return invalid("num_blocks=", p.num_blocks, ": must be >= 0");
  if (p.kv_c_stride < 0 || (p.kv_c_stride && p.kv_c_stride < kLatentDim))
    return invalid("kv_c_stride=", p.kv_c_stride, ": must be 0 (packed) or >= 512");
  if (p.k_pe_stride < 0 || (p.k_pe_stride && p.k_pe_stride < kRopeDim))
    return invalid("k_pe_stride=", p.k_pe_stride, ": must be 0 (packed) or >= 64");
  if (!p.kv_c_stride) p.kv_c_stride = kLatentDim;
  if (!p.k_pe_stride) p.k_pe_stride = kRopeDim;
  if (!p.kv_stride_token) p.kv_stride_token = kQkDim;
  if (!p.kv_stride_block) p.kv_stride_block = int64_t(p.block_size) * p.kv_stride_token;
  if (p.kv_stride_token < kQkDim) return invalid("kv_stride_token=", p.kv_stride_token, ": must be >= 576");
  if (p.kv_stride_block < int64_t(p.block_size) * p.kv_stride_token)
    return invalid("kv_stride_block=", p.kv_stride_block, ": must be >= block_size * kv_stride_token");
  if (p.num_tokens == 0) return Status::Ok();
  if (!p.kv_c) return invalid("kv_c: null pointer (expected [N, 512])");
  if (!p.k_pe) return invalid("k_pe: null pointer (expected [N, 64])");
  if (!p.slot_mapping) return invalid("slot_mapping: null pointer (expected [N] int64)");
  if (!p.kv_cache && p.num_blocks > 0) return invalid("kv_cache: null pointer with num_blocks=", p.num_blocks);
  if (p.num_blocks == 0) return Status::Ok();  // every slot is out of range: nothing to write
  return cuda_impl::launch_cache_write(p, stream);
}

}  // namespace mladcp
