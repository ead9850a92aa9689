"""The reference side of the tokenizer tests: tiktoken's gpt2 encoding, built from GPT-2's
rank file, and the test corpora.

  tokenizer_reference.py hf RANKS DIR          vocab.json + merges.txt of the same ranks
  tokenizer_reference.py encode RANKS IN OUT   tiktoken's ids of IN's bytes, as uint32 (LE)
  tokenizer_reference.py bench RANKS IN        tiktoken's single-thread encode, MB/s
  tokenizer_reference.py unicode OUT           generated Unicode text (see unicode_text)
  tokenizer_reference.py bytes OUT SIZE        seeded random bytes

Invalid UTF-8 follows Note [Pre-tokens] (src/text/pretokenize.hpp): well-formed runs through
tiktoken's encode_ordinary, each run of bad bytes through its _encode_single_piece.
"""
import base64
import random
import sys
import time
import unicodedata

import tiktoken

# tiktoken's gpt2 pattern (tiktoken_ext/openai_public.py), the same as GPT-2's.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def gpt2(path):
    ranks = load_ranks(path)
    return tiktoken.Encoding(name="gpt2_from_ranks", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": len(ranks)},
                             explicit_n_vocab=len(ranks) + 1)


def runs(data):
    """(is_valid, bytes) runs: maximal well-formed UTF-8, and maximal bytes that start none."""
    text = data.decode("utf-8", "surrogateescape")
    out, start = [], 0
    for i in range(1, len(text) + 1):
        if i == len(text) or (0xDC80 <= ord(text[i]) <= 0xDCFF) != (0xDC80 <= ord(text[start]) <= 0xDCFF):
            valid = not 0xDC80 <= ord(text[start]) <= 0xDCFF
            out.append((valid, text[start:i].encode("utf-8", "surrogateescape")))
            start = i
    return out


def encode(enc, data):
    ids = []
    for valid, piece in runs(data):
        if valid:
            ids += enc.encode_ordinary(piece.decode("utf-8"))
        else:
            ids += enc._encode_single_piece(piece)
    return ids


def byte_to_char():
    """GPT-2's printable stand-in for each byte (encoder.py's bytes_to_unicode, restated)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_hf(ranks_path, out_dir):
    """Each token's merge is the last step of BPE on its bytes with the lower ranks alone."""
    import json
    import os
    ranks = load_ranks(ranks_path)
    chars = byte_to_char()
    show = lambda b: "".join(chars[x] for x in b)
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) < 2:
            continue
        parts = [bytes([b]) for b in token]
        while len(parts) > 2:
            best = min((ranks.get(parts[i] + parts[i + 1], 1 << 62), i) for i in range(len(parts) - 1))
            if best[0] >= rank:
                break
            i = best[1]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, (token, parts)
        merges.append(show(parts[0]) + " " + show(parts[1]))
    vocab = {show(t): r for t, r in ranks.items()}
    vocab["<|endoftext|>"] = len(ranks)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")


def unicode_text(seed=0):
    """Every letter, number and combining mark Python's Unicode database knows (so every
    script's), in words of 1-8 with marks after some letters, between every kind of space and
    runs of them; contractions in every case; emoji (with ZWJ sequences and skin tones), CJK,
    punctuation and symbols."""
    rng = random.Random(seed)
    by_category = {}
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        by_category.setdefault(unicodedata.category(chr(cp)), []).append(chr(cp))
    letters = [c for k in ("Lu", "Ll", "Lt", "Lm", "Lo") for c in by_category[k]]
    numbers = [c for k in ("Nd", "Nl", "No") for c in by_category[k]]
    marks = [c for k in ("Mn", "Mc", "Me") for c in by_category[k]]
    other = [c for k in ("Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Cf")
             for c in by_category[k]]
    spaces = [chr(c) for c in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000,
                               0x2001, 0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008,
                               0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0x180E,
                               0x200B, 0xFEFF)]
    emoji = ["\U0001F600", "\U0001F469\u200D\U0001F4BB", "\U0001F44D\U0001F3FD", "\u2764\uFE0F",
             "\U0001F1EB\U0001F1F7", "\U0001F468\u200D\U0001F469\u200D\U0001F467"]
    contractions = [a + b for a in ("'", "\u2019") for b in
                    ("s", "S", "t", "T", "re", "RE", "Re", "rE", "ve", "VE", "Ve", "m", "M",
                     "ll", "LL", "Ll", "d", "D")]
    cjk = [chr(c) for c in range(0x4E00, 0x9FFF)]
    out = []
    # Every letter, number and mark at least once, in order, then mixed at random.
    for pool in (letters, numbers):
        for i in range(0, len(pool), 6):
            out.append("".join(pool[i:i + 6]))
            out.append(rng.choice(spaces) if rng.random() < 0.3 else " ")
    for i in range(0, len(marks), 3):
        out.append(rng.choice(letters) + "".join(marks[i:i + 3]) + " ")
    for _ in range(60000):
        kind = rng.random()
        if kind < 0.35:
            word = "".join(rng.choice(letters) + (rng.choice(marks) if rng.random() < 0.2 else "")
                           for _ in range(rng.randint(1, 8)))
        elif kind < 0.45:
            word = "".join(rng.choice(numbers) for _ in range(rng.randint(1, 5)))
        elif kind < 0.55:
            word = rng.choice(contractions)
        elif kind < 0.65:
            word = "".join(rng.choice(cjk) for _ in range(rng.randint(1, 10)))
        elif kind < 0.72:
            word = rng.choice(emoji)
        elif kind < 0.82:
            word = "".join(rng.choice(other) for _ in range(rng.randint(1, 3)))
        else:
            word = "".join(rng.choice(spaces) for _ in range(rng.randint(1, 6)))
        out.append(word)
        if rng.random() < 0.6:
            out.append(" ")
    return "".join(out)


def main():
    command = sys.argv[1]
    if command == "hf":
        write_hf(sys.argv[2], sys.argv[3])
    elif command == "encode":
        enc = gpt2(sys.argv[2])
        with open(sys.argv[3], "rb") as f:
            ids = encode(enc, f.read())
        with open(sys.argv[4], "wb") as f:
            f.write(b"".join(i.to_bytes(4, "little") for i in ids))
    elif command == "bench":
        enc = gpt2(sys.argv[2])
        with open(sys.argv[3], "rb") as f:
            data = f.read()
        text = data.decode("utf-8")
        best = float("inf")
        for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 5):
            start = time.perf_counter()
            ids = enc.encode_ordinary(text)
            best = min(best, time.perf_counter() - start)
        print(f"tiktoken {tiktoken.__version__ if hasattr(tiktoken, '__version__') else ''}: "
              f"{len(data) / best / 1e6:.2f} MB/s ({len(ids)} tokens, best of the runs)")
    elif command == "unicode":
        with open(sys.argv[2], "w", encoding="utf-8", newline="") as f:
            f.write(unicode_text())
    elif command == "bytes":
        rng = random.Random(1)
        with open(sys.argv[2], "wb") as f:
            f.write(bytes(rng.getrandbits(8) for _ in range(int(sys.argv[3]))))
    else:
        sys.exit(f"unknown command {command}")


if __name__ == "__main__":
    main()
