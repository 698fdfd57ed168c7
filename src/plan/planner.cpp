// The planner: model presets, the KV bytes of a DCP rank, the prediction of one DCP step, and the
// enumeration of layouts DP × TP × DCP for a GPU count.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <sstream>

#include "mladcp/plan.h"

namespace mladcp::plan {
namespace {

constexpr int kLatentValues = 576;  // kv_c (512) + k_pe (64) per token and layer
constexpr int kOutValues = 512;

// Published model configurations (attention heads, layers, width, total parameters; fp8 weights).
const std::map<std::string, ModelSpec>& presets() {
  static const std::map<std::string, ModelSpec> p = {
      {"deepseek-v3", {"DeepSeek-V3", 128, 61, 7168, 671, 1}},
      {"deepseek-r1", {"DeepSeek-R1", 128, 61, 7168, 671, 1}},
      {"kimi-k2", {"Kimi-K2", 64, 61, 7168, 1040, 1}},
  };
  return p;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

Status check_step_query(const StepQuery& q) {
  if (q.dcp < 1) return Status::InvalidArgument("step: dcp must be >= 1, got " + std::to_string(q.dcp));
  if (q.heads_per_rank < 1) {
    return Status::InvalidArgument("step: heads_per_rank must be >= 1, got " + std::to_string(q.heads_per_rank));
  }
  if (q.q_len < 1) return Status::InvalidArgument("step: q_len must be >= 1, got " + std::to_string(q.q_len));
  if (q.batch < 1) return Status::InvalidArgument("step: batch must be >= 1, got " + std::to_string(q.batch));
  if (q.context < q.q_len) {
    return Status::InvalidArgument("step: context must be >= q_len (" + std::to_string(q.q_len) + "), got " +
                                   std::to_string(q.context));
  }
  return Status::Ok();
}

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : presets()) names.push_back(k);
  return names;
}

Status find_model_preset(const std::string& name, ModelSpec* out) {
  const auto it = presets().find(lower(name));
  if (it == presets().end()) {
    std::string accepted;
    for (const std::string& n : model_preset_names()) accepted += (accepted.empty() ? "" : ", ") + n;
    return Status::InvalidArgument("--model=" + name + ": unknown model; accepted " + accepted +
                                   " (or give --heads and --layers)");
  }
  *out = it->second;
  return Status::Ok();
}

Status kv_bytes_per_gpu(const KvBytesQuery& q, double* bytes) {
  if (q.sequences < 0) return Status::InvalidArgument("kv bytes: sequences must be >= 0");
  if (q.context < 0) return Status::InvalidArgument("kv bytes: context must be >= 0");
  if (q.dcp < 1) return Status::InvalidArgument("kv bytes: dcp must be >= 1, got " + std::to_string(q.dcp));
  if (q.block_size < 1) return Status::InvalidArgument("kv bytes: block_size must be >= 1");
  if (q.layers < 1) return Status::InvalidArgument("kv bytes: layers must be >= 1");
  if (q.kv_dtype != DType::kBF16 && q.kv_dtype != DType::kFP8E4M3) {
    return Status::InvalidArgument(std::string("kv bytes: kv_dtype: accepted bf16, fp8; got ") +
                                   dtype_name(q.kv_dtype));
  }
  const int64_t span = int64_t(q.block_size) * q.dcp;  // tokens of one virtual block
  const int64_t blocks = (q.context + span - 1) / span;
  *bytes =
      double(q.sequences) * double(blocks) * q.block_size * kLatentValues * double(dtype_size(q.kv_dtype)) * q.layers;
  return Status::Ok();
}

Status predict_step(const StepQuery& q, const PerfModel& model, StepPrediction* out) {
  MLADCP_RETURN_IF_ERROR(check_step_query(q));
  StepPrediction p;
  const int w = q.dcp;
  const int64_t t = q.batch * q.q_len;
  const int64_t keys = (q.context + w - 1) / w;  // the longest shard (interleave 1)
  MLADCP_RETURN_IF_ERROR(model.kernel_us({q.heads_per_rank * w, q.q_len, q.batch, keys, q.kv_dtype}, &p.attention_us));
  MLADCP_RETURN_IF_ERROR(
      model.kernel_us({q.heads_per_rank, q.q_len, q.batch, q.context, q.kv_dtype}, &p.tp_attention_us));
  if (w > 1) {
    const double rows = double(t) * q.heads_per_rank;
    MLADCP_RETURN_IF_ERROR(model.collective_us(
        {CollectiveOp::kAllGather, w, double(w) * rows * kLatentValues * 2.0, q.ranks_per_node}, &p.q_all_gather_us));
    if (q.merge_mode == DcpMergeMode::kAllToAll) {
      MLADCP_RETURN_IF_ERROR(model.collective_us(
          {CollectiveOp::kAllToAll, w, double(w) * rows * (kOutValues + 1) * 4.0, q.ranks_per_node}, &p.exchange_us));
    } else {
      MLADCP_RETURN_IF_ERROR(model.collective_us(
          {CollectiveOp::kLseAgRs, w, double(w) * rows * kOutValues * 4.0, q.ranks_per_node}, &p.exchange_us));
    }
    MLADCP_RETURN_IF_ERROR(model.merge_us({q.merge_mode, w, int64_t(rows)}, &p.merge_us));
    p.overhead_us = model.step_overhead_us(q.merge_mode);
  }
  p.step_us = p.q_all_gather_us + p.attention_us + p.exchange_us + p.merge_us + p.overhead_us;
  *out = p;
  return Status::Ok();
}

Status make_plan(const PlanParams& params, const PerfModel& model, Plan* out) {
  if (out == nullptr) return Status::InvalidArgument("make_plan: out is null");
  const ModelSpec& m = params.model;
  if (m.num_heads < 1) return Status::InvalidArgument("--heads must be >= 1, got " + std::to_string(m.num_heads));
  if (m.num_layers < 1) return Status::InvalidArgument("--layers must be >= 1, got " + std::to_string(m.num_layers));
  if (m.hidden < 0) return Status::InvalidArgument("--hidden must be >= 0, got " + std::to_string(m.hidden));
  if (m.params_billions < 0) return Status::InvalidArgument("--params-b must be >= 0");
  if (params.kv_dtype != DType::kBF16 && params.kv_dtype != DType::kFP8E4M3) {
    return Status::InvalidArgument(std::string("--kv-dtype=") + dtype_name(params.kv_dtype) + ": accepted bf16, fp8");
  }
  if (params.q_len < 1) return Status::InvalidArgument("--q-len must be >= 1, got " + std::to_string(params.q_len));
  if (params.gpus < 1) return Status::InvalidArgument("--gpus must be >= 1, got " + std::to_string(params.gpus));
  if (params.gpus_per_node < 1) {
    return Status::InvalidArgument("--gpus-per-node must be >= 1, got " + std::to_string(params.gpus_per_node));
  }
  if (params.block_size < 1) {
    return Status::InvalidArgument("--block-size must be >= 1, got " + std::to_string(params.block_size));
  }
  if (params.contexts.empty()) return Status::InvalidArgument("--context: give at least one context length");
  if (params.batches.empty()) return Status::InvalidArgument("--batch: give at least one batch size");
  for (int64_t c : params.contexts) {
    if (c < params.q_len) {
      return Status::InvalidArgument("--context=" + std::to_string(c) + ": must be >= --q-len (" +
                                     std::to_string(params.q_len) + ")");
    }
  }
  for (int64_t b : params.batches) {
    if (b < 1) return Status::InvalidArgument("--batch=" + std::to_string(b) + ": must be >= 1");
  }
  if (!(params.memory_utilization > 0 && params.memory_utilization <= 1)) {
    return Status::InvalidArgument("--memory-utilization must be in (0, 1]");
  }
  if (params.max_dcp < 0) return Status::InvalidArgument("--max-dcp must be >= 0");
  std::vector<int> tps;
  for (int tp = 1; tp <= params.gpus; ++tp) {
    if (params.gpus % tp == 0 && m.num_heads % tp == 0) tps.push_back(tp);
  }
  if (tps.empty()) return Status::InvalidArgument("--gpus: no TP size divides both the GPUs and the heads");

  Plan plan;
  const double mem_gb = model.calibration().device.memory_gb;
  for (int64_t context : params.contexts) {
    for (int64_t batch : params.batches) {
      const size_t first = plan.rows.size();
      for (int tp : tps) {
        const int dp = params.gpus / tp;
        for (int dcp = 1; dcp <= tp; ++dcp) {
          if (tp % dcp != 0 || (params.max_dcp > 0 && dcp > params.max_dcp)) continue;
          PlanRow r;
          r.context = context, r.batch = batch, r.dp = dp, r.tp = tp, r.dcp = dcp;
          r.heads_per_rank = m.num_heads / tp;
          r.gathered_heads = r.heads_per_rank * dcp;
          r.batch_per_replica = (batch + dp - 1) / dp;
          r.tp_crosses_nodes = tp > params.gpus_per_node || params.gpus_per_node % tp != 0;
          r.dcp_crosses_nodes = dcp > params.gpus_per_node || params.gpus_per_node % dcp != 0;
          if (params.gpus <= params.gpus_per_node) r.tp_crosses_nodes = r.dcp_crosses_nodes = false;
          r.kv_budget_bytes =
              params.kv_budget_gb >= 0
                  ? params.kv_budget_gb * 1e9
                  : (mem_gb * params.memory_utilization - m.params_billions * m.weight_bytes / tp) * 1e9;
          double per_seq = 0;
          MLADCP_RETURN_IF_ERROR(
              kv_bytes_per_gpu({1, context, dcp, params.block_size, m.num_layers, params.kv_dtype}, &per_seq));
          r.kv_bytes_per_gpu = per_seq * double(r.batch_per_replica);
          r.max_batch = r.kv_budget_bytes > 0 ? int64_t(std::floor(r.kv_budget_bytes / per_seq)) * dp : 0;
          r.fits = r.kv_bytes_per_gpu <= r.kv_budget_bytes;

          StepQuery q;
          q.dcp = dcp, q.heads_per_rank = r.heads_per_rank, q.q_len = params.q_len, q.batch = r.batch_per_replica;
          q.context = context, q.kv_dtype = params.kv_dtype;
          q.ranks_per_node = r.dcp_crosses_nodes ? std::min(dcp, params.gpus_per_node) : 0;
          StepPrediction a2a, agrs;
          q.merge_mode = DcpMergeMode::kAllToAll;
          MLADCP_RETURN_IF_ERROR(predict_step(q, model, &a2a));
          q.merge_mode = DcpMergeMode::kAllGatherReduceScatter;
          MLADCP_RETURN_IF_ERROR(predict_step(q, model, &agrs));
          const bool use_agrs = dcp > 1 && agrs.exchange_us + agrs.merge_us < a2a.exchange_us + a2a.merge_us;
          const StepPrediction& s = use_agrs ? agrs : a2a;
          const StepPrediction& other = use_agrs ? a2a : agrs;
          r.merge_mode = use_agrs ? DcpMergeMode::kAllGatherReduceScatter : DcpMergeMode::kAllToAll;
          r.attention_us = s.attention_us, r.q_all_gather_us = s.q_all_gather_us;
          r.exchange_us = s.exchange_us, r.merge_us = s.merge_us, r.overhead_us = s.overhead_us;
          r.other_mode_exchange_merge_us = dcp > 1 ? other.exchange_us + other.merge_us : 0;
          r.tp_attention_us = s.tp_attention_us;
          if (m.hidden > 0 && tp > 1) {
            const double bytes = double(r.batch_per_replica) * params.q_len * m.hidden * 2.0;
            MLADCP_RETURN_IF_ERROR(model.collective_us(
                {CollectiveOp::kAllReduce, tp, bytes, r.tp_crosses_nodes ? std::min(tp, params.gpus_per_node) : 0},
                &r.tp_all_reduce_us));
          }
          r.layer_us = s.step_us + r.tp_all_reduce_us;
          r.step_vs_tp = s.step_us / s.tp_attention_us;
          r.step_ms = r.layer_us * m.num_layers / 1000.0;
          r.tokens_per_s = double(batch) * params.q_len / (r.step_ms / 1000.0);
          plan.rows.push_back(r);
        }
      }
      PlanRow* best = nullptr;
      for (size_t i = first; i < plan.rows.size(); ++i) {
        PlanRow& r = plan.rows[i];
        if (r.fits && (best == nullptr || r.step_ms < best->step_ms)) best = &r;
      }
      if (best != nullptr) best->best = true;
    }
  }
  const Calibration& cal = model.calibration();
  std::ostringstream os;
  os << "calibration: " << cal.gpu << ", " << cal.date << ", commit " << cal.commit;
  plan.assumptions.push_back(os.str());
  plan.assumptions.push_back(
      "per layer and rank: attention = the calibrated decode of heads/TP·DCP gathered heads over ceil(context/DCP) "
      "keys; q all-gather, exchange and merge from the calibrated collectives and merge kernels; the attention "
      "output all-reduce over TP when the model width is known; MoE/MLP and the other projections are not modelled");
  plan.assumptions.push_back(
      "DCP groups are consecutive ranks of a TP group (DCP divides TP); a group larger than --gpus-per-node "
      "(" +
      std::to_string(params.gpus_per_node) + ") runs its collectives at the InfiniBand parameters of the calibration");
  plan.assumptions.push_back(params.kv_budget_gb >= 0
                                 ? "KV budget per GPU: " + num(params.kv_budget_gb) + " GB (given)"
                                 : "KV budget per GPU: " + num(params.memory_utilization) + " x " + num(mem_gb) +
                                       " GB HBM minus the weights (" + num(m.params_billions) + "e9 params x " +
                                       num(m.weight_bytes) + " B) / TP");
  plan.assumptions.push_back("batch = concurrent sequences over all GPUs, spread evenly over the DP replicas");
  *out = std::move(plan);
  return Status::Ok();
}

}  // namespace mladcp::plan
