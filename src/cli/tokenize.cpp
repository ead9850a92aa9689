// `lockstep tokenize`: text files into llm.c token files (lockstep::tokenize_files).
//
// SIGINT/SIGTERM stop the run between batches and remove what it had written (exit 130/143);
// a second SIGINT exits at once, which can leave a "*.tmp" file beside the output but never a
// partial output.
#include <unistd.h>

#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cli/command_args.hpp"
#include "cli/commands.hpp"
#include "cli/signals.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"

namespace lockstep::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_stop_signal{0};

extern "C" void on_tokenize_signal(int sig) {
  if (sig == SIGINT && g_stop.load()) std::_Exit(128 + SIGINT);
  g_stop_signal.store(sig);
  g_stop.store(true);
}

struct TokenizeArgs {
  std::string tokenizer;
  TokenizerFamily family = TokenizerFamily::automatic;
  TokenizeOptions options;
};

double fraction_flag(const std::string& text) {
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size())
    throw InputError(fmt::format("--eval-fraction: expected a number in (0, 1), got '{}'", text));
  return value;
}

TokenizeArgs parse_tokenize_args(const std::vector<std::string_view>& args) {
  TokenizeArgs out;
  std::string format = "llmc";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string_view a = args[i];
    const auto is = [&](std::string_view flag) {
      return a == flag || (a.starts_with(flag) && a.size() > flag.size() && a[flag.size()] == '=');
    };
    const auto value = [&](std::string_view flag) -> std::string {
      if (a.size() > flag.size()) return std::string(a.substr(flag.size() + 1));
      if (i + 1 >= args.size())
        throw InputError(fmt::format("{}: expected a value after it", flag));
      return std::string(args[++i]);
    };
    if (is("--tokenizer")) out.tokenizer = value("--tokenizer");
    else if (is("--out")) out.options.out = value("--out");
    else if (is("--eval-out")) out.options.eval_out = value("--eval-out");
    else if (is("--eval-fraction"))
      out.options.eval_fraction = fraction_flag(value("--eval-fraction"));
    else if (is("--format")) format = value("--format");
    else if (a == "--allow-special") out.options.allow_special = true;
    else if (is("--tokenizer-family")) {
      const std::string name = value("--tokenizer-family");
      const std::optional<TokenizerFamily> family = parse_tokenizer_family(name);
      if (!family)
        throw InputError(fmt::format("--tokenizer-family: expected llama3, qwen2 or gpt2, got '{}'",
                                     name));
      out.family = *family;
    }
    else if (a.starts_with("-") && a != "-")
      unknown_option("tokenize", a, nullptr, false);
    else out.options.inputs.emplace_back(a);
  }
  if (out.tokenizer.empty()) throw InputError("tokenize: expected --tokenizer DIR|FILE");
  if (format == "llmc") out.options.format = TokenFormat::llmc;
  else if (format == "raw") out.options.format = TokenFormat::raw;
  else throw InputError(fmt::format("--format: expected llmc or raw, got '{}'", format));
  return out;
}

// "12.3 MB"
std::string megabytes(std::uint64_t bytes) {
  return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
}

// The progress line, redrawn on a terminal at most ~5 times a second.
class ProgressLine {
 public:
  ProgressLine() : live_(isatty(STDERR_FILENO) != 0) {}
  void update(const TokenizeProgress& p) {
    if (!live_ || p.elapsed_s - last_s_ < 0.2) return;
    last_s_ = p.elapsed_s;
    fmt::print(stderr, "\r\x1b[K{} read, {} documents, {} tokens, {:.2f} M tokens/s",
               megabytes(p.bytes), p.documents, p.tokens,
               static_cast<double>(p.tokens) / 1e6 / std::max(p.elapsed_s, 1e-9));
    open_ = true;
  }
  void finish() {
    if (open_) fmt::print(stderr, "\r\x1b[K");
    open_ = false;
  }

 private:
  bool live_;
  bool open_ = false;
  double last_s_ = -1.0;
};

// GPT-2's context: what a user is likely to train with when no config says otherwise.
constexpr std::uint64_t kLikelyContext = 1024;

// An eval file serves a model whose context + 1 tokens it holds (a window and its targets);
// one shorter than a likely context fails at training time, so it is said now.
void warn_short_eval_split(const TokenizeOptions& o, const TokenizeCounts& c) {
  if (c.eval_tokens > kLikelyContext) return;
  const double total = static_cast<double>(c.train_tokens + c.eval_tokens);
  const double needed = static_cast<double>(kLikelyContext + 1) / std::max(total, 1.0);
  const std::string larger =
      needed < 0.5 ? fmt::format("--eval-fraction {:.2g} or more here", std::ceil(needed * 100) / 100)
                   : std::string("more text than these ") + std::to_string(c.train_tokens + c.eval_tokens) + " tokens";
  fmt::print(stderr,
             "lockstep: warning: {}: {} tokens: an eval file needs model.context + 1 tokens, so "
             "this one serves a context of at most {} (GPT-2's is {}: {}); tokenize again with a "
             "larger --eval-fraction, or train on {} alone and hold out its tail with "
             "data.eval_fraction\n",
             o.eval_out.string(), c.eval_tokens, c.eval_tokens == 0 ? 0 : c.eval_tokens - 1,
             kLikelyContext, larger, o.out.string());
}

}  // namespace

int tokenize(const std::vector<std::string_view>& argv) {
  TokenizeArgs args = parse_tokenize_args(argv);
  const SignalHandlers signals(on_tokenize_signal);  // the previous ones once it returns
  const Tokenizer tokenizer = Tokenizer::load(args.tokenizer, args.family);
  ProgressLine progress;
  args.options.on_progress = [&](const TokenizeProgress& p) { progress.update(p); };
  args.options.stop = &g_stop;
  TokenizeCounts c;
  try {
    c = tokenize_files(tokenizer, args.options);
  } catch (const Interrupted&) {
    progress.finish();
    const int sig = g_stop_signal.load();
    fmt::print(stderr, "lockstep: tokenize stopped by signal {}: nothing written\n", sig);
    return 128 + sig;
  } catch (...) {
    progress.finish();
    throw;
  }
  progress.finish();
  const char* width = c.token_bytes == 2 ? "uint16" : "uint32";
  fmt::print("tokenized {} documents ({} of text) with {}\n", c.documents, megabytes(c.bytes),
             tokenizer.source().string());
  fmt::print("  {}: {} tokens ({})\n", args.options.out.string(), c.train_tokens, width);
  if (!args.options.eval_out.empty())
    fmt::print("  {}: {} tokens ({})\n", args.options.eval_out.string(), c.eval_tokens, width);
  fmt::print("  {:.2f} s, {:.2f} M tokens/s, {:.2f} MB/s\n", c.seconds,
             static_cast<double>(c.train_tokens + c.eval_tokens) / 1e6 / std::max(c.seconds, 1e-9),
             static_cast<double>(c.bytes) / 1e6 / std::max(c.seconds, 1e-9));
  if (!args.options.eval_out.empty()) warn_short_eval_split(args.options, c);
  return kExitOk;
}

}  // namespace lockstep::cli
