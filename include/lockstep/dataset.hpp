// Datasets, the DistributedSampler and per-worker batch loading.
//
//   auto data = lockstep::InMemoryDataset(features, labels, /*features=*/4, /*classes=*/3);
//   lockstep::DistributedSampler sampler(data.size(), /*replicas=*/4, /*rank=*/1,
//                                        /*shuffle=*/true, /*seed=*/0, /*drop_last=*/false);
//   sampler.set_epoch(3);
//   for (std::size_t i : sampler.indices()) { ... }
//
// A language model's samples are windows of a token stream:
//
//   lockstep::TokenDataset text = lockstep::load_text("book.txt", /*context=*/64);
//   lockstep::DataSplit split = lockstep::split_tokens(text, /*eval_fraction=*/0.1);
//
// Loaders throw InputError naming the file, the line (or byte offset) and what was expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lockstep/export.hpp"
#include "lockstep/types.hpp"

namespace lockstep {

struct Config;     // lockstep/config.hpp, for load_dataset
class Tokenizer;   // lockstep/tokenizer.hpp, for load_text

class LOCKSTEP_API Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::size_t size() const noexcept = 0;
  virtual int features() const noexcept = 0;
  virtual int classes() const noexcept = 0;
  // Labels per sample: 1 for classification, the context length for a language model (one
  // next-token target per position).
  virtual int targets() const noexcept { return 1; }
  // Copies sample i's features into x[0..features()) and its labels, each in [0, classes()),
  // into y[0..targets()).
  virtual void get(std::size_t i, float* x, std::int32_t* y) const = 0;
  // The per-feature mean and standard deviation the features were standardised with
  // (x = (raw - mean) / std), for checkpoints to record; empty when they were not.
  virtual std::span<const float> feature_mean() const noexcept { return {}; }
  virtual std::span<const float> feature_std() const noexcept { return {}; }
  // Whether a label may be kIgnoreLabel: a target that does not count toward the loss (a
  // conversation's prompt, padding; Note [Global token mean] in src/train/worker_loop.cpp).
  virtual bool masks_targets() const noexcept { return false; }
  // Whether samples are packed: several sequences in one window, each position numbered within
  // its own sequence (0 where one starts; Note [Packed windows] in src/data/chat.cpp).
  // get_positions() then copies sample i's positions, one per feature, into
  // positions[0..features()).
  virtual bool packed() const noexcept { return false; }
  virtual void get_positions(std::size_t /*i*/, std::int32_t* /*positions*/) const {}
};

// Samples held in memory: x (size, features) row-major, y (size).
//
// Note [Borrowed samples]
// ~~~~~~~~~~~~~~~~~~~~~~~
// The samples (and a TokenDataset's tokens) are either owned, moved in as vectors, or borrowed:
// spans into memory someone else owns (a numpy array, a memory map), kept alive by `owner` for as
// long as any copy of the dataset lives, and read in place, never copied. Borrowed memory must
// not change while a run reads it. The last owner reference may be dropped on any thread (a
// worker's, when a run ends), so its deleter must be safe there. Copies of a dataset share its
// memory; standardize() writes a fresh owned copy of x, never into the shared or borrowed one.
class LOCKSTEP_API InMemoryDataset final : public Dataset {
 public:
  // Throws InputError if the shapes disagree or a label is outside [0, classes).
  InMemoryDataset(std::vector<float> x, std::vector<std::int32_t> y, int features, int classes);
  // Borrows x and y (Note [Borrowed samples]); the same checks.
  InMemoryDataset(std::span<const float> x, std::span<const std::int32_t> y, int features,
                  int classes, std::shared_ptr<const void> owner);

  std::size_t size() const noexcept override { return y_.size(); }
  int features() const noexcept override { return features_; }
  int classes() const noexcept override { return classes_; }
  void get(std::size_t i, float* x, std::int32_t* y) const override;

  std::span<const float> x() const noexcept { return x_; }
  std::span<const std::int32_t> y() const noexcept { return y_; }
  // The samples at `indices`, in that order.
  InMemoryDataset subset(std::span<const std::size_t> indices) const;
  // Per-feature mean and standard deviation (a zero std becomes 1).
  void feature_stats(std::vector<float>& mean, std::vector<float>& stddev) const;
  // x = (x - mean) / stddev, per feature; feature_mean() and feature_std() then say so.
  void standardize(std::span<const float> mean, std::span<const float> stddev);
  std::span<const float> feature_mean() const noexcept override { return mean_; }
  std::span<const float> feature_std() const noexcept override { return std_; }

 private:
  void check() const;

  std::shared_ptr<const void> x_owner_, y_owner_;  // hold x_ and y_
  std::span<const float> x_;
  std::span<const std::int32_t> y_;
  std::vector<float> mean_, std_;  // what standardize() applied, composed
  int features_;
  int classes_;
};

// CSV of numbers, one sample per line. The label column holds integer classes 0..K-1;
// `label_column` < 0 counts from the end. Classes = max label + 1.
LOCKSTEP_API InMemoryDataset load_csv(const std::filesystem::path& file, int label_column,
                                       bool header);
// The IDX format of MNIST: an images file (ubyte, any number of dims) and a labels file.
// Pixels are scaled to [0, 1].
LOCKSTEP_API InMemoryDataset load_idx(const std::filesystem::path& images,
                                       const std::filesystem::path& labels);
// A deterministic Gaussian-mixture classification problem: class centres and samples are
// drawn from `seed`, so any size can be generated for benchmarks.
LOCKSTEP_API InMemoryDataset make_synthetic(std::size_t samples, int features, int classes,
                                             std::uint64_t seed);

// A token stream cut into windows of context + 1 tokens at stride context: window i is
// tokens[i * context, i * context + context], its first `context` tokens are the inputs and its
// last `context` the targets (the next token at each position), so size() is
// (tokens - 1) / context and a partial last window is dropped. get() writes the inputs as
// floats (exact: ids are below kMaxVocabSize) and the targets as int32.
// features() = targets() = context, classes() = vocab_size.
//
// Copies share the tokens; slice() views a contiguous part of them.
class LOCKSTEP_API TokenDataset final : public Dataset {
 public:
  // Throws InputError if context < 1, vocab_size is outside [1, kMaxVocabSize], a token is
  // >= vocab_size, or there are fewer than context + 1 tokens (no window).
  TokenDataset(std::vector<std::uint16_t> tokens, int context, int vocab_size);
  TokenDataset(std::vector<std::uint32_t> tokens, int context, int vocab_size);
  // Borrows the tokens (Note [Borrowed samples]); the same checks.
  TokenDataset(std::span<const std::uint16_t> tokens, std::shared_ptr<const void> owner,
               int context, int vocab_size);
  TokenDataset(std::span<const std::uint32_t> tokens, std::shared_ptr<const void> owner,
               int context, int vocab_size);

  std::size_t size() const noexcept override;
  int features() const noexcept override { return context_; }
  int targets() const noexcept override { return context_; }
  int classes() const noexcept override { return vocab_size_; }
  void get(std::size_t i, float* x, std::int32_t* y) const override;

  std::size_t token_count() const noexcept { return end_ - begin_; }
  // Tokens [begin, end) of this stream, windowed the same way: no window when they are fewer
  // than context + 1. Throws std::out_of_range when they are not inside the stream.
  TokenDataset slice(std::size_t begin, std::size_t end) const;

 private:
  using Tokens = std::variant<std::span<const std::uint16_t>, std::span<const std::uint32_t>>;
  TokenDataset(Tokens tokens, std::shared_ptr<const void> owner, int context, int vocab_size);

  std::shared_ptr<const void> owner_;  // holds tokens_
  Tokens tokens_;
  std::size_t begin_;
  std::size_t end_;
  int context_;
  int vocab_size_;
};

// A token file, as `format` says or (automatic) as its first 4 bytes say:
// - llmc: llm.c's .bin, a header of 256 little-endian int32 (magic 20240520; version 1 for
//   uint16 tokens, 2 for uint32; the token count) and then the tokens;
// - raw: headerless little-endian uint16 tokens, as nanoGPT's prepare.py writes them.
// automatic reads llmc when the file starts with the magic number, raw otherwise.
LOCKSTEP_API TokenDataset load_tokens(const std::filesystem::path& file, TokenFormat format,
                                      int context, int vocab_size);
// A UTF-8 text file, one token per byte (vocab_size >= 256). Invalid UTF-8 is an InputError
// naming the line and byte offset of the first bad sequence.
LOCKSTEP_API TokenDataset load_text(const std::filesystem::path& file, int context,
                                    int vocab_size = kByteVocabSize);
// A text file as one document of `tokenizer`'s ids, as `lockstep tokenize` writes it:
// <|endoftext|> first (when the vocabulary has it), then the text's ids. Any bytes encode (no
// UTF-8 check). InputError when the tokenizer has more ids than vocab_size.
LOCKSTEP_API TokenDataset load_text(const std::filesystem::path& file, int context,
                                    int vocab_size, const Tokenizer& tokenizer);

// Conversations for supervised fine-tuning: JSON Lines of {"messages": [{"role", "content"},
// ...]} (or {"prompt", "response"}, a user turn and an assistant turn), rendered through a chat
// template and tokenised with the model's tokenizer (Note [Chat templates] in src/data/chat.cpp).
// A sample is a window of `context` next-token positions; only the tokens of the roles in
// `train_on` (each turn's content and its end-of-turn token) are labels, every other target is
// kIgnoreLabel. Unpacked, each conversation has a window of its own, padded; packed, windows
// hold several, each position tagged with its conversation (Note [Packed windows]).
//
//   lockstep::ChatOptions opt{.context = 512, .pack = true};
//   lockstep::ChatDataset chat = lockstep::load_chat("chat.jsonl", tokenizer, opt);
struct LOCKSTEP_API ChatOptions {
  int context = 64;
  std::string chat_template = "chatml";            // chatml or llama3 (chat_template_names())
  std::vector<std::string> train_on = {"assistant"};  // roles whose tokens count
  bool pack = false;
  // A bad record (bad JSON, a missing field, an unknown role, a conversation longer than the
  // window) is skipped and counted rather than an InputError naming its file and line.
  bool skip_bad_records = false;
};

// The built-in templates' names, and the roles a message may have.
LOCKSTEP_API std::span<const std::string_view> chat_template_names() noexcept;
LOCKSTEP_API std::span<const std::string_view> chat_roles() noexcept;

// One conversation, tokenised: its ids and, per id, whether it counts toward the loss.
struct LOCKSTEP_API ChatTokens {
  std::vector<std::uint32_t> ids;  // TokenId
  std::vector<char> counted;
};
struct ChatMessage {
  std::string role;
  std::string content;
};
// Renders `messages` through the template named `chat_template` and tokenises them. Throws
// InputError naming the template for a special token `tokenizer` lacks, and for a role the
// template does not know.
LOCKSTEP_API ChatTokens render_chat(const Tokenizer& tokenizer, std::string_view chat_template,
                                    std::span<const ChatMessage> messages,
                                    std::span<const std::string> train_on);

class LOCKSTEP_API ChatDataset final : public Dataset {
 public:
  // Windows cut from tokenised conversations (each ChatTokens at most context + 1 ids), one per
  // window or packed; `vocab_size` >= every id.
  ChatDataset(std::span<const ChatTokens> conversations, int context, int vocab_size, bool pack);

  std::size_t size() const noexcept override { return windows_; }
  int features() const noexcept override { return context_; }
  int targets() const noexcept override { return context_; }
  int classes() const noexcept override { return vocab_size_; }
  void get(std::size_t i, float* x, std::int32_t* y) const override;
  bool masks_targets() const noexcept override { return true; }
  bool packed() const noexcept override { return pack_; }
  void get_positions(std::size_t i, std::int32_t* positions) const override;

  std::size_t conversations() const noexcept { return conversations_; }
  std::size_t skipped() const noexcept { return skipped_; }  // bad records left out
  void set_skipped(std::size_t n) noexcept { skipped_ = n; }
  std::int64_t counted_targets() const noexcept { return counted_; }

 private:
  std::vector<std::uint32_t> inputs_;   // (windows, context)
  std::vector<std::int32_t> labels_;    // (windows, context), kIgnoreLabel where nothing counts
  std::vector<std::int32_t> positions_;  // (windows, context) when packed
  std::size_t windows_ = 0;
  std::size_t conversations_ = 0;
  std::size_t skipped_ = 0;
  std::int64_t counted_ = 0;
  int context_;
  int vocab_size_;
  bool pack_;
};

// Reads a JSON Lines file of conversations (see ChatDataset), tokenised as render_chat says.
// Bad records are InputErrors naming the file and line, or skipped (options.skip_bad_records).
// Conversations are split: the last round(eval_fraction * count) go to eval.
struct LOCKSTEP_API ChatSplit {
  std::shared_ptr<const ChatDataset> train;
  std::shared_ptr<const ChatDataset> eval;
};
LOCKSTEP_API ChatSplit load_chat(const std::filesystem::path& file, const Tokenizer& tokenizer,
                                 int vocab_size, const ChatOptions& options,
                                 double eval_fraction = 0.0);

struct LOCKSTEP_API DataSplit {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> eval;  // may be empty (size 0) when eval_fraction is 0
};

// Shuffles with `seed`, holds out round(eval_fraction * size) samples for eval, and
// standardises both with the train split's statistics when `normalize` is set.
LOCKSTEP_API DataSplit split_dataset(const InMemoryDataset& all, double eval_fraction,
                                     bool normalize, std::uint64_t seed);
// Holds out the last round(eval_fraction * tokens) tokens for eval, so that no window of one
// split overlaps one of the other. Each split must hold a window (eval_fraction 0: eval is
// empty).
LOCKSTEP_API DataSplit split_tokens(const TokenDataset& all, double eval_fraction);
// Loads what cfg.data describes and splits it (with cfg.trainer.seed; token data is windowed
// by cfg.model.context). Relative paths are resolved against `base_dir`.
LOCKSTEP_API DataSplit load_dataset(const Config& cfg, const std::filesystem::path& base_dir = {});

// PyTorch's DistributedSampler: a permutation of [0, size) seeded by seed + epoch, identical on
// every rank; padded by wrap-around to a multiple of num_replicas (or trimmed with drop_last);
// rank r takes positions r, r + N, r + 2N, ...
//
// start_at(e, p) makes epoch e begin at position p of its order instead: rank r takes p + r,
// p + r + N, ..., the epoch's last size - p positions shared as a whole epoch's size would be
// (padded or trimmed the same way). Every other epoch is whole. A run whose worker count changed
// mid-epoch continues so (Note [Re-sharding] in src/train/worker_loop.cpp); start 0 is PyTorch's.
class LOCKSTEP_API DistributedSampler {
 public:
  DistributedSampler(std::size_t dataset_size, int num_replicas, int rank, bool shuffle,
                     std::uint64_t seed, bool drop_last);
  void set_epoch(std::uint64_t epoch) noexcept { epoch_ = epoch; }
  std::uint64_t epoch() const noexcept { return epoch_; }
  // Throws std::invalid_argument when position > dataset_size.
  void start_at(std::uint64_t epoch, std::size_t position);
  // Where the current epoch begins in its order: 0 but in start_at's epoch.
  std::size_t start() const noexcept { return epoch_ == start_epoch_ ? start_ : 0; }
  std::size_t num_samples() const noexcept { return samples_from(start()); }  // per rank, now
  std::size_t whole_epoch_samples() const noexcept { return samples_from(0); }  // per rank
  int num_replicas() const noexcept { return num_replicas_; }
  std::size_t total_size() const noexcept { return num_samples() * num_replicas_; }
  std::vector<std::size_t> indices() const;

 private:
  // Per rank, of an epoch begun at `start`.
  std::size_t samples_from(std::size_t start) const noexcept;

  std::size_t size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  bool drop_last_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::uint64_t start_epoch_ = 0;
  std::size_t start_ = 0;
};

struct LOCKSTEP_API Batch {
  std::vector<float> x;             // (size, features)
  std::vector<std::int32_t> y;      // (size, targets)
  std::vector<std::int32_t> positions;  // (size, features) when the data is packed, else empty
  std::int64_t counted = 0;         // labels that count toward the loss (not kIgnoreLabel)
  int size = 0;
  std::uint64_t epoch = 0;
  std::size_t index_in_epoch = 0;  // counted from the epoch's start position
  std::size_t epoch_start = 0;     // DistributedSampler::start() of its epoch
  bool last_in_epoch = false;
};

// Assembles one worker's batches on a background thread, `prefetch` batches ahead, epoch after
// epoch, from the sampler's epoch on. next() blocks until a batch is ready and rethrows a
// loading error. stop() (also run by the destructor) wakes and ends the producer. With
// prefetch 0 there is no thread: next() assembles the batch on the caller's thread and throws
// a loading error itself; the batches are the same either way.
//
// To resume mid-epoch, skip_batches skips that many batches of the first epoch, which is then
// loaded from batch `skip_batches` on (the whole epoch when it equals batches_per_epoch());
// more than batches_per_epoch() is std::invalid_argument.
class LOCKSTEP_API ShardLoader {
 public:
  ShardLoader(std::shared_ptr<const Dataset> data, DistributedSampler sampler, int batch_size,
              bool drop_last, int prefetch, std::size_t skip_batches = 0);
  ~ShardLoader();
  ShardLoader(const ShardLoader&) = delete;
  ShardLoader& operator=(const ShardLoader&) = delete;

  // Batches of a whole epoch for this rank (Batch::last_in_epoch marks each epoch's last,
  // the rest of one begun at a start position included).
  std::size_t batches_per_epoch() const noexcept;
  Batch next();
  void stop() noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// Number of batches of `batch_size` in `samples` samples.
LOCKSTEP_API std::size_t batches_in(std::size_t samples, int batch_size, bool drop_last) noexcept;

}  // namespace lockstep
