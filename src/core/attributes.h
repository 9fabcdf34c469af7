#pragma once
// Op attributes: a small ordered map from name to int, float, int list or string (ONNX style). In
// core/ because kernels receive them (KernelContext, core/backend.h); graph tasks hold them.
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

namespace partrain {

using AttributeValue = std::variant<std::int64_t, double, std::vector<std::int64_t>, std::string>;

class Attributes {
 public:
  Attributes() = default;
  Attributes(std::initializer_list<std::pair<const std::string, AttributeValue>> values) : values_(values) {}

  Attributes& set(const std::string& name, AttributeValue value) { values_[name] = std::move(value); return *this; }
  bool has(const std::string& name) const { return values_.count(name) != 0; }

  /// Typed getters; the one-argument forms throw partrain::Error naming the attribute when it is
  /// missing, every form throws when it has another type (an int is accepted for a float).
  std::int64_t get_int(const std::string& name) const;
  std::int64_t get_int(const std::string& name, std::int64_t fallback) const;
  double get_float(const std::string& name) const;
  double get_float(const std::string& name, double fallback) const;
  const std::vector<std::int64_t>& get_ints(const std::string& name) const;
  std::vector<std::int64_t> get_ints(const std::string& name, std::vector<std::int64_t> fallback) const;
  const std::string& get_string(const std::string& name) const;
  std::string get_string(const std::string& name, const std::string& fallback) const;

  /// Canonical text "name=value;..." (sorted by name), used for hashing and printing.
  std::string canonical_string() const;
  const std::map<std::string, AttributeValue>& values() const { return values_; }

 private:
  std::map<std::string, AttributeValue> values_;
};

}  // namespace partrain
