#!/usr/bin/env python3
"""Checks a lockstep .safetensors file with the reference implementation.

    python3 -m pip install safetensors numpy
    LOCKSTEP_KEEP_CHECKPOINT_DIR=/tmp/ckpt build/lockstep_tests -tc='safetensors: round trip*'
    python3 tests/io/check_safetensors.py /tmp/ckpt/small.safetensors /tmp/ckpt/small.npy

Loads the file with safetensors.numpy.load_file, prints each tensor's name, shape and dtype,
and checks that every value is finite and that "lockstep.checksum" (FNV-1a 64 of the data
section) matches the tensors as the library returned them. With a .npy of the flat parameter
buffer, also checks every value bit for bit against it.

Not run by CTest: CI has no pip packages.
"""

import argparse
import json
import struct
import sys

import numpy as np
from safetensors.numpy import load_file

FNV_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = FNV_BASIS
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def read_header(path):
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", help="a .safetensors file")
    parser.add_argument("npy", nargs="?", help="the expected flat float32 parameter buffer")
    args = parser.parse_args()

    tensors = load_file(args.file)
    header = read_header(args.file)
    metadata = header.pop("__metadata__", {})
    # The data section in file order, rebuilt from what the library returned.
    order = sorted(header, key=lambda name: header[name]["data_offsets"][0])
    for name in order:
        t = tensors[name]
        print(f"{name}: shape {list(t.shape)} {t.dtype}")
    flat = np.concatenate([tensors[n].reshape(-1) for n in order]) if order else np.zeros(0, "<f4")

    failures = []
    if not np.all(np.isfinite(flat)):
        failures.append(f"{np.count_nonzero(~np.isfinite(flat))} values are not finite")
    expected_sum = metadata.get("lockstep.checksum")
    actual_sum = f"{fnv1a64(flat.astype('<f4').tobytes()):016x}"
    if expected_sum is None:
        failures.append("no lockstep.checksum in the metadata")
    elif expected_sum != actual_sum:
        failures.append(f"checksum {actual_sum}, the metadata says {expected_sum}")
    if args.npy:
        reference = np.load(args.npy).reshape(-1)
        if reference.shape != flat.shape or reference.tobytes() != flat.astype("<f4").tobytes():
            failures.append(f"values differ from {args.npy}")

    print(f"{len(order)} tensors, {flat.size} values, metadata {metadata}")
    for f in failures:
        print(f"{args.file}: {f}", file=sys.stderr)
    print("FAIL" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
