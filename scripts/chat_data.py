#!/usr/bin/env python3
"""Writes third_party/chat/: a small conversation file for supervised fine-tuning and a
tokenizer.json with chat special tokens, both made here, deterministically.

- tokenizer/tokenizer.json: the Shakespeare byte-level BPE (third_party/shakespeare/tokenizer:
  vocab.json + merges.txt, made by scripts/shakespeare_tokenizer.py) with the special tokens of
  the chatml and llama3 templates added after its <|endoftext|>; tokenizer_config.json names the
  end-of-sequence and beginning-of-sequence tokens.
- conversations.jsonl: 400 short conversations we wrote as templates (arithmetic, words spelled
  backwards, the play's characters, colours of things), each {"messages": [...]} with an
  optional system turn, or the {"prompt", "response"} shorthand.

    python3 scripts/chat_data.py third_party/chat
"""
import json
import pathlib
import random
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>"]


def tokenizer(out):
    source = ROOT / "third_party" / "shakespeare" / "tokenizer"
    vocab = json.loads((source / "vocab.json").read_text())
    merges = [line for line in (source / "merges.txt").read_text().splitlines()
              if line and not line.startswith("#version")]
    added = [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "special": True}]
    for name in SPECIALS:
        vocab[name] = len(vocab)
        added.append({"id": vocab[name], "content": name, "special": True})
    for a in added:
        a.update({"single_word": False, "lstrip": False, "rstrip": False, "normalized": False})
    doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                             "use_regex": True},
           "post_processor": None,
           "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                       "use_regex": True},
           "model": {"type": "BPE", "dropout": None, "unk_token": None,
                     "continuing_subword_prefix": None, "end_of_word_suffix": None,
                     "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": merges}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False, indent=None) + "\n")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
              "bos_token": "<|begin_of_text|>", "add_bos_token": False}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


WORDS = ["forest", "apple", "music", "river", "cloud", "garden", "winter", "candle", "stone",
         "letter", "shadow", "orange", "silver", "window", "morning", "heart"]
NAMES = {"Rosalind": "the daughter of the banished Duke, who goes to the forest as Ganymede",
         "Orlando": "the youngest son of Sir Rowland de Boys, who loves Rosalind",
         "Celia": "Rosalind's cousin, who goes with her to the forest as Aliena",
         "Jaques": "a melancholy lord who says that all the world's a stage",
         "Touchstone": "the court fool, who follows Rosalind and Celia to the forest",
         "Oliver": "Orlando's elder brother, who at first wishes him harm",
         "Adam": "an old servant, who gives Orlando his savings",
         "Audrey": "a country girl whom Touchstone marries"}
COLOURS = {"grass": "green", "the sky": "blue", "snow": "white", "coal": "black",
           "a lemon": "yellow", "a ripe tomato": "red", "an orange": "orange",
           "a violet": "purple"}
SYSTEMS = ["You are a helpful assistant.", "You answer in one short sentence.",
           "You are a patient teacher."]


def conversation(rng):
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        op = rng.choice(["plus", "times", "minus"])
        value = {"plus": a + b, "times": a * b, "minus": a - b}[op]
        q, r = f"What is {a} {op} {b}?", f"{a} {op} {b} is {value}."
    elif kind == 1:
        w = rng.choice(WORDS)
        q, r = f"Spell {w} backwards.", f"{w} backwards is {w[::-1]}."
    elif kind == 2:
        n = rng.choice(sorted(NAMES))
        q, r = f"Who is {n} in As You Like It?", f"{n} is {NAMES[n]}."
    else:
        thing = rng.choice(sorted(COLOURS))
        q, r = f"What colour is {thing}?", f"{thing[0].upper() + thing[1:]} is {COLOURS[thing]}."
    shape = rng.randrange(4)
    if shape == 0:
        return {"prompt": q, "response": r}
    messages = [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
    if shape == 1:
        messages.insert(0, {"role": "system", "content": rng.choice(SYSTEMS)})
    if shape == 2:
        messages += [{"role": "user", "content": "Thank you."},
                     {"role": "assistant", "content": "You are welcome."}]
    return {"messages": messages}


def main(out):
    out = pathlib.Path(out)
    tokenizer(out / "tokenizer")
    rng = random.Random(44)
    lines = [json.dumps(conversation(rng)) for _ in range(400)]
    (out / "conversations.jsonl").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
