"""Training from Python: the same run as the CLI's, bit for bit, on numpy data."""

import numpy as np
import pytest

import lockstep
from conftest import cli_summary, mlp_config, write_yaml


def as_arrays(data):
    """Every sample of a dataset as (features, labels) arrays."""
    pairs = [data.sample(i) for i in range(len(data))]
    return np.stack([x for x, _ in pairs]), np.concatenate([y for _, y in pairs])


def test_an_mlp_on_numpy_arrays_matches_the_cli(tmp_path):
    path = write_yaml(tmp_path / "mlp.yaml", mlp_config())
    cli = cli_summary(tmp_path, path)
    config = lockstep.Config.from_yaml(path)
    train, held_out = lockstep.load_dataset(config)
    x, y = as_arrays(train)
    xe, ye = as_arrays(held_out)
    summary = lockstep.Trainer(config, train=lockstep.InMemoryDataset(x, y, classes=train.classes),
                               eval=lockstep.InMemoryDataset(xe, ye, classes=train.classes)).run()
    assert summary.param_hash == cli["param_hash"]
    assert summary.replicas_identical and summary.steps == 40
    assert summary.eval_loss == pytest.approx(cli["eval_loss"], rel=1e-12)
    # The config's own data, loaded by the trainer: the same run again.
    assert lockstep.Trainer(config).run().param_hash == cli["param_hash"]


def test_the_summary_is_the_summary_json(tmp_path):
    path = write_yaml(tmp_path / "mlp.yaml", mlp_config())
    cli = cli_summary(tmp_path, path)
    summary = lockstep.Trainer(lockstep.Config.from_yaml(path)).run()
    mine = summary.to_dict()
    assert set(mine) == set(cli)
    # Timings, and the memory each process measured of itself (its own peak RSS: the Python
    # interpreter's process is not the CLI's), differ between the two runs; the rest may not.
    measured = {k for k in cli if k.endswith("_s") or k in (
        "samples_per_s", "tokens_per_s", "comm_hidden_fraction", "worker_times",
        "peak_rss_bytes", "device_memory")}
    assert {k: v for k, v in mine.items() if k not in measured} == \
        {k: v for k, v in cli.items() if k not in measured}
    assert summary.samples_per_s == mine["samples_per_s"] > 0
    assert mine["peak_rss_bytes"] > 0 and cli["peak_rss_bytes"] > 0


def test_a_gpt_on_a_numpy_token_array_matches_the_cli(tmp_path):
    tokens = ((np.arange(4000) * 5) % 61).astype(np.uint16)  # a pattern a GPT learns fast
    tokens.tofile(tmp_path / "tokens.bin")  # headerless uint16: format raw
    values = {
        "model": {"type": "gpt", "vocab_size": 64, "context": 16, "n_layer": 1, "n_head": 2,
                  "d_model": 32},
        "data": {"dataset": "tokens", "path": str(tmp_path / "tokens.bin"), "eval_fraction": 0,
                 "batch_size": 4},
        "optimizer": {"type": "adamw", "lr": 0.01},
        "trainer": {"devices": 2, "steps": 12, "log_every": 4, "seed": 1},
    }
    path = write_yaml(tmp_path / "gpt.yaml", values)
    cli = cli_summary(tmp_path, path)
    data = lockstep.TokenDataset(tokens, context=16, vocab_size=64)
    assert not data.copied
    trainer = lockstep.Trainer(lockstep.Config.from_yaml(path), train=data)
    losses = []
    trainer.on_step(lambda m: losses.append(m.loss))
    summary = trainer.run()
    assert summary.param_hash == cli["param_hash"]
    assert summary.tokens_per_s == pytest.approx(summary.samples_per_s * 16)
    assert len(losses) == 3 and losses[-1] < losses[0]


def test_a_failed_worker_raises_a_worker_error_with_its_rank(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_FAULT", "1:3:forward")
    trainer = lockstep.Trainer(lockstep.Config.from_dict(mlp_config()))
    with pytest.raises(lockstep.WorkerError) as raised:
        trainer.run()
    assert raised.value.rank == 1
    assert raised.value.device and raised.value.device in str(raised.value)
    assert "worker 1" in str(raised.value)


def test_data_that_does_not_fit_the_model_is_an_input_error():
    config = lockstep.Config.from_dict({"model": {"type": "gpt", "context": 32, "vocab_size": 8},
                                        "data": {"dataset": "tokens", "path": "unused.bin"},
                                        "trainer": {"steps": 1}})
    x = np.zeros((8, 4), np.float32)  # 4 features, where the GPT reads windows of 32 tokens
    with pytest.raises(lockstep.InputError, match="context"):
        lockstep.Trainer(config, train=lockstep.InMemoryDataset(x, np.zeros(8, np.int32))).run()


def test_a_trainer_runs_once():
    trainer = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=2)))
    trainer.run()
    assert set(trainer.parameters()) == {"layers.0.weight", "layers.0.bias", "layers.2.weight",
                                         "layers.2.bias"}
    with pytest.raises(ValueError, match="runs once"):
        trainer.run()
