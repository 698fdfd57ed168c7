// The backend capability table: markdown for people (and docs/attention_backends.md), JSON for tools.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mladcp/backend.h"

namespace mladcp::cli {

// What `mladcp backends` lists: every backend registered in this process (built), then the built-in
// backends this build left out (built = false, shown as such).
std::vector<KnownBackend> backends_of_this_build();

// The markdown table, one row per backend. With `mark_unbuilt`, the Device cell of a backend that is
// not built says "(not built)".
std::string capability_table(const std::vector<KnownBackend>& rows, bool mark_unbuilt);

// "- `name`: description" lines, one per backend.
std::string backend_descriptions(const std::vector<KnownBackend>& rows);

// The whole of docs/attention_backends.md: generated from all_known_backends(), so it is the same for
// every build and every machine.
std::string backends_doc();

nlohmann::ordered_json capabilities_json(const std::vector<KnownBackend>& rows);

}  // namespace mladcp::cli
