// `lockstep eval`: a checkpoint's loss and accuracy on the config's eval split.
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {
namespace {

// The model a checkpoint records must be the config's: the same tensors with another activation
// or other heads would evaluate another model.
void check_recorded_model(const Checkpoint& ckpt, const Config& cfg, const Dataset& train) {
  const auto recorded = ckpt.metadata.find("lockstep.model");
  if (recorded == ckpt.metadata.end()) return;  // written before checkpoints recorded it
  if (const std::string mine = describe_model(cfg, train); recorded->second != mine)
    throw InputError(fmt::format("{}: the checkpoint records the model '{}', {} describes '{}': "
                                 "a checkpoint of another model", ckpt.weights_file.string(),
                                 recorded->second, cfg.source, mine));
}

// The config's eval split prepared as the checkpoint's model expects: raw features
// standardised with the statistics it was trained with, whatever data.normalize says.
InMemoryDataset prepared_eval_split(Config cfg, const Standardization& s) {
  cfg.data.normalize = false;
  const DataSplit raw = load_dataset(cfg);
  const Dataset& eval = *raw.eval;
  const auto f = static_cast<std::size_t>(eval.features());
  if (s.mean.size() != f)
    throw InputError(fmt::format("{}: the checkpoint standardises {} features, the data has {}",
                                 cfg.source, s.mean.size(), f));
  std::vector<float> x(eval.size() * f);
  std::vector<std::int32_t> y(eval.size());
  for (std::size_t i = 0; i < eval.size(); ++i) eval.get(i, x.data() + i * f, &y[i]);
  InMemoryDataset out(std::move(x), std::move(y), eval.features(), raw.train->classes());
  out.standardize(s.mean, s.std);
  return out;
}

}  // namespace

int eval(const std::vector<std::string_view>& argv) {
  const CommandArgs args = parse_command_args("eval", argv, {"--set", "--checkpoint"});
  if (args.positional.empty()) throw InputError("eval: expected a CONFIG file; see lockstep --help");
  if (args.get("--checkpoint").empty()) throw InputError("eval: expected --checkpoint CKPT");
  const Config cfg = load_config(args.positional, args.overrides);
  const DataSplit data = load_dataset(cfg);
  if (!data.eval || data.eval->size() == 0)
    throw InputError(fmt::format("{}: data.eval_fraction: the eval split is empty", cfg.source));
  Checkpoint ckpt = CheckpointManager::load(args.get("--checkpoint"), warn);
  check_recorded_model(ckpt, cfg, *data.train);
  // A LoRA checkpoint is evaluated as its merged model, from its base read again and checked by
  // hash (Note [LoRA exports] in src/io/lora_checkpoint.cpp): the model without adapters.
  Config model_cfg = cfg;
  if (merge_lora_checkpoint(
          ckpt, "eval needs that base back where it was (the adapters alone are not a model)"))
    model_cfg.model.lora = {};
  const Model model = make_model(model_cfg, *data.train);
  check_layout(ckpt, model.param_tensors());
  const std::optional<Standardization> standardization = read_standardization(ckpt.metadata);
  const EvalMetrics m =
      standardization
          ? evaluate(model_cfg, model, ckpt.params, prepared_eval_split(cfg, *standardization))
          : evaluate(model_cfg, model, ckpt.params, *data.eval);
  fmt::print("checkpoint {} (step {})\n", ckpt.weights_file.string(), ckpt.state.step);
  fmt::print("eval loss {:.6f} accuracy {:.4f} ({} samples)\n", m.loss, m.accuracy, m.samples);
  return kExitOk;
}

}  // namespace lockstep::cli
