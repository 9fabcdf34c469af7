#include "runtime/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <unordered_set>

#include "core/allocator.h"
#include "comm/tensor_parallel_group.h"
#include "core/error.h"
#include "graph/op_schema.h"
#include "graph/saved_tensors.h"
#include "io/fault_injection.h"
#include "plan/schedule_topology.h"

namespace partrain::runtime {
namespace {
// Per value id, the dtype the value has at run time: the data inputs and the parameters' working
// copies in the compute dtype (`compute`: bf16 or f16 under mixed precision, else f32), buffers and
// constants as declared, and each task's outputs what the op computes from those (a loss stays f32
// under mixed precision). A stage receiving a value (or its gradient) from another allocates it in
// this dtype.
std::vector<DType> value_dtypes(const Graph& graph, DType compute) {
  std::vector<DType> dtypes(graph.values().size());
  for (const Value& value : graph.values()) {
    const bool converted = value.kind == ValueKind::Input || value.kind == ValueKind::Label || value.kind == ValueKind::Param;
    dtypes[static_cast<std::size_t>(value.id)] = converted && value.type.dtype == DType::F32 ? compute : value.type.dtype;
  }
  for (const Task& task : graph.tasks()) {  // id order is topological
    std::vector<TensorType> inputs;
    for (int input : task.inputs) inputs.push_back({graph.value(input).type.shape, dtypes[static_cast<std::size_t>(input)]});
    const std::vector<TensorType> outputs = infer_output_types(task.op, task.attributes, inputs);
    for (std::size_t k = 0; k < outputs.size(); ++k) dtypes[static_cast<std::size_t>(task.outputs[k])] = outputs[k].dtype;
  }
  return dtypes;
}

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Messages between two ranks match by order within a tag: one tag per (microbatch, receiving local
// model chunk, direction); the chunk is 0 except under the interleaved schedule.
int message_tag(const comm::Communicator& world, int microbatch, int chunk, int chunks, bool gradient) {
  // In 64 bits: Open MPI's largest tag is INT_MAX, and INT_MAX + 1 overflows an int (UBSan).
  const std::int64_t tags = static_cast<std::int64_t>(world.max_tag()) + 1;
  const std::int64_t slot = static_cast<std::int64_t>(microbatch) * chunks + chunk;
  return static_cast<int>((slot * 2 + (gradient ? 1 : 0)) % tags);
}

// A copy of `tensor` on `backend`'s device (never the same storage).
Tensor copy_to(const Tensor& tensor, Backend& backend) {
  Tensor copy = backend.empty(tensor.shape(), tensor.dtype());
  backend.copy(copy, tensor);
  return copy;
}

// Appends `value` to `values` unless it is there already.
void add_once(std::vector<int>& values, int value) {
  if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
}

// What a training forward of the stage must not free while it runs (ExecutionOptions::keep): the
// saved tensors, the outputs to send, the loss and, when the forward will be recomputed, the inputs
// the recomputation starts from.
std::unordered_set<int> forward_keep(const StageProgram& program, const std::vector<int>* recompute_inputs) {
  std::unordered_set<int> keep(program.saved.begin(), program.saved.end());
  keep.insert(program.sent.begin(), program.sent.end());
  if (program.loss >= 0) keep.insert(program.loss);
  if (recompute_inputs != nullptr) keep.insert(recompute_inputs->begin(), recompute_inputs->end());
  return keep;
}

// After a training forward pass (or its recomputation): keep of the microbatch's values only the
// saved tensors (StageProgram::saved) and the loss, so that the activations stored until the
// backward are exactly what the backward reads (Korthikanti et al. 2022 §4); the others become
// shape-only. A received activation the backward does not read is let go of as well; a stage
// output stays in `outputs` until its sends have completed (release_sent_outputs).
void keep_saved_tensors(const Graph& graph, const StageProgram& program, TensorMap& values,
                        std::array<TensorMap, 2>& halves, TensorMap* received) {
  std::unordered_set<int> keep(program.saved.begin(), program.saved.end());
  if (program.loss >= 0) keep.insert(program.loss);
  release_unsaved(graph, values, keep);
  for (TensorMap& half : halves) release_unsaved(graph, half, keep);
  if (received != nullptr)
    for (auto it = received->begin(); it != received->end();)
      it = keep.count(it->first) ? std::next(it) : received->erase(it);
}

// Parameter -> the pipeline stages reading it (ascending, each once). Parameters read by several
// stages (tied embeddings) are reduced over every rank of those stages.
std::map<int, std::vector<int>> stages_reading_parameters(const Plan& plan, const std::vector<StageProgram>& programs) {
  std::map<int, std::vector<int>> stages_of;
  for (const StageProgram& program : programs)
    for (int value : program.parameters) {
      std::vector<int>& stages = stages_of[value];
      const int stage = plan.stage_of_chunk(program.stage);  // chunks of one stage share the rank's tensor
      add_once(stages, stage);
      std::sort(stages.begin(), stages.end());
    }
  return stages_of;
}

}  // namespace

// ---- Construction ----

PipelineExecutor::PipelineExecutor(const Graph& graph, const Plan& plan, comm::Communicator& world, Backend& backend,
                                   const io::BatchSource& data, const std::unordered_map<int, Tensor>& initial_values,
                                   const RuntimeOptions& options)
    : graph_(graph), plan_(plan), world_(world), backend_(backend), data_(data), options_(options),
      group_transfers_(options.group_transfers || world.sends_wait_for_their_receive()),
      lr_schedule_(options.lr_schedule), clock_origin_(now_us()), device_timer_(backend.make_device_timer()) {
  PARTRAIN_CHECK(world.size() == plan.world_size,
                 "the plan is for " << plan.world_size << " ranks, but " << world.size() << " are running");
  placement_ = plan.placement_of(world.rank());
  samples_ = plan.replica_samples(placement_.stage, placement_.replica);
  const std::vector<StageProgram> programs = build_stage_programs(graph, plan);
  select_chunks(programs);
  schedule_actions();
  active_data_ = &data_;
  load_initial_values(initial_values);
  const std::map<int, std::vector<int>> stages_of = stages_reading_parameters(plan, programs);
  create_groups(stages_of);
  // DDP's overlapped reduction (when the schedule reduces over a data-parallel group): buckets of
  // the untied gradients in the order the backward completes them, each reduced during the step's
  // last backward as soon as it is complete — an all-reduce, or under ZeRO-1 a reduce-scatter of
  // the partition's segment that is the bucket.
  const bool data_parallel = std::any_of(actions_.begin(), actions_.end(),
                                         [](const Action& action) { return action.kind == ActionKind::AllReduce; });
  // An interleaved stage runs several model chunks, whose gradients complete in several backwards:
  // the overlapped buckets follow one backward's completion order, so they are for one-chunk stages
  // (an interleaved stage reduces all its gradients at its AllReduce action, as before).
  const bool bucketed = data_parallel && programs_.size() == 1;
  classify_parameters(stages_of);
  const std::vector<GradientCompletion> completion =
      bucketed ? gradient_completion_order(graph, programs_.front().backward, untied_) : std::vector<GradientCompletion>{};
  create_optimizer(stages_of, bucketed, completion);
  create_gradient_buckets(bucketed, completion);
}

void PipelineExecutor::select_chunks(const std::vector<StageProgram>& programs) {
  // The rank's model chunks: its stage alone, or under the interleaved schedule chunks s, s + S, ...
  // (Action::chunk indexes this list). Their parameters are disjoint but for ties between chunks.
  for (int chunk : plan_.chunks_of_stage(placement_.stage)) programs_.push_back(programs[chunk]);
  for (const StageProgram& program : programs_) {  // over the rank's chunks, each once
    for (int value : program.parameters) add_once(parameter_order_, value);
    for (int value : program.buffers) add_once(rank_buffers_, value);
  }
}

void PipelineExecutor::schedule_actions() {
  actions_ = generate_schedule(plan_)[world_.rank()];
  for (Action action : actions_) {
    if (action.kind != ActionKind::Forward && action.kind != ActionKind::SendActivation &&
        action.kind != ActionKind::ReceiveActivation)
      continue;
    action.activations_recomputed = false;
    evaluation_actions_.push_back(action);
  }
  for (std::size_t i = 0; i < actions_.size(); ++i)
    if (actions_[i].kind == ActionKind::Backward || actions_[i].kind == ActionKind::BackwardWeight) last_backward_ = i;
    else if (actions_[i].kind == ActionKind::BackwardInput) last_backward_input_ = i;
  // A list with BackwardInput needs every chunk's backward split (build_stage_programs does it for
  // the zero-bubble schedules): say so here, not at the first microbatch.
  for (const StageProgram& program : programs_)
    PARTRAIN_CHECK(last_backward_input_ == 0 || program.split.input.output_grads == program.backward.output_grads,
                   "executor: stage " << program.stage << "'s backward was not split for a zero-bubble schedule");
  // The Step action finishes the step (optimizer_step): it must come last, after every send.
  PARTRAIN_CHECK(!actions_.empty() && actions_.back().kind == ActionKind::Step,
                 "executor: rank " << world_.rank() << "'s action list does not end with its Step");
}

void PipelineExecutor::load_initial_values(const std::unordered_map<int, Tensor>& initial_values) {
  for (int value : parameter_order_) {
    auto found = initial_values.find(value);
    PARTRAIN_CHECK(found != initial_values.end(), "executor: no initial value for parameter " << graph_.value(value).name);
    state_[value] = copy_to(found->second, backend_);
    gradients_[value] = backend_.zeros(found->second.shape());  // f32 master gradients
  }
  for (int value : rank_buffers_) {
    auto found = initial_values.find(value);
    PARTRAIN_CHECK(found != initial_values.end(), "executor: no initial value for buffer " << graph_.value(value).name);
    state_[value] = copy_to(found->second, backend_);
  }
  mixed_precision_ = plan_.precision != Precision::Fp32;
  compute_dtype_ = compute_dtype_of(plan_.precision);
  value_dtypes_ = value_dtypes(graph_, compute_dtype_);
  if (plan_.precision == Precision::Fp16) loss_scaler_.emplace(options_.loss_scaling);
  refresh_working_parameters();
  // Merak's sub-pipelined TMP splits the rank's rows of a microbatch in two; values that cross the
  // stage's boundary whole (a loss piece) cannot be split, so such a stage runs microbatches whole.
  sub_pipelined_ = plan_.sub_pipelined_tmp && plan_.tensor_parallel > 1 && rows() >= 2 &&
                   can_sub_pipeline(graph_, programs_);
  // Constants (position ids) copied to the device once, not at every use.
  for (const Value& value : graph_.values())
    if (value.kind == ValueKind::Const) constants_[value.id] = to_backend(graph_.constant_data(value.id), backend_);
}

void PipelineExecutor::create_groups(const std::map<int, std::vector<int>>& stages_of) {
  // Data-parallel and tied groups join the ranks holding the same part of a tensor-parallel stage.
  auto ranks_of_stages = [&](const std::vector<int>& stages) {
    std::vector<int> ranks;
    for (int pipeline_replica = 0; pipeline_replica < plan_.pipeline_replicas; ++pipeline_replica)
      for (int stage : stages)
        for (int replica = 0; replica < plan_.stages[stage].replicas; ++replica)
          ranks.push_back(plan_.rank_of({pipeline_replica, stage, replica, placement_.tensor_rank}));
    std::sort(ranks.begin(), ranks.end());
    return ranks;
  };
  std::vector<std::vector<int>> tied_sets;
  for (const auto& [value, stages] : stages_of)
    if (stages.size() > 1 && std::find(tied_sets.begin(), tied_sets.end(), stages) == tied_sets.end())
      tied_sets.push_back(stages);
  std::sort(tied_sets.begin(), tied_sets.end());
  for (const std::vector<int>& stages : tied_sets) {  // collective over the world, same order everywhere
    const std::vector<int> ranks = ranks_of_stages(stages);
    std::unique_ptr<comm::Communicator> group = world_.group(ranks);
    if (!group) continue;
    PARTRAIN_CHECK(!tied_group_, "executor: stage " << placement_.stage
                                                    << " shares parameters with two different sets of stages; "
                                                       "this is not supported");
    tied_group_ = std::move(group);
  }
  stage_group_ = world_.group(ranks_of_stages({placement_.stage}));
  if (plan_.tensor_parallel > 1) {
    tensor_group_ = world_.group(tensor_group(plan_, placement_));
    tensor_parallel_ = std::make_unique<comm::CommunicatorTensorParallelGroup>(*tensor_group_);
  }
}

void PipelineExecutor::classify_parameters(const std::map<int, std::vector<int>>& stages_of) {
  for (int value : parameter_order_) {
    const std::vector<int>& stages = stages_of.at(value);
    // A replicated parameter of a tensor-parallel stage (LayerNorm, row-parallel bias) has the same
    // gradient on the t ranks of its group (under sequence parallelism once summed over the group,
    // sum_sequence_parallel_gradients); a sharded one is a different part on each.
    double holders = graph_.value(value).sharding.sharded() ? 1 : plan_.tensor_parallel;
    double replicas = 0;
    for (int stage : stages) replicas += plan_.stages[stage].replicas * plan_.pipeline_replicas;
    holders *= replicas;
    holders_.push_back(holders);
    (stages.size() > 1 ? tied_ : untied_).push_back(value);
  }
}

void PipelineExecutor::create_optimizer(const std::map<int, std::vector<int>>& stages_of, bool bucketed,
                                        const std::vector<GradientCompletion>& completion) {
  // ZeRO-1 shards over the stage's data-parallel group; a group of one has nothing to shard over (and
  // its memory is modelled as plain data parallelism's).
  const bool sharded = plan_.zero == 1 && stage_group_->size() > 1;
  std::vector<OptimizerParameter> parameters;
  std::vector<OptimizerParameter> tied_parameters;  // after the ZeRO pieces
  for (int value : parameter_order_) {
    // No weight decay for biases and normalisation weights (1-D), as in Hugging Face and Megatron.
    OptimizerParameter parameter{graph_.value(value).name, state_[value], state_[value].rank() > 1};
    (sharded && stages_of.at(value).size() > 1 ? tied_parameters : parameters).push_back(parameter);
  }
  if (sharded) {
    // ZeRO-1: the optimizer updates this rank's pieces of the untied parameters (tied ones, reduced
    // over stages, stay whole). Each piece's elements are held by this rank alone in the
    // data-parallel group, and by the t ranks of the tensor-parallel group when not split there.
    std::vector<Tensor> untied_values;
    for (int value : untied_) untied_values.push_back(state_[value]);
    std::vector<std::vector<std::size_t>> segments;  // the buckets, as indices into untied_
    if (bucketed) {
      std::map<int, std::size_t> index;
      for (std::size_t i = 0; i < untied_.size(); ++i) index[untied_[i]] = i;
      std::vector<std::int64_t> bytes;
      for (const GradientCompletion& gradient : completion)
        bytes.push_back(static_cast<std::int64_t>(gradients_.at(gradient.parameter).nbytes()));
      for (const std::vector<std::size_t>& bucket : assign_buckets(bytes, options_.bucket_bytes)) {
        segments.emplace_back();
        for (std::size_t i : bucket) segments.back().push_back(index.at(completion[i].parameter));
      }
    }
    zero_ = std::make_unique<ZeroPartition>(std::move(untied_values), *stage_group_, backend_, std::move(segments));
    // In mixed precision the f32 masters are optimizer state too (ZeRO §5.1; Megatron-LM's
    // distributed optimizer): the rank keeps its elements of them in one buffer, the forward and
    // backward read the whole bf16 working copies, and the step all-gathers the updated elements.
    if (mixed_precision_) master_part_ = backend_.zeros({zero_->part_size()});
    std::vector<OptimizerParameter> pieces;
    for (const ZeroPartition::Piece& piece : zero_->pieces()) {
      const int value = untied_[piece.parameter];
      Tensor elements = ZeroPartition::view(state_[value], piece);
      if (mixed_precision_) {
        const Tensor master = master_part_.slice_rows(piece.offset, piece.offset + piece.end - piece.begin);
        backend_.copy(master, elements);
        master_part_pieces_.push_back(master);
        master_pieces_[value] = {piece.begin, piece.end, master};
        elements = master;
      }
      pieces.push_back({graph_.value(value).name, elements, state_[value].rank() > 1});
      piece_weights_.push_back(graph_.value(value).sharding.sharded() ? 1.0 : 1.0 / plan_.tensor_parallel);
    }
    if (mixed_precision_)
      for (int value : untied_) state_.erase(value);  // the working copies were cast already
    parameters = std::move(pieces);
    for (OptimizerParameter& parameter : tied_parameters) parameters.push_back(std::move(parameter));
  }
  optimizer_ = make_optimizer(plan_.optimizer, options_.optimizer, std::move(parameters), backend_);
}

void PipelineExecutor::create_gradient_buckets(bool bucketed, const std::vector<GradientCompletion>& completion) {
  if (bucketed && !untied_.empty())
    buckets_ = zero_ ? std::make_unique<BucketedAllReduce>(*zero_, untied_, completion, gradients_, backend_)
                     : std::make_unique<BucketedAllReduce>(completion, gradients_, options_.bucket_bytes, *stage_group_,
                                                           backend_);
}

PipelineExecutor::~PipelineExecutor() = default;

DType PipelineExecutor::compute_dtype(DType dtype) const {
  return dtype == DType::F32 ? compute_dtype_ : dtype;
}

void PipelineExecutor::refresh_working_parameters() {
  // Mixed precision (Megatron/Apex "O2"): forward and backward read bf16 or f16 copies of the f32 master
  // parameters; buffers (BatchNorm running statistics) stay f32.
  // (The working copies of sharded masters are gathered by optimizer_step or set by restore_value.)
  for (const auto& [value, tensor] : state_) {
    const bool parameter = graph_.value(value).kind == ValueKind::Param;
    working_[value] = parameter ? to_dtype(tensor, compute_dtype(tensor.dtype()), backend_) : tensor;
  }
}

bool PipelineExecutor::master_is_sharded(int value) const {
  return master_part_.defined() && std::find(untied_.begin(), untied_.end(), value) != untied_.end();
}

std::vector<int> PipelineExecutor::held_values() const {
  std::vector<int> values = parameter_order_;
  values.insert(values.end(), rank_buffers_.begin(), rank_buffers_.end());
  return values;
}

std::unordered_map<int, Tensor> PipelineExecutor::whole_state() {
  std::unordered_map<int, Tensor> whole = state_;
  if (!master_part_.defined()) return whole;
  zero_->all_gather_pieces(master_part_pieces_);
  // (A backend copy: on a GPU the buffer lives on the device.)
  for (std::size_t p = 0; p < untied_.size(); ++p) whole[untied_[p]] = copy_to(zero_->gradient_view(p), backend_);
  return whole;
}

void PipelineExecutor::restore_value(int value, const Tensor& whole) {
  if (auto held = state_.find(value); held != state_.end()) {
    PARTRAIN_CHECK(whole.shape() == held->second.shape(), "restore: " << graph_.value(value).name << " has shape "
                                                                      << shape_string(whole.shape()) << ", expected "
                                                                      << shape_string(held->second.shape()));
    backend_.copy(held->second, whole);
    return;
  }
  PARTRAIN_CHECK(master_is_sharded(value), "restore: " << graph_.value(value).name << " is not held by rank " << world_.rank());
  PARTRAIN_CHECK(whole.shape() == gradients_.at(value).shape(),
                 "restore: " << graph_.value(value).name << " has shape " << shape_string(whole.shape()) << ", expected "
                             << shape_string(gradients_.at(value).shape()));
  if (auto piece = master_pieces_.find(value); piece != master_pieces_.end())
    backend_.copy(piece->second.values, whole.reshape({-1}).slice_rows(piece->second.begin, piece->second.end));
  working_[value] = to_compute(whole);
}

Tensor PipelineExecutor::to_compute(const Tensor& host) const {
  return to_dtype(to_backend(host, backend_), compute_dtype(host.dtype()), backend_);
}

// ---- Helpers of the action methods ----

std::size_t PipelineExecutor::state_index(const Action& action) const {
  return static_cast<std::size_t>(action.chunk) * plan_.microbatches + action.microbatch;
}

int PipelineExecutor::peer_chunk(const Action& action) const {
  // Sender and receiver agree on the receiving model chunk; tags use its index on its rank.
  return plan_.local_chunk_index(receiver_chunk(plan_, world_.rank(), action));
}

Tensor PipelineExecutor::transferred_part(const Tensor& tensor, int value, const Action& action) const {
  const auto [begin, end] = samples_;
  if (has_batch_dim(graph_.value(value).type.shape))
    return tensor.slice_rows(action.sample_begin - begin, action.sample_end - begin);
  // An unbatched value (a loss piece) travels whole; Plan::validate allows it only between replicas
  // holding the same samples, so the transfer covers this replica's whole range.
  PARTRAIN_CHECK(action.sample_begin == begin && action.sample_end == end,
                 "executor: " << graph_.value(value).name << " has no batch dimension but rank " << world_.rank()
                              << " would exchange only samples [" << action.sample_begin << ", " << action.sample_end
                              << ") of [" << begin << ", " << end << ") with rank " << action.peer);
  return tensor;
}

std::int64_t PipelineExecutor::first_sample_in_step(int microbatch) const {
  const std::int64_t per_pipeline_replica = plan_.global_batch / plan_.pipeline_replicas;
  return placement_.pipeline_replica * per_pipeline_replica + microbatch * plan_.microbatch_size() + samples_.first;
}

RandomContext PipelineExecutor::random_context(std::int64_t step, int microbatch) const {
  RandomContext random;
  random.seed = options_.seed;
  random.step = static_cast<std::uint32_t>(step);
  // Keyed by the sample's index in the step, so any plan draws the same masks for it.
  random.first_sample = static_cast<std::uint32_t>(first_sample_in_step(microbatch));
  return random;
}

std::pair<std::int64_t, std::int64_t> PipelineExecutor::half_rows(int half) const {
  // Sub-pipelined TMP: the two sub-microbatches are rows [0, half) and [half, rows) of the rank's part.
  const std::int64_t middle = rows() / 2;
  return half == 0 ? std::pair<std::int64_t, std::int64_t>{0, middle} : std::pair<std::int64_t, std::int64_t>{middle, rows()};
}

std::array<ExecutionOptions, 2> PipelineExecutor::half_options(std::int64_t step, int microbatch) const {
  std::array<ExecutionOptions, 2> options;
  for (int h = 0; h < 2; ++h) {
    options[h] = {training_, random_context(step, microbatch), tensor_parallel_.get(), {}};
    options[h].random.first_sample += static_cast<std::uint32_t>(half_rows(h).first);
  }
  return options;
}

Tensor PipelineExecutor::concatenated(const std::array<TensorMap, 2>& halves, int value) const {
  const Tensor& first = halves[0].at(value);
  Shape shape = first.shape();
  shape[0] = rows();
  Tensor whole = backend_.empty(shape, first.dtype());
  for (int h = 0; h < 2; ++h)
    backend_.copy(whole.slice_rows(half_rows(h).first, half_rows(h).second), halves[h].at(value));
  return whole;
}

bool PipelineExecutor::partial_recompute(const StageProgram& program) const {
  // Stage-aware recomputation keeps the activations of the stage's later tasks and recomputes only
  // its first ones (the whole microbatch at once: sub-pipelined TMP recomputes the whole stage).
  return !program.recomputed.tasks.empty() && !sub_pipelined_;
}

void PipelineExecutor::run_forward_of(MicrobatchState& state, std::int64_t step, int microbatch,
                                      const Subgraph& subgraph, const std::unordered_set<int>* keep) {
  if (!sub_pipelined_) {
    for (const auto& [value, tensor] : working_) state.values[value] = tensor;
    for (const auto& [value, tensor] : constants_) state.values[value] = tensor;
    ExecutionOptions options{training_, random_context(step, microbatch), tensor_parallel_.get(), {}};
    options.keep = keep;
    run_forward(graph_, subgraph, state.values, backend_, options);
    return;
  }
  for (int h = 0; h < 2; ++h) {
    TensorMap& values = state.halves[h];
    values = working_;
    for (const auto& [value, tensor] : constants_) values[value] = tensor;
    for (int value : state.kept) values[value] = state.values.at(value).slice_rows(half_rows(h).first, half_rows(h).second);
  }
  run_forward_overlapped(graph_, subgraph, {&state.halves[0], &state.halves[1]}, backend_, half_options(step, microbatch));
}

void PipelineExecutor::release_sent_outputs(Pass& pass) {
  for (auto it = pass.sending.begin(); it != pass.sending.end();) {
    const bool done = std::all_of(it->requests.begin(), it->requests.end(),
                                  [&](std::size_t request) { return pass.pending[request].test(); });
    it = done ? pass.sending.erase(it) : std::next(it);
  }
}

// ---- The actions ----

PipelineExecutor::Pass PipelineExecutor::new_pass(std::int64_t step) const {
  Pass pass;
  pass.step = step;
  pass.microbatches.resize(static_cast<std::size_t>(plan_.microbatches) * programs_.size());
  return pass;
}

PipelineExecutor::Pass PipelineExecutor::begin_training_pass(std::int64_t step) {
  for (auto& [value, gradient] : gradients_) backend_.fill_zero(gradient);
  Pass pass = new_pass(step);
  if (buckets_) buckets_->begin(sub_pipelined_ ? 2 : 1);
  pass.activation_sends_left.assign(pass.microbatches.size(), 0);
  pass.activation_requests.assign(pass.microbatches.size(), {});
  for (const Action& action : actions_)
    if (action.kind == ActionKind::SendActivation) ++pass.activation_sends_left[state_index(action)];
  return pass;
}

void PipelineExecutor::post_held_sends(Pass& pass) {
  if (pass.held_sends.empty()) return;
  pass.pending[pass.held_sends_first_request] = world_.exchange(pass.held_sends, {});
  pass.held_sends.clear();
}

void PipelineExecutor::run_action(const Action& action, Pass& pass) {
  // Held sends go with the receives that follow them; before anything else they go alone.
  if (!action.is_send() && !action.is_receive()) post_held_sends(pass);
  switch (action.kind) {
    case ActionKind::Forward:
      return forward(action, pass);
    case ActionKind::Backward:
      return backward(action, pass);
    case ActionKind::BackwardInput:
      return backward_input(action, pass);
    case ActionKind::BackwardWeight:
      return backward_weight(action, pass);
    case ActionKind::Recompute:
      return recompute(action, pass);
    case ActionKind::SendActivation:
    case ActionKind::SendGradient:
      return send(action, pass);
    case ActionKind::ReceiveActivation:
    case ActionKind::ReceiveGradient:
      return receive(action, pass);
    case ActionKind::AllReduce:
      return all_reduce_gradients(pass);
    case ActionKind::Step:
      return optimizer_step(pass);
  }
}

void PipelineExecutor::receive(const Action& action, Pass& pass) {
  // The model chunk the action runs (the rank's only one except under the interleaved schedule).
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  const bool gradient = action.kind == ActionKind::ReceiveGradient;
  MicrobatchState& state = pass.microbatches[state_index(action)];
  const std::vector<int>& values = gradient ? program.gradients_received : program.received;
  TensorMap& into = gradient ? state.received_gradients : state.received;
  std::vector<comm::Request> requests;
  std::vector<comm::ReceiveSpec> receives;  // group_transfers_
  // zb_v's chunk S − 1 hands its outputs (and chunk S its input gradients) over on the same rank.
  const bool local = action.peer == world_.rank();
  std::vector<Tensor> handed_over;
  if (local) {
    auto found = pass.local_messages.find({gradient, action.microbatch, peer_chunk(action)});
    PARTRAIN_CHECK(found != pass.local_messages.end() && found->second.size() == values.size(),
                   "executor: rank " << world_.rank() << " receives " << action.to_string() << " from itself before sending it");
    handed_over = std::move(found->second);
    pass.local_messages.erase(found);
  }
  for (std::size_t k = 0; k < values.size(); ++k) {
    const int value = values[k];
    Tensor& tensor = into[value];
    if (!tensor.defined())
      tensor = backend_.empty(with_batch(graph_.value(value).type.shape, rows()), run_dtype(value));
    if (local) {
      backend_.copy(transferred_part(tensor, value, action), handed_over[k]);
      continue;
    }
    const int tag = message_tag(world_, action.microbatch, peer_chunk(action), plan_.virtual_stages, gradient);
    if (group_transfers_) receives.push_back({transferred_part(tensor, value, action), action.peer, tag});
    else requests.push_back(world_.receive(transferred_part(tensor, value, action), action.peer, tag));
  }
  if (group_transfers_ && !receives.empty()) {
    // The held sends and these receives start together (ncclGroupStart/End): neighbours that both
    // send before they receive cannot wait on each other. The sends' placeholders stay done.
    comm::Request grouped = world_.exchange(pass.held_sends, receives);
    pass.held_sends.clear();
    grouped.wait();
  }
  comm::wait_all(requests);
}

void PipelineExecutor::send(const Action& action, Pass& pass) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  const bool gradient = action.kind == ActionKind::SendGradient;
  const std::size_t index = state_index(action);
  MicrobatchState& state = pass.microbatches[index];
  const std::vector<int>& values = gradient ? program.gradients_sent : program.sent;
  const TensorMap& from = gradient ? state.outgoing_gradients : state.outputs;
  const bool tracked = !gradient && training_ && !pass.activation_sends_left.empty();
  const bool local = action.peer == world_.rank();  // zb_v: from chunk S − 1 to chunk S, or back
  for (int value : values) {
    const Tensor& tensor = from.at(value);
    if (local) {
      pass.local_messages[{gradient, action.microbatch, peer_chunk(action)}].push_back(
          copy_to(transferred_part(tensor, value, action), backend_));
      continue;
    }
    const int tag = message_tag(world_, action.microbatch, peer_chunk(action), plan_.virtual_stages, gradient);
    if (group_transfers_) {
      if (pass.held_sends.empty()) pass.held_sends_first_request = pass.pending.size();
      pass.held_sends.push_back({transferred_part(tensor, value, action), action.peer, tag});
      pass.pending.emplace_back();  // the spec holds the tensor until its exchange's request does
    } else {
      pass.pending.push_back(world_.send(transferred_part(tensor, value, action), action.peer, tag));
    }
    if (tracked) pass.activation_requests[index].push_back(pass.pending.size() - 1);
  }
  if (tracked && --pass.activation_sends_left[index] == 0) {
    // The microbatch's last send: its outputs the backward does not read go once sent.
    Pass::SendingOutputs sent;
    sent.requests = std::move(pass.activation_requests[index]);
    for (int value : program.sent) {
      if (std::binary_search(program.saved.begin(), program.saved.end(), value)) continue;
      auto found = state.outputs.find(value);
      if (found == state.outputs.end()) continue;
      sent.tensors.push_back(found->second);
      state.outputs.erase(found);
    }
    pass.sending.push_back(std::move(sent));
  }
}

void PipelineExecutor::forward(const Action& action, Pass& pass) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  MicrobatchState& state = pass.microbatches[state_index(action)];
  load_inputs(program, state, pass.step, action.microbatch);
  const bool free_during = training_ && evaluation_ == nullptr;  // evaluation reads values afterwards
  const std::unordered_set<int> keep =
      free_during ? forward_keep(program, action.activations_recomputed ? &state.kept : nullptr) : std::unordered_set<int>{};
  run_forward_of(state, pass.step, action.microbatch, program.subgraph, free_during ? &keep : nullptr);
  for (int value : program.sent) {  // relayed values came whole; the stage's own are in the halves
    auto whole = state.values.find(value);
    state.outputs[value] = whole != state.values.end() ? whole->second : concatenated(state.halves, value);
  }
  add_losses(program, state, pass);
  if (action.activations_recomputed) {  // keep only what the recomputation starts from (and the kept layers')
    TensorMap kept;
    for (int value : state.kept) kept[value] = state.values.at(value);
    if (partial_recompute(program))
      for (int value : program.kept_values)
        if (auto found = state.values.find(value); found != state.values.end()) kept[value] = found->second;
    state.values = std::move(kept);
    state.halves = {};
  } else if (training_) {  // keep only what the backward reads
    keep_saved_tensors(graph_, program, state.values, state.halves, &state.received);
  }
}

void PipelineExecutor::load_inputs(const StageProgram& program, MicrobatchState& state, std::int64_t step,
                                   int microbatch) {
  const std::int64_t first = step * plan_.global_batch + first_sample_in_step(microbatch);
  const io::NamedTensors batch = active_data_->samples(first, rows());
  for (int value : program.data_inputs) {
    auto found = batch.find(graph_.value(value).name);
    PARTRAIN_CHECK(found != batch.end(),
                   active_data_->path() << ": the data has no input '" << graph_.value(value).name << "'");
    state.values[value] = to_compute(found->second);
    state.kept.push_back(value);
  }
  for (const auto& [value, tensor] : state.received) {
    state.values[value] = tensor;
    state.kept.push_back(value);
  }
}

void PipelineExecutor::add_losses(const StageProgram& program, const MicrobatchState& state, Pass& pass) {
  const int pieces = sub_pipelined_ ? 2 : 1;  // each sub-microbatch is its own loss piece
  // The t ranks of a group share one loss. An evaluation reports its own terms (below), not these.
  if (program.loss >= 0 && placement_.tensor_rank == 0 && evaluation_ == nullptr) {
    for (int h = 0; h < pieces; ++h) {
      const std::int64_t piece = sub_pipelined_ ? half_rows(h).second - half_rows(h).first : rows();
      const TensorMap& values = sub_pipelined_ ? state.halves[h] : state.values;
      // A copy: the value itself may be released or reused before the step's end reads it.
      pass.loss_pieces.push_back({static_cast<double>(piece) / plan_.global_batch, copy_to(values.at(program.loss), backend_)});
    }
  }
  if (evaluation_ != nullptr)  // per loss piece: the rank's rows, or each sub-microbatch
    for (int h = 0; h < pieces; ++h)
      for (const auto& [term, task] : evaluation_terms_)
        if (std::find(program.subgraph.tasks.begin(), program.subgraph.tasks.end(), task) != program.subgraph.tasks.end())
          accumulate_loss_term(graph_, task, sub_pipelined_ ? state.halves[h] : state.values, backend_,
                               evaluation_top1_, evaluation_->terms[term]);
}

double PipelineExecutor::loss_sum(const Pass& pass) const {
  if (pass.loss_pieces.empty()) return 0;
  // Gathered on the device first, so that the host waits for the device once, not once a piece.
  const auto count = static_cast<std::int64_t>(pass.loss_pieces.size());
  const DType dtype = pass.loss_pieces.front().loss.dtype();
  const Tensor gathered = backend_.empty({count}, dtype);
  for (std::int64_t i = 0; i < count; ++i) {
    const Tensor& loss = pass.loss_pieces[static_cast<std::size_t>(i)].loss;
    PARTRAIN_CHECK(loss.numel() == 1 && loss.dtype() == dtype,
                   "executor: loss piece " << i << " is " << shape_string(loss.shape()) << " " << dtype_name(loss.dtype())
                                           << ", expected one " << dtype_name(dtype) << " element");
    backend_.copy(gathered.slice_rows(i, i + 1), loss);
  }
  const std::vector<float> losses = to_host(gathered, backend_).to_float_vector();
  double sum = 0;  // the pieces' order: the same sum as adding each when it was computed
  for (std::int64_t i = 0; i < count; ++i)
    sum += pass.loss_pieces[static_cast<std::size_t>(i)].weight * losses[static_cast<std::size_t>(i)];
  return sum;
}

void PipelineExecutor::recompute(const Action& action, Pass& pass) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  MicrobatchState& state = pass.microbatches[state_index(action)];
  // BatchNorm updated its running statistics in the first forward: keep them from changing twice.
  std::vector<std::pair<Tensor, Tensor>> saved;
  for (int value : program.buffers) saved.emplace_back(state_.at(value), copy_to(state_.at(value), backend_));
  const std::unordered_set<int> keep = forward_keep(program, nullptr);
  run_forward_of(state, pass.step, action.microbatch, partial_recompute(program) ? program.recomputed : program.subgraph,
                 &keep);
  for (auto& [live, copy] : saved) backend_.copy(live, copy);
  // One microbatch's saved tensors until its backward; the inputs it started from are no longer
  // needed unless the backward reads them.
  keep_saved_tensors(graph_, program, state.values, state.halves, nullptr);
}

void PipelineExecutor::run_backward_program(const Action& action, Pass& pass, const BackwardProgram& backward,
                                            std::span<const RecomputedSegment> segments, std::array<TensorMap, 2>& grads) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  MicrobatchState& state = pass.microbatches[state_index(action)];
  // In the step's last backward each completed gradient may start its bucket's all-reduce.
  std::function<void(int)> on_gradient;
  if (buckets_ && pass.in_last_backward) on_gradient = [this](int parameter) { buckets_->gradient_ready(parameter); };
  // Per-layer or selective recomputation runs forward segments again inside the backward: BatchNorm
  // updated its running statistics in the first forward, keep them from changing twice.
  std::vector<std::pair<Tensor, Tensor>> buffers;
  if (!segments.empty())
    for (int value : program.buffers) buffers.emplace_back(state_.at(value), copy_to(state_.at(value), backend_));
  if (sub_pipelined_) {
    std::array<ExecutionOptions, 2> backward_options = half_options(pass.step, action.microbatch);
    for (ExecutionOptions& option : backward_options) {
      option.training = true;
      option.on_parameter_gradient = on_gradient;
    }
    run_backward_overlapped(graph_, backward, segments, {&state.halves[0], &state.halves[1]}, {&grads[0], &grads[1]},
                            backend_, backward_options);
  } else {
    run_backward_recomputing(graph_, backward, segments, state.values, grads[0], backend_,
                             {true, random_context(pass.step, action.microbatch), tensor_parallel_.get(), on_gradient});
  }
  for (auto& [live, copy] : buffers) backend_.copy(live, copy);
}

// After a microbatch's backward (or its input half): what came from and went to the neighbouring
// stages is no longer needed (the outgoing gradients stay until sent).
void PipelineExecutor::release_transfers(MicrobatchState& state) {
  state.received.clear();
  state.outputs.clear();
  state.received_gradients.clear();
}

void PipelineExecutor::backward(const Action& action, Pass& pass) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  MicrobatchState& state = pass.microbatches[state_index(action)];
  std::array<TensorMap, 2> grads = seed_gradients(program, state);
  run_backward_program(action, pass, program.backward, program.segments, grads);
  collect_outgoing_gradients(program, state, grads);
  state.values.clear();
  state.halves = {};
  release_transfers(state);
}

void PipelineExecutor::backward_input(const Action& action, Pass& pass) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  MicrobatchState& state = pass.microbatches[state_index(action)];
  std::array<TensorMap, 2> grads = seed_gradients(program, state);
  run_backward_program(action, pass, program.split.input, program.input_segments, grads);
  collect_outgoing_gradients(program, state, grads);
  // Until its BackwardWeight the microbatch keeps the saved tensors the weight half reads and the
  // output gradients of its steps (Qi et al. 2024 §2: W's memory), nothing else.
  const std::unordered_set<int> keep(program.weight_saved.begin(), program.weight_saved.end());
  release_unsaved(graph_, state.values, keep);
  for (TensorMap& half : state.halves) release_unsaved(graph_, half, keep);
  for (TensorMap& half : grads)
    for (int value : program.backward.input_grads) half.erase(value);  // sent (outgoing_gradients holds them)
  state.weight_gradients = std::move(grads);
  release_transfers(state);
}

void PipelineExecutor::backward_weight(const Action& action, Pass& pass) {
  const StageProgram& program = programs_.at(static_cast<std::size_t>(action.chunk));
  MicrobatchState& state = pass.microbatches[state_index(action)];
  // No recomputed segment: their steps computed their parameter gradients in the input half.
  run_backward_program(action, pass, program.split.weight, {}, state.weight_gradients);
  state.values.clear();
  state.halves = {};
  state.weight_gradients = {};
}

std::array<TensorMap, 2> PipelineExecutor::seed_gradients(const StageProgram& program, const MicrobatchState& state) {
  // One backward per loss piece: the rank's rows, or the two sub-microbatches of sub-pipelined TMP.
  const int pieces = sub_pipelined_ ? 2 : 1;
  std::array<TensorMap, 2> grads;
  for (int p = 0; p < pieces; ++p) {
    const TensorMap& values = sub_pipelined_ ? state.halves[p] : state.values;
    const std::pair<std::int64_t, std::int64_t> range = sub_pipelined_ ? half_rows(p) : std::pair<std::int64_t, std::int64_t>{0, rows()};
    for (int value : program.backward.parameter_grads) grads[p][value] = gradients_.at(value);
    for (int value : program.backward.output_grads) {
      const Tensor& output = values.at(value);
      if (value == program.loss) {
        // fp16: the backward starts from the loss times the loss scale (unscaled in optimizer_step).
        const double weight = static_cast<double>(range.second - range.first) / plan_.global_batch *
                              (loss_scaler_ ? loss_scaler_->scale() : 1.0);
        grads[p][value] = to_backend(Tensor::full(output.shape(), weight, output.dtype()), backend_);
      } else if (auto found = state.received_gradients.find(value); found != state.received_gradients.end()) {
        grads[p][value] = sub_pipelined_ ? found->second.slice_rows(range.first, range.second) : found->second;
      } else {
        grads[p][value] = backend_.zeros(output.shape(), output.dtype());
      }
    }
  }
  return grads;
}

void PipelineExecutor::collect_outgoing_gradients(const StageProgram& program, MicrobatchState& state,
                                                  const std::array<TensorMap, 2>& grads) {
  for (int value : program.gradients_sent) {
    Tensor gradient;
    if (auto own = grads[0].find(value); own != grads[0].end() && own->second.defined())
      gradient = sub_pipelined_ ? concatenated(grads, value) : own->second;
    if (auto relayed = state.received_gradients.find(value); relayed != state.received_gradients.end()) {
      if (gradient.defined()) {
        backend_.accumulate(gradient, relayed->second);
      } else {
        gradient = relayed->second;
      }
    }
    if (!gradient.defined())
      gradient = backend_.zeros(with_batch(graph_.value(value).type.shape, rows()), run_dtype(value));
    state.outgoing_gradients[value] = gradient;
  }
}

void PipelineExecutor::all_reduce_gradients(Pass& pass) {
  // The stage's gradient reduction: an all-reduce, or ZeRO-1's reduce-scatter.
  if (buckets_) {  // started during the last backward: wait for the rest
    buckets_->finish(pass.step, clock_origin_, trace_);
    if (zero_) zero_gradients_ = zero_->reduced_parts();
    return;
  }
  std::vector<Tensor> tensors;
  for (int value : untied_) tensors.push_back(gradients_.at(value));
  if (zero_) {
    zero_gradients_ = zero_->reduce_scatter(tensors);
  } else if (!tensors.empty()) {
    stage_group_->all_reduce_coalesced(tensors);
  }
}

void PipelineExecutor::optimizer_step(Pass& pass) {
  // The step's last action: its sends (held ones posted by run_action) must have completed first
  // (every rank's list ends with it).
  comm::wait_all(pass.pending);
  pass.sending.clear();
  // Index and label checks of the step's kernels ran on the device without waiting; their verdict
  // reaches the host here, once a step, before the gradient norm needs the host anyway.
  backend_.check_device_errors();
  // The step's trace event starts when the backward's kernels and the gradient all-reduce are done
  // (a GPU queues them; the host waits a few lines on for the gradient norm anyway).
  backend_.synchronise();

  // Tied parameters, global-norm clipping, optimizer.
  const double step_start = now_us();
  if (tied_group_ && !tied_.empty()) {
    std::vector<Tensor> tensors;
    for (int value : tied_) tensors.push_back(gradients_.at(value));
    tied_group_->all_reduce_coalesced(tensors);
  }
  sum_sequence_parallel_gradients();
  // Every holder of a parameter has the same reduced gradient: count it once over the world. The
  // gradients are in the optimizer's order.
  std::vector<Tensor> gradients;
  std::vector<double> weights;
  if (zero_) {
    gradients = zero_gradients_;
    weights = piece_weights_;
  }
  for (std::size_t i = 0; i < parameter_order_.size(); ++i) {
    const bool tied = std::find(tied_.begin(), tied_.end(), parameter_order_[i]) != tied_.end();
    if (zero_ && !tied) continue;
    gradients.push_back(gradients_.at(parameter_order_[i]));
    weights.push_back(1.0 / holders_[i]);
  }
  inject_gradient_overflow(pass.step, gradients);
  // The world's sum of squares is also the overflow flag: an inf or NaN in any rank's gradients makes
  // it non-finite on every rank, so all ranks agree to skip the step without another all-reduce.
  const double sum_of_squares = world_.all_reduce_scalar(backend_.sum_of_squares(gradients, weights));
  pass.lr = lr_schedule_.at(pass.step);
  if (loss_scaler_ && !unscale_gradients(pass, sum_of_squares, gradients)) {
    trace_.push_back({"Step (skipped: overflow)", "optimizer", step_start - clock_origin_, now_us() - step_start, pass.step});
    return;
  }
  if (!loss_scaler_) pass.grad_norm = std::sqrt(sum_of_squares);
  optimizer_->step(gradients, pass.lr, clip_scale(pass.grad_norm, options_.grad_clip));
  if (zero_) {  // every rank's updated elements to every rank of the group
    if (master_part_.defined()) {
      // Gathered as the working copies (bf16 or f16), rounded by each shard's owner: half the bytes of f32.
      zero_->all_gather_pieces(master_part_pieces_, compute_dtype_);
      for (std::size_t p = 0; p < untied_.size(); ++p)
        working_[untied_[p]] = copy_to(zero_->gathered_view(p, compute_dtype_), backend_);
    } else {
      std::vector<Tensor> values;
      for (int value : untied_) values.push_back(state_.at(value));
      zero_->all_gather(values);
    }
    zero_gradients_.clear();
  }
  if (mixed_precision_) refresh_working_parameters();
  backend_.synchronise();  // the step's time includes the device's work
  trace_.push_back({"Step", "optimizer", step_start - clock_origin_, now_us() - step_start, pass.step});
}

void PipelineExecutor::retime_on_device(double step_start_us, int origin, std::span<const DeviceTimedEvent> events) {
  // The host's times of a GPU action are its launches; the device's marks give its work. The
  // device timeline is placed at the step's start on the host clock (the clocks are not otherwise
  // related), so the trace stays one timeline per rank.
  for (const DeviceTimedEvent& timed : events) {
    io::TraceEvent& event = trace_[timed.event];
    event.start_us = step_start_us - clock_origin_ + 1e6 * device_timer_->seconds_between(origin, timed.begin);
    event.duration_us = 1e6 * device_timer_->seconds_between(timed.begin, timed.end);
  }
}

bool PipelineExecutor::unscale_gradients(Pass& pass, double sum_of_squares, std::span<const Tensor> gradients) {
  // torch.amp.GradScaler: unscale_ before clipping, step() skipped on inf/NaN, then update(). The
  // learning-rate schedule follows the step index as a scheduler.step() after every scaler.step()
  // does; the optimizer's own step count (AdamW's bias correction) does not advance on a skip.
  const double scale = loss_scaler_->scale();
  pass.loss_scale = scale;
  pass.skipped = !std::isfinite(sum_of_squares);
  pass.grad_norm = std::sqrt(sum_of_squares) / scale;
  loss_scaler_->update(pass.skipped);
  if (pass.skipped) {
    zero_gradients_.clear();
    return false;
  }
  for (const Tensor& gradient : gradients) backend_.scale(gradient, 1.0 / scale);
  return true;
}

void PipelineExecutor::inject_gradient_overflow(std::int64_t step, std::span<const Tensor> gradients) {
  // PARTRAIN_FAULT_INJECT=gradient_overflow:RANK[:STEP] (STEP 1-based, as the log counts): an inf
  // in this rank's first gradient, as an fp16 overflow in its backward would leave.
  if (gradients.empty() || io::injected_fault_rank("gradient_overflow", step + 1) != world_.rank()) return;
  Tensor host = to_host(gradients.front(), backend_).clone();
  host.data<float>()[0] = std::numeric_limits<float>::infinity();
  backend_.copy(gradients.front(), host);
}

void PipelineExecutor::sum_sequence_parallel_gradients() {
  // Sequence parallelism (Korthikanti et al. 2022 §4.2.2): the parameters read on the rank's part of
  // the sequence (Sharding::sequence_parallel) got the gradient of that part only; summed over the
  // tensor-parallel group, every rank of it holds the whole one, as for any replicated parameter.
  // The sum commutes with the data-parallel and tied reductions, so it runs once per step after
  // them: on the whole gradients, or under ZeRO-1 on this rank's pieces of the untied ones (the
  // t ranks of a group hold the same pieces: their stages' local shapes and groups are alike).
  if (!tensor_group_) return;
  std::vector<Tensor> tensors;
  const auto sequence_parallel = [&](int value) { return graph_.value(value).sharding.sequence_parallel; };
  if (zero_) {
    const std::vector<ZeroPartition::Piece>& pieces = zero_->pieces();
    for (std::size_t k = 0; k < pieces.size(); ++k)
      if (sequence_parallel(untied_[pieces[k].parameter])) tensors.push_back(zero_gradients_.at(k));
  }
  for (int value : parameter_order_) {
    const bool tied = std::find(tied_.begin(), tied_.end(), value) != tied_.end();
    if (sequence_parallel(value) && (!zero_ || tied)) tensors.push_back(gradients_.at(value));
  }
  if (!tensors.empty()) tensor_group_->all_reduce_coalesced(tensors);
}

// ---- Passes ----

EvaluationResult PipelineExecutor::evaluate(const io::BatchSource& heldout, std::int64_t batches, bool top1) {
  // Every rank lists the same terms in the same order; each accumulates those its stage computes.
  EvaluationResult result;
  evaluation_terms_.clear();
  const std::vector<int> term_tasks = loss_term_tasks(graph_);
  for (std::size_t term = 0; term < term_tasks.size(); ++term) {
    result.terms.push_back({graph_.task(term_tasks[term]).name});
    for (const StageProgram& program : programs_) {
      const std::vector<int>& tasks = program.subgraph.tasks;  // the t ranks of a group share one loss
      if (placement_.tensor_rank == 0 && std::find(tasks.begin(), tasks.end(), term_tasks[term]) != tasks.end())
        evaluation_terms_.emplace_back(static_cast<int>(term), term_tasks[term]);
    }
  }
  // Each replica updated its BatchNorm running statistics from its own samples (as DDP without
  // SyncBatchNorm): evaluate every replica with their mean, so all replicas normalise alike.
  if (stage_group_->size() > 1 && !rank_buffers_.empty()) {
    std::vector<Tensor> buffers;
    for (int value : rank_buffers_) buffers.push_back(state_.at(value));
    stage_group_->all_reduce_coalesced(buffers);
    for (Tensor& buffer : buffers) backend_.scale(buffer, 1.0 / stage_group_->size());
  }
  active_data_ = &heldout;
  training_ = false;
  evaluation_ = &result;
  evaluation_top1_ = top1;
  const auto restore = [this] {
    active_data_ = &data_;
    training_ = true;
    evaluation_ = nullptr;
  };
  try {
    for (std::int64_t batch = 0; batch < batches; ++batch) {
      // The pass keeps no loss pieces: evaluation reports its own terms, not the training weighting.
      Pass pass = new_pass(batch);
      for (const Action& action : evaluation_actions_) run_action(action, pass);
      post_held_sends(pass);
      comm::wait_all(pass.pending);
      backend_.check_device_errors();  // once a batch, as once a training step
    }
  } catch (...) {
    restore();
    throw;
  }
  restore();
  for (LossTerm& term : result.terms) {  // the same order on every rank
    term.loss_sum = world_.all_reduce_scalar(term.loss_sum);
    term.count = world_.all_reduce_scalar(term.count);
    term.correct = world_.all_reduce_scalar(term.correct);
  }
  result.samples = batches * plan_.global_batch;
  return result;
}

StepResult PipelineExecutor::train_step(std::int64_t step) {
  const double start = now_us();
  CachingAllocator& allocator = backend_.allocator();
  allocator.reset_peak();
  Pass pass = begin_training_pass(step);
  std::vector<DeviceTimedEvent> device_timed;
  if (device_timer_) device_timer_->reset();
  const int origin = device_timer_ ? device_timer_->mark() : -1;
  for (std::size_t index = 0; index < actions_.size(); ++index) {
    const Action& action = actions_[index];
    const double action_start = now_us();
    const int begin = device_timer_ && action.kind != ActionKind::Step ? device_timer_->mark() : -1;
    pass.in_last_backward = index == last_backward_ || (last_backward_input_ > 0 && index == last_backward_input_);
    release_sent_outputs(pass);
    run_action(action, pass);
    pass.in_last_backward = false;
    if (action.kind == ActionKind::Step) continue;  // optimizer_step records its own trace event
    const char* category = action.is_compute() ? "compute" : "communication";
    std::string name = action_kind_name(action.kind);
    if (action.microbatch >= 0) name += " mb " + std::to_string(action.microbatch);
    if (plan_.virtual_stages > 1 && action.microbatch >= 0) name += " chunk " + std::to_string(action.chunk);
    trace_.push_back({name, category, action_start - clock_origin_, now_us() - action_start, step});
    if (begin >= 0) device_timed.push_back({trace_.size() - 1, begin, device_timer_->mark()});
  }
  if (device_timer_) retime_on_device(start, origin, device_timed);

  StepResult result;
  result.step = step;
  result.loss = world_.all_reduce_scalar(loss_sum(pass));
  result.grad_norm = pass.grad_norm;
  result.lr = pass.lr;
  result.loss_scale = pass.loss_scale;
  result.skipped = pass.skipped;
  result.seconds = world_.all_reduce_scalar((now_us() - start) * 1e-6, comm::ReduceOp::Max);
  result.rank_peak_memory_bytes = static_cast<double>(allocator.peak_bytes());
  result.peak_memory_bytes = world_.all_reduce_scalar(result.rank_peak_memory_bytes, comm::ReduceOp::Max);
  return result;
}

PipelineExecutor::OptimizerStateSnapshot PipelineExecutor::optimizer_state_snapshot() const {
  const std::vector<std::string> names = optimizer_->state_names();
  OptimizerStateSnapshot snapshot;
  auto states_of = [&](const std::string& name, const Shape& shape) {
    std::vector<Tensor> states;
    for (const std::string& state : names)
      states.push_back(optimizer_->has_state(name) ? to_host(optimizer_->state(name, state), backend_).clone() : Tensor::zeros(shape));
    return states;
  };
  for (int value : parameter_order_) {
    const std::string& name = graph_.value(value).name;
    const bool tied = std::find(tied_.begin(), tied_.end(), value) != tied_.end();
    if (zero_ && !tied) continue;
    snapshot.parts[value] = {0, -1, states_of(name, state_.at(value).shape())};
    snapshot.steps[value] = optimizer_->step_count(name);
  }
  if (!zero_) return snapshot;
  // ZeRO-1: this rank's pieces; the update counts agreed over the group (a member without a piece
  // of a parameter has none of its own).
  Tensor host_steps = Tensor::zeros({static_cast<std::int64_t>(untied_.size())});
  for (const ZeroPartition::Piece& piece : zero_->pieces()) {
    const int value = untied_[piece.parameter];
    const std::string& name = graph_.value(value).name;
    snapshot.parts[value] = {piece.begin, piece.end, states_of(name, {piece.end - piece.begin})};
    host_steps.data<float>()[piece.parameter] = static_cast<float>(optimizer_->step_count(name));
  }
  const Tensor steps = backend_.zeros(host_steps.shape());
  backend_.copy(steps, host_steps);
  stage_group_->all_reduce(steps, comm::ReduceOp::Max);
  host_steps = to_host(steps, backend_);
  for (std::size_t p = 0; p < untied_.size(); ++p)
    snapshot.steps[untied_[p]] = static_cast<std::int64_t>(host_steps.data<float>()[p]);
  return snapshot;
}

void PipelineExecutor::restore_optimizer_state(int value, const std::vector<Tensor>& states, std::int64_t steps) {
  const std::vector<std::string> names = optimizer_->state_names();
  PARTRAIN_CHECK(states.size() == names.size(), "restore_optimizer_state: " << states.size() << " states for "
                                                                            << names.size());
  const std::string& name = graph_.value(value).name;
  const auto untied = std::find(untied_.begin(), untied_.end(), value);
  if (zero_ && untied != untied_.end()) {
    const auto parameter = static_cast<std::size_t>(untied - untied_.begin());
    for (const ZeroPartition::Piece& piece : zero_->pieces()) {
      if (piece.parameter != parameter) continue;
      for (std::size_t k = 0; k < names.size(); ++k) optimizer_->set_state(name, names[k], ZeroPartition::view(states[k], piece));
      optimizer_->set_step_count(name, steps);
    }
    return;
  }
  for (std::size_t k = 0; k < names.size(); ++k) optimizer_->set_state(name, names[k], states[k]);
  optimizer_->set_step_count(name, steps);
}

}  // namespace partrain::runtime
