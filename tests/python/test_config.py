"""Config: the CLI's validation and messages, from YAML, dicts and overrides."""

import os
import re

import numpy as np
import pytest

import lockstep
from conftest import SOURCE_DIR, run_cli

QUICKSTART = os.path.join(SOURCE_DIR, "configs", "quickstart.yaml")


def test_from_yaml_with_overrides():
    config = lockstep.Config.from_yaml(QUICKSTART, overrides={
        "trainer.devices": 3, "optimizer.lr": 0.125, "model.hidden": [32, 16],
        "data.shuffle": False})
    d = config.to_dict()
    assert d["trainer"]["devices"] == [0, 1, 2]
    assert d["optimizer"]["lr"] == 0.125
    assert d["model"]["hidden"] == [32, 16]
    assert d["data"]["shuffle"] is False
    assert config["trainer.steps"] == 300
    # The file's relative data path is resolved against the file's directory.
    assert os.path.isabs(d["data"]["path"]) and os.path.exists(d["data"]["path"])


def test_from_dict_reads_what_to_dict_writes():
    config = lockstep.Config.from_yaml(QUICKSTART)
    again = lockstep.Config.from_dict(config.to_dict())
    assert again.to_dict() == config.to_dict()
    assert again.to_yaml() == config.to_yaml()


def test_from_dict_takes_dotted_keys():
    config = lockstep.Config.from_dict({"model.type": "mlp", "model": {"hidden": [8]},
                                        "data.dataset": "synthetic", "trainer.steps": 5})
    assert config["model.hidden"] == [8]
    assert config["data.dataset"] == "synthetic"
    assert config["trainer.steps"] == 5


def test_a_bad_key_raises_the_clis_message():
    with pytest.raises(lockstep.ConfigError) as raised:
        lockstep.Config.from_yaml(QUICKSTART, overrides={"optimizer.lrr": 0.1})
    message = str(raised.value)
    assert "optimizer.lrr" in message and "did you mean" in message
    code, _, stderr = run_cli("train", QUICKSTART, "--set", "optimizer.lrr=0.1", "--dry-run")
    assert code == 2
    assert message in stderr


def test_a_bad_value_names_the_key_and_what_was_expected():
    with pytest.raises(lockstep.ConfigError) as raised:
        lockstep.Config.from_dict({"data": {"dataset": "synthetic", "batch_size": -4},
                                   "trainer": {"steps": 3}})
    assert "data.batch_size" in str(raised.value)
    assert isinstance(raised.value, lockstep.InputError)
    with pytest.raises(lockstep.ConfigError, match="trainer.steps"):
        lockstep.Config.from_dict({"data": {"dataset": "synthetic"},
                                   "trainer": {"steps": 3, "epochs": 2}})


def test_a_missing_file_is_an_input_error():
    with pytest.raises(lockstep.InputError, match="no_such.yaml"):
        lockstep.Config.from_yaml("no_such.yaml")


def test_an_override_value_python_cannot_say_is_a_type_error():
    with pytest.raises(TypeError, match="override value"):
        lockstep.Config.from_yaml(QUICKSTART, overrides={"trainer.steps": object()})


def test_from_dict_errors_name_keys_not_lines_of_a_text_the_caller_never_saw():
    with pytest.raises(lockstep.ConfigError) as raised:
        lockstep.Config.from_dict({"model": {"hidden": [8]}, "optimizer": {"lr": "abc"},
                                   "trainer": {"steps": 2}})
    message = str(raised.value)
    assert message.startswith('Config.from_dict: optimizer.lr: expected a number > 0, got the '
                              'string "abc"'), message
    assert not re.search(r"from_dict:\d", message), message


def test_numpy_scalars_and_arrays_are_values():
    config = lockstep.Config.from_dict(
        {"model": {"hidden": np.array([16, 8])}, "optimizer": {"lr": np.float32(0.25)},
         "trainer": {"steps": np.int64(3)}}, overrides={"data.batch_size": np.int32(4)})
    assert config["model.hidden"] == [16, 8]
    assert config["optimizer.lr"] == 0.25
    assert config["trainer.steps"] == 3 and config["data.batch_size"] == 4


def test_a_dict_that_names_no_data_is_a_config_for_datasets_the_program_passes():
    config = lockstep.Config.from_dict({"model": {"hidden": [8]}, "trainer": {"steps": 2}})
    assert config["data.dataset"] == "given"
    x = np.random.default_rng(0).random((64, 4), dtype=np.float32)
    y = (np.arange(64) % 3).astype(np.int32)
    summary = lockstep.Trainer(config, train=lockstep.InMemoryDataset(x, y)).run()
    assert summary.steps == 2
    # Naming data keeps it: the default csv still asks for its path.
    with pytest.raises(lockstep.ConfigError, match="data.path: required when data.dataset is csv"):
        lockstep.Config.from_dict({"trainer": {"steps": 2}, "data": {"dataset": "csv"}})
    assert lockstep.Config.from_dict({"trainer.steps": 2},
                                     overrides={"data.dataset": "synthetic"})["data.dataset"] == \
        "synthetic"


def test_dir_shows_the_api_not_the_modules_it_imports():
    names = [n for n in dir(lockstep) if not n.startswith("_")]
    assert names == sorted(lockstep.__all__)
    assert "__version__" in dir(lockstep)
