#include <doctest/doctest.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>

#include <string>
#include <vector>

#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "sanitized.hpp"
#include "skip.hpp"
#include "temp_files.hpp"

using lockstep::InputError;
using lockstep::load_csv;
using lockstep::test::TempDir;

namespace {

std::vector<float> xs(const lockstep::InMemoryDataset& d) { return {d.x().begin(), d.x().end()}; }
std::vector<std::int32_t> ys(const lockstep::InMemoryDataset& d) {
  return {d.y().begin(), d.y().end()};
}

// The message load_csv() throws for `text`, or "" if it loads.
std::string csv_error(const std::string& text, int label_column = -1, bool header = false) {
  TempDir dir;
  const auto file = dir.write("bad.csv", text);
  try {
    load_csv(file, label_column, header);
  } catch (const InputError& e) {
    const std::string prefix = file.string();
    const std::string what = e.what();
    // The message starts with the file name; return what follows it.
    REQUIRE(what.compare(0, prefix.size(), prefix) == 0);
    return what.substr(prefix.size());
  }
  return "";
}

}  // namespace

TEST_CASE("load_csv: numbers, label last by default") {
  TempDir dir;
  const auto d = load_csv(dir.write("a.csv", "1,2.5,0\n-3,4e1,1\n0.5,6,2\n"), -1, false);
  CHECK(d.size() == 3);
  CHECK(d.features() == 2);
  CHECK(d.classes() == 3);
  CHECK(xs(d) == std::vector<float>{1, 2.5f, -3, 40, 0.5f, 6});
  CHECK(ys(d) == std::vector<std::int32_t>{0, 1, 2});
}

TEST_CASE("load_csv: header, CRLF, blank lines and spaces") {
  TempDir dir;
  const std::vector<float> x{1, 2, 3, 4};
  const std::vector<std::int32_t> y{0, 1};
  const auto header = load_csv(dir.write("h.csv", "f1,f2,label\n1,2,0\n3,4,1\n"), -1, true);
  CHECK(xs(header) == x);
  CHECK(ys(header) == y);
  const auto crlf = load_csv(dir.write("c.csv", "f1,f2,label\r\n1,2,0\r\n3,4,1\r\n"), -1, true);
  CHECK(xs(crlf) == x);
  CHECK(ys(crlf) == y);
  const auto loose = load_csv(dir.write("l.csv", "\n  \n 1 ,\t2 , 0\n\n+3,4,1"), -1, false);
  CHECK(xs(loose) == x);
  CHECK(ys(loose) == y);
  // The header is the first non-blank line.
  const auto late = load_csv(dir.write("t.csv", "\nf1,f2,label\n1,2,0\n3,4,1\n"), -1, true);
  CHECK(xs(late) == x);
  const auto bom = load_csv(dir.write("b.csv",
                                      "\xEF\xBB\xBF"
                                      "1,2,0\n3,4,1\n"),
                            -1, false);
  CHECK(xs(bom) == x);
}

TEST_CASE("load_csv: the label column can be anywhere") {
  TempDir dir;
  const auto file = dir.write("a.csv", "1,10,20\n0,11,21\n2,12,22\n");
  const auto first = load_csv(file, 0, false);
  CHECK(xs(first) == std::vector<float>{10, 20, 11, 21, 12, 22});
  CHECK(ys(first) == std::vector<std::int32_t>{1, 0, 2});
  CHECK(first.classes() == 3);
  const auto minus3 = load_csv(file, -3, false);
  CHECK(xs(minus3) == xs(first));
  CHECK(ys(minus3) == ys(first));

  const auto middle = load_csv(dir.write("m.csv", "5,1,6\n7,0,8\n"), -2, false);
  CHECK(xs(middle) == std::vector<float>{5, 6, 7, 8});
  CHECK(ys(middle) == std::vector<std::int32_t>{1, 0});
  CHECK(ys(load_csv(dir.write("m.csv", "5,1,6\n7,0,8\n"), 1, false)) == ys(middle));

  // Integral floats are labels too; classes = max label + 1 even if some are missing.
  const auto floats = load_csv(dir.write("f.csv", "1,0.0\n2,3.0\n"), -1, false);
  CHECK(ys(floats) == std::vector<std::int32_t>{0, 3});
  CHECK(floats.classes() == 4);
}

TEST_CASE("load_csv: errors name the file, the line and what was expected") {
  CHECK(csv_error("1,2,0\n\n3,4\n") == ":3: expected 3 columns, got 2");
  CHECK(csv_error("1,2,0\n3,4,1,5\n") == ":2: expected 3 columns, got 4");
  CHECK(csv_error("h\n1,abc,0\n", -1, true) == ":2: column 2: expected a number, got 'abc'");
  CHECK(csv_error("1,,0\n") == ":1: column 2: expected a number, got ''");
  CHECK(csv_error("1, 2x ,0\n") == ":1: column 2: expected a number, got '2x'");
  CHECK(csv_error("nan,2,0\n") == ":1: column 1: expected a number, got 'nan'");
  CHECK(csv_error("1e99,2,0\n") == ":1: column 1: expected a number, got '1e99'");
  CHECK(csv_error("1,2,0\n1,2,1\n1,2,2.5\n") ==
        ":3: label column: expected a non-negative integer class, got '2.5'");
  CHECK(csv_error("1,2,-1\n") ==
        ":1: label column: expected a non-negative integer class, got '-1'");
  CHECK(csv_error("1,2,one\n") ==
        ":1: label column: expected a non-negative integer class, got 'one'");
  CHECK(csv_error("1,2,0\n", 3) ==
        ":1: label_column 3 is out of range: expected -3..2 for 3 columns");
  CHECK(csv_error("1,2,0\n", -4) ==
        ":1: label_column -4 is out of range: expected -3..2 for 3 columns");
  CHECK(csv_error("\n1\n2\n") == ":2: expected at least 2 columns (features and a label), got 1");
  CHECK(csv_error("") == ": empty file: expected at least one sample line");
  CHECK(csv_error("\n \r\n") == ": empty file: expected at least one sample line");
  CHECK(csv_error("a,b,label\n", -1, true) ==
        ": no data after the header: expected at least one sample line");
  CHECK(csv_error("1,2,0\n3,4,0\n") ==
        ": every label is 0: expected at least 2 classes (labels 0..K-1)");
}

TEST_CASE("load_csv: unreadable files") {
  TempDir dir;
  const auto missing = dir.path() / "missing.csv";
  CHECK_THROWS_WITH_AS(load_csv(missing, -1, false),
                       (missing.string() + ": cannot open: No such file or directory").c_str(),
                       InputError);
  CHECK_THROWS_WITH_AS(load_csv(dir.path(), -1, false),
                       (dir.path().string() +
                        ": cannot open: it is a directory, expected a regular file").c_str(),
                       InputError);
}

TEST_CASE("load_csv: the shipped digits data") {
  const auto digits = load_csv(
      std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "third_party/digits/digits.csv", -1, false);
  CHECK(digits.size() == 1797);
  CHECK(digits.features() == 64);
  CHECK(digits.classes() == 10);
  for (const float v : digits.x()) REQUIRE((v >= 0.0f && v <= 16.0f));
}

// Note [Streaming CSV]: lines of 25 million single-digit values (100 MB, the worst case: a
// value per two bytes) costs the values and a block, not the text besides. Measured as the
// growth of the process's peak resident memory, which a sanitizer's shadow memory would blur.
TEST_CASE("load_csv: peak memory stays within twice the file for one very wide line") {
  if (lockstep::test::kSanitized)
    return lockstep::test::skip(lockstep::test::Skip::setup,
                                "peak memory under a sanitizer is the sanitizer's");
  TempDir dir;
  constexpr std::size_t kChunk = 1 << 19, kChunks = 48;  // 25,165,824 features a line
  // Written a chunk at a time, so that the test itself does not raise the peak first.
  const std::filesystem::path file = dir.path() / "wide.csv";
  {
    std::ofstream out(file, std::ios::binary);
    std::string chunk;
    for (std::size_t i = 0; i < kChunk; ++i) chunk += "1,";
    for (const char label : {'0', '1'}) {
      for (std::size_t i = 0; i < kChunks; ++i) out << chunk;
      out << label << '\n';
    }
  }
  const auto bytes = static_cast<double>(std::filesystem::file_size(file));
  const auto peak_bytes = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_maxrss) * 1024.0;  // Linux reports KiB
  };
  const double before = peak_bytes();
  const lockstep::InMemoryDataset d = lockstep::load_csv(file, -1, false);
  const double grown = peak_bytes() - before;
  CHECK(d.size() == 2);
  CHECK(d.features() == static_cast<int>(kChunk * kChunks));
  MESSAGE("peak grew by " << grown / 1e6 << " MB for a file of " << bytes / 1e6 << " MB");
  CHECK(grown <= 2.0 * bytes);
}
