#include "lockstep/dataset.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/error.hpp"
#include "temp_files.hpp"

using lockstep::InMemoryDataset;
using lockstep::InputError;

namespace {

// `n` samples with one feature equal to the sample's index, labels cycling through 3 classes.
InMemoryDataset numbered(std::size_t n) {
  std::vector<float> x(n);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(i);
    y[i] = static_cast<std::int32_t>(i % 3);
  }
  return InMemoryDataset(std::move(x), std::move(y), 1, 3);
}

std::vector<float> xs(const lockstep::Dataset& d) {
  const auto f = static_cast<std::size_t>(d.features());
  std::vector<float> out(d.size() * f);
  std::int32_t label = 0;
  for (std::size_t i = 0; i < d.size(); ++i) d.get(i, out.data() + i * f, &label);
  return out;
}

}  // namespace

TEST_CASE("InMemoryDataset: shapes, get and subset") {
  const InMemoryDataset d({1, 2, 3, 4, 5, 6}, {0, 2, 1}, 2, 3);
  CHECK(d.size() == 3);
  float row[2];
  std::int32_t label = -1;
  d.get(1, row, &label);
  CHECK(label == 2);
  CHECK(row[0] == 3);
  CHECK(row[1] == 4);
  CHECK_THROWS_AS(d.get(3, row, &label), std::out_of_range);

  const std::vector<std::size_t> pick{2, 0, 2};
  const auto s = d.subset(pick);
  CHECK(std::vector<float>(s.x().begin(), s.x().end()) == std::vector<float>{5, 6, 1, 2, 5, 6});
  CHECK(std::vector<std::int32_t>(s.y().begin(), s.y().end()) ==
        std::vector<std::int32_t>{1, 0, 1});
  CHECK(s.classes() == 3);

  CHECK(InMemoryDataset({}, {}, 4, 2).size() == 0);
  CHECK_THROWS_WITH_AS(InMemoryDataset({1, 2, 3}, {0, 1}, 2, 2),
                       "dataset: expected 2 samples x 2 features = 4 values, got 3", InputError);
  CHECK_THROWS_WITH_AS(InMemoryDataset({1, 2}, {0, 2}, 1, 2),
                       "dataset: sample 1: expected a label in [0, 2), got 2", InputError);
  CHECK_THROWS_AS(InMemoryDataset({1, 2}, {0, -1}, 1, 2), InputError);
  CHECK_THROWS_AS(InMemoryDataset({}, {}, 0, 2), InputError);
  CHECK_THROWS_AS(InMemoryDataset({}, {}, 1, 0), InputError);
}

TEST_CASE("InMemoryDataset: feature_stats and standardize") {
  InMemoryDataset d({1, 5, 3, 5, 5, 5, 7, 5}, {0, 1, 0, 1}, 2, 2);
  std::vector<float> mean;
  std::vector<float> stddev;
  d.feature_stats(mean, stddev);
  CHECK(mean == std::vector<float>{4, 5});
  CHECK(stddev[0] == doctest::Approx(std::sqrt(5.0)));  // population: (9 + 1 + 1 + 9) / 4
  CHECK(stddev[1] == 1.0f);                             // constant: 0 becomes 1
  d.standardize(mean, stddev);
  CHECK(d.x()[0] == doctest::Approx(-3 / std::sqrt(5.0)));
  CHECK(d.x()[1] == 0.0f);
  CHECK_THROWS_AS(d.standardize(mean, std::vector<float>{1}), std::invalid_argument);
}

TEST_CASE("InMemoryDataset, TokenDataset: borrowed samples are read in place and kept alive") {
  // Note [Borrowed samples]: the owner is shared, never copied; standardize() copies x.
  auto x = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  auto y = std::make_shared<std::vector<std::int32_t>>(std::vector<std::int32_t>{0, 1, 1});
  const std::weak_ptr<std::vector<float>> x_alive = x;
  InMemoryDataset d(*x, *y, 2, 2, x);
  CHECK(d.x().data() == x->data());
  CHECK(d.y().data() == y->data());
  (*x)[3] = 40;  // read in place: the dataset sees the write
  float row[2];
  std::int32_t label = -1;
  d.get(1, row, &label);
  CHECK(row[1] == 40);
  CHECK(label == 1);
  const InMemoryDataset copy = d;
  x.reset();
  CHECK_FALSE(x_alive.expired());  // held by both datasets
  d.standardize(std::vector<float>{1, 0}, std::vector<float>{2, 1});
  CHECK(d.x()[0] == 0.0f);
  CHECK(copy.x()[0] == 1.0f);  // the borrowed values are left as they were
  CHECK(copy.x().data() == x_alive.lock()->data());
  CHECK_THROWS_WITH_AS(InMemoryDataset(copy.x(), copy.y(), 3, 2, nullptr),
                       "dataset: expected 3 samples x 3 features = 9 values, got 6", InputError);

  auto tokens = std::make_shared<std::vector<std::uint16_t>>(
      std::vector<std::uint16_t>{5, 6, 7, 8, 9, 10, 11});
  const std::weak_ptr<std::vector<std::uint16_t>> tokens_alive = tokens;
  lockstep::TokenDataset t(std::span<const std::uint16_t>(*tokens), tokens, 3, 16);
  (*tokens)[1] = 15;
  const lockstep::TokenDataset tail = t.slice(3, 7);
  tokens.reset();
  CHECK_FALSE(tokens_alive.expired());
  float window[3];
  std::int32_t next[3];
  t.get(0, window, next);
  CHECK(std::vector<float>(window, window + 3) == std::vector<float>{5, 15, 7});
  CHECK(std::vector<std::int32_t>(next, next + 3) == std::vector<std::int32_t>{15, 7, 8});
  tail.get(0, window, next);
  CHECK(window[0] == 8);
  const std::vector<std::uint32_t> wide{1, 2, 99, 3};
  CHECK_THROWS_WITH_AS(lockstep::TokenDataset(std::span<const std::uint32_t>(wide), nullptr, 2, 8),
                       "token dataset: token 2 is 99: expected a token id < vocab_size = 8",
                       InputError);
}

TEST_CASE("make_synthetic: deterministic, balanced, seed-dependent") {
  const auto a = lockstep::make_synthetic(1000, 5, 4, 11);
  const auto b = lockstep::make_synthetic(1000, 5, 4, 11);
  const auto c = lockstep::make_synthetic(1000, 5, 4, 12);
  CHECK(a.size() == 1000);
  CHECK(a.features() == 5);
  CHECK(a.classes() == 4);
  CHECK(std::equal(a.x().begin(), a.x().end(), b.x().begin(), b.x().end()));
  CHECK(std::equal(a.y().begin(), a.y().end(), b.y().begin(), b.y().end()));
  CHECK(!std::equal(a.x().begin(), a.x().end(), c.x().begin(), c.x().end()));
  CHECK(!std::equal(a.y().begin(), a.y().end(), c.y().begin(), c.y().end()));
  for (std::int32_t k = 0; k < 4; ++k) CHECK(std::count(a.y().begin(), a.y().end(), k) == 250);
  CHECK(std::all_of(a.x().begin(), a.x().end(), [](float v) { return std::isfinite(v); }));

  // Large enough to be filled by several threads; still the same data.
  const auto big1 = lockstep::make_synthetic(200000, 16, 10, 3);
  const auto big2 = lockstep::make_synthetic(200000, 16, 10, 3);
  CHECK(std::equal(big1.x().begin(), big1.x().end(), big2.x().begin(), big2.x().end()));

  CHECK_THROWS_AS(lockstep::make_synthetic(10, 0, 2, 0), InputError);
  CHECK_THROWS_AS(lockstep::make_synthetic(10, 3, 1, 0), InputError);
}

TEST_CASE("split_dataset: sizes, order and determinism") {
  const auto all = numbered(100);
  const auto split = lockstep::split_dataset(all, 0.2, false, 5);
  CHECK(split.train->size() == 80);
  CHECK(split.eval->size() == 20);
  // Eval then train is one permutation of the samples.
  auto order = xs(*split.eval);
  const auto train = xs(*split.train);
  order.insert(order.end(), train.begin(), train.end());
  auto sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<float> expected(100);
  std::iota(expected.begin(), expected.end(), 0.0f);
  CHECK(sorted == expected);
  CHECK(order != expected);
  // Labels travel with their samples.
  for (std::size_t i = 0; i < split.train->size(); ++i) {
    float v = 0;
    std::int32_t label = -1;
    split.train->get(i, &v, &label);
    CHECK(label == static_cast<std::int32_t>(v) % 3);
  }

  const auto again = lockstep::split_dataset(all, 0.2, false, 5);
  CHECK(xs(*again.train) == train);
  CHECK(xs(*lockstep::split_dataset(all, 0.2, false, 6).train) != train);

  CHECK(lockstep::split_dataset(all, 0.0, false, 5).eval->size() == 0);
  CHECK(lockstep::split_dataset(all, 0.004, false, 5).eval->size() == 0);
  CHECK(lockstep::split_dataset(all, 0.005, false, 5).eval->size() == 1);  // rounded
  CHECK_THROWS_WITH_AS(
      lockstep::split_dataset(numbered(1), 0.5, false, 0),
      "dataset too small: 1 samples with eval_fraction 0.5 leave no training samples", InputError);
  CHECK_THROWS_AS(lockstep::split_dataset(all, 1.0, false, 0), InputError);
  CHECK_THROWS_AS(lockstep::split_dataset(all, -0.1, false, 0), InputError);
}

TEST_CASE("split_dataset: normalisation uses the train split's statistics") {
  const auto all = lockstep::make_synthetic(2000, 3, 3, 9);
  const auto raw = lockstep::split_dataset(all, 0.25, false, 1);
  const auto norm = lockstep::split_dataset(all, 0.25, true, 1);

  const auto& train = static_cast<const InMemoryDataset&>(*norm.train);
  std::vector<float> mean;
  std::vector<float> stddev;
  train.feature_stats(mean, stddev);
  for (int j = 0; j < 3; ++j) {
    CHECK(mean[j] == doctest::Approx(0.0).epsilon(1e-5).scale(1.0));
    CHECK(stddev[j] == doctest::Approx(1.0).epsilon(1e-4));
  }

  // Eval is shifted and scaled by the train statistics, not its own.
  static_cast<const InMemoryDataset&>(*raw.train).feature_stats(mean, stddev);
  const auto raw_eval = xs(*raw.eval);
  const auto norm_eval = xs(*norm.eval);
  REQUIRE(raw_eval.size() == norm_eval.size());
  for (std::size_t i = 0; i < raw_eval.size(); ++i) {
    CHECK(norm_eval[i] == doctest::Approx((raw_eval[i] - mean[i % 3]) / stddev[i % 3]));
  }
}

TEST_CASE("load_dataset: every kind, relative paths against base_dir") {
  lockstep::Config cfg;
  cfg.trainer.seed = 3;
  cfg.data.dataset = lockstep::DatasetKind::synthetic;
  cfg.data.samples = 500;
  cfg.data.features = 6;
  cfg.data.classes = 4;
  cfg.data.eval_fraction = 0.1;
  const auto synthetic = lockstep::load_dataset(cfg);
  CHECK(synthetic.train->size() == 450);
  CHECK(synthetic.eval->size() == 50);
  CHECK(synthetic.train->features() == 6);
  CHECK(xs(*lockstep::load_dataset(cfg).train) == xs(*synthetic.train));
  cfg.data.samples = 0;
  CHECK_THROWS_AS(lockstep::load_dataset(cfg), InputError);

  lockstep::test::TempDir dir;
  dir.write("small.csv", "1,2,0\n3,4,1\n5,6,1\n7,8,0\n");
  lockstep::Config csv;
  csv.data.path = "small.csv";
  csv.data.eval_fraction = 0.25;
  const auto loaded = lockstep::load_dataset(csv, dir.path());
  CHECK(loaded.train->size() == 3);
  CHECK(loaded.eval->size() == 1);
  CHECK(loaded.train->features() == 2);
  csv.data.path = (dir.path() / "small.csv").string();  // absolute paths ignore base_dir
  CHECK(lockstep::load_dataset(csv, "/nonexistent").train->size() == 3);
  csv.data.path = "";
  CHECK_THROWS_WITH_AS(lockstep::load_dataset(csv),
                       "data.path: expected the CSV file of a csv dataset, got ''", InputError);

  lockstep::Config idx;
  idx.data.dataset = lockstep::DatasetKind::idx;
  idx.data.images = "missing-images";
  idx.data.labels = "missing-labels";
  CHECK_THROWS_WITH_AS(
      lockstep::load_dataset(idx, dir.path()),
      ((dir.path() / "missing-images").string() + ": cannot open: No such file or directory")
          .c_str(),
      InputError);

  lockstep::Config digits;
  digits.data.path = "third_party/digits/digits.csv";
  const auto d = lockstep::load_dataset(digits, LOCKSTEP_SOURCE_DIR);
  CHECK(d.train->size() + d.eval->size() == 1797);
  CHECK(d.eval->size() == 359);  // round(0.2 * 1797)
  CHECK(d.train->features() == 64);
  CHECK(d.train->classes() == 10);
}
