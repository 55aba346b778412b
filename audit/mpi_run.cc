#include "audit/mpi_run.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include "models/errors.h"

#ifdef LIPCERT_HAVE_MPI
#include <mpi.h>
#endif

namespace lipcert::audit {

int LaunchedRanks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return std::max(1, std::atoi(s));
  return 1;
}

#ifndef LIPCERT_HAVE_MPI

bool MpiBuilt() { return false; }
MpiContext StartMpi() {
  if (LaunchedRanks() > 1)
    throw OptionError("mpirun: this lipcert was built without MPI (install libopenmpi-dev and rebuild), "
                      "or use --shard I/N and lipcert audit merge");
  return {};
}
void StopMpi(const MpiContext&) {}
int RunAuditMpi(const AuditPlan& plan, const RunOptions& o, const MpiContext&) { return RunAudit(plan, o); }

#else

namespace {
constexpr int kTagResult = 1;  // worker -> 0: "READY", "OK:" + journal line, "ERR:" + message
constexpr int kTagJob = 2;     // 0 -> worker: job index, -1 to stop

void SendText(const std::string& s, int to, int tag) {
  MPI_Send(s.data(), int(s.size()), MPI_CHAR, to, tag, MPI_COMM_WORLD);
}

int Coordinate(const AuditPlan& plan, const RunOptions& o, const MpiContext& mpi) {
  const OutputFolder out{o.out_dir};
  const nlohmann::json plan_json = ShardPlan(plan, o.shard, o.shards);
  JournalContents journal = out.Prepare(plan_json);
  std::set<std::string> done;
  for (const JournalEntry& e : journal.entries) done.insert(e.key);
  std::vector<int> todo;
  for (size_t i = 0; i < plan.jobs.size(); ++i)
    if (int(i % size_t(o.shards)) == o.shard && !done.count(plan.jobs[i].key)) todo.push_back(int(i));
  if (o.progress)
    std::fprintf(stderr, "lipcert audit: %zu jobs, %zu already in %s, %zu to run on %d MPI ranks\n",
                 size_t(plan_json["jobs"].size()), size_t(plan_json["jobs"].size()) - todo.size(), out.journal().c_str(),
                 todo.size(), mpi.size - 1);
  JournalWriter writer(out.journal());
  size_t next = 0, finished = 0;
  int stopped = 0;
  std::vector<std::string> failures;
  while (stopped < mpi.size - 1) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kTagResult, MPI_COMM_WORLD, &flag, &st);
    if (!flag) {  // poll gently: rank 0 shares the machine with the workers
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    int n = 0;
    MPI_Get_count(&st, MPI_CHAR, &n);
    std::string msg(size_t(n), '\0');
    MPI_Recv(msg.data(), n, MPI_CHAR, st.MPI_SOURCE, kTagResult, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (msg.rfind("OK:", 0) == 0) {
      const std::string line = msg.substr(3);
      JournalEntry e;
      if (line.empty() || line.back() != '\n' || !ParseJournalLine(std::string_view(line).substr(0, line.size() - 1), &e)) {
        failures.push_back("rank " + std::to_string(st.MPI_SOURCE) + " sent a corrupted journal line");
      } else {
        writer.Append(line);
        ++finished;
        if (o.progress)
          std::fprintf(stderr, "[audit %zu/%zu] rank %d: %s layer %d: upper %s\n", finished, todo.size(), st.MPI_SOURCE,
                       e.job.value("checkpoint", "?").c_str(), e.job.value("layer", -1),
                       e.certificate["upper_bound"].dump().c_str());
        journal.entries.push_back(std::move(e));
      }
    } else if (msg.rfind("ERR:", 0) == 0) {
      ++finished;
      failures.push_back(msg.substr(4));
    }
    const int job = next < todo.size() ? todo[next++] : -1;
    MPI_Send(&job, 1, MPI_INT, st.MPI_SOURCE, kTagJob, MPI_COMM_WORLD);
    if (job < 0) ++stopped;
  }
  int status = Summarise(plan_json, journal.entries, o.out_dir);
  for (const std::string& f : failures) {
    std::fprintf(stderr, "lipcert audit: %s\n", f.c_str());
    status = 1;
  }
  return status;
}

void Work(const AuditPlan& plan, const RunOptions& o) {
  int local = 1;
  if (const char* s = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(s));
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : std::max(1, cores / std::max(1, local - 1));
  SendText("READY", 0, kTagResult);
  for (;;) {
    int job = -1;
    MPI_Recv(&job, 1, MPI_INT, 0, kTagJob, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (job < 0 || job >= int(plan.jobs.size())) return;
    const AuditJob& j = plan.jobs[size_t(job)];
    try {
      const OutputFolder out{o.out_dir};
      // The partial certificate goes where rank 0 writes (a shared folder) when it can.
      const std::string partial =
          std::filesystem::is_directory(o.out_dir + "/partial") ? out.partial(j.key) : std::string();
      const JournalEntry e = RunAuditJob(j, threads, partial);
      std::error_code ec;
      if (!partial.empty()) std::filesystem::remove(partial, ec);
      SendText("OK:" + JournalLine(e), 0, kTagResult);
    } catch (const std::exception& ex) {
      SendText("ERR:job " + j.key.substr(0, 12) + " failed: " + ex.what(), 0, kTagResult);
    }
  }
}
}  // namespace

bool MpiBuilt() { return true; }

MpiContext StartMpi() {
  MpiContext c;
  if (LaunchedRanks() <= 1) return c;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &c.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &c.size);
  c.active = true;
  return c;
}

void StopMpi(const MpiContext& mpi) {
  if (mpi.active) MPI_Finalize();
}

int RunAuditMpi(const AuditPlan& plan, const RunOptions& o, const MpiContext& mpi) {
  if (!mpi.active || mpi.size < 2) return RunAudit(plan, o);
  if (const std::string e = ValidateRunOptions(o); !e.empty()) throw OptionError(e);
  if (mpi.rank == 0) {
    try {
      return Coordinate(plan, o, mpi);
    } catch (const std::exception& e) {
      // The workers wait for jobs: end them all rather than leave them waiting.
      std::fprintf(stderr, "lipcert: %s\n", e.what());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  Work(plan, o);
  return 0;
}

#endif

}  // namespace lipcert::audit
