// lipcert hf: certifies a HuggingFace model folder's attention layers from text. The work is
// done by the Python package (tokenizer, model and forward pass come from transformers), so
// this subcommand runs lipcert.hf's main with ARGS in the interpreter that has it:
// $LIPCERT_PYTHON, else the python3 beside this executable (a pip install puts both in the
// same bin/ folder), else python3 on the PATH. An interpreter without the package (or its
// [hf] extra) ends with exit code 2 and a message that names it, as every bad input does.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "cli/commands.h"

namespace lipcert::cli {
namespace {

// Run by `python -c` in place of `-m lipcert.hf`, so that a missing package is a usage error.
constexpr const char* kBootstrap = R"(import sys
try:
    import lipcert.hf as hf
except ImportError as e:
    sys.stderr.write("lipcert hf: the Python interpreter " + sys.executable + " cannot import lipcert.hf ("
                     + str(e) + "); install the package with its HuggingFace extra: pip install '.[hf]'\n")
    sys.exit(2)
sys.argv[0] = "lipcert hf"
sys.exit(hf.main(sys.argv[1:]))
)";

std::vector<std::string> Interpreters() {
  std::vector<std::string> out;
  if (const char* p = std::getenv("LIPCERT_PYTHON"); p && *p) return {p};
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec)
    for (const char* name : {"python3", "python"}) {
      const auto beside = self.parent_path() / name;
      if (std::filesystem::exists(beside, ec)) out.push_back(beside.string());
    }
  out.push_back("python3");
  return out;
}

}  // namespace

int RunHfCommand(int argc, char** argv) {
  std::string tried;
  for (const std::string& python : Interpreters()) {
    std::vector<std::string> args = {python, "-c", kBootstrap};
    for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
    std::vector<char*> cargs;
    for (std::string& a : args) cargs.push_back(a.data());
    cargs.push_back(nullptr);
    execvp(cargs[0], cargs.data());  // returns only on failure
    tried += (tried.empty() ? "" : ", ") + python + " (" + std::strerror(errno) + ")";
  }
  std::cerr << "lipcert hf: needs the Python package (pip install '.[hf]'); could not run " << tried << "\n";
  return 2;
}

}  // namespace lipcert::cli
