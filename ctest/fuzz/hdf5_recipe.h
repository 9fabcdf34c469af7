#pragma once
// Structure-aware fuzzing of partrain's HDF5 readers: the fuzzer's bytes are a recipe (groups,
// datasets of any type, rank and shape, attributes, with names drawn from what the reader looks
// for), which HDF5 itself writes as a well-formed file. The reader then sees every combination of
// content partrain must validate, without the fuzzer mutating HDF5's own metadata: HDF5 1.10's
// parser crashes on damaged metadata (a local heap that declares more bytes than it holds ends in a
// memcpy from a failed allocation inside H5F__accum_read; an object header's attribute message
// overflows in H5Aexists_by_name), library bugs no reader can guard against. The raw-byte corpora
// in ctest/data/fuzz/<target>/ are still replayed (PARTRAIN_FUZZ_RAW_HDF5=1, see ctest/CMakeLists.txt).
#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fuzz/fuzz_input_file.h"

namespace partrain::fuzz {

/// Whether this run replays raw HDF5 files (the committed corpora) instead of building recipes.
inline bool raw_hdf5_inputs() {
  static const bool raw = std::getenv("PARTRAIN_FUZZ_RAW_HDF5") != nullptr;
  return raw;
}

namespace recipe_detail {

inline const std::string& pick(FuzzedDataProvider& input, const std::vector<std::string>& names) {
  return names[input.ConsumeIntegralInRange<std::size_t>(0, names.size() - 1)];
}

inline hid_t file_type(int choice) {
  switch (choice) {
    case 0: return H5T_STD_I64LE;
    case 1: return H5T_STD_I32LE;
    case 2: return H5T_STD_U8LE;
    case 3: return H5T_STD_I8LE;
    case 4: return H5T_IEEE_F32LE;
    case 5: return H5T_IEEE_F64LE;
    default: return H5T_STD_U64LE;
  }
}

// Values near the readers' bounds come up more often than uniform draws would give them.
inline double next_value(FuzzedDataProvider& input) {
  switch (input.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return input.ConsumeIntegralInRange<int>(-2, 20);
    case 1: return static_cast<double>(input.ConsumeIntegral<std::int64_t>());
    case 2: return input.ConsumeFloatingPoint<double>();
    case 3: return std::numeric_limits<double>::quiet_NaN();
    case 4: return -100;
    default: return input.ConsumeIntegralInRange<int>(0, 3);
  }
}

// Creates every missing group on the way to `path` (HDF5 would refuse the dataset otherwise).
inline void create_parents(hid_t file, const std::string& path) {
  hid_t properties = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(properties, 1);
  const std::size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0 && H5Lexists(file, path.substr(0, slash).c_str(), H5P_DEFAULT) <= 0) {
    const hid_t group = H5Gcreate2(file, path.substr(0, slash).c_str(), properties, H5P_DEFAULT, H5P_DEFAULT);
    if (group >= 0) H5Gclose(group);
  }
  H5Pclose(properties);
}

/// A one- or more-dimensional dataset of `type` holding `values` (converted from int64), for base files.
inline void fixed_dataset(hid_t file, const std::string& path, hid_t type, const std::vector<hsize_t>& dimensions,
                          const std::vector<std::int64_t>& values) {
  create_parents(file, path);
  const hid_t space = H5Screate_simple(static_cast<int>(dimensions.size()), dimensions.data(), nullptr);
  const hid_t dataset = H5Dcreate2(file, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (dataset >= 0) {
    H5Dwrite(dataset, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(dataset);
  }
  H5Sclose(space);
}

inline void write_dataset(hid_t file, const std::string& path, FuzzedDataProvider& input) {
  const int rank = input.ConsumeIntegralInRange<int>(0, 4);
  std::vector<hsize_t> dimensions(static_cast<std::size_t>(rank));
  std::size_t count = 1;
  for (hsize_t& dimension : dimensions) {
    dimension = input.ConsumeIntegralInRange<hsize_t>(0, 6);
    count *= dimension;
  }
  const hid_t type = file_type(input.ConsumeIntegralInRange<int>(0, 6));
  std::vector<double> values(count);
  for (double& value : values) value = next_value(input);
  create_parents(file, path);
  const hid_t space = rank == 0 ? H5Screate(H5S_SCALAR) : H5Screate_simple(rank, dimensions.data(), nullptr);
  const hid_t dataset = H5Dcreate2(file, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (dataset >= 0) {
    // Out-of-range conversions (NaN to an integer, 1e300 to float) are HDF5's business: it clips.
    if (count > 0) H5Dwrite(dataset, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data());
    H5Dclose(dataset);
  }
  H5Sclose(space);
}

// Replaces attribute `name` of `object` by a scalar of `type`; false when HDF5 refuses.
inline bool create_attribute(hid_t target, const std::string& name, hid_t type, const void* value, hid_t memory_type) {
  if (H5Aexists(target, name.c_str()) > 0) H5Adelete(target, name.c_str());
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attribute = H5Acreate2(target, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT);
  if (attribute >= 0) {
    H5Awrite(attribute, memory_type, value);
    H5Aclose(attribute);
  }
  H5Sclose(space);
  return attribute >= 0;
}

inline void string_attribute(hid_t target, const std::string& name, const std::string& text) {
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, text.empty() ? 1 : text.size());
  const std::string padded = text.empty() ? std::string(1, '\0') : text;
  create_attribute(target, name, type, padded.data(), type);
  H5Tclose(type);
}

inline void number_attribute(hid_t target, const std::string& name, hid_t type, double value) {
  create_attribute(target, name, type, &value, H5T_NATIVE_DOUBLE);
}

inline void write_attribute(hid_t file, const std::string& object, const std::string& name,
                            FuzzedDataProvider& input) {
  const hid_t target = H5Oopen(file, object.c_str(), H5P_DEFAULT);
  if (target < 0) return;
  if (input.ConsumeBool()) {
    string_attribute(target, name, input.ConsumeRandomLengthString(64));
  } else {
    const hid_t type = file_type(input.ConsumeIntegralInRange<int>(0, 6));
    number_attribute(target, name, type, next_value(input));
  }
  H5Oclose(target);
}

}  // namespace recipe_detail

/// Writes the file the recipe in `data` describes and returns its path: up to 24 steps, each a
/// dataset (name from `dataset_names` or the input, rank 0-4, dimensions 0-6, one of seven integer
/// and float types) or an attribute (name from `attribute_names`, on "/" or a dataset written
/// before; an integer, float or string). Names the reader looks for come from the lists so that
/// the fuzzer reaches its checks; a dataset step replaces what the name held. Steps HDF5 refuses
/// are skipped. When given, `base_file` (what a valid file holds first, e.g. a checkpoint's
/// attributes) runs first on half of the inputs, so that the recipe explores past the reader's
/// first checks.
inline std::string write_recipe_file(const std::uint8_t* data, std::size_t size,
                                     const std::vector<std::string>& dataset_names,
                                     const std::vector<std::string>& attribute_names,
                                     const std::function<void(hid_t)>& base_file = {}) {
  static const bool silenced = [] { return H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr) >= 0; }();
  (void)silenced;
  FuzzedDataProvider input(data, size);
  const std::string path = input_path("h5");
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (file < 0) return path;
  using recipe_detail::pick;
  if (base_file && input.ConsumeBool()) base_file(file);
  std::vector<std::string> written = {"/"};
  const int steps = input.ConsumeIntegralInRange<int>(0, 24);
  for (int step = 0; step < steps && input.remaining_bytes() > 0; ++step) {
    if (input.ConsumeBool()) {
      const std::string name = input.ConsumeBool() ? pick(input, dataset_names) : "/" + input.ConsumeRandomLengthString(12);
      if (name == "/") continue;
      if (H5Lexists(file, name.c_str(), H5P_DEFAULT) > 0) H5Ldelete(file, name.c_str(), H5P_DEFAULT);  // replaced
      recipe_detail::write_dataset(file, name, input);
      written.push_back(name);
    } else {
      recipe_detail::write_attribute(file, pick(input, written), pick(input, attribute_names), input);
    }
  }
  H5Fclose(file);
  return path;
}

/// The file a fuzz target reads: the input bytes themselves when replaying raw HDF5 corpora
/// (raw_hdf5_inputs()), otherwise the file write_recipe_file builds from them.
inline std::string hdf5_input(const std::uint8_t* data, std::size_t size, const std::vector<std::string>& dataset_names,
                              const std::vector<std::string>& attribute_names,
                              const std::function<void(hid_t)>& base_file = {}) {
  if (raw_hdf5_inputs()) return write_input(data, size, "h5");
  return write_recipe_file(data, size, dataset_names, attribute_names, base_file);
}

}  // namespace partrain::fuzz
