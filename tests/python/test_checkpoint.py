"""Checkpoints from Python: tensors by name as numpy arrays, and where training stood."""

import os

import numpy as np
import pytest

import lockstep
from conftest import mlp_config


def test_a_checkpoint_holds_the_trained_parameters(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(checkpoint={"dir": str(tmp_path / "ckpt")}))
    trainer = lockstep.Trainer(config)
    written = []
    trainer.on_checkpoint(lambda step, file: written.append((step, file)))
    summary = trainer.run()
    assert written == [(40, summary.checkpoint)]
    saved = lockstep.load_checkpoint(tmp_path / "ckpt")
    assert saved.step == 40 and saved.workers == 2 and saved.weights_file == summary.checkpoint
    assert saved.metadata["lockstep.model"] == trainer.model
    trained = trainer.parameters()
    assert sorted(saved.parameters) == sorted(trained)
    for name, value in trained.items():
        assert saved.parameters[name].dtype == np.float32
        np.testing.assert_array_equal(saved.parameters[name], value)
    assert saved.parameters["layers.0.weight"].shape == (16, 8)
    assert set(saved.optimizer_state) == {"momentum"}
    assert dict(saved.config)["optimizer.lr"] == "0.05"
    again = lockstep.load_checkpoint(summary.checkpoint)  # the weights file itself
    np.testing.assert_array_equal(again.parameters["layers.2.bias"], trained["layers.2.bias"])


def test_init_from_starts_from_the_weights(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(checkpoint={"dir": str(tmp_path / "ckpt")}))
    first = lockstep.Trainer(config)
    first.run()
    second = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=1)))
    second.init_from(tmp_path / "ckpt")
    second.run()
    moved = second.parameters()["layers.0.weight"] - first.parameters()["layers.0.weight"]
    assert 0 < np.abs(moved).max() < 0.1  # one small step from the trained weights


def test_a_damaged_checkpoint_names_its_file(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(steps=2, checkpoint={"dir": str(tmp_path)}))
    weights = lockstep.Trainer(config).run().checkpoint
    with open(weights, "r+b") as f:  # one flipped byte in the data
        f.seek(-3, 2)
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(lockstep.InputError, match=os.path.basename(weights)):
        lockstep.load_checkpoint(weights)
    (tmp_path / "empty").mkdir()
    with pytest.raises(lockstep.InputError, match="no checkpoint"):
        lockstep.load_checkpoint(tmp_path / "empty")
