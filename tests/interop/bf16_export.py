"""Loads a BF16 export and its F32 twin with safetensors and checks, bit for bit, that every
BF16 tensor is torch's own rounding of the F32 one.

    bf16_export.py F32_FILE BF16_FILE   prints "equal N tensors" or exits 1 naming the first
"""
import sys

import torch
from safetensors.torch import load_file


def main(f32_file, bf16_file):
    f32, bf16 = load_file(f32_file), load_file(bf16_file)
    if sorted(f32) != sorted(bf16):
        sys.exit(f"tensor names differ: {sorted(f32)} vs {sorted(bf16)}")
    for name, want in f32.items():
        got = bf16[name]
        if want.dtype != torch.float32 or got.dtype != torch.bfloat16 or got.shape != want.shape:
            sys.exit(f"{name}: {want.dtype} {tuple(want.shape)} vs {got.dtype} {tuple(got.shape)}")
        if not torch.equal(got.view(torch.int16), want.to(torch.bfloat16).view(torch.int16)):
            sys.exit(f"{name}: differs from torch's bf16 rounding of the F32 tensor")
    print(f"equal {len(f32)} tensors")


if __name__ == "__main__":
    main(*sys.argv[1:])
