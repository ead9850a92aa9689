"""PyTorch's float -> bfloat16 conversion of the floats in a file, for tests/common/test_bf16.cpp.

usage: bf16_torch.py IN OUT
IN holds float32 values (native byte order). OUT gets, as uint16: PyTorch's conversion of all of
them in one tensor (its bulk, vectorised copy), then `torch.tensor(x).to(torch.bfloat16)` of each
of the first NaNs x of IN alone (a 0-d tensor: its scalar path), at most 16.
"""
import sys

import numpy as np
import torch


def bf16_bits(t):
    return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def main():
    src, dst = sys.argv[1], sys.argv[2]
    x = np.fromfile(src, dtype=np.float32)
    bulk = bf16_bits(torch.from_numpy(x))
    nans = x[np.isnan(x)][:16]
    scalar = [bf16_bits(torch.tensor(x_nan)).item() for x_nan in nans]
    np.concatenate([bulk, np.array(scalar, dtype=np.uint16)]).tofile(dst)


if __name__ == "__main__":
    main()
