// What bounds a run and what ends it early, for every stage of certify/certify.h:
//   - the wall clock: a time limit, read through RunClock and the deadline helpers here
//     (the one clock of certify/; the stages never read std::chrono themselves);
//   - a work budget (WorkBudget): every stage bounded by work instead, so that a run
//     repeats bit for bit on any machine;
//   - a stop flag (std::atomic<bool>, owned by the caller): when it turns true, every stage
//     ends at its next check as at the time limit.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <string>

namespace lipcert {

using Clock = std::chrono::steady_clock;
// No deadline.
inline constexpr Clock::time_point kNoDeadline = Clock::time_point::max();

// Seconds from t to now.
inline double ElapsedSeconds(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// Seconds from now to `deadline` (negative once it has passed; +inf for kNoDeadline).
double SecondsUntil(Clock::time_point deadline);
// The time point `seconds` after `from` (kNoDeadline when seconds is +inf or too large).
Clock::time_point After(Clock::time_point from, double seconds);

// fn() and the seconds it took. The result is computed before the clock is read again
// (in `record(name, Engine(...), Since(t))` C++ leaves the order unspecified).
template <class F>
auto Timed(F&& fn) {
  const auto t = Clock::now();
  auto result = fn();
  return std::make_pair(std::move(result), ElapsedSeconds(t));
}

// True when `stop` points to true.
inline bool StopRequested(const std::atomic<bool>* stop) {
  return stop != nullptr && stop->load(std::memory_order_relaxed);
}

// A run's one clock: every stage asks it how much of the time limit is left. Without a
// limit (+inf: a work budget) Left() is +inf and every At() is kNoDeadline.
class RunClock {
 public:
  explicit RunClock(double limit_s) : start_(Clock::now()), limit_s_(limit_s) {}
  Clock::time_point start() const { return start_; }
  double limit_s() const { return limit_s_; }
  double Elapsed() const { return ElapsedSeconds(start_); }
  double Left() const { return std::max(0.0, limit_s_ - Elapsed()); }
  // The time point `fraction` of the limit after the start.
  Clock::time_point At(double fraction) const { return After(start_, fraction * limit_s_); }

 private:
  Clock::time_point start_;
  double limit_s_;
};

// A work budget instead of the wall clock: with one, no stage reads the clock to decide
// anything (no deadline, no time model), so the certificate is the same on every machine,
// schedule and thread count (apart from the timing fields it records).
//   steps:  branch-and-bound pieces at most (> 0 turns the budget on)
//   rounds: rounds of the lower-bound search (candidates -> ascent)
// The structured engines then make their choices by size alone (certify/certify.h,
// EngineStageOptions says which).
struct WorkBudget {
  int steps = 0;
  int rounds = 2;
  bool enabled() const { return steps > 0; }
  std::string IsValid() const;  // "" or a message naming the field ("budget.rounds: ...")
};

// Reads "STEPS" or "STEPS,ROUNDS" (the CLI's --budget); "" when it parsed, else a message.
std::string ParseWorkBudget(const std::string& text, WorkBudget* budget);
// "STEPS,ROUNDS".
std::string WorkBudgetToString(const WorkBudget& budget);

}  // namespace lipcert
