// `mladcp backends`: the capability table of the decode backends.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "backend_table.h"
#include "commands.h"

namespace mladcp::cli {

void add_backends_command(CLI::App& app) {
  struct Options {
    bool json = false;
    bool doc = false;
  };
  auto opt = std::make_shared<Options>();
  CLI::App* sub = app.add_subcommand("backends", "Capability table of the decode backends (markdown, or --json)");
  CLI::Option* json = sub->add_flag("--json", opt->json, "Print JSON instead of markdown");
  sub->add_flag("--doc", opt->doc,
                "Print docs/attention_backends.md: every backend the library defines, independent of this build")
      ->excludes(json);
  set_command_body(sub, [opt] {
    std::string text;
    if (opt->doc)
      text = backends_doc();
    else if (opt->json)
      text = capabilities_json(backends_of_this_build()).dump(2) + "\n";
    else
      text = capability_table(backends_of_this_build(), /*mark_unbuilt=*/true) + "\n" +
             backend_descriptions(backends_of_this_build());
    std::fputs(text.c_str(), stdout);
    return Status::Ok();
  });
}

}  // namespace mladcp::cli
