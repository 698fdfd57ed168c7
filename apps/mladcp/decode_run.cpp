#include "decode_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <new>
#include <thread>

#include "cli_common.h"
#include "core/validate.h"
#include "mladcp/device_memory.h"
#include "mladcp/sharding.h"
#include "testkit/compare.h"
#include "testkit/median.h"

namespace mladcp::cli {
namespace {

using detail::invalid;

// Rough speed of the fp64 oracle, to decide when its run deserves a progress line.
constexpr double kOracleFlopsPerSecond = 2.5e9;
// Below this, a step needs no progress line.
constexpr double kQuietSeconds = 2.0;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Status parse_options(const DecodeOptions& opt, synthetic::Config* cfg, DType* out_dtype, LseBase* base) {
  if (opt.dcp_rank < 0 || opt.dcp_rank >= opt.dcp_world)
    return invalid("--dcp-rank=", opt.dcp_rank, ": must be in [0, --dcp-world=", opt.dcp_world, ")");
  if (opt.context < opt.q_len)
    return invalid("--context=", opt.context, ": must be >= --q-len=", opt.q_len,
                   " (a sequence holds its q_len new tokens)");
  if (opt.block_size % opt.interleave != 0)
    return invalid("--block-size=", opt.block_size, ": must be a multiple of --interleave=", opt.interleave);
  const std::optional<DType> kv = parse_dtype(opt.kv_dtype);
  if (!kv || (*kv != DType::kBF16 && *kv != DType::kFP8E4M3))
    return invalid("--kv-dtype=", opt.kv_dtype, ": accepted bf16, fp8");
  const std::optional<DType> out = parse_dtype(opt.out_dtype);
  if (!out || (*out != DType::kBF16 && *out != DType::kFP32))
    return invalid("--out-dtype=", opt.out_dtype, ": accepted bf16, fp32");
  if (opt.lse_base != "e" && opt.lse_base != "2") return invalid("--lse-base=", opt.lse_base, ": accepted e, 2");

  cfg->num_seqs = opt.batch;
  cfg->q_len = opt.q_len;
  cfg->num_heads = opt.heads;
  cfg->block_size = opt.block_size;
  cfg->seq_lens = synthetic::uniform_lengths(opt.batch, opt.context);
  cfg->kv_dtype = *kv;
  cfg->shard = DcpShard{opt.dcp_world, opt.dcp_rank, opt.interleave};
  cfg->seed = opt.seed;
  *out_dtype = *out;
  *base = opt.lse_base == "2" ? LseBase::k2 : LseBase::kE;
  return Status::Ok();
}

using testkit::median;

// Element-wise tolerance of the output check: the output dtype's rounding (testkit/compare.h), widened
// for device backends, whose tensor-core P·V product takes bf16 probabilities: a relative rounding of 2^-9
// per weight, up to 2^-8 of the output scale over a row (the bound of the cuda tests). The relative error
// ||out - ref|| / ||ref|| must stay within the relative term.
test::Tolerance check_tolerance(Device device, DType out_dtype) {
  test::Tolerance t = test::output_tolerance(out_dtype);
  if (device != Device::kHost) {
    t.rel = std::max(t.rel, 1.0 / 256.0);
    t.scale_rel = std::max(t.scale_rel, 1.0 / 256.0);
  }
  return t;
}

// Compares the backend's output and LSE with the oracle's (fp32 output, same LSE base).
CheckResult compare_with_oracle(const DecodeReport& r, const std::vector<float>& out, const std::vector<float>& ref,
                                const std::vector<float>& lse, const std::vector<float>& ref_lse) {
  CheckResult c;
  const int64_t T = r.config.num_seqs * r.config.q_len, H = r.config.num_heads;
  const test::Tolerance out_tol = check_tolerance(r.device, r.out_dtype);
  const test::Comparison oc = test::compare(out, ref, out_tol, "output", {T, H, kLatentDim});
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(out[i]) - double(ref[i]);
    diff2 += d * d;
    ref2 += double(ref[i]) * double(ref[i]);
  }
  c.out_max_abs_err = oc.max_abs_err;
  c.out_rel_err = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  c.out_rel_tolerance = out_tol.rel;
  c.out_bad = oc.bad;
  c.out_unwritten = oc.unwritten;
  c.detail = oc.report;
  // A NaN anywhere makes out_rel_err NaN, which fails the comparison below.
  c.pass = oc.ok && c.out_rel_err <= c.out_rel_tolerance;
  c.has_lse = !ref_lse.empty();
  if (c.has_lse) {
    const test::Comparison lc = test::compare(lse, ref_lse, test::lse_tolerance(), "lse", {T, H});
    c.lse_max_abs_err = lc.max_abs_err;
    c.lse_bad = lc.bad;
    c.detail += "\n" + lc.report;
    c.pass = c.pass && lc.ok;
  }
  return c;
}

// Runs a backend's decode on the problem where the backend keeps its data: on the host buffers as they
// are, or on device copies (mladcp/device_memory.h), timed with device events on a stream of its own.
class Runner {
 public:
  Runner() = default;
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;
  ~Runner() {
    (void)event_destroy(start_);
    (void)event_destroy(stop_);
    (void)stream_destroy(stream_);
  }

  // `host` points at the problem's host buffers and at sentinel-filled out/lse buffers of the given sizes.
  Status init(Backend* backend, const synthetic::Problem& problem, const MlaDecodeParams& host, size_t out_bytes,
              size_t lse_bytes, int threads) {
    backend_ = backend;
    device_ = backend->capabilities().device == Device::kCuda;
    params_ = host;
    out_bytes_ = out_bytes;
    lse_bytes_ = lse_bytes;
    ctx_.num_threads = threads;
    if (!device_) {
      host_workspace_.resize(backend->workspace_bytes(host));
      ctx_.workspace = host_workspace_.data();
      ctx_.workspace_size = host_workspace_.size();
      return Status::Ok();
    }
    int devices = 0;
    MLADCP_RETURN_IF_ERROR(device_count(&devices));
    if (devices == 0)
      return Status(StatusCode::kUnavailable, detail::cat("--backend=", backend->capabilities().name,
                                                          ": no CUDA device is visible on this machine"));
    MLADCP_RETURN_IF_ERROR(upload(&q_, problem.q.data(), problem.q.size() * sizeof(uint16_t)));
    MLADCP_RETURN_IF_ERROR(upload(&kv_, problem.kv_cache.data(), problem.kv_cache.size()));
    MLADCP_RETURN_IF_ERROR(upload(&table_, problem.block_table.data(), problem.block_table.size() * sizeof(int32_t)));
    MLADCP_RETURN_IF_ERROR(upload(&lens_, problem.seq_lens.data(), problem.seq_lens.size() * sizeof(int32_t)));
    MLADCP_RETURN_IF_ERROR(upload(&out_, host.out, out_bytes));  // sentinels: unwritten elements stay visible
    MLADCP_RETURN_IF_ERROR(upload(&lse_, host.lse, lse_bytes));
    params_.q = q_.data();
    params_.kv_cache = kv_.data();
    params_.block_table = table_.as<int32_t>();
    params_.seq_lens = lens_.as<int32_t>();
    params_.out = out_.data();
    params_.lse = host.lse ? lse_.as<float>() : nullptr;
    MLADCP_RETURN_IF_ERROR(workspace_.allocate(backend->workspace_bytes(params_)));
    MLADCP_RETURN_IF_ERROR(stream_create(&stream_));
    MLADCP_RETURN_IF_ERROR(event_create(&start_));
    MLADCP_RETURN_IF_ERROR(event_create(&stop_));
    ctx_.stream = stream_;
    ctx_.workspace = workspace_.data();
    ctx_.workspace_size = workspace_.size();
    DeviceInfo info;
    int current = 0;
    if (device_get(&current).ok() && device_info(current, &info).ok()) device_label_ = info.name;
    return Status::Ok();
  }

  // One decode; `seconds` is wall time on the host, device time (between events) on a device.
  Status run(double* seconds) {
    if (!device_) {
      const double t0 = now_seconds();
      MLADCP_RETURN_IF_ERROR(backend_->decode(params_, ctx_));
      *seconds = now_seconds() - t0;
      return Status::Ok();
    }
    MLADCP_RETURN_IF_ERROR(event_record(start_, stream_));
    MLADCP_RETURN_IF_ERROR(backend_->decode(params_, ctx_));
    MLADCP_RETURN_IF_ERROR(event_record(stop_, stream_));
    MLADCP_RETURN_IF_ERROR(event_synchronize(stop_));
    float ms = 0.0f;
    MLADCP_RETURN_IF_ERROR(event_elapsed_ms(start_, stop_, &ms));
    *seconds = double(ms) * 1e-3;
    return Status::Ok();
  }

  // Brings the output and LSE back to the host buffers given to init() (nothing to do on the host).
  Status fetch(void* out, float* lse) {
    if (!device_) return Status::Ok();
    MLADCP_RETURN_IF_ERROR(stream_synchronize(stream_));
    MLADCP_RETURN_IF_ERROR(copy_device_to_host(out, out_.data(), out_bytes_));
    if (lse && lse_bytes_) MLADCP_RETURN_IF_ERROR(copy_device_to_host(lse, lse_.data(), lse_bytes_));
    return Status::Ok();
  }

  const std::string& device_label() const { return device_label_; }

 private:
  static Status upload(DeviceBuffer* buf, const void* src, size_t bytes) {
    MLADCP_RETURN_IF_ERROR(buf->allocate(bytes));
    return bytes ? copy_host_to_device(buf->data(), src, bytes) : Status::Ok();
  }

  Backend* backend_ = nullptr;
  bool device_ = false;
  MlaDecodeParams params_;
  ExecContext ctx_;
  size_t out_bytes_ = 0, lse_bytes_ = 0;
  std::vector<uint8_t> host_workspace_;
  DeviceBuffer q_, kv_, table_, lens_, out_, lse_, workspace_;
  DeviceStream stream_ = nullptr;
  DeviceEvent start_ = nullptr, stop_ = nullptr;
  std::string device_label_;
};

}  // namespace

Status run_decode(const DecodeOptions& opt, DecodeReport* report) {
  DecodeReport& r = *report;
  r = DecodeReport{};
  MLADCP_RETURN_IF_ERROR(parse_options(opt, &r.config, &r.out_dtype, &r.lse_base));
  const LseBase base = r.lse_base;
  r.lse = !opt.no_lse;
  if (opt.split_policy != "invariant" && opt.split_policy != "fill")
    return invalid("--split-policy=", opt.split_policy, ": accepted invariant, fill");
  r.split_policy = opt.split_policy == "fill" ? SplitPolicy::kFillDevice : SplitPolicy::kBatchInvariant;

  r.backend = opt.backend.empty() ? best_available_backend() : opt.backend;
  const std::vector<std::string> names = backend_names();
  if (std::find(names.begin(), names.end(), r.backend) == names.end()) {
    std::string known;
    for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
    for (const KnownBackend& k : all_known_backends())
      if (k.capabilities.name == r.backend)
        return invalid("--backend=", r.backend, ": not part of this build (", device_name(k.capabilities.device),
                       " support was not compiled in); this build has ", known);
    return invalid("--backend=", r.backend, ": unknown; this build has ", known);
  }
  std::unique_ptr<Backend> backend;
  MLADCP_RETURN_IF_ERROR(create_backend(r.backend, &backend));
  r.device = backend->capabilities().device;
  r.threads = r.device != Device::kHost ? 0
              : opt.threads > 0         ? opt.threads
                                        : int(std::max(1u, std::thread::hardware_concurrency()));

  // The problem: one shard of a global cache, NaN in every unused slot, a permuted block table.
  synthetic::Problem problem;
  const double kv_values = double(opt.batch) * opt.context * kQkDim / opt.dcp_world;
  const double host_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (host_bytes > 0 && kv_values * dtype_size(r.config.kv_dtype) > host_bytes)
    return invalid("--batch=", opt.batch, " --context=", opt.context, ": the synthetic cache",
                   opt.dcp_world > 1 ? " shard" : "", " needs ",
                   format_bytes(kv_values * dtype_size(r.config.kv_dtype)), " of host memory; this machine has ",
                   format_bytes(host_bytes));
  if (kv_values > 2e8)
    progress("building a synthetic cache of " + format_bytes(kv_values * dtype_size(r.config.kv_dtype)) + "...");
  if (Status s = synthetic::make_problem(r.config, &problem); !s.ok())
    return Status(s.code(), detail::cat("--batch=", opt.batch, " --context=", opt.context,
                                        " --block-size=", opt.block_size, ": ", s.message()));
  const int64_t T = problem.num_tokens(), H = r.config.num_heads;
  const size_t out_elems = size_t(T) * H * kLatentDim, lse_elems = size_t(T) * H;

  std::vector<uint8_t> out(out_elems * dtype_size(r.out_dtype));
  std::vector<float> lse(r.lse ? lse_elems : 0);
  test::fill_sentinel(out.data(), r.out_dtype, out_elems);
  test::fill_sentinel(lse);
  MlaDecodeParams p = problem.params(out.data(), r.out_dtype, r.lse ? lse.data() : nullptr, base);
  p.split_policy = r.split_policy;

  // Traffic and work of one step.
  double visible = 0.0;
  for (int seq = 0; seq < r.config.num_seqs; ++seq)
    for (int t = 0; t < r.config.q_len; ++t)
      visible += double(sharding::visible_local_keys(problem.seq_lens[seq], r.config.q_len, t, r.config.shard));
  r.flops = 2.0 * (kQkDim + kLatentDim) * double(H) * visible;
  r.bytes = double(problem.kv_bytes_used()) + double(T) * H * kQkDim * dtype_size(DType::kBF16) + double(out.size()) +
            double(lse.size()) * sizeof(float);

  Runner runner;
  MLADCP_RETURN_IF_ERROR(runner.init(backend.get(), problem, p, out.size(), lse.size() * sizeof(float), opt.threads));
  r.device_label = runner.device_label();

  // One warm-up run, then the timed runs.
  double warm = 0.0;
  MLADCP_RETURN_IF_ERROR(runner.run(&warm));
  if (opt.iters > 0) {
    r.iters = opt.iters;
  } else if (warm >= 1.0) {
    r.iters = 0;  // a run this long is its own measurement
    r.seconds.push_back(warm);
  } else {
    r.iters = std::clamp(int(kQuietSeconds / std::max(warm, 1e-6)), 1, 100);
  }
  if (r.iters * warm > kQuietSeconds)
    progress("timing " + std::to_string(r.iters) + " runs of about " + format_seconds(warm) + " each...");
  for (int i = 0; i < r.iters; ++i) {
    double seconds = 0.0;
    MLADCP_RETURN_IF_ERROR(runner.run(&seconds));
    r.seconds.push_back(seconds);
  }
  if (r.iters == 0) r.iters = 1;
  r.median_seconds = median(r.seconds);
  r.min_seconds = *std::min_element(r.seconds.begin(), r.seconds.end());
  MLADCP_RETURN_IF_ERROR(runner.fetch(out.data(), r.lse ? lse.data() : nullptr));

  if (!opt.check) return Status::Ok();
  r.checked = true;
  std::unique_ptr<Backend> oracle;
  MLADCP_RETURN_IF_ERROR(create_backend("cpu-reference", &oracle));
  std::vector<float> ref(out_elems), ref_lse(r.lse ? lse_elems : 0);
  test::fill_sentinel(ref);
  test::fill_sentinel(ref_lse);
  const double oracle_estimate = r.flops / kOracleFlopsPerSecond;
  if (oracle_estimate > kQuietSeconds)
    progress("checking against the cpu-reference oracle (fp64, about " + format_seconds(oracle_estimate) + ")...");
  const double t0 = now_seconds();
  MLADCP_RETURN_IF_ERROR(
      oracle->decode(problem.params(ref.data(), DType::kFP32, r.lse ? ref_lse.data() : nullptr, base), ExecContext{}));
  const double oracle_seconds = now_seconds() - t0;
  r.check = compare_with_oracle(r, test::to_float(out.data(), r.out_dtype, out_elems), ref, lse, ref_lse);
  r.check.oracle_seconds = oracle_seconds;
  return Status::Ok();
}

std::string describe_backend(const DecodeReport& r) {
  if (r.device == Device::kHost) return detail::cat(r.backend, " (host, ", r.threads, " threads)");
  return detail::cat(r.backend, " (", r.device_label.empty() ? device_name(r.device) : r.device_label.c_str(), ")");
}

std::string describe_shape(const DecodeReport& r) {
  const synthetic::Config& c = r.config;
  std::string s = detail::cat(c.num_seqs, " x ", c.seq_lens.empty() ? 0 : c.seq_lens[0], " tokens, ", c.num_heads,
                              " heads, q_len ", c.q_len, ", ", dtype_name(c.kv_dtype), " KV, block ", c.block_size,
                              ", ", dtype_name(r.out_dtype), " out");
  if (r.lse) s += detail::cat(", LSE base ", lse_base_name(r.lse_base));
  if (r.split_policy != SplitPolicy::kFillDevice)
    s += detail::cat(", split policy ", split_policy_name(r.split_policy));
  if (c.shard.world > 1)
    s += detail::cat("; DCP shard rank ", c.shard.rank, " of ", c.shard.world, ", interleave ", c.shard.interleave);
  return s;
}

nlohmann::ordered_json report_json(const DecodeReport& r) {
  using json = nlohmann::ordered_json;
  const synthetic::Config& c = r.config;
  json j = {{"backend", r.backend},
            {"device", device_name(r.device)},
            {"device_name", r.device_label},
            {"threads", r.threads},
            {"shape",
             {{"batch", c.num_seqs},
              {"context", c.seq_lens.empty() ? 0 : c.seq_lens[0]},
              {"heads", c.num_heads},
              {"q_len", c.q_len},
              {"block_size", c.block_size},
              {"kv_dtype", dtype_name(c.kv_dtype)},
              {"out_dtype", dtype_name(r.out_dtype)},
              {"lse", r.lse},
              {"lse_base", lse_base_name(r.lse_base)},
              {"split_policy", split_policy_name(r.split_policy)}}},
            {"shard", {{"world", c.shard.world}, {"rank", c.shard.rank}, {"interleave", c.shard.interleave}}},
            {"seed", c.seed},
            {"iters", r.iters},
            {"time_s", {{"median", r.median_seconds}, {"min", r.min_seconds}}},
            {"bytes", r.bytes},
            {"flops", r.flops},
            {"bytes_per_s", r.bytes / r.median_seconds},
            {"flops_per_s", r.flops / r.median_seconds}};
  if (r.checked) {
    const CheckResult& k = r.check;
    json check = {{"oracle", "cpu-reference"},
                  {"pass", k.pass},
                  {"out_max_abs_err", k.out_max_abs_err},
                  {"out_rel_err", k.out_rel_err},
                  {"out_rel_tolerance", k.out_rel_tolerance},
                  {"out_elements_outside_tolerance", k.out_bad},
                  {"out_elements_unwritten", k.out_unwritten}};
    if (k.has_lse) {
      check["lse_max_abs_err"] = k.lse_max_abs_err;
      check["lse_elements_outside_tolerance"] = k.lse_bad;
    }
    check["oracle_seconds"] = k.oracle_seconds;
    j["check"] = check;
  } else {
    j["check"] = nullptr;
  }
  return j;
}

}  // namespace mladcp::cli
