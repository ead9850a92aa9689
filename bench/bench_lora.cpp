// One replica's forward and backward of SmolLM2-135M's shape (configs/smollm2_135m.yaml) on one
// CPU thread, a full fine-tune against LoRA on every projection (issue 44's step-time goal), in
// process CPU time rather than wall time, so that a machine shared with other work still gives
// steady figures: medians, milliseconds. Also LoRA on q_proj alone, which has the same frozen
// work and one adapter: the difference is what the other six adapters cost. The trainer's step
// adds the optimiser and the all-reduce to these (bench/lora_vs_full.sh measures the whole step).
//
//   build/bench/bench_lora [--layers 30] [--context 64] [--batch 2] [--rank 16] [--reps 5]
#include <ctime>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "lockstep/lockstep.hpp"
#include "stats.hpp"

namespace {

double cpu_now_s() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timing {
  double forward_s, backward_s;
};

Timing time_step(const lockstep::Model& model, int batch, int reps) {
  auto dev = lockstep::make_cpu_device(0, 1);
  lockstep::Replica replica(*dev, model, batch);
  replica.load_parameters(model.initial_parameters(1));
  if (model.frozen_count() > 0) replica.load_frozen(model.initial_frozen(1));
  const std::size_t rows = std::size_t(batch) * std::size_t(model.inputs());
  std::vector<float> tokens(rows);
  for (std::size_t i = 0; i < rows; ++i) tokens[i] = static_cast<float>((i * 7919) % 1000);
  lockstep::DeviceArray<float> x(*dev, rows);
  x.upload(tokens);
  // Any gradient of the logits does: the products cost the same.
  lockstep::DeviceArray<float> dlogits(*dev, std::size_t(batch) * std::size_t(model.outputs()));
  dlogits.upload(std::vector<float>(dlogits.size(), 1e-4f));
  std::vector<double> forward, backward;
  for (int i = 0; i <= reps; ++i) {  // the first is oneDNN making its primitives: left out
    const double t0 = cpu_now_s();
    replica.forward(x.data(), batch);
    const double t1 = cpu_now_s();
    replica.zero_grads();
    replica.backward(x.data(), dlogits.data(), batch);
    const double t2 = cpu_now_s();
    if (i == 0) continue;
    forward.push_back(t1 - t0);
    backward.push_back(t2 - t1);
  }
  return {lockstep::bench::median(forward), lockstep::bench::median(backward)};
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 30, context = 64, batch = 2, rank = 16, reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::stoi(argv[i + 1]);
    if (flag == "--layers") layers = value;
    else if (flag == "--context") context = value;
    else if (flag == "--batch") batch = value;
    else if (flag == "--rank") rank = value;
    else if (flag == "--reps") reps = value;
    else {
      fmt::print(stderr, "bench_lora: unknown flag {}\n", flag);
      return 2;
    }
  }
  const lockstep::GptSpec spec{
      .vocab_size = 49152, .context = context, .n_layer = layers, .n_head = 9, .d_model = 576,
      .norm = lockstep::NormKind::rmsnorm, .norm_eps = 1e-5,
      .positions = lockstep::PositionKind::rope, .rope_theta = 100000.0,
      .mlp = lockstep::MlpKind::swiglu, .intermediate_size = 1536, .n_kv_head = 3,
      .qkv_bias = false, .proj_bias = false, .tie_embeddings = true};
  const auto attention = lockstep::AttentionKind::materialized;
  const lockstep::LoraSpec all{.rank = rank, .alpha = 2.0 * rank,
                               .targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                           "up_proj", "down_proj"}};
  lockstep::LoraSpec q_only = all;
  q_only.targets = {"q_proj"};
  fmt::print("SmolLM2-135M shape, {} layers, batch {} x context {}, fp32, 1 CPU thread, process "
             "CPU ms, median of {}\n", layers, batch, context, reps);
  fmt::print("{:24}{:>10}{:>10}{:>10}\n", "", "forward", "backward", "both");
  const Timing full = time_step(lockstep::Model::gpt(spec, attention), batch, reps);
  const auto row = [&](const char* name, const Timing& t) {
    fmt::print("{:24}{:10.1f}{:10.1f}{:10.1f}   full / this {:.2f}x\n", name, 1e3 * t.forward_s,
               1e3 * t.backward_s, 1e3 * (t.forward_s + t.backward_s),
               (full.forward_s + full.backward_s) / (t.forward_s + t.backward_s));
  };
  row("full fine-tune", full);
  row("LoRA, all 7 projections", time_step(lockstep::Model::gpt(spec, attention, all), batch, reps));
  row("LoRA, q_proj alone", time_step(lockstep::Model::gpt(spec, attention, q_only), batch, reps));
  return 0;
}
