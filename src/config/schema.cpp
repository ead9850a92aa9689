// The schema's names (KeyCollector) and the enums' spellings (to_string).
#include "config/schema.hpp"

#include <algorithm>
#include <optional>

#include <fmt/ranges.h>

namespace lockstep {
namespace config_impl {
namespace {

// Learns the section and key names from visit_schema().
class KeyCollector {
 public:
  void section(std::string_view name) { sections_.push_back({name, {}}); }
  template <class... Rest> void integer(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void number(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void flag(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void text(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void path(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void choice(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void enumeration(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void integer_list(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void choice_list(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void devices(std::string_view key, Rest&&...) { add(key); }
  template <class... Rest> void number_pair(std::string_view key, Rest&&...) { add(key); }
  void nested(std::string_view key) { add(key); }

  std::vector<SectionKeys> take() && { return std::move(sections_); }

 private:
  void add(std::string_view key) { sections_.back().keys.push_back(key); }
  std::vector<SectionKeys> sections_;
};

}  // namespace

const std::vector<SectionKeys>& schema() {
  static const std::vector<SectionKeys> sections = [] {
    KeyCollector collector;
    Config unused;
    visit_schema(collector, unused);
    return std::move(collector).take();
  }();
  return sections;
}

const SectionKeys* find_section(std::string_view name) {
  const auto it = std::find_if(schema().begin(), schema().end(),
                               [&](const SectionKeys& s) { return s.name == name; });
  return it == schema().end() ? nullptr : &*it;
}

std::vector<std::string> leaf_names(std::string_view section) {
  std::vector<std::string> names;
  for (const std::string_view key : find_section(section)->keys) {
    const SectionKeys* nested = find_section(fmt::format("{}.{}", section, key));
    if (!nested) names.emplace_back(key);
    for (const std::string_view leaf : nested ? nested->keys : std::vector<std::string_view>{})
      names.push_back(fmt::format("{}.{}", key, leaf));
  }
  return names;
}

std::vector<std::string_view> section_names() {
  std::vector<std::string_view> names;
  for (const SectionKeys& s : schema())
    if (s.name.find('.') == std::string_view::npos) names.push_back(s.name);
  return names;
}

}  // namespace config_impl

using namespace config_impl;

std::string_view to_string(Activation v) { return spelling(kActivations, v); }
std::string_view to_string(DatasetKind v) { return spelling(kDatasetKinds, v); }

std::optional<BackendKind> backend_kind(std::string_view name) {
  for (const auto& s : kBackendKinds)
    if (s.name == name) return s.value;
  return std::nullopt;
}
std::string_view to_string(TokenFormat v) { return spelling(kTokenFormats, v); }
std::string_view to_string(OptimizerKind v) { return spelling(kOptimizerKinds, v); }
std::string_view to_string(ScheduleKind v) { return spelling(kScheduleKinds, v); }
std::string_view to_string(BackendKind v) { return spelling(kBackendKinds, v); }
std::string_view to_string(CommKind v) { return spelling(kCommKinds, v); }
std::string_view to_string(NonfinitePolicy v) { return spelling(kNonfinitePolicies, v); }
std::string_view to_string(WorkerFailurePolicy v) { return spelling(kWorkerFailurePolicies, v); }
std::string_view to_string(Precision v) { return spelling(kPrecisions, v); }
std::string_view to_string(ReduceDtype v) { return spelling(kReduceDtypes, v); }
std::string_view to_string(GraphMode v) { return spelling(kGraphModes, v); }
std::string_view to_string(Recompute v) { return spelling(kRecomputeModes, v); }
std::string_view to_string(AttentionKind v) { return spelling(kAttentionKinds, v); }
std::string_view to_string(ModelFamily v) { return spelling(kModelFamilies, v); }
std::string_view to_string(NormKind v) { return spelling(kNormKinds, v); }
std::string_view to_string(PositionKind v) { return spelling(kPositionKinds, v); }
std::string_view to_string(MlpKind v) { return spelling(kMlpKinds, v); }
std::string_view to_string(RopeScalingKind v) { return spelling(kRopeScalingKinds, v); }

}  // namespace lockstep
