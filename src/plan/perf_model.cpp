// The planner's performance model: fits of the calibration's kernel and merge points, interpolation of its
// collective curves and the fabrics' latency-bandwidth models.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "cuda/decode_plan.h"
#include "mladcp/plan.h"

namespace mladcp::plan {
namespace {

int row_chunks(int rows, int rows_per_cta) { return std::max(1, (rows + rows_per_cta - 1) / rows_per_cta); }

// Most rows per sequence on the 16/32-row CTAs: fp8 caches up to 32 rows (the portable or the Hopper fp8
// kernel), bf16 up to two_per_sm_max_rows (the portable kernel).
int small_rows_max(const DeviceParams& dev, DType kv_dtype) {
  return kv_dtype == DType::kFP8E4M3 ? cuda_plan::kHopperFp8MaxRows : dev.two_per_sm_max_rows;
}
// The cost class of a decode's query rows: on the 16/32-row CTAs (up to small_rows_max) 16 or 32; on the 64-row
// kernel a partial chunk rounded up to 16 rows (a chunk of 16 rows is memory-bound where 64 are compute-bound, and
// the kernel does the same tensor work for both), else whole row chunks.
struct RowClass {
  int rows = 0;
  bool small_cta = false;
};
RowClass row_class(int rows, const DeviceParams& dev, DType kv_dtype) {
  const int small = small_rows_max(dev, kv_dtype);
  if (rows <= 16 && rows <= small && dev.rows_per_cta >= 16) return {16, true};
  if (rows <= 32 && rows <= small && dev.rows_per_cta >= 32) return {32, true};
  if (rows < dev.rows_per_cta) return {(rows + 15) / 16 * 16, false};
  return {row_chunks(rows, dev.rows_per_cta) * dev.rows_per_cta, false};
}

struct KernelFeatures {
  double kkeys = 0;      // batch · keys / 1000
  double underfill = 0;  // max(0, 1 − CTAs / wave)
  double waves = 0;      // waves of CTAs
  double depth = 0;      // splits each warp of the combine kernel merges in turn (8 warps), 0 without a combine
};

KernelFeatures features(const DeviceParams& dev, int heads, int q_len, int64_t batch, int64_t keys, DType kv_dtype) {
  const KernelGrid g = kernel_grid(dev, heads, q_len, batch, keys, kv_dtype);
  return {double(batch) * double(keys) / 1000.0, std::max(0.0, 1.0 - double(g.ctas) / double(g.wave_ctas)),
          double(g.waves()), g.splits > 1 ? double((g.splits + 7) / 8) : 0.0};
}

// Least squares on A x = y (rows of A already weighted) through the normal equations with a tiny ridge;
// Gaussian elimination with partial pivoting. Returns false when the system is singular.
bool least_squares(const std::vector<std::vector<double>>& a, const std::vector<double>& y, std::vector<double>* x) {
  const size_t n = x->size();
  std::vector<std::vector<double>> m(n, std::vector<double>(n + 1, 0.0));
  for (size_t r = 0; r < a.size(); ++r) {
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) m[i][j] += a[r][i] * a[r][j];
      m[i][n] += a[r][i] * y[r];
    }
  }
  for (size_t i = 0; i < n; ++i) m[i][i] += 1e-12 * (1.0 + m[i][i]);
  for (size_t c = 0; c < n; ++c) {
    size_t p = c;
    for (size_t r = c + 1; r < n; ++r) {
      if (std::fabs(m[r][c]) > std::fabs(m[p][c])) p = r;
    }
    if (std::fabs(m[p][c]) < 1e-300) return false;
    std::swap(m[p], m[c]);
    for (size_t r = 0; r < n; ++r) {
      if (r == c) continue;
      const double f = m[r][c] / m[c][c];
      for (size_t k = c; k <= n; ++k) m[r][k] -= f * m[c][k];
    }
  }
  for (size_t i = 0; i < n; ++i) (*x)[i] = m[i][n] / m[i][i];
  return true;
}

double merge_bytes(DcpMergeMode mode, int states, int64_t rows) {
  const double r = double(rows), s = double(states);
  if (mode == DcpMergeMode::kAllToAll) return s * r * 513.0 * 4.0 + r * 512.0 * 2.0;
  // Rescale of all W·rows fp32 rows in place (read + write) and the LSEs, then the 1-way conversion.
  return s * r * 512.0 * 4.0 * 2.0 + s * r * 4.0 + r * 512.0 * (4.0 + 2.0);
}

double interpolate(const std::vector<CurvePoint>& pts, double bytes, double tail_us_per_byte) {
  if (bytes <= pts.front().bytes) return pts.front().time_us;
  for (size_t i = 1; i < pts.size(); ++i) {
    if (bytes <= pts[i].bytes) {
      const double f = (bytes - pts[i - 1].bytes) / (pts[i].bytes - pts[i - 1].bytes);
      return pts[i - 1].time_us + f * (pts[i].time_us - pts[i - 1].time_us);
    }
  }
  double slope = tail_us_per_byte;
  if (pts.size() >= 2) {
    const CurvePoint& p = pts[pts.size() - 2];
    const CurvePoint& q = pts.back();
    slope = std::max(0.0, (q.time_us - p.time_us) / (q.bytes - p.bytes));
  }
  return pts.back().time_us + slope * (bytes - pts.back().bytes);
}

const AlphaBeta& alpha_beta(const FabricParams& f, CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return f.all_gather;
    case CollectiveOp::kAllToAll:
      return f.all_to_all;
    case CollectiveOp::kReduceScatter:
    case CollectiveOp::kLseAgRs:
      return f.reduce_scatter;
    case CollectiveOp::kAllReduce:
      return f.all_reduce;
  }
  return f.all_gather;
}

}  // namespace

KernelGrid kernel_grid(const DeviceParams& dev, int heads, int q_len, int64_t batch, int64_t keys, DType kv_dtype) {
  const int rows = heads * q_len;
  const bool small = rows <= small_rows_max(dev, kv_dtype) && dev.rows_per_cta >= 32;  // 16/32-row CTAs
  const bool fp8 = kv_dtype == DType::kFP8E4M3;
  KernelGrid g;
  g.wave_ctas = int64_t(std::max(1, dev.sms)) * (small ? (fp8 ? std::max(1, dev.fp8_small_ctas_per_sm) : 2) : 1);
  const int64_t base = std::max<int64_t>(1, batch) * (small ? 1 : row_chunks(rows, dev.rows_per_cta));
  const int invariant = int(std::min<int64_t>(dev.base_split_keys, int64_t(1) << 30));
  g.split_keys = cuda_plan::fill_split_tokens(keys, base, g.wave_ctas, invariant);
  g.splits = std::max<int64_t>(1, (keys + g.split_keys - 1) / g.split_keys);
  g.ctas = base * g.splits;
  // The balanced schedule (cuda_plan::make_plan): one wave of parts × row chunks. Whole mode: whole sequences
  // per part, no partial state. Otherwise each part holds T work positions (a sequence: its tiles plus a fixed
  // cost), so a sequence spans about (its positions / T) + 1 parts, each leaving a partial state.
  // (The Hopper fp8 kernel, one 16/32-row CTA per SM, runs it too, with a higher bar; the portable 16/32-row CTAs
  // do not.)
  const bool balances = !small || (fp8 && dev.fp8_small_ctas_per_sm == 1);
  const int64_t chunks = base / std::max<int64_t>(1, batch);
  const cuda_plan::BalancedChoice b =
      cuda_plan::balanced_choice(std::max<int64_t>(1, batch), chunks, g.ctas, g.splits, g.wave_ctas,
                                 small ? cuda_plan::Schedule::kAutoManyWaves : cuda_plan::Schedule::kAuto);
  if (balances && dev.balanced_schedule && b.take) {
    g.ctas = b.parts * chunks;
    if (b.whole_short) {
      g.splits = 1;
      g.split_keys = keys;
    } else {
      const int64_t per_seq = cuda_plan::balanced_cost((keys + cuda_plan::kTileTokens - 1) / cuda_plan::kTileTokens);
      const int64_t per_part = std::max<int64_t>(1, (std::max<int64_t>(1, batch) * per_seq + b.parts - 1) / b.parts);
      g.splits = std::min(b.parts, (per_seq + per_part - 1) / per_part + 1);
      g.split_keys = std::min(keys, per_part * cuda_plan::kTileTokens);
    }
  }
  return g;
}

Status PerfModel::create(const Calibration& cal, PerfModel* out) {
  if (out == nullptr) return Status::InvalidArgument("PerfModel::create: out is null");
  if (cal.kernel.empty()) return Status::InvalidArgument("calibration: kernel: no measured points");
  if (cal.merge.empty()) return Status::InvalidArgument("calibration: merge: no measured points");
  if (cal.device.sms < 1 || cal.device.base_split_keys < 1 || cal.device.rows_per_cta < 1) {
    return Status::InvalidArgument("calibration: device: sms, base_split_keys and rows_per_cta must be >= 1");
  }
  PerfModel m;
  m.cal_ = cal;
  const DeviceParams& dev = cal.device;

  // Kernel classes and the points of each.
  std::vector<KernelClass>& classes = m.classes_;
  std::vector<int> class_of(cal.kernel.size());
  for (size_t i = 0; i < cal.kernel.size(); ++i) {
    const KernelPoint& p = cal.kernel[i];
    const RowClass rc = row_class(p.heads * p.q_len, dev, p.kv_dtype);
    auto it = std::find_if(classes.begin(), classes.end(), [&](const KernelClass& c) {
      return c.kv_dtype == p.kv_dtype && c.rows == rc.rows && c.small_cta == rc.small_cta;
    });
    if (it == classes.end()) {
      classes.push_back({p.kv_dtype, rc.rows, rc.small_cta, 0, 0, 0});
      it = classes.end() - 1;
    }
    it->points++;
    class_of[i] = int(it - classes.begin());
  }
  // Classes with points at two or more sizes get their own intercept and slope; the others a slope only
  // (intercept: the mean of the fitted ones). The under-fill cost is shared. Relative least squares.
  std::vector<int> var_index(classes.size(), -1);
  int nvar = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    double lo = std::numeric_limits<double>::infinity(), hi = 0;
    for (size_t i = 0; i < cal.kernel.size(); ++i) {
      if (class_of[i] != int(c)) continue;
      const double n = features(dev, cal.kernel[i].heads, cal.kernel[i].q_len, cal.kernel[i].batch, cal.kernel[i].keys,
                                cal.kernel[i].kv_dtype)
                           .kkeys;
      lo = std::min(lo, n), hi = std::max(hi, n);
    }
    if (hi > lo * 1.01) var_index[c] = nvar, nvar += 2;
  }
  bool any_underfill = false;
  for (size_t i = 0; i < cal.kernel.size(); ++i) {
    const KernelPoint& p = cal.kernel[i];
    if (var_index[class_of[i]] >= 0 && features(dev, p.heads, p.q_len, p.batch, p.keys, p.kv_dtype).underfill > 0.05) {
      any_underfill = true;
    }
  }
  const int c_index = any_underfill ? nvar++ : -1;
  bool any_multiwave = false;  // the wave cost needs points of one wave and of more
  for (size_t i = 0; i < cal.kernel.size(); ++i) {
    const KernelPoint& p = cal.kernel[i];
    if (var_index[class_of[i]] >= 0 && features(dev, p.heads, p.q_len, p.batch, p.keys, p.kv_dtype).waves > 1.5) {
      any_multiwave = true;
    }
  }
  const int d_index = any_multiwave ? nvar++ : -1;
  bool any_deep = false;  // the combine's cost needs points with several depths
  for (size_t i = 0; i < cal.kernel.size(); ++i) {
    const KernelPoint& p = cal.kernel[i];
    if (var_index[class_of[i]] >= 0 && features(dev, p.heads, p.q_len, p.batch, p.keys, p.kv_dtype).depth > 1.5)
      any_deep = true;
  }
  const int e_index = any_deep ? nvar++ : -1;
  std::vector<double> x(nvar, 0.0);
  if (nvar > 0) {
    std::vector<std::vector<double>> a;
    std::vector<double> y;
    for (size_t i = 0; i < cal.kernel.size(); ++i) {
      const int v = var_index[class_of[i]];
      if (v < 0) continue;
      const KernelPoint& p = cal.kernel[i];
      const KernelFeatures f = features(dev, p.heads, p.q_len, p.batch, p.keys, p.kv_dtype);
      std::vector<double> row(nvar, 0.0);
      row[v] = 1.0 / p.time_us;
      row[v + 1] = f.kkeys / p.time_us;
      if (c_index >= 0) row[c_index] = f.underfill / p.time_us;
      if (d_index >= 0) row[d_index] = f.waves / p.time_us;
      if (e_index >= 0) row[e_index] = f.depth / p.time_us;
      a.push_back(row);
      y.push_back(1.0);
    }
    if (!least_squares(a, y, &x))
      return Status::InvalidArgument("calibration: kernel: the points do not determine the fit");
  }
  m.underfill_us_ = c_index >= 0 ? std::max(0.0, x[c_index]) : 0.0;
  m.wave_us_ = d_index >= 0 ? std::max(0.0, x[d_index]) : 0.0;
  m.combine_step_us_ = e_index >= 0 ? std::max(0.0, x[e_index]) : 0.0;
  double a_sum = 0;
  int a_n = 0;
  for (size_t c = 0; c < classes.size(); ++c) {
    if (var_index[c] < 0) continue;
    classes[c].a_us = std::max(0.0, x[var_index[c]]);
    classes[c].b_us_per_kkey = x[var_index[c] + 1];
    a_sum += classes[c].a_us, a_n++;
  }
  const double a_default = a_n > 0 ? a_sum / a_n : 0.0;
  for (size_t c = 0; c < classes.size(); ++c) {
    if (var_index[c] >= 0) continue;
    // Slope through the points with the default intercept (relative least squares, one unknown).
    double num = 0, den = 0;
    for (size_t i = 0; i < cal.kernel.size(); ++i) {
      if (class_of[i] != int(c)) continue;
      const KernelPoint& p = cal.kernel[i];
      const KernelFeatures f = features(dev, p.heads, p.q_len, p.batch, p.keys, p.kv_dtype);
      const double w = 1.0 / (p.time_us * p.time_us);
      num +=
          w * f.kkeys *
          (p.time_us - a_default - m.underfill_us_ * f.underfill - m.wave_us_ * f.waves - m.combine_step_us_ * f.depth);
      den += w * f.kkeys * f.kkeys;
    }
    classes[c].a_us = a_default;
    classes[c].b_us_per_kkey = den > 0 ? num / den : 0.0;
  }
  for (const KernelClass& c : classes) {
    if (!(c.b_us_per_kkey > 0)) {
      return Status::InvalidArgument(std::string("calibration: kernel: the ") + dtype_name(c.kv_dtype) + " points of " +
                                     std::to_string(c.rows) +
                                     " rows give a time that does not grow with the keys; measure larger sizes");
    }
  }

  // Merge: one intercept per mode, one bandwidth (µs per byte) shared.
  bool has_mode[2] = {false, false};
  for (const MergePoint& p : cal.merge) has_mode[int(p.mode)] = true;
  {
    std::vector<std::vector<double>> a;
    std::vector<double> y;
    for (const MergePoint& p : cal.merge) {
      std::vector<double> row(3, 0.0);
      row[int(p.mode)] = 1.0 / p.time_us;
      row[2] = merge_bytes(p.mode, p.states, p.rows) / p.time_us;
      a.push_back(row);
      y.push_back(1.0);
    }
    std::vector<double> mx(3, 0.0);
    // A mode without points gets the other's intercept: add it as a tied unknown by merging the columns.
    if (!has_mode[0] || !has_mode[1]) {
      const int present = has_mode[0] ? 0 : 1;
      for (auto& row : a) row[present] += row[1 - present], row[1 - present] = 0;
      std::vector<std::vector<double>> a2;
      for (auto& row : a) a2.push_back({row[present], row[2]});
      std::vector<double> m2(2, 0.0);
      if (!least_squares(a2, y, &m2))
        return Status::InvalidArgument("calibration: merge: the points do not determine the fit");
      mx[0] = mx[1] = m2[0];
      mx[2] = m2[1];
    } else if (!least_squares(a, y, &mx)) {
      return Status::InvalidArgument("calibration: merge: the points do not determine the fit");
    }
    if (!(mx[2] > 0)) {
      // All points at one size: no bandwidth term can be fitted; take the HBM copy rate of 1 TB/s.
      mx[2] = 1e-6;
      for (int mode = 0; mode < 2; ++mode) {
        double s = 0;
        int n = 0;
        for (const MergePoint& p : cal.merge) {
          if (int(p.mode) == mode || !has_mode[mode])
            s += p.time_us - mx[2] * merge_bytes(p.mode, p.states, p.rows), n++;
        }
        mx[mode] = n > 0 ? s / n : 0.0;
      }
    }
    m.merge_intercept_us_[0] = std::max(0.0, mx[0]);
    m.merge_intercept_us_[1] = std::max(0.0, mx[1]);
    m.merge_us_per_byte_ = mx[2];
  }
  *out = std::move(m);
  return Status::Ok();
}

Status PerfModel::kernel_us(const KernelQuery& q, double* us) const {
  if (q.heads < 1) return Status::InvalidArgument("kernel query: heads must be >= 1, got " + std::to_string(q.heads));
  if (q.q_len < 1) return Status::InvalidArgument("kernel query: q_len must be >= 1, got " + std::to_string(q.q_len));
  if (q.batch < 1) return Status::InvalidArgument("kernel query: batch must be >= 1, got " + std::to_string(q.batch));
  if (q.keys < 1) return Status::InvalidArgument("kernel query: keys must be >= 1, got " + std::to_string(q.keys));
  const DeviceParams& dev = cal_.device;
  const RowClass rc = row_class(q.heads * q.q_len, dev, q.kv_dtype);
  const int rows = rc.rows;
  const KernelClass* ref = nullptr;
  for (const KernelClass& c : classes_) {
    if (c.kv_dtype != q.kv_dtype) continue;
    if (c.rows == rows && c.small_cta == rc.small_cta) {
      ref = &c;
      break;
    }
    // Nearest class: the same CTA kind, then fewest chunks apart, then the nearest row count, then the larger one.
    if (ref == nullptr) {
      ref = &c;
      continue;
    }
    const auto key = [&](const KernelClass& k) {
      return std::make_tuple(k.small_cta != rc.small_cta,
                             std::abs(row_chunks(k.rows, dev.rows_per_cta) - row_chunks(rows, dev.rows_per_cta)),
                             std::abs(k.rows - rows), -k.rows);
    };
    if (key(c) < key(*ref)) ref = &c;
  }
  if (ref == nullptr) {
    return Status::Unsupported(std::string("calibration ") + cal_.date + ": no kernel points for kv dtype " +
                               dtype_name(q.kv_dtype));
  }
  const double scale = double(row_chunks(rows, dev.rows_per_cta)) / double(row_chunks(ref->rows, dev.rows_per_cta));
  const KernelFeatures f = features(dev, q.heads, q.q_len, q.batch, q.keys, q.kv_dtype);
  *us = ref->a_us + ref->b_us_per_kkey * scale * f.kkeys + underfill_us_ * f.underfill + wave_us_ * f.waves +
        combine_step_us_ * f.depth;
  return Status::Ok();
}

Status PerfModel::collective_us(const CollectiveQuery& q, double* us) const {
  if (q.world < 1)
    return Status::InvalidArgument("collective query: world must be >= 1, got " + std::to_string(q.world));
  if (!(q.bytes >= 0)) return Status::InvalidArgument("collective query: bytes must be >= 0");
  if (q.world == 1) {
    *us = 0;
    return Status::Ok();
  }
  const bool crosses = q.ranks_per_node > 0 && q.ranks_per_node < q.world;
  const Fabric fabric = crosses ? Fabric::kInfiniband : Fabric::kNvlink;
  for (const CollectiveCurve& c : cal_.collectives) {
    if (c.op == q.op && c.fabric == fabric && c.world == q.world) {
      const FabricParams& fp = fabric == Fabric::kNvlink ? cal_.nvlink : cal_.infiniband;
      const double tail = (double(q.world - 1) / q.world) / (alpha_beta(fp, q.op).bus_gbps * 1e3);
      *us = interpolate(c.points, q.bytes, tail);
      return Status::Ok();
    }
  }
  if (q.op == CollectiveOp::kLseAgRs) {
    // LSE all-gather (W·W·T·h floats received: bytes · W / 512 with bytes = W·T·h·512·4) + reduce-scatter.
    double ag = 0, rs = 0;
    MLADCP_RETURN_IF_ERROR(
        collective_us({CollectiveOp::kAllGather, q.world, q.bytes * q.world / 512.0, q.ranks_per_node}, &ag));
    MLADCP_RETURN_IF_ERROR(collective_us({CollectiveOp::kReduceScatter, q.world, q.bytes, q.ranks_per_node}, &rs));
    *us = ag + rs;
    return Status::Ok();
  }
  const FabricParams& fp = crosses ? cal_.infiniband : cal_.nvlink;
  const AlphaBeta& ab = alpha_beta(fp, q.op);
  const double w = q.world;
  double moved = (w - 1) / w * q.bytes;  // per rank, over the bus
  if (q.op == CollectiveOp::kAllReduce) moved *= 2;
  // All-to-all across nodes: the bytes leaving the node go over the network; the rest overlaps on NVLink.
  if (q.op == CollectiveOp::kAllToAll && crosses) moved = (w - q.ranks_per_node) / w * q.bytes;
  *us = ab.latency_us + ab.latency_per_extra_rank_us * std::max(0.0, w - 2) + moved / (ab.bus_gbps * 1e3);
  return Status::Ok();
}

Status PerfModel::merge_us(const MergeQuery& q, double* us) const {
  if (q.states < 1) return Status::InvalidArgument("merge query: states must be >= 1, got " + std::to_string(q.states));
  if (q.rows < 0) return Status::InvalidArgument("merge query: rows must be >= 0, got " + std::to_string(q.rows));
  *us = merge_intercept_us_[int(q.mode)] + merge_us_per_byte_ * merge_bytes(q.mode, q.states, q.rows);
  return Status::Ok();
}

}  // namespace mladcp::plan
