#include "common/model/flat_config.hpp"

#include <yaml-cpp/yaml.h>

#include <exception>
#include <set>

#include "common/core/strings.hpp"

namespace corral::model {

namespace {

std::string at(const std::string& file, const YAML::Mark& mark) {
  if (mark.line < 0 || mark.column < 0) return file + ": ";
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1) + ": ";
}

}  // namespace

void FlatConfig::key(std::string name, Handler handler) {
  names_.push_back(name);
  handlers_.emplace(std::move(name), std::move(handler));
}

void FlatConfig::list_key(std::string name, ListHandler handler) {
  names_.push_back(name);
  list_handlers_.emplace(std::move(name), std::move(handler));
}

Result<void> FlatConfig::parse(std::string_view text) {
  if (text.size() > max_bytes_) {
    return make_error(ErrorCode::InvalidArgument, file_ + ": file is " + std::to_string(text.size()) +
                                                      " bytes; the limit is " + std::to_string(max_bytes_));
  }
  std::string keys;
  for (const auto& n : names_) keys += (keys.empty() ? "" : ", ") + n;
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return make_error(ErrorCode::InvalidArgument, at(file_, e.mark) + e.msg);
  } catch (const std::exception& e) {
    return make_error(ErrorCode::InvalidArgument, file_ + ": " + e.what());
  }
  std::vector<std::string> problems;
  std::set<std::string> seen;
  if (!root.IsDefined() || root.IsNull()) {
    if (!allow_empty_) problems.push_back(file_ + ": the file is empty; it must be a map of settings (" + keys + ")");
  } else if (!root.IsMap()) {
    return make_error(ErrorCode::InvalidArgument, at(file_, root.Mark()) + "must be a map of settings (" + keys + ")");
  } else {
    std::vector<std::string_view> known(names_.begin(), names_.end());
    try {
      for (auto it = root.begin(); it != root.end(); ++it) {
        const YAML::Node key = it->first;
        const YAML::Node value = it->second;
        const std::string where = at(file_, key.Mark());
        if (!key.IsScalar()) {
          problems.push_back(where + "keys must be plain names (" + keys + ")");
          continue;
        }
        const std::string name = key.Scalar();
        auto handler = handlers_.find(name);
        auto list_handler = list_handlers_.find(name);
        if (handler == handlers_.end() && list_handler == list_handlers_.end()) {
          std::string message = where + quote_for_message(name) + ": unknown setting";
          if (auto near = closest_match(name, known)) message += "; did you mean \"" + std::string(*near) + "\"?";
          problems.push_back(message);
          continue;
        }
        if (!seen.insert(name).second) {
          problems.push_back(where + name + ": set twice");
          continue;
        }
        // An empty value is marked where the next token starts: point at its key instead.
        const std::string value_where = at(file_, value.IsNull() ? key.Mark() : value.Mark());
        if (list_handler != list_handlers_.end()) {
          std::vector<std::string> items;
          std::string problem;
          if (value.IsSequence()) {
            for (const auto& item : value) {
              if (!item.IsScalar()) {
                problem = at(file_, item.Mark()) + name + ": each item must be a single value";
                break;
              }
              items.push_back(item.Scalar());
            }
          } else if (!value.IsNull()) {
            problem = value_where + name + ": must be a list, like [a, b]";
          }
          if (problem.empty()) {
            if (std::string p = list_handler->second(items); !p.empty()) problem = value_where + name + ": " + p;
          }
          if (!problem.empty()) problems.push_back(problem);
          continue;
        }
        if (!value.IsScalar() && !value.IsNull()) {
          problems.push_back(value_where + name + ": must be a single value");
          continue;
        }
        // No value at all reaches the handler as an empty one.
        if (std::string problem = handler->second(value.IsNull() ? std::string() : value.Scalar());
            !problem.empty()) {
          problems.push_back(value_where + name + ": " + problem);
        }
      }
    } catch (const std::exception& e) {
      problems.push_back(file_ + ": " + e.what());
    }
  }
  for (const auto& name : required_) {
    if (!seen.contains(name)) problems.push_back(file_ + ": " + name + ": required setting is missing");
  }
  if (problems.empty()) return {};
  std::string all;
  for (const auto& p : problems) all += (all.empty() ? "" : "\n") + p;
  return make_error(ErrorCode::InvalidArgument, all);
}

FlatConfig::Handler string_into(std::string& out, bool allow_empty) {
  return [&out, allow_empty](const std::string& v) -> std::string {
    if (v.empty() && !allow_empty) return "must not be empty";
    if (v.size() > 4096) return "longer than 4096 characters";
    out = v;
    return "";
  };
}

FlatConfig::Handler bool_into(bool& out) {
  return [&out](const std::string& v) -> std::string {
    if (v == "true" || v == "yes" || v == "on") {
      out = true;
    } else if (v == "false" || v == "no" || v == "off") {
      out = false;
    } else {
      return "must be true or false, got " + quote_for_message(v);
    }
    return "";
  };
}

FlatConfig::Handler duration_into(Duration& out) {
  return [&out](const std::string& v) -> std::string {
    auto d = parse_duration(v);
    if (!d) return d.error().message();
    out = *d;
    return "";
  };
}

FlatConfig::Handler int_into(long long& out, long long min, long long max) {
  return [&out, min, max](const std::string& v) -> std::string {
    auto parsed = parse_int<long long>(v);
    if (!parsed || *parsed < min || *parsed > max) {
      return "must be an integer from " + std::to_string(min) + " to " + std::to_string(max) + ", got " +
             quote_for_message(v);
    }
    out = *parsed;
    return "";
  };
}

}  // namespace corral::model
