#pragma once
// Checkpoints in parallel HDF5 (docs/checkpoints.md, issue 6).
//
// File layout: /model/<parameter name> and /optim/<parameter name>/<state> as whole fp32 tensors
// (chunked, Fletcher32 checksums), and attributes on "/" for every CheckpointInfo field. A file is
// written collectively to `step_XXXXXX.h5.tmp` and renamed to `step_XXXXXX.h5` by rank 0 only after
// every rank has closed it, so a killed job never leaves a damaged file under a final name.
// Readers are serial (any rank, any world size): tensors are stored whole under their names, so a
// run can resume under another plan.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/shape.h"
#include "core/tensor.h"
#include "io/fault_injection.h"

namespace partrain::io {

/// The newest file format this build writes and reads.
inline constexpr std::int64_t kCheckpointFormatVersion = 1;

/// One tensor of a checkpoint: its full name ("model/bert.embeddings.word_embeddings.weight",
/// "optim/<param name>/exp_avg"), shape, and - on the one rank that writes it - its data (a host
/// tensor of that shape; fp32, other dtypes are converted to fp32). `data` is undefined elsewhere.
/// Which part of a whole tensor one rank writes. A tensor-parallel shard (graph/tensor_parallel.h):
/// dimension `axis` is viewed as [blocks, parts, size / (blocks · parts)] and the rank's part is
/// [:, index, :] (parts 1: the whole tensor). Of that part the rank writes elements [begin, end) in
/// row-major order (a ZeRO-1 piece of the optimizer state; end < 0: all of it). In the file these
/// are a union of boxes of the dataset (part_boxes).
struct CheckpointPart {
  int axis = -1;
  int parts = 1;
  int blocks = 1;
  int index = 0;
  std::int64_t begin = 0;
  std::int64_t end = -1;
};

/// True when `part` is the whole tensor.
bool whole_tensor(const CheckpointPart& part);

/// Elements `part` selects of a tensor of shape `shape`. Throws partrain::Error when the axis does not
/// divide into blocks × parts, the index is outside [0, parts) or the range outside the part.
std::int64_t part_element_count(const Shape& shape, const CheckpointPart& part);

/// A box of a dataset: coordinates [start, start + count) in every dimension.
struct Box {
  std::vector<std::int64_t> start, count;
};

/// The boxes of `shape` holding the elements `part` selects; listing their elements in row-major
/// order of the whole tensor gives the part's elements in its own row-major order. Throws like
/// part_element_count.
std::vector<Box> part_boxes(const Shape& shape, const CheckpointPart& part);

struct CheckpointTensor {
  std::string name;
  Shape shape;        // of the whole tensor (the dataset)
  Tensor data;        // what this rank writes: part_element_count(shape, part) elements (any shape)
  CheckpointPart part;
};

/// Everything besides tensors that a resume needs.
struct CheckpointInfo {
  std::int64_t format_version = kCheckpointFormatVersion;
  std::int64_t step = 0;              // optimizer steps done
  std::int64_t consumed_samples = 0;
  std::int64_t data_cursor = 0;       // next sample index of the data stream
  std::uint64_t seed = 0;             // RNG state: dropout and data order are keyed by (seed, step, sample)
  std::int64_t lr_step = 0;           // LR-schedule state
  std::string config_toml;            // the experiment file with overrides applied
  std::string plan_json;
  std::string optimizer;              // "adamw" / "sgd"
  // fp16's dynamic loss scaler (runtime/loss_scaler.h): its scale and good-step count after `step`
  // steps. 0 when the run was not fp16; absent from older files and fp32/bf16 runs' (read as 0).
  double loss_scale = 0;
  std::int64_t loss_scale_good_steps = 0;
};

/// Test hook (documented in README "Faults"; io/fault_injection.h reads it):
/// PARTRAIN_FAULT_INJECT=checkpoint_write:RANK[:STEP] makes the collective write of the first
/// dataset fail on RANK alone (of checkpoint STEP only, when given), as a disk error on that rank
/// would; every rank then stops with the same error. checkpoint_write_abandon:RANK[:STEP] makes RANK
/// fail before it enters that collective write (an error inside H5Dwrite on one rank): the others
/// wait in it until the write timeout.

/// "step_000042.h5".
std::string checkpoint_file_name(std::int64_t step);

/// Writes `directory`/step_<step, 6 digits>.h5 collectively over `world` (an MpiCommunicator; every
/// rank calls it with the SAME names and shapes in the same order; `data` defined on the ranks that
/// write a tensor, each its CheckpointPart, the parts together holding every element once: one rank
/// writing it whole, tensor-parallel shards, ZeRO-1 pieces of them). Checked before anything is written, on every rank alike (a tensor with no
/// writer or with two, differing name lists, a data shape that is not the declared one, a GPU
/// tensor): all ranks throw the same partrain::Error. Writes `step_XXXXXX.h5.tmp` with parallel HDF5
/// (MPI-IO, collective transfers), flushes and closes it, renames it (rank 0, after a barrier), then
/// deletes all but the newest `keep` step_*.h5 files (keep <= 0: keep all) and stale *.h5.tmp files.
/// Returns the final path. Every HDF5 step that can fail on one rank alone (create, attributes,
/// each dataset, flush, close) is followed by an agreement over `world`, so a failure on any rank
/// (a full disk) becomes a partrain::CollectiveError with the same message on every rank, naming
/// the file, the failing rank, the dataset and the OS error; the .tmp file is then removed and the
/// earlier checkpoints are left as they were. Rank 0 allocates an upper bound of the file's size
/// (posix_fallocate) before any data is written and trims it afterwards: a full disk must fail there,
/// because parallel HDF5 hangs when a collective write fails on one rank. Nothing hangs: a close that HDF5 cannot finish after a
/// failure ends the process after 30 s (mpiexec or srun then ends the job), and so does any
/// collective step of the write (create, a dataset, flush, close) that has not ended after
/// `write_timeout_seconds` on a rank: an I/O error inside HDF5 or MPI-IO that one rank meets while
/// the others wait in the collective (PARTRAIN_FAULT_INJECT=checkpoint_write_abandon:RANK[:STEP]
/// makes RANK leave the first dataset's collective write) then ends the job with one line per rank
/// naming the file, the step and the rank, instead of hanging.
std::string write_checkpoint(comm::Communicator& world, const std::string& directory, const CheckpointInfo& info,
                             const std::vector<CheckpointTensor>& tensors, int keep, double write_timeout_seconds = 600);

/// A checkpoint read back.
struct Checkpoint {
  std::string path;
  CheckpointInfo info;
  std::map<std::string, Tensor> tensors;  // fp32 host tensors by full name
};

/// Reads (serially; any rank) and verifies a checkpoint: attributes present and format version
/// supported, every dataset read intact (HDF5 verifies Fletcher32 on read), every name in `required`
/// present. Returns the tensors whose names start with one of `prefixes` (empty: all) plus the
/// required ones. Errors (partrain::Error) name the file and the dataset or attribute; a truncated
/// file reads "PATH: not a readable HDF5 file (truncated or damaged)".
Checkpoint read_checkpoint(const std::string& path, const std::vector<std::string>& required = {},
                           const std::vector<std::string>& prefixes = {});

/// Reads every dataset of `path` (one at a time, discarding the data) and its attributes; throws
/// like read_checkpoint. What latest_valid_checkpoint runs on each candidate.
void verify_checkpoint(const std::string& path, const std::vector<std::string>& required = {});

/// The checkpoint files in `directory` (step_<digits>.h5, not *.tmp), newest step first. Empty when
/// the directory does not exist.
std::vector<std::string> list_checkpoints(const std::string& directory);

/// `--resume latest`: the newest checkpoint in `directory` that verifies completely (and holds every
/// name in `required`); each newer one skipped is appended to `skipped` (if non-null) as
/// "path: reason". Throws partrain::Error naming the directory when none is valid.
std::string latest_valid_checkpoint(const std::string& directory, std::vector<std::string>* skipped,
                                    const std::vector<std::string>& required = {});

/// Dataset names (recursively: "model/x", "optim/x/exp_avg"), sorted, with shapes, and the info -
/// for `partrain inspect FILE.h5`. Reads no tensor data.
struct CheckpointSummary {
  CheckpointInfo info;
  std::vector<std::pair<std::string, Shape>> tensors;
};
CheckpointSummary summarize_checkpoint(const std::string& path);

}  // namespace partrain::io
