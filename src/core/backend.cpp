#include "core/backend.h"

#include <algorithm>
#include <optional>
#include <vector>

namespace partrain {

namespace {
// Whether `tensor` is a 16-bit float tensor that `backend`'s kernels do not read themselves. A
// shape-only stand-in (a value the kernel does not read: OpSchema::saved_inputs) counts by its
// dtype too, so that the kernel sees it as fp32 beside the widened copies (kernels compare and
// dispatch on the dtypes of the values whose shapes they read). No tensor at all (Tensor()) is f32.
bool needs_widening(const Backend& backend, const Tensor& tensor) {
  return (tensor.dtype() == DType::BF16 && !backend.supports_bf16()) ||
         (tensor.dtype() == DType::F16 && !backend.supports_f16());
}

bool any_widened(const Backend& backend, std::span<const Tensor> tensors) {
  return std::any_of(tensors.begin(), tensors.end(), [&](const Tensor& t) { return needs_widening(backend, t); });
}

// fp32 working copies of the 16-bit tensors among `tensors` that the backend does not compute in
// (the others as they are). With `copy_values` false the copies are uninitialised (outputs and
// input gradients).
std::vector<Tensor> widened(Backend& backend, std::span<const Tensor> tensors, bool copy_values) {
  std::vector<Tensor> result(tensors.begin(), tensors.end());
  for (Tensor& tensor : result) {
    if (!needs_widening(backend, tensor)) continue;
    if (!tensor.defined()) tensor = tensor.shape_only(DType::F32);
    else tensor = copy_values ? to_dtype(tensor, DType::F32, backend) : backend.empty(tensor.shape(), DType::F32);
  }
  return result;
}

// Rounds the fp32 results back into the 16-bit tensors they stand for; tensors that were not
// widened were written in place by the kernel.
void narrow_into(Backend& backend, std::span<const Tensor> targets, std::span<const Tensor> results) {
  for (std::size_t i = 0; i < targets.size(); ++i)
    if (targets[i].defined() && needs_widening(backend, targets[i])) backend.convert(targets[i], results[i]);
}
}  // namespace

namespace {
// The widened (fp32) copies of a bf16 op are rounded back right after its kernel returns, so an
// all-reduce the kernel would defer (sub-pipelined TMP) must finish inside it.
class CompletingGroup final : public TensorParallelGroup {
 public:
  explicit CompletingGroup(TensorParallelGroup& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce(const Tensor& tensor, Reduction reduction) override { inner_.all_reduce(tensor, reduction); }
  void all_gather(const Tensor& input, const Tensor& output) override { inner_.all_gather(input, output); }
  void reduce_scatter(const Tensor& input, const Tensor& output) override { inner_.reduce_scatter(input, output); }
  bool orders_device_work() const override { return inner_.orders_device_work(); }

 private:
  TensorParallelGroup& inner_;
};

struct WidenedContext {
  std::optional<CompletingGroup> group;
  KernelContext context;
  explicit WidenedContext(const KernelContext& original) : context(original) {
    if (original.tensor_parallel == nullptr) return;
    group.emplace(*original.tensor_parallel);
    context.tensor_parallel = &*group;
  }
};
}  // namespace

void Backend::run_kernel(OpType, const char*, const std::function<void()>& kernel) const { kernel(); }

void Backend::forward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
                      std::span<const Tensor> outputs) const {
  const OpKernels& op = kernels(type);
  PARTRAIN_CHECK(op.forward != nullptr, "backend " << name() << " has no forward kernel for " << op_name(type));
  if (!any_widened(*this, inputs) && !any_widened(*this, outputs))
    return run_kernel(type, "forward", [&] { op.forward(context, inputs, outputs); });
  // bf16 or f16 on a backend that computes that type in fp32 only: widen, compute, round once.
  Backend& self = context.backend;
  const std::vector<Tensor> wide_inputs = widened(self, inputs, true);
  const std::vector<Tensor> wide_outputs = widened(self, outputs, false);
  const WidenedContext widened_context(context);
  run_kernel(type, "forward", [&] { op.forward(widened_context.context, wide_inputs, wide_outputs); });
  // Ops that update an input in place (BatchNorm2d running statistics) write the widened copy.
  narrow_into(self, inputs, wide_inputs);
  narrow_into(self, outputs, wide_outputs);
}

void Backend::backward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
                       std::span<const Tensor> outputs, std::span<const Tensor> output_grads,
                       std::span<const Tensor> input_grads) const {
  const OpKernels& op = kernels(type);
  PARTRAIN_CHECK(op.backward != nullptr, "backend " << name() << " has no backward kernel for " << op_name(type));
  if (!any_widened(*this, inputs) && !any_widened(*this, outputs) && !any_widened(*this, output_grads) &&
      !any_widened(*this, input_grads))
    return run_kernel(type, "backward", [&] { op.backward(context, inputs, outputs, output_grads, input_grads); });
  Backend& self = context.backend;
  const std::vector<Tensor> wide_input_grads = widened(self, input_grads, false);
  const WidenedContext widened_context(context);
  const std::vector<Tensor> wide_inputs = widened(self, inputs, true), wide_outputs = widened(self, outputs, true),
                            wide_output_grads = widened(self, output_grads, true);
  run_kernel(type, "backward", [&] {
    op.backward(widened_context.context, wide_inputs, wide_outputs, wide_output_grads, wide_input_grads);
  });
  narrow_into(self, input_grads, wide_input_grads);
}

Tensor to_backend(const Tensor& tensor, Backend& backend) {
  if (!tensor.defined() || tensor.device() == backend.device()) return tensor;
  Tensor copy = backend.empty(tensor.shape(), tensor.dtype());
  backend.copy(copy, tensor);
  return copy;
}

Tensor to_dtype(const Tensor& tensor, DType dtype, Backend& backend) {
  if (!tensor.defined() || tensor.dtype() == dtype) return tensor;
  Tensor converted = backend.empty(tensor.shape(), dtype);
  backend.convert(converted, tensor);
  return converted;
}

Tensor to_host(const Tensor& tensor, Backend& backend) {
  if (!tensor.defined() || tensor.device().is_cpu()) return tensor;
  Tensor copy = Tensor::empty(tensor.shape(), tensor.dtype());
  backend.copy(copy, tensor);
  return copy;
}

}  // namespace partrain
