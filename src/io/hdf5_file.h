#pragma once
// Small RAII helpers over the HDF5 C API for the dataset files in data/ (text.h5, fashion_mnist.h5).
// Files are opened with default (serial) property lists. Every failure throws partrain::Error naming
// the file and the dataset or attribute.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace partrain::io {

/// Owns one HDF5 identifier and closes it with the matching H5*close on destruction.
class Hdf5Handle {
 public:
  Hdf5Handle() = default;
  explicit Hdf5Handle(hid_t id) : id_(id) {}
  ~Hdf5Handle() { reset(); }
  Hdf5Handle(Hdf5Handle&& other) noexcept : id_(other.id_) { other.id_ = H5I_INVALID_HID; }
  Hdf5Handle& operator=(Hdf5Handle&& other) noexcept;
  Hdf5Handle(const Hdf5Handle&) = delete;
  Hdf5Handle& operator=(const Hdf5Handle&) = delete;
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  /// Closes the identifier (H5Fclose, H5Dclose, ... chosen by H5Iget_type).
  void reset();
  /// Gives up ownership without closing (after the caller closed it itself); returns the id.
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }

 private:
  hid_t id_ = H5I_INVALID_HID;
};

/// An HDF5 file opened read-only or created (truncating) for writing.
class Hdf5File {
 public:
  /// Opens an existing file read-only. Throws partrain::Error if it is missing or not HDF5.
  static Hdf5File open_read(const std::string& path);
  /// Creates (or truncates) a file for writing. Throws partrain::Error on failure.
  static Hdf5File create(const std::string& path);

  const std::string& path() const { return path_; }
  bool has_dataset(const std::string& name) const;
  /// Whether the top-level name `name` ("batch") is a group of the file.
  bool has_group(const std::string& name) const;
  /// Names (relative to `group`) of the datasets directly inside `group`, sorted. Throws
  /// partrain::Error naming the file when the group does not exist.
  std::vector<std::string> dataset_names(const std::string& group) const;
  /// Dimensions of dataset `name`; throws if it does not exist.
  std::vector<std::int64_t> dataset_shape(const std::string& name) const;
  /// Whether dataset `name` stores integers (HDF5 type class H5T_INTEGER, any width or sign);
  /// throws if it does not exist. Readers check this before reading integer fields, which HDF5
  /// would otherwise fill from floats by silent truncation.
  bool dataset_is_integer(const std::string& name) const;
  /// Whether dataset `name` stores floating-point numbers (H5T_FLOAT); throws if it does not exist.
  bool dataset_is_float(const std::string& name) const;
  /// The stored element type of dataset `name` for messages: "int64", "uint8", "float32",
  /// "string", ...; throws if it does not exist.
  std::string dataset_type_name(const std::string& name) const;

  /// Reads a whole dataset converted to T (int32, int64, uint8 or float); returns the elements in
  /// row-major order and, through `shape` if non-null, its dimensions. Throws partrain::Error when
  /// it declares more bytes than it stores could hold compressed (a damaged file).
  template <typename T>
  std::vector<T> read(const std::string& name, std::vector<std::int64_t>* shape = nullptr) const;
  /// Reads elements [begin, end) of a one-dimensional dataset converted to T.
  template <typename T>
  std::vector<T> read_range(const std::string& name, std::int64_t begin, std::int64_t end) const;
  /// Writes a dataset of the given shape (intermediate groups are created; gzip-compressed, chunked,
  /// when it has more than 4096 elements). Throws if numel(shape) != values.size().
  template <typename T>
  void write(const std::string& name, const std::vector<std::int64_t>& shape, const std::vector<T>& values);

  /// Integer attribute `attribute` on the object `object` ("/" for the file). Throws when missing.
  std::int64_t read_int_attribute(const std::string& object, const std::string& attribute) const;
  /// Floating-point attribute; throws when missing.
  double read_double_attribute(const std::string& object, const std::string& attribute) const;
  /// String attribute (fixed or variable length); throws when missing.
  std::string read_string_attribute(const std::string& object, const std::string& attribute) const;
  bool has_attribute(const std::string& object, const std::string& attribute) const;
  void write_int_attribute(const std::string& object, const std::string& attribute, std::int64_t value);
  void write_double_attribute(const std::string& object, const std::string& attribute, double value);
  void write_string_attribute(const std::string& object, const std::string& attribute, const std::string& value);

 private:
  Hdf5File(std::string path, Hdf5Handle handle) : path_(std::move(path)), handle_(std::move(handle)) {}
  Hdf5Handle open_dataset(const std::string& name) const;
  Hdf5Handle open_object(const std::string& object) const;
  /// Throws partrain::Error naming the dataset when `dimensions` × `element_bytes`, or its chunk
  /// size, exceeds what the dataset stores times deflate's best ratio (checked before allocating).
  void check_declared_size(const std::string& name, const std::vector<std::int64_t>& dimensions,
                           std::size_t element_bytes) const;
  void read_raw(const std::string& name, hid_t memory_type, void* buffer, std::int64_t count,
                std::int64_t begin, std::int64_t end, std::vector<std::int64_t>* shape) const;

  std::string path_;
  Hdf5Handle handle_;
};

}  // namespace partrain::io
