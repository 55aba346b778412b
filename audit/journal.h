// The audit journal: one finished job per line, appended atomically, self-checking.
//
//   {"sha256":"<hex of PAYLOAD's bytes>","payload":PAYLOAD}\n
//   PAYLOAD = {"certificate":{...lipcert.certificate/1...},"job":{...spec...},"key":"<job key>"}
//
// A line is appended with one write() and fsync(), so that a run killed at any moment
// (SIGKILL included) leaves at most a torn last line; ReadJournal detects a torn or
// corrupted line by its checksum and drops it, and OpenJournal cuts a torn tail off before
// appending. A key seen twice keeps its first line.
#pragma once

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace lipcert::audit {

struct JournalEntry {
  std::string key;
  nlohmann::json job;          // the job's spec (AuditJob::spec)
  nlohmann::json certificate;  // lipcert.certificate/1
};

// The line for `e`, newline included.
std::string JournalLine(const JournalEntry& e);
// The entry of one line (newline excluded), or false when it is torn or corrupted.
bool ParseJournalLine(std::string_view line, JournalEntry* e);

struct JournalContents {
  std::vector<JournalEntry> entries;  // in file order, one per key
  size_t valid_bytes = 0;             // the file up to the end of its last valid line
  int dropped = 0;                    // torn or corrupted lines skipped
  int duplicates = 0;                 // lines whose key was already seen
};

// Reads a journal; a missing file is an empty journal.
JournalContents ReadJournal(const std::string& path);

// Appends lines to a journal (thread-safe). Opening cuts a torn tail off the file.
class JournalWriter {
 public:
  explicit JournalWriter(const std::string& path);
  ~JournalWriter();
  JournalWriter(const JournalWriter&) = delete;
  JournalWriter& operator=(const JournalWriter&) = delete;
  // Writes the line and fsyncs it; throws std::runtime_error on failure.
  void Append(const std::string& line);

 private:
  std::string path_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace lipcert::audit
