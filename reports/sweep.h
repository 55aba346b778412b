// Radius sweeps: certify every (model, layer, tokens, radius) point through the pipeline
// (certify/pipeline.h) and keep a journal, DIR/sweep.json (schema lipcert.sweep/1,
// docs/reports.md), rewritten atomically after each point. A killed sweep keeps what it
// finished; rerunning the same command reads the journal and skips the points it holds
// (keyed by model SHA-256, layer, set, radius, tokens, norm, attention_only and centre).
//
//   SweepOptions --PlanSweep--> points --(skip journalled)--> PrepareJob/RunJob per point
//                --> journal after each --> WriteSweepOutputs: sweep.json, sweep.csv,
//                    report.html, report.md and its SVGs
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "certify/input_set.h"
#include "certify/run_control.h"
#include "reports/report.h"

namespace lipcert::reports {

struct SweepOptions {
  std::vector<std::string> models;     // checkpoints
  std::vector<std::string> centres;    // one for every model, or one per model ("zero", FILE[:TENSOR])
  std::string preset = "auto";
  std::string layer;                   // "": the checkpoint's only layer; "all"; or an index
  int heads = 0;                       // when the checkpoint does not say
  SetKind set = SetKind::kBall;
  std::vector<double> radii;           // absolute radii, or
  std::vector<double> relative_radii;  // fractions of ||X0||_F (exactly one of the two)
  int tokens = 0;                      // N with centre "zero"
  std::vector<int> tokens_list;        // several N (centre "zero" only); overrides tokens
  NormKind norm = NormKind::kL2;
  bool attention_only = false;
  double time_limit_per_point_s = 10;
  WorkBudget budget;                   // work instead of the clock per point (certify/run_control.h)
  int threads = 0;                     // 0: all cores
  std::string out_dir;                 // created when missing
  std::string command_line;            // recorded in the journal
  bool progress = true;                // stderr: a live line on a terminal, else a line per point
  bool validate = false;               // add the validation section to the report
  double validation_time_limit_s = 2;

  // "" when valid, else a message naming the field ("radii: ...").
  std::string IsValid() const;
};

// The key of one point (what makes two points the same computation).
std::string PointKey(const std::string& model_sha256, int layer, SetKind set, bool relative, double radius,
                     int tokens, NormKind norm, bool attention_only, const std::string& centre);

struct SweepSummary {
  int total = 0, computed = 0, resumed = 0;  // points planned, certified now, read from the journal
  std::string json_path, csv_path, html_path, markdown_path;
  double seconds = 0;
};

// Runs (or resumes) the sweep and writes every output. Throws OptionError for bad options
// (field named), InputError for bad files, both before any point is certified.
SweepSummary RunSweep(const SweepOptions& options);

// The CSV of a sweep document (one row per point).
std::string SweepCsv(const nlohmann::json& sweep);

// Writes DIR/sweep.csv, DIR/report.html, DIR/report.md and the SVGs beside it from a sweep
// document (validated with CheckReportInput first).
void WriteSweepOutputs(const nlohmann::json& sweep, const std::string& out_dir, const ReportOptions& options,
                       SweepSummary* summary);

}  // namespace lipcert::reports
