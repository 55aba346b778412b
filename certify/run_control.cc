#include "certify/run_control.h"

#include <cmath>
#include <cstdlib>

namespace lipcert {

double SecondsUntil(Clock::time_point deadline) {
  if (deadline == kNoDeadline) return INFINITY;
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

Clock::time_point After(Clock::time_point from, double seconds) {
  // About 290 years of steady_clock nanoseconds remain from any start: past a century the
  // deadline is none.
  if (!(seconds < 3e9)) return kNoDeadline;
  return from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(std::max(0.0, seconds)));
}

std::string WorkBudget::IsValid() const {
  if (steps < 0) return "budget.steps: must be >= 0 (0: no budget)";
  if (steps > 0 && rounds < 1) return "budget.rounds: must be >= 1";
  return "";
}

namespace {
// A positive decimal integer filling `s`; -1 otherwise.
long PositiveInteger(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  const long v = std::strtol(s.c_str(), nullptr, 10);
  return v > 0 ? v : -1;
}
}  // namespace

std::string ParseWorkBudget(const std::string& text, WorkBudget* budget) {
  const size_t comma = text.find(',');
  WorkBudget b;
  const long steps = PositiveInteger(text.substr(0, comma));
  if (steps < 0) return "budget: expected STEPS[,ROUNDS] with positive integers, got '" + text + "'";
  b.steps = int(steps);
  if (comma != std::string::npos) {
    const long rounds = PositiveInteger(text.substr(comma + 1));
    if (rounds < 0) return "budget: expected STEPS[,ROUNDS] with positive integers, got '" + text + "'";
    b.rounds = int(rounds);
  }
  *budget = b;
  return "";
}

std::string WorkBudgetToString(const WorkBudget& b) { return std::to_string(b.steps) + "," + std::to_string(b.rounds); }

}  // namespace lipcert
