"""transformers' rotary tables, transcribed: prints inv_freq, then the cos and sin tables of
`positions` positions, each as one line of fp32 bit patterns in hex.

The frequencies are _compute_default_rope_parameters and _compute_llama3_parameters of
transformers' modeling_rope_utils.py, and the angles its LlamaRotaryEmbedding.forward, in the
same PyTorch operations (the transformers release the interop tests pin predates llama3).

    rope_reference.py THETA HEAD_SIZE POSITIONS [FACTOR LOW_FREQ HIGH_FREQ OLD_CONTEXT]
"""
import math
import sys

import torch


def inverse_frequencies(base, dim, llama3):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if llama3 is None:
        return inv_freq
    factor, low_freq_factor, high_freq_factor, old_context_len = llama3
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def hex_line(t):
    return " ".join(f"{b & 0xFFFFFFFF:08x}" for b in t.contiguous().view(torch.int32).flatten().tolist())


def main():
    theta, dim, positions = float(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    llama3 = tuple(float(a) for a in sys.argv[4:8]) if len(sys.argv) > 4 else None
    inv_freq = inverse_frequencies(theta, dim, llama3)
    position_ids = torch.arange(positions)[None, :]
    inv_freq_expanded = inv_freq[None, :, None].float().expand(1, -1, 1)
    freqs = (inv_freq_expanded.float() @ position_ids[:, None, :].float()).transpose(1, 2)
    print(hex_line(inv_freq))
    print(hex_line(freqs.cos()))  # (1, positions, dim / 2): the first half of emb's columns
    print(hex_line(freqs.sin()))


if __name__ == "__main__":
    main()
