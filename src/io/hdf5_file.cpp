#include "io/hdf5_file.h"

#include <algorithm>

#include <cstring>
#include <utility>

namespace partrain::io {
namespace {

/// Turns off HDF5's automatic error stack printing once; failures are reported as partrain::Error.
void silence_hdf5_errors() {
  static const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
}

template <typename T> hid_t native_type();
template <> hid_t native_type<std::int32_t>() { return H5T_NATIVE_INT32; }
template <> hid_t native_type<std::int64_t>() { return H5T_NATIVE_INT64; }
template <> hid_t native_type<std::uint8_t>() { return H5T_NATIVE_UINT8; }
template <> hid_t native_type<float>() { return H5T_NATIVE_FLOAT; }

// Whether HDF5's current error stack (after a failed call) holds a filter pipeline error: a chunk
// that deflate (or a checksum filter) rejects, as opposed to a type conversion or a missing object.
bool failed_in_filter_pipeline() {
  bool found = false;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* entry, void* data) -> herr_t {
        if (entry->maj_num == H5E_PLINE) *static_cast<bool*>(data) = true;
        return 0;
      },
      &found);
  return found;
}

std::int64_t element_count(const std::vector<std::int64_t>& shape) {
  std::int64_t count = 1;
  for (std::int64_t dimension : shape) count *= dimension;
  return count;
}

// Deflate (gzip) compresses at most 1032:1: a dataset declaring more bytes than that times what it
// stores is damaged (or hostile), and reading it would allocate the declared size first.
constexpr double kMaximumCompressionRatio = 1032;

}  // namespace

Hdf5Handle& Hdf5Handle::operator=(Hdf5Handle&& other) noexcept {
  if (this != &other) {
    reset();
    id_ = other.id_;
    other.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Hdf5Handle::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: H5Oclose(id_); break;
  }
  id_ = H5I_INVALID_HID;
}

Hdf5File Hdf5File::open_read(const std::string& path) {
  silence_hdf5_errors();
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  PARTRAIN_CHECK(file >= 0, "cannot open HDF5 file '" << path << "' for reading (missing or not HDF5?)");
  return Hdf5File(path, Hdf5Handle(file));
}

Hdf5File Hdf5File::create(const std::string& path) {
  silence_hdf5_errors();
  const hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  PARTRAIN_CHECK(file >= 0, "cannot create HDF5 file '" << path << "'");
  return Hdf5File(path, Hdf5Handle(file));
}

std::vector<std::string> Hdf5File::dataset_names(const std::string& group) const {
  PARTRAIN_CHECK(H5Lexists(handle_.get(), group.c_str(), H5P_DEFAULT) > 0,
                 "HDF5 file '" << path_ << "' has no group '" << group << "'");
  Hdf5Handle handle(H5Gopen2(handle_.get(), group.c_str(), H5P_DEFAULT));
  PARTRAIN_CHECK(handle.valid(), "cannot open group '" << group << "' in '" << path_ << "'");
  H5G_info_t info;
  PARTRAIN_CHECK(H5Gget_info(handle.get(), &info) >= 0, "cannot list group '" << group << "' in '" << path_ << "'");
  std::vector<std::string> names;
  for (hsize_t index = 0; index < info.nlinks; ++index) {
    const ssize_t length = H5Lget_name_by_idx(handle.get(), ".", H5_INDEX_NAME, H5_ITER_INC, index, nullptr, 0, H5P_DEFAULT);
    PARTRAIN_CHECK(length >= 0, "cannot list group '" << group << "' in '" << path_ << "'");
    std::string name(static_cast<std::size_t>(length), '\0');
    H5Lget_name_by_idx(handle.get(), ".", H5_INDEX_NAME, H5_ITER_INC, index, name.data(), name.size() + 1, H5P_DEFAULT);
    H5O_info_t object;
    if (H5Oget_info_by_name(handle.get(), name.c_str(), &object, H5P_DEFAULT) >= 0 && object.type == H5O_TYPE_DATASET)
      names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool Hdf5File::has_dataset(const std::string& name) const {
  // Check every path component so that a missing intermediate group is not an error.
  std::size_t position = 0;
  while (true) {
    position = name.find('/', position + 1);
    const std::string prefix = name.substr(0, position);
    if (!prefix.empty() && prefix != "/" && H5Lexists(handle_.get(), prefix.c_str(), H5P_DEFAULT) <= 0) return false;
    if (position == std::string::npos) break;
  }
  Hdf5Handle dataset(H5Dopen2(handle_.get(), name.c_str(), H5P_DEFAULT));
  return dataset.valid();
}

bool Hdf5File::has_group(const std::string& name) const {
  if (name.empty() || H5Lexists(handle_.get(), name.c_str(), H5P_DEFAULT) <= 0) return false;
  H5O_info_t object;
  return H5Oget_info_by_name(handle_.get(), name.c_str(), &object, H5P_DEFAULT) >= 0 && object.type == H5O_TYPE_GROUP;
}

Hdf5Handle Hdf5File::open_dataset(const std::string& name) const {
  PARTRAIN_CHECK(has_dataset(name), "HDF5 file '" << path_ << "' has no dataset '" << name << "'");
  Hdf5Handle dataset(H5Dopen2(handle_.get(), name.c_str(), H5P_DEFAULT));
  PARTRAIN_CHECK(dataset.valid(), "cannot open dataset '" << name << "' in '" << path_ << "'");
  return dataset;
}

Hdf5Handle Hdf5File::open_object(const std::string& object) const {
  Hdf5Handle handle(H5Oopen(handle_.get(), object.c_str(), H5P_DEFAULT));
  PARTRAIN_CHECK(handle.valid(), "HDF5 file '" << path_ << "' has no object '" << object << "'");
  return handle;
}

std::vector<std::int64_t> Hdf5File::dataset_shape(const std::string& name) const {
  Hdf5Handle dataset = open_dataset(name);
  Hdf5Handle space(H5Dget_space(dataset.get()));
  const int rank = H5Sget_simple_extent_ndims(space.get());
  PARTRAIN_CHECK(rank >= 0, "cannot read the shape of '" << name << "' in '" << path_ << "'");
  std::vector<hsize_t> dimensions(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dimensions.data(), nullptr);
  return std::vector<std::int64_t>(dimensions.begin(), dimensions.end());
}

namespace {
// The type class and size of an open dataset's stored elements.
std::pair<H5T_class_t, std::size_t> stored_type(hid_t dataset) {
  Hdf5Handle type(H5Dget_type(dataset));
  if (!type.valid()) return {H5T_NO_CLASS, 0};
  return {H5Tget_class(type.get()), H5Tget_size(type.get())};
}
}  // namespace

bool Hdf5File::dataset_is_integer(const std::string& name) const {
  return stored_type(open_dataset(name).get()).first == H5T_INTEGER;
}

bool Hdf5File::dataset_is_float(const std::string& name) const {
  return stored_type(open_dataset(name).get()).first == H5T_FLOAT;
}

std::string Hdf5File::dataset_type_name(const std::string& name) const {
  Hdf5Handle dataset = open_dataset(name);
  const auto [type_class, size] = stored_type(dataset.get());
  const std::string bits = std::to_string(8 * size);
  switch (type_class) {
    case H5T_INTEGER: {
      Hdf5Handle type(H5Dget_type(dataset.get()));
      return (H5Tget_sign(type.get()) == H5T_SGN_NONE ? "uint" : "int") + bits;
    }
    case H5T_FLOAT: return "float" + bits;
    case H5T_STRING: return "string";
    case H5T_COMPOUND: return "compound";
    case H5T_ENUM: return "enum";
    case H5T_ARRAY: return "array";
    case H5T_VLEN: return "variable-length";
    case H5T_OPAQUE: return "opaque";
    case H5T_BITFIELD: return "bitfield";
    case H5T_REFERENCE: return "reference";
    case H5T_TIME: return "time";
    default: return "unknown type";
  }
}

void Hdf5File::read_raw(const std::string& name, hid_t memory_type, void* buffer, std::int64_t count,
                        std::int64_t begin, std::int64_t end, std::vector<std::int64_t>* shape) const {
  Hdf5Handle dataset = open_dataset(name);
  herr_t status;
  if (begin < 0) {
    status = H5Dread(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer);
  } else {
    Hdf5Handle file_space(H5Dget_space(dataset.get()));
    const hsize_t start = static_cast<hsize_t>(begin), length = static_cast<hsize_t>(end - begin);
    H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &length, nullptr);
    Hdf5Handle memory_space(H5Screate_simple(1, &length, nullptr));
    status = H5Dread(dataset.get(), memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, buffer);
  }
  if (status < 0 && failed_in_filter_pipeline()) {
    PARTRAIN_FAIL("compressed data in dataset '" << name << "' of " << path_
                                                  << " is damaged (a chunk does not decompress); prepare the file again");
  }
  PARTRAIN_CHECK(status >= 0, "cannot read " << count << " elements of dataset '" << name << "' in '" << path_
                                             << "' (type not convertible?)");
  (void)shape;
}

void Hdf5File::check_declared_size(const std::string& name, const std::vector<std::int64_t>& dimensions,
                                   std::size_t element_bytes) const {
  hsize_t file_bytes = 0;
  H5Fget_filesize(handle_.get(), &file_bytes);
  Hdf5Handle dataset = open_dataset(name);
  // HDF5 converts through buffers of the stored element size, which a damaged header may declare
  // absurdly large (a 1.6 GB "integer": found by fuzz_prepared_data).
  Hdf5Handle type(H5Dget_type(dataset.get()));
  const std::size_t stored_element_bytes = type.valid() ? H5Tget_size(type.get()) : 0;
  PARTRAIN_CHECK(stored_element_bytes > 0 && stored_element_bytes <= 16,
                 "dataset '" << name << "' in '" << path_ << "' stores elements of " << stored_element_bytes
                             << " bytes, not numbers (damaged file?)");
  element_bytes = std::max(element_bytes, stored_element_bytes);
  double bytes = static_cast<double>(element_bytes);
  for (std::int64_t dimension : dimensions) bytes *= static_cast<double>(dimension);
  // What the dataset stores (partrain's writers write every element: no unwritten fill-value chunks).
  const double stored_bytes =
      std::min(static_cast<double>(H5Dget_storage_size(dataset.get())), static_cast<double>(file_bytes));
  const double limit = kMaximumCompressionRatio * stored_bytes + 65536.0;
  PARTRAIN_CHECK(bytes <= limit, "dataset '" << name << "' in '" << path_ << "' declares " << bytes
                                             << " bytes but stores " << stored_bytes
                                             << ", too few even compressed (damaged file?)");
  // HDF5 allocates whole chunks (and each chunk's stored bytes) to read any part of a chunked
  // dataset: a damaged header may declare chunks far beyond the dataset (found by fuzz_prepared_data).
  Hdf5Handle creation(H5Dget_create_plist(dataset.get()));
  if (creation.valid() && H5Pget_layout(creation.get()) == H5D_CHUNKED) {
    std::vector<hsize_t> chunk(std::max<std::size_t>(1, dimensions.size()), 0);
    const int rank = H5Pget_chunk(creation.get(), static_cast<int>(chunk.size()), chunk.data());
    double chunk_bytes = static_cast<double>(element_bytes);
    for (int axis = 0; axis < rank; ++axis) chunk_bytes *= static_cast<double>(chunk[axis]);
    PARTRAIN_CHECK(rank >= 0 && chunk_bytes <= limit && H5Dget_storage_size(dataset.get()) <= file_bytes,
                   "dataset '" << name << "' in '" << path_ << "' declares chunks of " << chunk_bytes
                               << " bytes stored in " << stored_bytes << ", more than the file of " << file_bytes
                               << " bytes can hold (damaged file?)");
  }
}

template <typename T>
std::vector<T> Hdf5File::read(const std::string& name, std::vector<std::int64_t>* shape) const {
  const std::vector<std::int64_t> dimensions = dataset_shape(name);
  check_declared_size(name, dimensions, sizeof(T));
  std::vector<T> values(static_cast<std::size_t>(element_count(dimensions)));
  if (!values.empty()) read_raw(name, native_type<T>(), values.data(), values.size(), -1, -1, nullptr);
  if (shape) *shape = dimensions;
  return values;
}

template <typename T>
std::vector<T> Hdf5File::read_range(const std::string& name, std::int64_t begin, std::int64_t end) const {
  const std::vector<std::int64_t> dimensions = dataset_shape(name);
  PARTRAIN_CHECK(dimensions.size() == 1, "read_range: dataset '" << name << "' in '" << path_ << "' has rank "
                                                                 << dimensions.size() << ", expected 1");
  PARTRAIN_CHECK(0 <= begin && begin <= end && end <= dimensions[0],
                 "read_range: [" << begin << ", " << end << ") outside dataset '" << name << "' of length "
                                 << dimensions[0] << " in '" << path_ << "'");
  check_declared_size(name, {end - begin}, sizeof(T));
  std::vector<T> values(static_cast<std::size_t>(end - begin));
  if (!values.empty()) read_raw(name, native_type<T>(), values.data(), end - begin, begin, end, nullptr);
  return values;
}

template <typename T>
void Hdf5File::write(const std::string& name, const std::vector<std::int64_t>& shape, const std::vector<T>& values) {
  PARTRAIN_CHECK(element_count(shape) == static_cast<std::int64_t>(values.size()),
                 "write: " << values.size() << " values for dataset '" << name << "' in '" << path_ << "'");
  std::vector<hsize_t> dimensions(shape.begin(), shape.end());
  Hdf5Handle space(H5Screate_simple(static_cast<int>(dimensions.size()), dimensions.data(), nullptr));
  Hdf5Handle link_properties(H5Pcreate(H5P_LINK_CREATE));
  H5Pset_create_intermediate_group(link_properties.get(), 1);
  Hdf5Handle create_properties(H5Pcreate(H5P_DATASET_CREATE));
  if (values.size() > 4096) {
    std::vector<hsize_t> chunk = dimensions;
    // Chunks of about 64k elements along dimension 0.
    hsize_t row = 1;
    for (std::size_t axis = 1; axis < chunk.size(); ++axis) row *= chunk[axis];
    chunk[0] = std::max<hsize_t>(1, std::min<hsize_t>(chunk[0], 65536 / std::max<hsize_t>(row, 1)));
    H5Pset_chunk(create_properties.get(), static_cast<int>(chunk.size()), chunk.data());
    H5Pset_deflate(create_properties.get(), 4);
  }
  Hdf5Handle dataset(H5Dcreate2(handle_.get(), name.c_str(), native_type<T>(), space.get(), link_properties.get(),
                                create_properties.get(), H5P_DEFAULT));
  PARTRAIN_CHECK(dataset.valid(), "cannot create dataset '" << name << "' in '" << path_ << "'");
  if (!values.empty()) {
    PARTRAIN_CHECK(H5Dwrite(dataset.get(), native_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0,
                   "cannot write dataset '" << name << "' in '" << path_ << "'");
  }
}

bool Hdf5File::has_attribute(const std::string& object, const std::string& attribute) const {
  return H5Aexists_by_name(handle_.get(), object.c_str(), attribute.c_str(), H5P_DEFAULT) > 0;
}

std::int64_t Hdf5File::read_int_attribute(const std::string& object, const std::string& attribute) const {
  PARTRAIN_CHECK(has_attribute(object, attribute),
                 "HDF5 file '" << path_ << "': object '" << object << "' has no attribute '" << attribute << "'");
  Hdf5Handle handle(H5Aopen_by_name(handle_.get(), object.c_str(), attribute.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  std::int64_t value = 0;
  PARTRAIN_CHECK(H5Aread(handle.get(), H5T_NATIVE_INT64, &value) >= 0,
                 "cannot read attribute '" << attribute << "' of '" << object << "' in '" << path_ << "' as integer");
  return value;
}

double Hdf5File::read_double_attribute(const std::string& object, const std::string& attribute) const {
  PARTRAIN_CHECK(has_attribute(object, attribute),
                 "HDF5 file '" << path_ << "': object '" << object << "' has no attribute '" << attribute << "'");
  Hdf5Handle handle(H5Aopen_by_name(handle_.get(), object.c_str(), attribute.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  double value = 0;
  PARTRAIN_CHECK(H5Aread(handle.get(), H5T_NATIVE_DOUBLE, &value) >= 0,
                 "cannot read attribute '" << attribute << "' of '" << object << "' in '" << path_ << "' as double");
  return value;
}

std::string Hdf5File::read_string_attribute(const std::string& object, const std::string& attribute) const {
  PARTRAIN_CHECK(has_attribute(object, attribute),
                 "HDF5 file '" << path_ << "': object '" << object << "' has no attribute '" << attribute << "'");
  Hdf5Handle handle(H5Aopen_by_name(handle_.get(), object.c_str(), attribute.c_str(), H5P_DEFAULT, H5P_DEFAULT));
  Hdf5Handle type(H5Aget_type(handle.get()));
  PARTRAIN_CHECK(H5Tget_class(type.get()) == H5T_STRING,
                 "attribute '" << attribute << "' of '" << object << "' in '" << path_ << "' is not a string");
  if (H5Tis_variable_str(type.get()) > 0) {
    Hdf5Handle memory_type(H5Tcopy(H5T_C_S1));
    H5Tset_size(memory_type.get(), H5T_VARIABLE);
    H5Tset_cset(memory_type.get(), H5Tget_cset(type.get()));
    char* text = nullptr;
    PARTRAIN_CHECK(H5Aread(handle.get(), memory_type.get(), &text) >= 0,
                   "cannot read string attribute '" << attribute << "' in '" << path_ << "'");
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  Hdf5Handle memory_type(H5Tcopy(H5T_C_S1));
  H5Tset_size(memory_type.get(), size);
  PARTRAIN_CHECK(H5Aread(handle.get(), memory_type.get(), value.data()) >= 0,
                 "cannot read string attribute '" << attribute << "' in '" << path_ << "'");
  value.resize(std::strlen(value.c_str()));
  return value;
}

namespace {
void write_attribute(hid_t file, const std::string& path, const std::string& object, const std::string& attribute,
                     hid_t type, const void* value) {
  if (H5Aexists_by_name(file, object.c_str(), attribute.c_str(), H5P_DEFAULT) > 0) {
    H5Adelete_by_name(file, object.c_str(), attribute.c_str(), H5P_DEFAULT);
  }
  Hdf5Handle space(H5Screate(H5S_SCALAR));
  Hdf5Handle handle(
      H5Acreate_by_name(file, object.c_str(), attribute.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  PARTRAIN_CHECK(handle.valid(), "cannot create attribute '" << attribute << "' on '" << object << "' in '" << path << "'");
  PARTRAIN_CHECK(H5Awrite(handle.get(), type, value) >= 0,
                 "cannot write attribute '" << attribute << "' on '" << object << "' in '" << path << "'");
}
}  // namespace

void Hdf5File::write_int_attribute(const std::string& object, const std::string& attribute, std::int64_t value) {
  write_attribute(handle_.get(), path_, object, attribute, H5T_NATIVE_INT64, &value);
}

void Hdf5File::write_double_attribute(const std::string& object, const std::string& attribute, double value) {
  write_attribute(handle_.get(), path_, object, attribute, H5T_NATIVE_DOUBLE, &value);
}

void Hdf5File::write_string_attribute(const std::string& object, const std::string& attribute,
                                      const std::string& value) {
  Hdf5Handle type(H5Tcopy(H5T_C_S1));
  H5Tset_size(type.get(), H5T_VARIABLE);
  H5Tset_cset(type.get(), H5T_CSET_UTF8);
  const char* text = value.c_str();
  write_attribute(handle_.get(), path_, object, attribute, type.get(), &text);
}

template std::vector<std::int32_t> Hdf5File::read(const std::string&, std::vector<std::int64_t>*) const;
template std::vector<std::int64_t> Hdf5File::read(const std::string&, std::vector<std::int64_t>*) const;
template std::vector<std::uint8_t> Hdf5File::read(const std::string&, std::vector<std::int64_t>*) const;
template std::vector<float> Hdf5File::read(const std::string&, std::vector<std::int64_t>*) const;
template std::vector<std::int32_t> Hdf5File::read_range(const std::string&, std::int64_t, std::int64_t) const;
template std::vector<std::int64_t> Hdf5File::read_range(const std::string&, std::int64_t, std::int64_t) const;
template void Hdf5File::write(const std::string&, const std::vector<std::int64_t>&, const std::vector<std::int32_t>&);
template void Hdf5File::write(const std::string&, const std::vector<std::int64_t>&, const std::vector<std::int64_t>&);
template void Hdf5File::write(const std::string&, const std::vector<std::int64_t>&, const std::vector<std::uint8_t>&);
template void Hdf5File::write(const std::string&, const std::vector<std::int64_t>&, const std::vector<float>&);

}  // namespace partrain::io
