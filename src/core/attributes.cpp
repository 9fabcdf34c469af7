#include "core/attributes.h"

#include <sstream>

#include "core/error.h"

namespace partrain {

namespace {
template <typename T>
const T& typed(const std::map<std::string, AttributeValue>& values, const std::string& name, const char* what) {
  auto it = values.find(name);
  PARTRAIN_CHECK(it != values.end(), "missing attribute '" << name << "'");
  const T* value = std::get_if<T>(&it->second);
  PARTRAIN_CHECK(value != nullptr, "attribute '" << name << "' is not " << what);
  return *value;
}
}  // namespace

std::int64_t Attributes::get_int(const std::string& name) const { return typed<std::int64_t>(values_, name, "an integer"); }
std::int64_t Attributes::get_int(const std::string& name, std::int64_t fallback) const {
  return has(name) ? get_int(name) : fallback;
}
double Attributes::get_float(const std::string& name) const {
  auto it = values_.find(name);
  if (it != values_.end())
    if (const auto* integer = std::get_if<std::int64_t>(&it->second)) return static_cast<double>(*integer);
  return typed<double>(values_, name, "a number");
}
double Attributes::get_float(const std::string& name, double fallback) const {
  return has(name) ? get_float(name) : fallback;
}
const std::vector<std::int64_t>& Attributes::get_ints(const std::string& name) const {
  return typed<std::vector<std::int64_t>>(values_, name, "an integer list");
}
std::vector<std::int64_t> Attributes::get_ints(const std::string& name, std::vector<std::int64_t> fallback) const {
  return has(name) ? get_ints(name) : fallback;
}
const std::string& Attributes::get_string(const std::string& name) const {
  return typed<std::string>(values_, name, "a string");
}
std::string Attributes::get_string(const std::string& name, const std::string& fallback) const {
  return has(name) ? get_string(name) : fallback;
}

std::string Attributes::canonical_string() const {
  std::ostringstream out;
  out.precision(17);
  for (const auto& [name, value] : values_) {
    out << name << '=';
    if (const auto* integer = std::get_if<std::int64_t>(&value)) out << *integer;
    else if (const auto* real = std::get_if<double>(&value)) out << *real;
    else if (const auto* list = std::get_if<std::vector<std::int64_t>>(&value)) {
      out << '[';
      for (std::size_t i = 0; i < list->size(); ++i) out << (i ? "," : "") << (*list)[i];
      out << ']';
    } else out << '"' << std::get<std::string>(value) << '"';
    out << ';';
  }
  return out.str();
}

}  // namespace partrain
