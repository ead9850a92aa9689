#include "data/read_file.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <system_error>

#include "lockstep/error.hpp"

namespace lockstep::detail {

namespace {

// errno's text, without strerror's shared buffer.
std::string errno_message(int error) { return std::generic_category().message(error); }

}  // namespace

std::string read_file(const std::filesystem::path& file) {
  // stdio rather than iostreams: it reports why an open failed through errno.
  errno = 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(file.c_str(), "rb"), &std::fclose);
  if (!f) throw InputError(fmt::format("{}: cannot open: {}", file.string(), errno_message(errno)));

  std::string bytes;
  char chunk[1 << 16];
  std::size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof chunk, f.get())) > 0) bytes.append(chunk, got);
  // A directory opens fine on POSIX and fails here, with EISDIR.
  if (std::ferror(f.get())) {
    throw InputError(fmt::format("{}: cannot read: {}", file.string(), errno_message(errno)));
  }
  return bytes;
}

}  // namespace lockstep::detail
