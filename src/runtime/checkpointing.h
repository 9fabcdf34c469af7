#pragma once
// What a training run saves and restores (docs/checkpoints.md): every parameter and buffer as
// /model/<name>, the optimizer state as /optim/<name>/<state> (exp_avg, exp_avg_sq or
// momentum_buffer, and step: the parameter's update count), whole tensors under the model's names,
// so a checkpoint written under one plan resumes under any other. The first replica (pipeline replica
// 0) of the first stage holding a tensor writes it.
#include <vector>

#include "io/checkpoint.h"
#include "runtime/executor.h"

namespace partrain::runtime {

/// The full list of checkpoint tensors, identical in names, shapes and order on every rank, with data
/// on the rank that writes each one (tensor-parallel parts on every rank of the group). Collective
/// over each stage's data-parallel group under ZeRO-1 (its optimizer state parts are gathered), so
/// every rank calls it at the same point.
std::vector<io::CheckpointTensor> checkpoint_tensors(const Graph& graph, const Plan& plan,
                                                     const PipelineExecutor& executor);

/// Names every checkpoint of this model must hold for `optimizer` ("adamw" / "sgd" with momentum > 0).
std::vector<std::string> required_checkpoint_tensors(const Graph& graph, const std::vector<std::string>& optimizer_states);

/// Names every checkpoint of this model holds whatever the optimizer: /model/<name> of every
/// parameter and buffer (what evaluation, and a resume from an imported checkpoint, need).
std::vector<std::string> required_model_tensors(const Graph& graph);

/// Copies this rank's parameters and buffers and, when `optimizer_state`, its optimizer state
/// (values and step counts) from `checkpoint`; without it the optimizer keeps its fresh state.
/// Throws partrain::Error naming the checkpoint and the tensor when one is missing or has another
/// shape.
void restore_checkpoint(const io::Checkpoint& checkpoint, const Graph& graph, PipelineExecutor& executor,
                        bool optimizer_state = true);

}  // namespace partrain::runtime
