#pragma once
// The executor (docs/architecture.md §Runtime): runs one rank's schedule — forward,
// backward and recompute of its stage on its samples of each microbatch, non-blocking sends and
// blocking receives of activations and gradients (with RaNNC's redistribution of sample ranges
// between stages of unequal replica counts, and relaying of activations that skip stages), the
// gradient all-reduce over the stage's data-parallel group and over the stages sharing a tied
// parameter, global-norm clipping across all ranks, and the optimizer step.
//
// Numerics are independent of the plan: sample g of a step draws the same dropout masks wherever it
// runs, and the step loss is Σ over loss pieces of (samples in the piece / global batch) × the
// piece's mean loss, so a single-device run with the same pieces as microbatches computes the same
// losses and gradients up to floating-point summation order.
//
// Structure (as torch.distributed.pipelining's stage methods): run_action dispatches each action
// of the rank's list (plan/schedule.h) to one method per action kind — forward, backward,
// recompute, send, receive, all_reduce_gradients, optimizer_step — which share the state of the
// running pass (Pass: the microbatches, pending sends, loss pieces).
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "io/batch_source.h"
#include "io/chrome_trace.h"
#include "graph/interpreter.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "runtime/bucketed_all_reduce.h"
#include "runtime/evaluation.h"
#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer.h"
#include "runtime/runtime_options.h"
#include "runtime/stage_program.h"
#include "runtime/zero_partition.h"

namespace partrain::runtime {

/// What one optimizer step did, identical on every rank (reduced over the world).
struct StepResult {
  std::int64_t step = 0;
  double loss = 0;            // Σ (piece samples / global batch) × piece mean loss
  double grad_norm = 0;       // global L2 norm before clipping
  double lr = 0;
  double loss_scale = 0;      // fp16: the loss scale the step's backward used (0 otherwise)
  bool skipped = false;       // fp16: an inf or NaN in the gradients skipped the update (every rank alike)
  double seconds = 0;         // wall time of the step (max over ranks)
  double peak_memory_bytes = 0;  // max over ranks of the allocator's high-water mark
  double rank_peak_memory_bytes = 0;  // this rank's allocator high-water mark during the step
};

class PipelineExecutor {
 public:
  /// Sets up rank `world.rank()` of `plan`: its stage program (its model chunks' programs under the interleaved schedule), its share of `initial_values` (every
  /// Param and Buffer of the graph by value id — for a tensor-parallel plan `graph` is
  /// tensor_parallel_graph(model, t) and the values are this rank's parts; only this stage's are kept, copied), the optimizer
  /// and the communicators of its groups (collective over `world`: every rank constructs its
  /// executor at the same time). The plan says what runs (its precision and optimizer included);
  /// `options` only tune it. Throws partrain::Error when the world size differs from the plan's.
  PipelineExecutor(const Graph& graph, const Plan& plan, comm::Communicator& world, Backend& backend,
                   const io::BatchSource& data, const std::unordered_map<int, Tensor>& initial_values,
                   const RuntimeOptions& options);
  ~PipelineExecutor();

  /// Runs optimizer step `step` (0-based) on samples [step · B, (step + 1) · B) of the data stream.
  StepResult train_step(std::int64_t step);

  /// Evaluates `batches` global batches of `heldout` (samples [0, batches · B)) forward only in
  /// evaluation mode (no dropout, BatchNorm running statistics), through the same pipeline and
  /// sample pieces as training: every cross-entropy term of the loss as a sum and a count over all
  /// pieces (so the result does not depend on the plan) and, with `top1`, the positions whose
  /// logits' arg max is the label. Replicated stages first average their BatchNorm running
  /// statistics over the stage's data-parallel group. Collective over the world; the same result on
  /// every rank. Throws partrain::Error when the model's loss is not a sum of cross-entropies.
  EvaluationResult evaluate(const io::BatchSource& heldout, std::int64_t batches, bool top1 = false);

  /// This rank's parameters and buffers by value id that it holds whole (current values, f32 master
  /// copies on the backend's device; shared storage): every one, except under ZeRO-1 in mixed
  /// precision, where each rank of a stage's data-parallel group keeps only its shard of the untied
  /// parameters' f32 masters (Megatron-LM's distributed optimizer; ZeRO §5.1 counts the fp32 master
  /// weights as optimizer state): those are in sharded_masters(), and whole_state() gathers them.
  const std::unordered_map<int, Tensor>& state() const { return state_; }

  /// One sharded f32 master: elements [begin, end) of the flattened (tensor-parallel part of the)
  /// parameter, a 1-D view of this rank's master buffer on the backend.
  struct MasterPiece {
    std::int64_t begin = 0;
    std::int64_t end = 0;
    Tensor values;
  };
  /// The rank's shards of sharded f32 masters by parameter value id (see state(); empty unless the
  /// plan is ZeRO-1 in mixed precision over more than one replica). A parameter of the rank that is
  /// sharded but absent here has no element on this rank.
  const std::map<int, MasterPiece>& sharded_masters() const { return master_pieces_; }
  /// Whether parameter `value`'s f32 master is sharded over the stage's data-parallel group.
  bool master_is_sharded(int value) const;
  /// Every parameter and buffer of the rank by value id, whole and f32 on the backend: state() and
  /// the sharded masters all-gathered over the stage's data-parallel group (collective over it;
  /// it gathers through the flat gradient buffer, which is spent between steps).
  std::unordered_map<int, Tensor> whole_state();
  /// Every parameter and buffer value id of the rank (its chunks'), in a fixed order.
  std::vector<int> held_values() const;
  /// Sets parameter or buffer `value` (one of held_values()) to `whole` (f32, shaped like it, on the
  /// host or the backend): into state(), or for a sharded master into this rank's shard and the
  /// parameter's working copy. Then call refresh_working_parameters() (checkpoint restore).
  void restore_value(int value, const Tensor& whole);
  /// This rank's gradients by parameter value id: after train_step, the step's gradients reduced
  /// over the data-parallel and tied groups, before clipping (f32 on the backend's device). Under
  /// ZeRO-1 the untied ones are this rank's unreduced sums (the reduced ones exist only in parts).
  const std::unordered_map<int, Tensor>& gradients() const { return gradients_; }
  /// The gradient buckets of the data-parallel all-reduce or ZeRO-1 reduce-scatter (nullptr without
  /// data-parallel replicas).
  const BucketedAllReduce* gradient_buckets() const { return buckets_.get(); }
  /// Call after writing into state() (checkpoint restore): re-derives the bf16 working copies of
  /// the parameters under mixed precision.
  void refresh_working_parameters();
  /// The programs of the rank's model chunks: its stage's alone, or under the interleaved schedule
  /// model chunks s, s + S, ... of its pipeline stage s (Action::chunk indexes them).
  const std::vector<StageProgram>& programs() const { return programs_; }
  /// The backend every tensor of this executor lives on.
  Backend& backend() const { return backend_; }
  Placement placement() const { return placement_; }
  Optimizer& optimizer() { return *optimizer_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  /// The dynamic loss scaler of an fp16 plan (nullptr under fp32 and bf16): its scale and good-step
  /// count go into checkpoints.
  LossScaler* loss_scaler() { return loss_scaler_ ? &*loss_scaler_ : nullptr; }
  const LossScaler* loss_scaler() const { return loss_scaler_ ? &*loss_scaler_ : nullptr; }
  const std::vector<io::TraceEvent>& trace() const { return trace_; }
  /// True when the trace's compute and communication actions hold the time the device spent on them:
  /// on the CPU the host's clock (kernels run as they are called), on a GPU its own clock (events on
  /// the compute stream, read at the step's end; core/device_timer.h). What re-planning reads.
  bool traces_device_time() const { return backend_.device().is_cpu() || device_timer_ != nullptr; }
  /// The rank's action list (generate_schedule(plan)[rank]), what train_step runs.
  const std::vector<Action>& actions() const { return actions_; }

  /// The optimizer state this rank holds, by parameter value id: the state tensors
  /// (optimizer().state_names() order, f32 on the host, zeros before the first update) of elements
  /// [begin, end) of the parameter's flattened (tensor-parallel part of the) tensor — all of it
  /// (end -1), or under ZeRO-1 this rank's piece of an untied parameter (absent when it holds
  /// none) — and every parameter's update count. Collective over the stage's data-parallel group
  /// under ZeRO-1 (the counts are agreed on).
  struct OptimizerStatePart {
    std::int64_t begin = 0;
    std::int64_t end = -1;
    std::vector<Tensor> states;
  };
  struct OptimizerStateSnapshot {
    std::map<int, OptimizerStatePart> parts;
    std::map<int, std::int64_t> steps;
  };
  OptimizerStateSnapshot optimizer_state_snapshot() const;
  /// Restores parameter `value`'s optimizer state from whole (parameter-shaped) tensors in
  /// state_names() order and its update count; under ZeRO-1 the rank keeps its elements only.
  void restore_optimizer_state(int value, const std::vector<Tensor>& states, std::int64_t steps);

  /// Everything one microbatch (of one model chunk) holds on this rank between its forward and
  /// its backward.
  struct MicrobatchState {
    TensorMap values;               // forward values (only the inputs while a recomputed forward waits)
    TensorMap received;             // assembled activations from the previous stage
    TensorMap outputs;              // activations to send to the next stage
    TensorMap received_gradients;   // assembled gradients from the next stage
    TensorMap outgoing_gradients;   // gradients to send to the previous stage
    std::vector<int> kept;          // value ids kept for recomputation (data inputs and received)
    std::array<TensorMap, 2> halves;  // sub-pipelined TMP: each sub-microbatch's forward values
    /// Zero bubble: per loss piece, the gradients a BackwardInput left for its BackwardWeight.
    std::array<TensorMap, 2> weight_gradients;
  };
  /// The state one pass over an action list (a training step, or one batch of an evaluation)
  /// threads through its actions.
  struct Pass {
    std::int64_t step = 0;                      // training step or evaluation batch: which samples, which dropout masks
    std::vector<MicrobatchState> microbatches;  // by state_index: chunk-major, then microbatch
    std::vector<comm::Request> pending;         // the pass's non-blocking sends
    // Grouped transfers (group_transfers_): the sends held back to be posted with the next
    // receives in one exchange, or alone before the next other action. Each has a placeholder in
    // `pending` (a done request); the exchange's request takes the first one's place.
    std::vector<comm::SendSpec> held_sends;
    std::size_t held_sends_first_request = 0;
    // This rank's loss pieces of a training step, kept on the backend and read once a step by
    // loss_sum(): reading each on the host would stop a GPU at every microbatch.
    struct LossPiece {
      double weight = 0;  // piece samples / global batch
      Tensor loss;        // a copy of the piece's mean loss (one element), on the backend's device
    };
    std::vector<LossPiece> loss_pieces;
    bool in_last_backward = false;              // the action running is the step's last Backward
    // A stage's outputs that its backward does not read are dropped once they have been sent
    // (Korthikanti et al. 2022 §4: only the saved tensors wait for the backward). Per microbatch
    // state: SendActivation actions still to come and the requests already issued; empty when the
    // pass does not track its sends (evaluation, or a test running single actions).
    std::vector<int> activation_sends_left;
    std::vector<std::vector<std::size_t>> activation_requests;
    struct SendingOutputs {
      std::vector<std::size_t> requests;  // indices into pending
      std::vector<Tensor> tensors;        // held until every request has completed
    };
    std::vector<SendingOutputs> sending;
    /// zb_v: messages a rank sends to itself (its chunk S − 1 to its chunk S, gradients back), by
    /// (gradient?, microbatch, receiving local chunk), one tensor per value in send order.
    std::map<std::tuple<bool, int, int>, std::vector<Tensor>> local_messages;
    double grad_norm = 0;                       // set by the Step action: global L2 norm before clipping
    double lr = 0;                              // set by the Step action
    double loss_scale = 0;                      // set by the Step action under fp16
    bool skipped = false;                       // set by the Step action: fp16 overflow, no update
  };
  /// The pass of training step `step`: the gradients zeroed, the overlapped all-reduce's buckets
  /// armed, the activation sends counted (so that sent outputs are dropped once sent).
  Pass begin_training_pass(std::int64_t step);
  /// Runs one action of the rank's list on `pass`: dispatches to the action kind's method. train_step
  /// and evaluate run their lists through it; tests run single actions of a one-stage plan.
  void run_action(const Action& action, Pass& pass);
  /// This rank's Σ (piece samples / global batch) × piece mean loss over the loss pieces `pass` has
  /// computed so far, summed in the order they were computed; one copy to the host for all of them.
  double loss_sum(const Pass& pass) const;

 private:
  const Graph& graph_;
  const Plan& plan_;
  comm::Communicator& world_;
  Backend& backend_;
  const io::BatchSource& data_;
  RuntimeOptions options_;
  Placement placement_;
  std::pair<std::int64_t, std::int64_t> samples_;  // this replica's samples [begin, end) of each microbatch
  std::vector<StageProgram> programs_;          // the rank's model chunks (one without interleaving)
  std::vector<int> rank_buffers_;               // Buffer values of all the rank's chunks
  std::vector<Action> actions_;
  std::vector<Action> evaluation_actions_;      // the forward part of actions_
  const io::BatchSource* active_data_ = nullptr;  // training or held-out data of the running pass
  EvaluationResult* evaluation_ = nullptr;        // what the running evaluation accumulates into
  std::vector<std::pair<int, int>> evaluation_terms_;  // (index in evaluation_->terms, task) of this stage
  bool evaluation_top1_ = false;
  bool training_ = true;
  std::unordered_map<int, Tensor> state_;       // params and buffers (f32 masters)
  std::unordered_map<int, Tensor> working_;     // what forward/backward read: bf16 params under mixed precision
  std::unordered_map<int, Tensor> constants_;   // the graph's Const values on the backend's device
  bool mixed_precision_ = false;                // the plan's precision is bf16 or fp16
  DType compute_dtype_ = DType::F32;            // what f32 values are computed in: f32, bf16 or f16
  std::optional<LossScaler> loss_scaler_;       // fp16 plans: dynamic loss scaling
  std::vector<DType> value_dtypes_;             // per value id: its dtype at run time (see value_dtypes)
  bool sub_pipelined_ = false;                  // Merak's sub-pipelined TMP on this rank's stage
  bool group_transfers_ = false;                // RuntimeOptions::group_transfers, or the world's sends wait
  std::unordered_map<int, Tensor> gradients_;   // param value id -> accumulated gradient
  std::vector<int> parameter_order_;            // optimizer order (param value ids): the rank's chunks' parameters, each once
  std::vector<double> holders_;                 // per parameter_order_: ranks holding the parameter
  std::vector<int> tied_;                       // parameters shared with other stages
  std::vector<int> untied_;
  std::unique_ptr<comm::Communicator> stage_group_;   // data parallel: the stage's replicas at this tensor rank
  std::unique_ptr<comm::Communicator> tied_group_;
  std::unique_ptr<comm::Communicator> tensor_group_;  // tensor parallel: the t ranks of this replica
  std::unique_ptr<TensorParallelGroup> tensor_parallel_;  // what the kernels of the stage's communication tasks use
  std::unique_ptr<Optimizer> optimizer_;
  // ZeRO-1 (plan.zero = 1): the untied parameters partitioned over the stage group; the optimizer
  // holds this rank's pieces of them (first) and the tied parameters whole (after).
  std::unique_ptr<ZeroPartition> zero_;
  std::vector<Tensor> zero_gradients_;          // this step's reduce-scattered pieces
  // ZeRO-1 in mixed precision: the f32 masters of the untied parameters, this rank's elements only
  // (zero_->pieces() order, one buffer); state_ holds them no more and working_ is gathered from them.
  Tensor master_part_;
  std::vector<Tensor> master_part_pieces_;      // per piece: its view of master_part_
  std::map<int, MasterPiece> master_pieces_;    // the same by parameter value id
  std::vector<double> piece_weights_;           // per piece: 1 / ranks holding the same elements
  // The overlapped, bucketed all-reduce (ZeRO-1: reduce-scatter) of the untied gradients over the
  // stage group, when the schedule has an AllReduce; it starts during the step's last Backward.
  std::unique_ptr<BucketedAllReduce> buckets_;
  std::size_t last_backward_ = 0;               // index in actions_ of the step's last Backward (or BackwardWeight)
  std::size_t last_backward_input_ = 0;         // index in actions_ of the step's last BackwardInput (zero bubble)
  LearningRateSchedule lr_schedule_;
  std::vector<io::TraceEvent> trace_;
  double clock_origin_ = 0;
  // A GPU's clock for the actions of train_step (nullptr on the CPU): each action's trace event is
  // retimed from its marks once the step has ended (retime_on_device).
  struct DeviceTimedEvent {
    std::size_t event;  // index in trace_
    int begin, end;     // the device timer's marks around the action
  };
  std::unique_ptr<DeviceTimer> device_timer_;
  void retime_on_device(double step_start_us, int origin, std::span<const DeviceTimedEvent> events);

  // ---- Construction steps, in the constructor's order (the collective ones in the same order on every rank) ----
  // The rank's model chunks among every stage's `programs`, and their parameters and buffers.
  void select_chunks(const std::vector<StageProgram>& programs);
  // The rank's action list, its forward part (evaluation) and the index of its last Backward.
  void schedule_actions();
  // This rank's copies of its parameters and buffers, the zeroed gradients, the working copies,
  // the constants, and whether the stage runs sub-pipelined TMP.
  void load_initial_values(const std::unordered_map<int, Tensor>& initial_values);
  // The communicators of the tied, data-parallel and tensor-parallel groups (collective over the
  // world). `stages_of`: parameter -> pipeline stages reading it.
  void create_groups(const std::map<int, std::vector<int>>& stages_of);
  // The tied and untied parameters, and how many ranks hold each.
  void classify_parameters(const std::map<int, std::vector<int>>& stages_of);
  // The optimizer over the rank's parameters, under ZeRO-1 over its pieces of the untied ones (the
  // partition, collective over the stage group, has the overlapped buckets of `completion` as
  // segments when `bucketed`).
  void create_optimizer(const std::map<int, std::vector<int>>& stages_of, bool bucketed,
                        const std::vector<GradientCompletion>& completion);
  // DDP's overlapped reduction of the untied gradients in buckets of `completion` order (when
  // `bucketed`: the schedule reduces over a data-parallel group and the stage runs one chunk).
  void create_gradient_buckets(bool bucketed, const std::vector<GradientCompletion>& completion);

  // ---- One method per action kind (run_action dispatches) ----
  void forward(const Action& action, Pass& pass);
  void backward(const Action& action, Pass& pass);
  /// Zero-bubble halves of a backward (StageProgram::split): the input gradients (sent to the
  /// previous stage), keeping what the weight half reads; then, later, the parameter gradients.
  void backward_input(const Action& action, Pass& pass);
  void backward_weight(const Action& action, Pass& pass);
  static void release_transfers(MicrobatchState& state);
  /// Runs `program` (a whole backward or one half) on the action's microbatch with its recomputed
  /// `segments`, the gradient maps `grads` (one per loss piece) seeded; parameter gradients are
  /// handed to the overlapped all-reduce during the step's last backward.
  void run_backward_program(const Action& action, Pass& pass, const BackwardProgram& program,
                            std::span<const RecomputedSegment> segments, std::array<TensorMap, 2>& grads);
  void recompute(const Action& action, Pass& pass);
  void send(const Action& action, Pass& pass);      // SendActivation, SendGradient
  void receive(const Action& action, Pass& pass);   // ReceiveActivation, ReceiveGradient
  void all_reduce_gradients(Pass& pass);
  void optimizer_step(Pass& pass);
  /// fp16: from the world's `sum_of_squares` of the (loss-scaled) gradients, whether the step may
  /// update: false on an overflow (pass.skipped; the scale backed off), else the gradients divided
  /// by the scale and pass.grad_norm the unscaled norm. Updates the loss scaler either way.
  bool unscale_gradients(Pass& pass, double sum_of_squares, std::span<const Tensor> gradients);
  /// The test hook PARTRAIN_FAULT_INJECT=gradient_overflow:RANK[:STEP] (io/fault_injection.h).
  void inject_gradient_overflow(std::int64_t step, std::span<const Tensor> gradients);
  /// Sums the gradients of the sequence-parallel parameters over the tensor-parallel group (part of
  /// the Step action, after the data-parallel reduction).
  void sum_sequence_parallel_gradients();

  // ---- Helpers of the action methods ----
  // A pass over step (or evaluation batch) `step` with an empty state per (model chunk, microbatch).
  Pass new_pass(std::int64_t step) const;
  /// The dtype a value of graph dtype `dtype` has at run time (f32 -> bf16 under mixed precision).
  DType compute_dtype(DType dtype) const;
  /// The dtype value `value` has at run time: what its producer computes it in (under mixed precision
  /// bf16 for most activations, f32 for a loss), the dtype a receiving stage allocates for it and
  /// for its gradient.
  DType run_dtype(int value) const { return value_dtypes_.at(static_cast<std::size_t>(value)); }
  /// A host data tensor on the device in its compute dtype.
  Tensor to_compute(const Tensor& host) const;
  // Rows of this replica's part of a microbatch.
  std::int64_t rows() const { return samples_.second - samples_.first; }
  // Index within the step of this rank's first sample of `microbatch` (pipeline replica, then
  // microbatch, then this stage replica's rows): what keys the data and the dropout masks.
  std::int64_t first_sample_in_step(int microbatch) const;
  // The dropout masks of microbatch `microbatch` of step `step`, keyed by the global sample index.
  RandomContext random_context(std::int64_t step, int microbatch) const;
  // Sub-pipelined TMP: rows [begin, end) of sub-microbatch `half` (0 or 1) of the rank's part.
  std::pair<std::int64_t, std::int64_t> half_rows(int half) const;
  // Sub-pipelined TMP: the execution options of the two sub-microbatches.
  std::array<ExecutionOptions, 2> half_options(std::int64_t step, int microbatch) const;
  // A tensor of the rank's whole part of the microbatch from the two halves' (rows concatenated).
  Tensor concatenated(const std::array<TensorMap, 2>& halves, int value) const;
  // Stage-aware recomputation of `program` recomputes only its first tasks.
  bool partial_recompute(const StageProgram& program) const;
  // Runs `subgraph` forward on `state` (whole, or as two sub-microbatches). `keep`: free every other
  // value as soon as the forward no longer needs it (nullptr: keep all).
  void run_forward_of(MicrobatchState& state, std::int64_t step, int microbatch, const Subgraph& subgraph,
                      const std::unordered_set<int>* keep);
  // The part of `tensor` (this replica's rows of `value`) that `action` sends or receives: its rows
  // [sample_begin, sample_end), or the whole tensor for a value without a batch dimension.
  Tensor transferred_part(const Tensor& tensor, int value, const Action& action) const;
  // Index of the (chunk, microbatch) state of `action` in Pass::microbatches.
  std::size_t state_index(const Action& action) const;
  // The receiving model chunk of a send or receive, as an index among its rank's chunks.
  int peer_chunk(const Action& action) const;
  // Forward: the microbatch's data inputs (this replica's rows of the step's samples) and received
  // activations into its values (and its kept list, what a recomputation starts from).
  void load_inputs(const StageProgram& program, MicrobatchState& state, std::int64_t step, int microbatch);
  // Forward: adds the microbatch's loss pieces to the pass's loss sum, and in an evaluation its
  // loss terms to the result.
  void add_losses(const StageProgram& program, const MicrobatchState& state, Pass& pass);
  // Backward: per loss piece, the gradients the backward starts from — the accumulated parameter
  // gradients, the loss's weight (piece samples / global batch), the received output gradients.
  std::array<TensorMap, 2> seed_gradients(const StageProgram& program, const MicrobatchState& state);
  // Backward: the input gradients to send to the previous stage (the stage's own plus the relayed
  // ones) into state.outgoing_gradients.
  void collect_outgoing_gradients(const StageProgram& program, MicrobatchState& state,
                                  const std::array<TensorMap, 2>& grads);
  // Drops the sent outputs whose requests have all completed (polls, never blocks).
  void release_sent_outputs(Pass& pass);
  /// Posts the held sends (group_transfers_) as one exchange of sends only, its request in the
  /// first one's placeholder; nothing when none are held.
  void post_held_sends(Pass& pass);
};

}  // namespace partrain::runtime
