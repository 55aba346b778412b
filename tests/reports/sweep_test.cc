// The sweep driver: plan, journal, resume, outputs; a BERT-preset checkpoint with every layer.
#include "reports/sweep.h"
#include "models/sha256.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "models/errors.h"

namespace lipcert::reports {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("lipcert_sweep_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  return p.string();
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

SweepOptions SmallSweep(const std::string& out) {
  SweepOptions o;
  o.models = {std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/native-dot",
              std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/native-l2"};
  o.centres = {"zero"};
  o.set = SetKind::kTokens;
  o.radii = {0.5, 2};
  o.tokens_list = {2, 3};
  o.time_limit_per_point_s = 0.2;
  o.threads = 1;
  o.out_dir = out;
  o.progress = false;
  o.command_line = "lipcert sweep (test)";
  return o;
}

TEST(Sweep, WritesEveryPointAndResumesWithoutRecomputing) {
  const std::string out = TempDir("resume");
  const SweepOptions o = SmallSweep(out);
  const SweepSummary first = RunSweep(o);
  EXPECT_EQ(first.total, 8);
  EXPECT_EQ(first.computed, 8);
  EXPECT_EQ(first.resumed, 0);
  const nlohmann::json doc = ReadJson(out + "/sweep.json");
  EXPECT_EQ(doc["schema"], "lipcert.sweep/1");
  EXPECT_TRUE(doc["complete"].get<bool>());
  ASSERT_EQ(doc["points"].size(), 8u);
  std::set<std::string> keys;
  for (const auto& p : doc["points"]) {
    keys.insert(p["key"].get<std::string>());
    const auto& c = p["certificate"];
    EXPECT_EQ(c["schema"], "lipcert.certificate/1");
    EXPECT_GE(c["upper_bound"].get<double>(), c["lower_bound"].get<double>());
    EXPECT_EQ(c["set"]["tokens"].get<int>(), p["tokens"].get<int>());
  }
  EXPECT_EQ(keys.size(), 8u);
  for (const char* f : {"sweep.csv", "report.html", "report.md"}) EXPECT_TRUE(fs::exists(out + "/" + f)) << f;
  std::ifstream csv(out + "/sweep.csv");
  int lines = 0;
  for (std::string line; std::getline(csv, line);) ++lines;
  EXPECT_EQ(lines, 9);
  // The same command again: nothing recomputed, the points untouched.
  const SweepSummary second = RunSweep(o);
  EXPECT_EQ(second.computed, 0);
  EXPECT_EQ(second.resumed, 8);
  EXPECT_EQ(ReadJson(out + "/sweep.json")["points"], doc["points"]);
  // A journal with a point that is not in this sweep is refused, not mixed in.
  SweepOptions other = o;
  other.radii = {0.5};
  EXPECT_THROW(RunSweep(other), OptionError);
  // Dropping the last point from the journal (a killed run): only that point is recomputed.
  nlohmann::json partial = doc;
  partial["points"].erase(partial["points"].size() - 1);
  partial["complete"] = false;
  std::ofstream(out + "/sweep.json") << partial.dump();
  const SweepSummary third = RunSweep(o);
  EXPECT_EQ(third.computed, 1);
  EXPECT_EQ(third.resumed, 7);
  EXPECT_EQ(ReadJson(out + "/sweep.json")["points"].size(), 8u);
  EXPECT_EQ(ReadJson(out + "/sweep.json")["lipcert_build"], ExecutableSha256());
  // A journal written by another build of lipcert: every point is certified again.
  nlohmann::json foreign = ReadJson(out + "/sweep.json");
  foreign["lipcert_build"] = "another-build";
  std::ofstream(out + "/sweep.json") << foreign.dump();
  const SweepSummary fourth = RunSweep(o);
  EXPECT_EQ(fourth.computed, 8);
  EXPECT_EQ(fourth.resumed, 0);
  EXPECT_EQ(ReadJson(out + "/sweep.json")["lipcert_build"], ExecutableSha256());
  const std::string html = [&] {
    std::ifstream f(out + "/report.html");
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }();
  EXPECT_NE(html.find("against the radius"), std::string::npos);
  EXPECT_NE(html.find("against the number of tokens"), std::string::npos);
  EXPECT_NE(html.find("closed_form/castin"), std::string::npos);
  EXPECT_NE(html.find("closed_form/kim"), std::string::npos);
  fs::remove_all(out);
}

TEST(Sweep, BertCheckpointEveryLayer) {
  const std::string out = TempDir("bert");
  SweepOptions o;
  o.models = {std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/bert"};
  o.preset = "bert";
  o.layer = "all";
  o.centres = {"zero"};
  o.tokens = 3;
  o.set = SetKind::kBall;
  o.radii = {0.1, 1};
  o.time_limit_per_point_s = 0.2;
  o.threads = 1;
  o.out_dir = out;
  o.progress = false;
  const SweepSummary s = RunSweep(o);
  EXPECT_EQ(s.total, 4);  // 2 layers x 2 radii
  const nlohmann::json doc = ReadJson(out + "/sweep.json");
  std::set<int> layers;
  for (const auto& p : doc["points"]) layers.insert(p["layer"].get<int>());
  EXPECT_EQ(layers, (std::set<int>{0, 1}));
  std::ifstream f(out + "/report.html");
  std::stringstream ss;
  ss << f.rdbuf();
  EXPECT_NE(ss.str().find("data-plot=\"bar\""), std::string::npos);
  EXPECT_NE(ss.str().find("every layer"), std::string::npos);
  fs::remove_all(out);
}

TEST(Sweep, OptionsNameTheBadField) {
  SweepOptions o = SmallSweep("x");
  EXPECT_EQ(o.IsValid(), "");
  o.radii.clear();
  EXPECT_NE(o.IsValid().find("radii:"), std::string::npos);
  o = SmallSweep("x");
  o.relative_radii = {0.1};
  EXPECT_NE(o.IsValid().find("radii:"), std::string::npos);
  o = SmallSweep("x");
  o.centres = {"a", "b", "c"};
  EXPECT_NE(o.IsValid().find("center:"), std::string::npos);
  o = SmallSweep("x");
  o.layer = "two";
  EXPECT_NE(o.IsValid().find("layer:"), std::string::npos);
  o = SmallSweep("x");
  o.time_limit_per_point_s = 0;
  EXPECT_NE(o.IsValid().find("time_limit_per_point:"), std::string::npos);
}

TEST(Sweep, PointKeysSeparateEveryField) {
  std::set<std::string> keys;
  for (int layer : {0, 1})
    for (SetKind s : {SetKind::kBall, SetKind::kTokens})
      for (bool rel : {false, true})
        for (double r : {0.1, 0.2})
          for (int n : {0, 4})
            for (NormKind norm : {NormKind::kL2, NormKind::kLinf})
              for (bool ao : {false, true}) keys.insert(PointKey("sha", layer, s, rel, r, n, norm, ao, "zero"));
  EXPECT_EQ(keys.size(), 2u * 2 * 2 * 2 * 2 * 2 * 2);
}

}  // namespace
}  // namespace lipcert::reports
