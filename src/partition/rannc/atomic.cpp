#include "partition/rannc/atomic.h"

#include <algorithm>

#include "core/error.h"

namespace partrain::partition {

namespace {

// Appends to `component` every constant task reachable backwards from `start`'s inputs through
// constant producers, skipping tasks already stamped with `stamp` (so each appears once).
void collect_constant_ancestors(const Graph& graph, int start, int stamp, std::vector<int>& seen,
                                std::vector<int>& component, std::vector<int>& stack) {
  stack.clear();
  stack.push_back(start);
  while (!stack.empty()) {
    const int task = stack.back();
    stack.pop_back();
    for (int input : graph.task(task).inputs) {
      const int producer = graph.value(input).producer;
      if (producer < 0 || !graph.task(producer).constant || seen[producer] == stamp) continue;
      seen[producer] = stamp;
      component.push_back(producer);
      stack.push_back(producer);
    }
  }
}

}  // namespace

std::vector<AtomicComponent> atomic_components(const Graph& graph) {
  const std::vector<Task>& tasks = graph.tasks();
  const int task_count = static_cast<int>(tasks.size());
  if (task_count == 0) return {};

  // Graph sets Task::constant while building; check it against the definition, since every later
  // step (cloning, convexity over non-constant tasks) relies on it.
  for (const Task& task : tasks) {
    bool constant = true;
    for (int input : task.inputs) {
      const Value& value = graph.value(input);
      if (value.kind == ValueKind::Input || value.kind == ValueKind::Label) constant = false;
      if (value.kind == ValueKind::Activation && !graph.task(value.producer).constant) constant = false;
    }
    PARTRAIN_CHECK(constant == task.constant, "task '" << task.name << "' is marked "
                                                       << (task.constant ? "constant" : "non-constant")
                                                       << " but its inputs say otherwise");
  }

  std::vector<AtomicComponent> components;
  std::vector<int> seen(task_count, -1);   // stamp: index of the component that last took the task
  std::vector<char> needed(task_count, 0);  // constant task needed by some non-constant task
  std::vector<int> stack;
  for (const Task& task : tasks) {
    if (task.constant) continue;
    AtomicComponent component;
    component.task = task.id;
    const int stamp = static_cast<int>(components.size());
    seen[task.id] = stamp;
    component.tasks.push_back(task.id);
    collect_constant_ancestors(graph, task.id, stamp, seen, component.tasks, stack);
    for (int member : component.tasks) needed[member] = 1;
    std::sort(component.tasks.begin(), component.tasks.end());
    components.push_back(std::move(component));
  }
  PARTRAIN_CHECK(!components.empty(), "graph of " << task_count
                                                  << " tasks has no task that depends on an Input or Label; "
                                                     "there is nothing to partition by batch");

  // Constant tasks no component needs go to the last component, with their constant ancestors.
  AtomicComponent& last = components.back();
  const int last_stamp = static_cast<int>(components.size()) - 1;
  bool grew = false;
  for (const Task& task : tasks) {
    if (!task.constant || needed[task.id] || seen[task.id] == last_stamp) continue;
    seen[task.id] = last_stamp;
    last.tasks.push_back(task.id);
    collect_constant_ancestors(graph, task.id, last_stamp, seen, last.tasks, stack);
    grew = true;
  }
  if (grew) std::sort(last.tasks.begin(), last.tasks.end());
  return components;
}

}  // namespace partrain::partition
