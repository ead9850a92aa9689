// load_csv(): comma-separated numbers, one sample per line, one column holding the class.
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <span>
#include <string>
#include <system_error>
#include <vector>

#include "io/open_input.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"

namespace lockstep {

namespace {

std::string_view trim(std::string_view s) {
  constexpr std::string_view kSpace = " \t\r\f\v";
  const auto first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(kSpace) - first + 1);
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

// Note [Streaming CSV]
// The file is not held in memory: a CSV of one 1 GB line would otherwise cost the text, plus the
// parsed values (4 bytes each, up to twice the text for single-digit values). It is read through
// one block buffer, twice per line: a scan finds where the line ends, how many commas it has and
// whether it is blank, so that a wrong column count is reported before any field, as when lines
// were split in memory; then its fields are parsed in order, one at a time. The parser's peak
// memory is then the values (x_, y_) and the block: at most about twice the file.
class CsvReader {
 public:
  explicit CsvReader(const std::filesystem::path& file)
      : in_(detail::open_input(file, detail::InputKind::data)), name_(file.string()) {
    char bom[3] = {};
    if (read_at(0, std::span(bom)) == 3 && std::string_view(bom, 3) == "\xEF\xBB\xBF")
      start_ = 3;  // a UTF-8 byte-order mark
  }

  std::uint64_t start() const { return start_; }
  std::uint64_t size() const { return in_.size(); }

  struct Line {
    std::uint64_t begin = 0, end = 0, next = 0;  // [begin, end) without the '\n'; next line
    std::size_t commas = 0;
    bool blank = true;
  };

  // The line that starts at `begin`.
  Line scan(std::uint64_t begin) {
    Line line{.begin = begin, .end = size(), .next = size()};
    for_each_block(begin, size(), [&](std::uint64_t at, std::string_view block) {
      const std::size_t eol = block.find('\n');
      const std::string_view part = block.substr(0, eol);
      line.commas += static_cast<std::size_t>(std::count(part.begin(), part.end(), ','));
      line.blank = line.blank && std::all_of(part.begin(), part.end(), is_space);
      if (eol == std::string_view::npos) return true;
      line.end = at + eol;
      line.next = line.end + 1;
      return false;
    });
    return line;
  }

  // Calls f(field, column) for each field of `line`, trimmed, in order.
  template <class F>
  void fields(const Line& line, F&& f) {
    std::size_t column = 0;
    field_.clear();
    for_each_block(line.begin, line.end, [&](std::uint64_t, std::string_view block) {
      for (std::size_t comma; (comma = block.find(',')) != std::string_view::npos;) {
        field_.append(block.substr(0, comma));
        f(trim(field_), column++);
        field_.clear();
        block.remove_prefix(comma + 1);
      }
      field_.append(block);
      return true;
    });
    f(trim(field_), column);
  }

  // The number of '\n' in the file.
  std::size_t newlines() {
    std::size_t n = 0;
    for_each_block(start_, size(), [&](std::uint64_t, std::string_view block) {
      n += static_cast<std::size_t>(std::count(block.begin(), block.end(), '\n'));
      return true;
    });
    return n;
  }

 private:
  std::size_t read_at(std::uint64_t offset, std::span<char> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      const ::ssize_t n = ::pread(in_.get(), out.data() + done, out.size() - done,
                                  static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        throw InputError(fmt::format("{}: cannot read: {}", name_,
                                     std::generic_category().message(errno)));
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    return done;
  }

  // Calls f(offset, block) for the blocks of [begin, end) until it returns false.
  template <class F>
  void for_each_block(std::uint64_t begin, std::uint64_t end, F&& f) {
    for (std::uint64_t at = begin; at < end;) {
      const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(block_.size(), end - at));
      const std::size_t got = read_at(at, std::span(block_.data(), want));
      if (got == 0 || !f(at, std::string_view(block_.data(), got))) return;
      at += got;
    }
  }

  detail::InputFd in_;
  std::string name_;
  std::uint64_t start_ = 0;
  std::vector<char> block_ = std::vector<char>(1 << 20);
  std::string field_;  // the field being read: it may span blocks
};

// A finite double spelled in full by `s` (from_chars plus an optional leading '+').
std::optional<double> parse_number(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
  double value = 0.0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

class CsvParser {
 public:
  // `max_rows` (the number of lines) and `max_values` (a value takes at least a character and
  // a separator: half the bytes, rounded up) size the buffers up front.
  CsvParser(std::string name, int label_column, std::size_t max_rows, std::size_t max_values)
      : name_(std::move(name)),
        label_column_(label_column),
        max_rows_(max_rows),
        max_values_(max_values) {
    y_.reserve(max_rows_);
  }

  // Parses one non-blank data line; line_no is 1-based.
  void add_line(CsvReader& reader, const CsvReader::Line& line, std::size_t line_no) {
    const std::size_t fields = line.commas + 1;
    if (columns_ == 0) start(fields, line_no);
    if (fields != columns_) {
      fail(line_no, fmt::format("expected {} columns, got {}", columns_, fields));
    }
    reader.fields(line, [&](std::string_view field, std::size_t c) {
      if (c == label_) {
        y_.push_back(parse_label(field, line_no));
      } else {
        x_.push_back(parse_feature(field, c, line_no));
      }
    });
  }

  InMemoryDataset finish(bool saw_any_line) && {
    if (y_.empty()) {
      throw InputError(fmt::format("{}: {}: expected at least one sample line", name_,
                                   saw_any_line ? "no data after the header" : "empty file"));
    }
    const std::int32_t max_label = *std::max_element(y_.begin(), y_.end());
    if (max_label < 1) {
      throw InputError(fmt::format(
          "{}: every label is {}: expected at least 2 classes (labels 0..K-1)", name_, max_label));
    }
    return InMemoryDataset(std::move(x_), std::move(y_), static_cast<int>(columns_ - 1),
                           max_label + 1);
  }

 private:
  [[noreturn]] void fail(std::size_t line_no, std::string_view what) const {
    throw InputError(fmt::format("{}:{}: {}", name_, line_no, what));
  }

  // The first data line fixes the column count and the label column.
  void start(std::size_t fields, std::size_t line_no) {
    columns_ = fields;
    if (columns_ < 2) {
      fail(line_no,
           fmt::format("expected at least 2 columns (features and a label), got {}", columns_));
    }
    const auto n = static_cast<long long>(columns_);
    if (label_column_ < -n || label_column_ >= n) {
      fail(line_no, fmt::format("label_column {} is out of range: expected {}..{} for {} columns",
                                label_column_, -n, n - 1, n));
    }
    label_ = static_cast<std::size_t>(label_column_ < 0 ? n + label_column_ : label_column_);
    // Lines x columns alone would let a wide first line over many blank lines ask for
    // terabytes. A row of `columns_` values takes at least 2 x columns_ bytes with its commas
    // and newline (the last may lack one): so this bounds the rows from above, and the values
    // never outgrow the reservation (a vector that grows holds its old and new buffers at once).
    const std::size_t row_bound = (max_values_ * 2 + 1 + 2 * columns_ - 1) / (2 * columns_);
    x_.reserve(std::min(max_rows_, row_bound) * (columns_ - 1));
  }

  float parse_feature(std::string_view field, std::size_t column, std::size_t line_no) const {
    const auto value = parse_number(field);
    if (!value || std::abs(*value) > std::numeric_limits<float>::max()) {
      // Columns are 1-based in messages, like lines.
      fail(line_no, fmt::format("column {}: expected a number, got '{}'", column + 1, field));
    }
    return static_cast<float>(*value);
  }

  std::int32_t parse_label(std::string_view field, std::size_t line_no) const {
    // "3.0" is accepted: tools that write every column as floating point produce it.
    const auto value = parse_number(field);
    if (!value || *value < 0.0 || *value != std::floor(*value) ||
        *value >= std::numeric_limits<std::int32_t>::max()) {
      fail(line_no,
           fmt::format("label column: expected a non-negative integer class, got '{}'", field));
    }
    return static_cast<std::int32_t>(*value);
  }

  std::string name_;
  int label_column_;
  std::size_t max_rows_;
  std::size_t max_values_;
  std::size_t columns_ = 0;
  std::size_t label_ = 0;
  std::vector<float> x_;
  std::vector<std::int32_t> y_;
};

}  // namespace

InMemoryDataset load_csv(const std::filesystem::path& file, int label_column, bool header) {
  CsvReader reader(file);  // Note [Streaming CSV]
  CsvParser parser(file.string(), label_column, reader.newlines() + 1,
                   static_cast<std::size_t>((reader.size() - reader.start() + 1) / 2));
  bool header_pending = header;
  bool saw_any_line = false;
  for (std::uint64_t at = reader.start(), line_no = 1; at < reader.size(); ++line_no) {
    const CsvReader::Line line = reader.scan(at);  // a trailing '\r' is trimmed as space
    at = line.next;
    if (line.blank) continue;
    saw_any_line = true;
    if (header_pending) {
      header_pending = false;
      continue;
    }
    parser.add_line(reader, line, static_cast<std::size_t>(line_no));
  }
  return std::move(parser).finish(saw_any_line);
}

}  // namespace lockstep
