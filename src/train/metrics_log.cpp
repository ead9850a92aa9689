#include "train/metrics_log.hpp"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "io/json.hpp"
#include "lockstep/error.hpp"

namespace lockstep::detail {
namespace {

// JSON has no NaN or Infinity; an mfu of 0 means "no known peak".
std::string number(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : "null"; }

}  // namespace

std::string metrics_line(const RunStart& r) {
  std::tm utc{};
  gmtime_r(&r.start_time, &utc);
  char start[32];
  std::strftime(start, sizeof start, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return fmt::format(
      "{{\"kind\": \"run\", \"start_time\": \"{}\", \"config_hash\": \"{:016x}\", "
      "\"resumed_from_step\": {}, \"resumed_from\": {}, \"steps\": {}, \"workers\": {}}}",
      start, r.config_hash, r.resumed_from_step,
      r.resumed_from.empty() ? "null" : json_quote(r.resumed_from), r.steps, r.workers);
}

std::string metrics_line(const StepMetrics& m) {
  return fmt::format(
      "{{\"kind\": \"step\", \"step\": {}, \"epoch\": {}, \"loss\": {}, \"accuracy\": {}, "
      "\"lr\": {}, \"grad_norm\": {}, \"samples_per_s\": {}, \"tokens_per_s\": {}, \"mfu\": {}, "
      "\"comm_hidden_fraction\": {}, \"data_wait_s\": {}, \"elapsed_s\": {}}}",
      m.step, m.epoch, number(m.loss), number(m.accuracy), number(m.lr), number(m.grad_norm),
      number(m.samples_per_s), number(m.tokens_per_s), m.mfu > 0.0 ? number(m.mfu) : "null",
      number(m.comm_hidden_fraction), number(m.data_wait_s), number(m.elapsed_s));
}

std::string metrics_line(const EvalMetrics& m) {
  return fmt::format(
      "{{\"kind\": \"eval\", \"step\": {}, \"loss\": {}, \"accuracy\": {}, \"samples\": {}}}",
      m.step, number(m.loss), number(m.accuracy), m.samples);
}

std::string metrics_line(const Recovery& r) {
  return fmt::format(
      "{{\"kind\": \"recovery\", \"step\": {}, \"lost\": {}, \"workers\": {}, "
      "\"steps_redone\": {}, \"recovery_s\": {}}}",
      r.step, json_quote(r.lost), r.workers, r.steps_redone, number(r.recovery_s));
}

MetricsLog::MetricsLog(const std::filesystem::path& file) : path_(file) {
  std::error_code ec;  // a directory that cannot be made is reported by fopen below
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  errno = 0;
  file_ = std::fopen(file.c_str(), "a");
  if (!file_)
    throw InputError(fmt::format("trainer.metrics: {}: cannot open for appending: {}",
                                 file.string(), errno ? std::strerror(errno) : "unknown error"));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

// A whole line per write, flushed: a reader never sees a partial record unless the disk fills.
void MetricsLog::append(const std::string& line) {
  const std::string text = line + "\n";
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0)
    throw std::runtime_error(fmt::format("trainer.metrics: {}: write failed: {}", path_.string(),
                                         std::strerror(errno)));
}

}  // namespace lockstep::detail
