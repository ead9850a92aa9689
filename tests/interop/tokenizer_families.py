"""The reference side of the tokenizer-family tests: Hugging Face `tokenizers` (and tiktoken)
tokenizers of Llama 3's, Qwen2's and SmolLM2's kinds, trained on the shipped books, and their ids
for a set of test texts.

  tokenizer_families.py hf DIR        (the python-hf environment: tokenizers)
      DIR/<family>/tokenizer.json and tokenizer_config.json, each a BPE trained here with the
      family's published normaliser, pre-tokenizers, special tokens and post-processor;
      DIR/<family>/ranks.tiktoken, the same vocabulary as a tiktoken rank file;
      DIR/cases/<case>.txt, the texts; DIR/cases/<family>.<case>.<mode>.u32, the ids
      `tokenizers` gives: mode "ordinary" (special tokens' text as text: encode_special_tokens),
      "special" (split out) and "post" (with the post-processor's tokens).
  tokenizer_families.py tiktoken DIR [LLAMA3_MODEL QWEN_TIKTOKEN]  (the python-tiktoken env)
      DIR/cases/<family>.<case>.tiktoken.u32 and .tiktoken-special.u32: tiktoken's Encoding of
      ranks.tiktoken with the family's pattern and special tokens (Qwen2: NFC first, as Qwen's
      own tokenizer does); with the real rank files (family_rank_files.sh), the same of them
      as DIR/cases/real-<family>.*.

  tokenizer_families.py bench-hf TOKENIZER TEXT [RUNS]        `tokenizers`' encode, MB/s
  tokenizer_families.py bench-tiktoken FAMILY RANKS TEXT [RUNS] tiktoken's, the family's pattern

Invalid UTF-8. Both libraries take str only. A case's bytes are cut as Python's surrogateescape
decoder sees them: maximal runs of well-formed UTF-8, each encoded as a text of its own, and
maximal runs of bytes that start none, each given to the library's own BPE as one piece
(`tokenizers`: model.tokenize of the bytes' byte-level characters; tiktoken:
_encode_single_piece). That is lockstep's rule (Note [Tokenizer pipeline]), stated by Python's
decoder; tiktoken's own _encode_bytes differs on purpose (it merges the last piece before a bad
byte with everything after it).
"""
import json
import os
import random
import struct
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BOOKS = [os.path.join(ROOT, "third_party", "shakespeare", "as_you_like_it.txt"),
         os.path.join(ROOT, "third_party", "alice", "alice_in_wonderland.txt")]

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                    "<|python_tag|>", "<|image|>"] +
                   [f"<|reserved_special_token_{i}|>" for i in range(2, 246)])
QWEN2_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# qwen.tiktoken's, as Qwen's tokenization_qwen.py numbers them after the ranks.
QWEN2_RANK_SPECIALS = QWEN2_SPECIALS + [f"<|extra_{i}|>" for i in range(205)]
SMOL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
FAMILIES = ("llama3", "qwen2", "smollm2")
# Tokens put into each vocabulary after training, with no merge that makes them: with
# ignore_merges (Llama 3) a piece equal to one is that token; without, it is merged as usual.
UNREACHABLE = ["xyzzy", "\u0120xyzzy", "qqq"]


def code_text():
    out = []
    for sub in ("src/text", "tests/interop"):
        for name in sorted(os.listdir(os.path.join(ROOT, sub))):
            if name.endswith((".cpp", ".hpp", ".py")):
                with open(os.path.join(ROOT, sub, name), encoding="utf-8") as f:
                    out.append(f.read())
    return "\n".join(out)


def mixed_text(seed=0):
    """CJK, Arabic, Devanagari, Cyrillic, Greek, emoji and combining marks (composed and not:
    NFC changes the decomposed ones), between spaces, tabs and CR/LF."""
    rng = random.Random(seed)
    words = ["東京は日本の首都です", "北京欢迎你", "한국어 텍스트", "مرحبا بالعالم", "السَّلَامُ عَلَيْكُمْ",
             "नमस्ते दुनिया", "Привет, мир", "Καλημέρα κόσμε", "e\u0301te\u0301", "\u00e9t\u00e9",
             "A\u030a", "\u1e9b\u0323", "n\u0303o", "\U0001F600", "\U0001F469\u200D\U0001F4BB",
             "\U0001F44D\U0001F3FD", "\u2764\uFE0F", "\U0001F1EB\U0001F1F7", "café", "naïve",
             "Ǆemal", "ﬁne", "Ⅻ", "①②", "٣٤٥", "१२३", "don't", "WE'LL", "I'M", "it’s"]
    spaces = [" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n", "\t\t ", "\u3000", "\u00a0"]
    return "".join(rng.choice(words) + rng.choice(spaces) for _ in range(400))


def cases(specials):
    rng = random.Random(1)
    with open(BOOKS[0], encoding="utf-8") as f:
        prose = f.read()[20000:36000] + "\nxyzzy, qqq; a xyzzy qqqq Xyzzy.\n"
    digits = " ".join(str(rng.randrange(10 ** rng.randrange(1, 14))) for _ in range(400)) + \
        "\n3.14159 2,718,281 0x1F 1e-9 v1.2.3 2024-05-20 ١٢٣ ૪૫\n"
    spaces = "".join(rng.choice([" ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n\n", " \t \n",
                                 "\r\r\n", "word", "x", ".", "\t\tif", "    return"])
                     for _ in range(2000))
    special = "".join(rng.choice(specials[:3] + [" ", "text", "\n", "<|", "|>", "<|endoftext",
                                                 " <|im_start|>", "<|im_end|>\n", "a<|eot_id|>b"])
                      for _ in range(600))
    with open(os.path.join(ROOT, "tests", "interop", "test_tokenizer_reference.cpp"),
              encoding="utf-8") as f:
        code = f.read()
    bad = b"".join(rng.choice([b"ok ", b"\xff", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90",
                               b" caf\xc3\xa9 ", b"\xc0\xaf", b"\x80\x80 z", "東".encode(), b"\n"])
                   for _ in range(1500))
    return {"prose": prose.encode(), "code": code.encode(), "digits": digits.encode(),
            "mixed": mixed_text().encode(), "spaces": spaces.encode(), "special": special.encode(),
            "invalid": bad}


def runs(data):
    """(is_valid, bytes) runs as Python's surrogateescape decoder sees them."""
    text = data.decode("utf-8", "surrogateescape")
    bad = lambda c: 0xDC80 <= ord(c) <= 0xDCFF
    out, start = [], 0
    for i in range(1, len(text) + 1):
        if i == len(text) or bad(text[i]) != bad(text[start]):
            out.append((not bad(text[start]), text[start:i].encode("utf-8", "surrogateescape")))
            start = i
    return out


def write_u32(path, ids):
    with open(path, "wb") as f:
        f.write(struct.pack(f"<{len(ids)}I", *ids))


def build_hf(family, out_dir, corpus):
    from tokenizers import (Tokenizer, Regex, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
    specials = {"llama3": LLAMA3_SPECIALS, "qwen2": QWEN2_SPECIALS, "smollm2": SMOL_SPECIALS}[family]
    tok = Tokenizer(models.BPE(ignore_merges=family == "llama3"))
    if family == "llama3":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    elif family == "qwen2":
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer=trainer)
    # The special tokens after the trained vocabulary, as the families number them.
    tok.add_special_tokens(specials)
    if family == "llama3":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                          special_tokens=[("<|begin_of_text|>",
                                                           tok.token_to_id("<|begin_of_text|>"))])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "tokenizer.json")
    doc = json.loads(tok.to_str())
    # Tokens no merge makes (UNREACHABLE), after the rest of the model's vocabulary.
    vocab = doc["model"]["vocab"]
    model_size = len(vocab)
    added = doc["added_tokens"]
    for t in added:
        t["id"] += len(UNREACHABLE)
    for i, t in enumerate(UNREACHABLE):
        vocab[t] = model_size + i
    if family == "llama3":
        post = doc["post_processor"]["processors"][1]["special_tokens"]["<|begin_of_text|>"]
        post["ids"] = [post["ids"][0] + len(UNREACHABLE)]
    doc["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m
                              for m in doc["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    # The same with merges as [a, b] pairs, as tokenizers 0.20 and later write them (0.19 reads
    # "a b" only; lockstep reads both).
    pairs = dict(doc, model=dict(doc["model"], merges=[m.split(" ") for m in doc["model"]["merges"]]))
    os.makedirs(os.path.join(out_dir, "pairs"), exist_ok=True)
    with open(os.path.join(out_dir, "pairs", "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(pairs, f, ensure_ascii=False)
    config = {"llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
              "qwen2": {"bos_token": None, "eos_token": "<|endoftext|>", "add_bos_token": False},
              "smollm2": {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}}[family]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(dict(config, tokenizer_class="PreTrainedTokenizerFast"), f)
    tok = Tokenizer.from_file(path)
    # The same vocabulary as a rank file: every model token by id (ids are merge order).
    import base64
    with open(os.path.join(out_dir, "ranks.tiktoken"), "w") as f:
        for token, i in sorted(vocab.items(), key=lambda kv: kv[1]):
            raw = byte_level_bytes(token)
            f.write(base64.b64encode(raw).decode() + " " + str(i) + "\n")
    return tok


def byte_of_char():
    """GPT-2's printable stand-in for each byte (bytes_to_unicode), inverted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        table[chr(b) if b in keep else chr(256 + extra)] = b
        extra += b not in keep
    return table


BYTE_OF_CHAR = byte_of_char()


def byte_level_bytes(token):
    return bytes(BYTE_OF_CHAR[c] for c in token)


def hf_encode(tok, data, mode):
    """mode "post" is for well-formed text only (the post-processor's tokens around it)."""
    if mode == "post":
        tok.encode_special_tokens = True
        return tok.encode(data.decode("utf-8"), add_special_tokens=True).ids
    ids = []
    tok.encode_special_tokens = mode == "ordinary"
    to_char = {b: c for c, b in BYTE_OF_CHAR.items()}
    for valid, piece in runs(data):
        if valid:
            ids += tok.encode(piece.decode("utf-8"), add_special_tokens=False).ids
        else:
            ids += [t.id for t in tok.model.tokenize("".join(to_char[b] for b in piece))]
    return ids


def main_hf(out):
    with open(BOOKS[0], encoding="utf-8") as f:
        corpus = [f.read()]
    with open(BOOKS[1], encoding="utf-8") as f:
        corpus.append(f.read())
    corpus += [code_text(), mixed_text(7)]
    os.makedirs(os.path.join(out, "cases"), exist_ok=True)
    for family in FAMILIES:
        tok = build_hf(family, os.path.join(out, family), corpus)
        specials = {"llama3": LLAMA3_SPECIALS, "qwen2": QWEN2_SPECIALS, "smollm2": SMOL_SPECIALS}[family]
        for name, data in cases(specials).items():
            with open(os.path.join(out, "cases", f"{family}.{name}.txt"), "wb") as f:
                f.write(data)
            for mode in ("ordinary", "special") + (("post",) if name != "invalid" else ()):
                write_u32(os.path.join(out, "cases", f"{family}.{name}.{mode}.u32"),
                          hf_encode(tok, data, mode))


def load_ranks(path):
    import base64
    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


def main_tiktoken(out, llama3_model=None, qwen_tiktoken=None):
    """The trained rank files; with the real ones' paths, those too (real-<family> cases)."""
    import tiktoken
    files = [("", "llama3", os.path.join(out, "llama3", "ranks.tiktoken")),
             ("", "qwen2", os.path.join(out, "qwen2", "ranks.tiktoken"))]
    if llama3_model:
        files += [("real-", "llama3", llama3_model), ("real-", "qwen2", qwen_tiktoken)]
    for prefix, family, path in files:
        ranks = load_ranks(path)
        specials = LLAMA3_SPECIALS if family == "llama3" else QWEN2_RANK_SPECIALS
        enc = tiktoken.Encoding(name=family, pat_str=LLAMA3_PATTERN if family == "llama3" else QWEN2_PATTERN,
                                mergeable_ranks=ranks,
                                special_tokens={s: len(ranks) + i for i, s in enumerate(specials)})
        norm = (lambda s: unicodedata.normalize("NFC", s)) if family == "qwen2" else (lambda s: s)
        for name, data in cases(specials[:3]).items():
            for suffix, allowed in (("tiktoken", set()), ("tiktoken-special", "all")):
                ids = []
                for valid, piece in runs(data):
                    if valid:
                        ids += enc.encode(norm(piece.decode("utf-8")), allowed_special=allowed,
                                          disallowed_special=())
                    else:
                        ids += enc._encode_single_piece(piece)
                write_u32(os.path.join(out, "cases", f"{prefix}{family}.{name}.{suffix}.u32"), ids)


def best_mb_s(encode, text, runs):
    import time
    best = 1e30
    for _ in range(int(runs)):
        start = time.perf_counter()
        n = len(encode(text))
        best = min(best, time.perf_counter() - start)
    return len(text.encode()) / 1e6 / best, n


def bench_hf(tokenizer, text_file, runs="5"):
    """`tokenizers`' single-thread encode of TEXT: tokenizer.json, or a GPT-2 directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    if os.path.isdir(tokenizer):
        tok = Tokenizer(models.BPE.from_file(os.path.join(tokenizer, "vocab.json"),
                                             os.path.join(tokenizer, "merges.txt")))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    else:
        tok = Tokenizer.from_file(tokenizer)
    with open(text_file, encoding="utf-8", newline="") as f:
        text = f.read()
    # Line by line: `tokenizers` slows down on one string of megabytes (0.3 MB/s here), which is
    # not how it is used; lockstep and tiktoken take the text whole.
    lines = text.splitlines(keepends=True)
    mb_s, n = best_mb_s(lambda t: sum(len(tok.encode(line, add_special_tokens=False).ids)
                                      for line in lines) * [0], text, runs)
    print(f"tokenizers {__import__('tokenizers').__version__}, line by line: {mb_s:.2f} MB/s "
          f"({n} tokens, best of {runs})")


def bench_tiktoken(family, ranks_file, text_file, runs="5"):
    """tiktoken's single-thread encode_ordinary of TEXT with the family's pattern."""
    import tiktoken
    ranks = load_ranks(ranks_file)
    pattern = {"llama3": LLAMA3_PATTERN, "qwen2": QWEN2_PATTERN}[family]
    enc = tiktoken.Encoding(name=family, pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    with open(text_file, encoding="utf-8", newline="") as f:
        text = f.read()
    norm = (lambda s: unicodedata.normalize("NFC", s)) if family == "qwen2" else (lambda s: s)
    mb_s, n = best_mb_s(lambda t: enc.encode_ordinary(norm(t)), text, runs)
    version = __import__("importlib.metadata").metadata.version("tiktoken")
    print(f"tiktoken {version}: {mb_s:.2f} MB/s ({n} tokens, best of {runs})")


if __name__ == "__main__":
    {"hf": main_hf, "tiktoken": main_tiktoken, "bench-hf": bench_hf,
     "bench-tiktoken": bench_tiktoken}[sys.argv[1]](*sys.argv[2:])
