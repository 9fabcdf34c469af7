#include "profile/speed_calibration.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <vector>

#include "core/attributes.h"
#include "core/op_type.h"
#include "core/statistics.h"

namespace partrain::profile {

double speed_calibration_seconds(Backend& backend, comm::Communicator& world) {
  constexpr std::int64_t kSize = 256;
  // Each timed run is 32 back-to-back products (about 15 ms on one core): long enough to span the
  // scheduler's time slices, so that sharing the cores with other work shows (a single 0.5 ms product
  // runs at full speed inside one slice even on a loaded machine).
  constexpr int kWarmup = 1, kRepeats = 5, kProductsPerRun = 32;
  Tensor host_a = Tensor::empty({kSize, kSize}, DType::F32), host_b = Tensor::empty({kSize, kSize}, DType::F32);
  for (std::int64_t i = 0; i < kSize * kSize; ++i) {  // not zeros: some kernels run faster on them
    host_a.data<float>()[i] = static_cast<float>((i % 97) - 48) / 97.0f;
    host_b.data<float>()[i] = static_cast<float>((i % 89) - 44) / 89.0f;
  }
  const Tensor a = to_backend(host_a, backend), b = to_backend(host_b, backend);
  const Tensor out = backend.empty({kSize, kSize}, DType::F32);
  const Attributes attributes;
  const KernelContext context{attributes, backend, false};
  const std::vector<Tensor> inputs = {a, b}, outputs = {out};
  std::vector<double> seconds;
  world.barrier();  // every rank at once: they share the node's cores as in training
  for (int run = 0; run < kWarmup + kRepeats; ++run) {
    const auto start = std::chrono::steady_clock::now();
    for (int product = 0; product < kProductsPerRun; ++product) backend.forward(OpType::MatMul, context, inputs, outputs);
    backend.synchronise();
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (run >= kWarmup) seconds.push_back(elapsed);
  }
  return world.all_reduce_scalar(median(std::move(seconds))) / world.size();
}

double adapt_to_speed(ProfileDB& database, double speed_ratio) {
  if (speed_ratio <= 0 || std::abs(speed_ratio - 1) <= kCalibrationTolerance) return 1.0;
  database.rescale_times(speed_ratio);
  return speed_ratio;
}

ProfileDB at_recorded_speed(const ProfileDB& database, double speed_factor) {
  ProfileDB recorded = database;
  if (speed_factor != 1.0) recorded.rescale_times(1.0 / speed_factor);
  return recorded;
}

}  // namespace partrain::profile
