// Place, Problems and Origins (problems.hpp).
#include "config/problems.hpp"

namespace lockstep::config_impl {

Place mark_place(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null()) return {std::string(source)};
  return {fmt::format("{}:{}:{}", source, mark.line + 1, mark.column + 1),
          {0, static_cast<std::size_t>(mark.line), static_cast<std::size_t>(mark.column)}};
}

bool is_within(std::string_view path, std::string_view parent) {
  if (!path.starts_with(parent)) return false;
  return path.size() == parent.size() || path[parent.size()] == '.' || path[parent.size()] == '[';
}

bool Problems::failed(std::string_view path) const {
  return std::any_of(failed_.begin(), failed_.end(), [&](const std::string& f) {
    return is_within(path, f) || is_within(f, path);
  });
}

}  // namespace lockstep::config_impl
