// lipcert command-line interface: one file per subcommand (cli/<name>.cc); the
// certification pipeline itself is certify/pipeline.h.
//
//   lipcert inspect | certify | search | zoo | bench | sweep | report | audit | hf
//   (lipcert SUBCOMMAND --help)
//
// Exit status: 0 success, 2 bad input (one line naming the file and the field, no output
// file written), 1 internal error. Nothing below main() exits.
#include <cctype>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "models/errors.h"

namespace lipcert::cli {
namespace {

// Library errors name the request field ("time_limit: must be positive"); at the CLI the
// field is the flag that sets it ("--time-limit: ...").
std::string AsFlagMessage(const std::string& message) {
  size_t i = 0;
  while (i < message.size() && (std::islower(static_cast<unsigned char>(message[i])) || message[i] == '_')) ++i;
  if (i == 0 || i >= message.size() || message[i] != ':') return message;
  std::string flag = "--" + message.substr(0, i);
  for (char& c : flag)
    if (c == '_') c = '-';
  return flag + message.substr(i);
}

int Main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "hf") return RunHfCommand(argc, argv);
  CLI::App app{"lipcert: certified local Lipschitz bounds of attention layers"};
  app.footer("lipcert hf MODEL_DIR --text ... : a HuggingFace folder's layers from text, through the Python "
             "package (python -m lipcert.hf --help)");
  app.require_subcommand(1);
  const std::vector<Command> commands = {AddInspectCommand(app), AddCertifyCommand(app), AddSearchCommand(app),
                                         AddZooCommand(app), AddBenchCommand(app),
                                         AddSweepCommand(app), AddReportCommand(app), AddAuditCommand(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "lipcert: " << e.what() << "\n";
    return 2;
  }
  try {
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const InputError& e) {
    std::cerr << "lipcert: " << e.what() << "\n";
    return 2;
  } catch (const OptionError& e) {
    std::cerr << "lipcert: " << AsFlagMessage(e.what()) << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "lipcert: " << AsFlagMessage(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "lipcert: internal error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace lipcert::cli

int main(int argc, char** argv) { return lipcert::cli::Main(argc, argv); }
