#pragma once
// The operator graph: Values (tensors with a symbolic batch dimension) and Tasks (ops), ONNX-like.
// Models build forward graphs at operator granularity; partitioners read them; the runtime runs
// convex subgraphs of them (stages). Tasks are appended in topological order, so task ids are a
// topological order of the graph.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "core/attributes.h"
#include "graph/op_schema.h"

namespace partrain {

/// Role of a value. Input and Label are fed per sample (they carry the batch dimension); Param is
/// trainable; Buffer is non-trainable state updated by the model (BatchNorm running statistics);
/// Const is fixed data; Activation is produced by a task.
enum class ValueKind : std::uint8_t { Input, Label, Param, Buffer, Const, Activation };
const char* value_kind_name(ValueKind kind);

/// How a tensor-parallel graph holds a parameter (graph/tensor_parallel.h): each of the `parts`
/// ranks of the group holds 1/parts of dimension `axis` of the whole tensor. The dimension is viewed
/// as [blocks, parts, size / (blocks · parts)] and rank r holds [:, r, :] — blocks > 1 for fused
/// weights such as GPT-2's c_attn, whose query, key and value columns are each split across the
/// ranks. The Value's shape is the rank's local shape; axis -1 (parts 1): whole on every rank.
///
/// `padding`: rows of zeros appended to dimension `axis` of the whole tensor before it is split
/// (blocks 1): Megatron-LM's vocabulary padding (--make-vocab-size-divisible-by), which makes the
/// vocabulary rows of the embedding / LM head and the MLM decoder bias divide by the group. The
/// whole tensor (whole_shape, checkpoints, exports) is the unpadded one; the last ranks' parts end
/// in the padding rows, which stay zero (the loss masks their logits, so they get no gradient).
///
/// `sequence_parallel`: a whole parameter (not sharded) that tasks read on the rank's part of the
/// sequence under sequence parallelism (LayerNorm weights, row-parallel biases; Korthikanti et al.
/// 2022 §4.2.2): each rank's gradient covers only its part of the sequence, and the gradients are
/// summed over the tensor-parallel group before the optimizer step (Megatron-LM all-reduces its
/// "sequence-parallel" parameters' gradients likewise). The value is the same on every rank.
struct Sharding {
  int axis = -1;
  int parts = 1;
  int blocks = 1;
  bool sequence_parallel = false;
  std::int64_t padding = 0;
  bool sharded() const { return parts > 1; }
  bool operator==(const Sharding&) const = default;
};

struct Value {
  int id = -1;
  std::string name;
  ValueKind kind = ValueKind::Activation;
  TensorType type;
  int producer = -1;            // task id, -1 unless an activation
  std::vector<int> consumers;   // task ids in ascending (topological) order, one entry per use
  Sharding sharding;            // Param values of a tensor-parallel graph: the rank's part
};

/// Costs of a task for one sample (batch size 1) — the analytic cost model scales them by the batch
/// size for batch-dependent tasks. FLOPs count a multiply-add as 2.
struct TaskCost {
  double forward_flops = 0;      // forward FLOPs at batch size 1
  double activation_bytes = 0;   // bytes of the task's outputs at batch size 1
  double parameter_bytes = 0;    // bytes of the Param values the task reads
  /// Bytes all-reduced over the tensor-parallel group at batch size 1 (communication tasks of a
  /// tensor-parallel graph): in the forward pass and in the backward pass. Sequence parallelism's
  /// all-gathers and reduce-scatters count as the all-reduce moving as much (half the whole tensor).
  double forward_allreduce_bytes = 0;
  double backward_allreduce_bytes = 0;
};

/// What a model builder says about a task for tensor parallelism (Megatron-LM, Shoeybi et al.
/// 2019 §3); the graph of one device ignores it, graph/tensor_parallel.h reads it.
///  * ColumnParallel: a Gemm whose output features are split across the group (QKV, MLP-up);
///    `blocks` > 1 when the weight fuses that many matrices side by side (GPT-2 c_attn: 3).
///  * RowParallel: a Gemm whose input features are split (attention output, MLP-down); its partial
///    sums are all-reduced before the bias is added.
///  * VocabularyParallel: a Gather from an embedding table or a MatMul with it transposed (the tied
///    LM head / MLM decoder) whose vocabulary rows are split across the group; the table is padded
///    to a multiple of `vocab_divisible_by` × t rows (Megatron-LM's --make-vocab-size-divisible-by).
struct TensorParallelHint {
  enum class Kind : std::uint8_t { None, ColumnParallel, RowParallel, VocabularyParallel };
  Kind kind = Kind::None;
  int blocks = 1;
  std::int64_t vocab_divisible_by = 1;
};

struct Task {
  int id = -1;
  std::string name;             // unique in the graph; also seeds the task's random stream
  OpType op = OpType::Count;
  Attributes attributes;
  std::vector<int> inputs;
  std::vector<int> outputs;
  /// RaNNC §III-A: a constant task depends on no Input or Label (only on parameters, buffers and
  /// constants), so its output does not change with the batch.
  bool constant = false;
  TaskCost cost;
  /// Not part of the graph's hash: it changes nothing until the tensor-parallel transformation.
  TensorParallelHint tensor_parallel;
};

class Graph {
 public:
  // ---------------- building ----------------
  /// Adds a per-sample input / label. The shape normally starts with kBatch.
  int add_input(const std::string& name, const Shape& shape, DType dtype = DType::F32);
  int add_label(const std::string& name, const Shape& shape, DType dtype = DType::I64);
  /// Adds a trainable parameter (f32, concrete shape).
  int add_parameter(const std::string& name, const Shape& shape);
  /// Adds non-trainable state (f32, concrete shape), e.g. BatchNorm running statistics.
  int add_buffer(const std::string& name, const Shape& shape);
  /// Adds fixed data; the graph keeps the tensor (host).
  int add_constant(const std::string& name, const Tensor& value);
  /// Appends a task; infers its output types and costs. Throws partrain::Error naming the task on
  /// unknown inputs, a duplicate name or a shape error. Returns the output value ids (named after
  /// the task, ":1", ":2", ... for further outputs).
  std::vector<int> add_task(OpType op, const std::string& name, const std::vector<int>& inputs,
                            const Attributes& attributes = {});
  /// add_task for single-output ops: returns the output value id.
  int add(OpType op, const std::string& name, const std::vector<int>& inputs, const Attributes& attributes = {});
  /// Marks a value as a graph output (e.g. the loss).
  void mark_output(int value);
  /// Records how the task producing `value` splits under tensor parallelism (model builders).
  void hint_tensor_parallel(int value, TensorParallelHint hint);
  /// Records that Param `value` is the rank's part of a sharded parameter (the tensor-parallel
  /// transformation; the value's shape is already the local shape).
  void set_sharding(int value, const Sharding& sharding);

  // ---------------- reading ----------------
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Task>& tasks() const { return tasks_; }
  const Value& value(int id) const;
  const Task& task(int id) const;
  const std::vector<int>& outputs() const { return outputs_; }
  bool is_output(int value) const;
  /// Value id by name; throws partrain::Error if absent.
  int value_id(const std::string& name) const;
  /// Value ids of every Param, in creation order.
  std::vector<int> parameters() const;
  /// Total number of trainable parameter elements.
  std::int64_t parameter_count() const;
  /// Constant data of a Const value.
  const Tensor& constant_data(int value) const;

  /// Topological order of the given tasks (Kahn's algorithm over the edges among them), ties
  /// broken by id. Throws partrain::Error on a cycle (impossible for graphs built by add_task).
  std::vector<int> topological_order(std::span<const int> tasks) const;
  /// Stable 64-bit hash of the structure: op types, attributes, value kinds, shapes, dtypes and
  /// connectivity in task order (not names). Equal graphs hash equally across runs and machines.
  std::uint64_t hash() const;

 private:
  int add_value(const std::string& name, ValueKind kind, const TensorType& type);

  std::vector<Value> values_;
  std::vector<Task> tasks_;
  std::vector<int> outputs_;
  std::unordered_map<std::string, int> value_by_name_;
  std::unordered_map<std::string, int> task_by_name_;
  std::unordered_map<int, Tensor> constants_;
};

/// FNV-1a 64-bit hash of bytes, continuing from `seed` (stable across platforms).
std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t seed = 1469598103934665603ull);
/// 32-bit stream id of a name (used to seed a task's random numbers).
std::uint32_t name_stream(const std::string& name);

}  // namespace partrain
