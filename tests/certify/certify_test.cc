// Certify's run control (certify/certify.h): a work budget gives the same certificate
// whatever the thread count and the clock; a stop request ends the run at the next check
// with the certificate so far (status interrupted, every bound in it sound), for the
// pre-LN pipeline and the post-LN composition alike.
#include "certify/certify.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <string>

#include "certify/pipeline.h"

namespace lipcert {
namespace {

const std::string kZoo = std::string(LIPCERT_SOURCE_DIR) + "/models/zoo/";

PreparedJob ZooJob(double relative_radius) {
  CertifyRequest r;
  r.model.path = kZoo + "dot-layer0.safetensors";
  r.set.centre = kZoo + "dot-layer0-centres.safetensors:x0";
  r.set.relative_radius = relative_radius;
  r.options.time_limit_s = 5;
  return PrepareJob(r);
}

// The bert test checkpoint's post-LN sublayer LN(X + MHA(X)) on 4 tokens around zero.
PreparedJob PostLnJob() {
  CertifyRequest r;
  r.model.path = std::string(LIPCERT_SOURCE_DIR) + "/tests/data/checkpoints/bert";
  r.model.layer = 0;
  r.set.centre = "zero";
  r.set.tokens = 4;
  r.set.radius = 0.05;
  r.options.time_limit_s = 5;
  return PrepareJob(r);
}

TEST(CertifyTest, StopBeforeTheStartStillGivesASoundCertificate) {
  PreparedJob job = ZooJob(0.01);
  std::atomic<bool> stop{true};
  job.options.stop = &stop;
  const Certificate c = RunJob(job).certificate;
  EXPECT_EQ(c.status, CertificateStatus::kInterrupted);
  EXPECT_LE(c.lower_bound.value(), c.upper_bound.value());
  EXPECT_LT(c.elapsed_s, 5);
}

// Every certificate's engines are named by their ids; none carries a refused row for an
// engine the pipeline never runs (the dense `centred` engine runs on branch-and-bound
// pieces only).
TEST(CertifyTest, EnginesAreTheOnesThatRan) {
  PreparedJob job = ZooJob(0.001);
  job.options.budget = WorkBudget{1, 1};
  const Certificate c = RunJob(job).certificate;
  int checked = 0;
  for (const EngineResult& e : c.engines) {
    EXPECT_NE(e.id, EngineId::kCentred) << e.note;
    EngineId back;
    ASSERT_TRUE(StringToEngineId(e.name(), &back));
    EXPECT_EQ(back, e.id);
    ++checked;
  }
  EXPECT_GE(checked, 3);  // block_norm, centre_norm, branch_and_bound at least
  EXPECT_EQ(ToJson(c)["run"]["budget"]["steps"], 1);
  EXPECT_TRUE(ToJson(c)["run"]["time_limit_s"].is_null());
  EXPECT_FALSE(ToJson(c)["run"].contains("time_model"));  // no clock under a budget
}

TEST(CertifyTest, PostLayerNormRunIsAnytimeAndStoppable) {
  PreparedJob job = PostLnJob();
  ASSERT_TRUE(job.Layer().post_ln());
  std::atomic<bool> stop{false};
  job.options.stop = &stop;
  job.options.time_limit_s = 60;
  int calls = 0;
  Certificate in_progress;
  job.options.on_improvement = [&](const Certificate& c) {
    if (calls++ == 0) in_progress = c;
    stop = true;
  };
  const Certificate c = RunJob(job).certificate;
  ASSERT_GE(calls, 1);
  // The intermediate certificate is the sublayer's, not its inner MHA run's.
  EXPECT_TRUE(in_progress.post_layer_norm);
  EXPECT_EQ(in_progress.status, CertificateStatus::kInProgress);
  EXPECT_TRUE(std::isfinite(in_progress.upper_bound.value()));
  EXPECT_EQ(c.status, CertificateStatus::kInterrupted);
  EXPECT_TRUE(c.post_layer_norm);
  EXPECT_LE(c.upper_bound.value(), in_progress.upper_bound.value());
  EXPECT_LE(c.lower_bound.value(), c.upper_bound.value());
  EXPECT_LT(c.elapsed_s, 30);
}

TEST(CertifyTest, PostLayerNormStatusIsTheSublayersOwn) {
  // A short run whose bound and witness are far apart cannot report tolerance_reached:
  // the status comes from the sublayer's bounds, not from the inner MHA run's.
  PreparedJob job = PostLnJob();
  job.options.time_limit_s = 2;
  job.options.tolerance = 0.01;
  const Certificate c = RunJob(job).certificate;
  ASSERT_TRUE(std::isfinite(c.upper_bound.value()));
  const bool met = c.upper_bound.value() <= c.lower_bound.value() * (1 + 0.01) * (1 + 1e-12);
  EXPECT_EQ(c.status == CertificateStatus::kTolerance, met)
      << CertificateStatusToString(c.status) << " upper " << c.upper_bound.value() << " lower " << c.lower_bound.value();
}

TEST(CertifyTest, PostLayerNormUnderABudgetRepeats) {
  PreparedJob job = PostLnJob();
  job.options.budget = WorkBudget{2, 1};
  job.options.threads = 1;
  const Certificate one = RunJob(job).certificate;
  job.options.threads = 2;
  const Certificate two = RunJob(job).certificate;
  ASSERT_TRUE(std::isfinite(one.upper_bound.value()));
  EXPECT_EQ(one.upper_bound.value(), two.upper_bound.value());
  EXPECT_EQ(one.lower_bound.value(), two.lower_bound.value());
  EXPECT_LE(one.lower_bound.value(), one.upper_bound.value());
}

}  // namespace
}  // namespace lipcert
