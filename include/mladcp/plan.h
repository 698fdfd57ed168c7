// The DCP planner: for a model, a GPU count, context lengths and batch sizes, what each factorization
// DP × TP × DCP costs per GPU (KV bytes, largest batch in an HBM budget) and per decode step (attention,
// query all-gather, exchange, merge), predicted from a calibration file of measured kernel and collective
// times. `mladcp plan` prints it; docs/planner.md explains the model and its assumptions.
//
//   mladcp::plan::Calibration cal;
//   MLADCP_RETURN_IF_ERROR(mladcp::plan::load_calibration("data/calibration/h200-2026-12-01.json", &cal));
//   mladcp::plan::PerfModel model;
//   MLADCP_RETURN_IF_ERROR(mladcp::plan::PerfModel::create(cal, &model));
//   mladcp::plan::PlanParams p;
//   MLADCP_RETURN_IF_ERROR(mladcp::plan::find_model_preset("deepseek-v3", &p.model));
//   p.gpus = 8; p.contexts = {131072}; p.batches = {16};
//   mladcp::plan::Plan plan;
//   MLADCP_RETURN_IF_ERROR(mladcp::plan::make_plan(p, model, &plan));
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mladcp/dcp.h"
#include "mladcp/dtype.h"
#include "mladcp/status.h"

namespace mladcp::plan {

// ---- Calibration: what was measured ------------------------------------------------------------

// One measured decode call: `heads` query heads × `q_len` tokens for each of `batch` sequences of `keys`
// keys each (on a DCP rank: the keys of its shard), device time of the whole decode (split + combine).
struct KernelPoint {
  int heads = 0;
  int q_len = 1;
  int64_t batch = 0;
  int64_t keys = 0;
  DType kv_dtype = DType::kBF16;
  double time_us = 0;
  std::string source;  // where the figure was recorded (document, commit)
};

// One measured merge phase of the DCP step: `states` partial states (= W) of `rows` (token, head) rows.
// A2A: the combine of W states; AG+RS: the rescale of all W·rows rows plus the 1-way conversion.
struct MergePoint {
  DcpMergeMode mode = DcpMergeMode::kAllToAll;
  int states = 2;
  int64_t rows = 0;
  double time_us = 0;
  std::string source;
};

// Collective operations. Sizes follow nccl-tests: all-gather the receive buffer (W × the payload of one
// rank), reduce-scatter and all-reduce the input buffer, all-to-all the send buffer of one rank.
// kLseAgRs is the AG+RS merge's whole exchange (LSE all-gather + reduce-scatter), sized by its
// reduce-scatter input; it is measured directly where possible and composed from the other two elsewhere.
enum class CollectiveOp { kAllGather, kAllToAll, kReduceScatter, kAllReduce, kLseAgRs };
const char* collective_op_name(CollectiveOp op);  // "all_gather", "all_to_all", ...

enum class Fabric { kNvlink, kInfiniband };
const char* fabric_name(Fabric f);  // "nvlink", "infiniband"

struct CurvePoint {
  double bytes = 0;
  double time_us = 0;
};

// Measured times of one collective on `world` ranks over one fabric, at increasing sizes.
struct CollectiveCurve {
  CollectiveOp op = CollectiveOp::kAllGather;
  Fabric fabric = Fabric::kNvlink;
  int world = 2;
  std::vector<CurvePoint> points;
  std::string source;
};

// Latency-bandwidth model of one collective on one fabric, for group sizes without a measured curve:
// time = latency_us + latency_per_extra_rank_us · (W − 2) + moved / bus_gbps, with moved = (W−1)/W · size
// (all-reduce: twice that; all-to-all across nodes: the bytes that leave the node, see docs/planner.md).
struct AlphaBeta {
  double latency_us = 0;
  double latency_per_extra_rank_us = 0;
  double bus_gbps = 0;
};

struct FabricParams {
  AlphaBeta all_gather, all_to_all, reduce_scatter, all_reduce;
  std::string source;  // measured fit, published figure or assumption: stated in the file
};

struct DeviceParams {
  std::string name;             // "NVIDIA H200 SXM"
  int sms = 0;                  // streaming multiprocessors
  double memory_gb = 0;         // HBM per GPU (decimal GB)
  int64_t base_split_keys = 0;  // keys per split of the batch-invariant plan (the kernel's unit of work)
  int rows_per_cta = 64;        // (token, head) rows one CTA takes; more rows run as row chunks
  // Most bf16 rows per sequence that run the portable 16/32-row CTAs, two per SM (32; 8 where the Hopper
  // kernel takes 9 rows and more). Optional in the file; 32 when absent.
  int two_per_sm_max_rows = 32;
  // CTAs per SM of the 16/32-row fp8 kernel (fp8 caches of at most 32 rows per sequence): 2 for the portable
  // kernel, 1 for the Hopper fp8 kernel. Optional in the file; 2 when absent.
  int fp8_small_ctas_per_sm = 2;
  // kFillDevice takes the balanced schedule on the Hopper kernels (64 rows; fp8 16/32 rows where
  // fp8_small_ctas_per_sm is 1) where the split plan would run several waves of several splits
  // (cuda_plan::make_plan). Optional in the file; false when absent.
  bool balanced_schedule = false;
};

struct Calibration {
  std::string format;  // "mladcp-calibration-1"
  std::string gpu, date, commit, produced_by, notes;
  DeviceParams device;
  std::vector<KernelPoint> kernel;
  std::vector<MergePoint> merge;
  // Per layer and merge mode: the measured step minus the sum of its measured phases (launch gaps, the
  // exchange's own kernels), µs.
  double step_overhead_a2a_us = 0, step_overhead_ag_rs_us = 0;
  std::vector<CollectiveCurve> collectives;
  FabricParams nvlink, infiniband;
};

// Parses the JSON text of a calibration file (`origin` names it in errors) and checks every field:
// a missing or out-of-range field returns kInvalidArgument naming the file and the field.
Status parse_calibration(const std::string& json_text, const std::string& origin, Calibration* out);
Status load_calibration(const std::string& path, Calibration* out);
std::string calibration_to_json(const Calibration& cal);  // the file format, indented

// ---- The fitted model ------------------------------------------------------------------------

// Decode time of one call (params of PerfModel::kernel_us).
struct KernelQuery {
  int heads = 0;  // query heads the call computes (gathered heads on a DCP rank)
  int q_len = 1;
  int64_t batch = 0;  // sequences
  int64_t keys = 0;   // keys per sequence (on a DCP rank: its shard)
  DType kv_dtype = DType::kBF16;
};

// One collective (params of PerfModel::collective_us).
struct CollectiveQuery {
  CollectiveOp op = CollectiveOp::kAllGather;
  int world = 2;
  double bytes = 0;        // size as in CollectiveOp
  int ranks_per_node = 0;  // ranks of the group on one node; 0 or >= world: the group is inside a node
};

// The merge phase of one DCP step on one rank (params of PerfModel::merge_us).
struct MergeQuery {
  DcpMergeMode mode = DcpMergeMode::kAllToAll;
  int states = 2;    // W partial states
  int64_t rows = 0;  // T · h (token, head) rows this rank ends with
};

// The grid the cuda backend's default split plan (kFillDevice) gives a decode of `batch` sequences of
// `keys` keys: its split length, CTAs, and the CTAs one wave holds (SMs, or 2 per SM for CTAs of ≤ 32
// rows), as the performance model sees it.
struct KernelGrid {
  int64_t split_keys = 0, splits = 0, ctas = 0, wave_ctas = 0;
  int64_t waves() const { return wave_ctas > 0 ? (ctas + wave_ctas - 1) / wave_ctas : 0; }
};
KernelGrid kernel_grid(const DeviceParams& dev, int heads, int q_len, int64_t batch, int64_t keys,
                       DType kv_dtype = DType::kBF16);

// Kernel: time = a + b · (batch · keys) / 1000 + c · max(0, 1 − CTAs / wave) + d · waves + e · depth,
// with a and b fitted per (KV dtype, row class), c, d and e shared; CTAs and waves from kernel_grid (d:
// the fixed cost of a wave of CTAs, query loads and first copies at once; depth = ceil(splits / 8) with
// a combine, 0 without: the splits each warp of the combine kernel merges in turn). Row classes: rows = heads · q_len
// rounded up to 16, 32 or a multiple of rows_per_cta; a class without points is scaled from the nearest calibrated
// class of the same dtype by its row chunks. Collectives: the measured curve of (op, fabric, world) interpolated in
// size, else the fabric's latency-bandwidth model. Merge: intercept per mode plus bytes / a fitted bandwidth.
class PerfModel {
 public:
  static Status create(const Calibration& cal, PerfModel* out);

  Status kernel_us(const KernelQuery& q, double* us) const;
  Status collective_us(const CollectiveQuery& q, double* us) const;
  Status merge_us(const MergeQuery& q, double* us) const;
  double step_overhead_us(DcpMergeMode mode) const {
    return mode == DcpMergeMode::kAllToAll ? cal_.step_overhead_a2a_us : cal_.step_overhead_ag_rs_us;
  }
  const Calibration& calibration() const { return cal_; }

  // The fitted kernel classes, for reports: (dtype, rows) → a (µs), b (µs per 1000 key·sequences).
  struct KernelClass {
    DType kv_dtype = DType::kBF16;
    int rows = 0;            // 16 or 32 on the 16/32-row CTAs; a partial chunk (multiple of 16) or whole chunks
    bool small_cta = false;  // the 16/32-row CTAs
    double a_us = 0, b_us_per_kkey = 0;
    int points = 0;
  };
  const std::vector<KernelClass>& kernel_classes() const { return classes_; }
  double underfill_us() const { return underfill_us_; }
  double wave_us() const { return wave_us_; }
  double combine_step_us() const { return combine_step_us_; }

 private:
  Calibration cal_;
  std::vector<KernelClass> classes_;
  double underfill_us_ = 0;
  double wave_us_ = 0;
  double combine_step_us_ = 0;
  double merge_intercept_us_[2] = {0, 0};  // indexed by DcpMergeMode
  double merge_us_per_byte_ = 0;
};

// ---- Models and layouts ----------------------------------------------------------------------

struct ModelSpec {
  std::string name;
  int num_heads = 0;           // query heads of attention
  int num_layers = 0;          // MLA layers
  int hidden = 0;              // model width: the attention output all-reduced over TP (0: not modelled)
  double params_billions = 0;  // weights, for the default KV budget (0: weights not counted)
  double weight_bytes = 1;     // bytes per weight (fp8: 1)
};

// "deepseek-v3", "deepseek-r1", "kimi-k2" (case-insensitive). Unknown names: kInvalidArgument listing them.
Status find_model_preset(const std::string& name, ModelSpec* out);
std::vector<std::string> model_preset_names();

// Bytes of KV cache one GPU of a DCP group holds (the exact paged layout): every sequence of `context`
// tokens uses ceil(context / (block_size · dcp)) blocks of block_size tokens on every rank, each token
// 576 values of kv_dtype, in each of `layers` layers.
struct KvBytesQuery {
  int64_t sequences = 0;
  int64_t context = 0;
  int dcp = 1;
  int block_size = 64;
  int layers = 1;
  DType kv_dtype = DType::kBF16;
};
Status kv_bytes_per_gpu(const KvBytesQuery& q, double* bytes);

struct PlanParams {
  ModelSpec model;
  DType kv_dtype = DType::kBF16;
  int q_len = 1;                  // query tokens per sequence and step (speculative decoding: > 1)
  int gpus = 8;                   // GPUs in total; every factorization DP · TP = gpus is planned
  int gpus_per_node = 8;          // NVLink domain; groups larger than this cross InfiniBand
  std::vector<int64_t> contexts;  // tokens per sequence
  std::vector<int64_t> batches;   // concurrent sequences over all GPUs (split evenly over DP replicas)
  int block_size = 64;
  double memory_utilization = 0.9;  // share of HBM usable (weights + KV)
  double kv_budget_gb = -1;         // KV budget per GPU; < 0: memory·utilization − weights / TP
  int max_dcp = 0;                  // 0: every DCP dividing TP
};

struct PlanRow {
  int64_t context = 0, batch = 0;
  int dp = 1, tp = 1, dcp = 1;
  int heads_per_rank = 0, gathered_heads = 0;
  int64_t batch_per_replica = 0;
  bool dcp_crosses_nodes = false, tp_crosses_nodes = false;
  double kv_bytes_per_gpu = 0, kv_budget_bytes = 0;
  int64_t max_batch = 0;  // largest total batch (all replicas) whose KV fits the budget
  bool fits = false;
  // Per layer, µs. exchange and merge are those of `merge_mode` (the faster one).
  double attention_us = 0, q_all_gather_us = 0, exchange_us = 0, merge_us = 0, overhead_us = 0;
  double tp_all_reduce_us = 0;  // attention output over TP (0 when not modelled)
  double layer_us = 0;          // sum of the above
  double other_mode_exchange_merge_us = 0;
  DcpMergeMode merge_mode = DcpMergeMode::kAllToAll;
  double tp_attention_us = 0;  // same TP, no DCP: heads_per_rank over the whole context
  double step_vs_tp = 0;       // (layer_us − tp_all_reduce_us) / tp_attention_us
  double step_ms = 0;          // layer_us · layers
  double tokens_per_s = 0;     // batch · q_len / step (attention layers only)
  bool best = false;           // fastest fitting layout for its (context, batch)
};

struct Plan {
  std::vector<PlanRow> rows;
  std::vector<std::string> assumptions;  // stated with every output
};

// Every factorization of params.gpus into DP × TP (TP dividing the heads) and DCP dividing TP, for every
// (context, batch). Bad input returns kInvalidArgument naming the field.
Status make_plan(const PlanParams& params, const PerfModel& model, Plan* out);

// Prediction of one DCP step on one rank (what make_plan computes per row; also used by the benches):
// W = dcp ranks of h heads each, T = batch · q_len tokens.
struct StepQuery {
  int dcp = 1;
  int heads_per_rank = 0;
  int q_len = 1;
  int64_t batch = 0;    // sequences
  int64_t context = 0;  // global tokens per sequence
  DType kv_dtype = DType::kBF16;
  DcpMergeMode merge_mode = DcpMergeMode::kAllToAll;
  int ranks_per_node = 0;  // 0: the group is inside a node
};
struct StepPrediction {
  double attention_us = 0, q_all_gather_us = 0, exchange_us = 0, merge_us = 0, overhead_us = 0, step_us = 0;
  double tp_attention_us = 0;  // heads_per_rank over the whole context, no DCP
};
Status predict_step(const StepQuery& q, const PerfModel& model, StepPrediction* out);

// ---- Validation against measured rows ------------------------------------------------------------

// A measured figure to set a prediction against: a single-GPU decode (kind "kernel") or a DCP step on
// `dcp` GPUs (kind "step": step and attention times of the row).
struct MeasuredRow {
  std::string kind;  // "kernel" or "step"
  std::string label, source;
  KernelQuery kernel;       // kind "kernel"
  StepQuery step;           // kind "step"
  double time_us = 0;       // kernel time, or the step time
  double attention_us = 0;  // kind "step": the measured attention phase (0: not compared)
  // Held to the tolerance. False for rows of kernels superseded since (same shapes, faster now): reported only.
  bool gate = true;
};
Status parse_measured_rows(const std::string& json_text, const std::string& origin, std::vector<MeasuredRow>* out);

struct ValidationRow {
  MeasuredRow measured;
  double predicted_us = 0, error = 0;  // error = predicted / measured − 1
  double predicted_attention_us = 0, attention_error = 0;
  double leave_one_out_error = 0;  // kernel rows that are calibration points: refit without the point
  bool in_calibration = false;
};
Status validate(const Calibration& cal, const std::vector<MeasuredRow>& rows, std::vector<ValidationRow>* out);

}  // namespace mladcp::plan
