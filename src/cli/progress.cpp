#include "cli/progress.hpp"

#include <cmath>
#include <span>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/rate.hpp"
#include "io/durable_file.hpp"

namespace lockstep::cli {
namespace {

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long t = std::lround(s);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

// "12345 samples/s", or for a language model "20 samples/s 1280 tokens/s", with " mfu 41.2%"
// when the devices' peak is known; a slow run's "0.213 samples/s" (detail::format_rate).
std::string throughput(double samples_per_s, double tokens_per_s, double mfu) {
  std::string out = detail::format_rate(samples_per_s) + " samples/s";
  if (tokens_per_s > samples_per_s * 1.5)
    out += fmt::format(" {} tokens/s", detail::format_rate(tokens_per_s));
  if (mfu > 0.0) out += fmt::format(" mfu {:.1f}%", 100.0 * mfu);
  return out;
}

}  // namespace

Progress::Progress(std::FILE* out, bool live) : out_(out), live_(live) {}

void Progress::clear_line() {
  if (line_open_) {
    fmt::print(out_, "\r\033[2K");
    line_open_ = false;
  }
}

void Progress::step(const StepMetrics& m) {
  if (!live_) return;
  if (m.step != m.total_steps && m.elapsed_s - last_draw_s_ < 0.1) return;
  last_draw_s_ = m.elapsed_s;
  const double eta = m.elapsed_s / static_cast<double>(m.step) *
                     static_cast<double>(m.total_steps - m.step);
  fmt::print(out_, "\r\033[2Kstep {}/{} | epoch {} | loss {:.4f} | {} | ETA {}", m.step,
             m.total_steps, m.epoch, m.loss, throughput(m.samples_per_s, m.tokens_per_s, m.mfu),
             duration(eta));
  std::fflush(out_);
  line_open_ = true;
}

// Also on a terminal: the live line gives way to the log line, so the scrollback keeps every
// logged step, and is drawn again at the next step.
void Progress::log(const StepMetrics& m) {
  clear_line();
  fmt::print(out_,
             "step {}/{} epoch {} loss {:.4f} acc {:.4f} lr {:.4g} grad_norm {:.4g} {}\n",
             m.step, m.total_steps, m.epoch, m.loss, m.accuracy, m.lr, m.grad_norm,
             throughput(m.samples_per_s, m.tokens_per_s, m.mfu));
  std::fflush(out_);
}

void Progress::eval(const EvalMetrics& m) {
  clear_line();
  fmt::print(out_, "eval step {}: loss {:.4f} accuracy {:.4f} ({} samples)\n", m.step, m.loss,
             m.accuracy, m.samples);
  std::fflush(out_);
}

void Progress::checkpoint(std::int64_t step, const std::string& weights_file) {
  clear_line();
  fmt::print(out_, "checkpoint step {}: {}\n", step, weights_file);
  std::fflush(out_);
}

void Progress::finish() {
  if (line_open_) {
    fmt::print(out_, "\n");
    line_open_ = false;
  }
}

void write_file_atomically(const std::filesystem::path& path, const std::string& text) {
  const std::span<const std::byte> bytes = std::as_bytes(std::span(text.data(), text.size()));
  detail::write_file_atomically(path, std::span(&bytes, 1));
}

void print_summary(std::FILE* out, const Summary& s) {
  fmt::print(out, "summary\n");
  fmt::print(out, "  backend             {}\n", describe_backend(s));
  if (!s.matmul.empty()) fmt::print(out, "  matrix products     {}\n", s.matmul);
  if (!s.communicator.empty()) fmt::print(out, "  communicator        {}\n", s.communicator);
  fmt::print(out, "  precision           {}\n", s.precision);
  if (!s.attention.empty())
    fmt::print(out, "  attention           {}: {}\n", s.attention, s.attention_detail);
  fmt::print(out, "  parameters          {}\n", s.parameters);
  if (!s.memory_plan.empty()) fmt::print(out, "  memory plan         {}\n", s.memory_plan);
  for (const Summary::DeviceMemory& g : s.device_memory)
    fmt::print(out, "  device memory       {}\n", describe_device_memory(g));
  fmt::print(out, "  steps               {}\n", s.steps);
  fmt::print(out, "  wall time           {:.3f} s\n", s.wall_s);
  fmt::print(out, "  samples/s           {}\n", detail::format_rate(s.samples_per_s));
  if (s.flops_per_token > 0.0) {
    fmt::print(out, "  tokens/s            {}\n", detail::format_rate(s.tokens_per_s));
    // The steady step beside the whole run's rate, which counts the start (Summary).
    if (s.step_tokens_per_s > 0.0)
      fmt::print(out, "  step tokens/s       {}{} (a step's, the median after the first two; "
                      "the line above is the whole run's, its start included)\n",
                 detail::format_rate(s.step_tokens_per_s),
                 s.step_mfu > 0.0 ? fmt::format(", mfu {:.1f}%", 100.0 * s.step_mfu)
                                  : std::string());
    if (s.masked)
      fmt::print(out, "  loss tokens/s       {} ({} labels counted{})\n",
                 detail::format_rate(s.loss_tokens_per_s), s.loss_tokens,
                 s.skipped_records > 0
                     ? fmt::format("; {} bad records skipped", s.skipped_records)
                     : std::string());
    if (s.mfu > 0.0)
      fmt::print(out, "  mfu                 {:.1f}% ({:.3g} GFLOP per token)\n", 100.0 * s.mfu,
                 s.flops_per_token / 1e9);
    else
      fmt::print(out, "  mfu                 unknown: no peak FLOP/s for this device ({:.3g} GFLOP "
                      "per token)\n", s.flops_per_token / 1e9);
  }
  fmt::print(out, "  train loss          {:.4f} (accuracy {:.4f}), over the last log window\n",
             s.final_train_loss, s.final_train_accuracy);
  if (std::isfinite(s.eval_loss)) {
    fmt::print(out, "  eval loss           {:.4f}\n", s.eval_loss);
    fmt::print(out, "  eval accuracy       {:.4f}\n", s.eval_accuracy);
  } else if (s.stopped_early) {
    fmt::print(out, "  eval                skipped: the run was stopped\n");
  } else {
    fmt::print(out, "  eval                none (data.eval_fraction is 0)\n");
  }
  fmt::print(out, "  replicas identical  {} ({} hash checks, parameter hash {:016x})\n",
             s.replicas_identical ? "yes" : "NO", s.replica_checks, s.param_hash);
  if (s.workers_lost > 0) fmt::print(out, "  workers lost        {}\n", describe_recoveries(s));
  fmt::print(out,
             "  gradient buckets    {} (overlap {}, collectives {}, accumulate {} micro-batches "
             "per step)\n",
             s.buckets, s.overlap ? "on" : "off", s.comm_mode, s.accumulate_steps);
  // ZeRO-1 reduce-scatters the gradients and all-gathers the parameters instead.
  fmt::print(out, "  {:<20}{:.3f} s per worker, {:.0f}% hidden behind backward\n",
             s.zero >= 1 ? "scatter + gather" : "all-reduce", s.comm_s,
             100.0 * s.comm_hidden_fraction);
  fmt::print(out, "  gradient bytes      {} per step per worker to the collectives ({})\n",
             s.reduce_bytes_per_step, s.reduce_dtype);
  fmt::print(out, "  optimizer state     {}\n", describe_optimizer_state(s));
  fmt::print(out, "  worker memory       {}\n", describe_worker_memory(s));
  if (const std::string cost = describe_training_cost(s); !cost.empty())
    fmt::print(out, "  trained             {}\n", cost);
  fmt::print(out, "  host syncs          {} per step\n", s.host_syncs_per_step);
  if (s.device_busy)
    fmt::print(out, "  device busy         {:.1f}% of a step (median; else waiting for the host)\n",
               100.0 * *s.device_busy);
  if (s.backend != "cpu")  // the CPU composes every product: the count says nothing there
    fmt::print(out, "  fused linear        {} of {} products fused, {} partly, {} composed\n",
               s.fused_linear.fused, s.fused_linear.total(), s.fused_linear.partial,
               s.fused_linear.composed);
  if (s.backend != "cpu") fmt::print(out, "  cuda graphs         {}\n", describe_graphs(s.graphs));
  fmt::print(out,
             "  waiting             {:.3f} s for data (loader {}), {:.3f} s at the barrier (per "
             "worker)\n",
             s.data_wait_s, s.loader, s.barrier_wait_s);
}

}  // namespace lockstep::cli
