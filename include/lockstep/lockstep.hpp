// lockstep: data-parallel training on every device of one machine, from C++.
//
//   #include <lockstep/lockstep.hpp>
//
//   lockstep::InMemoryDataset data(std::move(x), std::move(y), /*features=*/4, /*classes=*/3);
//   auto split = lockstep::split_dataset(data, /*eval_fraction=*/0.2, /*normalize=*/true, 0);
//   lockstep::Config cfg;
//   cfg.trainer.devices = {0, 1};
//   cfg.trainer.steps = 200;
//   lockstep::Trainer trainer(cfg, split.train, split.eval);
//   trainer.on_step([](const lockstep::StepMetrics& m) { /* log m.loss */ });
//   lockstep::Summary summary = trainer.run();
#pragma once

#include "lockstep/checkpoint.hpp"
#include "lockstep/comm.hpp"
#include "lockstep/config.hpp"
#include "lockstep/dataset.hpp"
#include "lockstep/device.hpp"
#include "lockstep/error.hpp"
#include "lockstep/generate.hpp"
#include "lockstep/model.hpp"
#include "lockstep/trainer.hpp"
#include "lockstep/version.hpp"
