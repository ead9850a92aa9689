// Weight-decay groups (Note [Decay groups] in src/train/optimizer.hpp): decay reaches the
// matrices only, unless optimizer.decay_all, also when the buffer is updated in pieces.
#include <doctest/doctest.h>

#include <vector>

#include "lockstep/config.hpp"
#include "lockstep/device.hpp"
#include "lockstep/model.hpp"
#include "train/optimizer.hpp"

using namespace lockstep;

TEST_CASE("decay groups: the 2-D tensors decay, biases do not, in one or several pieces") {
  const Model model = Model::mlp({.inputs = 3, .hidden = {4}, .classes = 2});
  const std::vector<ParamTensor> tensors = model.param_tensors();
  const std::size_t n = model.param_count();

  const std::vector<detail::DecaySpan> all = detail::decay_spans(tensors, n, /*decay_all=*/true);
  REQUIRE(all.size() == 1);
  CHECK((all[0].begin == 0 && all[0].end == n && all[0].decay));
  const std::vector<detail::DecaySpan> spans = detail::decay_spans(tensors, n, false);
  std::size_t covered = 0;
  for (const detail::DecaySpan& s : spans) {
    CHECK(s.begin == covered);  // in order, no gap
    covered = s.end;
  }
  CHECK(covered == n);

  // SGD without momentum on a zero gradient: decay alone, p <- p (1 - lr wd) = 0.95 p.
  OptimizerConfig cfg{.type = OptimizerKind::sgd, .lr = 0.1, .weight_decay = 0.5};
  const std::unique_ptr<Device> dev = make_cpu_device(0, 1);
  for (bool decay_all : {false, true}) {
    for (std::size_t split : {n, n / 2 + 1}) {  // one piece, or two cutting a tensor
      CAPTURE(decay_all);
      CAPTURE(split);
      DeviceArray<float> params(*dev, n), grads(*dev, n);
      params.upload(std::vector<float>(n, 1.0f));
      grads.upload(std::vector<float>(n, 0.0f));
      detail::Optimizer opt(*dev, cfg, n, detail::decay_spans(tensors, n, decay_all));
      opt.begin_step();
      opt.apply(params.data(), grads.data(), cfg.lr, 0, split);
      opt.apply(params.data(), grads.data(), cfg.lr, split, n);
      const std::vector<float> after = params.download();
      for (const ParamTensor& t : tensors) {
        CAPTURE(t.name);
        const float expected = decay_all || t.shape.size() == 2 ? 0.95f : 1.0f;
        for (std::size_t i = t.offset; i < t.offset + t.numel(); ++i)
          CHECK(after[i] == doctest::Approx(expected).epsilon(1e-7));
      }
    }
  }
}
