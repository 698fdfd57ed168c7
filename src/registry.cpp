// The backend registry: built-in backends first, then whatever callers register.
#include <mutex>
#include <utility>

#include "core/validate.h"
#include "cpu/cpu_backends.h"
#include "mladcp/backend.h"
#include "mladcp/kv_cache.h"
// The CUDA backend's capabilities are plain data in a header-only declaration, so that a build without
// CUDA still knows them (all_known_backends(), the generated backend table).
#include "cuda/cuda_capabilities.h"

namespace mladcp {

#if MLADCP_HAVE_CUDA
// The cuda backend lives in the mladcp::cuda library. These references are weak: in a program that
// does not link it they are null, and the registry has no "cuda" entry (and no CUDA dependency).
__attribute__((weak)) std::unique_ptr<Backend> make_cuda_backend();
__attribute__((weak)) int cuda_device_count();
__attribute__((weak)) Status write_kv_cache_cuda(const CacheWriteParams& p, void* stream);
#endif

namespace {

bool cuda_backend_linked() {
#if MLADCP_HAVE_CUDA
  return make_cuda_backend != nullptr;
#else
  return false;
#endif
}

struct Registry {
  std::mutex mu;
  std::vector<std::pair<std::string, BackendFactory>> entries;

  Registry() {
    entries.emplace_back("cpu-reference", make_cpu_reference_backend);
    entries.emplace_back("cpu", make_cpu_backend);
#if MLADCP_HAVE_CUDA
    if (cuda_backend_linked()) entries.emplace_back("cuda", [] { return make_cuda_backend(); });
#endif
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

Status register_backend(const std::string& name, BackendFactory factory) {
  if (name.empty()) return detail::invalid("name: empty backend name");
  if (!factory) return detail::invalid("factory: null for backend '", name, "'");
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [n, f] : r.entries)
    if (n == name) return detail::invalid("name='", name, "': a backend of that name is already registered");
  r.entries.emplace_back(name, std::move(factory));
  return Status::Ok();
}

std::vector<std::string> backend_names() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (auto& [n, f] : r.entries) names.push_back(n);
  return names;
}

Status create_backend(const std::string& name, std::unique_ptr<Backend>* out) {
  if (!out) return detail::invalid("out: null");
  Registry& r = registry();
  BackendFactory factory;
  std::string known;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [n, f] : r.entries) {
      known += (known.empty() ? "" : ", ") + n;
      if (n == name) factory = f;
    }
  }
  if (!factory) return detail::invalid("backend='", name, "': unknown; registered: ", known);
  *out = factory();
  if (!*out) return Status(StatusCode::kUnavailable, detail::cat("backend '", name, "' could not be created"));
  return Status::Ok();
}

std::vector<BackendCapabilities> all_backend_capabilities() {
  std::vector<BackendCapabilities> caps;
  for (const std::string& n : backend_names()) {
    std::unique_ptr<Backend> b;
    if (create_backend(n, &b).ok()) caps.push_back(b->capabilities());
  }
  return caps;
}

std::vector<KnownBackend> all_known_backends() {
  std::vector<KnownBackend> known;
  known.push_back({make_cpu_reference_backend()->capabilities(), true});
  known.push_back({make_cpu_backend()->capabilities(), true});
  known.push_back({cuda_backend_capabilities(), cuda_backend_linked()});
  return known;
}

Status write_kv_cache_device(const CacheWriteParams& p, void* stream) {
#if MLADCP_HAVE_CUDA
  if (write_kv_cache_cuda) return write_kv_cache_cuda(p, stream);
#endif
  (void)p;
  (void)stream;
  return Status::Unsupported("write_kv_cache_device: this program has no cuda backend (link mladcp::cuda)");
}

std::string best_available_backend() {
#if MLADCP_HAVE_CUDA
  if (cuda_backend_linked() && cuda_device_count && cuda_device_count() > 0) return "cuda";
#endif
  return "cpu";
}

}  // namespace mladcp
