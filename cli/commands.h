// The subcommands of the lipcert CLI, one file each (cli/<name>.cc). Each Add*Command
// registers its options on `parent` and returns what main() runs when it was chosen.
// Commands throw InputError / OptionError for bad input (main() prints one line and
// returns 2); nothing below main() exits.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "certify/pipeline.h"

namespace lipcert::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command AddInspectCommand(CLI::App& parent);
Command AddCertifyCommand(CLI::App& parent);
Command AddSearchCommand(CLI::App& parent);
Command AddZooCommand(CLI::App& parent);
Command AddBenchCommand(CLI::App& parent);
Command AddSweepCommand(CLI::App& parent);
Command AddReportCommand(CLI::App& parent);
Command AddAuditCommand(CLI::App& parent);

// Shared by certify and search: the request's options and where output goes.
struct CertifyArgs {
  CertifyRequest request;
  std::string set = "ball", norm = "2", json_out, witness_out;
  std::string budget;             // --budget STEPS[,ROUNDS]
  bool quiet = false;
  bool no_probabilistic = false;  // --no-probabilistic
};
void AddModelOptions(CLI::App* app, ModelSpec* model, bool positional);
void AddCertifyOptions(CLI::App* app, CertifyArgs* args);
// Turns the parsed strings into the request and checks that output folders exist, so that
// nothing fails at the end of a long run.
CertifyRequest ToRequest(const CertifyArgs& args);
// Writes the witness X* and direction v (F64 safetensors, lower bound in the metadata).
void WriteWitness(const std::string& path, const Witness& w);

}  // namespace lipcert::cli
