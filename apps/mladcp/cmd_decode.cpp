// `mladcp decode`: one MLA decode step on synthetic data, timed, optionally checked against the oracle.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli_checks.h"
#include "cli_common.h"
#include "commands.h"
#include "core/validate.h"
#include "decode_run.h"
#include "mladcp/config.h"

namespace mladcp::cli {
namespace {

void print_report(const DecodeReport& r) {
  std::printf("backend   %s\n", describe_backend(r).c_str());
  std::printf("shape     %s\n", describe_shape(r).c_str());
  std::printf("time      %s (median of %d, min %s%s)\n", format_seconds(r.median_seconds).c_str(), r.iters,
              format_seconds(r.min_seconds).c_str(), r.device == Device::kHost ? "" : "; device time");
  std::printf("traffic   %s -> %s\n", format_bytes(r.bytes).c_str(),
              format_rate(r.bytes / r.median_seconds, "B/s").c_str());
  std::printf("compute   %s -> %s\n", format_rate(r.flops, "FLOP").c_str(),
              format_rate(r.flops / r.median_seconds, "FLOP/s").c_str());
  if (!r.checked) return;
  const CheckResult& c = r.check;
  std::printf("check     vs cpu-reference: out max abs err %s, rel err %s (tolerance %s)",
              format_sci(c.out_max_abs_err).c_str(), format_sci(c.out_rel_err).c_str(),
              format_sci(c.out_rel_tolerance).c_str());
  if (c.has_lse) std::printf(", LSE max abs err %s", format_sci(c.lse_max_abs_err).c_str());
  std::printf(": %s\n", c.pass ? "PASS" : "FAIL");
}

}  // namespace

void add_decode_command(CLI::App& app) {
  auto opt = std::make_shared<DecodeOptions>();
  auto json = std::make_shared<bool>(false);
  CLI::App* sub = app.add_subcommand(
      "decode", "One MLA decode step on synthetic data (DeepSeek-V3 shapes by default): time, GB/s, GFLOP/s");
  sub->add_option("--backend", opt->backend, "Backend name (see `mladcp backends`); default: the best available");
  sub->add_option("--heads", opt->heads, "Query heads")->capture_default_str()->check(int_in_range(1, kMaxHeads));
  sub->add_option("--batch", opt->batch, "Sequences")->capture_default_str()->check(int_in_range(1, 1 << 20));
  sub->add_option("--context", opt->context, "Global length of every sequence, new tokens included")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 30));
  sub->add_option("--q-len", opt->q_len, "Query tokens per sequence (speculative decoding when > 1)")
      ->capture_default_str()
      ->check(int_in_range(1, kMaxQLen));
  sub->add_option("--block-size", opt->block_size, "Tokens per paged-cache block")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 20));
  sub->add_option("--kv-dtype", opt->kv_dtype, "Cache dtype: bf16 or fp8 (e4m3, per-tensor scale)")
      ->capture_default_str();
  sub->add_option("--out-dtype", opt->out_dtype, "Output dtype: bf16 or fp32")->capture_default_str();
  sub->add_option("--lse-base", opt->lse_base, "Base of the returned LSE: e or 2")->capture_default_str();
  sub->add_flag("--no-lse", opt->no_lse, "Ask the kernel for no LSE");
  sub->add_option("--split-policy", opt->split_policy,
                  "Split-KV plan of device backends: fill (the default: shorter splits when the batch leaves the GPU "
                  "idle; results may depend on the batch and the device) or invariant (results independent of the "
                  "batch)")
      ->capture_default_str();
  sub->add_option("--dcp-world", opt->dcp_world, "DCP group size W: decode one shard of a W-way sharded cache")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 16));
  sub->add_option("--dcp-rank", opt->dcp_rank, "Which shard (0 <= rank < W)")
      ->capture_default_str()
      ->check(int_in_range(0, 1 << 16));
  sub->add_option("--interleave", opt->interleave, "DCP interleave I: runs of I positions per rank")
      ->capture_default_str()
      ->check(int_in_range(1, 1 << 20));
  sub->add_option("--iters", opt->iters, "Timed runs after one warm-up (0: as many as fit in about 2 s)")
      ->capture_default_str()
      ->check(int_in_range(0, 1 << 20));
  sub->add_option("--threads", opt->threads, "Host threads (0: all)")
      ->capture_default_str()
      ->check(int_in_range(0, 1 << 16));
  sub->add_option("--seed", opt->seed, "Seed of the synthetic data")->capture_default_str();
  sub->add_flag("--check", opt->check,
                "Compare with the cpu-reference oracle; exit 1 when an error exceeds the dtype's tolerance");
  sub->add_flag("--json", *json, "Print JSON");
  set_command_body(sub, [opt, json] {
    DecodeReport r;
    MLADCP_RETURN_IF_ERROR(run_decode(*opt, &r));
    if (*json)
      std::printf("%s\n", report_json(r).dump(2).c_str());
    else
      print_report(r);
    if (r.checked && !r.check.pass) {
      std::fprintf(stderr, "%s\n", r.check.detail.c_str());
      return Status::Internal(detail::cat("decode check failed: backend '", r.backend,
                                          "' differs from cpu-reference beyond the tolerance (seed ", r.config.seed,
                                          ", ", describe_shape(r), ")"));
    }
    return Status::Ok();
  });
}

}  // namespace mladcp::cli
