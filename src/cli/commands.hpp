// The `lockstep` commands, one file each (main.cpp parses the command and dispatches).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lockstep/lockstep.hpp"

namespace lockstep::cli {

inline constexpr int kExitOk = 0, kExitFailure = 1, kExitBadInput = 2;

// lockstep train CONFIG [--set KEY=VALUE]... [--summary-json FILE] [--scaling N,N,...]
//                [--resume [DIR|FILE] | --init-from CKPT] [--overwrite] [--dry-run]
// `processes` is the MPI job this process belongs to (null: a single process).
int train(const std::vector<std::string_view>& args,
          const std::shared_ptr<ProcessGroup>& processes);

// The signal that stopped `train` (0: none): main() reports a stop that failed by it.
int train_stop_signal();

// lockstep eval CONFIG --checkpoint CKPT [--set KEY=VALUE]...
int eval(const std::vector<std::string_view>& args);

// lockstep export CKPT --out FILE|DIR [--format torch|hf] [--dtype fp32|bf16]
//                 [--tokenizer DIR|FILE]
int export_weights(const std::vector<std::string_view>& args);

// lockstep sample --checkpoint CKPT [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]
//                 [--seed S] [--backend auto|cpu|cuda] [--tokenizer DIR|FILE]
int sample(const std::vector<std::string_view>& args);

// lockstep tokenize --tokenizer DIR|FILE --out FILE [--eval-out FILE --eval-fraction F]
//                   [--format llmc|raw] INPUT...
int tokenize(const std::vector<std::string_view>& args);

// lockstep config --print CONFIG [--set KEY=VALUE]... [--init-from CKPT]
// lockstep config --schema --markdown
int config(const std::vector<std::string_view>& args);

// CONFIG with the overrides, and with `init_from` (when not empty) the model.* keys it does not
// set taken from those weights, as train reads it (Note [--init-from's model] in train.cpp).
Config load_config_with_weights(const std::string& config, const std::vector<std::string>& overrides,
                                const std::string& init_from, const ConfigReading& reading);

// The config keys with their values, defaults and descriptions, for `lockstep train --help`.
void print_config_keys();

// lockstep devices
int devices(const std::shared_ptr<ProcessGroup>& processes);

}  // namespace lockstep::cli
