"""Config: the CLI's validation and messages, from YAML, dicts and overrides."""

import os

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
