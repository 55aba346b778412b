// The audit's report through reports/ (reports/report.h): an audit document with schema
// "lipcert.audit/1" (plan, thresholds, verdicts, certificates) rendered as OUT/report.html
// and OUT/report.md, and readable again by `lipcert report OUT/audit.json`.
//
//   lipcert.audit/1 = {schema, audit_file, jobs: [{key, checkpoint_name, spec, thresholds,
//                      verdict, reason, certificate (null when missing)}]}
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace lipcert::audit {

// Registers the lipcert.audit/1 handler with reports/ (idempotent).
void RegisterAuditSchema();

// Writes OUT/audit.json, OUT/report.html and OUT/report.md (figures beside it).
void WriteAuditReport(const nlohmann::json& audit_doc, const std::string& out_dir);

}  // namespace lipcert::audit
