// Reading and checking report inputs, the schema table, and the renderers.
#include "reports/report.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "certify/pipeline.h"
#include "models/errors.h"

namespace lipcert::reports {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("lipcert_reports_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

void Write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A real certificate from the pipeline on a small bundled checkpoint.
nlohmann::json RealCertificate() {
  CertifyRequest r;
  r.model.path = std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/native-dot";
  r.set.centre = "zero";
  r.set.tokens = 3;
  r.set.kind = SetKind::kTokens;
  r.set.radius = 0.5;
  r.options.time_limit_s = 0.3;
  r.options.threads = 1;
  return ToJson(CertifyCheckpoint(r).certificate);
}

std::string ErrorOf(const std::vector<std::string>& paths) {
  try {
    ReadReportInputs(paths);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(Report, BadInputsNameTheFileAndTheField) {
  const std::string dir = TempDir("bad");
  const nlohmann::json cert = RealCertificate();
  const std::string good = dir + "/good.json";
  Write(good, cert.dump());
  EXPECT_EQ(ErrorOf({good}), "");
  Write(dir + "/malformed.json", "{\"schema\": ");
  EXPECT_NE(ErrorOf({good, dir + "/malformed.json"}).find("malformed.json: (json): malformed JSON"), std::string::npos);
  Write(dir + "/noschema.json", "{}");
  EXPECT_NE(ErrorOf({dir + "/noschema.json"}).find("noschema.json: schema: missing"), std::string::npos);
  Write(dir + "/unknown.json", "{\"schema\": \"lipcert.nothing/9\"}");
  EXPECT_NE(ErrorOf({dir + "/unknown.json"}).find("unknown.json: schema: unknown schema 'lipcert.nothing/9'"),
            std::string::npos);
  nlohmann::json broken = cert;
  broken["upper_bound"] = "big";
  Write(dir + "/field.json", broken.dump());
  EXPECT_NE(ErrorOf({dir + "/field.json"}).find("field.json: upper_bound: expected a number or null"), std::string::npos);
  broken = cert;
  broken["numerics"].erase("exp_backend");
  Write(dir + "/nested.json", broken.dump());
  EXPECT_NE(ErrorOf({dir + "/nested.json"}).find("nested.json: numerics.exp_backend: missing"), std::string::npos);
  EXPECT_NE(ErrorOf({dir + "/absent.json"}).find("absent.json: (file): cannot open"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Report, CertificatesRenderToSelfContainedHtmlAndMarkdown) {
  const std::string dir = TempDir("render");
  const nlohmann::json cert = RealCertificate();
  const std::vector<ReportInput> inputs = {{"a.json", cert}, {"b.json", cert}};
  ReportOptions o;
  o.command_line = "lipcert report a.json b.json --html r.html";
  const std::string html = RenderHtml(inputs, o);
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find(cert["model"]["sha256"].get<std::string>()), std::string::npos);
  EXPECT_NE(html.find("lipcert report a.json b.json"), std::string::npos);
  // Nothing external: no src= attributes, no links or imports to other documents.
  EXPECT_EQ(html.find(" src="), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  const std::string md = RenderMarkdown(inputs, o, dir, "");
  EXPECT_NE(md.find("](certificates.svg)"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir + "/certificates.svg"));
  EXPECT_NE(md.find("| certified upper |"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Report, NewSchemasRegisterInTheTable) {
  SchemaHandler h;
  h.schema = "lipcert.test/1";
  h.check = [](const nlohmann::json& d) { return d.contains("value") ? "" : "value: missing"; };
  h.render = [](const std::vector<const ReportInput*>& in) {
    Section s;
    s.title = "Test section";
    s.blocks.push_back(Paragraph{"inputs " + std::to_string(in.size())});
    return std::vector<Section>{s};
  };
  RegisterSchema(h);
  const std::string dir = TempDir("schema");
  Write(dir + "/t.json", "{\"schema\": \"lipcert.test/1\", \"value\": 1}");
  Write(dir + "/bad.json", "{\"schema\": \"lipcert.test/1\"}");
  const std::vector<ReportInput> in = ReadReportInputs({dir + "/t.json", dir + "/t.json"});
  const std::string html = RenderHtml(in, ReportOptions{});
  EXPECT_NE(html.find("Test section"), std::string::npos);
  EXPECT_NE(html.find("inputs 2"), std::string::npos);
  EXPECT_NE(ErrorOf({dir + "/bad.json"}).find("bad.json: value: missing"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lipcert::reports
