// Note [Opening an input]: what is not a regular file is refused before it is read, with its
// type in the message; a config over its size cap is refused before it is read.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "data/temp_files.hpp"
#include "io/open_input.hpp"
#include "lockstep/error.hpp"

namespace fs = std::filesystem;
using lockstep::InputError;
using lockstep::detail::InputKind;
using lockstep::detail::open_input;
using lockstep::detail::read_input;

namespace {

std::string open_error(const fs::path& file, InputKind kind) {
  try {
    open_input(file, kind);
  } catch (const InputError& e) {
    return e.what();
  }
  FAIL_CHECK("no InputError for " << file.string());
  return "";
}

}  // namespace

TEST_CASE("open_input: a regular file opens with its size, and read_input reads all of it") {
  lockstep::test::TempDir dir;
  const fs::path file = dir.write("a.yaml", "model: {}\n");
  CHECK(open_input(file, InputKind::config).size() == 10);
  CHECK(read_input(file, InputKind::data) == "model: {}\n");
  CHECK(read_input(dir.write("empty", ""), InputKind::checkpoint).empty());
}

TEST_CASE("open_input: a FIFO, a character device, a directory and a socket are named and refused") {
  lockstep::test::TempDir dir;
  const fs::path fifo = dir.path() / "fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Held open for reading and writing, so that an open that did block would return at once and
  // the test could not hang: the refusal must come from the file's type, not a timeout.
  const int holder = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  REQUIRE(holder >= 0);
  for (const InputKind kind : {InputKind::config, InputKind::data, InputKind::checkpoint}) {
    const std::string prefix = fifo.string() + (kind == InputKind::config
                                                    ? ": cannot open config file: "
                                                    : ": cannot open: ");
    CHECK(open_error(fifo, kind) == prefix + "it is a FIFO (named pipe), expected a regular file");
  }
  ::close(holder);
  CHECK(open_error("/dev/zero", InputKind::data) ==
        "/dev/zero: cannot open: it is a character device, expected a regular file");
  CHECK(open_error(dir.path(), InputKind::checkpoint) ==
        dir.path().string() + ": cannot open: it is a directory, expected a regular file");

  const fs::path socket_path = dir.path() / "sock";
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, socket_path.c_str(), sizeof address.sun_path - 1);
  REQUIRE(::bind(s, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0);
  CHECK(open_error(socket_path, InputKind::data) ==
        socket_path.string() + ": cannot open: it is a socket, expected a regular file");
  ::close(s);
}

TEST_CASE("open_input: a config over its cap is refused before it is read, data has no cap") {
  lockstep::test::TempDir dir;
  const fs::path big = dir.path() / "big.yaml";
  // A sparse file: its size is what matters, and it costs no disk.
  const int fd = ::open(big.c_str(), O_WRONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(lockstep::detail::kMaxConfigBytes) + 1) == 0);
  ::close(fd);
  CHECK(open_error(big, InputKind::config) ==
        fmt::format("{}: config file of {} bytes: expected at most {}", big.string(),
                    lockstep::detail::kMaxConfigBytes + 1, lockstep::detail::kMaxConfigBytes));
  CHECK(open_input(big, InputKind::data).size() == lockstep::detail::kMaxConfigBytes + 1);
}
