// One GPT training step on one device, for bench/compare_gpt.py (against PyTorch eager):
// forward, next-token cross-entropy, backward and AdamW on a fixed batch of random tokens,
// timed with Device::synchronize() around each step after --warmup steps. Prints one JSON line:
// the median step time over --steps steps, tokens/s, and on a GPU the peak table knows, MFU.
//
//   build/bench/bench_gpt [--preset tiny|small|124m] [--batch B] [--steps N] [--warmup W]
//                         [--backend cpu|cuda] [--tf32 | --bf16] [--threads T]
//                         [--attention materialized|fused] [--context T]
//                         [--head chunked|whole] [--breakdown]
//
// --bf16 runs the step as the trainer does under trainer.precision: bf16 (Note [bf16 compute]
// in src/model/ops.hpp): the LM head's bf16 logits, the fused classifier writing their gradient
// over them, and AdamW writing the bf16 copy of the weights; so a build before and after a
// change to the bf16 kernels can be timed on the same step (issue 25).
// --head chunked (the default, as the trainer's step) runs the LM head and the loss a chunk of
// rows at a time (Note [Chunked classifier] in src/model/lm_head.cpp); whole writes every logit
// first, as the step did before, so the two can be timed side by side. --context T shortens
// the preset's sequences.
// --breakdown then runs --steps more steps with the device synchronised between their parts
// (the blocks' forward, the LM head with the loss, the blocks' backward, AdamW) and adds each
// part's median milliseconds to the JSON line ("parts"), beside "parts_sum_ms": where a step's
// time goes, and what the synchronisations cost against "step_ms". With --head whole the
// second part is forward's head and the loss, and backward includes the head's.
// Presets: tiny = configs/gpt_tiny.yaml's shapes (V 256, T 64, L 4, H 4, C 128); small = V 512,
// T 128, L 4, H 4, C 256; 124m = GPT-2 small (V 50257, T 1024, L 12, H 12, C 768).
// Without a usable GPU, --backend cuda prints {"error": ...} and exits 0.
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/json.hpp"
#include "lockstep/lockstep.hpp"
#include "stats.hpp"

using namespace lockstep;

namespace {

struct Options {
  std::string preset = "tiny";
  int batch = 16;
  int steps = 20;
  int warmup = 3;
  BackendKind backend = BackendKind::cpu;
  bool tf32 = false;
  bool bf16 = false;
  int threads = 0;
  AttentionKind attention = AttentionKind::materialized;  // model.attention, resolved
  int context = 0;     // 0: the preset's
  bool chunked = true;  // --head
  bool breakdown = false;
};

GptSpec preset(const std::string& name) {
  if (name == "tiny") return {.vocab_size = 256, .context = 64, .n_layer = 4, .n_head = 4, .d_model = 128};
  if (name == "small") return {.vocab_size = 512, .context = 128, .n_layer = 4, .n_head = 4, .d_model = 256};
  if (name == "124m") return {.vocab_size = 50257, .context = 1024, .n_layer = 12, .n_head = 12, .d_model = 768};
  throw std::invalid_argument("--preset: expected tiny, small or 124m, got " + name);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(flag + ": expected a value");
      return argv[++i];
    };
    if (flag == "--preset") o.preset = value();
    else if (flag == "--batch") o.batch = std::stoi(value());
    else if (flag == "--steps") o.steps = std::stoi(value());
    else if (flag == "--warmup") o.warmup = std::stoi(value());
    else if (flag == "--threads") o.threads = std::stoi(value());
    else if (flag == "--context") o.context = std::stoi(value());
    else if (flag == "--head") {
      const std::string h = value();
      if (h != "chunked" && h != "whole") throw std::invalid_argument("--head: expected chunked or whole");
      o.chunked = h == "chunked";
    }
    else if (flag == "--breakdown") o.breakdown = true;
    else if (flag == "--tf32") o.tf32 = true;
    else if (flag == "--bf16") o.bf16 = true;
    else if (flag == "--attention") {
      const std::string a = value();
      if (a != "fused" && a != "materialized")
        throw std::invalid_argument("--attention: expected fused or materialized");
      o.attention = a == "fused" ? AttentionKind::fused : AttentionKind::materialized;
    }
    else if (flag == "--backend") {
      const std::string b = value();
      if (b != "cpu" && b != "cuda") throw std::invalid_argument("--backend: expected cpu or cuda");
      o.backend = b == "cpu" ? BackendKind::cpu : BackendKind::cuda;
    } else {
      throw std::invalid_argument("unknown flag " + flag);
    }
  }
  if (o.tf32 && o.bf16) throw std::invalid_argument("--tf32 and --bf16: choose one");
  return o;
}

int run(const Options& o) {
  GptSpec spec = preset(o.preset);
  if (o.context > 0) spec.context = o.context;
  const Precision precision = o.bf16 ? Precision::bf16 : o.tf32 ? Precision::tf32 : Precision::fp32;
  const int id = 0;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Device> dev;
  try {
    backend = make_backend(o.backend, std::span(&id, 1), {.precision = precision});
    dev = backend->create_device(id, 1, o.threads);
  } catch (const std::exception& e) {
    fmt::print("{{\"error\": {}}}\n", detail::json_quote(e.what()));  // one valid JSON line
    return 0;
  }
  const Model model = Model::gpt(spec, o.attention);
  Replica replica(*dev, model, o.batch, precision);
  replica.load_parameters(model.initial_parameters(0));
  const std::size_t rows = std::size_t(o.batch) * spec.context, n = model.param_count();
  std::vector<float> x(rows);
  std::vector<std::int32_t> y(rows);
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> token(0, spec.vocab_size - 1);
  for (std::size_t i = 0; i < rows; ++i) {
    x[i] = static_cast<float>(token(rng));
    y[i] = token(rng);
  }
  const int width = model.outputs() / spec.context;  // the padded vocabulary
  // bf16's gradient of the logits is written over its bf16 logits (Replica::dlogits_bf16).
  DeviceArray<float> xd(*dev, rows), dlogits(*dev, o.bf16 || o.chunked ? 0 : rows * width), m(*dev, n),
      v(*dev, n);
  DeviceArray<std::int32_t> yd(*dev, rows);
  xd.upload(x);
  yd.upload(y);
  const AdamWParams adamw{.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  DeviceArray<LossStats> stats(*dev, 1);
  std::vector<double> times;
  double loss = 0.0;
  // One step; `part(i)` is called after each of its four parts (a no-op when timing the whole).
  const auto step_once = [&](int step, const auto& part) {
    replica.zero_grads();
    const float scale = 1.0f / static_cast<float>(rows);
    if (o.chunked) {  // as the trainer's step
      replica.forward_hidden(xd.data(), o.batch);
      part(0);
      replica.head_loss(o.batch, {.labels = yd.data(), .grad_scale = scale, .stats = stats.data()},
                        /*gradients=*/true);
      part(1);
      replica.backward(xd.data(), nullptr, o.batch);
    } else if (std::uint16_t* logits16 = replica.dlogits_bf16()) {  // bf16
      (void)replica.forward_bf16(xd.data(), o.batch);
      part(0);
      dev->softmax_cross_entropy(logits16, yd.data(), static_cast<int>(rows), width, logits16,
                                 scale, stats.data());
      part(1);
      replica.backward(xd.data(), nullptr, o.batch);
    } else {
      const float* logits = replica.forward(xd.data(), o.batch);
      part(0);
      dev->softmax_cross_entropy(logits, yd.data(), static_cast<int>(rows), width, dlogits.data(),
                                 scale, stats.data());
      part(1);
      replica.backward(xd.data(), dlogits.data(), o.batch);
    }
    part(2);
    dev->adamw_step(adamw, 3e-4f, step, replica.params(), replica.grads(), m.data(), v.data(), n,
                    nullptr, replica.params_bf16());
    part(3);
  };
  for (int step = 1; step <= o.warmup + o.steps; ++step) {
    stats.upload(std::vector<LossStats>(1));  // zeroed, before the clock starts
    dev->synchronize();
    const double t0 = bench::now_s();
    step_once(step, [](int) {});
    dev->synchronize();
    if (step > o.warmup) times.push_back(bench::now_s() - t0);
    loss = stats.download()[0].loss_sum / static_cast<double>(rows);  // after the clock stops
  }
  // --breakdown: each part between synchronisations (the forward without the head, then the
  // head with the loss, and so on), medians over --steps more steps.
  constexpr const char* kParts[] = {"forward", "head_loss", "backward", "adamw"};
  std::vector<std::vector<double>> parts(o.breakdown ? 4 : 0);
  for (int step = 1; o.breakdown && step <= o.steps; ++step) {
    stats.upload(std::vector<LossStats>(1));
    dev->synchronize();
    double t = bench::now_s();
    step_once(o.warmup + o.steps + step, [&](int i) {
      dev->synchronize();
      const double now = bench::now_s();
      parts[static_cast<std::size_t>(i)].push_back(now - t);
      t = now;
    });
  }
  std::string parts_json;
  double parts_sum = 0.0;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const double ms = 1e3 * bench::median(parts[i]);
    parts_sum += ms;
    parts_json += fmt::format("{}\"{}\": {:.4f}", i ? ", " : "", kParts[i], ms);
  }
  const double step_s = bench::median(times);
  const double tokens_per_s = static_cast<double>(rows) / step_s;
  const std::vector<DeviceInfo> infos = backend->devices();
  const std::string name = infos.empty() ? "?" : infos.front().name;
  const std::optional<double> peak = peak_flops(name, precision);
  fmt::print(
      "{{\"framework\": \"lockstep\", \"device\": \"{}\", \"preset\": \"{}\", \"attention\": \"{}\", "
      "\"precision\": \"{}\", \"params\": {}, "
      "\"batch\": {}, \"context\": {}, \"steps\": {}, \"step_ms\": {:.4f}, \"tokens_per_s\": {:.1f}, "
      "\"mfu\": {}, \"last_loss\": {:.6f}, \"head\": \"{}\"{}}}\n",
      name, o.preset, to_string(o.attention), to_string(precision), n, o.batch, spec.context, o.steps, 1e3 * step_s, tokens_per_s,
      peak ? fmt::format("{:.4f}", gpt_flops_per_token(spec) * tokens_per_s / *peak) : "null", loss,
      o.chunked ? "chunked" : "whole",
      o.breakdown ? fmt::format(", \"parts\": {{{}}}, \"parts_sum_ms\": {:.4f}", parts_json, parts_sum)
                  : std::string());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_gpt: {}\n", e.what());
    return 2;
  }
}
