// partrain eval: a checkpoint on held-out data. Every rank reads the experiment file and builds the
// graph; rank 0 plans (on the analytic cost model: evaluating takes less time than profiling) or
// loads --plan, for whatever world size runs; every rank restores its stage's parameters from the
// checkpoint (any plan: tensors are stored whole) and runs the forward part of the schedule in
// evaluation mode over the data; rank 0 prints eval_loss, perplexity (language models) or accuracy
// (image classifiers), and the number of samples.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "app/checkpoint_resume.h"
#include "app/collective_decision.h"
#include "app/commands.h"
#include "app/mpi_command.h"
#include "app/plan_agreement.h"
#include "app/planning.h"
#include "comm/device_communicator.h"
#include "comm/mpi_communicator.h"
#include "core/backend_registry.h"
#include "core/error.h"
#include "io/batch_file.h"
#include "io/batch_source.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/hdf5_file.h"
#include "models/model.h"
#include "runtime/checkpointing.h"
#include "runtime/executor.h"

namespace partrain::app {
namespace {

// Requests refused before any work, looked at on rank 0: a --resume or --plan file that is not
// there, a --data file that is not readable.
void check_eval_request(const EvalArguments& arguments, comm::Communicator& world) {
  decide_on_rank0(world, [&] {
    PARTRAIN_CHECK(arguments.resume == "latest" || readable_file(arguments.resume),
                   "--resume " << arguments.resume
                               << ": no such readable checkpoint file (give a step_NNNNNN.h5 or latest)");
    PARTRAIN_CHECK(arguments.plan_file.empty() || readable_file(arguments.plan_file),
                   "--plan " << arguments.plan_file << ": no such readable plan file");
    PARTRAIN_CHECK(arguments.data.empty() || readable_file(arguments.data),
                   "--data " << arguments.data << ": no such readable file");
    return std::string();
  });
}

// Rank 0 checks that `checkpoint` holds the model of `config`: every parameter and buffer under its
// name and shape (from the file's index, without reading the data).
void check_checkpoint_model(const std::string& checkpoint, const ExperimentConfig& config, const Graph& graph,
                            comm::Communicator& world) {
  decide_on_rank0(world, [&] {
    const io::CheckpointSummary summary = io::summarize_checkpoint(checkpoint);
    for (const std::string& name : runtime::required_model_tensors(graph)) {
      const Value& value = graph.value(graph.value_id(name.substr(std::string("model/").size())));
      auto found = std::find_if(summary.tensors.begin(), summary.tensors.end(),
                                [&](const auto& tensor) { return tensor.first == name; });
      PARTRAIN_CHECK(found != summary.tensors.end(), checkpoint << ": dataset /" << name
                                                                << " is missing (a checkpoint of another model than "
                                                                << config.path << "?)");
      PARTRAIN_CHECK(found->second == value.type.shape,
                     checkpoint << ": dataset /" << name << " has shape " << shape_string(found->second)
                                << ", the model of " << config.path << " needs " << shape_string(value.type.shape)
                                << " (evaluate with the settings it was trained with: its attribute config_toml "
                                   "holds them)");
    }
    return std::string();
  });
}

// The values a batch file's integer field may hold, checked before evaluation (an id outside the
// vocabulary would fail only inside the embedding kernel, naming neither file nor dataset): token
// ids below [model] vocab, token types below [model] type_vocab, labels below the class count of
// the cross-entropy that reads them (its logits' last dimension) or equal to its ignore_index.
void set_field_bounds(io::BatchField& field, const Value& value, const ExperimentConfig& config, const Graph& graph) {
  const std::string where = " in " + config.path;
  if (value.name == "input_ids") {
    field.upper_bound = config.model.vocab;
    field.bound_source = "[model] vocab = " + std::to_string(config.model.vocab) + where;
  } else if (value.name == "token_type_ids") {
    field.upper_bound = config.model.type_vocab;
    field.bound_source = "[model] type_vocab = " + std::to_string(config.model.type_vocab) + where;
  }
  if (value.kind != ValueKind::Label) return;
  for (int consumer : value.consumers) {
    const Task& task = graph.task(consumer);
    if (task.op != OpType::SoftmaxCrossEntropy || task.inputs.size() != 2 || task.inputs[1] != value.id) continue;
    const Shape& logits = graph.value(task.inputs[0]).type.shape;
    if (logits.empty()) continue;
    field.upper_bound = logits.back();
    field.ignore_value = task.attributes.get_int("ignore_index", -100);
    field.bound_source = "the classes of " + task.name + ", whose ignore_index is " + std::to_string(*field.ignore_value);
  }
}

// The samples to evaluate: `path` empty: the held-out split of the config's data; a batch file
// (a /batch group): its rows in order; else a data/prepare.sh data set: its held-out split.
std::unique_ptr<io::BatchSource> evaluation_data(const ExperimentConfig& config, const Graph& graph,
                                                 const std::string& path) {
  if (path.empty()) return io::make_batch_source(config, true);
  if (io::is_batch_file(path)) {
    std::vector<io::BatchField> fields;
    for (const Value& value : graph.values()) {
      if (value.kind != ValueKind::Input && value.kind != ValueKind::Label) continue;
      const Shape& shape = value.type.shape;
      io::BatchField field;
      field.name = value.name;
      field.sample_shape = Shape(shape.begin() + (has_batch_dim(shape) ? 1 : 0), shape.end());
      field.dtype = value.type.dtype;
      set_field_bounds(field, value, config, graph);
      fields.push_back(std::move(field));
    }
    return std::make_unique<io::BatchFile>(path, fields);
  }
  ExperimentConfig with_data = config;
  with_data.data.path = path;
  return io::make_batch_source(with_data, true);
}

// The number of global batches of the plan: --batches (at most what the data holds), or every whole batch.
std::int64_t evaluation_batches(const io::BatchSource& data, const Plan& plan, const ExperimentConfig& config,
                                bool batch_file, long requested) {
  const std::int64_t batch = plan.global_batch, available = data.samples_per_epoch();
  const std::string what = data.path() + (batch_file ? "" : "'s held-out split");
  PARTRAIN_CHECK(available >= batch, what << " holds " << available << " samples, fewer than one global batch of "
                                          << batch << " ([train] global_batch in " << config.path << ")");
  if (requested == 0) return available / batch;
  PARTRAIN_CHECK(requested * batch <= available,
                 "--batches " << requested << " needs " << requested * batch << " samples (global batch " << batch
                              << "), but " << what << " holds " << available << ": at most --batches "
                              << available / batch);
  return requested;
}

int evaluate(const EvalArguments& arguments, comm::Communicator& world, bool& diverged) {
  const bool leader = world.rank() == 0;
  const ExperimentConfig config = load_experiment(arguments.config, arguments.overrides);
  check_eval_request(arguments, world);
  PlannedGraphs graphs(config);
  const Graph& model = graphs.model();
  const std::string checkpoint = resume_path(arguments.resume, checkpoint_directory(config), world);
  check_checkpoint_model(checkpoint, config, model, world);
  const std::unique_ptr<io::BatchSource> data = evaluation_data(config, model, arguments.data);
  const bool batch_file = dynamic_cast<const io::BatchFile*>(data.get()) != nullptr;
  Backend& backend = select_backend(config.train.device, comm::MpiCommunicator::node_local_rank());
  const std::unique_ptr<comm::Communicator> device_world = comm::make_device_world(world, backend);
  comm::Communicator& run_world = device_world ? *device_world : world;
  // From here on the plan, not the config, says the global batch, degree, precision and optimizer.
  const Plan plan = agree_on_plan(config, graphs, arguments.plan_file, false, world, run_world, backend);
  const std::int64_t batches = evaluation_batches(*data, plan, config, batch_file, arguments.batches);
  // The graph the plan indexes: the model's, or one tensor-parallel rank's part of it.
  const Graph& graph = graphs.of_degree(plan.tensor_parallel, plan.sequence_parallel);

  runtime::PipelineExecutor executor(
      graph, plan, run_world, backend, *data,
      initial_values(config, model, graph, plan.placement_of(world.rank()).tensor_rank),
      runtime_options(config.train, config.parallel));
  // Every rank reads the same file: an error there is every rank's (printed once).
  const std::int64_t step = resume_from(checkpoint, graph, executor, world, RestoreScope::Model);
  diverged = true;
  if (leader && !arguments.save_batches.empty()) {
    io::Hdf5File file = io::Hdf5File::create(arguments.save_batches);
    file.write_string_attribute("/", "config", config.text);
    io::write_batches(file, data->samples(0, batches * plan.global_batch));
    std::printf("eval: wrote the %lld samples to %s\n", static_cast<long long>(batches * plan.global_batch),
                arguments.save_batches.c_str());
  }
  if (leader) {
    std::printf("eval: step %lld of %s on %s (%s): %lld batches of %lld; %d ranks, %zu stages, tensor parallel %d, "
                "%d microbatches\n",
                static_cast<long long>(step), checkpoint.c_str(), data->path().c_str(),
                batch_file ? "batch file" : "held-out split", static_cast<long long>(batches),
                static_cast<long long>(plan.global_batch), world.size(), plan.stages.size(),
                plan.tensor_parallel, plan.microbatches);
    std::fflush(stdout);
  }
  const bool classifier = config.model.is_classifier();
  const runtime::EvaluationResult result = executor.evaluate(*data, batches, classifier);
  if (!leader) return 0;
  std::printf("eval_loss: %.9g\n", result.loss());
  if (result.terms.size() > 1)
    for (const runtime::LossTerm& term : result.terms)
      std::printf("eval_loss %s: %.9g over %.0f positions\n", term.name.c_str(), term.mean(), term.count);
  if (classifier)
    std::printf("accuracy: %.6f\n", result.terms.front().accuracy());
  else
    std::printf("perplexity: %.9g\n", std::exp(result.loss()));
  std::printf("samples: %lld\n", static_cast<long long>(result.samples));
  return 0;
}

}  // namespace

int run_eval(const EvalArguments& arguments) {
  return run_on_every_rank(
      [&](comm::Communicator& world, bool& diverged) { return evaluate(arguments, world, diverged); });
}

}  // namespace partrain::app
