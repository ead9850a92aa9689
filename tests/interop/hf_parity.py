#!/usr/bin/env python3
"""transformers' side of the parity tests of Hugging Face checkpoints (tests/interop/
test_hf_parity.cpp); run with the virtual environment of tests/interop/hf_venv.sh.

    hf_parity.py make FAMILY DIR CONFIG_JSON [DTYPE [MAX_SHARD_SIZE [PARAMS.safetensors]]]
        saves a randomly initialised (torch.manual_seed(0)) GPT2LMHeadModel, LlamaForCausalLM,
        Qwen2ForCausalLM or MistralForCausalLM (FAMILY gpt2, llama, qwen2, mistral) of the
        config fields CONFIG_JSON gives to DIR with save_pretrained, in DTYPE (float32 or
        bfloat16), in shards of MAX_SHARD_SIZE when given ("none": one file). Weights drawn
        with std 0.2 rather than 0.02, so that a tiny model's logits are not all alike. A "rope_scaling" of type
        llama3 is written into config.json after the save when this transformers predates it
        (see llama3_inv_freq). With PARAMS, also every parameter as saved, widened to F32, under
        transformers' names (a tied head once, as the embedding).
    hf_parity.py check DIR TOKENS.i32 BATCH LOGITS.f32 GRADS.safetensors
        loads DIR in fp32, runs the BATCH sequences of TOKENS (each one token longer than the
        model's input: the last is the target), and compares with lockstep's logits (B, T, V)
        and its gradient of the mean next-token loss for every parameter (lockstep's names;
        GPT-2's Conv1D weights transposed). Prints the relative errors (norm of the difference
        over the norm of transformers') and exits 1 when one exceeds 1e-5.
    hf_parity.py train DIR LOCKSTEP_CLI STEPS BATCH
        trains the model of DIR for STEPS steps of BATCH windows both ways, from its weights on
        the same tokens: `LOCKSTEP_CLI train --init-from DIR` (one CPU worker, a raw token file
        read in order, AdamW with weight decay on the tensors of 2 or more dimensions, a constant
        learning rate, fp32; the losses from its metrics stream), and transformers' model with
        torch.optim.AdamW of the same settings in the same two groups. Prints the losses side by
        side and exits 1 when one differs by more than 1e-4 relative.
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F
import transformers

transformers.utils.logging.disable_progress_bar()  # shards' loading bars would mix into the output
from safetensors.torch import load_file, save_file

TOLERANCE = 1e-5
CLASSES = {
    "gpt2": (transformers.GPT2Config, transformers.GPT2LMHeadModel),
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
}


def transformers_knows_llama3():
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return (major, minor) >= (4, 43)


def llama3_inv_freq(base, dim, scaling):
    """RoPE's inverse frequencies under llama3 scaling, as transformers 4.43 and later compute
    them: tests/model/rope_reference.py's transcription of _compute_llama3_parameters."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model"))
    import rope_reference
    return rope_reference.inverse_frequencies(base, dim, (
        scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"],
        scaling["original_max_position_embeddings"]))


def make(family, directory, fields, dtype="float32", max_shard_size=None, params=None):
    config_class, model_class = CLASSES[family]
    fields = json.loads(fields)
    scaling = fields.pop("rope_scaling", None)
    if scaling and transformers_knows_llama3():
        fields["rope_scaling"] = scaling
        scaling = None
    torch.manual_seed(0)
    config = config_class(**fields)
    config.initializer_range = 0.2
    model = model_class(config).eval().to(getattr(torch, dtype))
    kwargs = {"safe_serialization": True}
    if max_shard_size and max_shard_size != "none":
        kwargs["max_shard_size"] = max_shard_size
    model.save_pretrained(directory, **kwargs)
    if params:
        save_file({n: p.detach().float().contiguous() for n, p in model.named_parameters()}, params)
    if scaling:  # what a newer transformers writes
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            saved = json.load(f)
        saved["rope_scaling"] = scaling
        with open(path, "w") as f:
            json.dump(saved, f, indent=2)
    return 0


def load(directory):
    with open(os.path.join(directory, "config.json")) as f:
        saved = json.load(f)
    family = saved["model_type"]
    scaling = saved.get("rope_scaling")
    old = scaling and not transformers_knows_llama3()
    # This transformers refuses the llama3 type: the config without it, then the rotary
    # frequencies each layer's RoPE computes from set as a newer one computes them.
    config = CLASSES[family][0].from_dict({k: v for k, v in saved.items() if k != "rope_scaling"}) \
        if old else transformers.AutoConfig.from_pretrained(directory)
    model = CLASSES[family][1].from_pretrained(directory, config=config, torch_dtype=torch.float32).eval()
    if old:
        head_dim = saved.get("head_dim") or saved["hidden_size"] // saved["num_attention_heads"]
        inv_freq = llama3_inv_freq(saved.get("rope_theta", 10000.0), head_dim, scaling)
        patched = 0
        for name, module in model.named_modules():
            if hasattr(module, "inv_freq"):
                module.inv_freq = inv_freq.clone()
                patched += 1
        assert patched > 0, "no rotary embedding to patch"
    return family, model


def lockstep_name(family, name):
    if family == "gpt2" and not name.startswith("transformer."):
        return "transformer." + name
    return name


def is_conv1d(family, name):
    return family == "gpt2" and name.endswith(
        (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"))


def relative(ours, theirs):
    return float((ours - theirs).norm() / max(float(theirs.norm()), 1e-30))


def check(directory, tokens_file, batch, logits_file, grads_file):
    family, model = load(directory)
    tokens = torch.from_numpy(np.fromfile(tokens_file, dtype=np.int32).astype(np.int64)).reshape(int(batch), -1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs).logits
    vocab = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))
    loss.backward()
    ours = torch.from_numpy(np.fromfile(logits_file, dtype=np.float32)).reshape(logits.shape)
    worst = relative(ours, logits.detach())
    print(f"logits relative error {worst:.2e}; loss {loss.item():.9g}")
    grads = load_file(grads_file)
    seen = set()
    grad_worst, grad_name = 0.0, ""
    for name, p in model.named_parameters():
        key = lockstep_name(family, name)
        if key not in grads:
            print(f"{name}: no gradient from lockstep ({key})")
            return 1
        g = grads[key].t() if is_conv1d(family, name) else grads[key]
        err = relative(g, p.grad)
        seen.add(key)
        if err > grad_worst:
            grad_worst, grad_name = err, name
    extra = sorted(set(grads) - seen)
    if extra:
        print(f"lockstep has gradients transformers' model lacks: {extra}")
        return 1
    print(f"gradients of {len(seen)} parameters: worst relative error {grad_worst:.2e} ({grad_name})")
    return 0 if worst <= TOLERANCE and grad_worst <= TOLERANCE else 1


# lockstep's AdamW as `train` configures it (the config keys of the same names).
ADAMW = {"lr": 3e-3, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1}
TRAIN_TOLERANCE = 1e-4


def train_config(tokens, metrics, batch, steps):
    """`lockstep train` with every model key from --init-from's config.json: one CPU worker,
    the windows of a raw token file in order, AdamW with a constant learning rate, fp32."""
    optimizer = "\n".join(f"  {k}: {v}" for k, v in ADAMW.items())
    return f"""model:
  type: gpt
data:
  dataset: tokens
  path: {tokens}
  format: raw
  eval_fraction: 0.0
  batch_size: {batch}
  shuffle: false
optimizer:
  type: adamw
{optimizer}
  decay_all: false
  clip_grad_norm: 0
schedule:
  type: constant
trainer:
  backend: cpu
  devices: 1
  steps: {steps}
  log_every: 1
  eval_every: 0
  check_replicas_every: 0
  precision: fp32
  metrics: {metrics}
  checkpoint:
    dir: null
"""


def train(directory, cli, steps, batch):
    steps, batch = int(steps), int(batch)
    family, model = load(directory)
    t, vocab = model.config.max_position_embeddings, model.config.vocab_size
    n = steps * batch * t + 1
    rng = np.random.default_rng(5)
    tokens = ((np.arange(n) * 7 + rng.integers(0, 3, n)) % vocab).astype(np.uint16)
    with tempfile.TemporaryDirectory() as folder:
        tokens.tofile(os.path.join(folder, "tokens.bin"))
        config = os.path.join(folder, "train.yaml")
        with open(config, "w") as f:
            f.write(train_config(os.path.join(folder, "tokens.bin"),
                                 os.path.join(folder, "metrics.jsonl"), batch, steps))
        run = subprocess.run([cli, "train", config, "--init-from", directory],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if run.returncode != 0:
            print(f"{cli} train exited with {run.returncode}:\n{run.stdout}")
            return 1
        with open(os.path.join(folder, "metrics.jsonl")) as f:
            ours = [m["loss"] for m in map(json.loads, f) if m["kind"] == "step"]
    # Window i is tokens [i T, i T + T]; step s takes windows s B .. s B + B - 1.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    adamw = torch.optim.AdamW([{"params": decay, "weight_decay": ADAMW["weight_decay"]},
                               {"params": rest, "weight_decay": 0.0}], lr=ADAMW["lr"],
                              betas=(ADAMW["beta1"], ADAMW["beta2"]), eps=ADAMW["eps"])
    windows = torch.from_numpy(tokens.astype(np.int64))
    model.train()
    theirs = []
    for step in range(steps):
        w = torch.stack([windows[i * t:i * t + t + 1] for i in range(step * batch, (step + 1) * batch)])
        logits = model(w[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1))
        adamw.zero_grad()
        loss.backward()
        adamw.step()
        theirs.append(loss.item())
    print(f"{'step':>4} {'lockstep loss':>14} {'torch loss':>14} {'rel err':>9}")
    worst = 0.0
    for step, (a, b) in enumerate(zip(ours, theirs)):
        worst = max(worst, abs(a - b) / abs(b))
        print(f"{step + 1:>4} {a:>14.8f} {b:>14.8f} {abs(a - b) / abs(b):>9.2e}")
    ok = len(ours) == steps and worst <= TRAIN_TOLERANCE
    print(f"{family}: worst loss relative error {worst:.2e} over {len(ours)} steps (of {steps}); "
          f"tolerance {TRAIN_TOLERANCE:g}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    if sys.argv[1] == "make":
        return make(*sys.argv[2:])
    if sys.argv[1] == "train":
        return train(*sys.argv[2:6])
    return check(*sys.argv[2:7])


if __name__ == "__main__":
    sys.exit(main())
