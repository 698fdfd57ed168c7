// `mladcp plan`: what each factorization DP × TP × DCP of a GPU count costs for a model, context lengths
// and batch sizes (KV bytes per GPU, largest batch in the HBM budget, attention and DCP phases per layer
// and per step, merge mode), predicted from a calibration file; `--validate` sets the model against
// measured rows. The model and its assumptions: docs/planner.md.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "mladcp/plan.h"

namespace mladcp::cli {
namespace {

using nlohmann::json;
namespace plan = mladcp::plan;

struct Options {
  std::string model = "deepseek-v3";
  int heads = 0, layers = 0, hidden = -1;
  double params_b = -1;
  std::string kv_dtype = "bf16";
  int q_len = 1;
  int gpus = 8, gpus_per_node = 8;
  std::string contexts = "32K,128K,512K";
  std::string batches = "1,8,64";
  int block_size = 64;
  double kv_budget_gb = -1, memory_utilization = 0.9;
  int max_dcp = 0;
  std::string calibration;
  double ib_bw_gbps = 0, ib_latency_us = -1;
  bool json = false, markdown = false, best_only = false;
  std::string validate;
  double tolerance = 0.15;
};

// The calibration file used without --calibration: $MLADCP_CALIBRATION, the installed copy, then the
// copy in the source tree this tool was built from.
std::string default_calibration() {
  if (const char* env = std::getenv("MLADCP_CALIBRATION"); env != nullptr && *env != '\0') return env;
  for (const char* path : {MLADCP_INSTALLED_CALIBRATION, MLADCP_SOURCE_CALIBRATION}) {
    if (std::FILE* f = std::fopen(path, "r")) {
      std::fclose(f);
      return path;
    }
  }
  return MLADCP_SOURCE_CALIBRATION;
}

// "32K,128K,1M,4096" → token counts (K = 1024, M = 1048576).
Status parse_sizes(const std::string& flag, const std::string& text, std::vector<int64_t>* out) {
  std::stringstream ss(text);
  std::string item;
  out->clear();
  while (std::getline(ss, item, ',')) {
    int64_t mult = 1;
    std::string digits = item;
    if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'k')) mult = 1024, digits.pop_back();
    if (!digits.empty() && (digits.back() == 'M' || digits.back() == 'm')) mult = 1 << 20, digits.pop_back();
    char* end = nullptr;
    const long long v = std::strtoll(digits.c_str(), &end, 10);
    if (digits.empty() || *end != '\0' || v < 1 || v > (int64_t(1) << 40) / mult) {
      return Status::InvalidArgument(flag + "=" + text +
                                     ": expected positive integers separated by commas (K, M suffixes)");
    }
    out->push_back(v * mult);
  }
  if (out->empty()) return Status::InvalidArgument(flag + "=" + text + ": give at least one value");
  return Status::Ok();
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string tokens_label(int64_t n) {
  if (n % (1 << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n % 1024 == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

// Rows of cells printed as an aligned text table or as a markdown table.
std::string render(const std::vector<std::vector<std::string>>& rows, bool markdown, size_t right_from) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (size_t k = 0; k < rows.size(); ++k) {
    std::string line = markdown ? "|" : "";
    for (size_t i = 0; i < rows[k].size(); ++i) {
      const std::string& c = rows[k][i];
      const std::string pad(width[i] - c.size(), ' ');
      const std::string cell = i >= right_from ? pad + c : c + pad;
      line += markdown ? " " + cell + " |" : (i ? "  " : "") + cell;
    }
    while (!markdown && !line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
    if (markdown && k == 0) {
      std::string sep = "|";
      for (size_t i = 0; i < width.size(); ++i)
        sep += (i >= right_from ? std::string(width[i] + 1, '-') + ":" : std::string(width[i] + 2, '-')) + "|";
      out += sep + "\n";
    }
  }
  return out;
}

std::string fabric_label(const plan::PlanRow& r) {
  if (r.dcp == 1) return "-";
  return r.dcp_crosses_nodes ? "IB" : "NVLink";
}

// One line per (context, batch): the best layout, and what the best one without DCP costs or why none fits.
std::string verdict(const plan::Plan& p, size_t first, size_t end) {
  const plan::PlanRow* best = nullptr;
  const plan::PlanRow* no_dcp = nullptr;
  for (size_t k = first; k < end; ++k) {
    const plan::PlanRow& r = p.rows[k];
    if (r.best) best = &r;
    if (r.dcp == 1 && r.fits && (no_dcp == nullptr || r.step_ms < no_dcp->step_ms)) no_dcp = &r;
  }
  if (best == nullptr) return "verdict: no layout fits the KV budget; more GPUs, fp8 KV or fewer sequences";
  std::ostringstream os;
  os << "verdict: " << best->dp << "x" << best->tp << "x" << best->dcp << " (" << fixed(best->step_ms, 2)
     << " ms per step";
  if (best->dcp > 1) os << ", DCP " << best->dcp << " over " << (best->dcp_crosses_nodes ? "InfiniBand" : "NVLink");
  os << ")";
  if (best->dcp == 1) {
    os << ": DCP does not pay here";
  } else if (no_dcp == nullptr) {
    os << "; without DCP the KV does not fit";
  } else {
    os << "; without DCP " << no_dcp->dp << "x" << no_dcp->tp << "x1 takes " << fixed(no_dcp->step_ms, 2) << " ms ("
       << fixed(no_dcp->step_ms / best->step_ms, 2) << "x)";
  }
  return os.str();
}

std::string plan_text(const plan::Plan& p, const plan::PlanParams& params, bool markdown) {
  std::string out;
  std::ostringstream head;
  head << params.model.name << ": " << params.model.num_heads << " heads, " << params.model.num_layers << " layers, KV "
       << dtype_name(params.kv_dtype) << ", q_len " << params.q_len << "; " << params.gpus << " GPUs ("
       << params.gpus_per_node << " per node)";
  out += markdown ? "### " + head.str() + "\n\n" : head.str() + "\n";
  size_t i = 0;
  while (i < p.rows.size()) {
    const size_t first = i;
    const int64_t ctx = p.rows[i].context, batch = p.rows[i].batch;
    std::vector<std::vector<std::string>> t = {{"DPxTPxDCP", "heads/rank", "gathered", "KV/GPU GB", "budget GB",
                                                "max batch", "attn us", "q AG us", "exch us", "merge us", "layer us",
                                                "step ms", "vs TP attn", "tok/s", "merge", "DCP over", "note"}};
    for (; i < p.rows.size() && p.rows[i].context == ctx && p.rows[i].batch == batch; ++i) {
      const plan::PlanRow& r = p.rows[i];
      t.push_back({std::to_string(r.dp) + "x" + std::to_string(r.tp) + "x" + std::to_string(r.dcp),
                   std::to_string(r.heads_per_rank), std::to_string(r.gathered_heads),
                   fixed(r.kv_bytes_per_gpu / 1e9, 2), r.kv_budget_bytes > 0 ? fixed(r.kv_budget_bytes / 1e9, 1) : "-",
                   std::to_string(r.max_batch), fixed(r.attention_us, 1), fixed(r.q_all_gather_us, 1),
                   fixed(r.exchange_us, 1), fixed(r.merge_us, 1), fixed(r.layer_us, 1), fixed(r.step_ms, 2),
                   fixed(r.step_vs_tp, 2), fixed(r.tokens_per_s, 0),
                   r.dcp > 1 ? dcp_merge_mode_name(r.merge_mode) : "-", fabric_label(r),
                   r.best                   ? "best"
                   : r.fits                 ? ""
                   : r.kv_budget_bytes <= 0 ? "weights do not fit"
                                            : "KV does not fit"});
    }
    const std::string title = "context " + tokens_label(ctx) + ", batch " + std::to_string(batch);
    out += markdown ? "\n#### " + title + "\n\n" : "\n" + title + "\n";
    out += render(t, markdown, 1);
    out += (markdown ? "\n" : "") + verdict(p, first, i) + "\n";
  }
  out += markdown ? "\nAssumptions:\n\n" : "\nassumptions:\n";
  for (const std::string& a : p.assumptions) out += "- " + a + "\n";
  return out;
}

json plan_json(const plan::Plan& p, const plan::PlanParams& params) {
  json rows = json::array();
  for (const plan::PlanRow& r : p.rows) {
    rows.push_back({{"context", r.context},
                    {"batch", r.batch},
                    {"dp", r.dp},
                    {"tp", r.tp},
                    {"dcp", r.dcp},
                    {"heads_per_rank", r.heads_per_rank},
                    {"gathered_heads", r.gathered_heads},
                    {"batch_per_replica", r.batch_per_replica},
                    {"dcp_crosses_nodes", r.dcp_crosses_nodes},
                    {"tp_crosses_nodes", r.tp_crosses_nodes},
                    {"kv_bytes_per_gpu", r.kv_bytes_per_gpu},
                    {"kv_budget_bytes", r.kv_budget_bytes},
                    {"max_batch", r.max_batch},
                    {"fits", r.fits},
                    {"per_layer_us",
                     {{"attention", r.attention_us},
                      {"q_all_gather", r.q_all_gather_us},
                      {"exchange", r.exchange_us},
                      {"merge", r.merge_us},
                      {"overhead", r.overhead_us},
                      {"tp_all_reduce", r.tp_all_reduce_us},
                      {"total", r.layer_us},
                      {"tp_attention", r.tp_attention_us},
                      {"other_mode_exchange_merge", r.other_mode_exchange_merge_us}}},
                    {"merge_mode", dcp_merge_mode_name(r.merge_mode)},
                    {"step_vs_tp_attention", r.step_vs_tp},
                    {"step_ms", r.step_ms},
                    {"tokens_per_s", r.tokens_per_s},
                    {"best", r.best}});
  }
  return {{"model",
           {{"name", params.model.name},
            {"heads", params.model.num_heads},
            {"layers", params.model.num_layers},
            {"hidden", params.model.hidden},
            {"kv_dtype", dtype_name(params.kv_dtype)},
            {"q_len", params.q_len}}},
          {"gpus", params.gpus},
          {"gpus_per_node", params.gpus_per_node},
          {"rows", rows},
          {"assumptions", p.assumptions}};
}

std::string pct(double e) {
  if (std::isnan(e)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", 100.0 * e);
  return buf;
}

Status run_validation(const Options& o, const plan::Calibration& cal, const std::string& cal_path) {
  std::FILE* f = std::fopen(o.validate.c_str(), "r");
  if (f == nullptr) return Status::InvalidArgument("--validate=" + o.validate + ": cannot be opened");
  std::string text;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
  std::fclose(f);
  std::vector<plan::MeasuredRow> rows;
  MLADCP_RETURN_IF_ERROR(plan::parse_measured_rows(text, o.validate, &rows));
  std::vector<plan::ValidationRow> v;
  MLADCP_RETURN_IF_ERROR(plan::validate(cal, rows, &v));
  double worst = 0;
  int over = 0;
  if (o.json) {
    json out = json::array();
    for (const auto& r : v) {
      out.push_back(
          {{"label", r.measured.label},
           {"kind", r.measured.kind},
           {"measured_us", r.measured.time_us},
           {"predicted_us", r.predicted_us},
           {"error", r.error},
           {"attention_error", std::isnan(r.attention_error) ? json(nullptr) : json(r.attention_error)},
           {"leave_one_out_error", std::isnan(r.leave_one_out_error) ? json(nullptr) : json(r.leave_one_out_error)},
           {"in_calibration", r.in_calibration},
           {"gated", r.measured.gate},
           {"source", r.measured.source}});
    }
    std::printf("%s\n", json({{"calibration", cal_path}, {"rows", out}}).dump(2).c_str());
  }
  std::vector<std::vector<std::string>> t = {{"row", "measured us", "predicted us", "error", "attn measured",
                                              "attn predicted", "attn error", "in fit", "leave-one-out", "gated",
                                              "source"}};
  size_t gated = 0;
  for (const auto& r : v) {
    t.push_back({r.measured.label, fixed(r.measured.time_us, 1), fixed(r.predicted_us, 1), pct(r.error),
                 r.measured.kind == "step" ? fixed(r.measured.attention_us, 1) : "-",
                 r.measured.kind == "step" ? fixed(r.predicted_attention_us, 1) : "-", pct(r.attention_error),
                 r.in_calibration ? "yes" : "no", pct(r.leave_one_out_error), r.measured.gate ? "yes" : "no",
                 r.measured.source});
    if (!r.measured.gate) continue;  // a superseded kernel: reported, not held to the tolerance
    ++gated;
    worst = std::max({worst, std::fabs(r.error), std::isnan(r.attention_error) ? 0.0 : std::fabs(r.attention_error)});
    if (std::fabs(r.error) > o.tolerance ||
        (!std::isnan(r.attention_error) && std::fabs(r.attention_error) > o.tolerance)) {
      ++over;
    }
  }
  if (!o.json) {
    std::printf("Planner against measured rows (calibration %s, %s, commit %s)\n\n", cal_path.c_str(), cal.date.c_str(),
                cal.commit.c_str());
    std::fputs(render(t, /*markdown=*/true, 1).c_str(), stdout);
    std::printf("\n%zu rows, %zu held to the tolerance: largest error %.1f%%, %d over the %.0f%% tolerance: %s\n",
                v.size(), gated, 100 * worst, over, 100 * o.tolerance, over == 0 ? "PASS" : "FAIL");
  }
  if (over > 0) {
    return Status(StatusCode::kInternal,
                  std::to_string(over) + " rows predicted outside " + fixed(100 * o.tolerance, 0) + "%");
  }
  return Status::Ok();
}

Status run_plan(const Options& o) {
  const std::string cal_path = o.calibration.empty() ? default_calibration() : o.calibration;
  plan::Calibration cal;
  MLADCP_RETURN_IF_ERROR(plan::load_calibration(cal_path, &cal));
  // InfiniBand parameters given on the command line replace the file's for every collective.
  for (plan::AlphaBeta* ab : {&cal.infiniband.all_gather, &cal.infiniband.all_to_all, &cal.infiniband.reduce_scatter,
                              &cal.infiniband.all_reduce}) {
    if (o.ib_bw_gbps > 0) ab->bus_gbps = o.ib_bw_gbps;
    if (o.ib_latency_us >= 0) ab->latency_us = o.ib_latency_us;
  }
  if (o.ib_bw_gbps > 0 || o.ib_latency_us >= 0) cal.infiniband.source = "given on the command line";
  if (!o.validate.empty()) return run_validation(o, cal, cal_path);

  plan::PerfModel model;
  MLADCP_RETURN_IF_ERROR(plan::PerfModel::create(cal, &model));
  plan::PlanParams p;
  if (o.heads > 0 || o.layers > 0) {
    if (o.heads <= 0 || o.layers <= 0) return Status::InvalidArgument("--heads and --layers go together (both >= 1)");
    p.model.name = "custom";
    p.model.num_heads = o.heads, p.model.num_layers = o.layers;
    p.model.hidden = 0, p.model.params_billions = 0;
  } else {
    MLADCP_RETURN_IF_ERROR(plan::find_model_preset(o.model, &p.model));
  }
  if (o.hidden >= 0) p.model.hidden = o.hidden;
  if (o.params_b >= 0) p.model.params_billions = o.params_b;
  const auto dtype = parse_dtype(o.kv_dtype);
  if (!dtype || (*dtype != DType::kBF16 && *dtype != DType::kFP8E4M3)) {
    return Status::InvalidArgument("--kv-dtype=" + o.kv_dtype + ": accepted bf16, fp8");
  }
  p.kv_dtype = *dtype;
  p.q_len = o.q_len, p.gpus = o.gpus, p.gpus_per_node = o.gpus_per_node, p.block_size = o.block_size;
  p.kv_budget_gb = o.kv_budget_gb, p.memory_utilization = o.memory_utilization, p.max_dcp = o.max_dcp;
  MLADCP_RETURN_IF_ERROR(parse_sizes("--context", o.contexts, &p.contexts));
  MLADCP_RETURN_IF_ERROR(parse_sizes("--batch", o.batches, &p.batches));
  plan::Plan result;
  MLADCP_RETURN_IF_ERROR(plan::make_plan(p, model, &result));
  if (o.best_only) {
    std::vector<plan::PlanRow> best;
    for (const auto& r : result.rows) {
      if (r.best) best.push_back(r);
    }
    result.rows = best;
  }
  if (o.json) {
    json j = plan_json(result, p);
    j["calibration"] = {{"path", cal_path}, {"gpu", cal.gpu}, {"date", cal.date}, {"commit", cal.commit}};
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("calibration %s (%s, %s, commit %s)\n", cal_path.c_str(), cal.gpu.c_str(), cal.date.c_str(),
                cal.commit.c_str());
    std::fputs(plan_text(result, p, o.markdown).c_str(), stdout);
  }
  return Status::Ok();
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Plan TP x DCP layouts for a model and a GPU count: KV per GPU, largest batch, predicted step times");
  sub->add_option("--model", o->model, "Model preset: deepseek-v3, deepseek-r1, kimi-k2")->capture_default_str();
  sub->add_option("--heads", o->heads, "Query heads (instead of --model; with --layers)")->check(CLI::Range(1, 65536));
  sub->add_option("--layers", o->layers, "MLA layers (instead of --model; with --heads)")->check(CLI::Range(1, 65536));
  sub->add_option("--hidden", o->hidden, "Model width, for the TP all-reduce of the attention output (0: not modelled)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--params-b", o->params_b, "Weights in billions of parameters, for the default KV budget")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_option("--kv-dtype", o->kv_dtype, "Cache dtype: bf16 or fp8")->capture_default_str();
  sub->add_option("--q-len", o->q_len, "Query tokens per sequence and step")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  sub->add_option("--gpus", o->gpus, "GPUs in total")->capture_default_str()->check(CLI::Range(1, 65536));
  sub->add_option("--gpus-per-node", o->gpus_per_node, "GPUs per node (NVLink domain)")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  sub->add_option("--context", o->contexts, "Context lengths, comma-separated (K = 1024, M = 1048576)")
      ->capture_default_str();
  sub->add_option("--batch", o->batches, "Concurrent sequences over all GPUs, comma-separated")->capture_default_str();
  sub->add_option("--block-size", o->block_size, "Tokens per paged-cache block")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--kv-budget-gb", o->kv_budget_gb,
                  "KV budget per GPU in GB (default: HBM x utilization - weights / TP)");
  sub->add_option("--memory-utilization", o->memory_utilization, "Share of HBM usable for weights and KV")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1.0));
  sub->add_option("--max-dcp", o->max_dcp, "Largest DCP size to plan (0: every one)")->check(CLI::Range(0, 65536));
  sub->add_option("--calibration", o->calibration, "Calibration file (default: $MLADCP_CALIBRATION or the H200 file)");
  sub->add_option("--ib-bw-gbps", o->ib_bw_gbps, "InfiniBand bus bandwidth per GPU in GB/s (replaces the file's)")
      ->check(CLI::Range(0.001, 1e6));
  sub->add_option("--ib-latency-us", o->ib_latency_us, "InfiniBand collective base latency in us (replaces the file's)")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_flag("--best", o->best_only, "Print only the fastest layout that fits, per context and batch");
  CLI::Option* json = sub->add_flag("--json", o->json, "Print JSON");
  sub->add_flag("--markdown", o->markdown, "Print markdown tables")->excludes(json);
  sub->add_option("--validate", o->validate,
                  "Measured rows (data/calibration/h200-measured-*.json): print the prediction error of each and fail "
                  "when one is over --tolerance");
  sub->add_option("--tolerance", o->tolerance, "Largest accepted relative error of --validate")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10.0));
  set_command_body(sub, [o] { return run_plan(*o); });
}

}  // namespace mladcp::cli
