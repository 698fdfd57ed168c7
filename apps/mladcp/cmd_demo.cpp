// `mladcp demo`: the library's main job with a short human summary: the decode check on the best available
// backend, then DCP on 4 CPU ranks (cmd_dcp.cpp) against single-rank decode.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <string>

#include "cli_checks.h"
#include "cli_common.h"
#include "commands.h"
#include "core/validate.h"
#include "decode_run.h"

namespace mladcp::cli {
namespace {

// One decode step of DeepSeek-V3 attention (all 128 heads, bf16 latent cache), checked against the oracle.
// Two sequences of 4096 tokens keep the fp64 oracle to a few seconds.
Status decode_section(int threads) {
  DecodeOptions opt;
  opt.backend = best_available_backend();
  opt.heads = 128;
  opt.batch = 2;
  opt.context = 4096;
  opt.threads = threads;
  opt.check = true;
  DecodeReport r;
  MLADCP_RETURN_IF_ERROR(run_decode(opt, &r));
  const CheckResult& c = r.check;
  std::printf(
      "MLA decode with LSE, DeepSeek-V3 attention shape, checked against the fp64 oracle (cpu-reference)\n"
      "  problem   %d sequences x %d tokens, %d query heads, q_len %d; latent cache [kv_c 512 | k_pe 64] in %s,\n"
      "            blocks of %d tokens under a permuted block table, NaN in every unused cache slot\n"
      "  backend   %s\n"
      "  time      %s per step (median of %d%s): %s, %s\n"
      "  error     output rel %s, max abs %s; LSE max abs %s (tolerance: output rel %s, %s)\n"
      "  result    %s\n",
      r.config.num_seqs, r.config.seq_lens[0], r.config.num_heads, r.config.q_len, dtype_name(r.config.kv_dtype),
      r.config.block_size, describe_backend(r).c_str(), format_seconds(r.median_seconds).c_str(), r.iters,
      r.device == Device::kHost ? "" : ", device time", format_rate(r.bytes / r.median_seconds, "B/s").c_str(),
      format_rate(r.flops / r.median_seconds, "FLOP/s").c_str(), format_sci(c.out_rel_err).c_str(),
      format_sci(c.out_max_abs_err).c_str(), format_sci(c.lse_max_abs_err).c_str(),
      format_sci(c.out_rel_tolerance).c_str(), dtype_name(r.out_dtype),
      c.pass ? "PASS: every output and LSE element written, all within tolerance of the oracle"
             : "FAIL: the backend disagrees with the oracle");
  if (!c.pass) {
    std::fprintf(stderr, "%s\n", c.detail.c_str());
    return Status::Internal("demo failed: decode on '" + r.backend + "' differs from the oracle");
  }
  return Status::Ok();
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto threads = std::make_shared<int>(0);
  CLI::App* sub = app.add_subcommand(
      "demo",
      "Run the library's main job on this machine: MLA decode with LSE on the best available backend checked "
      "against the oracle, and DCP on 4 CPU ranks checked against single-rank decode");
  sub->add_option("--threads", *threads, "Host threads (0: all)")->check(int_in_range(0, 1 << 16));
  set_command_body(sub, [threads] {
    const Status decode = decode_section(*threads);
    const Status dcp = dcp_demo_section(*threads);
    return decode.ok() ? dcp : decode;
  });
}

}  // namespace mladcp::cli
