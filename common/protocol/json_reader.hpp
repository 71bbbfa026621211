#pragma once
// JsonReader: typed, bounded field access on untrusted JSON that records the first
// problem with the field's path instead of throwing. Include only from .cpp files: it
// brings nlohmann/json with it.

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/core/error.hpp"

namespace corral::protocol {

using Json = nlohmann::json;

// Parses without exceptions; InvalidArgument on malformed or oversized text.
// Calls on_structure(position, character) for each bracket, brace and comma of JSON text
// that is not inside a string, in order; stops when it returns false. Returns false when
// it was stopped or a string is left open.
template <typename OnStructure>
bool scan_json_structure(std::string_view text, OnStructure on_structure) {
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '[' || c == '{' || c == ']' || c == '}' || c == ',') && !on_structure(i, c)) {
      return false;
    }
  }
  return !in_string;
}

// Arrays and objects nest at most this deep in anything parse_json accepts.
inline constexpr int kMaxJsonDepth = 32;
Result<Json> parse_json(std::string_view text, std::size_t max_bytes);

class JsonReader {
 public:
  JsonReader(const Json& object, std::string path = {}) : j_(object), path_(std::move(path)) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  Error to_error() const { return Error(ErrorCode::InvalidArgument, error_); }

  std::int64_t i64(const char* key, std::int64_t min, std::int64_t max, std::optional<std::int64_t> dflt = {});
  int i32(const char* key, int min, int max, std::optional<int> dflt = {}) {
    return static_cast<int>(i64(key, min, max, dflt));
  }
  std::uint64_t u64(const char* key, std::optional<std::uint64_t> dflt = {});
  bool boolean(const char* key, std::optional<bool> dflt = {});
  std::string str(const char* key, std::size_t max_len, std::optional<std::string> dflt = {});
  std::vector<std::string> str_list(const char* key, std::size_t max_items, std::size_t max_len, bool required = true);
  std::vector<int> int_list(const char* key, std::size_t max_items, int min, int max, bool required = true);
  // A nested object or array; nullptr (and an error unless optional) when absent or mistyped.
  const Json* object(const char* key, bool required = true);
  const Json* array(const char* key, std::size_t max_items, bool required = true);

  std::string child_path(const char* key) const { return path_.empty() ? key : path_ + "." + key; }
  std::string item_path(const char* key, std::size_t i) const { return child_path(key) + "[" + std::to_string(i) + "]"; }
  // Records a problem found by the caller (the first one wins).
  void fail(const std::string& field_path, const std::string& message);
  void absorb(const JsonReader& nested) {
    if (ok() && !nested.ok()) error_ = nested.error();
  }

 // The raw value of a field, for fields of more than one type.
  const Json* raw(const char* key, bool required) { return find(key, required); }

 private:
  const Json* find(const char* key, bool required);

  const Json& j_;
  std::string path_;
  std::string error_;
};

}  // namespace corral::protocol
