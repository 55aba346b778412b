// The audit library: the audit file's validation names file, line and key; the job list is
// the cross product with thresholds applied; job keys change only for the jobs an edit
// touches; journal lines check themselves and a torn tail is dropped and cut; verdicts.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "audit/audit_file.h"
#include "audit/journal.h"
#include "audit/run.h"
#include "models/errors.h"

namespace lipcert::audit {
namespace {

namespace fs = std::filesystem;
const std::string kZoo = std::string(LIPCERT_SOURCE_DIR) + "/models/zoo";

// A fresh folder per test, under the build folder.
std::string TempDir(const std::string& name) {
  const fs::path d = fs::path(LIPCERT_BINARY_DIR) / "tests" / "audit-tmp" / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d.string();
}

std::string Write(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/audit.toml";
  std::ofstream(path) << text;
  return path;
}

// A small valid audit of the bundled zoo (two checkpoints by glob, two centres, two radii).
std::string ZooAudit(const std::string& extra = "") {
  return "[defaults]\n"
         "radii = [\"0.1%\", \"1%\"]\n"
         "budget = { steps = 4, rounds = 1 }\n"
         "dense_limit = 0\n"
         "[[checkpoint]]\n"
         "path = \"" + kZoo + "/dot-layer*.safetensors\"\n"
         "centres = { file = \"" + kZoo + "/{stem}-centres.safetensors\", tensors = [\"x0\", \"x1\"] }\n" + extra;
}

std::string ErrorOf(const std::string& path) {
  try {
    ReadAuditFile(path);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(AuditFile, CrossProduct) {
  const std::string dir = TempDir("cross");
  const AuditPlan plan = ReadAuditFile(Write(dir, ZooAudit()));
  // 2 checkpoints x 1 layer x 2 centres x 1 set x 2 radii x 1 norm x 1 part.
  ASSERT_EQ(plan.jobs.size(), 8u);
  std::set<std::string> keys;
  for (const AuditJob& j : plan.jobs) {
    keys.insert(j.key);
    EXPECT_EQ(j.request.options.budget.steps, 4);  // the job's work budget (CertifyOptions::budget)
    EXPECT_EQ(j.request.options.budget.rounds, 1);
    EXPECT_TRUE(j.request.options.budget.enabled());
    EXPECT_TRUE(j.thresholds.empty());
  }
  EXPECT_EQ(keys.size(), 8u);
  EXPECT_EQ(plan.jobs[0].checkpoint_name, "dot-layer0");
  EXPECT_EQ(plan.jobs[7].checkpoint_name, "dot-layer1");
  EXPECT_DOUBLE_EQ(plan.jobs[1].request.set.relative_radius, 0.01);
  EXPECT_EQ(plan.jobs[0].spec["centre"], kZoo + "/dot-layer0-centres.safetensors:x0");
}

TEST(AuditFile, ThresholdRulesTighten) {
  const std::string dir = TempDir("rules");
  const AuditPlan plan = ReadAuditFile(Write(dir, ZooAudit(
      "thresholds = { max_upper = 1000 }\n"
      "[[threshold]]\ncheckpoint = \"dot-layer1\"\nradius = \"1%\"\nmax_upper = 500\nmax_gap = 50\n")));
  ASSERT_EQ(plan.jobs.size(), 8u);
  int tightened = 0;
  for (const AuditJob& j : plan.jobs) {
    ASSERT_TRUE(j.thresholds.max_upper.has_value());
    const bool hit = j.checkpoint_name == "dot-layer1" && j.spec["radius"] == "1%";
    EXPECT_EQ(*j.thresholds.max_upper, hit ? 500 : 1000);
    EXPECT_EQ(j.thresholds.max_gap.has_value(), hit);
    tightened += hit;
  }
  EXPECT_EQ(tightened, 2);
}

TEST(AuditFile, KeysChangeOnlyForTouchedJobs) {
  const std::string dir = TempDir("keys");
  const AuditPlan a = ReadAuditFile(Write(dir, ZooAudit()));
  // A threshold is not part of the key (verdicts are recomputed from the journal).
  const AuditPlan b = ReadAuditFile(Write(dir, ZooAudit("thresholds = { max_upper = 7 }\n")));
  // One more radius adds jobs and keeps the others.
  std::string more = ZooAudit();
  more.replace(more.find("\"1%\"]"), 5, "\"1%\", 0.05]");
  const AuditPlan c = ReadAuditFile(Write(dir, more));
  std::set<std::string> ka, kc;
  for (const AuditJob& j : a.jobs) ka.insert(j.key);
  for (size_t i = 0; i < a.jobs.size(); ++i) EXPECT_EQ(a.jobs[i].key, b.jobs[i].key);
  for (const AuditJob& j : c.jobs) kc.insert(j.key);
  ASSERT_EQ(c.jobs.size(), 12u);
  int kept = 0;
  for (const std::string& k : ka) kept += kc.count(k);
  EXPECT_EQ(kept, 8);
  // A changed centre file changes the keys of its jobs only.
  const std::string copy = dir + "/centres";
  fs::create_directories(copy);
  for (const char* f : {"dot-layer0-centres.safetensors", "dot-layer1-centres.safetensors"})
    fs::copy_file(kZoo + "/" + f, copy + "/" + f);
  std::string local = ZooAudit();
  local.replace(local.find(kZoo + "/{stem}"), kZoo.size(), copy);
  const AuditPlan d0 = ReadAuditFile(Write(dir, local));
  {
    std::fstream f(copy + "/dot-layer1-centres.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x3f');  // the last byte of x3's last float64 (a finite value still)
  }
  const AuditPlan d1 = ReadAuditFile(Write(dir, local));
  int changed = 0;
  for (size_t i = 0; i < d0.jobs.size(); ++i) {
    const bool touched = d0.jobs[i].checkpoint_name == "dot-layer1";
    EXPECT_EQ(d0.jobs[i].key != d1.jobs[i].key, touched) << i;
    changed += d0.jobs[i].key != d1.jobs[i].key;
  }
  EXPECT_EQ(changed, 4);
}

TEST(AuditFile, ErrorsNameFileLineAndKey) {
  const std::string dir = TempDir("errors");
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {ZooAudit("colour = 3\n"), ":8: checkpoint[0].colour: unknown key"},
      {"[defaults]\nradii = [\"1%\"]\ntime_limit = \"ten\"\n", ":3: defaults.time_limit: expected a number, got a string"},
      {"[defaults]\nradii = [\"1 percent\"]\n", ":2: defaults.radii[0]: expected a number (absolute) or a percentage"},
      {"[defaults]\nnorms = [3]\n", ":2: defaults.norms[0]: expected 2 or \"inf\""},
      {"[defaults]\nradii = [1]\n[[checkpoint]]\npath = \"nowhere.safetensors\"\n", ":4: checkpoint[0].path: 'nowhere.safetensors' not found"},
      {"[defaults]\nradii = [1]\n[[checkpoint]]\npath = \"" + kZoo + "/dot-layer0.safetensors\"\n"
       "centres = { file = \"" + kZoo + "/dot-layer0-centres.safetensors\", tensors = [\"x9\"] }\n",
       ":5: checkpoint[0].centres.tensors: no tensor 'x9'"},
      {"[defaults]\nradii = [1]\n[[checkpoint]]\npath = \"" + kZoo + "/dot-layer0.safetensors\"\nlayers = [3]\n"
       "centres = { file = \"" + kZoo + "/dot-layer0-centres.safetensors\" }\n",
       ":5: checkpoint[0].layers[0]: "},
      {"[defaults]\nradii = [1]\n[[checkpoint]]\npath = \"" + kZoo + "/dot-layer0.safetensors\"\n"
       "centres = { file = \"" + kZoo + "/missing-{layer}.npy\" }\n",
       ":5: checkpoint[0].centres.file: '" + kZoo + "/missing-0.npy' not found"},
      {ZooAudit("[[threshold]]\ncheckpoint = \"nope\"\nmax_upper = 1\n"), ":8: threshold[0]: matches no job"},
      {ZooAudit("[[threshold]]\nlayer = 0\n"), ":8: threshold[0]: sets none of"},
      {ZooAudit("budget = { steps = 0 }\n"), ":8: checkpoint[0].budget.steps: must be in"},
      {"[defaults\n", ":1: toml: "},
  };
  int checked = 0;
  for (const Case& c : cases) {
    const std::string path = Write(dir, c.text);
    const std::string e = ErrorOf(path);
    EXPECT_NE(e.find(path + c.expect), std::string::npos) << "got: " << e << "\nexpected: " << c.expect;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    ++checked;
  }
  EXPECT_EQ(checked, int(cases.size()));
}

TEST(Journal, LinesCheckThemselvesAndTornTailsAreCut) {
  const std::string dir = TempDir("journal");
  const std::string path = dir + "/journal.jsonl";
  std::string all;
  {
    JournalWriter w(path);
    for (int i = 0; i < 3; ++i) {
      const std::string line = JournalLine({"k" + std::to_string(i), {{"i", i}}, {{"upper_bound", 1.5 * i}}});
      w.Append(line);
      all += line;
    }
  }
  JournalContents c = ReadJournal(path);
  ASSERT_EQ(c.entries.size(), 3u);
  EXPECT_EQ(c.dropped, 0);
  EXPECT_EQ(c.entries[2].certificate["upper_bound"], 3.0);
  // Every cut of the last line is dropped, and the journal before it survives.
  const size_t last_start = all.rfind('\n', all.size() - 2) + 1;
  int cuts = 0;
  for (size_t cut = last_start + 1; cut < all.size(); cut += 7) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << all.substr(0, cut);
    c = ReadJournal(path);
    ASSERT_EQ(c.entries.size(), 2u) << cut;
    EXPECT_EQ(c.dropped, 1);
    ++cuts;
  }
  EXPECT_GT(cuts, 10);
  // A flipped byte inside a line fails its checksum.
  std::string flipped = all;
  flipped[last_start + 100] ^= 1;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
  EXPECT_EQ(ReadJournal(path).entries.size(), 2u);
  // Opening for append cuts the torn tail; the next line starts clean; duplicates keep the first.
  std::ofstream(path, std::ios::binary | std::ios::trunc) << all.substr(0, all.size() - 5);
  {
    JournalWriter w(path);
    w.Append(JournalLine({"k0", {{"i", 9}}, {{"upper_bound", 99}}}));
    w.Append(JournalLine({"k3", {{"i", 3}}, {}}));
  }
  c = ReadJournal(path);
  ASSERT_EQ(c.entries.size(), 3u);
  EXPECT_EQ(c.dropped, 0);
  EXPECT_EQ(c.duplicates, 1);
  EXPECT_EQ(c.entries[0].job["i"], 0);
  EXPECT_EQ(c.entries[2].key, "k3");
}

TEST(Verdicts, ViolatedUnprovenPass) {
  using nlohmann::json;
  Thresholds t;
  t.max_upper = 10;
  EXPECT_EQ(Judge(t, {{"upper_bound", 9.0}, {"lower_bound", 1.0}}).verdict, Verdict::kPass);
  EXPECT_EQ(Judge(t, {{"upper_bound", 12.0}, {"lower_bound", 1.0}}).verdict, Verdict::kUnproven);
  EXPECT_EQ(Judge(t, {{"upper_bound", 12.0}, {"lower_bound", 11.0}}).verdict, Verdict::kViolated);
  EXPECT_EQ(Judge(t, {{"upper_bound", nullptr}, {"lower_bound", 1.0}}).verdict, Verdict::kUnproven);
  Thresholds g;
  g.max_gap = 2;
  EXPECT_EQ(Judge(g, {{"upper_bound", 3.0}, {"lower_bound", 2.0}}).verdict, Verdict::kPass);
  EXPECT_EQ(Judge(g, {{"upper_bound", 5.0}, {"lower_bound", 2.0}}).verdict, Verdict::kUnproven);
  EXPECT_EQ(Judge(g, {{"upper_bound", 5.0}, {"lower_bound", 0.0}}).verdict, Verdict::kUnproven);
  Thresholds m;
  m.min_lower = 4;
  EXPECT_EQ(Judge(m, {{"upper_bound", 5.0}, {"lower_bound", 4.0}}).verdict, Verdict::kPass);
  EXPECT_EQ(Judge(m, {{"upper_bound", 5.0}, {"lower_bound", 3.0}}).verdict, Verdict::kUnproven);
  EXPECT_EQ(Judge(m, {{"upper_bound", 3.5}, {"lower_bound", 3.0}}).verdict, Verdict::kViolated);
  EXPECT_EQ(Judge(Thresholds{}, {{"upper_bound", 3.5}}).verdict, Verdict::kNoThreshold);
}

}  // namespace
}  // namespace lipcert::audit
