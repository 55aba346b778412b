// The run's clock, deadlines, stop flag and work budget (certify/run_control.h).
#include "certify/run_control.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lipcert {
namespace {

TEST(RunControlTest, DeadlinesAndTheUnlimitedClock) {
  const Clock::time_point t = Clock::now();
  EXPECT_EQ(After(t, INFINITY), kNoDeadline);
  EXPECT_EQ(After(t, 1e12), kNoDeadline);
  EXPECT_EQ(After(t, 0.5) - t, std::chrono::milliseconds(500));
  EXPECT_EQ(After(t, -3), t);  // a spent limit is now, never before the start
  EXPECT_TRUE(std::isinf(SecondsUntil(kNoDeadline)));
  EXPECT_LT(SecondsUntil(t), 0.0 + 1e-9);
  const RunClock unlimited(INFINITY);
  EXPECT_TRUE(std::isinf(unlimited.Left()));
  EXPECT_EQ(unlimited.At(0.5), kNoDeadline);
  const RunClock limited(10);
  EXPECT_GT(limited.Left(), 9.0);
  EXPECT_LE(limited.Left(), 10.0);
  EXPECT_EQ(limited.At(0.25) - limited.start(), std::chrono::milliseconds(2500));
}

TEST(RunControlTest, StopFlag) {
  std::atomic<bool> stop{false};
  EXPECT_FALSE(StopRequested(nullptr));
  EXPECT_FALSE(StopRequested(&stop));
  stop = true;
  EXPECT_TRUE(StopRequested(&stop));
}

TEST(RunControlTest, ParsesBudgetsAndNamesBadOnes) {
  WorkBudget b;
  EXPECT_FALSE(b.enabled());
  EXPECT_EQ(b.IsValid(), "");
  EXPECT_EQ(ParseWorkBudget("60", &b), "");
  EXPECT_EQ(b.steps, 60);
  EXPECT_EQ(b.rounds, 2);
  EXPECT_TRUE(b.enabled());
  EXPECT_EQ(ParseWorkBudget("60,1", &b), "");
  EXPECT_EQ(b.steps, 60);
  EXPECT_EQ(b.rounds, 1);
  EXPECT_EQ(WorkBudgetToString(b), "60,1");
  int refused = 0;
  for (const char* bad : {"", "0", "-1", "4,0", "4,", ",2", "4,2,1", "x", "1e3", "9999999999"}) {
    WorkBudget kept = b;
    const std::string e = ParseWorkBudget(bad, &kept);
    EXPECT_EQ(e.rfind("budget:", 0), 0u) << bad << ": " << e;
    EXPECT_EQ(kept.steps, 60) << bad;  // untouched on error
    ++refused;
  }
  EXPECT_EQ(refused, 10);
  WorkBudget no_rounds{4, 0};
  EXPECT_EQ(no_rounds.IsValid().rfind("budget.rounds:", 0), 0u);
  WorkBudget negative{-1, 2};
  EXPECT_EQ(negative.IsValid().rfind("budget.steps:", 0), 0u);
}

}  // namespace
}  // namespace lipcert
