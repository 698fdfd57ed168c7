// Predictions set against measured rows: single-GPU decode calls and DCP steps recorded in docs/perf.
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "mladcp/plan.h"
#include "plan/json_fields.h"

namespace mladcp::plan {
namespace {

using detail::Fields;
using nlohmann::json;
constexpr int64_t kMaxInt = int64_t(1) << 40;
constexpr const char* kFormat = "mladcp-measured-1";

Status parse_dtype_field(const Fields& f, DType* out) {
  std::string s = "bf16";
  MLADCP_RETURN_IF_ERROR(f.string("kv_dtype", &s, false));
  const auto d = parse_dtype(s);
  if (!d || (*d != DType::kBF16 && *d != DType::kFP8E4M3)) {
    return Status::InvalidArgument(f.where("kv_dtype") + ": accepted bf16, fp8; got \"" + s + "\"");
  }
  *out = *d;
  return Status::Ok();
}

bool same_point(const KernelPoint& p, const KernelQuery& q) {
  return p.heads == q.heads && p.q_len == q.q_len && p.batch == q.batch && p.keys == q.keys && p.kv_dtype == q.kv_dtype;
}

}  // namespace

Status parse_measured_rows(const std::string& json_text, const std::string& origin, std::vector<MeasuredRow>* out) {
  if (out == nullptr) return Status::InvalidArgument("parse_measured_rows: out is null");
  json root;
  MLADCP_RETURN_IF_ERROR(detail::parse_object(json_text, origin, &root));
  const Fields f(root, origin, "");
  std::string format;
  MLADCP_RETURN_IF_ERROR(f.string("format", &format));
  if (format != kFormat) {
    return Status::InvalidArgument(f.where("format") + ": expected \"" + kFormat + "\", got \"" + format + "\"");
  }
  size_t n = 0;
  MLADCP_RETURN_IF_ERROR(f.array("rows", &n));
  std::vector<MeasuredRow> rows(n);
  for (size_t i = 0; i < n; ++i) {
    const Fields r = f.element("rows", i);
    MeasuredRow& m = rows[i];
    MLADCP_RETURN_IF_ERROR(r.string("kind", &m.kind));
    MLADCP_RETURN_IF_ERROR(r.string("label", &m.label, false));
    MLADCP_RETURN_IF_ERROR(r.string("source", &m.source, false));
    MLADCP_RETURN_IF_ERROR(r.number("time_us", 1e-3, 1e9, &m.time_us));
    if (r.has("gate")) {
      if (!r.json().at("gate").is_boolean())
        return Status::InvalidArgument(r.where("gate") + ": expected true or false");
      m.gate = r.json().at("gate").get<bool>();
    }
    if (m.kind == "kernel") {
      MLADCP_RETURN_IF_ERROR(r.integer_as("heads", 1, 65536, &m.kernel.heads));
      MLADCP_RETURN_IF_ERROR(r.integer_as("q_len", 1, 1024, &m.kernel.q_len, false));
      MLADCP_RETURN_IF_ERROR(r.integer_as("batch", 1, kMaxInt, &m.kernel.batch));
      MLADCP_RETURN_IF_ERROR(r.integer_as("keys", 1, kMaxInt, &m.kernel.keys));
      MLADCP_RETURN_IF_ERROR(parse_dtype_field(r, &m.kernel.kv_dtype));
    } else if (m.kind == "step") {
      MLADCP_RETURN_IF_ERROR(r.integer_as("dcp", 1, 65536, &m.step.dcp));
      MLADCP_RETURN_IF_ERROR(r.integer_as("heads_per_rank", 1, 65536, &m.step.heads_per_rank));
      MLADCP_RETURN_IF_ERROR(r.integer_as("q_len", 1, 1024, &m.step.q_len, false));
      MLADCP_RETURN_IF_ERROR(r.integer_as("batch", 1, kMaxInt, &m.step.batch));
      MLADCP_RETURN_IF_ERROR(r.integer_as("context", 1, kMaxInt, &m.step.context));
      MLADCP_RETURN_IF_ERROR(parse_dtype_field(r, &m.step.kv_dtype));
      std::string merge = "a2a";
      MLADCP_RETURN_IF_ERROR(r.string("merge", &merge, false));
      const auto mode = parse_dcp_merge_mode(merge);
      if (!mode) return Status::InvalidArgument(r.where("merge") + ": accepted a2a, ag-rs; got \"" + merge + "\"");
      m.step.merge_mode = *mode;
      MLADCP_RETURN_IF_ERROR(r.number("attention_us", 0, 1e9, &m.attention_us, false));
    } else {
      return Status::InvalidArgument(r.where("kind") + ": accepted kernel, step; got \"" + m.kind + "\"");
    }
  }
  *out = std::move(rows);
  return Status::Ok();
}

Status validate(const Calibration& cal, const std::vector<MeasuredRow>& rows, std::vector<ValidationRow>* out) {
  if (out == nullptr) return Status::InvalidArgument("validate: out is null");
  PerfModel model;
  MLADCP_RETURN_IF_ERROR(PerfModel::create(cal, &model));
  std::vector<ValidationRow> result;
  for (const MeasuredRow& m : rows) {
    ValidationRow v;
    v.measured = m;
    v.leave_one_out_error = std::numeric_limits<double>::quiet_NaN();
    v.attention_error = std::numeric_limits<double>::quiet_NaN();
    if (m.kind == "kernel") {
      MLADCP_RETURN_IF_ERROR(model.kernel_us(m.kernel, &v.predicted_us));
      Calibration without = cal;
      without.kernel.clear();
      for (const KernelPoint& p : cal.kernel) {
        if (same_point(p, m.kernel)) {
          v.in_calibration = true;
        } else {
          without.kernel.push_back(p);
        }
      }
      PerfModel loo;
      double loo_us = 0;
      if (v.in_calibration && !without.kernel.empty() && PerfModel::create(without, &loo).ok() &&
          loo.kernel_us(m.kernel, &loo_us).ok()) {
        v.leave_one_out_error = loo_us / m.time_us - 1.0;
      }
    } else {
      StepPrediction s;
      MLADCP_RETURN_IF_ERROR(predict_step(m.step, model, &s));
      v.predicted_us = s.step_us;
      v.predicted_attention_us = s.attention_us;
      if (m.attention_us > 0) v.attention_error = s.attention_us / m.attention_us - 1.0;
    }
    v.error = v.predicted_us / m.time_us - 1.0;
    result.push_back(v);
  }
  *out = std::move(result);
  return Status::Ok();
}

}  // namespace mladcp::plan
