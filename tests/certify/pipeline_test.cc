// The pipeline (certify/pipeline.h) end to end in C++: PrepareJob's validation names the
// field at fault, the prepared set matches the request, and RunJob's certificate is
// sound (lower <= upper) and carries the request's provenance.
#include "certify/pipeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>
#include <thread>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "models/errors.h"

namespace lipcert {
namespace {

const std::string kZoo = std::string(LIPCERT_SOURCE_DIR) + "/models/zoo/";

CertifyRequest ZooRequest() {
  CertifyRequest r;
  r.model.path = kZoo + "dot-layer0.safetensors";
  r.set.centre = kZoo + "dot-layer0-centres.safetensors:x0";
  r.set.kind = SetKind::kBall;
  r.set.relative_radius = 0.001;
  r.options.time_limit_s = 2;
  return r;
}

// The message of the OptionError or InputError that f throws ("" when none).
template <class F>
std::string ErrorOf(F&& f) {
  try {
    f();
  } catch (const OptionError& e) {
    return e.what();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(PrepareJobTest, BuildsTheRequestedSet) {
  const PreparedJob job = PrepareJob(ZooRequest());
  EXPECT_EQ(job.set.kind, SetKind::kBall);
  ASSERT_GT(job.set.center.size(), 0);
  EXPECT_EQ(job.set.width(), job.Layer().d_model);
  EXPECT_DOUBLE_EQ(job.set.radius, 0.001 * job.set.center.norm());
  EXPECT_EQ(job.provenance.model_sha256.size(), 64u);
  EXPECT_TRUE(job.Layer().residual());
  EXPECT_TRUE(job.note.empty());
}

TEST(PrepareJobTest, AttentionOnlyDropsTheLayerNorm) {
  CertifyRequest r = ZooRequest();
  r.model.attention_only = true;
  EXPECT_FALSE(PrepareJob(r).Layer().residual());
}

TEST(PrepareJobTest, AttentionOnlyOnALayerWithoutLayerNormIsNoted) {
  CertifyRequest r = ZooRequest();
  r.model.path = std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/native-dot";
  r.model.attention_only = true;
  r.set.centre = "zero";
  r.set.relative_radius = -1;
  r.set.radius = 0.1;
  r.set.tokens = 3;
  r.options.time_limit_s = 1;  // before PrepareJob, which copies the options
  const PreparedJob job = PrepareJob(r);
  EXPECT_NE(job.note.find("no LayerNorm"), std::string::npos) << job.note;
  EXPECT_EQ(job.options.time_limit_s, 1);
  const CertifyOutcome out = RunJob(job);
  ASSERT_EQ(out.certificate.notes.size(), 1u);
  EXPECT_EQ(out.certificate.notes[0], job.note);
}

TEST(PrepareJobTest, RefusesBadRequestsNamingTheField) {
  CertifyRequest both = ZooRequest();
  both.set.radius = 1;
  EXPECT_EQ(ErrorOf([&] { PrepareJob(both); }).rfind("radius:", 0), 0u);
  CertifyRequest neither = ZooRequest();
  neither.set.relative_radius = -1;
  EXPECT_EQ(ErrorOf([&] { PrepareJob(neither); }).rfind("radius:", 0), 0u);
  CertifyRequest time = ZooRequest();
  time.options.time_limit_s = 0;
  EXPECT_EQ(ErrorOf([&] { PrepareJob(time); }).rfind("time_limit", 0), 0u);
  CertifyRequest missing = ZooRequest();
  missing.set.centre = kZoo + "dot-layer0-centres.safetensors:no_such_tensor";
  EXPECT_NE(ErrorOf([&] { PrepareJob(missing); }).find("no_such_tensor"), std::string::npos);
  CertifyRequest layer = ZooRequest();
  layer.model.path = std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/bert";
  layer.model.layer = 77;
  const std::string no_layer = ErrorOf([&] { PrepareJob(layer); });
  // The file, then the field and the layer asked for.
  EXPECT_NE(no_layer.find("bert/model.safetensors: layer: layer 77 not found"), std::string::npos) << no_layer;
  CertifyRequest budget = ZooRequest();
  budget.options.budget.steps = 4;
  budget.options.budget.rounds = 0;
  EXPECT_EQ(ErrorOf([&] { PrepareJob(budget); }).rfind("budget.rounds:", 0), 0u);
}

// A work budget: every stage bounded by work, the same certificate for any thread count
// and any clock; a stop request ends the run with the certificate so far.
TEST(RunJobTest, WorkBudgetRepeatsAcrossThreadCounts) {
  CertifyRequest r = ZooRequest();  // 4 tokens around zero: N*D = 256, where pieces split
  r.set.centre = "zero";
  r.set.tokens = 4;
  r.set.relative_radius = -1;
  r.set.radius = 0.5;
  r.options.budget = WorkBudget{3, 1};
  r.options.time_limit_s = 1e-3;  // not read under a budget
  PreparedJob job = PrepareJob(r);
  job.options.threads = 1;
  const Certificate one = RunJob(job).certificate;
  job.options.threads = 2;
  const Certificate two = RunJob(job).certificate;
  ASSERT_TRUE(std::isfinite(one.upper_bound.value()));
  EXPECT_GT(one.lower_bound.value(), 0);
  EXPECT_LE(one.lower_bound.value(), one.upper_bound.value());
  EXPECT_EQ(one.upper_bound.value(), two.upper_bound.value());
  EXPECT_EQ(one.lower_bound.value(), two.lower_bound.value());
  EXPECT_LE(one.pieces_explored, 3);
  EXPECT_NE(one.status, CertificateStatus::kTimeLimit);
}

TEST(RunJobTest, StopEndsTheRunWithTheCertificateSoFar) {
  PreparedJob job = PrepareJob(ZooRequest());
  std::atomic<bool> stop{false};
  job.options.stop = &stop;
  job.options.time_limit_s = 60;
  double first_upper = INFINITY;
  int calls = 0;
  job.options.on_improvement = [&](const Certificate& c) {
    if (calls++ == 0) first_upper = c.upper_bound.value();
    stop = true;  // as a signal handler would
  };
  const Certificate c = RunJob(job).certificate;
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(c.status, CertificateStatus::kInterrupted);
  ASSERT_TRUE(std::isfinite(first_upper));
  EXPECT_EQ(c.upper_bound.value(), first_upper);
  EXPECT_LT(c.elapsed_s, 30);
}

TEST(RunJobTest, CertificateIsSoundAndCarriesTheProvenance) {
  const CertifyOutcome out = CertifyCheckpoint(ZooRequest());
  const Certificate& c = out.certificate;
  EXPECT_GT(c.lower_bound.value(), 0);
  EXPECT_LE(c.lower_bound.value(), c.upper_bound.value());
  EXPECT_TRUE(std::isfinite(c.upper_bound.value()));
  EXPECT_NE(c.status, CertificateStatus::kInProgress);
  EXPECT_EQ(c.provenance.centre_source, ZooRequest().set.centre);
  EXPECT_EQ(c.witness.x.rows(), c.tokens);
  EXPECT_EQ(c.witness.v.cols(), c.d_model);
  EXPECT_EQ(c.witness.lower_bound.value(), c.lower_bound.value());
}

TEST(RunJobTest, IntermediateCertificatesAreInProgress) {
  PreparedJob job = PrepareJob(ZooRequest());
  int calls = 0;
  job.options.on_improvement = [&](const Certificate& c) {
    ++calls;
    EXPECT_EQ(c.status, CertificateStatus::kInProgress);
    EXPECT_EQ(ToJson(c)["status"], "in_progress");
  };
  const Certificate c = RunJob(job).certificate;
  EXPECT_GE(calls, 1);
  EXPECT_NE(ToJson(c)["status"], "in_progress");
}

}  // namespace
}  // namespace lipcert

namespace lipcert {
namespace {

#if defined(__x86_64__)
// A thread whose MXCSR has FTZ and DAZ set (as crtfastmath.o or a library would leave it)
// still certifies soundly: the pipeline restores the rounding model's environment,
// records it, and gives the same bound bits as a clean thread.
TEST(RunJobTest, FlushToZeroThreadIsRepairedAndRecorded) {
  CertifyRequest r = ZooRequest();
  // A work budget, not a time limit: on a loaded machine a 1 s limit let the block-norm
  // engine finish in one thread and not in the other.
  r.options.budget = WorkBudget{2, 1};
  r.options.search.max_rounds = 1;
  const PreparedJob job = PrepareJob(r);
  const Certificate clean = RunJob(job).certificate;
  EXPECT_FALSE(clean.fp_environment_repaired);
  Certificate spoiled;
  std::thread t([&] {
    _mm_setcsr(_mm_getcsr() | (1u << 15) | (1u << 6));  // FTZ | DAZ
    spoiled = RunJob(job).certificate;
  });
  t.join();
  EXPECT_TRUE(spoiled.fp_environment_repaired);
  EXPECT_EQ(ToJson(spoiled)["numerics"]["fp_environment_repaired"], true);
  // Under a budget the block-norm engine is deterministic: the same bits in both threads.
  auto block = [](const Certificate& c) {
    for (const EngineResult& e : c.engines)
      if (e.id == EngineId::kBlockNorm) return e.upper.value();
    return -1.0;
  };
  ASSERT_GT(block(clean), 0);
  EXPECT_EQ(block(clean), block(spoiled));
  EXPECT_LE(spoiled.lower_bound.value(), spoiled.upper_bound.value());
}
#endif

}  // namespace
}  // namespace lipcert
