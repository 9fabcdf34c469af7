#include "graph/graph.h"

#include <algorithm>
#include <queue>

#include "core/error.h"

namespace partrain {

const char* value_kind_name(ValueKind kind) {
  switch (kind) {
    case ValueKind::Input: return "input";
    case ValueKind::Label: return "label";
    case ValueKind::Param: return "param";
    case ValueKind::Buffer: return "buffer";
    case ValueKind::Const: return "const";
    case ValueKind::Activation: return "activation";
  }
  return "?";
}

std::uint64_t fnv1a(const void* data, std::size_t size, std::uint64_t seed) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) seed = (seed ^ bytes[i]) * 1099511628211ull;
  return seed;
}

std::uint32_t name_stream(const std::string& name) {
  const std::uint64_t h = fnv1a(name.data(), name.size());
  return static_cast<std::uint32_t>(h ^ (h >> 32));
}

int Graph::add_value(const std::string& name, ValueKind kind, const TensorType& type) {
  PARTRAIN_CHECK(!name.empty(), "a value needs a name");
  PARTRAIN_CHECK(!value_by_name_.count(name), "duplicate value name '" << name << "'");
  Value value;
  value.id = static_cast<int>(values_.size());
  value.name = name;
  value.kind = kind;
  value.type = type;
  values_.push_back(std::move(value));
  value_by_name_[name] = values_.back().id;
  return values_.back().id;
}

int Graph::add_input(const std::string& name, const Shape& shape, DType dtype) {
  return add_value(name, ValueKind::Input, {shape, dtype});
}
int Graph::add_label(const std::string& name, const Shape& shape, DType dtype) {
  return add_value(name, ValueKind::Label, {shape, dtype});
}
int Graph::add_parameter(const std::string& name, const Shape& shape) {
  PARTRAIN_CHECK(!has_batch_dim(shape), "parameter '" << name << "' cannot have a batch dimension");
  return add_value(name, ValueKind::Param, {shape, DType::F32});
}
int Graph::add_buffer(const std::string& name, const Shape& shape) {
  PARTRAIN_CHECK(!has_batch_dim(shape), "buffer '" << name << "' cannot have a batch dimension");
  return add_value(name, ValueKind::Buffer, {shape, DType::F32});
}
int Graph::add_constant(const std::string& name, const Tensor& data) {
  const int id = add_value(name, ValueKind::Const, {data.shape(), data.dtype()});
  constants_[id] = data;
  return id;
}

std::vector<int> Graph::add_task(OpType op, const std::string& name, const std::vector<int>& inputs,
                                 const Attributes& attributes) {
  PARTRAIN_CHECK(!task_by_name_.count(name), "duplicate task name '" << name << "'");
  std::vector<TensorType> input_types;
  bool constant = true;
  for (int input : inputs) {
    PARTRAIN_CHECK(input >= 0 && input < static_cast<int>(values_.size()),
                   "task '" << name << "': unknown input value id " << input);
    const Value& value = values_[input];
    input_types.push_back(value.type);
    if (value.kind == ValueKind::Input || value.kind == ValueKind::Label) constant = false;
    if (value.kind == ValueKind::Activation && !tasks_[value.producer].constant) constant = false;
  }
  std::vector<TensorType> output_types;
  try {
    output_types = infer_output_types(op, attributes, input_types);
  } catch (const Error& error) {
    std::ostringstream inputs_text;
    for (int input : inputs) inputs_text << " " << values_[input].name << shape_string(values_[input].type.shape);
    PARTRAIN_FAIL("task '" << name << "' (" << op_name(op) << "):" << inputs_text.str() << ": " << error.message());
  }

  Task task;
  task.id = static_cast<int>(tasks_.size());
  task.name = name;
  task.op = op;
  task.attributes = attributes;
  task.inputs = inputs;
  task.constant = constant;
  for (std::size_t k = 0; k < output_types.size(); ++k) {
    const int id = add_value(k == 0 ? name : name + ":" + std::to_string(k), ValueKind::Activation, output_types[k]);
    values_[id].producer = task.id;
    task.outputs.push_back(id);
  }
  for (int input : inputs) values_[input].consumers.push_back(task.id);

  // Costs at batch size 1.
  std::vector<TensorType> concrete_inputs, concrete_outputs;
  for (const TensorType& type : input_types) concrete_inputs.push_back({with_batch(type.shape, 1), type.dtype});
  for (const TensorType& type : output_types) {
    concrete_outputs.push_back({with_batch(type.shape, 1), type.dtype});
    task.cost.activation_bytes += double(numel(concrete_outputs.back().shape)) * dtype_size(type.dtype);
  }
  const OpSchema& schema = op_schema(op);
  task.cost.forward_flops = schema.flops(attributes, concrete_inputs, concrete_outputs);
  if (schema.allreduce_bytes) {
    const auto [forward_bytes, backward_bytes] = schema.allreduce_bytes(concrete_inputs, concrete_outputs);
    task.cost.forward_allreduce_bytes = forward_bytes;
    task.cost.backward_allreduce_bytes = backward_bytes;
  }
  for (int input : inputs)
    if (values_[input].kind == ValueKind::Param)
      task.cost.parameter_bytes += double(numel(values_[input].type.shape)) * dtype_size(values_[input].type.dtype);

  tasks_.push_back(std::move(task));
  task_by_name_[name] = tasks_.back().id;
  return tasks_.back().outputs;
}

int Graph::add(OpType op, const std::string& name, const std::vector<int>& inputs, const Attributes& attributes) {
  const std::vector<int> outputs = add_task(op, name, inputs, attributes);
  PARTRAIN_CHECK(outputs.size() == 1, "task '" << name << "' has " << outputs.size() << " outputs; use add_task");
  return outputs[0];
}

void Graph::mark_output(int value) {
  PARTRAIN_CHECK(value >= 0 && value < static_cast<int>(values_.size()), "mark_output: unknown value id " << value);
  if (!is_output(value)) outputs_.push_back(value);
}

void Graph::hint_tensor_parallel(int value, TensorParallelHint hint) {
  const int producer = this->value(value).producer;
  PARTRAIN_CHECK(producer >= 0, "hint_tensor_parallel: '" << values_[value].name << "' is not a task output");
  tasks_[producer].tensor_parallel = hint;
}

void Graph::set_sharding(int value, const Sharding& sharding) {
  PARTRAIN_CHECK(this->value(value).kind == ValueKind::Param, "set_sharding: '" << values_[value].name << "' is not a parameter");
  values_[value].sharding = sharding;
}

const Value& Graph::value(int id) const {
  PARTRAIN_CHECK(id >= 0 && id < static_cast<int>(values_.size()), "unknown value id " << id);
  return values_[id];
}

const Task& Graph::task(int id) const {
  PARTRAIN_CHECK(id >= 0 && id < static_cast<int>(tasks_.size()), "unknown task id " << id);
  return tasks_[id];
}

bool Graph::is_output(int value) const { return std::find(outputs_.begin(), outputs_.end(), value) != outputs_.end(); }

int Graph::value_id(const std::string& name) const {
  auto it = value_by_name_.find(name);
  PARTRAIN_CHECK(it != value_by_name_.end(), "no value named '" << name << "'");
  return it->second;
}

std::vector<int> Graph::parameters() const {
  std::vector<int> ids;
  for (const Value& value : values_)
    if (value.kind == ValueKind::Param) ids.push_back(value.id);
  return ids;
}

std::int64_t Graph::parameter_count() const {
  std::int64_t count = 0;
  for (int id : parameters()) count += numel(values_[id].type.shape);
  return count;
}

const Tensor& Graph::constant_data(int value) const {
  auto it = constants_.find(value);
  PARTRAIN_CHECK(it != constants_.end(), "value '" << this->value(value).name << "' is not a constant");
  return it->second;
}

std::vector<int> Graph::topological_order(std::span<const int> tasks) const {
  std::unordered_map<int, int> in_degree;
  for (int t : tasks) in_degree[t] = 0;
  for (int t : tasks)
    for (int input : task(t).inputs)
      if (int producer = values_[input].producer; producer >= 0 && in_degree.count(producer)) ++in_degree[t];
  std::priority_queue<int, std::vector<int>, std::greater<>> ready;
  for (auto [t, degree] : in_degree)
    if (degree == 0) ready.push(t);
  std::vector<int> order;
  while (!ready.empty()) {
    const int t = ready.top();
    ready.pop();
    order.push_back(t);
    for (int output : tasks_[t].outputs)
      for (int consumer : values_[output].consumers)
        if (auto it = in_degree.find(consumer); it != in_degree.end() && --it->second == 0) ready.push(consumer);
  }
  PARTRAIN_CHECK(order.size() == in_degree.size(), "the task set has a cycle");
  return order;
}

std::uint64_t Graph::hash() const {
  std::uint64_t h = fnv1a("partrain-graph-v1", 17);
  auto mix = [&h](const auto& item) { h = fnv1a(&item, sizeof item, h); };
  auto mix_string = [&h](const std::string& text) { h = fnv1a(text.data(), text.size(), h); };
  for (const Value& value : values_) {
    mix(static_cast<std::uint8_t>(value.kind));
    mix(static_cast<std::uint8_t>(value.type.dtype));
    mix(value.type.shape.size());
    for (std::int64_t dim : value.type.shape) mix(dim);
    if (value.sharding.sharded()) {  // only tensor-parallel graphs: one-device hashes stay as they were
      mix(value.sharding.axis);
      mix(value.sharding.parts);
      mix(value.sharding.blocks);
      if (value.sharding.padding > 0) mix(value.sharding.padding);
    }
    if (value.sharding.sequence_parallel) mix(1);
  }
  for (const Task& task : tasks_) {
    mix(static_cast<std::uint8_t>(task.op));
    mix_string(task.attributes.canonical_string());
    for (int input : task.inputs) mix(input);
    mix(-1);
    for (int output : task.outputs) mix(output);
  }
  for (int output : outputs_) mix(output);
  return h;
}

}  // namespace partrain
