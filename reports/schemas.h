// The built-in schema handlers of reports/report.h and what they share (internal to reports/).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "reports/report.h"

namespace lipcert::reports {

SchemaHandler CertificateSchema();  // lipcert.certificate/1 (docs/certificate.md)
SchemaHandler SweepSchema();        // lipcert.sweep/1 (docs/reports.md)

// "" when `cert` has every certificate field a report reads, else "PREFIX.FIELD: message".
std::string CheckCertificateJson(const nlohmann::json& cert, const std::string& prefix);

// The engine whose certified bound is the certificate's (the smallest applied bound).
std::string WinningEngine(const nlohmann::json& cert);
// A certificate's upper/lower bounds as doubles (null upper: +inf).
double UpperOf(const nlohmann::json& cert);
double LowerOf(const nlohmann::json& cert);
// "closed_form/castin" -> its bound, for every closed_form/* engine with a finite bound.
std::vector<std::pair<std::string, double>> ClosedForms(const nlohmann::json& cert);

// The last section: how this report was made and what each input rests on.
Section ReportProvenanceSection(const std::vector<ReportInput>& inputs, const ReportOptions& options);

// lipcert's version (the CMake project version).
const char* LipcertVersion();
// The current UTC time, ISO 8601.
std::string UtcNow();

}  // namespace lipcert::reports
