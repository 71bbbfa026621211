#include "common/protocol/json_reader.hpp"

namespace corral::protocol {

Result<Json> parse_json(std::string_view text, std::size_t max_bytes) {
  if (text.size() > max_bytes) {
    return make_error(ErrorCode::InvalidArgument,
                      "message is " + std::to_string(text.size()) + " bytes; the limit is " + std::to_string(max_bytes));
  }
  // Deep nesting is refused before anything is built (the parser recurses per level).
  int depth = 0;
  bool too_deep = !scan_json_structure(text, [&depth](std::size_t, char c) {
    if (c == '[' || c == '{') return ++depth <= kMaxJsonDepth;
    if (c != ',') --depth;
    return true;
  }) && depth > kMaxJsonDepth;
  if (too_deep) {
    return make_error(ErrorCode::InvalidArgument, "JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  Json j = Json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded()) return make_error(ErrorCode::InvalidArgument, "malformed JSON");
  return j;
}

void JsonReader::fail(const std::string& field_path, const std::string& message) {
  if (error_.empty()) error_ = (field_path.empty() ? std::string("message") : field_path) + ": " + message;
}

const Json* JsonReader::find(const char* key, bool required) {
  if (!j_.is_object()) {
    fail(path_, "must be an object");
    return nullptr;
  }
  auto it = j_.find(key);
  if (it == j_.end() || it->is_null()) {
    if (required) fail(child_path(key), "required field is missing");
    return nullptr;
  }
  return &*it;
}

std::int64_t JsonReader::i64(const char* key, std::int64_t min, std::int64_t max, std::optional<std::int64_t> dflt) {
  const Json* v = find(key, !dflt.has_value());
  if (!v) return dflt.value_or(0);
  if (!v->is_number_integer()) {
    fail(child_path(key), "must be an integer");
    return dflt.value_or(0);
  }
  std::int64_t x = v->is_number_unsigned() && v->get<std::uint64_t>() > static_cast<std::uint64_t>(max)
                       ? max + 1
                       : v->get<std::int64_t>();
  if (x < min || x > max) {
    fail(child_path(key), "must be between " + std::to_string(min) + " and " + std::to_string(max));
    return dflt.value_or(0);
  }
  return x;
}

std::uint64_t JsonReader::u64(const char* key, std::optional<std::uint64_t> dflt) {
  const Json* v = find(key, !dflt.has_value());
  if (!v) return dflt.value_or(0);
  if (!v->is_number_unsigned() && !(v->is_number_integer() && v->get<std::int64_t>() >= 0)) {
    fail(child_path(key), "must be a non-negative integer");
    return dflt.value_or(0);
  }
  return v->get<std::uint64_t>();
}

bool JsonReader::boolean(const char* key, std::optional<bool> dflt) {
  const Json* v = find(key, !dflt.has_value());
  if (!v) return dflt.value_or(false);
  if (!v->is_boolean()) {
    fail(child_path(key), "must be true or false");
    return dflt.value_or(false);
  }
  return v->get<bool>();
}

std::string JsonReader::str(const char* key, std::size_t max_len, std::optional<std::string> dflt) {
  const Json* v = find(key, !dflt.has_value());
  if (!v) return dflt.value_or("");
  if (!v->is_string()) {
    fail(child_path(key), "must be a string");
    return dflt.value_or("");
  }
  const auto& s = v->get_ref<const std::string&>();
  if (s.size() > max_len) {
    fail(child_path(key), "longer than " + std::to_string(max_len) + " bytes");
    return dflt.value_or("");
  }
  return s;
}

const Json* JsonReader::object(const char* key, bool required) {
  const Json* v = find(key, required);
  if (!v) return nullptr;
  if (!v->is_object()) {
    fail(child_path(key), "must be an object");
    return nullptr;
  }
  return v;
}

const Json* JsonReader::array(const char* key, std::size_t max_items, bool required) {
  const Json* v = find(key, required);
  if (!v) return nullptr;
  if (!v->is_array()) {
    fail(child_path(key), "must be a list");
    return nullptr;
  }
  if (v->size() > max_items) {
    fail(child_path(key), "more than " + std::to_string(max_items) + " items");
    return nullptr;
  }
  return v;
}

std::vector<std::string> JsonReader::str_list(const char* key, std::size_t max_items, std::size_t max_len,
                                              bool required) {
  std::vector<std::string> out;
  const Json* a = array(key, max_items, required);
  if (!a) return out;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const Json& v = (*a)[i];
    if (!v.is_string() || v.get_ref<const std::string&>().size() > max_len) {
      fail(item_path(key, i), "must be a string of at most " + std::to_string(max_len) + " bytes");
      return {};
    }
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::vector<int> JsonReader::int_list(const char* key, std::size_t max_items, int min, int max, bool required) {
  std::vector<int> out;
  const Json* a = array(key, max_items, required);
  if (!a) return out;
  for (std::size_t i = 0; i < a->size(); ++i) {
    const Json& v = (*a)[i];
    if (!v.is_number_integer() || v.get<std::int64_t>() < min || v.get<std::int64_t>() > max) {
      fail(item_path(key, i), "must be an integer between " + std::to_string(min) + " and " + std::to_string(max));
      return {};
    }
    out.push_back(v.get<int>());
  }
  return out;
}

}  // namespace corral::protocol
