// The time model (certify/time_model.h): the calibration is measured once per process,
// quickly, and the models scale with it and with the sizes as documented.
#include "certify/time_model.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lipcert {
namespace {

TEST(TimeModelTest, CalibrationIsMeasuredOnceAndQuickly) {
  const MachineCalibration& c = Calibration();
  EXPECT_TRUE(c.measured);
  EXPECT_EQ(&Calibration(), &c);  // cached for the process
  EXPECT_GT(c.interval_probe_s, 0);
  EXPECT_GT(c.gemm_probe_s, 0);
  EXPECT_LT(c.probe_seconds, 1.0);
  EXPECT_DOUBLE_EQ(c.interval_slowdown, c.interval_probe_s / time_model::kReferenceIntervalProbeSeconds);
  EXPECT_DOUBLE_EQ(c.gemm_slowdown, c.gemm_probe_s / time_model::kReferenceGemmProbeSeconds);
  EXPECT_NE(CalibrationSummary(c).find("slowdown"), std::string::npos);
}

TEST(TimeModelTest, ModelsScaleWithTheCalibrationAndTheSizes) {
  AttentionLayer L;
  L.d_model = 16;
  L.heads = 2;
  L.head_dim_qk = L.head_dim_v = 8;
  const double ops = CentredEngineOperations(L, 32);
  EXPECT_DOUBLE_EQ(CentredEngineSeconds(L, 32),
                   ops / time_model::kCentredOperationsPerSecond * Calibration().interval_slowdown);
  // About (N D)^2 at these sizes (as measured).
  const double big = CentredEngineOperations(L, 64);
  EXPECT_GT(big, 3.9 * ops);
  EXPECT_LT(big, 9 * ops);
  // The post-LN composition: 6 D (N D)^2.
  EXPECT_DOUBLE_EQ(PostLnComposeSeconds(8, 16) * 4, PostLnComposeSeconds(16, 16));
  EXPECT_DOUBLE_EQ(PostLnComposeSeconds(8, 16),
                   6.0 * 16 * 128.0 * 128.0 / time_model::kPostLnComposeOperationsPerSecond *
                       Calibration().interval_slowdown);
}

}  // namespace
}  // namespace lipcert
