// The subcommands of the mladcp tool. Each lives in its own cmd_<name>.cpp and registers itself on the
// top-level app; main.cpp calls every add_<name>_command() once. To add a command: write cmd_<name>.cpp
// (picked up by the build), declare its add function here and call it from main.cpp.
#pragma once

#include <functional>

#include "mladcp/status.h"

namespace CLI {
class App;
}

namespace mladcp::cli {

void add_backends_command(CLI::App& app);
void add_dcp_command(CLI::App& app);
void add_decode_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_version_command(CLI::App& app);

// The DCP part of `mladcp demo`: runs `mladcp dcp --check` on 4 CPU ranks under mpirun and prints a summary
// (a note when mpirun or MPI is missing). Defined in cmd_dcp.cpp.
Status dcp_demo_section(int threads);

// Makes `body` the work of subcommand `sub`. main() turns its Status into the exit code: 0 on success,
// 2 for a bad argument (kInvalidArgument), 1 for any other failure; errors print as "mladcp: <message>".
void set_command_body(CLI::App* sub, std::function<Status()> body);

}  // namespace mladcp::cli
