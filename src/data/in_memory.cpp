// InMemoryDataset, the train/eval split and load_dataset() (token streams: tokens.cpp).
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <utility>

#include "data/shuffle.hpp"
#include "data/too_few_tokens.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/error.hpp"
#include "lockstep/tokenizer.hpp"
#include "text/data_tokenizer.hpp"

namespace lockstep {

namespace {

// Keeps the split's shuffle independent of the other streams drawn from the same seed
// (the synthetic labels are shuffled with the same Fisher-Yates over the same size).
constexpr std::uint64_t kSplitStream = 0x73706c6974000000ull;  // "split"

std::filesystem::path resolve(const std::filesystem::path& base_dir, const std::string& path) {
  std::filesystem::path p(path);
  return base_dir.empty() || p.is_absolute() ? p : base_dir / p;
}

void require_path(const std::string& value, const char* key, const char* what) {
  if (value.empty()) throw InputError(fmt::format("{}: expected {}, got ''", key, what));
}

// Moves `values` into a shared owner, and points `view` at them.
template <typename T>
std::shared_ptr<const void> own(std::vector<T> values, std::span<const T>& view) {
  auto owned = std::make_shared<const std::vector<T>>(std::move(values));
  view = *owned;
  return owned;
}

}  // namespace

InMemoryDataset::InMemoryDataset(std::vector<float> x, std::vector<std::int32_t> y, int features,
                                 int classes)
    : features_(features), classes_(classes) {
  x_owner_ = own(std::move(x), x_);
  y_owner_ = own(std::move(y), y_);
  check();
}

InMemoryDataset::InMemoryDataset(std::span<const float> x, std::span<const std::int32_t> y,
                                 int features, int classes, std::shared_ptr<const void> owner)
    : x_owner_(owner), y_owner_(std::move(owner)), x_(x), y_(y), features_(features),
      classes_(classes) {
  check();
}

void InMemoryDataset::check() const {
  if (features_ < 1) {
    throw InputError(fmt::format("dataset: expected at least 1 feature, got {}", features_));
  }
  if (classes_ < 1) {
    throw InputError(fmt::format("dataset: expected at least 1 class, got {}", classes_));
  }
  const std::size_t n = y_.size();
  const auto f = static_cast<std::size_t>(features_);
  if (x_.size() / f != n || x_.size() % f != 0) {
    throw InputError(fmt::format("dataset: expected {} samples x {} features = {} values, got {}",
                                 n, f, n * f, x_.size()));
  }
  for (std::size_t i = 0; i < n; ++i) {
    if (y_[i] < 0 || y_[i] >= classes_) {
      throw InputError(fmt::format("dataset: sample {}: expected a label in [0, {}), got {}", i,
                                   classes_, y_[i]));
    }
  }
}

void InMemoryDataset::get(std::size_t i, float* x, std::int32_t* y) const {
  if (i >= y_.size()) {
    throw std::out_of_range(fmt::format("dataset: sample {} of {}", i, y_.size()));
  }
  const auto f = static_cast<std::size_t>(features_);
  std::memcpy(x, x_.data() + i * f, f * sizeof(float));
  *y = y_[i];
}

InMemoryDataset InMemoryDataset::subset(std::span<const std::size_t> indices) const {
  const auto f = static_cast<std::size_t>(features_);
  std::vector<float> x(indices.size() * f);
  std::vector<std::int32_t> y(indices.size());
  for (std::size_t k = 0; k < indices.size(); ++k) get(indices[k], x.data() + k * f, &y[k]);
  return InMemoryDataset(std::move(x), std::move(y), features_, classes_);
}

void InMemoryDataset::feature_stats(std::vector<float>& mean, std::vector<float>& stddev) const {
  // Two passes in double: a constant column then has exactly zero variance (and becomes 1).
  const auto f = static_cast<std::size_t>(features_);
  const std::size_t n = y_.size();
  std::vector<double> sum(f, 0.0);
  std::vector<double> sq(f, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < f; ++j) sum[j] += x_[i * f + j];
  }
  for (std::size_t j = 0; j < f; ++j) sum[j] = n > 0 ? sum[j] / static_cast<double>(n) : 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < f; ++j) {
      const double d = x_[i * f + j] - sum[j];
      sq[j] += d * d;
    }
  }
  mean.assign(f, 0.0f);
  stddev.assign(f, 1.0f);
  for (std::size_t j = 0; j < f; ++j) {
    mean[j] = static_cast<float>(sum[j]);
    const double sd = n > 0 ? std::sqrt(sq[j] / static_cast<double>(n)) : 0.0;
    if (sd > 0.0) stddev[j] = static_cast<float>(sd);
  }
}

void InMemoryDataset::standardize(std::span<const float> mean, std::span<const float> stddev) {
  const auto f = static_cast<std::size_t>(features_);
  if (mean.size() != f || stddev.size() != f) {
    throw std::invalid_argument(
        fmt::format("standardize: expected {} means and stddevs, got {} and {}", f, mean.size(),
                    stddev.size()));
  }
  // A fresh owned copy (Note [Borrowed samples]): the samples may be shared or borrowed.
  std::vector<float> x(x_.size());
  for (std::size_t i = 0; i < y_.size(); ++i) {
    const float* in = x_.data() + i * f;
    float* row = x.data() + i * f;
    for (std::size_t j = 0; j < f; ++j) row[j] = (in[j] - mean[j]) / stddev[j];
  }
  x_owner_ = own(std::move(x), x_);
  // A second standardisation composes: ((raw - m1) / s1 - m2) / s2 = (raw - (m1 + s1 m2)) / (s1 s2).
  if (mean_.empty()) {
    mean_.assign(mean.begin(), mean.end());
    std_.assign(stddev.begin(), stddev.end());
  } else {
    for (std::size_t j = 0; j < f; ++j) {
      mean_[j] += std_[j] * mean[j];
      std_[j] *= stddev[j];
    }
  }
}

DataSplit split_dataset(const InMemoryDataset& all, double eval_fraction, bool normalize,
                        std::uint64_t seed) {
  if (!(eval_fraction >= 0.0 && eval_fraction < 1.0)) {
    throw InputError(
        fmt::format("eval_fraction: expected a value in [0, 1), got {}", eval_fraction));
  }
  const std::size_t n = all.size();
  const auto n_eval =
      static_cast<std::size_t>(std::llround(eval_fraction * static_cast<double>(n)));
  if (n_eval >= n) {
    throw InputError(
        fmt::format("dataset too small: {} samples with eval_fraction {} leave no training samples",
                    n, eval_fraction));
  }

  std::uint64_t state = detail::mix64(seed ^ kSplitStream);
  const std::vector<std::size_t> order = detail::permutation(n, state);
  const std::span<const std::size_t> all_order(order);
  InMemoryDataset eval = all.subset(all_order.first(n_eval));
  InMemoryDataset train = all.subset(all_order.subspan(n_eval));
  if (normalize) {
    std::vector<float> mean;
    std::vector<float> stddev;
    train.feature_stats(mean, stddev);
    train.standardize(mean, stddev);
    eval.standardize(mean, stddev);
  }
  return {std::make_shared<const InMemoryDataset>(std::move(train)),
          std::make_shared<const InMemoryDataset>(std::move(eval))};
}

namespace {

// A token file or a text file, as data.dataset says; text through `tokenizer` when there is
// one, else byte by byte.
TokenDataset load_stream(const Config& cfg, const std::filesystem::path& file,
                         const std::optional<Tokenizer>& tokenizer) {
  const int vocab = cfg.model.vocab_size != 0 || !tokenizer
                        ? cfg.model.vocab_size
                        : static_cast<int>(tokenizer->vocab_size());
  if (cfg.data.dataset == DatasetKind::text) {
    if (tokenizer) return load_text(file, cfg.model.context, vocab, *tokenizer);
    return load_text(file, cfg.model.context, vocab == 0 ? kByteVocabSize : vocab);
  }
  if (vocab == 0)
    throw InputError("model.vocab_size: expected the vocabulary size of a tokens dataset, got 0");
  return load_tokens(file, cfg.data.format, cfg.model.context, vocab);
}

// The tail split of data.path, or data.path for training and data.eval_path for eval.
DataSplit load_token_split(const Config& cfg, const std::filesystem::path& base_dir) {
  const DataConfig& d = cfg.data;
  require_path(d.path, "data.path", "the file of a tokens or text dataset");
  std::optional<Tokenizer> tokenizer;
  if (!d.tokenizer.empty()) tokenizer = detail::load_data_tokenizer(cfg, resolve(base_dir, d.tokenizer));
  const TokenDataset all = load_stream(cfg, resolve(base_dir, d.path), tokenizer);
  if (d.eval_path.empty()) return split_tokens(all, d.eval_fraction);
  try {
    return {std::make_shared<const TokenDataset>(all),
            std::make_shared<const TokenDataset>(
                load_stream(cfg, resolve(base_dir, d.eval_path), tokenizer))};
  } catch (const detail::TooFewTokens& e) {
    throw InputError(fmt::format(
        "data.eval_path: {}: the eval file is shorter than one window of model.context = {}. "
        "Tokenize again with a larger --eval-fraction (about {} tokens or more), or leave "
        "data.eval_path out and hold out the tail of data.path with data.eval_fraction",
        e.what(), cfg.model.context, cfg.model.context + 1));
  }
}

// data.path's conversations (the tail held out for eval), or data.path for training and
// data.eval_path for eval.
DataSplit load_chat_split(const Config& cfg, const std::filesystem::path& base_dir) {
  const DataConfig& d = cfg.data;
  require_path(d.path, "data.path", "the JSON Lines file of a chat dataset");
  require_path(d.tokenizer, "data.tokenizer", "the tokenizer of a chat dataset");
  const Tokenizer tokenizer = detail::load_data_tokenizer(cfg, resolve(base_dir, d.tokenizer));
  const int vocab = cfg.model.vocab_size != 0 ? cfg.model.vocab_size
                                              : static_cast<int>(tokenizer.vocab_size());
  const ChatOptions options{.context = cfg.model.context,
                            .chat_template = d.chat_template,
                            .train_on = d.train_on,
                            .pack = d.pack,
                            .skip_bad_records = d.skip_bad_records};
  if (d.eval_path.empty()) {
    ChatSplit split = load_chat(resolve(base_dir, d.path), tokenizer, vocab, options,
                                d.eval_fraction);
    return {std::move(split.train), std::move(split.eval)};
  }
  return {load_chat(resolve(base_dir, d.path), tokenizer, vocab, options).train,
          load_chat(resolve(base_dir, d.eval_path), tokenizer, vocab, options).train};
}

}  // namespace

DataSplit load_dataset(const Config& config, const std::filesystem::path& base_dir) {
  const DataConfig& cfg = config.data;
  const std::uint64_t seed = config.trainer.seed;
  switch (cfg.dataset) {
    case DatasetKind::csv:
      require_path(cfg.path, "data.path", "the CSV file of a csv dataset");
      return split_dataset(load_csv(resolve(base_dir, cfg.path), cfg.label_column, cfg.header),
                           cfg.eval_fraction, cfg.normalize, seed);
    case DatasetKind::idx:
      require_path(cfg.images, "data.images", "the images file of an idx dataset");
      require_path(cfg.labels, "data.labels", "the labels file of an idx dataset");
      return split_dataset(load_idx(resolve(base_dir, cfg.images), resolve(base_dir, cfg.labels)),
                           cfg.eval_fraction, cfg.normalize, seed);
    case DatasetKind::synthetic:
      if (cfg.samples < 1) {
        throw InputError(
            fmt::format("data.samples: expected a positive sample count, got {}", cfg.samples));
      }
      return split_dataset(
          make_synthetic(static_cast<std::size_t>(cfg.samples), cfg.features, cfg.classes, seed),
          cfg.eval_fraction, cfg.normalize, seed);
    case DatasetKind::tokens:
    case DatasetKind::text:
      return load_token_split(config, base_dir);  // never normalised: the ids are not features
    case DatasetKind::chat:
      return load_chat_split(config, base_dir);
    case DatasetKind::given:
      throw InputError("data.dataset is given: the program passes the datasets to the Trainer "
                       "(there is no data to load); name the data here to train from the config");
  }
  throw InputError(fmt::format("data.dataset: unknown kind {}", static_cast<int>(cfg.dataset)));
}

}  // namespace lockstep
