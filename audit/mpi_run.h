// Audits under MPI: `mpirun -np K lipcert audit AUDIT.toml`. Rank 0 reads the journal,
// hands the jobs left out one at a time to ranks 1..K-1 as they ask (dynamic scheduling),
// appends each finished job's line to the one journal and summarises; the other ranks
// certify. Built only with MPI (CMake finds it: LIPCERT_HAVE_MPI); without it, a launch
// under mpirun is refused instead of running the whole audit K times.
#pragma once

#include "audit/audit_file.h"
#include "audit/run.h"

namespace lipcert::audit {

struct MpiContext {
  bool active = false;  // MPI initialised (launched by mpirun with more than one rank)
  int rank = 0, size = 1;
};

// True when this binary was built with MPI.
bool MpiBuilt();
// The number of ranks an MPI launcher started (from its environment), 1 when none did.
int LaunchedRanks();
// Initialises MPI when launched with more than one rank (else an inactive context).
MpiContext StartMpi();
void StopMpi(const MpiContext& mpi);

// Runs the plan on every rank of `mpi`; returns the exit status on rank 0 (0 elsewhere).
int RunAuditMpi(const AuditPlan& plan, const RunOptions& o, const MpiContext& mpi);

}  // namespace lipcert::audit
