// Calibration files: parsing with a check of every field, and writing them back.
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "mladcp/plan.h"
#include "plan/json_fields.h"

namespace mladcp::plan {
namespace {

using detail::Fields;
using nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kMaxInt = int64_t(1) << 40;
constexpr const char* kFormat = "mladcp-calibration-1";

struct OpName {
  CollectiveOp op;
  const char* name;
};
constexpr OpName kOps[] = {{CollectiveOp::kAllGather, "all_gather"},
                           {CollectiveOp::kAllToAll, "all_to_all"},
                           {CollectiveOp::kReduceScatter, "reduce_scatter"},
                           {CollectiveOp::kAllReduce, "all_reduce"},
                           {CollectiveOp::kLseAgRs, "lse_ag_rs"}};

Status parse_kv_dtype(const Fields& f, DType* out) {
  std::string s;
  MLADCP_RETURN_IF_ERROR(f.string("kv_dtype", &s));
  const auto d = parse_dtype(s);
  if (!d || (*d != DType::kBF16 && *d != DType::kFP8E4M3)) {
    return Status::InvalidArgument(f.where("kv_dtype") + ": accepted bf16, fp8; got \"" + s + "\"");
  }
  *out = *d;
  return Status::Ok();
}

Status parse_alpha_beta(const Fields& f, AlphaBeta* out) {
  MLADCP_RETURN_IF_ERROR(f.number("latency_us", 0, 1e6, &out->latency_us));
  MLADCP_RETURN_IF_ERROR(f.number("latency_per_extra_rank_us", 0, 1e6, &out->latency_per_extra_rank_us));
  MLADCP_RETURN_IF_ERROR(f.number("bus_gbps", 1e-3, 1e6, &out->bus_gbps));
  return Status::Ok();
}

Status parse_fabric(const Fields& f, FabricParams* out) {
  MLADCP_RETURN_IF_ERROR(f.string("source", &out->source));
  const std::pair<const char*, AlphaBeta*> ops[] = {{"all_gather", &out->all_gather},
                                                    {"all_to_all", &out->all_to_all},
                                                    {"reduce_scatter", &out->reduce_scatter},
                                                    {"all_reduce", &out->all_reduce}};
  for (const auto& [name, ab] : ops) {
    MLADCP_RETURN_IF_ERROR(f.object(name));
    MLADCP_RETURN_IF_ERROR(parse_alpha_beta(f.child(name), ab));
  }
  return Status::Ok();
}

Status parse_root(const Fields& root, Calibration* cal) {
  MLADCP_RETURN_IF_ERROR(root.string("format", &cal->format));
  if (cal->format != kFormat) {
    return Status::InvalidArgument(root.where("format") + ": expected \"" + kFormat + "\", got \"" + cal->format +
                                   "\"");
  }
  MLADCP_RETURN_IF_ERROR(root.string("gpu", &cal->gpu));
  MLADCP_RETURN_IF_ERROR(root.string("date", &cal->date));
  MLADCP_RETURN_IF_ERROR(root.string("commit", &cal->commit));
  MLADCP_RETURN_IF_ERROR(root.string("produced_by", &cal->produced_by, false));
  MLADCP_RETURN_IF_ERROR(root.string("notes", &cal->notes, false));

  MLADCP_RETURN_IF_ERROR(root.object("device"));
  const Fields dev = root.child("device");
  MLADCP_RETURN_IF_ERROR(dev.string("name", &cal->device.name));
  MLADCP_RETURN_IF_ERROR(dev.integer_as("sms", 1, 100000, &cal->device.sms));
  MLADCP_RETURN_IF_ERROR(dev.number("memory_gb", 1e-3, 1e6, &cal->device.memory_gb));
  MLADCP_RETURN_IF_ERROR(dev.integer_as("base_split_keys", 1, kMaxInt, &cal->device.base_split_keys));
  MLADCP_RETURN_IF_ERROR(dev.integer_as("rows_per_cta", 1, 4096, &cal->device.rows_per_cta));
  MLADCP_RETURN_IF_ERROR(dev.integer_as("two_per_sm_max_rows", 0, 32, &cal->device.two_per_sm_max_rows, false));
  MLADCP_RETURN_IF_ERROR(dev.integer_as("fp8_small_ctas_per_sm", 1, 2, &cal->device.fp8_small_ctas_per_sm, false));
  MLADCP_RETURN_IF_ERROR(dev.boolean("balanced_schedule", &cal->device.balanced_schedule, false));

  size_t n = 0;
  MLADCP_RETURN_IF_ERROR(root.array("kernel", &n));
  if (n == 0) return Status::InvalidArgument(root.where("kernel") + ": needs at least one measured point");
  cal->kernel.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Fields k = root.element("kernel", i);
    KernelPoint& p = cal->kernel[i];
    MLADCP_RETURN_IF_ERROR(k.integer_as("heads", 1, 65536, &p.heads));
    MLADCP_RETURN_IF_ERROR(k.integer_as("q_len", 1, 1024, &p.q_len));
    MLADCP_RETURN_IF_ERROR(k.integer_as("batch", 1, kMaxInt, &p.batch));
    MLADCP_RETURN_IF_ERROR(k.integer_as("keys", 1, kMaxInt, &p.keys));
    MLADCP_RETURN_IF_ERROR(parse_kv_dtype(k, &p.kv_dtype));
    MLADCP_RETURN_IF_ERROR(k.number("time_us", 1e-3, 1e9, &p.time_us));
    MLADCP_RETURN_IF_ERROR(k.string("source", &p.source, false));
  }

  MLADCP_RETURN_IF_ERROR(root.array("merge", &n));
  if (n == 0) return Status::InvalidArgument(root.where("merge") + ": needs at least one measured point");
  cal->merge.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Fields m = root.element("merge", i);
    MergePoint& p = cal->merge[i];
    std::string mode;
    MLADCP_RETURN_IF_ERROR(m.string("mode", &mode));
    const auto parsed = parse_dcp_merge_mode(mode);
    if (!parsed) return Status::InvalidArgument(m.where("mode") + ": accepted a2a, ag-rs; got \"" + mode + "\"");
    p.mode = *parsed;
    MLADCP_RETURN_IF_ERROR(m.integer_as("states", 1, 65536, &p.states));
    MLADCP_RETURN_IF_ERROR(m.integer_as("rows", 1, kMaxInt, &p.rows));
    MLADCP_RETURN_IF_ERROR(m.number("time_us", 1e-3, 1e9, &p.time_us));
    MLADCP_RETURN_IF_ERROR(m.string("source", &p.source, false));
  }
  MLADCP_RETURN_IF_ERROR(root.object("step_overhead_us"));
  MLADCP_RETURN_IF_ERROR(root.child("step_overhead_us").number("a2a", 0, 1e6, &cal->step_overhead_a2a_us));
  MLADCP_RETURN_IF_ERROR(root.child("step_overhead_us").number("ag-rs", 0, 1e6, &cal->step_overhead_ag_rs_us));

  MLADCP_RETURN_IF_ERROR(root.array("collectives", &n));
  cal->collectives.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Fields c = root.element("collectives", i);
    CollectiveCurve& curve = cal->collectives[i];
    std::string op, fabric;
    MLADCP_RETURN_IF_ERROR(c.string("op", &op));
    bool found = false;
    for (const OpName& o : kOps) {
      if (op == o.name) curve.op = o.op, found = true;
    }
    if (!found) {
      return Status::InvalidArgument(
          c.where("op") + ": accepted all_gather, all_to_all, reduce_scatter, all_reduce, lse_ag_rs; got \"" + op +
          "\"");
    }
    MLADCP_RETURN_IF_ERROR(c.string("fabric", &fabric));
    if (fabric == "nvlink") {
      curve.fabric = Fabric::kNvlink;
    } else if (fabric == "infiniband") {
      curve.fabric = Fabric::kInfiniband;
    } else {
      return Status::InvalidArgument(c.where("fabric") + ": accepted nvlink, infiniband; got \"" + fabric + "\"");
    }
    MLADCP_RETURN_IF_ERROR(c.integer_as("world", 2, 65536, &curve.world));
    MLADCP_RETURN_IF_ERROR(c.string("source", &curve.source, false));
    size_t np = 0;
    MLADCP_RETURN_IF_ERROR(c.array("points", &np));
    if (np == 0) return Status::InvalidArgument(c.where("points") + ": needs at least one [bytes, time_us] pair");
    for (size_t k = 0; k < np; ++k) {
      const json& pt = c.json().at("points").at(k);
      const std::string where = c.where("points") + "[" + std::to_string(k) + "]";
      if (!pt.is_array() || pt.size() != 2 || !pt[0].is_number() || !pt[1].is_number()) {
        return Status::InvalidArgument(where + ": expected [bytes, time_us], got " + pt.dump());
      }
      const CurvePoint p{pt[0].get<double>(), pt[1].get<double>()};
      if (!(p.bytes > 0) || !(p.time_us > 0) || p.bytes == kInf || p.time_us == kInf) {
        return Status::InvalidArgument(where + ": bytes and time_us must be positive, got " + pt.dump());
      }
      if (!curve.points.empty() && p.bytes <= curve.points.back().bytes) {
        return Status::InvalidArgument(where + ": sizes must increase, got " + pt.dump() + " after " +
                                       std::to_string(curve.points.back().bytes));
      }
      curve.points.push_back(p);
    }
  }

  MLADCP_RETURN_IF_ERROR(root.object("fabrics"));
  const Fields fabrics = root.child("fabrics");
  MLADCP_RETURN_IF_ERROR(fabrics.object("nvlink"));
  MLADCP_RETURN_IF_ERROR(parse_fabric(fabrics.child("nvlink"), &cal->nvlink));
  MLADCP_RETURN_IF_ERROR(fabrics.object("infiniband"));
  MLADCP_RETURN_IF_ERROR(parse_fabric(fabrics.child("infiniband"), &cal->infiniband));
  return Status::Ok();
}

json alpha_beta_json(const AlphaBeta& ab) {
  return {{"latency_us", ab.latency_us},
          {"latency_per_extra_rank_us", ab.latency_per_extra_rank_us},
          {"bus_gbps", ab.bus_gbps}};
}

json fabric_json(const FabricParams& f) {
  return {{"source", f.source},
          {"all_gather", alpha_beta_json(f.all_gather)},
          {"all_to_all", alpha_beta_json(f.all_to_all)},
          {"reduce_scatter", alpha_beta_json(f.reduce_scatter)},
          {"all_reduce", alpha_beta_json(f.all_reduce)}};
}

}  // namespace

const char* collective_op_name(CollectiveOp op) {
  for (const OpName& o : kOps) {
    if (o.op == op) return o.name;
  }
  return "?";
}

const char* fabric_name(Fabric f) { return f == Fabric::kNvlink ? "nvlink" : "infiniband"; }

Status parse_calibration(const std::string& json_text, const std::string& origin, Calibration* out) {
  if (out == nullptr) return Status::InvalidArgument("parse_calibration: out is null");
  json root;
  MLADCP_RETURN_IF_ERROR(detail::parse_object(json_text, origin, &root));
  Calibration cal;
  MLADCP_RETURN_IF_ERROR(parse_root(Fields(root, origin, ""), &cal));
  *out = std::move(cal);
  return Status::Ok();
}

Status load_calibration(const std::string& path, Calibration* out) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument("calibration file " + path + ": cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_calibration(ss.str(), path, out);
}

std::string calibration_to_json(const Calibration& cal) {
  json kernel = json::array(), merge = json::array(), collectives = json::array();
  for (const KernelPoint& p : cal.kernel) {
    kernel.push_back({{"heads", p.heads},
                      {"q_len", p.q_len},
                      {"batch", p.batch},
                      {"keys", p.keys},
                      {"kv_dtype", p.kv_dtype == DType::kFP8E4M3 ? "fp8" : "bf16"},
                      {"time_us", p.time_us},
                      {"source", p.source}});
  }
  for (const MergePoint& p : cal.merge) {
    merge.push_back({{"mode", dcp_merge_mode_name(p.mode)},
                     {"states", p.states},
                     {"rows", p.rows},
                     {"time_us", p.time_us},
                     {"source", p.source}});
  }
  for (const CollectiveCurve& c : cal.collectives) {
    json points = json::array();
    for (const CurvePoint& p : c.points) points.push_back({p.bytes, p.time_us});
    collectives.push_back({{"op", collective_op_name(c.op)},
                           {"fabric", fabric_name(c.fabric)},
                           {"world", c.world},
                           {"source", c.source},
                           {"points", points}});
  }
  const json root = {{"format", kFormat},
                     {"gpu", cal.gpu},
                     {"date", cal.date},
                     {"commit", cal.commit},
                     {"produced_by", cal.produced_by},
                     {"notes", cal.notes},
                     {"device",
                      {{"name", cal.device.name},
                       {"sms", cal.device.sms},
                       {"memory_gb", cal.device.memory_gb},
                       {"base_split_keys", cal.device.base_split_keys},
                       {"rows_per_cta", cal.device.rows_per_cta},
                       {"two_per_sm_max_rows", cal.device.two_per_sm_max_rows},
                       {"fp8_small_ctas_per_sm", cal.device.fp8_small_ctas_per_sm},
                       {"balanced_schedule", cal.device.balanced_schedule}}},
                     {"kernel", kernel},
                     {"merge", merge},
                     {"step_overhead_us", {{"a2a", cal.step_overhead_a2a_us}, {"ag-rs", cal.step_overhead_ag_rs_us}}},
                     {"collectives", collectives},
                     {"fabrics", {{"nvlink", fabric_json(cal.nvlink)}, {"infiniband", fabric_json(cal.infiniband)}}}};
  return root.dump(2) + "\n";
}

}  // namespace mladcp::plan
