// The audit file (docs/audit.md): a TOML list of checkpoints, centres, sets, radii, norms,
// limits and thresholds, read and validated in full before any job runs, and expanded into
// the job list (the cross product), each job a CertifyRequest.
//
//   ReadAuditFile(path) --> AuditPlan { jobs[i] = { spec, request, thresholds, key } }
//
// Any problem (TOML syntax, an unknown key, a wrong type, a missing file, tensor or layer)
// throws InputError whose what() is one line "FILE:LINE: KEY: message".
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "certify/pipeline.h"

namespace lipcert::audit {

// What must hold for one job; unset limits are not checked. Several rules that match one
// job combine to the tightest of each limit.
struct Thresholds {
  std::optional<double> max_upper;  // certified upper bound <= max_upper
  std::optional<double> max_gap;    // upper / lower <= max_gap
  std::optional<double> min_lower;  // witnessed lower bound >= min_lower (at least this sensitive)
  bool empty() const { return !max_upper && !max_gap && !min_lower; }
  void Tighten(const Thresholds& other);
  nlohmann::json ToJson() const;
  static Thresholds FromJson(const nlohmann::json& j);
};


struct AuditJob {
  // The job's own description, as written in the journal: checkpoint (name and path as the
  // audit file gives it), preset, layer, centre, set, radius, norm, attention_only, limits.
  // Paths in it are relative to the audit file's folder, so that the key does not depend on
  // where the audit runs.
  nlohmann::json spec;
  CertifyRequest request;       // paths resolved for this process
  Thresholds thresholds;
  std::string checkpoint_name;  // for the table
  std::string checkpoint_sha256, centre_sha256;
  // sha256 of (spec, checkpoint sha256, centre file sha256, lipcert's build): a changed entry
  // or file invalidates exactly the jobs it touches, and a rebuilt lipcert all of them.
  std::string key;
};

struct AuditPlan {
  std::string file;             // the audit file as given
  std::vector<AuditJob> jobs;   // in file order: checkpoint, layer, centre, set, radius, norm, attention_only
  nlohmann::json ToJson() const;  // the plan written beside the journal (keys, specs, thresholds)
};

// Reads, validates and expands the audit file. Loads each checkpoint's header and each
// centre once to check layers, tensors and shapes; runs nothing.
AuditPlan ReadAuditFile(const std::string& path);

}  // namespace lipcert::audit
