// load_csv(): comma-separated numbers, one sample per line, one column holding the class.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string_view>
#include <system_error>

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

void split_fields(std::string_view line, std::vector<std::string_view>& fields) {
  fields.clear();
  while (true) {
    const auto comma = line.find(',');
    fields.push_back(trim(line.substr(0, comma)));
    if (comma == std::string_view::npos) return;
    line.remove_prefix(comma + 1);
  }
}

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
  // a separator) size the buffers up front.
  CsvParser(std::string name, int label_column, std::size_t max_rows, std::size_t max_values)
      : name_(std::move(name)),
        label_column_(label_column),
        max_rows_(max_rows),
        max_values_(max_values) {
    y_.reserve(max_rows_);
  }

  // Parses one non-blank data line; line_no is 1-based.
  void add_line(std::string_view line, std::size_t line_no) {
    split_fields(line, fields_);
    if (columns_ == 0) start(line_no);
    if (fields_.size() != columns_) {
      fail(line_no, fmt::format("expected {} columns, got {}", columns_, fields_.size()));
    }
    for (std::size_t c = 0; c < columns_; ++c) {
      if (c == label_) {
        y_.push_back(parse_label(fields_[c], line_no));
      } else {
        x_.push_back(parse_feature(fields_[c], c, line_no));
      }
    }
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
  void start(std::size_t line_no) {
    columns_ = fields_.size();
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
    // terabytes.
    x_.reserve(std::min(max_rows_, max_values_ / columns_) * (columns_ - 1));
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
  std::vector<std::string_view> fields_;
  std::vector<float> x_;
  std::vector<std::int32_t> y_;
};

}  // namespace

InMemoryDataset load_csv(const std::filesystem::path& file, int label_column, bool header) {
  const std::string text = detail::read_input(file, detail::InputKind::data);
  std::string_view rest = text;
  if (rest.starts_with("\xEF\xBB\xBF")) rest.remove_prefix(3);  // a UTF-8 byte-order mark

  CsvParser parser(file.string(), label_column,
                   static_cast<std::size_t>(std::count(rest.begin(), rest.end(), '\n')) + 1,
                   rest.size() / 2 + 1);
  bool header_pending = header;
  bool saw_any_line = false;
  for (std::size_t line_no = 1; !rest.empty(); ++line_no) {
    const auto eol = rest.find('\n');
    const std::string_view line = rest.substr(0, eol);  // a trailing '\r' is trimmed as space
    rest.remove_prefix(eol == std::string_view::npos ? rest.size() : eol + 1);
    if (trim(line).empty()) continue;
    saw_any_line = true;
    if (header_pending) {
      header_pending = false;
      continue;
    }
    parser.add_line(line, line_no);
  }
  return std::move(parser).finish(saw_any_line);
}

}  // namespace lockstep
