#pragma once
// Batch files: samples stored ready for the model, the exchange format between partrain and other
// implementations of the same models (validation/export_hf.py evaluates Hugging Face models on
// them). Layout: one dataset /batch/<name> per model Input and Label, batch dimension first, all
// with the same number of rows N; sample i is row i of each (no shuffling, no epochs). Integer
// inputs (token ids, labels) are i64, the others f32, as the model reads them (BERT's attention_mask
// is additive: 0 for a token, -10000 for padding, [N, 1, 1, S]). `partrain train --set
// log.save_initial=true` writes every step's batch in this layout (initial_parameters.h5), so do the
// golden files (validation/golden/*.h5) and `partrain eval --save-batches`.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/shape.h"
#include "io/batch_source.h"
#include "io/hdf5_file.h"

namespace partrain::io {

/// One per-sample tensor a batch file must hold: a model Input or Label.
struct BatchField {
  std::string name;
  Shape sample_shape;  ///< without the batch dimension
  DType dtype = DType::F32;
  /// Integer fields: every value must lie in [0, upper_bound) (token ids: the vocabulary; labels:
  /// the classes); unset: not checked.
  std::optional<std::int64_t> upper_bound;
  /// Integer fields: one more accepted value outside the bound (a loss's ignore_index, -100).
  std::optional<std::int64_t> ignore_value;
  /// Where the bound comes from, for messages ("[model] vocab = 30522 in bert.toml").
  std::string bound_source;
};

/// A BatchSource over a batch file, read whole into memory.
class BatchFile : public BatchSource {
 public:
  /// Reads /batch/<name> of every field. Throws partrain::Error naming the file and the dataset
  /// when the file is not HDF5, a dataset is missing, has another per-sample shape than its field,
  /// stores floats for an integer field (or integers for a float field), holds a value outside the
  /// field's bound (naming the row and the value) or a non-finite float, or the datasets' row
  /// counts differ or are 0.
  BatchFile(const std::string& path, const std::vector<BatchField>& fields);

  /// Rows [first, first + count). Throws partrain::Error naming the file when the range goes past
  /// its last row.
  NamedTensors samples(std::int64_t first, std::int64_t count) const override;
  /// The file's row count N.
  std::int64_t samples_per_epoch() const override { return rows_; }
  /// Length of input_ids' rows (0 without input_ids: images).
  std::int64_t tokens_per_sample() const override { return tokens_per_sample_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  NamedTensors tensors_;
  std::int64_t rows_ = 0;
  std::int64_t tokens_per_sample_ = 0;
};

/// Whether `path` is an HDF5 file with a /batch group (a batch file, not a data/prepare.sh data
/// set). Throws partrain::Error naming the file when it is missing or not HDF5.
bool is_batch_file(const std::string& path);

/// Writes `tensors` into `file` as /batch/<name> (i64 tensors as i64, every other dtype as f32):
/// the batch file layout.
void write_batches(Hdf5File& file, const NamedTensors& tensors);

}  // namespace partrain::io
