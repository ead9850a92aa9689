#include "train/report.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <span>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/rate.hpp"
#include "io/durable_file.hpp"
#include "lockstep/version.hpp"

namespace fs = std::filesystem;

namespace lockstep::detail {
namespace {

// ---- Text -----------------------------------------------------------------------------------

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A tick label: integers up to 10^7 in full, other values with 4 significant digits.
std::string label(double v) {
  if (std::abs(v) >= 1e4 && std::abs(v) < 1e7) return fmt::format("{:.0f}", v);
  return fmt::format("{:.4g}", v);
}

std::string seconds(double s) { return fmt::format("{:.3f} s", s); }

std::string percent(double part, double whole) {
  return whole > 0.0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : "-";
}

// ---- Charts (inline SVG; no xmlns, which HTML does not need) --------------------------------

constexpr double kChartW = 720, kChartH = 300;
constexpr double kLeft = 72, kRight = 24, kTop = 36, kBottom = 46;
constexpr const char* kFont = "font-family=\"sans-serif\" font-size=\"12\"";
constexpr const char* kTitleFont = "font-family=\"sans-serif\" font-size=\"14\" font-weight=\"bold\"";

// An axis range widened to round numbers, with its ticks (steps of 1, 2 or 5 x 10^k).
struct Axis {
  double lo = 0.0, hi = 1.0;
  std::vector<double> ticks;
};

Axis nice_axis(double lo, double hi, bool from_zero) {
  if (from_zero) lo = std::min(lo, 0.0);
  if (!(hi > lo)) {
    const double pad = lo == 0.0 ? 1.0 : 0.1 * std::abs(lo);
    hi = lo + pad;
    if (!from_zero) lo -= pad;
  }
  const double raw = (hi - lo) / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / magnitude;
  const double step = (f < 1.5 ? 1.0 : f < 3.0 ? 2.0 : f < 7.0 ? 5.0 : 10.0) * magnitude;
  Axis a{std::floor(lo / step) * step, std::ceil(hi / step) * step, {}};
  for (int i = 0;; ++i) {
    const double v = a.lo + i * step;
    if (v > a.hi + 1e-6 * step) break;
    a.ticks.push_back(std::abs(v) < 1e-9 * step ? 0.0 : v);
  }
  return a;
}

struct Series {
  std::string name, color;
  std::vector<double> x{}, y{};
  bool markers = false;  // a dot per point (sparse series such as eval)
  bool dashed = false;
};

// Legend entries, right-aligned, in a row whose boxes start at `top`.
std::string legend(const std::vector<std::pair<std::string, std::string>>& entries, double top = 12) {
  std::string out;
  double x = kChartW - kRight;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    x -= 7.0 * static_cast<double>(it->first.size()) + 26.0;
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/>"
        "<text x=\"{:.1f}\" y=\"{}\" {}>{}</text>\n",
        x, top, it->second, x + 16, top + 10, kFont, escape(it->first));
  }
  return out;
}

// Axes, grid, tick labels and titles around a plot area; maps data to pixels.
struct Frame {
  Axis x, y;
  double px(double v) const { return kLeft + (v - x.lo) / (x.hi - x.lo) * (kChartW - kLeft - kRight); }
  double py(double v) const {
    return kChartH - kBottom - (v - y.lo) / (y.hi - y.lo) * (kChartH - kTop - kBottom);
  }

  std::string draw(std::string_view title, std::string_view x_label, std::string_view y_label) const {
    std::string out = fmt::format(
        "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"{2}\">\n"
        "<rect width=\"{0}\" height=\"{1}\" fill=\"#fff\"/>\n"
        "<text x=\"{3}\" y=\"22\" {4}>{2}</text>\n",
        kChartW, kChartH, escape(title), kLeft, kTitleFont);
    for (double t : y.ticks)
      out += fmt::format(
          "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#e4e4e4\"/>"
          "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\" {5}>{6}</text>\n",
          kLeft, kChartW - kRight, py(t), kLeft - 6, py(t) + 4, kFont, label(t));
    for (double t : x.ticks)
      out += fmt::format(
          "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>"
          "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\" {4}>{5}</text>\n",
          px(t), kTop, kChartH - kBottom, kChartH - kBottom + 16, kFont, label(t));
    out += fmt::format(
        "<rect x=\"{0}\" y=\"{1}\" width=\"{2}\" height=\"{3}\" fill=\"none\" stroke=\"#888\"/>\n"
        "<text x=\"{4}\" y=\"{5}\" text-anchor=\"middle\" {6}>{7}</text>\n"
        "<text transform=\"translate(16 {8}) rotate(-90)\" text-anchor=\"middle\" {6}>{9}</text>\n",
        kLeft, kTop, kChartW - kLeft - kRight, kChartH - kTop - kBottom,
        (kLeft + kChartW - kRight) / 2, kChartH - 8, kFont, escape(x_label),
        (kTop + kChartH - kBottom) / 2, escape(y_label));
    return out;
  }
};

// Lines (broken at non-finite values) and optional markers, on one pair of axes.
std::string line_chart(std::string_view title, std::string_view x_label, std::string_view y_label,
                       const std::vector<Series>& series, bool y_from_zero) {
  double x_lo = INFINITY, x_hi = -INFINITY, y_lo = INFINITY, y_hi = -INFINITY;
  for (const Series& s : series)
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_lo = std::min(x_lo, s.x[i]);
      x_hi = std::max(x_hi, s.x[i]);
      y_lo = std::min(y_lo, s.y[i]);
      y_hi = std::max(y_hi, s.y[i]);
    }
  if (!std::isfinite(x_lo)) return fmt::format("<p>{}: no finite values.</p>\n", escape(title));
  const Frame f{nice_axis(x_lo, x_hi, false), nice_axis(y_lo, y_hi, y_from_zero)};
  std::string out = f.draw(title, x_label, y_label);
  std::vector<std::pair<std::string, std::string>> entries;
  for (const Series& s : series) {
    if (s.x.empty()) continue;
    entries.emplace_back(s.name, s.color);
    std::string points;
    auto flush = [&] {
      if (!points.empty())
        out += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\"{} points=\"{}\"/>\n",
                           s.color, s.dashed ? " stroke-dasharray=\"6 4\"" : "", points);
      points.clear();
    };
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        flush();
        continue;
      }
      points += fmt::format("{:.1f},{:.1f} ", f.px(s.x[i]), f.py(s.y[i]));
      if (s.markers)
        out += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} at {}: {:.6g}</title></circle>\n",
                           f.px(s.x[i]), f.py(s.y[i]), s.color, escape(s.name), label(s.x[i]), s.y[i]);
    }
    flush();
  }
  return out + legend(entries) + "</svg>\n";
}

// One horizontal bar per worker, split into where its time went.
std::string worker_chart(const std::vector<WorkerTimes>& rows) {
  struct Part {
    const char* name;
    const char* color;
    double WorkerTimes::*field;
  };
  static constexpr Part kParts[] = {{"compute", "#4c78a8", &WorkerTimes::compute_s},
                                    {"communication (exposed)", "#f58518", &WorkerTimes::comm_exposed_s},
                                    {"data wait", "#54a24b", &WorkerTimes::data_wait_s},
                                    {"barrier wait", "#b279a2", &WorkerTimes::barrier_wait_s}};
  if (rows.empty()) return "<p>No per-worker times.</p>\n";
  constexpr double kRow = 26.0, kBarsTop = kTop + 16;  // the legend gets a row of its own
  const double height = kBarsTop + kRow * static_cast<double>(rows.size()) + kBottom;
  double longest = 0.0;
  for (const WorkerTimes& w : rows) {
    double sum = 0.0;
    for (const Part& p : kParts) sum += w.*p.field;
    longest = std::max(longest, std::max(sum, w.total_s));
  }
  const Axis x = nice_axis(0.0, longest, true);
  auto px = [&](double v) { return kLeft + v / (x.hi - x.lo) * (kChartW - kLeft - kRight); };
  std::string out = fmt::format(
      "<svg viewBox=\"0 0 {0} {1}\" width=\"{0}\" height=\"{1}\" role=\"img\" aria-label=\"time per worker\">\n"
      "<rect width=\"{0}\" height=\"{1}\" fill=\"#fff\"/>\n"
      "<text x=\"{2}\" y=\"22\" {3}>Where each worker's time went</text>\n",
      kChartW, height, kLeft, kTitleFont);
  const double bottom = height - kBottom;
  for (double t : x.ticks)
    out += fmt::format(
        "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#e4e4e4\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\" {4}>{5}</text>\n",
        px(t), kBarsTop, bottom, bottom + 16, kFont, label(t));
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const double y = kBarsTop + kRow * static_cast<double>(r) + 4.0;
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\" {}>rank {}</text>\n",
                       kLeft - 6, y + 13, kFont, r);
    double at = 0.0;
    for (const Part& p : kParts) {
      const double v = rows[r].*p.field;
      if (!(v > 0.0)) continue;
      out += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.1f}\" width=\"{:.2f}\" height=\"{}\" fill=\"{}\">"
          "<title>rank {}: {} {} ({})</title></rect>\n",
          px(at), y, px(at + v) - px(at), kRow - 8.0, p.color, r, p.name, seconds(v),
          percent(v, rows[r].total_s));
      at += v;
    }
  }
  out += fmt::format(
      "<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#888\"/>\n"
      "<text x=\"{3}\" y=\"{4}\" text-anchor=\"middle\" {5}>seconds over the run</text>\n",
      kLeft, kBarsTop, bottom, (kLeft + kChartW - kRight) / 2, height - 8, kFont);
  std::vector<std::pair<std::string, std::string>> entries;
  for (const Part& p : kParts) entries.emplace_back(p.name, p.color);
  return out + legend(entries, kTop - 6) + "</svg>\n";
}

// ---- Tables ---------------------------------------------------------------------------------

using Rows = std::vector<std::pair<std::string, std::string>>;

std::string table(const Rows& rows) {
  std::string out = "<table>\n";
  for (const auto& [key, value] : rows)
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", escape(key), escape(value));
  return out + "</table>\n";
}

std::string summary_table(const Summary& s) {
  Rows rows = {
      {"backend", describe_backend(s)},
      {"precision", s.precision},
      {"parameters", std::to_string(s.parameters)},
      {"steps", std::to_string(s.steps)},
      {"samples", std::to_string(s.samples)},
      {"wall time", seconds(s.wall_s)},
      {"samples/s", detail::format_rate(s.samples_per_s)},
      {"final train loss", fmt::format("{:.4f} (accuracy {:.4f})", s.final_train_loss,
                                       s.final_train_accuracy)},
      {"eval", std::isfinite(s.eval_loss)
                   ? fmt::format("loss {:.4f}, accuracy {:.4f}", s.eval_loss, s.eval_accuracy)
                   : std::string(s.stopped_early ? "skipped: the run was stopped"
                                                 : "none (data.eval_fraction is 0)")},
      {"replicas identical", fmt::format("{} ({} hash checks, parameter hash {:016x})",
                                         s.replicas_identical ? "yes" : "NO", s.replica_checks,
                                         s.param_hash)},
      {"gradient buckets",
       fmt::format("{} (overlap {}, collectives {}, accumulate {} micro-batches per step)",
                   s.buckets, s.overlap ? "on" : "off", s.comm_mode, s.accumulate_steps)},
      {"all-reduce", fmt::format("{} per worker, {:.0f}% hidden behind backward",
                                 seconds(s.comm_s), 100.0 * s.comm_hidden_fraction)},
      {"waiting", fmt::format("{} for data (loader {}), {} at the barrier (per worker)",
                              seconds(s.data_wait_s), s.loader, seconds(s.barrier_wait_s))},
      {"optimizer state", describe_optimizer_state(s)},
      {"worker memory", describe_worker_memory(s)},
  };
  if (s.backend != "cpu") rows.emplace_back("cuda graphs", describe_graphs(s.graphs));
  // A language model's rows, after samples/s (and precision after matrix products, below).
  const auto after = [&](std::string_view key) {
    return std::find_if(rows.begin(), rows.end(), [&](const auto& r) { return r.first == key; }) + 1;
  };
  if (s.flops_per_token > 0.0)
    rows.insert(after("samples/s"), {"tokens/s", detail::format_rate(s.tokens_per_s)});
  if (!s.attention.empty())
    rows.insert(after("precision"), {"attention", s.attention + ": " + s.attention_detail});
  if (!s.communicator.empty()) rows.insert(rows.begin() + 1, {"communicator", s.communicator});
  if (!s.matmul.empty()) rows.insert(rows.begin() + 1, {"matrix products", s.matmul});
  if (s.resumed_from_step > 0) rows.emplace_back("resumed from step", std::to_string(s.resumed_from_step));
  if (s.stopped_early) rows.emplace_back("stopped early", "yes (request_stop)");
  if (s.nonfinite_skips > 0) rows.emplace_back("non-finite steps skipped", std::to_string(s.nonfinite_skips));
  if (s.workers_lost > 0) rows.emplace_back("workers lost", describe_recoveries(s));
  if (!s.last_checkpoint.empty()) rows.emplace_back("last checkpoint", s.last_checkpoint);
  return table(rows);
}

std::string settings_table(const Config& c, const Summary& s) {
  const OptimizerConfig& o = c.optimizer;
  std::string optimizer = fmt::format("{}, lr {:g}", to_string(o.type), o.lr);
  if (o.type == OptimizerKind::sgd && o.momentum > 0.0)
    optimizer += fmt::format(", momentum {:g}{}", o.momentum, o.nesterov ? " (nesterov)" : "");
  if (o.weight_decay > 0.0) optimizer += fmt::format(", weight decay {:g}", o.weight_decay);
  if (o.clip_grad_norm > 0.0) optimizer += fmt::format(", clip norm {:g}", o.clip_grad_norm);
  const std::size_t n = s.devices.size() * static_cast<std::size_t>(s.processes);  // workers
  const ModelConfig& m = c.model;
  return table({
      {"config", c.source},
      {"model", m.type == "gpt"
                    ? fmt::format("gpt, {} layers, {} heads, d_model {}, context {}", m.n_layer,
                                  m.n_head, m.d_model, m.context)
                    : fmt::format("{}, hidden [{}], {}", m.type, fmt::join(m.hidden, ", "),
                                  to_string(m.activation))},
      {"data", fmt::format("{}, batch {} per worker ({} global)", to_string(c.data.dataset),
                           c.data.batch_size, static_cast<std::size_t>(c.data.batch_size) * n)},
      {"optimizer", optimizer},
      {"schedule", std::string(to_string(c.schedule.type))},
      {"threads per worker", c.trainer.threads_per_device == 0
                                 ? std::string("auto (cores / workers)")
                                 : std::to_string(c.trainer.threads_per_device)},
      {"bucket cap", fmt::format("{:g} MB", c.trainer.bucket_cap_mb)},
      {"seed", std::to_string(c.trainer.seed)},
  });
}

std::string worker_table(const std::vector<WorkerTimes>& rows) {
  std::string out =
      "<table class=\"grid\">\n<tr><th>rank</th><th>total</th><th>compute</th>"
      "<th>communication (exposed)</th><th>data wait</th><th>barrier wait</th></tr>\n";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const WorkerTimes& w = rows[r];
    auto cell = [&](double v) { return fmt::format("<td>{} ({})</td>", seconds(v), percent(v, w.total_s)); };
    out += fmt::format("<tr><td>{}</td><td>{}</td>{}{}{}{}</tr>\n", r, seconds(w.total_s),
                       cell(w.compute_s), cell(w.comm_exposed_s), cell(w.data_wait_s),
                       cell(w.barrier_wait_s));
  }
  return out + "</table>\n";
}

constexpr std::string_view kStyle = R"(body { font-family: sans-serif; margin: 2em; color: #222; max-width: 60em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { padding: 0.2em 0.8em; text-align: left; border-bottom: 1px solid #ddd; font-size: 0.95em; }
table.grid td { text-align: right; } table.grid td:first-child { text-align: left; }
svg { display: block; margin: 0.8em 0; max-width: 100%; height: auto; }
.note { color: #666; font-size: 0.9em; })";

}  // namespace

RunReport::RunReport(fs::path file) : file_(std::move(file)) {
  const fs::path dir = fs::absolute(file_).parent_path();
  if (!fs::is_directory(dir))
    throw InputError(fmt::format("trainer.report: {}: directory '{}' does not exist",
                                 file_.string(), dir.string()));
  buckets_.reserve(kMaxBuckets);
}

void RunReport::step(const StepMetrics& m) {
  if (buckets_.empty() || buckets_.back().count >= width_) {
    if (buckets_.size() == kMaxBuckets) {
      // Merge neighbours; every bucket now spans twice as many steps.
      std::size_t out = 0;
      for (std::size_t i = 0; i < buckets_.size(); i += 2, ++out) {
        Bucket merged = buckets_[i];
        if (i + 1 < buckets_.size()) {
          const Bucket& next = buckets_[i + 1];
          merged.last_step = next.last_step;
          merged.count += next.count;
          merged.loss_sum += next.loss_sum;
          merged.accuracy_sum += next.accuracy_sum;
          merged.lr = next.lr;
          merged.elapsed_s = next.elapsed_s;
          merged.samples = next.samples;
        }
        buckets_[out] = merged;
      }
      buckets_.resize(out);
      width_ *= 2;
    }
    if (buckets_.empty() || buckets_.back().count >= width_) buckets_.emplace_back();
  }
  Bucket& b = buckets_.back();
  if (b.count == 0) b.first_step = m.step;
  b.last_step = m.step;
  ++b.count;
  b.loss_sum += m.loss;
  b.accuracy_sum += m.accuracy;
  b.lr = m.lr;
  b.elapsed_s = m.elapsed_s;
  b.samples = m.samples_per_s * m.elapsed_s;  // samples since the start of this run
}

void RunReport::eval(const EvalMetrics& m) { evals_.push_back(m); }

std::string RunReport::html(const Config& config, const Summary& summary) const {
  Series loss{.name = "train", .color = "#4c78a8"}, accuracy{.name = "train", .color = "#4c78a8"},
      throughput{.name = "per step", .color = "#4c78a8"}, lr{.name = "learning rate", .color = "#4c78a8"};
  double prev_s = 0.0, prev_samples = 0.0;
  for (const Bucket& b : buckets_) {
    const double x = 0.5 * static_cast<double>(b.first_step + b.last_step);
    const double n = static_cast<double>(b.count);
    loss.x.push_back(x);
    loss.y.push_back(b.loss_sum / n);
    accuracy.x.push_back(x);
    accuracy.y.push_back(b.accuracy_sum / n);
    throughput.x.push_back(x);
    throughput.y.push_back(b.elapsed_s > prev_s ? (b.samples - prev_samples) / (b.elapsed_s - prev_s) : NAN);
    lr.x.push_back(static_cast<double>(b.last_step));
    lr.y.push_back(b.lr);
    prev_s = b.elapsed_s;
    prev_samples = b.samples;
  }
  Series eval_loss{.name = "eval", .color = "#e45756", .markers = true},
      eval_accuracy{.name = "eval", .color = "#e45756", .markers = true};
  for (const EvalMetrics& e : evals_) {
    eval_loss.x.push_back(static_cast<double>(e.step));
    eval_loss.y.push_back(e.loss);
    eval_accuracy.x.push_back(static_cast<double>(e.step));
    eval_accuracy.y.push_back(e.accuracy);
  }
  Series mean{.name = "run mean (summary)", .color = "#999", .dashed = true};
  if (!throughput.x.empty()) {
    mean.x = {throughput.x.front(), throughput.x.back()};
    mean.y = {summary.samples_per_s, summary.samples_per_s};
  }

  const std::string per_point =
      width_ > 1 ? fmt::format("Each point is the mean of {} consecutive steps.", width_)
                 : std::string("One point per step.");
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>lockstep run report: {0}</title>\n<style>\n{1}\n</style>\n</head>\n<body>\n"
      "<h1>lockstep run report</h1>\n<p class=\"note\">{0}, written by lockstep {2}.</p>\n"
      "<h2>Summary</h2>\n{3}<h2>Settings</h2>\n{4}<h2>Loss</h2>\n<p class=\"note\">{5}</p>\n",
      escape(config.source), kStyle, kVersion, summary_table(summary), settings_table(config, summary),
      per_point);
  out += line_chart("Loss", "step", "cross-entropy", {loss, eval_loss}, true);
  out += line_chart("Accuracy", "step", "accuracy", {accuracy, eval_accuracy}, true);
  out += "<h2>Throughput</h2>\n<p class=\"note\">Global samples/s of each step (all workers), "
         "from the step's end-to-end time.</p>\n";
  out += line_chart("Throughput", "step", "samples/s", {throughput, mean}, true);
  const auto [lr_lo, lr_hi] = std::minmax_element(lr.y.begin(), lr.y.end());
  if (lr_lo != lr.y.end() && *lr_lo != *lr_hi)
    out += line_chart("Learning rate", "step", "learning rate", {lr}, true);
  out += "<h2>Workers</h2>\n<p class=\"note\">Seconds of each worker's training loop: compute "
         "(forward, backward, optimiser, eval), blocked on the gradient all-reduce, waiting for "
         "its loader, and waiting at the end-of-step barrier.</p>\n";
  out += worker_chart(summary.worker_times);
  out += worker_table(summary.worker_times);
  return out + "</body>\n</html>\n";
}

void RunReport::write(const Config& config, const Summary& summary) const {
  const std::string text = html(config, summary);
  const std::span<const std::byte> bytes = std::as_bytes(std::span(text.data(), text.size()));
  write_file_atomically(file_, std::span(&bytes, 1));
}

}  // namespace lockstep::detail
