#include "core/backend.h"

namespace partrain {

void Backend::forward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
                      std::span<const Tensor> outputs) const {
  const OpKernels& op = kernels(type);
  PARTRAIN_CHECK(op.forward != nullptr, "backend " << name() << " has no forward kernel for " << op_name(type));
  op.forward(context, inputs, outputs);
}

void Backend::backward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
                       std::span<const Tensor> outputs, std::span<const Tensor> output_grads,
                       std::span<const Tensor> input_grads) const {
  const OpKernels& op = kernels(type);
  PARTRAIN_CHECK(op.backward != nullptr, "backend " << name() << " has no backward kernel for " << op_name(type));
  op.backward(context, inputs, outputs, output_grads, input_grads);
}

}  // namespace partrain
