#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "io/json.hpp"
#include "train/memory_plan.hpp"
#include "lockstep/trainer.hpp"

namespace lockstep {
namespace {

// JSON has no NaN or Infinity: write null.
std::string number(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : "null"; }

std::string worker_times_json(const std::vector<WorkerTimes>& rows) {
  std::string out;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    const WorkerTimes& w = rows[r];
    out += fmt::format(
        "{}\n    {{\"rank\": {}, \"total_s\": {}, \"compute_s\": {}, \"comm_exposed_s\": {}, "
        "\"data_wait_s\": {}, \"barrier_wait_s\": {}, \"optimizer_state_bytes\": {}}}",
        r ? "," : "", r, number(w.total_s), number(w.compute_s), number(w.comm_exposed_s),
        number(w.data_wait_s), number(w.barrier_wait_s), w.optimizer_state_bytes);
  }
  return rows.empty() ? out : out + "\n  ";
}

std::string device_memory_json(const std::vector<Summary::DeviceMemory>& gpus) {
  std::string out;
  for (const Summary::DeviceMemory& g : gpus)
    out += fmt::format("{}{{\"device\": {}, \"total_bytes\": {}, \"baseline_bytes\": {}, "
                       "\"peak_bytes\": {}}}",
                       out.empty() ? "" : ", ", g.device, g.total_bytes, g.baseline_bytes,
                       g.peak_bytes);
  return out;
}

}  // namespace

std::string describe_backend(const Summary& s) {
  const std::size_t workers = s.devices.size() * static_cast<std::size_t>(s.processes);
  return fmt::format("{} ({} worker{}: {}devices {})", s.backend, workers, workers == 1 ? "" : "s",
                     s.processes > 1 ? fmt::format("{} processes x ", s.processes) : std::string(),
                     fmt::join(s.devices, ","));
}

std::string describe_optimizer_state(const Summary& s) {
  return fmt::format("{} per worker at most ({})",
                     detail::format_bytes(static_cast<double>(s.optimizer_state_bytes)),
                     s.zero == 2   ? "ZeRO-2: sharded across workers, with the gradients"
                     : s.zero == 1 ? "ZeRO-1: sharded across workers"
                                   : "replicated, trainer.zero 0");
}

std::string describe_worker_memory(const Summary& s) {
  const auto size = [](std::size_t bytes) {
    return detail::format_bytes(static_cast<double>(bytes));
  };
  return fmt::format("parameters {}, gradients {}, optimizer state {}, activations {}",
                     size(s.param_bytes), size(s.grad_bytes), size(s.optimizer_state_bytes),
                     size(s.activation_bytes));
}

std::string describe_training_cost(const Summary& s) {
  if (!s.full_finetune) return {};
  const Summary::TrainingCost &t = s.training, &f = *s.full_finetune;
  const auto size = [](std::size_t bytes) { return detail::format_bytes(double(bytes)); };
  const auto ratio = [](std::size_t full, std::size_t mine) {
    return mine ? fmt::format("{:.0f}x", double(full) / double(mine)) : std::string("-");
  };
  return fmt::format("{} of {} parameters trained (frozen {}); gradients {} per step, {} fewer "
                     "than a full fine-tune's {}; optimiser state {}, {} less than {}",
                     t.trainable_parameters, t.trainable_parameters + t.frozen_parameters,
                     t.frozen_parameters, size(t.gradient_bytes_per_step),
                     ratio(f.gradient_bytes_per_step, t.gradient_bytes_per_step),
                     size(f.gradient_bytes_per_step), size(t.optimizer_state_bytes),
                     ratio(f.optimizer_state_bytes, t.optimizer_state_bytes),
                     size(f.optimizer_state_bytes));
}

std::string training_cost_json(const Summary::TrainingCost& c) {
  return fmt::format("{{\"trainable_parameters\": {}, \"frozen_parameters\": {}, "
                     "\"gradient_bytes_per_step\": {}, \"optimizer_state_bytes\": {}}}",
                     c.trainable_parameters, c.frozen_parameters, c.gradient_bytes_per_step,
                     c.optimizer_state_bytes);
}

std::string describe_graphs(const Summary::Graphs& g) {
  std::string timed;
  if (g.eager_step_s > 0.0 && g.graph_step_s > 0.0)
    timed = fmt::format("; auto timed a step at {:.2f} ms with them, {:.2f} ms without",
                        1e3 * g.graph_step_s, 1e3 * g.eager_step_s);
  const std::string refused =
      g.refused == 0 ? std::string()
                     : fmt::format("; {} part(s) run as launched, their capture refused: {}",
                                   g.refused, g.refusal);
  if (g.used)
    return fmt::format("on ({} captured, {} launches{}{})", g.captured, g.launched, refused,
                       timed);
  return fmt::format("off ({})", g.why_not.empty() ? "nothing captured" : g.why_not);
}

std::string describe_device_memory(const Summary::DeviceMemory& g) {
  const auto size = [](std::size_t bytes) { return detail::format_bytes(double(bytes)); };
  return fmt::format("cuda:{} {} at the peak, {} of it before the run (the CUDA context and "
                     "others'), {} added by the run; {} on the GPU",
                     g.device, size(g.peak_bytes), size(g.baseline_bytes),
                     size(g.peak_bytes - std::min(g.peak_bytes, g.baseline_bytes)),
                     size(g.total_bytes));
}

std::string describe_recoveries(const Summary& s) {
  return fmt::format("{} ({} recover{}, {} steps redone, {:.2f} s; trainer.on_worker_failure: "
                     "shrink)",
                     s.workers_lost, s.recoveries, s.recoveries == 1 ? "y" : "ies", s.steps_redone,
                     s.recovery_s);
}

std::string Summary::to_json() const {
  return fmt::format(
      "{{\n"
      "  \"backend\": \"{}\",\n"
      "  \"matmul\": {},\n"
      "  \"precision\": \"{}\",\n"
      "  \"attention\": {},\n"
      "  \"cudnn\": {},\n"
      "  \"communicator\": {},\n"
      "  \"devices\": [{}],\n"
      "  \"workers\": {},\n"
      "  \"processes\": {},\n"
      "  \"parameters\": {},\n"
      "  \"steps\": {},\n"
      "  \"samples\": {},\n"
      "  \"wall_s\": {},\n"
      "  \"samples_per_s\": {},\n"
      "{}"
      "  \"mfu\": {},\n"
      "  \"final_train_loss\": {},\n"
      "  \"final_train_accuracy\": {},\n"
      "  \"eval_loss\": {},\n"
      "  \"eval_accuracy\": {},\n"
      "  \"replicas_identical\": {},\n"
      "  \"replica_checks\": {},\n"
      "  \"param_hash\": \"{:016x}\",\n"
      "  \"accumulate_steps\": {},\n"
      "  \"buckets\": {},\n"
      "  \"reduce_bytes_per_step\": {},\n"
      "  \"reduce_dtype\": \"{}\",\n"
      "  \"overlap\": {},\n"
      "  \"comm_mode\": \"{}\",\n"
      "  \"loader\": \"{}\",\n"
      "  \"zero\": {},\n"
      "  \"optimizer_state_bytes\": {},\n"
      "  \"param_bytes\": {},\n"
      "  \"grad_bytes\": {},\n"
      "  \"activation_bytes\": {},\n"
      "  \"planned_worker_bytes\": {},\n"
      "  \"peak_rss_bytes\": {},\n"
      "  \"device_memory\": [{}],\n"
      "  \"trainable_parameters\": {},\n"
      "  \"frozen_parameters\": {},\n"
      "  \"gradient_bytes_per_step\": {},\n"
      "  \"planned_optimizer_state_bytes\": {},\n"
      "  \"full_finetune\": {},\n"
      "  \"host_syncs_per_step\": {},\n"
      "  \"device_busy\": {},\n"
      "  \"fused_linear\": {{\"fused\": {}, \"partial\": {}, \"composed\": {}}},\n"
      "  \"cuda_graphs\": {{\"used\": {}, \"why_not\": {}, \"eager_step_ms\": {}, "
      "\"graph_step_ms\": {}, \"captured\": {}, \"launched\": {}, \"eager\": {}, "
      "\"refused\": {}, \"refusal\": {}}},\n"
      "  \"data_wait_s\": {},\n"
      "  \"barrier_wait_s\": {},\n"
      "  \"comm_s\": {},\n"
      "  \"comm_exposed_s\": {},\n"
      "  \"comm_hidden_fraction\": {},\n"
      "  \"resumed_from_step\": {},\n"
      "  \"stopped_early\": {},\n"
      "  \"nonfinite_skips\": {},\n"
      "  \"workers_lost\": {},\n"
      "  \"recoveries\": {},\n"
      "  \"steps_redone\": {},\n"
      "  \"recovery_s\": {},\n"
      "  \"checkpoint\": {},\n"
      "  \"worker_times\": [{}]\n"
      "}}\n",
      backend, detail::json_quote(matmul), precision,
      attention.empty() ? "null" : detail::json_quote(attention),
      cudnn.empty() ? "null" : detail::json_quote(cudnn),
      communicator.empty() ? "null" : detail::json_quote(communicator), fmt::join(devices, ", "), devices.size() * processes, processes, parameters, steps, samples,
      number(wall_s), number(samples_per_s),
      // A language model's token fields; an MLP has no tokens.
      flops_per_token > 0.0
          ? fmt::format("  \"tokens_per_s\": {},\n  \"step_tokens_per_s\": {},\n  \"step_mfu\": "
                        "{},\n  \"flops_per_token\": {},\n{}",
                        number(tokens_per_s), number(step_tokens_per_s),
                        step_mfu > 0.0 ? number(step_mfu) : "null", number(flops_per_token),
                        masked ? fmt::format("  \"loss_tokens\": {},\n  \"loss_tokens_per_s\": "
                                             "{},\n  \"skipped_records\": {},\n",
                                             loss_tokens, number(loss_tokens_per_s),
                                             skipped_records)
                               : std::string())
          : std::string(),
      mfu > 0.0 ? number(mfu) : "null", number(final_train_loss),
      number(final_train_accuracy), number(eval_loss), number(eval_accuracy),
      replicas_identical ? "true" : "false", replica_checks, param_hash, accumulate_steps, buckets,
      reduce_bytes_per_step, reduce_dtype,
      overlap ? "true" : "false", comm_mode, loader, zero, optimizer_state_bytes, param_bytes, grad_bytes, activation_bytes,
      planned_worker_bytes, peak_rss_bytes, device_memory_json(device_memory),
      training.trainable_parameters, training.frozen_parameters, training.gradient_bytes_per_step,
      training.optimizer_state_bytes,
      full_finetune ? training_cost_json(*full_finetune) : std::string("null"),
      host_syncs_per_step, device_busy ? number(*device_busy) : std::string("null"),
      fused_linear.fused, fused_linear.partial, fused_linear.composed,
      graphs.used ? "true" : "false",
      graphs.why_not.empty() ? "null" : detail::json_quote(graphs.why_not),
      graphs.eager_step_s > 0.0 ? number(1e3 * graphs.eager_step_s) : "null",
      graphs.graph_step_s > 0.0 ? number(1e3 * graphs.graph_step_s) : "null", graphs.captured,
      graphs.launched, graphs.eager, graphs.refused,
      graphs.refusal.empty() ? "null" : detail::json_quote(graphs.refusal),
      number(data_wait_s),
      number(barrier_wait_s), number(comm_s), number(comm_exposed_s), number(comm_hidden_fraction),
      resumed_from_step, stopped_early ? "true" : "false", nonfinite_skips,
      workers_lost, recoveries, steps_redone, number(recovery_s),
      last_checkpoint.empty() ? "null" : detail::json_quote(last_checkpoint),
      worker_times_json(worker_times));
}

}  // namespace lockstep
