// NumPy .npy files (format versions 1.0, 2.0 and 3.0) holding little-endian float64 or
// float32 arrays in C order. Written for untrusted input: the header is parsed by a small
// bounded parser, and the data size must match the shape exactly.
#pragma once

#include <string>
#include <string_view>

#include "models/safetensors.h"

namespace lipcert {

// Parses .npy bytes into a Tensor (dtype "F64" or "F32", values converted to double; NaN and
// Inf are kept, callers decide). `file` names the file in errors. Throws InputError.
Tensor ParseNpy(std::string_view bytes, const std::string& file);
Tensor ReadNpy(const std::string& path);

// Encodes a Tensor as a version 1.0 .npy ('<f8' for F64, '<f4' for F32, rounded to nearest).
std::string EncodeNpy(const Tensor& t, const std::string& file = "<memory>");
// Writes EncodeNpy's bytes atomically.
void WriteNpy(const std::string& path, const Tensor& t);

}  // namespace lipcert
