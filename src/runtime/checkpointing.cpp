#include "runtime/checkpointing.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "core/error.h"
#include "graph/tensor_parallel.h"

namespace partrain::runtime {
namespace {

// The stage that writes each parameter and buffer: the first stage reading it.
std::map<int, int> writer_stages(const Graph& graph, const Plan& plan) {
  std::map<int, int> stage_of;
  for (const StageProgram& program : build_stage_programs(graph, plan)) {
    // Pipeline stages, not model chunks: a rank holding several chunks (interleaved) writes them all.
    for (int value : program.parameters) stage_of.try_emplace(value, plan.stage_of_chunk(program.stage));
    for (int value : program.buffers) stage_of.try_emplace(value, plan.stage_of_chunk(program.stage));
  }
  return stage_of;
}

// A parameter padded with vocabulary rows (Sharding::padding, graph/tensor_parallel.h) is saved
// without them: the file holds the real vocabulary, whatever t wrote it. Its sharded axis is 0, so
// the rank's part is rows [rank·chunk, (rank + 1)·chunk) of the padded tensor and its real rows
// are a prefix of the part: elements [offset, offset + real) of the whole tensor.
struct PaddedPart {
  std::int64_t offset = 0;  // the part's first element in the whole tensor
  std::int64_t real = 0;    // elements of the part that are not padding
};

PaddedPart padded_part(const Value& value, int tensor_rank) {
  PARTRAIN_CHECK(value.sharding.axis == 0 && value.sharding.blocks == 1,
                 "checkpoint: '" << value.name << "' is padded along dimension " << value.sharding.axis << " ("
                                 << value.sharding.blocks << " blocks); only the vocabulary rows (dimension 0) are");
  const Shape whole = whole_shape(value);
  const std::int64_t row = numel(value.type.shape) / value.type.shape[0];
  const std::int64_t first_row = value.type.shape[0] * tensor_rank;
  PaddedPart part;
  part.offset = first_row * row;
  part.real = std::clamp(whole[0] - first_row, std::int64_t{0}, value.type.shape[0]) * row;
  return part;
}

// What a rank writes of a padded parameter (or its optimizer state): `data` holds elements
// [begin, begin + data.numel()) of its part; only those before the padding go to the file, as a
// range of the whole tensor's elements (no data when none does).
io::CheckpointTensor padded_tensor(const std::string& name, const Value& value, int tensor_rank, const Tensor& data,
                                   std::int64_t begin) {
  io::CheckpointTensor tensor{name, whole_shape(value), Tensor(), {}};
  if (!data.defined()) return tensor;
  const PaddedPart part = padded_part(value, tensor_rank);
  const std::int64_t end = std::min(begin + data.numel(), part.real);
  if (end <= begin) return tensor;
  tensor.data = Tensor::empty({end - begin}, data.dtype());
  std::memcpy(tensor.data.raw_data(), data.raw_data(), static_cast<std::size_t>(end - begin) * dtype_size(data.dtype()));
  tensor.part.begin = part.offset + begin;
  tensor.part.end = part.offset + end;
  return tensor;
}

std::vector<int> saved_values(const Graph& graph) {
  std::vector<int> values;
  for (const Value& value : graph.values())
    if (value.kind == ValueKind::Param || value.kind == ValueKind::Buffer) values.push_back(value.id);
  return values;
}

}  // namespace

std::vector<std::string> required_checkpoint_tensors(const Graph& graph, const std::vector<std::string>& optimizer_states) {
  std::vector<std::string> names;
  for (int value : saved_values(graph)) {
    const Value& v = graph.value(value);
    names.push_back("model/" + v.name);
    if (v.kind != ValueKind::Param) continue;
    for (const std::string& state : optimizer_states) names.push_back("optim/" + v.name + "/" + state);
    names.push_back("optim/" + v.name + "/step");
  }
  return names;
}

std::vector<std::string> required_model_tensors(const Graph& graph) {
  std::vector<std::string> names;
  for (int value : saved_values(graph)) names.push_back("model/" + graph.value(value).name);
  return names;
}

std::vector<io::CheckpointTensor> checkpoint_tensors(const Graph& graph, const Plan& plan,
                                                     const PipelineExecutor& executor) {
  const std::map<int, int> writer = writer_stages(graph, plan);
  const Placement placement = executor.placement();
  const bool first_replica = placement.pipeline_replica == 0 && placement.replica == 0;
  const std::vector<std::string> states = executor.optimizer().state_names();
  // Whole per parameter (ZeRO-1 parts gathered over the stage's data-parallel group: collective).
  const PipelineExecutor::OptimizerStateSnapshot optimizer_state = executor.optimizer_state_snapshot();
  std::vector<io::CheckpointTensor> tensors;
  for (int value : saved_values(graph)) {
    const Value& v = graph.value(value);
    const bool holder = first_replica && writer.count(value) && writer.at(value) == placement.stage;
    // Tensor parallelism: every rank of the group writes its part of a sharded parameter as a
    // hyperslab of the whole dataset; a replicated one is written by tensor rank 0.
    const bool sharded = v.sharding.sharded();
    const bool mine = holder && (sharded || placement.tensor_rank == 0);
    const io::CheckpointPart part =
        sharded ? io::CheckpointPart{v.sharding.axis, v.sharding.parts, v.sharding.blocks, placement.tensor_rank}
                : io::CheckpointPart{};
    const Shape shape = whole_shape(v);
    const bool padded = sharded && v.sharding.padding > 0;
    // `data` (undefined on a rank that writes none) as dataset `name`: the rank's tensor-parallel
    // part, or elements [begin, end) of it when end ≥ 0 (a ZeRO-1 shard).
    const auto dataset = [&](const std::string& name, const Tensor& data, std::int64_t begin, std::int64_t end) {
      io::CheckpointPart range = part;
      if (end >= 0) {
        range.begin = begin;
        range.end = end;
      }
      return padded ? padded_tensor(name, v, placement.tensor_rank, data, end >= 0 ? begin : 0)
                    : io::CheckpointTensor{name, shape, data, range};
    };
    // The writer reads host memory: device tensors are copied out first.
    Backend& backend = executor.backend();
    if (executor.master_is_sharded(value)) {
      // ZeRO-1 in mixed precision: every data-parallel rank writes its shard of the f32 master,
      // as it writes its shard of the optimizer state.
      const auto master = executor.sharded_masters().find(value);
      const bool has_piece = master != executor.sharded_masters().end();
      const bool writer = has_piece && (sharded || placement.tensor_rank == 0);
      tensors.push_back(dataset("model/" + v.name, writer ? to_host(master->second.values, backend).clone() : Tensor(),
                                has_piece ? master->second.begin : 0, has_piece ? master->second.end : -1));
    } else {
      tensors.push_back(dataset("model/" + v.name, mine ? to_host(executor.state().at(value), backend) : Tensor(), 0, -1));
    }
    if (v.kind != ValueKind::Param) continue;
    // The optimizer state: the same part of the tensor as the parameter, or under ZeRO-1 every
    // data-parallel rank's piece of it (elements [begin, end) of the part).
    const auto held = optimizer_state.parts.find(value);
    const bool pieces = held != optimizer_state.parts.end() && held->second.end >= 0;
    const bool state_writer = pieces ? (sharded || placement.tensor_rank == 0) : mine && held != optimizer_state.parts.end();
    for (std::size_t k = 0; k < states.size(); ++k)
      tensors.push_back(dataset("optim/" + v.name + "/" + states[k], state_writer ? held->second.states[k] : Tensor(),
                                pieces ? held->second.begin : 0, pieces ? held->second.end : -1));
    Tensor step;
    if (holder && placement.tensor_rank == 0) step = Tensor::full({1}, static_cast<double>(optimizer_state.steps.at(value)));
    tensors.push_back({"optim/" + v.name + "/step", {1}, step});
  }
  return tensors;
}

void restore_checkpoint(const io::Checkpoint& checkpoint, const Graph& graph, PipelineExecutor& executor,
                        bool optimizer_state) {
  auto tensor = [&](const std::string& name, const Shape& shape) -> const Tensor& {
    auto found = checkpoint.tensors.find(name);
    PARTRAIN_CHECK(found != checkpoint.tensors.end(), checkpoint.path << ": dataset /" << name << " is missing");
    PARTRAIN_CHECK(found->second.shape() == shape, checkpoint.path << ": dataset /" << name << " has shape "
                                                                   << shape_string(found->second.shape())
                                                                   << ", the model needs " << shape_string(shape));
    return found->second;
  };
  const std::vector<std::string> states = executor.optimizer().state_names();
  const int tensor_rank = executor.placement().tensor_rank;
  for (int value : executor.held_values()) {
    const Value& v = graph.value(value);
    // Whole tensors in the file; a tensor-parallel rank takes its part (a ZeRO-1 rank in mixed
    // precision keeps its shard of the f32 master and the whole working copy).
    auto part = [&](const std::string& name) { return shard_of(tensor(name, whole_shape(v)), v.sharding, tensor_rank); };
    executor.restore_value(value, part("model/" + v.name));
    if (v.kind != ValueKind::Param || !optimizer_state) continue;
    std::vector<Tensor> saved_state;
    for (const std::string& state : states) saved_state.push_back(part("optim/" + v.name + "/" + state));
    executor.restore_optimizer_state(value, saved_state,
                                     static_cast<std::int64_t>(tensor("optim/" + v.name + "/step", {1}).data<float>()[0]));
  }
  executor.refresh_working_parameters();
}

}  // namespace partrain::runtime
