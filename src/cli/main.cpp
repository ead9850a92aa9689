// The `lockstep` command line.
//
// Exit codes: 0 success, 1 run-time failure, 2 bad input (config, flags, data files).
//
// Under mpirun or srun, every process runs this command with the same arguments: process 0
// prints and writes, the others are quiet but for errors. A process that fails ends the whole
// job (MPI_Abort) after its own workers have stopped, so no process is left waiting.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "lockstep/lockstep.hpp"

namespace lockstep::cli {
namespace {

// `lockstep train --help` prints this part of the usage, then the config keys.
constexpr std::string_view kTrainUsage =
    R"(train CONFIG [--set KEY=VALUE]... [--summary-json FILE] [--scaling N,N,...]
        [--resume [DIR|FILE] | --init-from CKPT] [--overwrite] [--dry-run [--compare-zero]]
                      train the model described by the YAML file CONFIG on every
                      configured device; --set overrides a config key (repeatable),
                      e.g. --set trainer.devices=4 --set optimizer.lr=0.05;
                      --scaling 1,2,4 trains once per device count and reports
                      samples/s, speedup and efficiency against one device;
                      --resume continues from the latest valid checkpoint in DIR
                      (default: trainer.checkpoint.dir) or from one checkpoint FILE;
                      --init-from starts from the weights alone of a checkpoint, an
                      export or a Hugging Face GPT-2 directory (step 0, fresh
                      optimiser): fine-tuning; the model.* keys the config does
                      not set come from the weights (config.json), those it sets
                      must agree.
                      a new run refuses a trainer.checkpoint.dir that holds
                      checkpoints; --overwrite lets it replace them
                      (trainer.checkpoint.overwrite: true).
                      --dry-run checks everything, prints the memory plan (bytes
                      per worker and on the host, against what this process may
                      use) and stops before step 1; with --compare-zero, the
                      plans at trainer.zero 0, 1 and 2, side by side.
                      SIGINT/SIGTERM finish the step, write a checkpoint and exit
                      130/143; a second SIGINT exits at once
)";

constexpr std::string_view kUsageHead = R"(usage: lockstep <command> [options]

commands:
)";

// One entry per command but train: its usage line(s) and what it does, as `lockstep COMMAND
// --help` prints it after "usage: lockstep ", and the whole usage lists them indented.
struct CommandHelp {
  std::string_view name;
  std::string_view text;
};

constexpr CommandHelp kCommandHelp[] = {
    {"eval", R"(eval CONFIG --checkpoint CKPT [--set KEY=VALUE]...
                      loss and accuracy of a checkpoint on the config's eval split
)"},
    {"export", R"(export CKPT --out FILE [--format torch] [--dtype fp32|bf16]
  export CKPT --format hf --out DIR [--dtype fp32|bf16] [--tokenizer DIR|FILE]
         [--max-shard-size SIZE] [--base]
  export CKPT --format peft --out DIR
                      write a checkpoint's weights as one safetensors file (with an
                      MLP's standardisation as normalize.mean and normalize.std), or
                      a GPT's as a Hugging Face directory (config.json and
                      model.safetensors for transformers.GPT2LMHeadModel, in shards
                      with model.safetensors.index.json above SIZE, 5GB by default,
                      and the run's data.tokenizer for AutoTokenizer; --tokenizer
                      when it has moved); --dtype bf16 stores every tensor as BF16
                      (rounded to nearest even). A LoRA checkpoint (model.lora):
                      hf merges the adapters into the base, hf --base writes the
                      base alone, peft the adapters as a PEFT adapter directory
)"},
    {"sample", R"(sample CKPT [--prompt TEXT] [--tokens N] [--temperature T]
         [--top-k K] [--seed S] [--backend auto|cpu|cuda] [--tokenizer DIR|FILE]
         [--stop-at ID,...|none] [--kv-cache on|off] [--allow-special]
                      continue TEXT with a GPT checkpoint CKPT (model.type gpt;
                      --checkpoint CKPT says the same), or a Hugging Face
                      directory (export --format hf; its own tokenizer): N
                      tokens (200), temperature T (0.8; 0 is greedy), from the K
                      most likely (0: all), seeded by S (0). A text model reads
                      and writes bytes; a model trained with data.tokenizer text,
                      through the tokenizer it records (--tokenizer when it has
                      moved); another token model ids, or text with --tokenizer.
                      It stops at the model's end-of-sequence ids (config.json's
                      eos_token_id from --init-from, else the tokenizer's end
                      token), or at --stop-at's. Each token costs one position
                      through a key/value cache (--kv-cache off: the whole
                      window per token, the same tokens). Special tokens' text
                      in TEXT is ordinary text unless --allow-special (a prompt
                      in a chat template: <|im_start|>user...)
)"},
    {"tokenize", R"(tokenize --tokenizer DIR|FILE --out FILE [--eval-out FILE --eval-fraction F]
           [--format llmc|raw] [--tokenizer-family llama3|qwen2|gpt2]
           [--allow-special] INPUT...
                      byte-level BPE over text into an llm.c token file, ready
                      for data.dataset: tokens. DIR|FILE: a Hugging Face
                      directory (tokenizer.json with its tokenizer_config.json,
                      or GPT-2's vocab.json and merges.txt), a tokenizer.json,
                      or a tiktoken rank file (GPT-2's, or the family named).
                      Each INPUT is a document (a text file; - is standard
                      input) or one per line (.jsonl, its "text" field), each
                      preceded by the model's BOS (Llama 3) or else its EOS
                      (GPT-2's <|endoftext|>, Qwen2). Special tokens' text is
                      ordinary text unless --allow-special. --eval-out takes
                      about F of the tokens (whole documents, or 16 KiB parts
                      of long ones; with few documents, the last tokens), and
                      warns when that is less than one window of GPT-2's
                      context. uint16 tokens (uint32 above 65,536 ids);
                      --format raw writes no header
)"},
    {"config", R"(config --print CONFIG [--set KEY=VALUE]... [--init-from CKPT]
                      print CONFIG with the overrides (and the model.* keys
                      --init-from takes from the weights) as lockstep train reads
                      it: every key, defaults included, paths absolute (YAML that
                      train takes back); its data files need not exist yet
  config --schema --markdown
                      the config key reference as Markdown (docs/config.md)
)"},
    {"devices", R"(devices             list the backends and devices this binary can use, what a
                      device is on each (on the CPU, a worker thread) and how
                      many this machine can run, and whether MPI is built in
)"},
};

// The options and the exit codes.
constexpr std::string_view kUsageTail = R"(
under mpirun -np P (or srun), each process trains on its own trainer.devices
and the job trains as one: P x devices workers

options:
  -h, --help          show this help; lockstep train --help also lists the config keys
  --version           print the version

exit codes: 0 ok, 1 run-time failure, 2 bad input (config, flags, data)
)";

void print_usage(std::FILE* to) {
  fmt::print(to, "{}  {}", kUsageHead, kTrainUsage);
  for (const CommandHelp& c : kCommandHelp) fmt::print(to, "  {}", c.text);
  fmt::print(to, "{}", kUsageTail);
}

// `lockstep COMMAND --help`: that command's usage (train's with the config keys); false for a
// name that is no command.
bool print_command_help(std::string_view command) {
  if (command == "train") {
    fmt::print("usage: lockstep {}", kTrainUsage);
    print_config_keys();
    return true;
  }
  for (const CommandHelp& c : kCommandHelp) {
    if (c.name != command) continue;
    fmt::print("usage: lockstep {}\noptions:\n  -h, --help          show this help (lockstep --help: every "
               "command)\n\nexit codes: 0 ok, 1 run-time failure, 2 bad input (config, flags, data)\n",
               c.text);
    return true;
  }
  return false;
}

// `processes` is set for the commands that may run as one process of an MPI job.
int run(int argc, char** argv, std::shared_ptr<ProcessGroup>& processes) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(stderr);
    return kExitBadInput;
  }
  const std::string_view command = args.front();
  const std::vector<std::string_view> rest(args.begin() + 1, args.end());
  if (command == "-h" || command == "--help" || command == "help") {
    print_usage(stdout);
    return kExitOk;
  }
  if (command == "--version") {
    fmt::print("lockstep {}\n", kVersion);
    return kExitOk;
  }
  // "lockstep sample --help" and the like: that command's usage, not an error; train's lists
  // the config keys. An unknown command's --help shows them all.
  if (std::any_of(rest.begin(), rest.end(), [](std::string_view a) { return a == "-h" || a == "--help"; })) {
    if (!print_command_help(command)) print_usage(stdout);
    return kExitOk;
  }
  if (command == "train" || command == "devices") processes = make_mpi_processes();
  if (command == "train") return train(rest, processes);
  if (command == "devices") return devices(processes);
  if (command == "eval") return eval(rest);
  if (command == "export") return export_weights(rest);
  if (command == "sample") return sample(rest);
  if (command == "tokenize") return tokenize(rest);
  if (command == "config") return config(rest);
  throw InputError(fmt::format("unknown command '{}'; expected train, eval, export, sample, "
                               "tokenize, config or devices (see lockstep --help)",
                               command));
}

}  // namespace
}  // namespace lockstep::cli

// Note [Leaving after a failure]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A failed run leaves through _Exit once its message is out (stdout and stderr flushed; every
// file it wrote was closed when written), skipping the exit handlers of the libraries. One of
// them hung: OpenBLAS (the pthreads build) starts a thread per core when it is loaded, each
// allocating a 128 MiB buffer at once and retrying forever, spinning, when that fails; its exit
// handler (gotoblas_quit) joins them. Under a memory cap (`ulimit -v`) a run that ran out of
// memory thus reported it and never exited. A worker left behind by a bounded stop (Note
// [Bounded stop]) is likewise not waited for. A run that succeeds exits normally.
int main(int argc, char** argv) {
  using namespace lockstep::cli;
  std::shared_ptr<lockstep::ProcessGroup> processes;  // under mpirun or srun
  const auto who = [&] {
    return processes && processes->size() > 1
               ? fmt::format("lockstep: process {} of {}", processes->rank(), processes->size())
               : std::string("lockstep");
  };
  int code = kExitOk;
  try {
    code = run(argc, argv, processes);
  } catch (const lockstep::InputError& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: error: {}\n", who(), e.what());
    code = kExitBadInput;
  } catch (const std::bad_alloc& e) {
    std::fflush(stdout);
    const bool named = dynamic_cast<const lockstep::OutOfMemory*>(&e) != nullptr;
    fmt::print(stderr, "{}: failed: {} while {}\n", who(), named ? e.what() : "out of memory",
               phase());
    code = kExitFailure;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "{}: failed: {}\n", who(), e.what());
    code = kExitFailure;
  } catch (...) {
    fmt::print(stderr, "{}: failed: unknown error\n", who());
    code = kExitFailure;
  }
  // A stop by signal that could not finish cleanly (Note [Bounded stop]) still says which signal.
  if (code == kExitFailure && train_stop_signal() != 0) code = 128 + train_stop_signal();
  // This process has stopped cleanly; the others may wait for it in a collective: end the job.
  // (A signal stop is agreed by every process and needs no abort.)
  if ((code == kExitFailure || code == kExitBadInput) && processes && processes->size() > 1) {
    std::fflush(stdout);
    std::fflush(stderr);
    processes->abort_job(code);
  }
  if (code != kExitOk) {  // Note [Leaving after a failure]
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(code);
  }
  return code;
}
