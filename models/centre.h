// The centre X0 of the input set (a ball or box around one input sequence).
#pragma once

#include <Eigen/Dense>
#include <string>

#include "models/errors.h"

namespace lipcert {

// spec is one of
//   "zero"                     the (tokens, d_model) zero matrix; needs tokens > 0
//   "file.npy"                 a 2-D (N, D) or 3-D (1, N, D) '<f8' / '<f4' C-order array
//   "file.safetensors:name"    the tensor `name` of that file, same shapes ("file.safetensors"
//                              alone when the file holds exactly one tensor)
// The result is (N, D), checked finite and D == d_model; when tokens > 0, N must equal tokens
// (tokens <= 0 takes N from the file). Throws InputError naming the file and field.
Eigen::MatrixXd LoadCentre(const std::string& spec, int tokens, int d_model);

}  // namespace lipcert
