#pragma once
// Where a run's outputs and checkpoints live, which checkpoint `--resume latest|PATH` means, and
// restoring one into an executor under any plan. Shared by `partrain train` and `partrain eval`.
#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "graph/graph.h"
#include "io/config.h"
#include "runtime/executor.h"

namespace partrain::app {

/// The run's output directory: [log] dir, else runs/<experiment file name without .toml>.
std::string output_directory(const ExperimentConfig& config);

/// The run's checkpoint directory: [checkpoint] dir, else <output directory>/checkpoints.
std::string checkpoint_directory(const ExperimentConfig& config);

/// Whether `path` is a regular file this process can open for reading.
bool readable_file(const std::string& path);

/// The checkpoint `resume` names: "latest" is the newest valid checkpoint in `directory` (rank 0
/// verifies them and prints which damaged ones it skipped), anything else the path itself (callers
/// check first that it is readable). Decided on rank 0; collective over `world`. Throws
/// partrain::Error (on every rank) naming the directory when it holds no valid checkpoint.
std::string resume_path(const std::string& resume, const std::string& directory, comm::Communicator& world);

/// What resume_from restores.
enum class RestoreScope {
  Training,  ///< parameters, buffers and optimizer state; a checkpoint without /optim (an import)
             ///< restores the model and says that the optimizer starts fresh
  Model,     ///< parameters and buffers only (evaluation): /optim is not read
};

/// Restores `executor` (any plan: tensors are stored whole) from the checkpoint at `path`, which
/// every rank reads; rank 0 prints what it restored. Returns the checkpoint's step. Throws
/// partrain::Error naming the file and the dataset when one is missing, damaged or of another shape.
std::int64_t resume_from(const std::string& path, const Graph& graph, runtime::PipelineExecutor& executor,
                         comm::Communicator& world, RestoreScope scope = RestoreScope::Training);

}  // namespace partrain::app
