#!/usr/bin/env python3
"""Learns the small byte-level BPE vocabulary in third_party/shakespeare/tokenizer/ from the play.

GPT-2's files, GPT-2's way, at 1/50 of the size: the text is split by GPT-2's pre-token pattern
(ASCII classes suffice: the play is ASCII), then the most frequent adjacent pair is merged, 768
times (ties broken by the pair itself, so that every run writes the same files). vocab.json holds
the 256 bytes (id = byte), the merged tokens in merge order and <|endoftext|>, in GPT-2's
printable form; merges.txt the pairs. A pair whose concatenation is already a token is passed
over (a token is made one way only).

    python3 scripts/shakespeare_tokenizer.py third_party/shakespeare/as_you_like_it.txt \
        third_party/shakespeare/tokenizer
"""
import collections
import json
import pathlib
import re
import sys

MERGES = 768
PATTERN = re.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")


def byte_to_char():
    """GPT-2's printable stand-in for each byte (bytes_to_unicode in its encoder.py): the byte's
    own character when that prints (the space does not), else U+0100 onwards in byte order."""
    hidden = [b for b in range(256) if b == 32 or not chr(b).isprintable()]
    return {b: chr(256 + hidden.index(b)) if b in hidden else chr(b) for b in range(256)}


def main(text_file, out_dir):
    text = pathlib.Path(text_file).read_bytes().decode("ascii")
    words = collections.Counter(
        tuple(bytes([b]) for b in piece.encode()) for piece in PATTERN.findall(text))
    tokens = {bytes([b]) for b in range(256)}
    merges, passed_over = [], set()
    while len(merges) < MERGES:
        pairs = collections.Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                if pair not in passed_over:
                    pairs[pair] += count
        best = max(pairs, key=lambda p: (pairs[p], p))
        if best[0] + best[1] in tokens:
            passed_over.add(best)
            continue
        merges.append(best)
        tokens.add(best[0] + best[1])
        merged = collections.Counter()
        for word, count in words.items():
            out, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(word[i] + word[i + 1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += count
        words = merged

    printable = byte_to_char()
    show = lambda token: "".join(printable[b] for b in token)
    vocab = {show(bytes([b])): b for b in range(256)}
    for i, (a, b) in enumerate(merges):
        vocab[show(a + b)] = 256 + i
    vocab["<|endoftext|>"] = 256 + len(merges)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{show(a)} {show(b)}\n" for a, b in merges), encoding="utf-8")


if __name__ == "__main__":
    main(*sys.argv[1:])
