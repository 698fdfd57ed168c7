#include "testkit/dcp_command.h"

#include <optional>

#include "core/validate.h"

namespace mladcp::testkit {

using detail::invalid;

Status check_dcp_options(const DcpCommandOptions& o, int world, DcpCommandSetup* out) {
  if (!out) return invalid("out: null");
  if (world < 1) return invalid("world=", world, ": must be >= 1");
  if (o.heads % world != 0)
    return invalid("--heads=", o.heads, ": must be a multiple of the number of ranks (", world,
                   "); each rank owns heads / ranks query heads");
  if (o.context < o.q_len)
    return invalid("--context=", o.context, ": must be >= --q-len=", o.q_len, " (a sequence holds its new tokens)");
  if (o.interleave < 1 || o.block_size % o.interleave != 0)
    return invalid("--block-size=", o.block_size, ": must be a multiple of --interleave=", o.interleave);
  const std::optional<DType> kv = parse_dtype(o.kv_dtype);
  if (!kv || (*kv != DType::kBF16 && *kv != DType::kFP8E4M3))
    return invalid("--kv-dtype=", o.kv_dtype, ": accepted bf16, fp8");
  const std::optional<DType> dtype = parse_dtype(o.out_dtype);
  if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kFP32))
    return invalid("--out-dtype=", o.out_dtype, ": accepted bf16, fp32");
  const std::optional<DcpMergeMode> mode = parse_dcp_merge_mode(o.merge);
  if (!mode) return invalid("--merge=", o.merge, ": accepted a2a, ag-rs");
  synthetic::Config& c = out->problem;
  c = synthetic::Config{};
  c.num_seqs = o.batch;
  c.q_len = o.q_len;
  c.num_heads = o.heads;
  c.block_size = o.block_size;
  c.seq_lens = synthetic::uniform_lengths(o.batch, o.context);
  c.kv_dtype = *kv;
  c.kv_scale = *kv == DType::kFP8E4M3 ? 0.25f : 1.0f;
  c.seed = o.seed;
  out->out_dtype = *dtype;
  out->merge_mode = *mode;
  return Status::Ok();
}

}  // namespace mladcp::testkit
