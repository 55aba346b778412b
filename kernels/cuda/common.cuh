// What every CUDA file of the back end shares: error checks that throw with file and line,
// the block size and grid of the simple kernels, and the device maths of both types.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#define LIPCERT_CUDA_CHECK(expr)                                                                 \
  do {                                                                                           \
    cudaError_t err_ = (expr);                                                                   \
    if (err_ != cudaSuccess)                                                                     \
      throw std::runtime_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                               #expr + ": " + cudaGetErrorString(err_));                         \
  } while (0)

#define LIPCERT_KERNEL_CHECK() LIPCERT_CUDA_CHECK(cudaGetLastError())

namespace lipcert::cuda {

constexpr int kThreads = 256;  // block size of every kernel (a power of two: reductions)

inline int Blocks(long long n) { return int((n + kThreads - 1) / kThreads); }

__device__ inline float Exp(float v) { return expf(v); }
__device__ inline double Exp(double v) { return exp(v); }
__device__ inline float Sqrt(float v) { return sqrtf(v); }
__device__ inline double Sqrt(double v) { return sqrt(v); }

}  // namespace lipcert::cuda
