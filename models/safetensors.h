// Reading and writing safetensors files (https://huggingface.co/docs/safetensors).
//
// Layout: an 8-byte little-endian u64 N, then N bytes of UTF-8 JSON header
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// then the byte buffer; data_offsets are relative to the buffer's start.
//
// The reader trusts no length in the file: every size and offset is checked against the
// actual number of bytes (header size bounded, offsets inside the buffer, begin <= end,
// no two tensors overlapping, end - begin == prod(shape) * dtype size computed without
// overflow). Values are converted to double exactly (F64, F32, F16, BF16); NaN or Inf is
// rejected naming the tensor. Every problem is an InputError naming the file and field.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "models/errors.h"

namespace lipcert {

struct Tensor {
  std::string dtype;           // "F64", "F32", "F16" or "BF16", as stored
  std::vector<int64_t> shape;  // dimensions, outermost first; {} is a scalar
  std::vector<double> values;  // row-major, converted to double (exactly)
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // the "__metadata__" entry
  std::map<std::string, Tensor> tensors;
};

// One header entry, before any value is decoded.
struct TensorInfo {
  std::string dtype;           // as stored; may be a dtype this reader cannot decode
  std::vector<int64_t> shape;  // dimensions, outermost first
  uint64_t begin = 0;          // byte offset of the data, relative to the buffer's start
  uint64_t end = 0;            // one past the last byte
};

// The validated header of a file: every entry's offsets are known to lie inside the
// buffer, not to overlap and to match the shape (for decodable dtypes).
struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N, the JSON header's length
  uint64_t buffer_bytes = 0;  // bytes after the header
  std::map<std::string, std::string> metadata;
  std::map<std::string, TensorInfo> tensors;
  uint64_t buffer_offset() const { return 8 + header_bytes; }  // where the buffer starts in the file
};

// Upper bound on the JSON header's length; larger headers are refused.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

// Bytes per element of a decodable dtype ("F64" -> 8, ...), 0 for anything else.
int DtypeSize(const std::string& dtype);

// Parses and validates the JSON header (the N bytes after the length) of a file whose buffer
// holds buffer_bytes bytes. A tensor with a dtype this reader cannot decode is kept (its
// byte range must still be consistent: inside the buffer, not overlapping) so that callers
// may skip it; DecodeTensor refuses it naming the tensor.
SafetensorsHeader ParseSafetensorsHeader(std::string_view header_json, uint64_t buffer_bytes,
                                         const std::string& file);

// Decodes one entry from the buffer (the bytes after the header). Throws InputError naming
// the tensor for an unsupported dtype or a NaN / Inf value.
Tensor DecodeTensor(const TensorInfo& info, std::string_view buffer, const std::string& file,
                    const std::string& name);

// Parses a whole file held in memory; `file` names it in errors. Every tensor must have a
// decodable dtype. Used by ReadSafetensors and by the fuzz target.
SafetensorsFile ParseSafetensors(std::string_view bytes, const std::string& file);

// Reads and validates a whole file. Throws InputError.
SafetensorsFile ReadSafetensors(const std::string& path);

// Reads only the header of a file (8 + N bytes), checked against the file's real size.
SafetensorsHeader ReadSafetensorsHeader(const std::string& path);

// Reads and decodes one tensor of a file whose header was read by ReadSafetensorsHeader.
// Throws InputError naming the tensor when it is absent, undecodable or not finite.
Tensor ReadSafetensorsTensor(const std::string& path, const SafetensorsHeader& header,
                             const std::string& name);

// Encodes tensors as safetensors bytes. Each Tensor is stored with its own dtype: F64 exactly,
// F32 rounded to nearest, F16 / BF16 only when every value is exactly representable. Values
// must be finite and match prod(shape). Throws InputError(file, tensor, ...) otherwise.
std::string EncodeSafetensors(const std::map<std::string, Tensor>& tensors,
                              const std::map<std::string, std::string>& metadata = {},
                              const std::string& file = "<memory>");

// Writes EncodeSafetensors' bytes atomically (a temporary file in the same folder, then rename).
void WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A 2-D tensor as a matrix (rows = shape[0]); anything else is an InputError(file, name, ...).
Eigen::MatrixXd TensorAsMatrix(const Tensor& t, const std::string& file, const std::string& name);
// A 1-D tensor as a vector; anything else is an InputError(file, name, ...).
Eigen::VectorXd TensorAsVector(const Tensor& t, const std::string& file, const std::string& name);

// Convenience for tests and writers: a tensor from a matrix / vector (dtype "F64" by default).
Tensor MatrixTensor(const Eigen::MatrixXd& m, const std::string& dtype = "F64");
Tensor VectorTensor(const Eigen::VectorXd& v, const std::string& dtype = "F64");

// IEEE 754 binary16 and bfloat16 bit patterns to double (exact; NaN and Inf come out as such).
double HalfBitsToDouble(uint16_t bits);
double BFloat16BitsToDouble(uint16_t bits);

// Writes bytes to path atomically: a temporary file beside it, then rename. Throws InputError.
void WriteFileAtomically(const std::string& path, std::string_view bytes);

// Reads a whole regular file. Throws InputError(path, "file", ...).
std::string ReadWholeFile(const std::string& path);

}  // namespace lipcert
