// Note [Checking an output]: what cannot be written is refused before a run, naming the key;
// write_file_atomically writes through a symlink and keeps it.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <span>
#include <string>

#include "../cli/cli_runner.hpp"
#include "checkpoint_fixtures.hpp"
#include "io/durable_file.hpp"
#include "io/file_roles.hpp"
#include "io/output_path.hpp"
#include "skip.hpp"

namespace fs = std::filesystem;
using namespace lockstep;
using namespace lockstep::test;

namespace {

void write_text(const fs::path& file, std::string_view text) {
  const std::span<const std::byte> piece = std::as_bytes(std::span(text));
  detail::write_file_atomically(file, std::span(&piece, 1));
}

}  // namespace

TEST_CASE("check_output_file and check_output_dir: a missing parent, a directory for a file") {
  TempDir tmp;
  const fs::path missing = tmp.path() / "no" / "summary.json";
  CHECK(input_error_of([&] { detail::check_output_file(missing, "--summary-json"); }) ==
        "--summary-json " + missing.string() + ": directory '" + (tmp.path() / "no").string() +
            "' does not exist");
  CHECK(input_error_of([&] { detail::check_output_file(tmp.path(), "trainer.trace"); }) ==
        "trainer.trace " + tmp.path().string() + ": is a directory; expected a file name");
  const fs::path file = tmp.write("file", "x");
  CHECK(input_error_of([&] { detail::check_output_file(file / "out.json", "export --out"); })
            .ends_with(fmt::format("'{}' is not a directory", file.string())));
  CHECK(input_error_of([&] { detail::check_output_dir(file, "trainer.checkpoint.dir"); }) ==
        "trainer.checkpoint.dir " + file.string() + ": exists and is not a directory");
  CHECK(input_error_of([&] { detail::check_output_dir(file / "a" / "b", "trainer.checkpoint.dir"); })
            .ends_with(fmt::format("'{}' is not a directory", file.string())));
  // What can be written passes, and nothing is left behind by the check.
  detail::check_output_file(tmp.path() / "new.json", "--summary-json");
  detail::check_output_file(file, "--summary-json");
  detail::check_output_dir(tmp.path() / "a" / "b", "trainer.checkpoint.dir");
  CHECK(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()) == 1);
}

// Root writes into any directory: as root, the refusal is checked end to end instead, `lockstep
// train` run as nobody asked for its summary in a directory only root may write.
TEST_CASE("check_output_file: a directory without write permission is refused") {
  const std::optional<std::string> as_user = unprivileged_prefix();
  if (!as_user) return skip(Skip::root, "running as root without setpriv: root writes anywhere");
  TempDir tmp;
  const fs::path locked = tmp.path() / "locked";
  fs::create_directories(locked);
  const std::string refusal =
      "cannot write in directory '" + locked.string() + "': Permission denied";
  if (as_user->empty()) {
    fs::permissions(locked, fs::perms::owner_read | fs::perms::owner_exec);
    const std::string why =
        input_error_of([&] { detail::check_output_file(locked / "s.json", "--summary-json"); });
    fs::permissions(locked, fs::perms::owner_all);
    CHECK(why.ends_with(refusal));
    return;
  }
  // Root's directories, which nobody may enter and read, not write.
  const fs::perms read_only = fs::perms::owner_all | fs::perms::group_read |
                              fs::perms::group_exec | fs::perms::others_read |
                              fs::perms::others_exec;
  fs::permissions(tmp.path(), read_only);
  fs::permissions(locked, read_only);
  const CliResult r = run_command(*as_user + cli_path() + " train \"" LOCKSTEP_SOURCE_DIR
                                  "/configs/quickstart.yaml\" --set trainer.steps=1 "
                                  "--set trainer.checkpoint.dir= --summary-json " +
                                  (locked / "s.json").string());
  CHECK_MESSAGE(r.code == 2, r.output);
  // The CLI makes the file's directory first (prepare_output_file), so it names the directory.
  CHECK_MESSAGE(r.output.find("--summary-json " + locked.string() + ": " + refusal) !=
                    std::string::npos,
                r.output);
}

TEST_CASE("write_file_atomically: through a symlink, the target is replaced and the link kept") {
  TempDir tmp;
  fs::create_directories(tmp.path() / "real");
  const fs::path target = tmp.path() / "real" / "summary.json";
  write_text(target, "old");
  const fs::path link = tmp.path() / "link.json";
  fs::create_symlink(fs::path("real") / "summary.json", link);  // relative, as ln -s makes it
  detail::check_output_file(link, "--summary-json");
  write_text(link, "new");
  CHECK(fs::is_symlink(fs::symlink_status(link)));
  CHECK(slurp(target) == "new");
  // A dangling link: its target is created.
  const fs::path dangling = tmp.path() / "dangling.json";
  fs::create_symlink(tmp.path() / "real" / "later.json", dangling);
  write_text(dangling, "made");
  CHECK(fs::is_symlink(fs::symlink_status(dangling)));
  CHECK(slurp(tmp.path() / "real" / "later.json") == "made");
}

// Note [An output is never an input]: the same file by any name, existing or not yet.
TEST_CASE("FileRoles: an output that is an input or another output, by any name, is refused") {
  TempDir tmp;
  const fs::path data = tmp.path() / "data.txt";
  write_text(data, "text");
  const fs::path hard = tmp.path() / "hard.txt";
  fs::create_hard_link(data, hard);
  const fs::path link = tmp.path() / "link.txt";
  fs::create_symlink("data.txt", link);
  fs::create_directory(tmp.path() / "sub");
  const fs::path dir_link = tmp.path() / "sub_link";
  fs::create_directory_symlink(tmp.path() / "sub", dir_link);
  const auto refusal = [](const detail::FileRoles& roles) {
    return input_error_of([&] { roles.check(); });
  };
  for (const fs::path& same : {data, hard, link, tmp.path() / "sub" / ".." / "data.txt"}) {
    CAPTURE(same);
    detail::FileRoles roles;
    roles.input(data, "data.path").output(same, "--summary-json");
    CHECK(refusal(roles) == "--summary-json " + same.string() + ": is the same file as data.path " +
                                data.string() + ", which is read: writing it would destroy it; "
                                "give another path");
  }
  // Not there yet: the same path through a linked directory, or spelled another way.
  detail::FileRoles twice;
  twice.output(tmp.path() / "sub" / "out.bin", "tokenize --out")
      .output(dir_link / "out.bin", "tokenize --eval-out");
  CHECK(refusal(twice) == "tokenize --eval-out " + (dir_link / "out.bin").string() +
                              ": is the same file as tokenize --out " +
                              (tmp.path() / "sub" / "out.bin").string() +
                              ", which is written too: one would replace the other; give another "
                              "path");
  // A tokenizer directory's files are its inputs; other names in it, and other files, are not.
  write_text(tmp.path() / "sub" / "vocab.json", "{}");
  detail::FileRoles tokenizer;
  tokenizer.input_dir(dir_link, "--tokenizer", detail::kTokenizerFiles)
      .output(tmp.path() / "sub" / "vocab.json", "--out");
  CHECK(refusal(tokenizer).starts_with("--out " + (tmp.path() / "sub" / "vocab.json").string() +
                                       ": is the same file as --tokenizer "));
  detail::FileRoles apart;
  apart.input(data, "data.path")
      .input_dir(dir_link, "--tokenizer", detail::kTokenizerFiles)
      .output(tmp.path() / "sub" / "other.bin", "--out")
      .output(tmp.path() / "x.json", "--summary-json")
      .output("", "trainer.trace");
  CHECK_NOTHROW(apart.check());
}

TEST_CASE("directory_of: a bare file name is in the working directory") {
  CHECK(detail::directory_of("my.yaml") == ".");
  CHECK(detail::directory_of("configs/my.yaml") == "configs");
  CHECK(detail::directory_of("/my.yaml") == "/");
}
