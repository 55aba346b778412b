// Errors caused by user input (a malformed checkpoint, centre file or option value).
// Every one names the file and the field at fault in a single line, so that the CLI
// can print what() as is.
#pragma once

#include <stdexcept>
#include <string>

namespace lipcert {

// Makes text from an untrusted file safe to print on one line: control characters
// become '?', and anything past max_chars is cut and marked with "...".
inline std::string OneLine(const std::string& s, size_t max_chars = 300) {
  std::string out;
  out.reserve(s.size() < max_chars ? s.size() : max_chars + 3);
  for (size_t i = 0; i < s.size(); ++i) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    const unsigned char c = static_cast<unsigned char>(s[i]);
    out += (c < 0x20 || c == 0x7f) ? '?' : s[i];
  }
  return out;
}

// A user-input problem: what() == "<file>: <field>: <message>", one line.
struct InputError : std::runtime_error {
  InputError(const std::string& file, const std::string& field, const std::string& message)
      : std::runtime_error(OneLine(file, 4096) + ": " + OneLine(field) + ": " + OneLine(message, 2000)),
        file(file),
        field(field) {}
  std::string file;   // the file (or option) the problem is in
  std::string field;  // the tensor, header entry or key at fault
};

// A user error in an option or request field (not in a file): what() names the field,
// e.g. "radius: must be finite". Reported like InputError (exit 2 at the CLI).
struct OptionError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace lipcert
