#include "graph/tensor_parallel.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <numeric>

#include "core/error.h"

namespace partrain {

namespace {

// How an activation of the original graph exists on each rank of the group.
struct Layout {
  bool split = false;     // false: replicated (the whole tensor on every rank)
  int axis = -1;          // split: the rank holds 1/t of this dimension
  bool sequence = false;  // split by sequence parallelism (axis: the sequence), not by a layer's features or heads
  std::int64_t padding = 0;  // vocabulary padding: the split dimension is this much longer than the whole tensor's
};

// Ops that compute each position of the sequence on its own: under sequence parallelism they run on
// the rank's part of the sequence (Korthikanti et al. §4.2.2: LayerNorm, dropout, residual adds;
// and the head's per-token dense layers). Any other op reading a sequence-split tensor gets it
// gathered whole first.
bool per_position(OpType op) {
  switch (op) {
    case OpType::Relu: case OpType::Gelu: case OpType::Tanh: case OpType::Scale: case OpType::Dropout:
    case OpType::Add: case OpType::Sub: case OpType::Mul: case OpType::LayerNorm: case OpType::Gemm:
      return true;
    default:
      return false;
  }
}

std::int64_t product(const Shape& shape, std::size_t begin, std::size_t end) {
  std::int64_t result = 1;
  for (std::size_t d = begin; d < end; ++d) result *= shape[d];
  return result;
}

class Transformation {
 public:
  Transformation(const Graph& graph, int degree, bool sequence_parallel)
      : graph_(graph), degree_(degree), sequence_parallel_(sequence_parallel), map_(graph.values().size(), -1),
        layout_(graph.values().size()) {}

  Graph run() {
    // Data inputs first, in the original order: they exist even when no task of a stage reads them.
    for (const Value& value : graph_.values()) {
      if (value.kind == ValueKind::Input) map_[value.id] = out_.add_input(value.name, value.type.shape, value.type.dtype);
      if (value.kind == ValueKind::Label) map_[value.id] = out_.add_label(value.name, value.type.shape, value.type.dtype);
    }
    bool hinted = false;
    for (const Task& task : graph_.tasks()) {
      hinted = hinted || task.tensor_parallel.kind != TensorParallelHint::Kind::None;
      transform(task);
    }
    PARTRAIN_CHECK(hinted, "tensor parallelism: the model has no tensor-parallel layer (only BERT and GPT "
                           "transformer layers split across ranks); tensor_parallel must be 1, got "
                               << degree_);
    for (int output : graph_.outputs()) {
      PARTRAIN_CHECK(!layout_[output].split, "tensor parallelism: graph output '" << graph_.value(output).name
                                                                                  << "' would be split across ranks");
      out_.mark_output(map_[output]);
    }
    return std::move(out_);
  }

 private:
  const Graph& graph_;
  const int degree_;
  const bool sequence_parallel_;
  Graph out_;
  std::vector<int> map_;        // original value id -> new value id
  std::vector<Layout> layout_;  // original activation -> its layout on the ranks
  std::map<int, int> copies_;   // original value -> its TensorParallelCopy (or SequenceParallelAllGather) output
  std::map<int, int> gathers_;  // original sequence-split value -> its SequenceParallelGather output (whole)

  [[noreturn]] void fail(const Task& task, const std::string& message) const {
    PARTRAIN_FAIL("tensor parallelism (" << degree_ << " ranks" << (sequence_parallel_ ? ", sequence parallel" : "")
                                         << "): task '" << task.name << "' (" << op_name(task.op) << "): " << message);
  }

  // The new id of a Param, Buffer or Const, created at its first use; a Param gets `sharding`
  // there (later uses must ask for the same one).
  int leaf(int value, const Task& task, Sharding sharding = {}) {
    const Value& v = graph_.value(value);
    if (map_[value] >= 0) {
      if (v.kind == ValueKind::Param && !(out_.value(map_[value]).sharding == sharding))
        fail(task, "parameter '" + v.name + "' is used with two different shardings" +
                       (sharding.sequence_parallel != out_.value(map_[value]).sharding.sequence_parallel
                            ? " (on the rank's part of the sequence and on the whole sequence)"
                            : ""));
      return map_[value];
    }
    switch (v.kind) {
      case ValueKind::Param: {
        Shape shape = v.type.shape;
        if (sharding.sharded()) {
          const std::int64_t size = shape.at(static_cast<std::size_t>(sharding.axis)) + sharding.padding;
          if (size % (static_cast<std::int64_t>(sharding.blocks) * sharding.parts) != 0)
            fail(task, "parameter '" + v.name + "' dimension " + std::to_string(sharding.axis) + " of size " +
                           std::to_string(size) + (sharding.blocks > 1 ? " (" + std::to_string(sharding.blocks) + " fused blocks)" : "") +
                           " does not divide into " + std::to_string(sharding.parts) + " parts");
          shape[static_cast<std::size_t>(sharding.axis)] = size / sharding.parts;
        }
        map_[value] = out_.add_parameter(v.name, shape);
        if (sharding.sharded() || sharding.sequence_parallel) out_.set_sharding(map_[value], sharding);
        break;
      }
      case ValueKind::Buffer: map_[value] = out_.add_buffer(v.name, v.type.shape); break;
      case ValueKind::Const: map_[value] = out_.add_constant(v.name, graph_.constant_data(value)); break;
      default: fail(task, "value '" + v.name + "' has no producer");
    }
    return map_[value];
  }

  bool is_leaf(int value) const {
    const ValueKind kind = graph_.value(value).kind;
    return kind == ValueKind::Param || kind == ValueKind::Buffer || kind == ValueKind::Const;
  }
  bool is_split(int value) const { return !is_leaf(value) && layout_[value].split; }
  bool is_sequence_split(int value) const { return is_split(value) && layout_[value].sequence; }

  // A whole parameter read by a task on the rank's part of the sequence: its gradient is partial.
  int sequence_parameter(int value, const Task& task) {
    if (graph_.value(value).kind != ValueKind::Param) return whole(value, task);
    Sharding sharding;
    sharding.sequence_parallel = true;
    return leaf(value, task, sharding);
  }

  // The sequence dimension of an activation [B, S, ...] that sequence parallelism splits.
  void check_sequence(const Task& task, int value) const {
    const Shape& shape = graph_.value(value).type.shape;
    if (shape.size() < 2 || shape[0] != kBatch)
      fail(task, "sequence parallelism splits [batch, sequence, ...] tensors, not '" + graph_.value(value).name + "' " +
                     shape_string(shape));
    divisible(task, shape[1], "sequence length");
  }

  Attributes sequence_attributes(std::int64_t axis) const {
    Attributes attributes;
    attributes.set("axis", axis);
    attributes.set("parts", static_cast<std::int64_t>(degree_));
    return attributes;
  }

  // g under sequence parallelism: the partial sums `value` (new id; original `original`) reduce-scattered
  // along the sequence.
  int reduce_scattered(const Task& task, int original, int value) {
    check_sequence(task, original);
    return out_.add(OpType::SequenceParallelReduceScatter, task.name + ".reduce_scatter", {value}, sequence_attributes(1));
  }

  // The whole of a sequence-split value for a task that needs the whole sequence (one per value).
  int gathered(int value) {
    auto found = gathers_.find(value);
    if (found != gathers_.end()) return found->second;
    const int whole_value = out_.add(OpType::SequenceParallelGather, graph_.value(value).name + ".sequence_parallel_gather",
                                     {map_[value]}, sequence_attributes(layout_[value].axis));
    gathers_[value] = whole_value;
    return whole_value;
  }

  // The new id of an input that the task reads whole.
  int whole(int value, const Task& task) {
    if (is_leaf(value)) return leaf(value, task);
    if (layout_[value].split)
      fail(task, "needs '" + graph_.value(value).name + "' whole, but it is split across the ranks (dimension " +
                     std::to_string(layout_[value].axis) + ")");
    return map_[value];
  }

  // Megatron's f before a column-parallel layer: one per value, shared by all its column consumers
  // (BERT's query, key and value read the same hidden states: one all-reduce of their gradients).
  // Under sequence parallelism a sequence-split input is all-gathered instead (backward:
  // reduce-scatter of its gradient).
  int copied(int value, const Task& task) {
    auto found = copies_.find(value);
    if (found != copies_.end()) return found->second;
    if (is_sequence_split(value)) {
      const int gathered_value =
          out_.add(OpType::SequenceParallelAllGather, graph_.value(value).name + ".sequence_parallel_all_gather",
                   {map_[value]}, sequence_attributes(layout_[value].axis));
      copies_[value] = gathered_value;
      return gathered_value;
    }
    const int input = whole(value, task);
    const int copy = out_.add(OpType::TensorParallelCopy, graph_.value(value).name + ".tensor_parallel_copy", {input});
    copies_[value] = copy;
    return copy;
  }

  void finish(const Task& task, const std::vector<int>& new_outputs, Layout layout) {
    for (std::size_t k = 0; k < task.outputs.size(); ++k) {
      const int old_value = task.outputs[k];
      map_[old_value] = new_outputs.at(k);
      layout_[old_value] = layout;
      // The local shape must be the whole shape with the split dimension (and its vocabulary
      // padding, if any) divided.
      Shape expected = graph_.value(old_value).type.shape;
      if (layout.split) {
        std::int64_t& split = expected[static_cast<std::size_t>(layout.axis)];
        split = (split + layout.padding) / degree_;
      }
      const Shape& actual = out_.value(new_outputs.at(k)).type.shape;
      if (actual != expected)
        fail(task, "local output " + shape_string(actual) + " is not the rank's part " + shape_string(expected) +
                       " of " + shape_string(graph_.value(old_value).type.shape));
    }
  }

  void emit(const Task& task, OpType op, const std::vector<int>& inputs, const Attributes& attributes, Layout layout) {
    finish(task, out_.add_task(op, task.name, inputs, attributes), layout);
  }

  void divisible(const Task& task, std::int64_t size, const std::string& what) const {
    if (size % degree_ != 0)
      fail(task, "its " + what + " (" + std::to_string(size) + ") is not a multiple of the tensor-parallel degree " +
                     std::to_string(degree_));
  }

  void transform(const Task& task) {
    switch (task.tensor_parallel.kind) {
      case TensorParallelHint::Kind::ColumnParallel: return column_parallel(task);
      case TensorParallelHint::Kind::RowParallel: return row_parallel(task);
      case TensorParallelHint::Kind::VocabularyParallel: return vocabulary_parallel(task);
      case TensorParallelHint::Kind::None: break;
    }
    bool any_split = false, needs_whole_sequence = false;
    for (int input : task.inputs) {
      any_split = any_split || is_split(input);
      needs_whole_sequence = needs_whole_sequence || (is_sequence_split(input) && !per_position(task.op));
    }
    if (!any_split || needs_whole_sequence) {
      std::vector<int> inputs;
      for (int input : task.inputs) inputs.push_back(is_sequence_split(input) ? gathered(input) : whole(input, task));
      return emit(task, task.op, inputs, task.attributes, {});
    }
    follow_split(task);
  }

  void column_parallel(const Task& task) {
    if (task.op != OpType::Gemm) fail(task, "only a Gemm can be column-parallel");
    const bool trans_b = task.attributes.get_int("trans_b", 1) == 1;
    const int blocks = task.tensor_parallel.blocks;
    const int out_axis = trans_b ? 0 : 1;
    const std::int64_t features = graph_.value(task.inputs[1]).type.shape[static_cast<std::size_t>(out_axis)];
    if (features % (static_cast<std::int64_t>(blocks) * degree_) != 0)
      fail(task, "its " + std::to_string(features) + " output features" +
                     (blocks > 1 ? " (" + std::to_string(blocks) + " fused blocks)" : "") +
                     " do not divide by the tensor-parallel degree " + std::to_string(degree_));
    std::vector<int> inputs{copied(task.inputs[0], task), leaf(task.inputs[1], task, {out_axis, degree_, blocks})};
    if (task.inputs.size() > 2) inputs.push_back(leaf(task.inputs[2], task, {0, degree_, blocks}));
    const int rank = static_cast<int>(graph_.value(task.outputs[0]).type.shape.size());
    emit(task, task.op, inputs, task.attributes, {true, rank - 1});
  }

  void row_parallel(const Task& task) {
    if (task.op != OpType::Gemm) fail(task, "only a Gemm can be row-parallel");
    const int x = task.inputs[0];
    const int x_rank = static_cast<int>(graph_.value(x).type.shape.size());
    if (!is_split(x) || layout_[x].axis != x_rank - 1)
      fail(task, "a row-parallel Gemm needs its input '" + graph_.value(x).name + "' split on its last dimension");
    const bool trans_b = task.attributes.get_int("trans_b", 1) == 1;
    const int in_axis = trans_b ? 1 : 0;
    divisible(task, graph_.value(task.inputs[1]).type.shape[static_cast<std::size_t>(in_axis)], "input features");
    const int product_value = out_.add(OpType::Gemm, task.name, {map_[x], leaf(task.inputs[1], task, {in_axis, degree_, 1})},
                                       task.attributes);
    if (sequence_parallel_) {
      // The partial products are reduce-scattered along the sequence; the bias is added to the part.
      int result = reduce_scattered(task, task.outputs[0], product_value);
      if (task.inputs.size() > 2)
        result = out_.add(OpType::Add, task.name + ".add_bias", {result, sequence_parameter(task.inputs[2], task)});
      return finish(task, {result}, {true, 1, true});
    }
    int result = out_.add(OpType::TensorParallelAllReduce, task.name + ".all_reduce", {product_value});
    // The bias is added once, after the partial products are summed.
    if (task.inputs.size() > 2) result = out_.add(OpType::Add, task.name + ".add_bias", {result, leaf(task.inputs[2], task)});
    finish(task, {result}, {});
  }

  // Megatron-LM's vocabulary padding: the rows added so that the vocabulary divides into
  // vocab_divisible_by × t (a multiple of t whatever the vocabulary).
  std::int64_t vocabulary_padding(const Task& task, std::int64_t vocabulary) const {
    const std::int64_t divisible_by = task.tensor_parallel.vocab_divisible_by;
    if (divisible_by < 1 || divisible_by > std::numeric_limits<std::int64_t>::max() / 2 / degree_)
      fail(task, "vocab_divisible_by must be positive and not overflow when multiplied by the degree, got " +
                     std::to_string(divisible_by));
    const std::int64_t multiple = divisible_by * degree_;
    return (multiple - vocabulary % multiple) % multiple;
  }

  void vocabulary_parallel(const Task& task) {
    const int table = task.op == OpType::Gather ? task.inputs[0] : task.inputs[1];
    const std::int64_t vocabulary = graph_.value(table).type.shape[0];
    Sharding sharding{0, degree_, 1};
    sharding.padding = vocabulary_padding(task, vocabulary);
    const int table_part = leaf(table, task, sharding);
    if (task.op == OpType::Gather) {
      Attributes attributes;  // an index in the padding rows is as wrong as one beyond them
      if (sharding.padding > 0) attributes.set("vocab_size", vocabulary);
      const int embedded =
          out_.add(OpType::VocabParallelEmbedding, task.name, {table_part, whole(task.inputs[1], task)}, attributes);
      if (sequence_parallel_) return finish(task, {reduce_scattered(task, task.outputs[0], embedded)}, {true, 1, true});
      return finish(task, {out_.add(OpType::TensorParallelAllReduce, task.name + ".all_reduce", {embedded})}, {});
    }
    if (task.op != OpType::MatMul || task.attributes.get_int("trans_b", 0) != 1 || task.attributes.get_int("trans_a", 0) != 0)
      fail(task, "a vocabulary-parallel task is a Gather from the table or a MatMul with the table transposed");
    const int rank = static_cast<int>(graph_.value(task.outputs[0]).type.shape.size());
    emit(task, task.op, {copied(task.inputs[0], task), table_part}, task.attributes,
         {true, rank - 1, false, sharding.padding});
  }

  // An unhinted task with a split input: the split passes through ops that work per slice of it.
  void follow_split(const Task& task) {
    const int x = task.inputs[0];
    const Shape& x_shape = graph_.value(x).type.shape;
    const int rank = static_cast<int>(x_shape.size());
    const int axis = is_split(x) ? layout_[x].axis : -1;
    auto split_inputs_only = [&](std::size_t count) {
      for (std::size_t i = count; i < task.inputs.size(); ++i)
        if (is_split(task.inputs[i])) fail(task, "input " + std::to_string(i) + " may not be split");
    };
    // Padded vocabulary-parallel logits reach the cross-entropy, which masks the padding, through
    // element-wise ops only (anything else would compute on, or move, the padding columns).
    if (is_split(x) && layout_[x].padding > 0) {
      switch (task.op) {
        case OpType::Relu: case OpType::Gelu: case OpType::Tanh: case OpType::Scale: case OpType::Add:
        case OpType::Sub: case OpType::Mul: case OpType::SoftmaxCrossEntropy:
          break;
        default:
          fail(task, "'" + graph_.value(x).name + "' holds the padded vocabulary (vocab_divisible_by) and only " +
                         "element-wise ops and the cross-entropy may read it");
      }
    }
    switch (task.op) {
      case OpType::Relu: case OpType::Gelu: case OpType::Tanh: case OpType::Scale:
        return emit(task, task.op, {map_[x]}, task.attributes, layout_[x]);
      case OpType::Dropout: {
        // The mask of element e of a sample is drawn from its index in the whole tensor: with the
        // rank holding 1/t of dimension 1 that index is rank · (its elements per sample) + e.
        if (axis != 1) fail(task, "dropout of a tensor split on dimension " + std::to_string(axis) + " (only 1 is supported)");
        Attributes attributes = task.attributes;
        attributes.set("tensor_parallel_split", std::int64_t{1});
        return emit(task, task.op, {map_[x]}, attributes, layout_[x]);
      }
      case OpType::Add: case OpType::Sub: case OpType::Mul: return binary(task);
      case OpType::LayerNorm: case OpType::Gemm: {
        // Per position over the last dimension, with whole parameters (sequence parallelism only).
        if (!is_sequence_split(x) || axis >= rank - 1) fail(task, "only a sequence-split input may be split");
        split_inputs_only(1);
        std::vector<int> inputs{map_[x]};
        for (std::size_t i = 1; i < task.inputs.size(); ++i) inputs.push_back(sequence_parameter(task.inputs[i], task));
        return emit(task, task.op, inputs, task.attributes, layout_[x]);
      }
      case OpType::Split: {
        if (axis < 0) fail(task, "only its input may be split");
        Attributes attributes = task.attributes;
        if (normalise_axis(task.attributes.get_int("axis"), x_shape.size()) == axis) {
          std::vector<std::int64_t> sizes = task.attributes.get_ints("sizes");
          for (std::int64_t& size : sizes) {
            divisible(task, size, "split size");
            size /= degree_;
          }
          attributes.set("sizes", sizes);
        }
        return finish(task, out_.add_task(OpType::Split, task.name, {map_[x]}, attributes), layout_[x]);
      }
      case OpType::Reshape: return reshape(task);
      case OpType::Permute: {
        const std::vector<std::int64_t> perm = task.attributes.get_ints("perm");
        for (int j = 0; j < rank; ++j)
          if (perm[static_cast<std::size_t>(j)] == axis)
            return emit(task, task.op, {map_[x]}, task.attributes, {true, j, layout_[x].sequence});
        fail(task, "bad permutation");
      }
      case OpType::MatMul: {
        // Batched over the split dimension (attention heads): each rank multiplies its heads.
        const int b = task.inputs[1];
        if (!is_split(x) || !is_split(b) || layout_[b].axis != axis || axis >= rank - 2)
          fail(task, "a MatMul of split tensors must have both split on the same batch dimension");
        return emit(task, task.op, {map_[x], map_[b]}, task.attributes, layout_[x]);
      }
      case OpType::Softmax: case OpType::Attention: {
        const std::size_t split_count = task.op == OpType::Attention ? 3 : 1;
        for (std::size_t i = 0; i < split_count; ++i)
          if (!is_split(task.inputs[i]) || layout_[task.inputs[i]].axis != axis) fail(task, "inputs split differently");
        if (axis >= rank - (task.op == OpType::Softmax ? 1 : 2)) fail(task, "split along the dimensions it reduces");
        split_inputs_only(split_count);
        std::vector<int> inputs;
        for (std::size_t i = 0; i < task.inputs.size(); ++i)
          inputs.push_back(i < split_count ? map_[task.inputs[i]] : broadcast_along(task, task.inputs[i], x_shape, axis));
        return emit(task, task.op, inputs, task.attributes, layout_[x]);
      }
      case OpType::SoftmaxCrossEntropy: {
        if (axis != rank - 1) fail(task, "logits split on a dimension other than the classes");
        split_inputs_only(1);
        // Padded classes take no part in the softmax (Megatron-LM masks them likewise).
        Attributes attributes = task.attributes;
        if (layout_[x].padding > 0) attributes.set("vocab_size", graph_.value(x).type.shape.back());
        const std::vector<int> outputs =
            out_.add_task(OpType::VocabParallelCrossEntropy, task.name, {map_[x], whole(task.inputs[1], task)}, attributes);
        return finish(task, {outputs[0]}, {});
      }
      default:
        fail(task, "'" + graph_.value(x).name + "' is split across the ranks and this op cannot run on a part of it");
    }
  }

  // A replicated input that broadcasts along the split dimension (an attention mask [B, 1, 1, S]).
  int broadcast_along(const Task& task, int value, const Shape& split_shape, int axis) {
    const Shape& shape = graph_.value(value).type.shape;
    const int shift = static_cast<int>(split_shape.size()) - static_cast<int>(shape.size());
    if (axis >= shift && shape[static_cast<std::size_t>(axis - shift)] != 1)
      fail(task, "'" + graph_.value(value).name + "' does not broadcast along the split dimension");
    return whole(value, task);
  }

  void binary(const Task& task) {
    const int a = task.inputs[0], b = task.inputs[1];
    const int split = is_split(a) ? a : b, other = split == a ? b : a;
    const Layout layout = layout_[split];
    const Shape& split_shape = graph_.value(split).type.shape;
    const Shape& other_shape = graph_.value(other).type.shape;
    int other_new;
    if (is_split(other)) {
      if (layout_[other].axis != layout.axis || layout_[other].padding != layout.padding || other_shape != split_shape)
        fail(task, "operands split differently");
      other_new = map_[other];
    } else {
      const int shift = static_cast<int>(split_shape.size()) - static_cast<int>(other_shape.size());
      const bool covers = layout.axis >= shift && other_shape[static_cast<std::size_t>(layout.axis - shift)] != 1;
      if (covers && layout.sequence && graph_.value(other).kind == ValueKind::Activation) {
        // A replicated tensor spanning the sequence (position embeddings) enters the sequence-parallel
        // region: the rank takes its part (backward: all-gather of the gradient).
        other_new = out_.add(OpType::SequenceParallelScatter, graph_.value(other).name + ".sequence_parallel_scatter",
                             {whole(other, task)}, sequence_attributes(layout.axis - shift));
      } else if (covers && !layout.sequence && graph_.value(other).kind == ValueKind::Param) {
        // The MLM decoder bias: split (and padded) like the logits.
        Sharding sharding{layout.axis - shift, degree_, 1};
        sharding.padding = layout.padding;
        other_new = leaf(other, task, sharding);
      } else if (!covers) {
        other_new = layout.sequence ? sequence_parameter(other, task) : whole(other, task);
      } else {
        fail(task, "'" + graph_.value(other).name + "' is whole but its operand is split along a dimension it spans");
      }
    }
    const std::vector<int> inputs = split == a ? std::vector<int>{map_[a], other_new} : std::vector<int>{other_new, map_[b]};
    emit(task, task.op, inputs, task.attributes, layout);
  }

  // A reshape that merges or splits dimensions around the split one: the rank's part stays a
  // contiguous range of the merged index when the split dimension is the outermost of its group.
  void reshape(const Task& task) {
    const int x = task.inputs[0];
    const Shape in = with_batch(graph_.value(x).type.shape, 1);
    const Shape out = with_batch(graph_.value(task.outputs[0]).type.shape, 1);
    const auto axis = static_cast<std::size_t>(layout_[x].axis);
    const std::int64_t before = product(in, 0, axis);
    std::vector<std::int64_t> shape = task.attributes.get_ints("shape");
    for (std::size_t j = 0; j < out.size(); ++j) {
      if (product(out, 0, j) != before || out[j] == 1) continue;
      divisible(task, out[j], "output dimension " + std::to_string(j));
      if (shape[j] > 0) {
        shape[j] /= degree_;
      } else if (shape[j] == 0 && j != axis) {
        continue;
      }
      Attributes attributes = task.attributes;
      attributes.set("shape", shape);
      return emit(task, task.op, {map_[x]}, attributes, {true, static_cast<int>(j), layout_[x].sequence});
    }
    fail(task, "the split dimension " + std::to_string(axis) + " of " + shape_string(graph_.value(x).type.shape) +
                   " has no counterpart in " + shape_string(graph_.value(task.outputs[0]).type.shape));
  }
};

// Copies between a whole tensor and a rank's part: the sharded dimension (with its padding) is
// viewed as [blocks, parts, chunk]; `to_part` copies whole -> part (zeros in the padding rows), else
// part -> whole (the padding rows dropped).
void copy_shard(const Tensor& whole, const Tensor& part, const Sharding& sharding, int rank, bool to_part) {
  PARTRAIN_CHECK(whole.device().is_cpu() && part.device().is_cpu(), "shard copies work on host tensors");
  PARTRAIN_CHECK(whole.dtype() == part.dtype(), "shard copy between dtypes " << dtype_name(whole.dtype()) << " and "
                                                                            << dtype_name(part.dtype()));
  const Shape& shape = whole.shape();
  const auto axis = static_cast<std::size_t>(sharding.axis);
  PARTRAIN_CHECK(sharding.axis >= 0 && axis < shape.size(), "sharding axis " << sharding.axis << " of a tensor "
                                                                           << shape_string(shape));
  PARTRAIN_CHECK(rank >= 0 && rank < sharding.parts, "shard rank " << rank << " outside [0, " << sharding.parts << ")");
  PARTRAIN_CHECK(sharding.padding >= 0 && (sharding.padding == 0 || sharding.blocks == 1),
                 "shard copy: padding " << sharding.padding << " with " << sharding.blocks << " blocks");
  const std::int64_t size = shape[axis] + sharding.padding;
  const std::int64_t pieces = static_cast<std::int64_t>(sharding.blocks) * sharding.parts;
  PARTRAIN_CHECK(size % pieces == 0, "dimension " << axis << " of " << shape_string(shape)
                                                  << (sharding.padding > 0 ? " + " + std::to_string(sharding.padding) + " padding" : "")
                                                  << " does not divide into " << sharding.blocks << " blocks x "
                                                  << sharding.parts << " parts");
  Shape local = shape;
  local[axis] = size / sharding.parts;
  PARTRAIN_CHECK(part.shape() == local, "shard of " << shape_string(shape) << " should be " << shape_string(local)
                                                     << ", got " << shape_string(part.shape()));
  const std::int64_t outer = product(shape, 0, axis);
  const std::size_t element = dtype_size(whole.dtype());
  const std::int64_t inner = product(shape, axis + 1, shape.size());
  const std::size_t chunk_bytes = static_cast<std::size_t>(size / pieces * inner) * element;
  auto* whole_bytes = static_cast<char*>(whole.raw_data());
  auto* part_bytes = static_cast<char*>(part.raw_data());
  if (sharding.padding > 0) {
    // One block: the rank's rows [rank·chunk, (rank + 1)·chunk) of the padded dimension, of which
    // those below the whole tensor's size are real.
    const std::int64_t chunk = size / sharding.parts;
    const std::int64_t real = std::clamp(shape[axis] - rank * chunk, std::int64_t{0}, chunk);
    const std::size_t real_bytes = static_cast<std::size_t>(real * inner) * element;
    for (std::int64_t o = 0; o < outer; ++o) {
      char* in_part = part_bytes + static_cast<std::size_t>(o) * chunk_bytes;
      if (real > 0) {
        char* in_whole = whole_bytes + static_cast<std::size_t>((o * shape[axis] + rank * chunk) * inner) * element;
        if (to_part) {
          std::memcpy(in_part, in_whole, real_bytes);
        } else {
          std::memcpy(in_whole, in_part, real_bytes);
        }
      }
      if (to_part) std::memset(in_part + real_bytes, 0, chunk_bytes - real_bytes);
    }
    return;
  }
  for (std::int64_t o = 0; o < outer; ++o)
    for (int b = 0; b < sharding.blocks; ++b) {
      char* in_whole = whole_bytes + (static_cast<std::size_t>(o * pieces) + static_cast<std::size_t>(b * sharding.parts + rank)) * chunk_bytes;
      char* in_part = part_bytes + static_cast<std::size_t>(o * sharding.blocks + b) * chunk_bytes;
      if (to_part) {
        std::memcpy(in_part, in_whole, chunk_bytes);
      } else {
        std::memcpy(in_whole, in_part, chunk_bytes);
      }
    }
}

}  // namespace

Graph tensor_parallel_graph(const Graph& graph, int degree, bool sequence_parallel) {
  PARTRAIN_CHECK(degree >= 1, "tensor parallelism: the degree must be at least 1, got " << degree);
  if (degree == 1) return graph;
  return Transformation(graph, degree, sequence_parallel).run();
}

bool is_sequence_parallel(const Graph& graph) {
  for (const Task& task : graph.tasks())
    if (task.op == OpType::SequenceParallelAllGather || task.op == OpType::SequenceParallelReduceScatter ||
        task.op == OpType::SequenceParallelScatter || task.op == OpType::SequenceParallelGather)
      return true;
  return false;
}

std::vector<int> sequence_parallel_parameters(const Graph& graph) {
  std::vector<int> parameters;
  for (int value : graph.parameters())
    if (graph.value(value).sharding.sequence_parallel) parameters.push_back(value);
  return parameters;
}

int tensor_parallel_degree(const Graph& graph) {
  int degree = 1;
  for (const Value& value : graph.values()) degree = std::max(degree, value.sharding.parts);
  return degree;
}

Shape whole_shape(const Value& value) {
  Shape shape = value.type.shape;
  if (value.sharding.sharded())
    shape[static_cast<std::size_t>(value.sharding.axis)] =
        shape[static_cast<std::size_t>(value.sharding.axis)] * value.sharding.parts - value.sharding.padding;
  return shape;
}

Tensor shard_of(const Tensor& whole, const Sharding& sharding, int rank) {
  if (!sharding.sharded()) return whole;
  Shape local = whole.shape();
  PARTRAIN_CHECK(sharding.axis >= 0 && static_cast<std::size_t>(sharding.axis) < local.size(),
                 "sharding axis " << sharding.axis << " of a tensor " << shape_string(local));
  local[static_cast<std::size_t>(sharding.axis)] = (local[static_cast<std::size_t>(sharding.axis)] + sharding.padding) / sharding.parts;
  Tensor part = Tensor::empty(local, whole.dtype());
  copy_shard(whole, part, sharding, rank, true);
  return part;
}

void place_shard(const Tensor& whole, const Tensor& part, const Sharding& sharding, int rank) {
  copy_shard(whole, part, sharding, rank, false);
}

std::unordered_map<int, Tensor> shard_values(const Graph& whole, const std::unordered_map<int, Tensor>& whole_values,
                                             const Graph& part, int rank) {
  std::unordered_map<int, Tensor> values;
  for (const Value& value : part.values()) {
    if (value.kind != ValueKind::Param && value.kind != ValueKind::Buffer) continue;
    auto found = whole_values.find(whole.value_id(value.name));
    PARTRAIN_CHECK(found != whole_values.end(), "shard_values: no value for '" << value.name << "'");
    values[value.id] = shard_of(found->second, value.sharding, rank);
  }
  return values;
}

}  // namespace partrain
