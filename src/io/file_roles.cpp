#include "io/file_roles.hpp"

#include <sys/stat.h>

#include <fmt/format.h>

#include <optional>
#include <system_error>

#include "io/output_path.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace fs = std::filesystem;
namespace {

// What tells two paths apart as files (Note [An output is never an input]).
struct FileId {
  bool exists = false;
  dev_t device = 0;
  ino_t inode = 0;
  fs::path resolved;  // when it does not exist

  bool operator==(const FileId& other) const {
    if (exists != other.exists) return false;
    return exists ? device == other.device && inode == other.inode : resolved == other.resolved;
  }
};

FileId file_id(const fs::path& path) {
  struct ::stat st {};
  if (::stat(path.c_str(), &st) == 0)
    return {.exists = true, .device = st.st_dev, .inode = st.st_ino, .resolved = {}};
  // Not there yet: where a write would put it, a dangling link's target included.
  const fs::path target = fs::absolute(follow_links(path));
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(target, ec);
  return {.resolved = ec ? target.lexically_normal() : resolved};
}

}  // namespace

FileRoles& FileRoles::input(const fs::path& path, std::string_view name) {
  if (!path.empty()) inputs_.push_back({path, std::string(name)});
  return *this;
}

FileRoles& FileRoles::input_dir(const fs::path& path, std::string_view name,
                                std::span<const std::string_view> files) {
  input(path, name);
  std::error_code ec;
  if (path.empty() || !fs::is_directory(path, ec)) return *this;
  for (const std::string_view file : files)
    if (fs::exists(path / file, ec)) input(path / file, name);
  return *this;
}

FileRoles& FileRoles::output(const fs::path& path, std::string_view name) {
  if (!path.empty()) outputs_.push_back({path, std::string(name)});
  return *this;
}

void FileRoles::check() const {
  std::vector<FileId> inputs;
  for (const Named& in : inputs_) inputs.push_back(file_id(in.path));
  std::vector<FileId> outputs;
  for (const Named& out : outputs_) {
    const FileId id = file_id(out.path);
    const auto clash = [&](const Named& other, std::string_view why) {
      throw InputError(fmt::format("{} {}: is the same file as {} {}, {}; give another path",
                                   out.name, out.path.string(), other.name, other.path.string(),
                                   why));
    };
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i] == id) clash(inputs_[i], "which is read: writing it would destroy it");
    for (std::size_t i = 0; i < outputs.size(); ++i)
      if (outputs[i] == id) clash(outputs_[i], "which is written too: one would replace the other");
    outputs.push_back(id);
  }
}

fs::path directory_of(const fs::path& file) {
  return file.has_parent_path() ? file.parent_path() : fs::path(".");
}

}  // namespace lockstep::detail
