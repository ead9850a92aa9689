#include "io/output_path.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <system_error>

#include "io/file_roles.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace fs = std::filesystem;
namespace {

[[noreturn]] void refuse(const fs::path& path, std::string_view what, std::string_view reason) {
  throw InputError(fmt::format("{} {}: {}", what, path.string(), reason));
}

// Files are created in `dir` (a temp file, then a rename): it must let us write and search.
void check_writable_dir(const fs::path& dir, const fs::path& path, std::string_view what) {
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (!fs::exists(status))
    refuse(path, what, fmt::format("directory '{}' does not exist", dir.string()));
  if (!fs::is_directory(status))
    refuse(path, what, fmt::format("'{}' is not a directory", dir.string()));
  // A file made and removed at once, rather than access(): it also sees a read-only file
  // system, ACLs, and root's reach.
  const fs::path probe = dir / fmt::format(".lockstep-probe.{}.tmp", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 && errno != EEXIST)
    refuse(path, what, fmt::format("cannot write in directory '{}': {}", dir.string(),
                                   std::generic_category().message(errno)));
  if (fd >= 0) {
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

}  // namespace

fs::path follow_links(const fs::path& path) {
  fs::path p = path;
  std::error_code ec;
  // A bound, for a loop of links: the kernel's own (ELOOP) is 40.
  for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : directory_of(p) / target;
  }
  return p;
}

void check_output_file(const fs::path& file, std::string_view what) {
  if (file.empty()) refuse(file, what, "expected a file name");
  const fs::path target = follow_links(file);
  std::error_code ec;
  const fs::file_status status = fs::status(target, ec);
  if (fs::is_directory(status))
    refuse(file, what, "is a directory; expected a file name");
  if (fs::exists(status) && !fs::is_regular_file(status))
    refuse(file, what, "exists and is not a regular file");
  check_writable_dir(directory_of(target), file, what);
}

void prepare_output_file(const fs::path& file, std::string_view what) {
  if (file.empty()) refuse(file, what, "expected a file name");
  const fs::path dir = directory_of(follow_links(file));
  check_output_dir(dir, what);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) refuse(file, what, fmt::format("cannot make directory '{}': {}", dir.string(), ec.message()));
  check_output_file(file, what);
}

void check_output_dir(const fs::path& dir, std::string_view what) {
  if (dir.empty()) return;
  std::error_code ec;
  const fs::file_status status = fs::status(dir, ec);
  if (fs::exists(status)) {
    if (!fs::is_directory(status)) refuse(dir, what, "exists and is not a directory");
    check_writable_dir(dir, dir, what);
    return;
  }
  // It will be created: the nearest ancestor that exists must let us.
  fs::path ancestor = fs::absolute(dir, ec).parent_path();
  while (!ancestor.empty() && !fs::exists(ancestor, ec) && ancestor != ancestor.root_path())
    ancestor = ancestor.parent_path();
  check_writable_dir(ancestor, dir, what);
}

}  // namespace lockstep::detail
