#include "io/checkpoint.h"

#include <hdf5.h>
#include <mpi.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <regex>
#include <sstream>

#include "comm/mpi_communicator.h"
#include "core/collective_error.h"
#include "core/error.h"
#include "io/fault_injection.h"
#include "core/watchdog.h"
#include "io/hdf5_file.h"

namespace partrain::io {
namespace fs = std::filesystem;
namespace {

constexpr std::int64_t kChunkElements = std::int64_t{1} << 20;  // 4 MiB of fp32 per chunk

void silence_hdf5_errors() {
  static const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

/// The most specific message on HDF5's error stack of this thread (e.g. "data error detected by
/// Fletcher32 checksum"), or "" when empty. Call right after the failed API call.
std::string hdf5_error_detail() {
  std::string detail;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_UPWARD,
      [](unsigned n, const H5E_error2_t* error, void* data) -> herr_t {
        auto* out = static_cast<std::string*>(data);
        if (n == 0 && error != nullptr) {
          char minor[256] = {0};
          if (H5Eget_msg(error->min_num, nullptr, minor, sizeof minor) > 0) *out = minor;
          if (error->desc != nullptr && *error->desc != '\0') {
            if (!out->empty()) *out += ": ";
            *out += error->desc;
          }
        }
        return 0;
      },
      &detail);
  return detail;
}

std::string with_detail(const std::string& message) {
  const std::string detail = hdf5_error_detail();
  return detail.empty() ? message : message + " (" + detail + ")";
}

/// with_detail, and the OS error (strerror(errno)) when the failed call left one: "No space left
/// on device" is what a user can act on.
std::string with_os_detail(const std::string& message) {
  const int code = errno;
  const std::string described = with_detail(message);
  if (code == 0) return described;
  return described + ": " + std::strerror(code);
}

/// An upper bound of the checkpoint file's size: the data, a Fletcher32 checksum per chunk, 8 KiB of
/// object header and chunk index per dataset, the attributes twice, and 1 MiB.
std::int64_t reserved_bytes(const std::vector<CheckpointTensor>& tensors, const CheckpointInfo& info) {
  std::int64_t bytes = std::int64_t{1} << 20;
  bytes += 2 * static_cast<std::int64_t>(info.config_toml.size() + info.plan_json.size() + info.optimizer.size());
  for (const CheckpointTensor& tensor : tensors) {
    const std::int64_t count = numel(tensor.shape);
    bytes += 4 * count + 4 * (count / kChunkElements + 1) + 8192;
  }
  return bytes;
}

/// Allocates the first `bytes` of `path` on disk (rank 0, once HDF5 created it): parallel HDF5
/// cannot recover from a write that fails on one rank inside a collective transfer (it hangs), so a
/// full disk must show up here, before any data is written, as one local error. "" or the error.
std::string reserve_space(const std::string& path, std::int64_t bytes) {
  const int descriptor = ::open(path.c_str(), O_WRONLY);
  if (descriptor < 0) return path + ": cannot open it to reserve space: " + std::strerror(errno);
  const int code = ::posix_fallocate(descriptor, 0, static_cast<off_t>(bytes));
  ::close(descriptor);
  if (code == 0) return {};
  return path + ": cannot reserve " + std::to_string(bytes >> 20) + " MiB for the checkpoint: " + std::strerror(code);
}

/// Cuts the space reserve_space allocated beyond the end of the HDF5 file that was written (the
/// end-of-file address of superblock version 2 and 3, at byte 28). Leaves other files alone.
void trim_reserved_space(const std::string& path) {
  const int descriptor = ::open(path.c_str(), O_RDWR);
  if (descriptor < 0) return;
  unsigned char superblock[36] = {0};
  if (::pread(descriptor, superblock, sizeof superblock, 0) == static_cast<ssize_t>(sizeof superblock) &&
      std::memcmp(superblock, "\x89HDF\r\n\x1a\n", 8) == 0 && (superblock[8] == 2 || superblock[8] == 3) &&
      superblock[9] == 8) {
    std::uint64_t end = 0;
    for (int i = 7; i >= 0; --i) end = (end << 8) | superblock[28 + i];
    struct stat status {};
    if (::fstat(descriptor, &status) == 0 && end > 0 && static_cast<std::uint64_t>(status.st_size) > end)
      (void)::ftruncate(descriptor, static_cast<off_t>(end));
  }
  ::close(descriptor);
}

/// How long closing a checkpoint file after a failed write may take before the rank gives up.
constexpr double kCloseSeconds = 30;

/// Every rank's error of one step, agreed: "" when every rank succeeded, else "rank R: message"
/// of the lowest failing rank - the same string on every rank. Collective over `world`.
std::string agree_on_error(comm::Communicator& world, const std::string& local_error) {
  if (world.all_reduce_scalar(local_error.empty() ? 0.0 : 1.0, comm::ReduceOp::Max) == 0.0) return {};
  const std::vector<std::string> errors = world.all_gather_bytes(local_error);
  for (std::size_t rank = 0; rank < errors.size(); ++rank)
    if (!errors[rank].empty()) return "rank " + std::to_string(rank) + ": " + errors[rank];
  return "an unknown rank failed";
}

bool starts_with_any(const std::string& name, const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return true;
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](const std::string& prefix) { return name.rfind(prefix, 0) == 0; });
}

std::uint64_t fnv1a(std::uint64_t hash, const void* data, std::size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < size; ++i) {
    hash ^= bytes[i];
    hash *= 1099511628211ull;
  }
  return hash;
}

std::string hex64(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

/// Empty if `name` is a usable dataset path ("model/x", "optim/x/exp_avg"), else why not.
std::string name_problem(const std::string& name) {
  if (name.empty()) return "empty tensor name";
  if (name.front() == '/' || name.back() == '/' || name.find("//") != std::string::npos)
    return "tensor name '" + name + "' is not a relative HDF5 path (no leading, trailing or double '/')";
  if (name.find('.') == 0) return "tensor name '" + name + "' starts with '.'";
  return {};
}

// ---------------------------------------------------------------- attributes

void write_int_attribute(hid_t file, const char* name, hid_t file_type, hid_t memory_type, const void* value,
                         const std::string& path) {
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle attribute(H5Acreate2(file, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  PARTRAIN_CHECK(attribute.valid(), with_detail(path + ": cannot create attribute '" + name + "'"));
  PARTRAIN_CHECK(H5Awrite(attribute.get(), memory_type, value) >= 0,
                 with_detail(path + ": cannot write attribute '" + name + "'"));
}

void write_string_attribute(hid_t file, const char* name, const std::string& value, const std::string& path) {
  // Fixed-length (parallel HDF5 and every reader handle these); large ones go to dense attribute
  // storage (file format >= 1.8, set on the file access property list).
  Hdf5Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), std::max<std::size_t>(value.size(), 1));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle attribute(H5Acreate2(file, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT));
  PARTRAIN_CHECK(attribute.valid(), with_detail(path + ": cannot create attribute '" + name + "'"));
  std::string padded = value;
  if (padded.empty()) padded.push_back('\0');
  PARTRAIN_CHECK(H5Awrite(attribute.get(), type.get(), padded.data()) >= 0,
                 with_detail(path + ": cannot write attribute '" + name + "'"));
}

Hdf5Handle open_attribute(hid_t file, const char* name, const std::string& path) {
  const htri_t exists = H5Aexists(file, name);
  PARTRAIN_CHECK(exists > 0, path << ": missing attribute '" << name << "' (not a partrain checkpoint?)");
  Hdf5Handle attribute(H5Aopen(file, name, H5P_DEFAULT));
  PARTRAIN_CHECK(attribute.valid(), with_detail(path + ": cannot open attribute '" + name + "'"));
  return attribute;
}

template <typename T>
T read_number_attribute(hid_t file, const char* name, hid_t memory_type, const std::string& path) {
  Hdf5Handle attribute = open_attribute(file, name, path);
  Hdf5Handle type(H5Aget_type(attribute.get()));
  PARTRAIN_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, path << ": attribute '" << name << "' is not an integer");
  T value{};
  PARTRAIN_CHECK(H5Aread(attribute.get(), memory_type, &value) >= 0,
                 with_detail(path + ": cannot read attribute '" + name + "'"));
  return value;
}

std::string read_string_attribute(hid_t file, const char* name, const std::string& path) {
  Hdf5Handle attribute = open_attribute(file, name, path);
  Hdf5Handle type(H5Aget_type(attribute.get()));
  PARTRAIN_CHECK(H5Tget_class(type.get()) == H5T_STRING, path << ": attribute '" << name << "' is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    Hdf5Handle memory_type(H5Tcopy(H5T_C_S1));
    H5Tset_size(memory_type.get(), H5T_VARIABLE);
    H5Tset_cset(memory_type.get(), H5Tget_cset(type.get()));  // UTF-8 as h5py writes, or ASCII
    char* text = nullptr;
    PARTRAIN_CHECK(H5Aread(attribute.get(), memory_type.get(), &text) >= 0,
                   with_detail(path + ": cannot read attribute '" + name + "'"));
    std::string value = text != nullptr ? text : "";
    Hdf5Handle space(H5Aget_space(attribute.get()));
    H5Dvlen_reclaim(memory_type.get(), space.get(), H5P_DEFAULT, &text);
    return value;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  PARTRAIN_CHECK(H5Aread(attribute.get(), type.get(), value.data()) >= 0,
                 with_detail(path + ": cannot read attribute '" + name + "'"));
  const std::size_t end = value.find('\0');
  if (end != std::string::npos) value.resize(end);
  return value;
}

void write_info(hid_t file, const CheckpointInfo& info, const std::string& path) {
  auto write_int64 = [&](const char* name, std::int64_t value) {
    write_int_attribute(file, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value, path);
  };
  write_int64("format_version", info.format_version);
  write_int64("step", info.step);
  write_int64("consumed_samples", info.consumed_samples);
  write_int64("data_cursor", info.data_cursor);
  write_int_attribute(file, "seed", H5T_STD_U64LE, H5T_NATIVE_UINT64, &info.seed, path);
  write_int64("lr_step", info.lr_step);
  write_string_attribute(file, "optimizer", info.optimizer, path);
  write_string_attribute(file, "config_toml", info.config_toml, path);
  write_string_attribute(file, "plan_json", info.plan_json, path);
  if (info.loss_scale > 0) {  // fp16 runs only: other runs' files stay as they were
    write_int_attribute(file, "loss_scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &info.loss_scale, path);
    write_int64("loss_scale_good_steps", info.loss_scale_good_steps);
  }
}

// The optional loss-scaler attributes (a file of an fp32/bf16 run, or an older one, has none).
void read_loss_scale(hid_t file, CheckpointInfo& info, const std::string& path) {
  if (H5Aexists(file, "loss_scale") <= 0) return;
  Hdf5Handle attribute = open_attribute(file, "loss_scale", path);
  PARTRAIN_CHECK(H5Aread(attribute.get(), H5T_NATIVE_DOUBLE, &info.loss_scale) >= 0,
                 with_detail(path + ": cannot read attribute 'loss_scale'"));
  info.loss_scale_good_steps = read_number_attribute<std::int64_t>(file, "loss_scale_good_steps", H5T_NATIVE_INT64, path);
}

CheckpointInfo read_info(hid_t file, const std::string& path) {
  CheckpointInfo info;
  info.format_version = read_number_attribute<std::int64_t>(file, "format_version", H5T_NATIVE_INT64, path);
  PARTRAIN_CHECK(info.format_version >= 1 && info.format_version <= kCheckpointFormatVersion,
                 path << ": checkpoint format version " << info.format_version
                      << " is not supported (this build reads 1 to " << kCheckpointFormatVersion << ")");
  info.step = read_number_attribute<std::int64_t>(file, "step", H5T_NATIVE_INT64, path);
  info.consumed_samples = read_number_attribute<std::int64_t>(file, "consumed_samples", H5T_NATIVE_INT64, path);
  info.data_cursor = read_number_attribute<std::int64_t>(file, "data_cursor", H5T_NATIVE_INT64, path);
  info.seed = read_number_attribute<std::uint64_t>(file, "seed", H5T_NATIVE_UINT64, path);
  info.lr_step = read_number_attribute<std::int64_t>(file, "lr_step", H5T_NATIVE_INT64, path);
  info.optimizer = read_string_attribute(file, "optimizer", path);
  info.config_toml = read_string_attribute(file, "config_toml", path);
  info.plan_json = read_string_attribute(file, "plan_json", path);
  read_loss_scale(file, info, path);
  return info;
}

// ---------------------------------------------------------------- reading

Hdf5Handle open_checkpoint_file(const std::string& path) {
  silence_hdf5_errors();
  std::error_code error;
  PARTRAIN_CHECK(fs::is_regular_file(path, error), path << ": no such checkpoint file");
  Hdf5Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
  PARTRAIN_CHECK(file.valid(), path << ": not a readable HDF5 file (truncated or damaged)");
  return file;
}

/// Every dataset below "/" (full relative names), sorted.
std::vector<std::string> dataset_names(hid_t file, const std::string& path) {
  std::vector<std::string> names;
  const herr_t status = H5Lvisit(
      file, H5_INDEX_NAME, H5_ITER_INC,
      [](hid_t group, const char* name, const H5L_info_t* info, void* data) -> herr_t {
        if (info->type != H5L_TYPE_HARD) return 0;
        Hdf5Handle object(H5Oopen(group, name, H5P_DEFAULT));
        if (!object.valid()) return -1;
        if (H5Iget_type(object.get()) == H5I_DATASET) static_cast<std::vector<std::string>*>(data)->push_back(name);
        return 0;
      },
      &names);
  PARTRAIN_CHECK(status >= 0, with_detail(path + ": cannot list the datasets (damaged file?)"));
  std::sort(names.begin(), names.end());
  return names;
}

Shape dataset_shape(hid_t dataset, const std::string& path, const std::string& name) {
  Hdf5Handle space(H5Dget_space(dataset));
  const int rank = space.valid() ? H5Sget_simple_extent_ndims(space.get()) : -1;
  PARTRAIN_CHECK(rank >= 0, with_detail(path + ": cannot read the shape of dataset '" + name + "'"));
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return Shape(dims.begin(), dims.end());
}

/// Reads dataset `name` as fp32 into `out` (a fresh tensor) or, when `out` is null, into a scratch
/// buffer (verification only).
void read_dataset(hid_t file, const std::string& path, const std::string& name, Tensor* out,
                  std::vector<float>* scratch) {
  Hdf5Handle dataset(H5Dopen2(file, name.c_str(), H5P_DEFAULT));
  PARTRAIN_CHECK(dataset.valid(), with_detail(path + ": cannot open dataset '" + name + "' (damaged file?)"));
  Hdf5Handle type(H5Dget_type(dataset.get()));
  PARTRAIN_CHECK(type.valid() && H5Tget_class(type.get()) == H5T_FLOAT,
                 path << ": dataset '" << name << "' is not floating point");
  const Shape shape = dataset_shape(dataset.get(), path, name);
  // A damaged header can declare any shape: refuse one the file is too small to hold before
  // allocating it (found by the checkpoint fuzzer: a mutated dimension meant an out-of-memory).
  double declared_bytes = static_cast<double>(sizeof(float));
  for (std::int64_t dimension : shape) declared_bytes *= static_cast<double>(dimension);
  std::error_code error;
  const double file_bytes = static_cast<double>(std::filesystem::file_size(path, error));
  PARTRAIN_CHECK(!error && declared_bytes <= file_bytes,
                 path << ": dataset '" << name << "' declares shape " << shape_string(shape) << " ("
                      << declared_bytes << " bytes), more than the file holds (" << file_bytes
                      << " bytes): the file is damaged");
  // The same for the chunk size, which HDF5 allocates to run the Fletcher32 filter, and for the
  // stored size of the chunks.
  Hdf5Handle creation(H5Dget_create_plist(dataset.get()));
  if (creation.valid() && H5Pget_layout(creation.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(std::max<std::size_t>(1, shape.size()), 0);
    const int rank = H5Pget_chunk(creation.get(), static_cast<int>(chunk.size()), chunk.data());
    double chunk_bytes = static_cast<double>(sizeof(float));
    for (int i = 0; i < rank; ++i) chunk_bytes *= static_cast<double>(chunk[i]);
    // The chunk index records each chunk's stored size, which HDF5 reads into one buffer.
    const double stored_bytes = static_cast<double>(H5Dget_storage_size(dataset.get()));
    PARTRAIN_CHECK(rank >= 0 && chunk_bytes <= file_bytes && stored_bytes <= file_bytes,
                   path << ": dataset '" << name << "' declares chunks of " << chunk_bytes << " bytes stored in "
                        << stored_bytes << ", more than the file holds (" << file_bytes
                        << " bytes): the file is damaged");
  }
  const std::int64_t count = numel(shape);
  float* buffer = nullptr;
  if (out != nullptr) {
    *out = Tensor::empty(shape);
    buffer = count > 0 ? out->data<float>() : nullptr;
  } else {
    scratch->resize(static_cast<std::size_t>(count));
    buffer = scratch->data();
  }
  if (count == 0) return;
  PARTRAIN_CHECK(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer) >= 0,
                 with_detail(path + ": dataset '" + name + "' is damaged: reading it failed"));
}

void check_required(const std::string& path, const std::vector<std::string>& names,
                    const std::vector<std::string>& required) {
  for (const std::string& name : required)
    PARTRAIN_CHECK(std::binary_search(names.begin(), names.end(), name),
                   path << ": missing dataset '" << name << "'");
}

}  // namespace

std::string checkpoint_file_name(std::int64_t step) {
  char text[64];
  std::snprintf(text, sizeof text, "step_%06lld.h5", static_cast<long long>(step));
  return text;
}

// ---------------------------------------------------------------- parts of tensors

bool whole_tensor(const CheckpointPart& part) { return part.parts <= 1 && part.begin == 0 && part.end < 0; }

namespace {
// The shape of the tensor-parallel part (the whole shape when parts is 1), after checking `part`.
Shape part_shape(const Shape& shape, const CheckpointPart& part) {
  Shape local = shape;
  if (part.parts > 1) {
    PARTRAIN_CHECK(part.axis >= 0 && part.axis < static_cast<int>(shape.size()) && part.blocks >= 1 &&
                       shape[static_cast<std::size_t>(part.axis)] % (static_cast<std::int64_t>(part.parts) * part.blocks) == 0 &&
                       part.index >= 0 && part.index < part.parts,
                   "part " << part.index << " of " << part.parts << " (" << part.blocks << " blocks) along dimension "
                           << part.axis << " of " << shape_string(shape) << " does not exist");
    local[static_cast<std::size_t>(part.axis)] /= part.parts;
  }
  const std::int64_t elements = numel(local);
  const std::int64_t end = part.end < 0 ? elements : part.end;
  PARTRAIN_CHECK(part.begin >= 0 && part.begin <= end && end <= elements,
                 "elements [" << part.begin << ", " << end << ") are outside the part's " << elements);
  return local;
}
}  // namespace

std::int64_t part_element_count(const Shape& shape, const CheckpointPart& part) {
  const std::int64_t elements = numel(part_shape(shape, part));
  return (part.end < 0 ? elements : part.end) - part.begin;
}

std::vector<Box> part_boxes(const Shape& shape, const CheckpointPart& part) {
  const Shape local = part_shape(shape, part);
  const std::size_t rank = local.size();
  std::int64_t begin = part.begin;
  const std::int64_t end = part.end < 0 ? numel(local) : part.end;
  std::vector<std::int64_t> strides(rank, 1);
  for (std::size_t d = rank; d-- > 1;) strides[d - 1] = strides[d] * local[d];
  // 1. The flat range as boxes of the part: at each step the outermost dimension whose whole units
  //    start at `begin` and fit before `end`, as many units as fit in the enclosing row.
  std::vector<Box> boxes;
  while (begin < end) {
    std::size_t d = 0;
    while (d + 1 < rank && !(begin % strides[d] == 0 && begin + strides[d] <= end)) ++d;
    Box box;
    std::int64_t rest = begin;
    for (std::size_t k = 0; k < rank; ++k) {
      const std::int64_t coordinate = rest / strides[k];
      rest %= strides[k];
      box.start.push_back(k <= d ? coordinate : 0);
      box.count.push_back(k < d ? 1 : local[k]);
    }
    const std::int64_t units = rank == 0 ? 1 : std::min((end - begin) / strides[d], local[d] - box.start[d]);
    if (rank > 0) box.count[d] = units;
    boxes.push_back(box);
    begin += units * (rank == 0 ? 1 : strides[d]);
  }
  if (part.parts <= 1) return boxes;
  // 2. Along the split axis, part coordinate i is file coordinate b·parts·chunk + index·chunk + o
  //    (i = b·chunk + o): split each box at the block boundaries and move the pieces.
  const auto axis = static_cast<std::size_t>(part.axis);
  const std::int64_t chunk = local[axis] / part.blocks;
  std::vector<Box> file_boxes;
  for (const Box& box : boxes) {
    for (std::int64_t i = box.start[axis]; i < box.start[axis] + box.count[axis];) {
      const std::int64_t block = i / chunk, offset = i % chunk;
      const std::int64_t length = std::min(chunk - offset, box.start[axis] + box.count[axis] - i);
      Box moved = box;
      moved.start[axis] = block * part.parts * chunk + part.index * chunk + offset;
      moved.count[axis] = length;
      file_boxes.push_back(moved);
      i += length;
    }
  }
  return file_boxes;
}

// ---------------------------------------------------------------- writing

namespace {

// Step 1 of write_checkpoint, this rank's side: "<digest>|<counts>|<error>", the digest of the
// tensor list (names and shapes), the elements this rank writes of each tensor (comma-separated)
// and the first problem found in its part of the list ("" when none), for every rank to compare.
std::string describe_tensor_list(const std::vector<CheckpointTensor>& tensors) {
  std::string local_error;
  std::string counts;  // elements this rank writes of each tensor, comma-separated
  std::uint64_t digest = 14695981039346656037ull;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const CheckpointTensor& tensor = tensors[i];
    digest = fnv1a(digest, tensor.name.data(), tensor.name.size() + 1);
    digest = fnv1a(digest, tensor.shape.data(), tensor.shape.size() * sizeof(std::int64_t));
    digest = fnv1a(digest, "|", 1);
    if (local_error.empty()) local_error = name_problem(tensor.name);
    if (local_error.empty() && std::any_of(tensor.shape.begin(), tensor.shape.end(), [](auto d) { return d < 0; }))
      local_error = "tensor '" + tensor.name + "' has a symbolic or negative shape " + shape_string(tensor.shape);
    std::int64_t count = 0;
    if (tensor.data.defined() && local_error.empty()) {
      try {
        count = part_element_count(tensor.shape, tensor.part);
      } catch (const Error& problem) {
        local_error = "tensor '" + tensor.name + "': " + problem.message();
      }
      if (!local_error.empty()) {
      } else if (!tensor.data.device().is_cpu()) {
        local_error = "tensor '" + tensor.name + "' is on " + tensor.data.device().to_string() + " (copy it to the host first)";
      } else if (tensor.part.end < 0 && tensor.data.shape() != part_shape(tensor.shape, tensor.part)) {
        // A whole tensor or tensor-parallel part comes in its own shape; a range of elements in any.
        local_error = "tensor '" + tensor.name + "' has data of shape " + shape_string(tensor.data.shape()) +
                      ", declared " + shape_string(part_shape(tensor.shape, tensor.part));
      } else if (tensor.data.numel() != count) {
        local_error = "tensor '" + tensor.name + "' has data of shape " + shape_string(tensor.data.shape()) + " for " +
                      std::to_string(count) + " elements of " + shape_string(tensor.shape);
      }
    }
    counts += (i ? "," : "") + std::to_string(count);
  }
  for (std::size_t i = 0; i + 1 < tensors.size() && local_error.empty(); ++i)
    for (std::size_t j = i + 1; j < tensors.size(); ++j)
      if (tensors[i].name == tensors[j].name) {
        local_error = "tensor '" + tensors[i].name + "' is listed twice";
        break;
      }
  return hex64(digest) + "|" + counts + "|" + local_error;
}

// Step 1, the verdict on every rank's describe_tensor_list (`gathered`, by rank): "" or what is
// wrong (a rank's own problem, a rank with another list than rank 0's, a tensor whose writers'
// parts do not add up to it). Every rank parses the same gathered strings and compares with rank
// 0's list, so every rank reaches the same verdict without another collective.
std::string tensor_list_problem(const std::vector<std::string>& gathered, const std::vector<CheckpointTensor>& tensors) {
  std::string error;
  const std::string reference_digest = gathered[0].substr(0, 16);
  std::vector<std::vector<std::int64_t>> written(gathered.size());  // per rank, per tensor
  for (std::size_t r = 0; r < gathered.size() && error.empty(); ++r) {
    const std::string& entry = gathered[r];
    const std::size_t bar = entry.find('|', 17);
    const std::string their_error = bar == std::string::npos ? std::string() : entry.substr(bar + 1);
    if (!their_error.empty()) {
      error = "rank " + std::to_string(r) + ": " + their_error;
      break;
    }
    if (entry.substr(0, 16) != reference_digest) {
      error = "rank " + std::to_string(r) + " passed a different list of tensor names and shapes than rank 0";
      break;
    }
    std::istringstream list(entry.substr(17, bar - 17));
    for (std::string item; std::getline(list, item, ',');) written[r].push_back(std::stoll(item));
  }
  for (std::size_t i = 0; i < tensors.size() && error.empty(); ++i) {
    // The writers' parts must add up to the tensor; a rank writing all of it must be the only writer.
    const std::int64_t total = numel(tensors[i].shape);
    std::int64_t sum = 0;
    std::vector<int> ranks;
    for (std::size_t r = 0; r < gathered.size(); ++r) {
      const std::int64_t count = i < written[r].size() ? written[r][i] : 0;
      if (count == 0 && !(total == 0 && tensors[i].data.defined())) continue;
      sum += count;
      ranks.push_back(static_cast<int>(r));
    }
    if (ranks.empty() && total > 0) {
      error = "no rank holds the data of tensor '" + tensors[i].name + "'";
    } else if (sum != total) {
      error = "tensor '" + tensors[i].name + "' has data on ranks " + std::to_string(ranks[0]) +
              (ranks.size() > 1 ? " and " + std::to_string(ranks[1]) : std::string()) +
              " whose parts hold " + std::to_string(sum) + " of its " + std::to_string(total) +
              " elements (exactly one rank must write each element)";
    }
  }
  return error;
}

// Step 2a: rank 0 creates the checkpoint directory; a failure is the same CollectiveError on every rank.
void create_checkpoint_directory(comm::Communicator& world, const std::string& directory) {
  std::string directory_error;
  if (world.rank() == 0) {
    std::error_code code;
    fs::create_directories(directory, code);
    if (code) directory_error = "cannot create checkpoint directory '" + directory + "': " + code.message();
  }
  world.broadcast_bytes(directory_error, 0);
  if (!directory_error.empty()) PARTRAIN_FAIL_COLLECTIVE(directory_error);
}

// The steps of the collective write. Every HDF5 step that can fail on one rank alone (a full disk
// shows up on whichever rank writes the block that does not fit) is followed by an agreement: all
// ranks learn the first failing rank's message and skip the remaining steps together, so no rank
// waits in a collective that another has left. An error inside a collective HDF5 or MPI-IO call on
// one rank leaves the others waiting in it, where no agreement can reach them: each step is
// bounded, and a step that does not end ends the process (first removing the half-written file,
// which every rank sees), so that mpiexec or srun ends the job.
class AgreedSteps {
 public:
  AgreedSteps(comm::Communicator& world, std::string final_path, std::string temporary_path, double timeout_seconds)
      : world_(world), final_path_(std::move(final_path)), temporary_path_(std::move(temporary_path)),
        timeout_seconds_(timeout_seconds) {}

  // Runs `body` on every rank, bounded, unless an error was agreed on; then agrees on its error.
  void run(const std::function<void()>& body) {
    if (!error_.empty()) return;
    const Watchdog watchdog = bound();
    std::string local;
    try {
      errno = 0;
      body();
    } catch (const Error& caught) {
      local = caught.message();
    }
    agree(local);
  }

  // A watchdog that ends the process when the step it guards outlasts [checkpoint] write_timeout.
  Watchdog bound() const {
    const std::string temporary_path = temporary_path_;
    return Watchdog(timeout_seconds_,
                    "cannot write checkpoint " + final_path_ + ": a collective step of the write did not end within " +
                        std::to_string(static_cast<int>(timeout_seconds_)) + " s on rank " +
                        std::to_string(world_.rank()) +
                        " (an I/O error on some rank inside HDF5 or MPI-IO; [checkpoint] write_timeout)",
                    1, [temporary_path] { ::unlink(temporary_path.c_str()); });
  }

  // Agrees on this rank's `local` error ("" when none) with every rank (collective).
  void agree(const std::string& local) { error_ = agree_on_error(world_, local); }

  // The agreed error: "" while every step succeeded; identical on every rank.
  const std::string& error() const { return error_; }

 private:
  comm::Communicator& world_;
  std::string final_path_, temporary_path_;
  double timeout_seconds_;
  std::string error_;
};

// The chunk dimensions of a dataset of `shape` (rank > 0, elements > 0): whole trailing dimensions
// first, up to kChunkElements.
std::vector<hsize_t> chunk_dimensions(const Shape& shape) {
  std::vector<hsize_t> chunk(shape.size());
  std::int64_t budget = kChunkElements;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    const std::int64_t extent =
        std::min<std::int64_t>(shape[static_cast<std::size_t>(d)], std::max<std::int64_t>(budget, 1));
    chunk[static_cast<std::size_t>(d)] = static_cast<hsize_t>(extent);
    budget /= extent;
  }
  return chunk;
}

// The test hooks (kFaultInjectVariable) of one checkpoint's write: the rank whose write fails after
// the collective write completed, and the rank that leaves before it; −1 for none.
struct InjectedFaults {
  int failing_rank = -1;
  int abandoning_rank = -1;
};

// One dataset of the collective write (every rank, in the same order): creates `tensor`'s f32
// dataset in `file` (chunked with Fletcher32), and writes this rank's part of it (none when it holds
// no data). Throws partrain::Error naming the dataset.
void write_dataset(hid_t file, hid_t link_create, hid_t transfer, const CheckpointTensor& tensor,
                   const std::string& temporary_path, int this_rank, const InjectedFaults& faults) {
  const std::string what = temporary_path + ": dataset '" + tensor.name + "'";
  const int rank = static_cast<int>(tensor.shape.size());
  const std::int64_t count = numel(tensor.shape);
  std::vector<hsize_t> dims(tensor.shape.begin(), tensor.shape.end());
  Hdf5Handle space(rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dims.data(), nullptr));
  Hdf5Handle create(H5Pcreate(H5P_DATASET_CREATE));
  H5Pset_fill_time(create.get(), H5D_FILL_TIME_NEVER);
  if (rank > 0 && count > 0) {
    const std::vector<hsize_t> chunk = chunk_dimensions(tensor.shape);
    PARTRAIN_CHECK(H5Pset_chunk(create.get(), rank, chunk.data()) >= 0 && H5Pset_fletcher32(create.get()) >= 0,
                   with_detail(what + ": cannot set chunking and Fletcher32"));
  }
  Hdf5Handle dataset(H5Dcreate2(file, tensor.name.c_str(), H5T_IEEE_F32LE, space.get(), link_create, create.get(),
                                H5P_DEFAULT));
  PARTRAIN_CHECK(dataset.valid(), with_os_detail(what + ": cannot create it"));
  if (count == 0) return;
  const bool writer = tensor.data.defined();
  const hsize_t memory_count = static_cast<hsize_t>(writer ? tensor.data.numel() : count);
  Hdf5Handle memory_space(H5Screate_simple(1, &memory_count, nullptr));
  Hdf5Handle file_space(H5Dget_space(dataset.get()));
  if (writer && !whole_tensor(tensor.part)) {
    // The part's elements: a union of boxes of the dataset, in the same row-major order.
    bool first = true;
    for (const Box& box : part_boxes(tensor.shape, tensor.part)) {
      const std::vector<hsize_t> start(box.start.begin(), box.start.end()), extent(box.count.begin(), box.count.end());
      PARTRAIN_CHECK(H5Sselect_hyperslab(file_space.get(), first ? H5S_SELECT_SET : H5S_SELECT_OR, start.data(), nullptr,
                                         extent.data(), nullptr) >= 0,
                     with_detail(what + ": cannot select this rank's part"));
      first = false;
    }
  }
  std::vector<float> converted;
  float dummy = 0.0f;
  const void* buffer = &dummy;
  if (writer) {
    if (tensor.data.dtype() == DType::F32) {
      buffer = tensor.data.data<float>();
    } else {
      converted = tensor.data.to_float_vector();
      buffer = converted.data();
    }
  } else {
    H5Sselect_none(memory_space.get());
    H5Sselect_none(file_space.get());
  }
  // The test hook: this rank leaves before the collective write (an error inside H5Dwrite).
  PARTRAIN_CHECK(faults.abandoning_rank != this_rank,
                 what << ": writing failed on this rank alone (fault injected by " << kFaultInjectVariable << ")");
  const herr_t status = H5Dwrite(dataset.get(), H5T_NATIVE_FLOAT, memory_space.get(), file_space.get(), transfer, buffer);
  PARTRAIN_CHECK(status >= 0, with_os_detail(what + ": writing failed"));
  // The test hook fails the collective write on one rank after it completed everywhere, like a
  // disk error that only that rank's share of the write met.
  PARTRAIN_CHECK(faults.failing_rank != this_rank,
                 what << ": writing failed (fault injected by " << kFaultInjectVariable << ")");
}

// Closes `file` on every rank in the same order. After a successful write everything is on disk:
// closing only rewrites the superblock, collectively, and its failure is agreed on. After a
// failure HDF5 still holds unwritten metadata that closing tries to write: rank 0 frees the file's
// blocks first (a full disk then has room for it), and a close that still hangs inside HDF5 ends
// the process rather than the job waiting.
void close_file(Hdf5Handle& file, AgreedSteps& steps, comm::Communicator& world, const std::string& final_path,
                const std::string& temporary_path) {
  if (steps.error().empty()) {
    std::string local;
    const Watchdog watchdog = steps.bound();
    if (H5Fclose(file.get()) < 0) local = with_os_detail(temporary_path + ": closing failed");
    (void)file.release();
    steps.agree(local);
  } else if (file.valid()) {
    if (world.rank() == 0) ::truncate(temporary_path.c_str(), 0);
    world.barrier();
    const Watchdog watchdog(kCloseSeconds, "cannot write checkpoint " + final_path + ": " + steps.error() +
                                               "; closing the damaged file did not end within " +
                                               std::to_string(static_cast<int>(kCloseSeconds)) + " s on rank " +
                                               std::to_string(world.rank()));
    H5Fclose(file.get());
    (void)file.release();
    H5Eclear2(H5E_DEFAULT);
    world.barrier();
  }
}

// Step 2b: `info` and `tensors` into a new file at `temporary_path` with parallel HDF5 over `mpi`
// (every rank its part of each dataset), flushed and closed on every rank. Returns "" or the agreed
// error (the same on every rank; the file is then closed but not removed).
std::string write_file(comm::MpiCommunicator& mpi, const std::string& final_path, const std::string& temporary_path,
                       const CheckpointInfo& info, const std::vector<CheckpointTensor>& tensors,
                       double write_timeout_seconds) {
  comm::Communicator& world = mpi;
  AgreedSteps steps(world, final_path, temporary_path, write_timeout_seconds);
  const InjectedFaults faults{injected_fault_rank("checkpoint_write", info.step),
                              injected_fault_rank("checkpoint_write_abandon", info.step)};
  Hdf5Handle access, file, link_create, transfer;
  steps.run([&] {
    access = Hdf5Handle(H5Pcreate(H5P_FILE_ACCESS));
    PARTRAIN_CHECK(H5Pset_fapl_mpio(access.get(), mpi.native(), MPI_INFO_NULL) >= 0,
                   with_detail(temporary_path + ": H5Pset_fapl_mpio failed"));
    // Format >= 1.8: attributes larger than 64 KiB (config, plan) go to dense storage.
    H5Pset_libver_bounds(access.get(), H5F_LIBVER_V18, H5F_LIBVER_V110);
    file = Hdf5Handle(H5Fcreate(temporary_path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, access.get()));
    PARTRAIN_CHECK(file.valid(), with_os_detail(temporary_path + ": cannot create the checkpoint file"));
  });
  steps.run([&] {
    if (world.rank() == 0) {
      const std::string problem = reserve_space(temporary_path, reserved_bytes(tensors, info));
      PARTRAIN_CHECK(problem.empty(), problem);
    }
  });
  steps.run([&] {
    write_info(file.get(), info, temporary_path);
    link_create = Hdf5Handle(H5Pcreate(H5P_LINK_CREATE));
    H5Pset_create_intermediate_group(link_create.get(), 1);
    transfer = Hdf5Handle(H5Pcreate(H5P_DATASET_XFER));
    H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_COLLECTIVE);
  });
  for (std::size_t i = 0; i < tensors.size() && steps.error().empty(); ++i)
    steps.run([&] {
      write_dataset(file.get(), link_create.get(), transfer.get(), tensors[i], temporary_path, world.rank(), faults);
    });
  steps.run([&] {
    PARTRAIN_CHECK(H5Fflush(file.get(), H5F_SCOPE_GLOBAL) >= 0, with_os_detail(temporary_path + ": flush failed"));
  });
  close_file(file, steps, world, final_path, temporary_path);
  transfer.reset();
  link_create.reset();
  access.reset();
  return steps.error();
}

// Keeps `final_path` (just written in `directory`) and the newest keep − 1 other checkpoints there;
// a newer file from an abandoned run (resumed from an older step) counts as one of those others.
// Removes leftover temporary files of earlier writes. keep ≤ 0 keeps every checkpoint.
void remove_old_checkpoints(const std::string& directory, const std::string& final_path, int keep) {
  std::error_code code;
  if (keep > 0) {
    int kept = 1;
    for (const std::string& other : list_checkpoints(directory)) {
      if (fs::equivalent(other, final_path, code)) continue;
      if (kept < keep) ++kept;
      else fs::remove(other, code);
    }
  }
  static const std::regex temporary_name(R"(step_\d+\.h5\.tmp)");
  for (const auto& entry : fs::directory_iterator(directory, code))
    if (std::regex_match(entry.path().filename().string(), temporary_name)) fs::remove(entry.path(), code);
}

// Step 3, on rank 0 once every rank has closed the file: after a write that failed (`error`
// non-empty) removes the temporary file and returns `error`; else renames it to `final_path`, keeps
// the newest [checkpoint] keep, and returns "" or the rename's error.
std::string publish_checkpoint(const std::string& directory, const std::string& temporary_path,
                               const std::string& final_path, int keep, const std::string& error) {
  std::error_code code;
  if (!error.empty()) {
    fs::remove(temporary_path, code);
    return error;
  }
  trim_reserved_space(temporary_path);
  fs::rename(temporary_path, final_path, code);
  if (code) return "cannot rename " + temporary_path + " to " + final_path + ": " + code.message();
  remove_old_checkpoints(directory, final_path, keep);
  return {};
}

}  // namespace

std::string write_checkpoint(comm::Communicator& world, const std::string& directory, const CheckpointInfo& info,
                             const std::vector<CheckpointTensor>& tensors, int keep, double write_timeout_seconds) {
  PARTRAIN_CHECK(write_timeout_seconds > 0, "write_checkpoint: write timeout " << write_timeout_seconds << " s");
  silence_hdf5_errors();
  auto* mpi = dynamic_cast<comm::MpiCommunicator*>(&world);
  PARTRAIN_CHECK(mpi != nullptr, "write_checkpoint needs an MPI communicator (parallel HDF5), not '"
                                     << world.backend_name() << "'");
  const std::string final_path = (fs::path(directory) / checkpoint_file_name(info.step)).string();
  const std::string temporary_path = final_path + ".tmp";

  // 1. Agree on the tensor list and on who writes what before touching the file.
  const std::string list_error = tensor_list_problem(world.all_gather_bytes(describe_tensor_list(tensors)), tensors);
  if (!list_error.empty()) PARTRAIN_FAIL_COLLECTIVE("cannot write checkpoint " << final_path << ": " << list_error);

  // 2. The directory (rank 0), then the file, collectively.
  create_checkpoint_directory(world, directory);
  const std::string write_error = write_file(*mpi, final_path, temporary_path, info, tensors, write_timeout_seconds);

  // 3. Every rank has closed the file: rank 0 renames and cleans up.
  std::string final_error = write_error;
  if (world.rank() == 0) final_error = publish_checkpoint(directory, temporary_path, final_path, keep, write_error);
  world.broadcast_bytes(final_error, 0);
  if (!final_error.empty()) PARTRAIN_FAIL_COLLECTIVE("cannot write checkpoint " << final_path << ": " << final_error);
  return final_path;
}

// ---------------------------------------------------------------- reading

Checkpoint read_checkpoint(const std::string& path, const std::vector<std::string>& required,
                           const std::vector<std::string>& prefixes) {
  Hdf5Handle file = open_checkpoint_file(path);
  Checkpoint checkpoint;
  checkpoint.path = path;
  checkpoint.info = read_info(file.get(), path);
  const std::vector<std::string> names = dataset_names(file.get(), path);
  check_required(path, names, required);
  for (const std::string& name : names) {
    if (!starts_with_any(name, prefixes) && std::find(required.begin(), required.end(), name) == required.end())
      continue;
    read_dataset(file.get(), path, name, &checkpoint.tensors[name], nullptr);
  }
  return checkpoint;
}

void verify_checkpoint(const std::string& path, const std::vector<std::string>& required) {
  Hdf5Handle file = open_checkpoint_file(path);
  read_info(file.get(), path);
  const std::vector<std::string> names = dataset_names(file.get(), path);
  check_required(path, names, required);
  std::vector<float> scratch;
  for (const std::string& name : names) read_dataset(file.get(), path, name, nullptr, &scratch);
}

std::vector<std::string> list_checkpoints(const std::string& directory) {
  static const std::regex checkpoint_name(R"(step_(\d+)\.h5)");
  std::vector<std::pair<std::int64_t, std::string>> found;
  std::error_code code;
  if (!fs::is_directory(directory, code)) return {};
  for (const auto& entry : fs::directory_iterator(directory, code)) {
    const std::string file_name = entry.path().filename().string();
    std::smatch match;
    if (!std::regex_match(file_name, match, checkpoint_name) || !entry.is_regular_file(code)) continue;
    found.emplace_back(std::stoll(match[1].str()), entry.path().string());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second > b.second;
  });
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string latest_valid_checkpoint(const std::string& directory, std::vector<std::string>* skipped,
                                    const std::vector<std::string>& required) {
  const std::vector<std::string> candidates = list_checkpoints(directory);
  PARTRAIN_CHECK(!candidates.empty(), "no checkpoint (step_*.h5) in '" << directory << "'");
  for (const std::string& path : candidates) {
    try {
      verify_checkpoint(path, required);
      return path;
    } catch (const Error& error) {
      if (skipped != nullptr) {
        std::string reason = error.message();
        if (reason.rfind(path + ": ", 0) == 0) reason = reason.substr(path.size() + 2);
        skipped->push_back(path + ": " + reason);
      }
    }
  }
  PARTRAIN_FAIL("no valid checkpoint in '" << directory << "': all " << candidates.size()
                                           << " are damaged or incomplete");
}

CheckpointSummary summarize_checkpoint(const std::string& path) {
  Hdf5Handle file = open_checkpoint_file(path);
  CheckpointSummary summary;
  summary.info = read_info(file.get(), path);
  for (const std::string& name : dataset_names(file.get(), path)) {
    Hdf5Handle dataset(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT));
    PARTRAIN_CHECK(dataset.valid(), with_detail(path + ": cannot open dataset '" + name + "' (damaged file?)"));
    summary.tensors.emplace_back(name, dataset_shape(dataset.get(), path, name));
  }
  return summary;
}

}  // namespace partrain::io
