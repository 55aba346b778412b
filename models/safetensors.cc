#include "models/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace lipcert {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kHeader = "header";
constexpr const char* kMetadataKey = "__metadata__";
// The header of a valid file nests three levels deep; anything much deeper is refused
// before the JSON parser sees it.
constexpr int kMaxJsonDepth = 16;

// Element sizes of every dtype the safetensors format defines (decodable or not).
int KnownDtypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E5M2" || d == "F8_E4M3") return 1;
  return 0;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t ReadU64LE(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Number of elements of a shape, or false on overflow past 2^63 - 1.
bool ElementCount(const std::vector<int64_t>& shape, uint64_t* count) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (d == 0) {
      *count = 0;
      return true;
    }
  for (int64_t d : shape) {
    const uint64_t ud = static_cast<uint64_t>(d);
    if (n > uint64_t(std::numeric_limits<int64_t>::max()) / ud) return false;
    n *= ud;
  }
  *count = n;
  return true;
}

// Refuses headers nested deeper than kMaxJsonDepth (counted outside strings).
void CheckJsonDepth(std::string_view s, const std::string& file) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxJsonDepth)
        throw InputError(file, kHeader, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

json ParseHeaderJson(std::string_view text, const std::string& file) {
  CheckJsonDepth(text, file);
  // Duplicate keys would let two readers disagree on a file; refuse them.
  std::vector<std::set<std::string>> open_objects;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == json::parse_event_t::key && !open_objects.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(key).second)
        throw InputError(file, kHeader, "duplicate key '" + key + "' in the JSON header");
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    throw InputError(file, kHeader, std::string("invalid JSON: ") + e.what());
  }
}

uint64_t UnsignedField(const json& v, const std::string& file, const std::string& field, const char* what) {
  if (!v.is_number_unsigned())
    throw InputError(file, field, std::string(what) + " must be a non-negative integer");
  return v.get<uint64_t>();
}

double DecodeOne(const std::string& dtype, const unsigned char* p) {
  if (dtype == "F64") {
    const uint64_t u = ReadU64LE(p);
    double d;
    std::memcpy(&d, &u, 8);
    return d;
  }
  if (dtype == "F32") {
    const uint32_t u = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint16_t u = uint16_t(p[0] | p[1] << 8);
  return dtype == "F16" ? HalfBitsToDouble(u) : BFloat16BitsToDouble(u);
}

// Decodes the bytes of one tensor (exactly prod(shape) * size of them).
Tensor DecodeBytes(const TensorInfo& info, std::string_view bytes, const std::string& file,
                   const std::string& name) {
  const int size = DtypeSize(info.dtype);
  if (size == 0)
    throw InputError(file, name, "unsupported dtype '" + info.dtype + "' (supported: F64, F32, F16, BF16)");
  uint64_t count = 0;
  if (!ElementCount(info.shape, &count) || count > bytes.size() / size || count * size != bytes.size())
    throw InputError(file, name, "data size does not match shape " + ShapeString(info.shape));
  Tensor t;
  t.dtype = info.dtype;
  t.shape = info.shape;
  t.values.resize(count);
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  for (uint64_t i = 0; i < count; ++i) {
    const double v = DecodeOne(info.dtype, p + i * size);
    if (!std::isfinite(v))
      throw InputError(file, name, std::string(std::isnan(v) ? "NaN" : "Inf") + " value at flat index " +
                                       std::to_string(i));
    t.values[i] = v;
  }
  return t;
}

std::string SystemError() { return std::strerror(errno); }

uint64_t RegularFileSize(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) throw InputError(path, "file", "cannot open: no such file");
  if (!fs::is_regular_file(st)) throw InputError(path, "file", "not a regular file");
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw InputError(path, "file", "cannot read its size: " + ec.message());
  return size;
}

// Reads `n` bytes at `offset`; the file must still hold them.
std::string ReadRange(std::ifstream& in, const std::string& path, uint64_t offset, uint64_t n) {
  std::string out(n, '\0');
  in.seekg(std::streamoff(offset));
  in.read(out.data(), std::streamsize(n));
  if (!in || uint64_t(in.gcount()) != n)
    throw InputError(path, "file", "truncated while reading (the file changed or cannot be read)");
  return out;
}

void AppendLE(std::string& out, uint64_t bits, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(char((bits >> (8 * i)) & 0xff));
}

// Exact binary16 encoding of v, or false when v is not representable.
bool DoubleToHalfBitsExact(double v, uint16_t* bits) {
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  if (a == 0) {
    *bits = sign;
    return true;
  }
  if (a < std::ldexp(1.0, -14)) {  // subnormal: f * 2^-24, f in 1..1023
    const double f = std::ldexp(a, 24);
    if (f != std::floor(f)) return false;
    *bits = uint16_t(sign | uint16_t(f));
    return true;
  }
  const int e = std::ilogb(a);
  if (e > 15) return false;
  const double frac = (std::ldexp(a, -e) - 1.0) * 1024.0;
  if (frac != std::floor(frac)) return false;
  *bits = uint16_t(sign | uint16_t((e + 15) << 10) | uint16_t(frac));
  return true;
}

void EncodeValues(const Tensor& t, std::string& out, const std::string& file, const std::string& name) {
  for (size_t i = 0; i < t.values.size(); ++i) {
    const double v = t.values[i];
    if (!std::isfinite(v)) throw InputError(file, name, "cannot write a NaN or Inf value");
    if (t.dtype == "F64") {
      uint64_t u;
      std::memcpy(&u, &v, 8);
      AppendLE(out, u, 8);
    } else if (t.dtype == "F32") {
      const float f = static_cast<float>(v);
      if (!std::isfinite(f)) throw InputError(file, name, "value " + std::to_string(v) + " overflows F32");
      uint32_t u;
      std::memcpy(&u, &f, 4);
      AppendLE(out, u, 4);
    } else if (t.dtype == "F16") {
      uint16_t u;
      if (!DoubleToHalfBitsExact(v, &u))
        throw InputError(file, name, "value at flat index " + std::to_string(i) + " is not exactly representable in F16");
      AppendLE(out, u, 2);
    } else {  // BF16
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      if (double(f) != v || (u & 0xffff) != 0)
        throw InputError(file, name, "value at flat index " + std::to_string(i) + " is not exactly representable in BF16");
      AppendLE(out, u >> 16, 2);
    }
  }
}

}  // namespace

int DtypeSize(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F32") return 4;
  if (dtype == "F16" || dtype == "BF16") return 2;
  return 0;
}

double HalfBitsToDouble(uint16_t bits) {
  const double sign = (bits & 0x8000) ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0x1f)
    return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(double(mantissa), -24);
  return sign * std::ldexp(double(1024 + mantissa), exponent - 25);
}

double BFloat16BitsToDouble(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

SafetensorsHeader ParseSafetensorsHeader(std::string_view header_json, uint64_t buffer_bytes,
                                         const std::string& file) {
  SafetensorsHeader h;
  h.header_bytes = header_json.size();
  h.buffer_bytes = buffer_bytes;
  const json j = ParseHeaderJson(header_json, file);
  if (!j.is_object()) throw InputError(file, kHeader, "the JSON header is not an object");

  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, entry] : j.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) throw InputError(file, kMetadataKey, "must be an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw InputError(file, std::string(kMetadataKey) + "." + k, "value must be a string");
        h.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    if (name.empty()) throw InputError(file, kHeader, "a tensor has an empty name");
    if (!entry.is_object()) throw InputError(file, name, "header entry must be an object");
    for (const auto& [k, v] : entry.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        throw InputError(file, name, "unexpected key '" + k + "' in header entry");
    if (!entry.contains("dtype") || !entry["dtype"].is_string())
      throw InputError(file, name, "missing or non-string 'dtype'");
    if (!entry.contains("shape") || !entry["shape"].is_array())
      throw InputError(file, name, "missing or non-array 'shape'");
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
      throw InputError(file, name, "'data_offsets' must be an array [begin, end]");

    TensorInfo info;
    info.dtype = entry["dtype"].get<std::string>();
    const int size = KnownDtypeSize(info.dtype);
    if (size == 0)
      throw InputError(file, name, "unknown dtype '" + info.dtype + "' (supported: F64, F32, F16, BF16)");
    for (const json& d : entry["shape"]) {
      const uint64_t u = UnsignedField(d, file, name, "every entry of 'shape'");
      if (u > uint64_t(std::numeric_limits<int64_t>::max()))
        throw InputError(file, name, "shape entry too large");
      info.shape.push_back(int64_t(u));
    }
    info.begin = UnsignedField(entry["data_offsets"][0], file, name, "data_offsets[0]");
    info.end = UnsignedField(entry["data_offsets"][1], file, name, "data_offsets[1]");
    if (info.begin > info.end)
      throw InputError(file, name, "data_offsets [" + std::to_string(info.begin) + ", " + std::to_string(info.end) +
                                       "] has begin > end");
    if (info.end > buffer_bytes)
      throw InputError(file, name, "data_offsets end " + std::to_string(info.end) + " is past the buffer's " +
                                       std::to_string(buffer_bytes) + " bytes");
    uint64_t count = 0;
    if (!ElementCount(info.shape, &count) || count > std::numeric_limits<uint64_t>::max() / uint64_t(size))
      throw InputError(file, name, "shape " + ShapeString(info.shape) + " overflows");
    if (count * uint64_t(size) != info.end - info.begin)
      throw InputError(file, name, "shape " + ShapeString(info.shape) + " of " + info.dtype + " needs " +
                                       std::to_string(count * uint64_t(size)) + " bytes, data_offsets give " +
                                       std::to_string(info.end - info.begin));
    auto it = h.tensors.emplace(name, std::move(info)).first;
    ranges.push_back({it->second.begin, it->second.end, &it->first});
  }

  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Range* prev = nullptr;
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;  // empty tensors occupy no bytes
    if (prev && r.begin < prev->end)
      throw InputError(file, *r.name, "data_offsets overlap those of tensor '" + *prev->name + "'");
    prev = &r;
  }
  return h;
}

Tensor DecodeTensor(const TensorInfo& info, std::string_view buffer, const std::string& file,
                    const std::string& name) {
  if (info.begin > info.end || info.end > buffer.size())
    throw InputError(file, name, "data_offsets outside the buffer");
  return DecodeBytes(info, buffer.substr(info.begin, info.end - info.begin), file, name);
}

SafetensorsFile ParseSafetensors(std::string_view bytes, const std::string& file) {
  if (bytes.size() < 8)
    throw InputError(file, kHeader, "file is " + std::to_string(bytes.size()) +
                                        " bytes, shorter than the 8-byte header length");
  const uint64_t n = ReadU64LE(reinterpret_cast<const unsigned char*>(bytes.data()));
  if (n > kMaxSafetensorsHeaderBytes)
    throw InputError(file, kHeader, "header length " + std::to_string(n) + " exceeds the limit of " +
                                        std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (n > bytes.size() - 8)
    throw InputError(file, kHeader, "header length " + std::to_string(n) + " is past the end of the file (" +
                                        std::to_string(bytes.size()) + " bytes)");
  const SafetensorsHeader h = ParseSafetensorsHeader(bytes.substr(8, n), bytes.size() - 8 - n, file);
  const std::string_view buffer = bytes.substr(8 + n);
  SafetensorsFile out;
  out.metadata = h.metadata;
  for (const auto& [name, info] : h.tensors) out.tensors.emplace(name, DecodeTensor(info, buffer, file, name));
  return out;
}

std::string ReadWholeFile(const std::string& path) {
  const uint64_t size = RegularFileSize(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "file", "cannot open: " + SystemError());
  return ReadRange(in, path, 0, size);
}

SafetensorsFile ReadSafetensors(const std::string& path) { return ParseSafetensors(ReadWholeFile(path), path); }

SafetensorsHeader ReadSafetensorsHeader(const std::string& path) {
  const uint64_t size = RegularFileSize(path);
  if (size < 8)
    throw InputError(path, kHeader, "file is " + std::to_string(size) + " bytes, shorter than the 8-byte header length");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "file", "cannot open: " + SystemError());
  const std::string len = ReadRange(in, path, 0, 8);
  const uint64_t n = ReadU64LE(reinterpret_cast<const unsigned char*>(len.data()));
  if (n > kMaxSafetensorsHeaderBytes)
    throw InputError(path, kHeader, "header length " + std::to_string(n) + " exceeds the limit of " +
                                        std::to_string(kMaxSafetensorsHeaderBytes) + " bytes");
  if (n > size - 8)
    throw InputError(path, kHeader, "header length " + std::to_string(n) + " is past the end of the file (" +
                                        std::to_string(size) + " bytes)");
  return ParseSafetensorsHeader(ReadRange(in, path, 8, n), size - 8 - n, path);
}

Tensor ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader& header, const std::string& name) {
  const auto it = header.tensors.find(name);
  if (it == header.tensors.end()) throw InputError(path, name, "missing tensor");
  const TensorInfo& info = it->second;
  if (DtypeSize(info.dtype) == 0)
    throw InputError(path, name, "unsupported dtype '" + info.dtype + "' (supported: F64, F32, F16, BF16)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "file", "cannot open: " + SystemError());
  const std::string bytes = ReadRange(in, path, header.buffer_offset() + info.begin, info.end - info.begin);
  return DecodeBytes(info, bytes, path, name);
}

std::string EncodeSafetensors(const std::map<std::string, Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata, const std::string& file) {
  json header = json::object();
  std::string buffer;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == kMetadataKey) throw InputError(file, name, "invalid tensor name");
    if (DtypeSize(t.dtype) == 0)
      throw InputError(file, name, "cannot write dtype '" + t.dtype + "' (supported: F64, F32, F16, BF16)");
    uint64_t count = 0;
    for (int64_t d : t.shape)
      if (d < 0) throw InputError(file, name, "negative dimension in shape " + ShapeString(t.shape));
    if (!ElementCount(t.shape, &count) || count != t.values.size())
      throw InputError(file, name, "shape " + ShapeString(t.shape) + " does not match " +
                                       std::to_string(t.values.size()) + " values");
    const uint64_t begin = buffer.size();
    EncodeValues(t, buffer, file, name);
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, uint64_t(buffer.size())}}};
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const json::exception& e) {
    throw InputError(file, kHeader, std::string("cannot encode the header: ") + e.what());
  }
  while ((8 + text.size()) % 8) text.push_back(' ');  // the buffer starts 8-byte aligned
  std::string out;
  out.reserve(8 + text.size() + buffer.size());
  AppendLE(out, text.size(), 8);
  out += text;
  out += buffer;
  return out;
}

void WriteFileAtomically(const std::string& path, std::string_view bytes) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw InputError(path, "file", "cannot create a temporary file: " + SystemError());
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      throw InputError(path, "file", "cannot write: " + SystemError());
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw InputError(path, "file", "cannot rename the temporary file into place: " + ec.message());
  }
}

void WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  WriteFileAtomically(path, EncodeSafetensors(tensors, metadata, path));
}

Eigen::MatrixXd TensorAsMatrix(const Tensor& t, const std::string& file, const std::string& name) {
  if (t.shape.size() != 2)
    throw InputError(file, name, "expected a 2-D tensor, got shape " + ShapeString(t.shape));
  uint64_t count = 0;
  if (t.shape[0] < 0 || t.shape[1] < 0 || !ElementCount(t.shape, &count) || count != t.values.size())
    throw InputError(file, name, "shape " + ShapeString(t.shape) + " does not match its values");
  using RowMajor = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  return Eigen::Map<const RowMajor>(t.values.data(), Eigen::Index(t.shape[0]), Eigen::Index(t.shape[1]));
}

Eigen::VectorXd TensorAsVector(const Tensor& t, const std::string& file, const std::string& name) {
  if (t.shape.size() != 1)
    throw InputError(file, name, "expected a 1-D tensor, got shape " + ShapeString(t.shape));
  if (t.shape[0] < 0 || uint64_t(t.shape[0]) != t.values.size())
    throw InputError(file, name, "shape " + ShapeString(t.shape) + " does not match its values");
  return Eigen::Map<const Eigen::VectorXd>(t.values.data(), Eigen::Index(t.shape[0]));
}

Tensor MatrixTensor(const Eigen::MatrixXd& m, const std::string& dtype) {
  Tensor t;
  t.dtype = dtype;
  t.shape = {int64_t(m.rows()), int64_t(m.cols())};
  t.values.resize(size_t(m.size()));
  for (Eigen::Index i = 0; i < m.rows(); ++i)
    for (Eigen::Index j = 0; j < m.cols(); ++j) t.values[size_t(i * m.cols() + j)] = m(i, j);
  return t;
}

Tensor VectorTensor(const Eigen::VectorXd& v, const std::string& dtype) {
  Tensor t;
  t.dtype = dtype;
  t.shape = {int64_t(v.size())};
  t.values.assign(v.data(), v.data() + v.size());
  return t;
}

}  // namespace lipcert
