#include "kernels/cpu/cpu_backend.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/backend_registry.h"
#include "kernels/cpu/optimizer_kernels.h"

namespace partrain {

namespace {
void check_host_float(const Tensor& tensor, const char* what) {
  PARTRAIN_CHECK(tensor.defined() && tensor.device().is_cpu() && is_floating(tensor.dtype()),
                 what << ": needs a defined float host tensor, got " << (tensor.defined() ? dtype_name(tensor.dtype()) : "undefined")
                      << " on " << tensor.device().to_string());
}

// Element i of a float host tensor as fp32, and the store that rounds to the tensor's dtype.
inline float load(const Tensor& tensor, std::int64_t i) {
  if (tensor.dtype() == DType::F32) return tensor.data<float>()[i];
  if (tensor.dtype() == DType::F16) return static_cast<float>(tensor.data<Float16>()[i]);
  return static_cast<float>(tensor.data<BFloat16>()[i]);
}
inline void store(const Tensor& tensor, std::int64_t i, float value) {
  if (tensor.dtype() == DType::F32) tensor.data<float>()[i] = value;
  else if (tensor.dtype() == DType::F16) tensor.data<Float16>()[i] = Float16(value);
  else tensor.data<BFloat16>()[i] = BFloat16(value);
}

// destination = source between fp32 and the 16-bit type `Half` (BFloat16 or Float16), the pointers
// hoisted (as in sum_of_squares): load/store look the tensor's data up per element, which made
// every widened op of mixed precision several times slower than its kernel.
template <typename Half>
void convert_half(const Tensor& destination, const Tensor& source) {
  const std::int64_t n = source.numel();
  if (source.dtype() != DType::F32) {
    const Half* from = source.data<Half>();
    float* to = destination.data<float>();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t i = 0; i < n; ++i) to[i] = static_cast<float>(from[i]);
    return;
  }
  const float* from = source.data<float>();
  Half* to = destination.data<Half>();
#pragma omp parallel for schedule(static) if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) to[i] = Half(from[i]);
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* what) {
  PARTRAIN_CHECK(a.shape() == b.shape(), what << ": shapes " << shape_string(a.shape()) << " and " << shape_string(b.shape()));
}
}  // namespace

void register_cpu_kernels(Backend& backend) {
  register_cpu_gemm_kernels(backend);
  register_cpu_elementwise_kernels(backend);
  register_cpu_normalization_kernels(backend);
  register_cpu_softmax_kernels(backend);
  register_cpu_attention_kernels(backend);
  register_cpu_shape_kernels(backend);
  register_cpu_convolution_kernels(backend);
  register_cpu_tensor_parallel_kernels(backend);
}

CpuBackend::CpuBackend() { register_cpu_kernels(*this); }

void CpuBackend::copy(const Tensor& destination, const Tensor& source) {
  PARTRAIN_CHECK(destination.device().is_cpu() && source.device().is_cpu(), "cpu backend copies host tensors only");
  PARTRAIN_CHECK(destination.numel() == source.numel() && destination.dtype() == source.dtype(),
                 "copy " << shape_string(source.shape()) << " " << dtype_name(source.dtype()) << " into "
                         << shape_string(destination.shape()) << " " << dtype_name(destination.dtype()));
  std::memmove(destination.raw_data(), source.raw_data(), source.nbytes());
}

void CpuBackend::fill_zero(const Tensor& tensor) { tensor.zero(); }

void CpuBackend::accumulate(const Tensor& accumulator, const Tensor& value) {
  check_host_float(accumulator, "accumulate");
  check_host_float(value, "accumulate");
  check_same_shape(accumulator, value, "accumulate");
  const std::int64_t n = value.numel();
  if (accumulator.dtype() == DType::F32 && value.dtype() == DType::F32) {
    float* out = accumulator.data<float>();
    const float* in = value.data<float>();
#pragma omp parallel for schedule(static) if (n > 32768)
    for (std::int64_t i = 0; i < n; ++i) out[i] += in[i];
    return;
  }
#pragma omp parallel for schedule(static) if (n > 32768)
  for (std::int64_t i = 0; i < n; ++i) store(accumulator, i, load(accumulator, i) + load(value, i));
}

void CpuBackend::convert(const Tensor& destination, const Tensor& source) {
  check_host_float(destination, "convert");
  check_host_float(source, "convert");
  PARTRAIN_CHECK(destination.numel() == source.numel(), "convert: " << source.numel() << " elements into "
                                                                     << destination.numel());
  if (destination.dtype() == source.dtype()) return copy(destination, source);
  PARTRAIN_CHECK(destination.dtype() == DType::F32 || source.dtype() == DType::F32,
                 "convert: " << dtype_name(source.dtype()) << " into " << dtype_name(destination.dtype())
                             << " (one side must be f32)");
  if (destination.dtype() == DType::F16 || source.dtype() == DType::F16) return convert_half<Float16>(destination, source);
  convert_half<BFloat16>(destination, source);
}

double CpuBackend::sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) {
  PARTRAIN_CHECK(tensors.size() == weights.size(), "sum_of_squares: " << tensors.size() << " tensors, " << weights.size()
                                                                      << " weights");
  double total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    if (!tensor.defined()) continue;
    check_host_float(tensor, "sum_of_squares");
    const std::int64_t n = tensor.numel();
    double sum = 0;
    if (tensor.dtype() == DType::F32) {
      sum = cpu::sum_of_squares_f32(tensor.data<float>(), n);
    } else {
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n >= 32768)
      for (std::int64_t k = 0; k < n; ++k) {
        const double x = load(tensor, k);
        sum += x * x;
      }
    }
    total += weights[i] * sum;
  }
  return total;
}

void CpuBackend::scale(const Tensor& tensor, double factor) {
  check_host_float(tensor, "scale");
  const float f = static_cast<float>(factor);
  const std::int64_t n = tensor.numel();
  if (tensor.dtype() == DType::F32) {
    float* values = tensor.data<float>();
#pragma omp parallel for schedule(static) if (n >= 32768)
    for (std::int64_t k = 0; k < n; ++k) values[k] *= f;
    return;
  }
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (std::int64_t k = 0; k < n; ++k) store(tensor, k, load(tensor, k) * f);
}

void CpuBackend::adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg,
                              const Tensor& exp_avg_sq, const AdamWUpdate& u) {
  for (const Tensor* t : {&parameter, &gradient, &exp_avg, &exp_avg_sq}) {
    PARTRAIN_CHECK(t->dtype() == DType::F32 && t->device().is_cpu(), "adamw_update: needs f32 host tensors");
    check_same_shape(*t, parameter, "adamw_update");
  }
  cpu::adamw_update_f32(parameter.data<float>(), gradient.data<float>(), exp_avg.data<float>(),
                        exp_avg_sq.data<float>(), parameter.numel(), u);
}

void CpuBackend::sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                            const SgdUpdate& u) {
  for (const Tensor* t : {&parameter, &gradient, &momentum_buffer}) {
    if (t == &momentum_buffer && !t->defined()) continue;
    PARTRAIN_CHECK(t->dtype() == DType::F32 && t->device().is_cpu(), "sgd_update: needs f32 host tensors");
    check_same_shape(*t, parameter, "sgd_update");
  }
  cpu::sgd_update_f32(parameter.data<float>(), gradient.data<float>(),
                      momentum_buffer.defined() ? momentum_buffer.data<float>() : nullptr, parameter.numel(), u);
}

namespace {
// The largest data cache of cpu0 that /sys lists (0: none), among those no other core shares when
// `private_only`.
std::size_t largest_listed_data_cache(bool private_only) {
  std::size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string directory = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream type_file(directory + "type"), size_file(directory + "size"), shared_file(directory + "shared_cpu_list");
    std::string type, size, shared;
    if (!(type_file >> type) || !(size_file >> size) || type == "Instruction" || size.empty()) continue;
    if (private_only && (!(shared_file >> shared) || shared != "0")) continue;
    std::size_t multiplier = 1;
    if (size.back() == 'K') multiplier = std::size_t{1} << 10;
    if (size.back() == 'M') multiplier = std::size_t{1} << 20;
    largest = std::max(largest, static_cast<std::size_t>(std::strtoull(size.c_str(), nullptr, 10)) * multiplier);
  }
  return largest;
}

// Stores `value` to every 64-byte line of `buffer`, the OpenMP threads of the caller each a
// contiguous part (static schedule), so each thread's core caches its own part.
void write_every_line(std::vector<unsigned char>& buffer, unsigned char value) {
  unsigned char* data = buffer.data();
  const std::int64_t n = static_cast<std::int64_t>(buffer.size());
#pragma omp parallel for schedule(static)
  for (std::int64_t i = 0; i < n; i += 64) data[i] = value;
}
}  // namespace

std::size_t private_cache_bytes() {
  static const std::size_t bytes = [] {  // (read once: the profiler flushes before every warm pass)
    const std::size_t listed = largest_listed_data_cache(true);
    return listed > 0 ? listed : std::size_t{1} << 20;
  }();
  return bytes;
}

std::size_t last_level_cache_bytes() {
  static const std::size_t bytes = [] {
    // The kernel's view of cpu0's caches first: on a VM sysconf may report the host package's whole
    // L3 (320 MiB on one AMD EPYC guest here, whose cores share 32 MiB).
    std::size_t largest = largest_listed_data_cache(false);
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (largest == 0)
      for (int name : {_SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE}) {
        const long reported = sysconf(name);
        if (reported > 0) largest = std::max(largest, static_cast<std::size_t>(reported));
      }
#endif
    return largest > 0 ? largest : std::size_t{32} << 20;
  }();
  return bytes;
}

void CpuBackend::flush_caches() {
  // Twice the cache: a last-level cache that is not strictly LRU (or a victim cache, as AMD's L3)
  // keeps part of the old data after one cache-sized write.
  if (flush_buffer_.empty()) flush_buffer_.resize(2 * last_level_cache_bytes());
  write_every_line(flush_buffer_, ++flush_value_);  // a new value each time, so the stores are not elided
}

void CpuBackend::flush_private_caches() {
  // Twice a core's own cache for each thread: the static schedule gives each its own part.
  const std::size_t bytes = 2 * private_cache_bytes() * static_cast<std::size_t>(omp_get_max_threads());
  if (private_flush_buffer_.size() != bytes) private_flush_buffer_.resize(bytes);
  write_every_line(private_flush_buffer_, ++flush_value_);
}

CpuBackend& cpu_backend() {
  static CpuBackend* backend = new CpuBackend();  // never destroyed: used until exit
  return *backend;
}

void cpu::install() { register_cpu_backend(cpu_backend()); }

}  // namespace partrain
