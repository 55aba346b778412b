#include "models/npy.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace lipcert {

namespace {

constexpr std::string_view kMagic("\x93NUMPY", 6);

// The header is a Python dict literal such as
//   {'descr': '<f8', 'fortran_order': False, 'shape': (3, 4), }
// This parser accepts exactly the subset NumPy writes: string keys; values that are strings,
// True / False, or tuples of non-negative integers.
class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& file) : s_(s), file_(file) {}

  void Parse(std::string* descr, bool* fortran, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    Expect('{');
    while (true) {
      SkipSpace();
      if (Peek() == '}') break;
      const std::string key = String();
      Expect(':');
      SkipSpace();
      if (key == "descr") {
        *descr = String();
        have_descr = true;
      } else if (key == "fortran_order") {
        *fortran = Bool();
        have_fortran = true;
      } else if (key == "shape") {
        *shape = Tuple();
        have_shape = true;
      } else {
        Fail("unexpected key '" + key + "' in the header");
      }
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') break;
      Fail("expected ',' or '}' in the header");
    }
    ++pos_;
    SkipSpace();
    if (pos_ != s_.size()) Fail("unexpected text after the header dict");
    if (!have_descr || !have_fortran || !have_shape)
      Fail("the header must have 'descr', 'fortran_order' and 'shape'");
  }

 private:
  [[noreturn]] void Fail(const std::string& msg) { throw InputError(file_, "header", msg); }
  char Peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void SkipSpace() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t')) ++pos_;
  }
  void Expect(char c) {
    SkipSpace();
    if (Peek() != c) Fail(std::string("expected '") + c + "' in the header");
    ++pos_;
  }
  std::string String() {
    SkipSpace();
    const char quote = Peek();
    if (quote != '\'' && quote != '"') Fail("expected a quoted string in the header");
    const size_t end = s_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) Fail("unterminated string in the header");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool Bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    Fail("expected True or False in the header");
  }
  std::vector<int64_t> Tuple() {
    std::vector<int64_t> out;
    Expect('(');
    while (true) {
      SkipSpace();
      if (Peek() == ')') break;
      if (Peek() < '0' || Peek() > '9') Fail("expected a non-negative integer in 'shape'");
      int64_t v = 0;
      while (Peek() >= '0' && Peek() <= '9') {
        const int digit = Peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) Fail("'shape' entry too large");
        v = v * 10 + digit;
        ++pos_;
      }
      if (Peek() == 'L') ++pos_;  // Python 2 long suffix
      out.push_back(v);
      SkipSpace();
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() != ')') Fail("expected ',' or ')' in 'shape'");
    }
    ++pos_;
    return out;
  }

  std::string_view s_;
  const std::string& file_;
  size_t pos_ = 0;
};

}  // namespace

Tensor ParseNpy(std::string_view bytes, const std::string& file) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) throw InputError(file, "magic", "not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const auto* u = reinterpret_cast<const unsigned char*>(bytes.data());
  uint64_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = uint64_t(u[8]) | uint64_t(u[9]) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw InputError(file, "header", "truncated header length");
    header_len = uint64_t(u[8]) | uint64_t(u[9]) << 8 | uint64_t(u[10]) << 16 | uint64_t(u[11]) << 24;
    header_start = 12;
  } else {
    throw InputError(file, "version", "unsupported .npy format version " + std::to_string(major));
  }
  if (header_len > bytes.size() - header_start)
    throw InputError(file, "header", "header length " + std::to_string(header_len) + " is past the end of the file");
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  HeaderParser(bytes.substr(header_start, header_len), file).Parse(&descr, &fortran, &shape);
  int size = 0;
  Tensor t;
  if (descr == "<f8") {
    size = 8;
    t.dtype = "F64";
  } else if (descr == "<f4") {
    size = 4;
    t.dtype = "F32";
  } else {
    throw InputError(file, "descr", "unsupported dtype '" + descr + "' (expected '<f8' or '<f4')");
  }
  if (fortran) throw InputError(file, "fortran_order", "Fortran-order arrays are not supported; save in C order");
  const std::string_view data = bytes.substr(header_start + header_len);
  uint64_t count = 1;
  bool zero = false;
  for (int64_t d : shape) zero = zero || d == 0;
  if (zero) count = 0;
  else
    for (int64_t d : shape) {
      if (count > data.size() / uint64_t(d)) throw InputError(file, "shape", "shape does not match the data size");
      count *= uint64_t(d);
    }
  if (count > data.size() / size || count * size != data.size())
    throw InputError(file, "shape", "shape needs " + std::to_string(count) + " values of " + std::to_string(size) +
                                        " bytes, the file holds " + std::to_string(data.size()) + " data bytes");
  t.shape = shape;
  t.values.resize(count);
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t bits = 0;
    for (int b = size - 1; b >= 0; --b) bits = (bits << 8) | p[i * size + b];
    if (size == 8) {
      std::memcpy(&t.values[i], &bits, 8);
    } else {
      const uint32_t b32 = uint32_t(bits);
      float f;
      std::memcpy(&f, &b32, 4);
      t.values[i] = f;
    }
  }
  return t;
}

Tensor ReadNpy(const std::string& path) { return ParseNpy(ReadWholeFile(path), path); }

std::string EncodeNpy(const Tensor& t, const std::string& file) {
  const int size = t.dtype == "F64" ? 8 : t.dtype == "F32" ? 4 : 0;
  if (size == 0) throw InputError(file, "descr", "cannot write dtype '" + t.dtype + "' to .npy");
  uint64_t count = 1;
  for (int64_t d : t.shape) count *= uint64_t(d);
  if (count != t.values.size()) throw InputError(file, "shape", "shape does not match the values");
  std::string dict = std::string("{'descr': '") + (size == 8 ? "<f8" : "<f4") + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(t.shape[i]);
  if (t.shape.size() == 1) dict += ",";  // a Python 1-tuple
  dict += "), }";
  while ((10 + dict.size() + 1) % 64) dict.push_back(' ');
  dict.push_back('\n');
  std::string out(kMagic);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(char(dict.size() & 0xff));
  out.push_back(char(dict.size() >> 8));
  out += dict;
  for (double v : t.values) {
    uint64_t bits;
    if (size == 8) {
      std::memcpy(&bits, &v, 8);
    } else {
      const float f = static_cast<float>(v);
      uint32_t b32;
      std::memcpy(&b32, &f, 4);
      bits = b32;
    }
    for (int b = 0; b < size; ++b) out.push_back(char((bits >> (8 * b)) & 0xff));
  }
  return out;
}

void WriteNpy(const std::string& path, const Tensor& t) { WriteFileAtomically(path, EncodeNpy(t, path)); }

}  // namespace lipcert
