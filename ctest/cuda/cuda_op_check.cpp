#include "cuda/cuda_op_check.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>

#include "graph/op_schema.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device_query.cuh"
#include "support/gradient_check.h"

namespace partrain::testing {

namespace {
// Result of trying to create the CUDA backend once per process.
struct Availability {
  bool available = false;
  std::string reason;
};

const Availability& availability() {
  static const Availability result = [] {
    Availability a;
    if (cuda::device_count() == 0) {
      a.reason = "no CUDA device or driver; " + cuda::library_versions();
      return a;
    }
    try {
      cuda::cuda_backend(0);
      a.available = true;
    } catch (const Error& error) {
      a.reason = error.what();
    }
    return a;
  }();
  return result;
}

// `tensor` with float values rounded to `dtype` (integers unchanged), on the host.
Tensor as_dtype(const Tensor& tensor, DType dtype) {
  return is_floating(tensor.dtype()) ? to_dtype(tensor, dtype, cpu_backend()) : tensor;
}

// An uninitialised `shape` x `dtype` tensor on `backend` filled with NaN: a kernel that leaves an
// element unwritten then fails the comparison instead of matching by luck of fresh (zeroed) memory.
Tensor poisoned(Backend& backend, const Shape& shape, DType dtype) {
  Tensor host = Tensor::empty(shape, dtype);
  const std::size_t count = static_cast<std::size_t>(host.numel());
  if (dtype == DType::F32) {
    std::fill_n(host.data<float>(), count, std::numeric_limits<float>::quiet_NaN());
  } else if (dtype == DType::BF16) {
    std::fill_n(static_cast<std::uint16_t*>(host.raw_data()), count, std::uint16_t{0x7FC0});  // bf16 quiet NaN
  } else if (dtype == DType::F16) {
    std::fill_n(static_cast<std::uint16_t*>(host.raw_data()), count, std::uint16_t{0x7E00});  // fp16 quiet NaN
  } else {
    std::memset(host.raw_data(), 0xFF, host.nbytes());  // integers: -1, an index no kernel may leave
  }
  return to_backend(host, backend);
}

struct OpResults {
  std::vector<Tensor> outputs, input_grads, inputs_after;
};

// Forward (+ backward with `output_grads`) of one op on `backend`; results copied to the host.
OpResults run_on(Backend& backend, OpType type, const Attributes& attributes, const std::vector<Tensor>& host_inputs,
                 const std::vector<Tensor>& host_output_grads, const CudaOpCheck& check) {
  std::vector<Tensor> inputs;
  std::vector<TensorType> types;
  for (const Tensor& input : host_inputs) {
    inputs.push_back(to_backend(input.clone(), backend));
    types.push_back({input.shape(), input.dtype()});
  }
  std::vector<Tensor> outputs;
  for (const TensorType& type_of_output : infer_output_types(type, attributes, types))
    outputs.push_back(poisoned(backend, type_of_output.shape, type_of_output.dtype));
  const KernelContext context{attributes, backend, check.training, check.random, check.tensor_parallel};
  backend.forward(type, context, inputs, outputs);
  OpResults results;
  for (const Tensor& output : outputs) results.outputs.push_back(to_host(output, backend));
  if (check.compare_inputs_after_forward)
    for (const Tensor& input : inputs) results.inputs_after.push_back(to_host(input, backend));
  if (!host_output_grads.empty()) {
    std::vector<Tensor> output_grads, input_grads;
    for (const Tensor& grad : host_output_grads) output_grads.push_back(to_backend(grad, backend));
    // Inputs that take no gradient (indices, masks, running statistics) get an undefined tensor.
    const OpSchema& schema = op_schema(type);
    for (std::size_t i = 0; i < inputs.size(); ++i)
      input_grads.push_back(schema.input_is_differentiable(i) && is_floating(inputs[i].dtype())
                                ? poisoned(backend, inputs[i].shape(), inputs[i].dtype())
                                : Tensor());
    // The values the backward does not read arrive shape-only, as the interpreter hands them over
    // (graph/interpreter.cpp): a kernel that reads one, or compares its dtype, fails here.
    std::vector<Tensor> saved_inputs = inputs, saved_outputs = outputs;
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (!schema.input_is_saved(i)) saved_inputs[i] = inputs[i].shape_only();
    for (std::size_t k = 0; k < outputs.size(); ++k)
      if (!schema.output_is_saved(k)) saved_outputs[k] = outputs[k].shape_only();
    backend.backward(type, context, saved_inputs, saved_outputs, output_grads, input_grads);
    for (const Tensor& grad : input_grads) results.input_grads.push_back(grad.defined() ? to_host(grad, backend) : Tensor());
  }
  backend.synchronise();
  return results;
}

void compare(const std::vector<Tensor>& actual, const std::vector<Tensor>& expected, double tolerance,
             const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (!expected[i].defined() || !is_floating(expected[i].dtype())) continue;
    ASSERT_TRUE(actual[i].defined()) << what << " " << i << " is missing on CUDA";
    const double error = normalised_error(actual[i], expected[i]);
    EXPECT_LE(error, tolerance) << what << " " << i << " " << shape_string(expected[i].shape())
                                << ": normalised error " << error;
  }
}

void check_precision(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                     const CudaOpCheck& check, DType dtype) {
  std::vector<Tensor> typed;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const bool keep_f32 = std::find(check.f32_inputs_in_bf16.begin(), check.f32_inputs_in_bf16.end(), int(i)) !=
                          check.f32_inputs_in_bf16.end();
    typed.push_back(as_dtype(inputs[i], keep_f32 ? DType::F32 : dtype));
  }
  std::vector<TensorType> types;
  for (const Tensor& t : typed) types.push_back({t.shape(), t.dtype()});
  std::vector<Tensor> output_grads;
  if (check.backward) {
    std::uint64_t seed = 900;
    for (const TensorType& output : infer_output_types(type, attributes, types))
      output_grads.push_back(as_dtype(normal_tensor(output.shape, seed++), output.dtype));
  }
  const OpResults cpu = run_on(cpu_backend(), type, attributes, typed, output_grads, check);
  const OpResults gpu = run_on(cuda::cuda_backend(0), type, attributes, typed, output_grads, check);
  const double tolerance = dtype == DType::F32 ? check.f32_tolerance : check.bf16_tolerance;
  const std::string prefix = std::string(op_name(type)) + " " + dtype_name(dtype) + " ";
  compare(gpu.outputs, cpu.outputs, tolerance, prefix + "output");
  compare(gpu.input_grads, cpu.input_grads, tolerance, prefix + "gradient of input");
  compare(gpu.inputs_after, cpu.inputs_after, tolerance, prefix + "input after forward");
}
}  // namespace

bool cuda_available() { return availability().available; }
bool gpu_visible() { return cuda::device_count() > 0; }
std::string cuda_unavailable_reason() { return availability().reason; }

double normalised_error(const Tensor& actual, const Tensor& expected) {
  const std::vector<float> a = actual.to_float_vector(), e = expected.to_float_vector();
  if (a.size() != e.size()) return INFINITY;
  double difference = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    difference += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
    norm += double(e[i]) * e[i];
  }
  return std::sqrt(difference) / std::max(std::sqrt(norm), 1e-30);
}

void expect_cuda_matches_cpu(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                             const CudaOpCheck& check) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(std::string(op_name(type)) + " in " + dtype_name(dtype));
    check_precision(type, attributes, inputs, check, dtype);
  }
}

}  // namespace partrain::testing
