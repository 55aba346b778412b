// The project's one parallel-for over independent items (points, heads, rows).
// Every item, in a worker thread or in the calling thread, runs under
// ScopedSoundFpEnvironment (interval/fp_environment.h): certified arithmetic never runs
// in a thread whose FTZ/DAZ or rounding mode some other code changed (a repair is
// counted in FpEnvironmentRepairs(), and the calling thread's state is put back after).
#pragma once

#include <atomic>
#include <thread>
#include <vector>

#include "interval/fp_environment.h"

namespace lipcert {

// Worker count for `requested` threads (0 = hardware concurrency), never above `items`.
inline int WorkerCount(int requested, int items) {
  int t = requested > 0 ? requested : int(std::thread::hardware_concurrency());
  if (t < 1) t = 1;
  if (items < t) t = items < 1 ? 1 : items;
  return t;
}

// Calls fn(item, worker) for item in [0, items), with `workers` threads pulling items in
// order from a shared counter. fn must not throw. Each call of fn has its own guard (a
// few dozen cycles), so an item that changes the environment cannot affect the next.
template <class Fn>
void ParallelFor(int items, int workers, Fn&& fn) {
  auto run = [&](int i, int worker) {
    const ScopedSoundFpEnvironment fp_guard;
    fn(i, worker);
  };
  if (workers <= 1 || items <= 1) {
    for (int i = 0; i < items; ++i) run(i, 0);
    return;
  }
  std::atomic<int> next{0};
  auto body = [&](int worker) {
    for (int i = next++; i < items; i = next++) run(i, worker);
  };
  std::vector<std::thread> pool;
  pool.reserve(workers - 1);
  for (int t = 1; t < workers; ++t) pool.emplace_back(body, t);
  body(0);
  for (auto& th : pool) th.join();
}

}  // namespace lipcert
