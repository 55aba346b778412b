// Helpers shared by the models tests: a temporary folder per test and checks on InputError.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include "models/errors.h"

namespace lipcert::testing {

// A fresh folder under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = "lipcert-models-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    if (info) name += std::string("-") + info->name();
    for (char& c : name)
      if (c == '/') c = '_';
    path_ = std::filesystem::temp_directory_path() / name;
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

// Runs f, which must throw InputError naming `file` and `field`, with a one-line message that
// contains `fragment`.
inline void ExpectInputError(const std::function<void()>& f, const std::string& file, const std::string& field,
                             const std::string& fragment = "") {
  try {
    f();
    ADD_FAILURE() << "expected InputError(" << file << ", " << field << ") but nothing was thrown";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.file, file) << what;
    EXPECT_EQ(e.field, field) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << "not one line: " << what;
    EXPECT_EQ(what.rfind(file + ": " + field + ": ", 0), 0u) << what;
    if (!fragment.empty()) {
      EXPECT_NE(what.find(fragment), std::string::npos) << "'" << fragment << "' not in: " << what;
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
  }
}

}  // namespace lipcert::testing
