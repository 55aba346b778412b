// lipcert certify --model M [--preset P] [--layer I] --center SPEC [--tokens N]
//                 --set ball|tokens|box --radius R | --relative-radius F [--norm 2|inf]
//                 [--time-limit S | --budget STEPS[,ROUNDS]] [--threads T] [--json OUT.json]
//                 [--witness OUT.safetensors]
// SIGINT and SIGTERM stop the run at its stages' next checks: the certificate so far is
// written (status interrupted) and printed as at the end.
#include <atomic>
#include <csignal>
#include <iostream>

#include "cli/commands.h"

namespace lipcert::cli {
namespace {

std::atomic<bool> g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);  // set from a signal handler
extern "C" void RequestStop(int) { g_stop.store(true); }

}  // namespace

Command AddCertifyCommand(CLI::App& parent) {
  auto a = std::make_shared<CertifyArgs>();
  CLI::App* app = parent.add_subcommand("certify", "certify the local Lipschitz constant of one layer over a set");
  AddCertifyOptions(app, a.get());
  return {app, [a] {
            PreparedJob job = PrepareJob(ToRequest(*a));
            if (!a->json_out.empty()) {
              // Anytime: every improvement is written atomically with status in_progress,
              // so a run killed at any moment leaves its best certificate so far.
              job.options.on_improvement = [out = a->json_out](const Certificate& c) {
                WriteFileAtomic(out, ToJson(c).dump(2) + "\n");
              };
            }
            job.options.stop = &g_stop;
            std::signal(SIGINT, RequestStop);
            std::signal(SIGTERM, RequestStop);
            const CertifyOutcome r = RunJob(job);
            std::signal(SIGINT, SIG_DFL);
            std::signal(SIGTERM, SIG_DFL);
            if (!a->witness_out.empty())
              WriteWitness(a->witness_out, r.certificate.witness);
            if (!a->json_out.empty()) WriteFileAtomic(a->json_out, ToJson(r.certificate).dump(2) + "\n");
            std::cout << Summary(r.certificate);
            return 0;
          }};
}

}  // namespace lipcert::cli
