"""Datasets from numpy: borrowed in place when the layout allows, kept alive, checked."""

import gc
import weakref

import numpy as np
import pytest

import lockstep


def test_an_in_memory_dataset_reads_the_arrays_buffer():
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    y = np.array([0, 1, 2, 1], dtype=np.int32)
    data = lockstep.InMemoryDataset(x, y)
    assert not data.copied
    assert (len(data), data.features, data.classes, data.targets) == (4, 3, 3, 1)
    features, label = data.sample(2)
    assert features.tolist() == [6.0, 7.0, 8.0] and label.tolist() == [2]
    x[2, 1] = 42.0  # the dataset reads the array itself: it sees the write
    y[2] = 0
    features, label = data.sample(2)
    assert features.tolist() == [6.0, 42.0, 8.0] and label.tolist() == [0]


def test_a_dataset_keeps_the_array_alive():
    x = np.ones((5, 2), dtype=np.float32)
    y = np.zeros(5, dtype=np.int32)
    alive = weakref.ref(x)
    data = lockstep.InMemoryDataset(x, y, classes=2)
    del x
    gc.collect()
    assert alive() is not None
    assert data.sample(4)[0].tolist() == [1.0, 1.0]
    del data
    gc.collect()
    assert alive() is None


def test_other_layouts_are_converted_once():
    x = np.arange(12, dtype=np.float64).reshape(4, 3)
    data = lockstep.InMemoryDataset(x, np.array([0, 1, 0, 1]))  # float64, int64
    assert data.copied
    x[0, 0] = 99.0
    assert data.sample(0)[0].tolist() == [0.0, 1.0, 2.0]
    strided = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert lockstep.InMemoryDataset(strided, np.zeros(4, dtype=np.int32)).copied


def test_bad_samples_raise_input_errors():
    with pytest.raises(lockstep.InputError, match=r"sample 1: expected a label in \[0, 2\), got 5"):
        lockstep.InMemoryDataset(np.zeros((2, 3), np.float32), np.array([0, 5], np.int32), 2)
    with pytest.raises(lockstep.InputError,
                       match="x has 2 samples .rows., y has 3 labels: expected one label per row"):
        lockstep.InMemoryDataset(np.zeros((2, 3), np.float32), np.zeros(3, np.int32))
    with pytest.raises(lockstep.InputError, match="2-d"):
        lockstep.InMemoryDataset(np.zeros(6, np.float32), np.zeros(6, np.int32))
    with pytest.raises(lockstep.InputError, match="integer class ids"):
        lockstep.InMemoryDataset(np.zeros((2, 3), np.float32), np.array([0.5, 1.0]))
    with pytest.raises(lockstep.InputError, match=r"\[0, 2\^31\)"):
        lockstep.InMemoryDataset(np.zeros((2, 3), np.float32), np.array([0, -1]))


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32])
def test_a_token_dataset_windows_the_array_in_place(dtype):
    tokens = np.arange(20, dtype=dtype)
    data = lockstep.TokenDataset(tokens, context=4, vocab_size=64)
    assert not data.copied
    assert (len(data), data.features, data.targets, data.classes) == (4, 4, 4, 64)
    x, y = data.sample(1)  # tokens 4..8: inputs 4..7, targets 5..8
    assert x.tolist() == [4, 5, 6, 7] and y.tolist() == [5, 6, 7, 8]
    tokens[5] = 63
    assert data.sample(1)[0].tolist() == [4, 63, 6, 7]


def test_token_ids_are_checked():
    with pytest.raises(lockstep.InputError, match="token 3 is 9: expected a token id < vocab_size = 8"):
        lockstep.TokenDataset(np.array([1, 2, 3, 9, 4], np.uint16), context=2, vocab_size=8)
    with pytest.raises(lockstep.InputError, match="expected at least context"):
        lockstep.TokenDataset(np.arange(4, dtype=np.uint16), context=4)
    copied = lockstep.TokenDataset(np.arange(10), context=3)  # int64: converted to uint32
    assert copied.copied and copied.classes == 10


def test_load_dataset_splits_as_the_cli_does():
    config = lockstep.Config.from_dict({"data": {"dataset": "synthetic", "samples": 100,
                                                 "features": 5, "classes": 3,
                                                 "eval_fraction": 0.2},
                                        "trainer": {"steps": 1}})
    train, held_out = lockstep.load_dataset(config)
    assert (len(train), len(held_out), train.features, train.classes) == (80, 20, 5, 3)
