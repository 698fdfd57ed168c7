// The host backends every oracle test runs: each registered host backend, plus the "cpu" backend with
// every kernel variant this machine supports and with a plan that splits keys into many small chunks
// (so the split-KV merge runs even on short sequences).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/decode_check.h"
#include "cpu/cpu_internal.h"

namespace mladcp::test {

struct BackendUnderTest {
  std::string label;
  std::function<std::unique_ptr<Backend>()> make;
};

inline std::vector<BackendUnderTest> host_backends_under_test() {
  std::vector<BackendUnderTest> out;
  for (const std::string& name : host_backend_names()) out.push_back({name, [name] { return make_backend(name); }});
  for (cpu::Isa isa : {cpu::Isa::kGeneric, cpu::Isa::kAvx2, cpu::Isa::kAvx512, cpu::Isa::kAmx}) {
    const cpu::KernelVariant* k = cpu::kernel_for(isa);
    if (!k) continue;
    out.push_back({std::string("cpu[") + cpu::isa_name(isa) + "]", [k] { return cpu::make_cpu_backend_with(*k); }});
    cpu::PlanOptions small;
    small.target_items = 1 << 20;
    small.min_chunk_keys = cpu::kTileKeys;
    small.max_chunk_keys = cpu::kTileKeys;
    out.push_back({std::string("cpu[") + cpu::isa_name(isa) + ",64-key chunks]",
                   [k, small] { return cpu::make_cpu_backend_with(*k, small); }});
  }
  return out;
}

}  // namespace mladcp::test
