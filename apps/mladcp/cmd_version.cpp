// `mladcp version`: the library version and what this build contains.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "commands.h"
#include "mladcp/backend.h"
#include "mladcp/version.h"

namespace mladcp::cli {

void add_version_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("version", "Print the version and the backends built in");
  set_command_body(sub, [] {
    std::string names;
    for (const std::string& n : backend_names()) names += (names.empty() ? "" : ", ") + n;
    std::printf("mladcp %s\nbackends: %s\nbest available here: %s\n", MLADCP_VERSION_STRING, names.c_str(),
                best_available_backend().c_str());
    return Status::Ok();
  });
}

}  // namespace mladcp::cli
