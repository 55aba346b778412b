// Kim et al.'s l_inf bound against lipcert's structured inf-norm bound on compact sets
// (docs/engines.md, "Kim et al.'s l_inf bound"): the unit L2 layer (D = H = dk = 1, all
// weights 1), tokens sets of radius R around Kim's tightness construction at N tokens,
// `lipcert certify --norm inf` with the given seconds. One line per (N, R): the certified
// bound, the best structured engine's, Kim's bound and the witness.
//
//   build/bench/kim_inf_bench [--tokens 11,101] [--radii 0,0.01,0.1,0.3] [--seconds 5] [--threads 2]
#include <cstdio>
#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "certify/certify.h"
#include "reports/validation.h"

namespace {

std::vector<double> ListOf(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || !(v >= 0)) throw std::invalid_argument(flag + ": expected numbers >= 0, got '" + item + "'");
    out.push_back(v);
  }
  if (out.empty()) throw std::invalid_argument(flag + ": empty list");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace lipcert;
  try {
    std::vector<double> tokens = {11, 101}, radii = {0, 0.01, 0.1, 0.3};
    double seconds = 5;
    int threads = 2;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (i + 1 >= argc) throw std::invalid_argument(a + ": missing value");
      const std::string v = argv[++i];
      if (a == "--tokens") tokens = ListOf(a, v);
      else if (a == "--radii") radii = ListOf(a, v);
      else if (a == "--seconds") seconds = ListOf(a, v).at(0);
      else if (a == "--threads") threads = int(ListOf(a, v).at(0));
      else throw std::invalid_argument("unknown option " + a);
    }
    for (double t : tokens)
      if (t < 3 || t != double(int(t)) || int(t) % 2 == 0) throw std::invalid_argument("--tokens: Kim's construction needs odd N >= 3");
    if (!(seconds > 0)) throw std::invalid_argument("--seconds: must be > 0");
    const AttentionLayer l2 = reports::UnitLayer(AttentionKind::kL2);
    for (double t : tokens) {
      const int n = int(t);
      for (double r : radii) {
        InputSet set;
        set.kind = SetKind::kTokens;
        set.center = reports::KimTightnessInput(n);
        set.radius = r;
        CertifyOptions o;
        o.norm = NormKind::kLinf;
        o.time_limit_s = seconds;
        o.threads = threads;
        const Certificate c = Certify(l2, set, o, Provenance{});
        double kim = -1, structured = 1e300;
        std::string from = "none";
        for (const EngineResult& e : c.engines) {
          if (e.id == EngineId::kClosedFormKimInf) kim = e.upper.value();
          else if (e.applied && e.id != EngineId::kBranchAndBound && e.upper.value() < structured)
            structured = e.upper.value(), from = e.name();
        }
        std::printf("N=%d R=%g certified=%.5g structured=%.5g (%s) kim_inf=%.5g witness=%.5g\n", n, r,
                    c.upper_bound.value(), structured, from.c_str(), kim, c.lower_bound.value());
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kim_inf_bench: %s\n", e.what());
    return 2;
  }
}
