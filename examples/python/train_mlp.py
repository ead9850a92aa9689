"""Train an MLP from numpy arrays with lockstep, on every device of this machine (two CPU
workers here when there is no GPU), and watch it learn from Python.

    python3 examples/python/train_mlp.py
"""
import numpy as np

import lockstep

# A classification problem made in numpy: three noisy spirals of 2-d points.
rng = np.random.default_rng(0)
n, classes = 3000, 3
label = rng.integers(0, classes, size=n)
radius = rng.uniform(0.1, 1.0, size=n)
angle = 4.0 * radius + label * (2 * np.pi / classes) + rng.normal(0, 0.15, size=n)
x = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).astype(np.float32)
y = label.astype(np.int32)
split = n * 4 // 5
train = lockstep.InMemoryDataset(x[:split], y[:split])  # borrowed in place, not copied
held_out = lockstep.InMemoryDataset(x[split:], y[split:])

config = lockstep.Config.from_dict({
    "model": {"type": "mlp", "hidden": [64, 64]},
    "data": {"dataset": "given", "batch_size": 64},  # given: the datasets below
    "optimizer": {"type": "adamw", "lr": 0.01},
    "schedule": {"type": "warmup_cosine", "warmup_steps": 20},
    "trainer": {"devices": 2, "steps": 400, "log_every": 100, "eval_every": 200},
})

trainer = lockstep.Trainer(config, train=train, eval=held_out)
trainer.on_step(lambda m: print(f"step {m.step:4d}  loss {m.loss:.4f}  "
                                f"{m.samples_per_s:,.0f} samples/s"))
trainer.on_eval(lambda m: print(f"eval at step {m.step}: accuracy {m.accuracy:.3f}"))
summary = trainer.run()

print(f"trained {summary.parameters} parameters on {summary.workers} workers "
      f"({summary.backend}): eval accuracy {summary.eval_accuracy:.3f}, "
      f"replicas identical: {summary.replicas_identical}")
