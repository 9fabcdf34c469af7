#include "support/gradient_check.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>

#include "graph/op_schema.h"
#include "kernels/cpu/cpu_backend.h"

namespace partrain::testing {

Tensor uniform_tensor(const Shape& shape, std::uint64_t seed, float low, float high) {
  Tensor tensor = Tensor::empty(shape);
  std::mt19937_64 generator(seed);
  std::uniform_real_distribution<float> distribution(low, high);
  float* data = tensor.data<float>();
  for (std::int64_t i = 0; i < tensor.numel(); ++i) data[i] = distribution(generator);
  return tensor;
}

Tensor normal_tensor(const Shape& shape, std::uint64_t seed, float standard_deviation) {
  Tensor tensor = Tensor::empty(shape);
  std::mt19937_64 generator(seed);
  std::normal_distribution<float> distribution(0.f, standard_deviation);
  float* data = tensor.data<float>();
  for (std::int64_t i = 0; i < tensor.numel(); ++i) data[i] = distribution(generator);
  return tensor;
}

Tensor index_tensor(const Shape& shape, std::int64_t upper, std::uint64_t seed, DType dtype) {
  Tensor tensor = Tensor::empty(shape, dtype);
  std::mt19937_64 generator(seed);
  std::uniform_int_distribution<std::int64_t> distribution(0, upper - 1);
  for (std::int64_t i = 0; i < tensor.numel(); ++i) {
    if (dtype == DType::I64) tensor.data<std::int64_t>()[i] = distribution(generator);
    else tensor.data<std::int32_t>()[i] = static_cast<std::int32_t>(distribution(generator));
  }
  return tensor;
}

std::vector<Tensor> run_forward(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                                bool training, RandomContext random) {
  std::vector<TensorType> input_types;
  for (const Tensor& input : inputs) input_types.push_back({input.shape(), input.dtype()});
  std::vector<Tensor> outputs;
  for (const TensorType& type_of_output : infer_output_types(type, attributes, input_types))
    outputs.push_back(Tensor::empty(type_of_output.shape, type_of_output.dtype));
  CpuBackend& backend = cpu_backend();
  KernelContext context{attributes, backend, training, random};
  backend.forward(type, context, inputs, outputs);
  return outputs;
}

namespace {
// L = sum_k <projection_k, output_k>, accumulated in double.
double projected_loss(const std::vector<Tensor>& outputs, const std::vector<Tensor>& projections) {
  double loss = 0;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    if (!projections[k].defined()) continue;
    const float* y = outputs[k].data<float>();
    const float* r = projections[k].data<float>();
    for (std::int64_t i = 0; i < outputs[k].numel(); ++i) loss += double(y[i]) * double(r[i]);
  }
  return loss;
}
}  // namespace

GradientCheckResult check_gradients(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                                    const GradientCheckOptions& options, BackwardKernel backward_override) {
  const OpSchema& schema = op_schema(type);
  CpuBackend& backend = cpu_backend();
  KernelContext context{attributes, backend, options.training, options.random};

  std::vector<Tensor> working;  // private copies: finite differences perturb them
  for (const Tensor& input : inputs) working.push_back(input.clone());
  std::vector<Tensor> outputs = run_forward(type, attributes, working, options.training, options.random);

  std::vector<Tensor> projections;
  for (std::size_t k = 0; k < outputs.size(); ++k)
    projections.push_back(outputs[k].dtype() == DType::F32 ? normal_tensor(outputs[k].shape(), options.seed + 17 * k)
                                                           : Tensor());

  // Analytic gradients from the backward kernel.
  std::vector<Tensor> output_grads;
  for (std::size_t k = 0; k < outputs.size(); ++k)
    output_grads.push_back(projections[k].defined() ? projections[k] : Tensor::zeros(outputs[k].shape(), outputs[k].dtype()));
  std::vector<Tensor> input_grads(working.size());
  for (std::size_t i = 0; i < working.size(); ++i)
    if (schema.input_is_differentiable(i) && working[i].dtype() == DType::F32)
      input_grads[i] = Tensor::full(working[i].shape(), std::nan(""));  // a kernel must overwrite it
  if (backward_override) backward_override(context, working, outputs, output_grads, input_grads);
  else backend.backward(type, context, working, outputs, output_grads, input_grads);

  GradientCheckResult result;
  result.passed = true;
  std::ostringstream report;
  std::mt19937_64 generator(options.seed);
  for (std::size_t i = 0; i < working.size(); ++i) {
    if (!input_grads[i].defined()) continue;
    const std::int64_t n = working[i].numel();
    std::vector<std::int64_t> elements(n);
    std::iota(elements.begin(), elements.end(), 0);
    if (n > options.max_elements_per_input) {
      std::shuffle(elements.begin(), elements.end(), generator);
      elements.resize(options.max_elements_per_input);
    }
    float* x = working[i].data<float>();
    const float* analytic = input_grads[i].data<float>();
    double difference_norm = 0, analytic_norm = 0, numeric_norm = 0;
    for (std::int64_t e : elements) {
      const float original = x[e];
      x[e] = static_cast<float>(original + options.step);
      const double loss_plus = projected_loss(run_forward(type, attributes, working, options.training, options.random), projections);
      x[e] = static_cast<float>(original - options.step);
      const double loss_minus = projected_loss(run_forward(type, attributes, working, options.training, options.random), projections);
      x[e] = original;
      const double numeric = (loss_plus - loss_minus) / (2 * options.step);
      difference_norm += (analytic[e] - numeric) * (analytic[e] - numeric);
      analytic_norm += double(analytic[e]) * analytic[e];
      numeric_norm += numeric * numeric;
    }
    const double scale = std::max({std::sqrt(analytic_norm), std::sqrt(numeric_norm), 1e-3});
    const double error = std::isnan(difference_norm) ? INFINITY : std::sqrt(difference_norm) / scale;
    result.worst_error = std::max(result.worst_error, error);
    if (!(error <= options.tolerance)) result.passed = false;
    report << op_name(type) << " input " << i << " " << shape_string(working[i].shape()) << ": " << elements.size()
           << " elements, normalised error " << error << " (|analytic| " << std::sqrt(analytic_norm)
           << ", |numeric| " << std::sqrt(numeric_norm) << ")\n";
  }
  result.report = report.str();
  return result;
}

}  // namespace partrain::testing
