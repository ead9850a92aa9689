#!/usr/bin/env python3
"""Reads an MLP export of `lockstep export` in PyTorch, as docs/cli.md says to, and counts the
correct predictions on raw samples after the stored standardisation.

    python3 tests/interop/mlp_export.py EXPORT X.f32 Y.i32

X.f32: (n, features) float32 raw features; Y.i32: n int32 labels. Prints "correct K of N".
The safetensors file is parsed by hand (the format is a JSON header and raw data), so that
Debian's torch suffices; `safetensors.torch.load_file` returns the same tensors.
"""

import json
import struct
import sys

import numpy as np
import torch


def load_file(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
        data = f.read()
    meta = header.pop("__metadata__", {})
    state = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", t
        begin, end = t["data_offsets"]
        state[name] = torch.from_numpy(np.frombuffer(data[begin:end], dtype=np.float32).copy()).reshape(t["shape"])
    return state, meta


def main():
    export, xs, ys = sys.argv[1:4]
    state, meta = load_file(export)
    # "mlp inputs=64 hidden=64 classes=10 activation=relu"
    spec = dict(word.split("=") for word in meta["lockstep.model"].split()[1:])
    widths = [int(spec["inputs"])] + [int(h) for h in spec["hidden"].split(",") if h] + [int(spec["classes"])]
    act = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh,
           "gelu": lambda: torch.nn.GELU(approximate="tanh")}[spec["activation"]]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(torch.nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(act())
    # docs/cli.md's recipe: take the standardisation out, strip "layers." for Sequential.
    mean, std = state.pop("normalize.mean"), state.pop("normalize.std")
    model = torch.nn.Sequential(*layers)
    model.load_state_dict({k.removeprefix("layers."): v for k, v in state.items()})

    x = torch.from_numpy(np.fromfile(xs, dtype=np.float32).reshape(-1, widths[0]))
    y = torch.from_numpy(np.fromfile(ys, dtype=np.int32).astype(np.int64))
    with torch.no_grad():
        pred = model((x - mean) / std).argmax(1)
    print(f"correct {int((pred == y).sum())} of {len(y)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
