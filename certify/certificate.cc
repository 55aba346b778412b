#include "certify/certificate.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <unistd.h>

namespace lipcert {

const char* CertificateStatusToString(CertificateStatus s) {
  switch (s) {
    case CertificateStatus::kTolerance: return "tolerance_reached";
    case CertificateStatus::kTimeLimit: return "time_limit";
    case CertificateStatus::kExhausted: return "engines_exhausted";
    case CertificateStatus::kInProgress: return "in_progress";
    case CertificateStatus::kInterrupted: return "interrupted";
    case CertificateStatus::kWorkBudget: return "work_budget";
  }
  return "?";
}

const char* EngineIdToString(EngineId id) {
  switch (id) {
    case EngineId::kClosedFormCastin: return "closed_form/castin";
    case EngineId::kClosedFormKim: return "closed_form/kim";
    case EngineId::kClosedFormKimInf: return "closed_form/kim_inf";
    case EngineId::kBlockNorm: return "block_norm";
    case EngineId::kCentred: return "centred";
    case EngineId::kCentreNorm: return "centre_norm";
    case EngineId::kBranchAndBound: return "branch_and_bound";
    case EngineId::kPostLnComposition: return "post_ln_composition";
    case EngineId::kPostLnCentre: return "post_ln_centre";
    case EngineId::kPostLnVariation: return "post_ln_variation";
    case EngineId::kTaylor: return "taylor";
  }
  return "?";
}

bool StringToEngineId(const std::string& name, EngineId* id) {
  for (EngineId e : {EngineId::kClosedFormCastin, EngineId::kClosedFormKim, EngineId::kClosedFormKimInf,
                     EngineId::kBlockNorm, EngineId::kCentred, EngineId::kCentreNorm, EngineId::kBranchAndBound,
                     EngineId::kPostLnComposition, EngineId::kPostLnCentre, EngineId::kPostLnVariation,
                     EngineId::kTaylor})
    if (name == EngineIdToString(e)) {
      *id = e;
      return true;
    }
  return false;
}

bool StringToCertificateStatus(const std::string& name, CertificateStatus* s) {
  for (CertificateStatus c : {CertificateStatus::kTolerance, CertificateStatus::kTimeLimit, CertificateStatus::kExhausted,
                              CertificateStatus::kInProgress, CertificateStatus::kInterrupted,
                              CertificateStatus::kWorkBudget})
    if (name == CertificateStatusToString(c)) {
      *s = c;
      return true;
    }
  return false;
}

double Certificate::gap() const {
  if (!(lower_bound.value() > 0)) return std::numeric_limits<double>::infinity();
  return upper_bound.value() / lower_bound.value();
}

const EngineResult* Certificate::Winner() const {
  const EngineResult* best = nullptr;
  for (const EngineResult& e : engines)
    if (e.applied && std::isfinite(e.upper.value()) && (!best || e.upper.value() < best->upper.value())) best = &e;
  return best;
}

namespace {
// JSON has no infinity: an unbounded value is written as null.
nlohmann::json Num(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
}  // namespace

namespace {

// "engines" (name -> bound), "engine_details" and "winner" (the engine whose bound is the
// certificate's and its largest term: "why is my bound large").
void EnginesToJson(const Certificate& c, nlohmann::json& j) {
  nlohmann::json engines = nlohmann::json::object(), details = nlohmann::json::array();
  for (const EngineResult& e : c.engines) {
    engines[e.name()] = Num(e.upper.value());
    nlohmann::json terms = nlohmann::json::array();
    for (const BoundTerm& t : e.terms) terms.push_back({{"name", t.name}, {"upper_bound", Num(t.value.value())}});
    details.push_back({{"name", e.name()},
                       {"upper_bound", Num(e.upper.value())},
                       {"seconds", e.seconds},
                       {"applied", e.applied},
                       {"note", e.note},
                       {"terms", terms}});
  }
  j["engines"] = engines;
  j["engine_details"] = details;
  // The engine that won and its largest term: "why is my bound large".
  if (const EngineResult* w = c.Winner()) {
    nlohmann::json winner = {{"engine", w->name()}};
    const BoundTerm* top = nullptr;
    for (const BoundTerm& t : w->terms)
      if (!top || t.value.value() > top->value.value()) top = &t;
    if (top) winner["dominant_term"] = {{"name", top->name}, {"upper_bound", Num(top->value.value())}};
    j["winner"] = winner;
  }
}

nlohmann::json ProbabilisticToJson(const ProbabilisticBound& p) {
  return {{"certified", false},
          {"probable_upper", Num(p.value)},
          {"confidence", 1 - p.failure_probability},
          {"failure_probability", p.failure_probability},
          {"route", p.route},
          {"method", "randomized Lanczos on J(X0)^T J(X0), Kuczynski-Wozniakowski 1992 Thm 4.2"},
          {"centre", {{"probable_upper", Num(p.centre.value)},
                      {"ritz_sigma", p.centre.ritz_sigma},
                      {"epsilon", p.centre.epsilon},
                      {"krylov_dim", p.centre.krylov_dim},
                      {"steps", p.centre.steps},
                      {"seed", p.centre.seed},
                      {"seconds", p.centre.seconds},
                      {"stopped_by_time", p.centre.stopped_by_time}}}};
}

// What a rerun needs (RunSettings).
nlohmann::json RunToJson(const RunSettings& r) {
  nlohmann::json run = {{"time_limit_s", r.budget.enabled() ? nlohmann::json(nullptr) : Num(r.time_limit_s)},
                        {"budget", r.budget.enabled() ? nlohmann::json{{"steps", r.budget.steps},
                                                                          {"rounds", r.budget.rounds}}
                                                          : nlohmann::json(nullptr)},
                        {"tolerance", r.tolerance},
                        {"seed", r.seed},
                        {"threads", r.threads}};
  if (const auto& cal = r.calibration)
    run["time_model"] = {{"interval_probe_s", cal->interval_probe_s},
                         {"interval_probe_cpu_s", cal->interval_probe_cpu_s},
                         {"interval_slowdown", cal->interval_slowdown},
                         {"gemm_probe_s", cal->gemm_probe_s},
                         {"gemm_probe_cpu_s", cal->gemm_probe_cpu_s},
                         {"gemm_slowdown", cal->gemm_slowdown},
                         {"probe_s", cal->probe_seconds}};
  return run;
}

}  // namespace

nlohmann::json ToJson(const Certificate& c) {
  nlohmann::json j;
  j["schema"] = "lipcert.certificate/1";
  j["model"] = {{"path", c.provenance.model_path},
                {"sha256", c.provenance.model_sha256},
                {"preset", c.provenance.preset},
                {"layer", c.provenance.layer_index}};
  j["layer"] = {{"kind", AttentionKindToString(c.kind)},         {"d_model", c.d_model},       {"heads", c.heads},
                {"head_dim_qk", c.head_dim_qk}, {"head_dim_v", c.head_dim_v}, {"causal", c.causal},
                {"layer_norm", c.layer_norm},   {"biases", c.biases},
                {"post_layer_norm", c.post_layer_norm}};
  j["set"] = {{"kind", SetKindToString(c.set)},
              {"radius", c.radius},
              {"tokens", c.tokens},
              {"centre", c.provenance.centre_source},
              {"centre_frobenius_norm", c.centre_frobenius_norm}};
  j["norm"] = NormKindToString(c.norm);
  j["upper_bound"] = Num(c.upper_bound.value());
  j["lower_bound"] = Num(c.lower_bound.value());
  j["gap"] = Num(c.gap());
  EnginesToJson(c, j);
  j["witness"] = {{"origin", c.witness.origin},
                  {"value", Num(c.witness.value)},
                  {"lower_bound", Num(c.witness.lower_bound.value())}};
  if (c.invertibility) {
    const Invertibility& inv = *c.invertibility;
    j["invertibility"] = {{"residual_lipschitz_upper", Num(inv.lip_g_upper.value())},
                          {"certified_invertible", inv.certified},
                          {"bi_lipschitz_lower", Num(inv.bi_lipschitz_lower.value())},
                          {"bi_lipschitz_upper", Num(inv.bi_lipschitz_upper.value())}};
  }
  if (c.probabilistic) j["probabilistic"] = ProbabilisticToJson(*c.probabilistic);
  j["run"] = RunToJson(c.run);
  j["numerics"] = {{"rounding_model", c.rounding_model},
                   {"exp_backend", c.exp_backend},
                   {"fp_environment_repaired", c.fp_environment_repaired}};
  j["status"] = CertificateStatusToString(c.status);
  j["branch_and_bound"] = {{"pieces_explored", c.pieces_explored}, {"open_pieces", c.open_pieces}};
  j["elapsed_s"] = c.elapsed_s;
  if (!c.notes.empty()) j["notes"] = c.notes;
  return j;
}

std::string Summary(const Certificate& c) {
  std::ostringstream os;
  os.precision(6);
  os << c.provenance.model_path << " layer " << c.provenance.layer_index << " (" << AttentionKindToString(c.kind)
     << ", D=" << c.d_model << ", H=" << c.heads << (c.causal ? ", causal" : "")
     << (c.layer_norm ? ", X+MHA(LN(X))" : "") << (c.post_layer_norm ? ", LN(X+MHA(X))" : "") << ")\n";
  os << "  set " << SetKindToString(c.set) << " radius " << c.radius << " around " << c.provenance.centre_source
     << " (N=" << c.tokens << "), norm " << NormKindToString(c.norm) << "\n";
  os << "  certified upper " << c.upper_bound.value() << "   witnessed lower " << c.lower_bound.value()
     << "   gap " << c.gap() << "   [" << CertificateStatusToString(c.status) << ", " << c.elapsed_s << " s]\n";
  os << "  engines:";
  for (const EngineResult& e : c.engines) {
    os << " " << e.name() << "=";
    if (!e.applied)
      os << "n/a (" << e.note << ")";
    else if (!std::isfinite(e.upper.value()) && !e.note.empty())
      os << "n/a (" << e.note << ")";  // ran out of time: +inf in the JSON, the reason here
    else
      os << e.upper.value();
  }
  os << "\n";
  if (const EngineResult* w = c.Winner(); w && !w->terms.empty()) {
    os << "  " << w->name() << " =";
    for (size_t i = 0; i < w->terms.size(); ++i)
      os << (i ? " + " : " ") << w->terms[i].name << " " << w->terms[i].value.value();
    os << "\n";
  }
  if (c.probabilistic)
    os << "  probabilistic (not certified): upper " << c.probabilistic->value << " with probability >= "
       << 1 - c.probabilistic->failure_probability << " (" << c.probabilistic->route << ")\n";
  for (const std::string& n : c.notes) os << "  note: " << n << "\n";
  if (c.invertibility)
    os << "  residual Lip(g) <= " << c.invertibility->lip_g_upper.value()
       << (c.invertibility->certified ? "  -> certified invertible on the set" : "  (invertibility not certified)")
       << "\n";
  return os.str();
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error(path + ": cannot open for writing");
    f << text;
    f.flush();
    if (!f) {
      std::remove(tmp.c_str());
      throw std::runtime_error(path + ": write failed");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename temporary file into place");
  }
}

}  // namespace lipcert
