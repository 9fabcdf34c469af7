#include "kernels/cpu/cpu_backend.h"

#include <cstring>

namespace partrain {

CpuBackend::CpuBackend() {
  register_cpu_gemm_kernels(*this);
  register_cpu_elementwise_kernels(*this);
  register_cpu_normalization_kernels(*this);
  register_cpu_softmax_kernels(*this);
  register_cpu_attention_kernels(*this);
  register_cpu_shape_kernels(*this);
  register_cpu_convolution_kernels(*this);
}

void CpuBackend::copy(const Tensor& destination, const Tensor& source) {
  PARTRAIN_CHECK(destination.device().is_cpu() && source.device().is_cpu(), "cpu backend copies host tensors only");
  PARTRAIN_CHECK(destination.numel() == source.numel() && destination.dtype() == source.dtype(),
                 "copy " << shape_string(source.shape()) << " " << dtype_name(source.dtype()) << " into "
                         << shape_string(destination.shape()) << " " << dtype_name(destination.dtype()));
  std::memmove(destination.raw_data(), source.raw_data(), source.nbytes());
}

void CpuBackend::fill_zero(const Tensor& tensor) { tensor.zero(); }

void CpuBackend::accumulate(const Tensor& accumulator, const Tensor& value) {
  PARTRAIN_CHECK(accumulator.shape() == value.shape() && accumulator.dtype() == DType::F32 &&
                     value.dtype() == DType::F32,
                 "accumulate " << shape_string(value.shape()) << " into " << shape_string(accumulator.shape()));
  float* out = accumulator.data<float>();
  const float* in = value.data<float>();
  const std::int64_t n = value.numel();
#pragma omp parallel for schedule(static) if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) out[i] += in[i];
}

CpuBackend& cpu_backend() {
  static CpuBackend* backend = new CpuBackend();  // never destroyed: used until exit
  return *backend;
}

}  // namespace partrain
