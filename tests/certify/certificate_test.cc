// The certificate JSON (certify/certificate.h ToJson) against docs/certificate.md, and the
// atomic writer WriteFileAtomic: whole files, replacement, no temporary left behind, a
// clear error on an unwritable folder, and no partial file seen by a concurrent reader.
#include "certify/certificate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace lipcert {
namespace {

namespace fs = std::filesystem;

// A certificate with every field set to a distinct value, including the optional one.
Certificate FullCertificate() {
  Certificate c;
  c.provenance = {"model.safetensors", "ab12", "hf-bert", 3, "zero"};
  c.kind = AttentionKind::kDot;
  c.d_model = 8;
  c.heads = 2;
  c.head_dim_qk = 4;
  c.head_dim_v = 3;
  c.tokens = 5;
  c.causal = true;
  c.layer_norm = true;
  c.biases = false;
  c.set = SetKind::kTokens;
  c.radius = 0.25;
  c.centre_frobenius_norm = 1.5;
  c.norm = NormKind::kLinf;
  c.upper_bound = UpperBound(12.5);
  c.lower_bound = LowerBound(10.0);
  c.engines = {{EngineId::kBlockNorm, UpperBound(12.5), 0.5, "", true, {{"attention Jacobian", UpperBound(11.5)}}, {}},
               {EngineId::kClosedFormKim, UpperBound(kInf), 0.0, "l2 attention only", false, {}, {}}};
  c.witness.origin = "multistart";
  c.witness.value = 10.25;
  c.witness.lower_bound = LowerBound(10.0);
  c.notes = {"a note"};
  c.fp_environment_repaired = true;
  c.invertibility = Invertibility{UpperBound(0.5), true, LowerBound(0.5), UpperBound(1.5)};
  c.rounding_model = "directed";
  c.exp_backend = "mpfr";
  c.status = CertificateStatus::kTolerance;
  c.elapsed_s = 2.5;
  c.pieces_explored = 7;
  c.open_pieces = 1;
  ProbabilisticBound p;
  p.value = 11.0;
  p.failure_probability = 1e-6;
  p.route = "the centre: randomized Lanczos";
  p.centre.value = 11.0;
  c.probabilistic = p;
  return c;
}

// The field names of the table in docs/certificate.md: the backticked names of the first
// column; a name starting with '.' continues the previous one's parent
// (`branch_and_bound.pieces_explored`, `.open_pieces`).
std::vector<std::string> DocumentedFields() {
  std::ifstream f(std::string(LIPCERT_SOURCE_DIR) + "/docs/certificate.md");
  EXPECT_TRUE(f) << "docs/certificate.md not found";
  std::vector<std::string> out;
  std::string line;
  const std::regex name("`([A-Za-z_.]+)`");
  while (std::getline(f, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::string first = line.substr(1, line.find('|', 1) - 1);
    std::string parent;
    for (std::sregex_iterator it(first.begin(), first.end(), name), end; it != end; ++it) {
      std::string n = (*it)[1];
      if (n[0] == '.') n = parent + n;
      const size_t dot = n.rfind('.');
      parent = dot == std::string::npos ? "" : n.substr(0, dot);
      out.push_back(n);
    }
  }
  return out;
}

const nlohmann::json* Find(const nlohmann::json& j, const std::string& dotted) {
  const nlohmann::json* p = &j;
  std::stringstream ss(dotted);
  std::string part;
  while (std::getline(ss, part, '.')) {
    if (!p->is_object() || !p->contains(part)) return nullptr;
    p = &(*p)[part];
  }
  return p;
}

TEST(CertificateJsonTest, EveryDocumentedFieldIsPresentAndEveryKeyDocumented) {
  const nlohmann::json j = ToJson(FullCertificate());
  const std::vector<std::string> fields = DocumentedFields();
  ASSERT_GE(fields.size(), 30u) << "the table in docs/certificate.md was not parsed";
  std::set<std::string> top;
  for (const std::string& f : fields) {
    EXPECT_NE(Find(j, f), nullptr) << "documented field missing from ToJson: " << f;
    top.insert(f.substr(0, f.find('.')));
  }
  int keys = 0;
  for (const auto& [k, v] : j.items()) {
    EXPECT_TRUE(top.count(k)) << "ToJson key not documented in docs/certificate.md: " << k;
    ++keys;
  }
  EXPECT_EQ(keys, int(top.size()));
}

TEST(CertificateJsonTest, ValuesAreTheCertificateFields) {
  const Certificate c = FullCertificate();
  // Through text and back, as a reader sees it: numbers round-trip exactly.
  const nlohmann::json j = nlohmann::json::parse(ToJson(c).dump());
  EXPECT_EQ(j["schema"], "lipcert.certificate/1");
  EXPECT_EQ(j["model"]["path"], "model.safetensors");
  EXPECT_EQ(j["model"]["sha256"], "ab12");
  EXPECT_EQ(j["model"]["preset"], "hf-bert");
  EXPECT_EQ(j["model"]["layer"], 3);
  EXPECT_EQ(j["layer"]["kind"], "dot");
  EXPECT_EQ(j["layer"]["d_model"], 8);
  EXPECT_EQ(j["layer"]["heads"], 2);
  EXPECT_EQ(j["layer"]["head_dim_qk"], 4);
  EXPECT_EQ(j["layer"]["head_dim_v"], 3);
  EXPECT_EQ(j["layer"]["causal"], true);
  EXPECT_EQ(j["layer"]["layer_norm"], true);
  EXPECT_EQ(j["layer"]["biases"], false);
  EXPECT_EQ(j["set"]["kind"], "tokens");
  EXPECT_EQ(j["set"]["radius"], 0.25);
  EXPECT_EQ(j["set"]["tokens"], 5);
  EXPECT_EQ(j["set"]["centre"], "zero");
  EXPECT_EQ(j["set"]["centre_frobenius_norm"], 1.5);
  EXPECT_EQ(j["norm"], "inf");
  EXPECT_EQ(j["upper_bound"], 12.5);
  EXPECT_EQ(j["lower_bound"], 10.0);
  EXPECT_EQ(j["gap"], 1.25);
  EXPECT_EQ(j["engines"]["block_norm"], 12.5);
  ASSERT_EQ(j["engine_details"].size(), 2u);
  EXPECT_EQ(j["engine_details"][0]["name"], "block_norm");
  EXPECT_EQ(j["engine_details"][0]["seconds"], 0.5);
  EXPECT_EQ(j["engine_details"][0]["applied"], true);
  EXPECT_EQ(j["engine_details"][1]["applied"], false);
  EXPECT_EQ(j["engine_details"][1]["note"], "l2 attention only");
  EXPECT_EQ(j["witness"]["origin"], "multistart");
  EXPECT_EQ(j["witness"]["value"], 10.25);
  EXPECT_EQ(j["witness"]["lower_bound"], 10.0);
  EXPECT_EQ(j["invertibility"]["residual_lipschitz_upper"], 0.5);
  EXPECT_EQ(j["invertibility"]["certified_invertible"], true);
  EXPECT_EQ(j["invertibility"]["bi_lipschitz_lower"], 0.5);
  EXPECT_EQ(j["invertibility"]["bi_lipschitz_upper"], 1.5);
  EXPECT_EQ(j["numerics"]["rounding_model"], "directed");
  EXPECT_EQ(j["numerics"]["exp_backend"], "mpfr");
  EXPECT_EQ(j["status"], "tolerance_reached");
  EXPECT_EQ(j["branch_and_bound"]["pieces_explored"], 7);
  EXPECT_EQ(j["branch_and_bound"]["open_pieces"], 1);
  EXPECT_EQ(j["elapsed_s"], 2.5);

  // A bound with all 17 significant digits survives the text form bit for bit.
  Certificate d = c;
  d.upper_bound = UpperBound(std::nextafter(12.5, 13.0));
  EXPECT_EQ(nlohmann::json::parse(ToJson(d).dump())["upper_bound"].get<double>(), d.upper_bound.value());
}

TEST(CertificateJsonTest, InfiniteAndNanNumbersAreNull) {
  // docs/certificate.md: "Numbers that are infinite (an engine that does not apply) are
  // written as null".
  Certificate c = FullCertificate();
  c.upper_bound = UpperBound(kInf);
  c.lower_bound = LowerBound(0);  // gap = +inf
  c.witness.value = std::numeric_limits<double>::quiet_NaN();
  c.invertibility->lip_g_upper = UpperBound(kInf);
  c.invertibility->bi_lipschitz_upper = UpperBound(kInf);
  const nlohmann::json j = nlohmann::json::parse(ToJson(c).dump());
  EXPECT_TRUE(j["upper_bound"].is_null());
  EXPECT_EQ(j["lower_bound"], 0.0);
  EXPECT_TRUE(j["gap"].is_null());
  EXPECT_TRUE(j["engines"]["closed_form/kim"].is_null());
  EXPECT_TRUE(j["engine_details"][1]["upper_bound"].is_null());
  EXPECT_TRUE(j["witness"]["value"].is_null());
  EXPECT_TRUE(j["invertibility"]["residual_lipschitz_upper"].is_null());
  EXPECT_TRUE(j["invertibility"]["bi_lipschitz_upper"].is_null());
  EXPECT_EQ(c.gap(), kInf);
  // Without the optional part the key is absent, not null.
  c.invertibility.reset();
  EXPECT_FALSE(ToJson(c).contains("invertibility"));
}

TEST(CertificateJsonTest, EnumStringsRoundTrip) {
  int checked = 0;
  for (SetKind k : {SetKind::kBall, SetKind::kTokens, SetKind::kBox}) {
    Certificate c = FullCertificate();
    c.set = k;
    SetKind back = SetKind::kBall;
    ASSERT_TRUE(StringToSetKind(ToJson(c)["set"]["kind"].get<std::string>(), &back));
    EXPECT_EQ(back, k);
    ++checked;
  }
  for (NormKind k : {NormKind::kL2, NormKind::kLinf}) {
    Certificate c = FullCertificate();
    c.norm = k;
    NormKind back = NormKind::kL2;
    ASSERT_TRUE(StringToNormKind(ToJson(c)["norm"].get<std::string>(), &back));
    EXPECT_EQ(back, k);
    ++checked;
  }
  // Every status's string is distinct, the documented one, and reads back.
  std::set<std::string> statuses;
  for (CertificateStatus s : {CertificateStatus::kTolerance, CertificateStatus::kTimeLimit,
                              CertificateStatus::kExhausted, CertificateStatus::kInProgress,
                              CertificateStatus::kInterrupted, CertificateStatus::kWorkBudget}) {
    Certificate c = FullCertificate();
    c.status = s;
    const std::string name = ToJson(c)["status"].get<std::string>();
    statuses.insert(name);
    CertificateStatus back = CertificateStatus::kInProgress;
    ASSERT_TRUE(StringToCertificateStatus(name, &back)) << name;
    EXPECT_EQ(back, s);
    ++checked;
  }
  EXPECT_EQ(statuses, (std::set<std::string>{"tolerance_reached", "time_limit", "engines_exhausted", "in_progress",
                                             "interrupted", "work_budget"}));
  CertificateStatus unused;
  EXPECT_FALSE(StringToCertificateStatus("budget", &unused));
  EXPECT_EQ(checked, 11);
  SetKind sk;
  NormKind nk;
  EXPECT_FALSE(StringToSetKind("sphere", &sk));
  EXPECT_FALSE(StringToNormKind("1", &nk));
}

// ---- WriteFileAtomic ----

class WriteFileAtomicTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("lipcert_certificate_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static std::string Read(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    return s.str();
  }
  // Every entry of the test folder (the target and any leftover temporary).
  std::vector<std::string> Entries() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    return out;
  }

  fs::path dir_;
};

TEST_F(WriteFileAtomicTest, WritesTheWholeFileAndLeavesNoTemporary) {
  std::string text(3 << 20, '\0');  // 3 MiB, every byte value
  for (size_t i = 0; i < text.size(); ++i) text[i] = char(i * 131 % 256);
  const fs::path p = dir_ / "cert.json";
  WriteFileAtomic(p.string(), text);
  EXPECT_EQ(fs::file_size(p), text.size());
  EXPECT_EQ(Read(p), text);
  EXPECT_EQ(Entries(), (std::vector<std::string>{"cert.json"}));
  WriteFileAtomic(p.string(), "");  // empty is a whole file too
  EXPECT_EQ(fs::file_size(p), 0u);
}

TEST_F(WriteFileAtomicTest, ReplacesAnExistingFile) {
  const fs::path p = dir_ / "cert.json";
  WriteFileAtomic(p.string(), std::string(10000, 'a'));
  WriteFileAtomic(p.string(), "short");
  EXPECT_EQ(Read(p), "short");  // not "short" followed by the rest of the old file
  EXPECT_EQ(Entries(), (std::vector<std::string>{"cert.json"}));
}

TEST_F(WriteFileAtomicTest, UnwritableFolderThrowsNamingThePath) {
  const std::string p = (dir_ / "no_such_folder" / "cert.json").string();
  try {
    WriteFileAtomic(p, "x");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "no_such_folder"));
  // A target that cannot be replaced (a folder): the error names it and the temporary is gone.
  fs::create_directories(dir_ / "is_a_folder");
  const std::string q = (dir_ / "is_a_folder").string();
  try {
    WriteFileAtomic(q, "x");
    FAIL() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(q), std::string::npos) << e.what();
  }
  EXPECT_EQ(Entries(), (std::vector<std::string>{"is_a_folder"}));
}

TEST_F(WriteFileAtomicTest, ConcurrentReaderNeverSeesAPartialFile) {
  // The writer alternates two contents of different lengths; every read must be one of
  // them in full.
  const fs::path p = dir_ / "cert.json";
  const std::string a(200000, 'a'), b(300000, 'b');
  WriteFileAtomic(p.string(), a);
  constexpr int kWrites = 300;
  std::atomic<bool> done{false};
  int reads = 0, partial = 0;
  std::thread reader([&] {
    for (int i = 0; i < 1000000 && !done.load(); ++i) {
      const std::string s = Read(p);
      ++reads;
      if (s != a && s != b) ++partial;
    }
  });
  for (int w = 0; w < kWrites; ++w) WriteFileAtomic(p.string(), w % 2 ? a : b);
  done = true;
  reader.join();
  EXPECT_GT(reads, 0);
  EXPECT_EQ(partial, 0) << "of " << reads << " reads";
  EXPECT_EQ(Read(p), a);  // the last write (w = kWrites - 1 is odd)
  EXPECT_EQ(Entries(), (std::vector<std::string>{"cert.json"}));
}

// The summary shows a refused engine and one stopped by its deadline as n/a with the
// reason, and a finite bound as its value.
TEST(CertificateSummaryTest, RefusedAndTimedOutEnginesReadNotApplicable) {
  Certificate c = FullCertificate();
  c.engines.push_back({EngineId::kCentreNorm, UpperBound(kInf), 3.0,
                       "centre_norm: deadline passed before the bound was complete", true, {}, {}});
  const std::string s = Summary(c);
  EXPECT_NE(s.find("block_norm=12.5"), std::string::npos) << s;
  EXPECT_NE(s.find("closed_form/kim=n/a (l2 attention only)"), std::string::npos) << s;
  EXPECT_NE(s.find("centre_norm=n/a (centre_norm: deadline passed"), std::string::npos) << s;
  EXPECT_EQ(s.find("=inf"), std::string::npos) << s;
}

}  // namespace
}  // namespace lipcert
