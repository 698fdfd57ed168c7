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

uint64_t text_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::vector<SharedFlag> shared_flags(const DcpCommandOptions& o) {
  auto num = [](const char* n, double v) { return SharedFlag{n, v, ""}; };
  auto txt = [](const char* n, const std::string& v) { return SharedFlag{n, double(text_hash(v) >> 12), v}; };
  return {txt("--backend", o.backend),
          num("--heads", o.heads),
          num("--batch", o.batch),
          num("--context", o.context),
          num("--q-len", o.q_len),
          num("--block-size", o.block_size),
          txt("--kv-dtype", o.kv_dtype),
          txt("--out-dtype", o.out_dtype),
          txt("--merge", o.merge),
          num("--interleave", o.interleave),
          num("--lse", o.lse),
          num("--iters", o.iters),
          num("--deadline-ms", o.deadline_ms),
          num("--seed", double(o.seed)),
          num("--check", o.check)};
}

Status flags_agree(const std::vector<SharedFlag>& mine, const std::vector<double>& all, int world, int rank) {
  const size_t n = mine.size();
  if (all.size() != n * size_t(world)) return Status::Internal("flags_agree: wrong number of values");
  std::string differ;
  for (size_t i = 0; i < n; ++i) {
    bool same = true;
    for (int r = 0; r < world; ++r) same = same && all[size_t(r) * n + i] == mine[i].value;
    if (same) continue;
    if (!differ.empty()) differ += "; ";
    differ += mine[i].name;
    if (!mine[i].text.empty()) {  // a text flag: only this rank's own value is known here
      differ += detail::cat(" (", mine[i].text, " on rank ", rank, ", another value elsewhere)");
      continue;
    }
    differ += " (";
    for (int r = 0; r < world; ++r)
      differ += detail::cat(r ? ", " : "", "rank ", r, ": ", int64_t(all[size_t(r) * n + i]));
    differ += ")";
  }
  if (differ.empty()) return Status::Ok();
  return invalid("ranks disagree on flags every rank must share: ", differ, "; start every rank with the same flags");
}

}  // namespace mladcp::testkit
