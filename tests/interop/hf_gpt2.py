#!/usr/bin/env python3
"""The Hugging Face side of the GPT-2 round trip (tests/interop/test_interop.cpp); run with the
virtual environment of tests/interop/hf_venv.sh (transformers, and Debian's torch).

    hf_gpt2.py logits DIR TOKENS.i32 LOGITS.f32
        loads DIR (`lockstep export --format hf`) with GPT2LMHeadModel.from_pretrained and
        compares its logits on the tokens (one sequence) with lockstep's: relative error
        <= 1e-4 (fp32), exit 0, else 1.
    hf_gpt2.py dtype DIR
        prints config.json's torch_dtype and the dtype of the weights of
        GPT2LMHeadModel.from_pretrained(DIR, torch_dtype="auto"): "config torch.bfloat16,
        loaded torch.bfloat16" for `--dtype bf16`.
    hf_gpt2.py tokenize DIR TEXT
        prints the ids AutoTokenizer.from_pretrained(DIR) gives TEXT's contents, one line.
    hf_gpt2.py random DIR TEXT CONTEXT [BF16_DIR]
        saves a randomly initialised GPT-2 (vocabulary 256, context CONTEXT, 1 layer, 2 heads,
        width 32) to DIR with save_pretrained, and prints its mean next-token loss over the
        windows of TEXT's bytes (CONTEXT + 1 tokens at stride CONTEXT), as lockstep reads text.
        With BF16_DIR, also the model in bfloat16 there, in shards of at most 20KB with
        model.safetensors.index.json, and its loss with those weights widened to fp32
        ("loss_bf16 X").
"""

import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers

transformers.utils.logging.disable_progress_bar()  # shards' loading bars would mix into the output


def logits(directory, tokens_file, logits_file):
    model = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    tokens = torch.from_numpy(np.fromfile(tokens_file, dtype=np.int32).astype(np.int64))[None]
    with torch.no_grad():
        theirs = model(tokens).logits[0]
    ours = torch.from_numpy(np.fromfile(logits_file, dtype=np.float32)).reshape(theirs.shape)
    err = float((ours - theirs).norm() / theirs.norm())
    print(f"logits relative error {err:.2e} (tolerance 1e-4)")
    return 0 if err <= 1e-4 else 1


def dtype(directory):
    config = transformers.AutoConfig.from_pretrained(directory)
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, torch_dtype="auto")
    print(f"config {config.torch_dtype}, loaded {next(model.parameters()).dtype}")
    return 0


def tokenize(directory, text_file):
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    with open(text_file, encoding="utf-8", newline="") as f:
        print(" ".join(str(i) for i in tokenizer(f.read())["input_ids"]))
    return 0


def random_model(directory, text_file, context, bf16_directory=None):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=context, n_embd=32, n_layer=1,
                                     n_head=2, activation_function="gelu_new")
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(directory, safe_serialization=True)
    data = np.frombuffer(open(text_file, "rb").read(), dtype=np.uint8).astype(np.int64)
    n = (len(data) - 1) // context
    windows = torch.stack([torch.from_numpy(data[i * context:i * context + context + 1]) for i in range(n)])

    def loss_of(m):
        with torch.no_grad():
            out = m(windows[:, :-1]).logits
            return F.cross_entropy(out.reshape(-1, 256), windows[:, 1:].reshape(-1)).item()

    print(f"loss {loss_of(model):.9g}")
    if bf16_directory:
        model = model.to(torch.bfloat16)
        model.save_pretrained(bf16_directory, safe_serialization=True, max_shard_size="20KB")
        print(f"loss_bf16 {loss_of(model.to(torch.float32)):.9g}")
    return 0


def main():
    if sys.argv[1] == "logits":
        return logits(*sys.argv[2:5])
    if sys.argv[1] == "dtype":
        return dtype(sys.argv[2])
    if sys.argv[1] == "tokenize":
        return tokenize(sys.argv[2], sys.argv[3])
    return random_model(sys.argv[2], sys.argv[3], int(sys.argv[4]), *sys.argv[5:6])


if __name__ == "__main__":
    sys.exit(main())
