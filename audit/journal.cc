#include "audit/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "models/sha256.h"

namespace lipcert::audit {

namespace {
constexpr std::string_view kHead = "{\"sha256\":\"";
constexpr std::string_view kMiddle = "\",\"payload\":";
constexpr size_t kHexLength = 64;
constexpr size_t kPayloadStart = kHead.size() + kHexLength + kMiddle.size();

}  // namespace

bool ParseJournalLine(std::string_view line, JournalEntry* e) {
  if (line.size() < kPayloadStart + 2 || line.substr(0, kHead.size()) != kHead ||
      line.substr(kHead.size() + kHexLength, kMiddle.size()) != kMiddle || line.back() != '}')
    return false;
  const std::string_view payload = line.substr(kPayloadStart, line.size() - kPayloadStart - 1);
  if (Sha256Hex(payload) != line.substr(kHead.size(), kHexLength)) return false;
  const nlohmann::json j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("key") || !j["key"].is_string() || !j.contains("certificate") || !j.contains("job"))
    return false;
  e->key = j["key"];
  e->job = j["job"];
  e->certificate = j["certificate"];
  return true;
}

std::string JournalLine(const JournalEntry& e) {
  const std::string payload =
      nlohmann::json{{"key", e.key}, {"job", e.job}, {"certificate", e.certificate}}.dump();
  return std::string(kHead) + Sha256Hex(payload) + std::string(kMiddle) + payload + "}\n";
}

JournalContents ReadJournal(const std::string& path) {
  JournalContents out;
  std::ifstream in(path, std::ios::binary);
  if (!in) return out;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::set<std::string> seen;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) {  // a torn last line: no newline yet
      ++out.dropped;
      break;
    }
    JournalEntry e;
    if (ParseJournalLine(std::string_view(text).substr(pos, nl - pos), &e)) {
      if (seen.insert(e.key).second)
        out.entries.push_back(std::move(e));
      else
        ++out.duplicates;
      out.valid_bytes = nl + 1;
    } else {
      ++out.dropped;
    }
    pos = nl + 1;
  }
  return out;
}

JournalWriter::JournalWriter(const std::string& path) : path_(path) {
  const JournalContents c = ReadJournal(path);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(path + ": cannot open the journal: " + std::strerror(errno));
  // Cut a torn tail (a line killed mid-write) so that the next line starts clean.
  if (::ftruncate(fd_, off_t(c.valid_bytes)) != 0 || ::lseek(fd_, 0, SEEK_END) < 0 || ::fsync(fd_) != 0)
    throw std::runtime_error(path + ": cannot repair the journal: " + std::strerror(errno));
}

JournalWriter::~JournalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void JournalWriter::Append(const std::string& line) {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error(path_ + ": write failed: " + std::strerror(errno));
    done += size_t(n);
  }
  if (::fsync(fd_) != 0) throw std::runtime_error(path_ + ": fsync failed: " + std::strerror(errno));
}

}  // namespace lipcert::audit
