// The vector operations of the shared Lanczos driver (kernels/lanczos.h) in the CUDA back
// end (CPU: CpuEvaluator::PointOps), on `batch` points at once. Slot i of point b starts at
// slots + i slot_stride + b nd; coefficients are doubles, one row of m per point, and every
// sum accumulates in double. Each launcher checks its launch.
#pragma once

namespace lipcert::cuda {

// out[b m + i] = <slot_i[b], slot_w[b]> for i < m: one block per dot.
template <class T>
void SlotDots(const T* slots, long long slot_stride, int w, int m, int batch, int nd, double* out);
// slot_w[b] -= sum_i c[b m + i] slot_i[b].
template <class T>
void SlotSubtract(T* slots, long long slot_stride, int w, int m, int batch, int nd, const double* c);
// slot_dst[b] = f[b] slot_src[b].
template <class T>
void SlotScale(T* slots, long long slot_stride, int src, int dst, int batch, int nd, const double* f);
// slot_dst[b] = sum_i c[b m + i] slot_i[b] where mask[b] (other points left as they are).
template <class T>
void SlotCombine(T* slots, long long slot_stride, int m, int dst, int batch, int nd, const double* c,
                 const unsigned char* mask);

}  // namespace lipcert::cuda
