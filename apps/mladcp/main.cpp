// mladcp: the command-line tool of the MLA decode + DCP library.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "cli_common.h"
#include "commands.h"
#include "mladcp/version.h"

namespace mladcp::cli {
namespace {

// The outcome of the subcommand that ran (CLI11 runs it inside parse()).
Status& command_status() {
  static Status status;
  return status;
}

}  // namespace

void set_command_body(CLI::App* sub, std::function<Status()> body) {
  sub->callback([body = std::move(body)] { command_status() = body(); });
}

}  // namespace mladcp::cli

int main(int argc, char** argv) {
  using namespace mladcp::cli;
  CLI::App app{"mladcp " MLADCP_VERSION_STRING
               ": MLA (multi-head latent attention) decode with log-sum-exp, and decode context parallelism",
               "mladcp"};
  app.set_version_flag("--version", std::string("mladcp ") + MLADCP_VERSION_STRING);
  app.require_subcommand(1);

  add_backends_command(app);
  add_dcp_command(app);
  add_decode_command(app);
  add_demo_command(app);
  add_plan_command(app);
  add_version_command(app);

  // A first word that is neither a flag nor a subcommand: name it and list the subcommands.
  if (argc > 1 && argv[1][0] != '-' &&
      app.get_subcommands([&](CLI::App* sub) { return sub->check_name(argv[1]); }).empty()) {
    std::string names;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      if (!names.empty()) names += ", ";
      names += sub->get_name();
    }
    std::fprintf(stderr, "mladcp: '%s': unknown subcommand; accepted: %s\n", argv[1], names.c_str());
    return kExitBadArgument;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "mladcp: %s\n", e.what());
    if (argc <= 1) std::fprintf(stderr, "%s", app.help().c_str());
    return kExitBadArgument;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mladcp: out of host memory (try a smaller problem)\n");
    return kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mladcp: internal error: %s\n", e.what());
    return kExitFailure;
  }
  return exit_code(command_status());
}
