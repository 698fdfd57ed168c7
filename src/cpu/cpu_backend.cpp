// "cpu": the fast host backend (first version runs the oracle's loops under its own name).
#include "cpu/cpu_backends.h"
#include "mladcp/backend.h"

namespace mladcp {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend() : inner_(make_cpu_reference_backend()) {
    caps_ = inner_->capabilities();
    caps_.name = "cpu";
    caps_.description = "host backend: multi-threaded, vectorized";
  }
  const BackendCapabilities& capabilities() const override { return caps_; }
  Status decode(const MlaDecodeParams& p, const ExecContext& ctx) override { return inner_->decode(p, ctx); }
  Status merge(const MergeParams& p, const ExecContext& ctx) override { return inner_->merge(p, ctx); }
  Status rescale(const RescaleParams& p, const ExecContext& ctx) override { return inner_->rescale(p, ctx); }

 private:
  std::unique_ptr<Backend> inner_;
  BackendCapabilities caps_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace mladcp
