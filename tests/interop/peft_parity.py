#!/usr/bin/env python3
"""PEFT's side of the LoRA parity test (tests/interop/test_peft_parity.cpp); run with the
virtual environment of tests/interop/hf_venv.sh (transformers 4.40.2, peft 0.10.0).

    peft_parity.py make DIR [llama|gpt2]
        saves a random LlamaForCausalLM (or GPT2LMHeadModel; torch.manual_seed(0), weights std
        0.2) to DIR/base with save_pretrained, and a LoRA adapter on every projection (r 4,
        lora_alpha 8, B drawn so that it is not zero) to DIR/adapter with
        PeftModel.save_pretrained. On GPT-2 the projections are transformers' Conv1D, weight
        (in, out), which PEFT adapts with fan_in_fan_out set; "attn.c_proj" and "mlp.c_proj"
        name one module each by PEFT's suffix match.
    peft_parity.py check DIR TOKENS.i32 BATCH LOGITS.f32 GRADS.safetensors MERGED.safetensors
                         LOCKSTEP_ADAPTER_DIR LOSSES.f64
        loads DIR/base with DIR/adapter in fp32 and compares with lockstep's logits (B, T, V)
        (relative error 1e-5), its adapters' gradients of the mean next-token loss (lockstep's
        names; 1e-5), its merged weights with merge_and_unload's (largest absolute difference
        1e-6; lockstep's (out, in) against Conv1D's (in, out) transposed), and loads lockstep's `export --format peft` directory on DIR/base, whose adapters
        must equal DIR/adapter's; then trains DIR/adapter 20 steps with torch.optim.AdamW (lr
        0.01, no weight decay) on the same batch, whose losses must be lockstep's within 1e-4
        relative. Prints the errors; exits 1 when one is over its bound.
"""

import sys

import numpy as np
import peft
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

TARGETS = {"llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           "gpt2": ["c_attn", "attn.c_proj", "c_fc", "mlp.c_proj"]}


def relative(a, b):
    return (a - b).norm().item() / max(b.norm().item(), 1e-30)


def make(directory, family):
    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=96, n_positions=16, n_embd=32, n_layer=2,
                                         n_head=4)
    else:
        config = transformers.LlamaConfig(
            vocab_size=96, max_position_embeddings=16, hidden_size=32, intermediate_size=48,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2)
    model.save_pretrained(f"{directory}/base", safe_serialization=True)
    base = transformers.AutoModelForCausalLM.from_pretrained(f"{directory}/base")
    lora = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS[family], lora_dropout=0.0,
        fan_in_fan_out=family == "gpt2", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    lora.save_pretrained(f"{directory}/adapter")
    return 0


def load(directory, adapter):
    base = transformers.AutoModelForCausalLM.from_pretrained(f"{directory}/base",
                                                             torch_dtype=torch.float32)
    return peft.PeftModel.from_pretrained(base, adapter, is_trainable=True)


def lockstep_name(name):
    # base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight
    return name.replace("base_model.model.", "", 1).replace(".default.", ".")


def adamw_losses(directory, inputs, targets, steps=20):
    model = load(directory, f"{directory}/adapter")
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        logits = model(inputs).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return np.array(losses)


def check(directory, tokens_file, batch, logits_file, grads_file, merged_file, ours_dir, losses_file):
    model = load(directory, f"{directory}/adapter")
    tokens = torch.from_numpy(np.fromfile(tokens_file, dtype=np.int32).astype(np.int64)).reshape(int(batch), -1)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    logits = model(inputs).logits
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    ours = torch.from_numpy(np.fromfile(logits_file, dtype=np.float32)).reshape(logits.shape)
    logit_err = relative(ours, logits.detach())
    grads = load_file(grads_file)
    grad_err, seen = 0.0, set()
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        key = lockstep_name(name)
        if key not in grads:
            print(f"{name}: no gradient from lockstep ({key})")
            return 1
        grad_err = max(grad_err, relative(grads[key], p.grad))
        seen.add(key)
    if set(grads) != seen:
        print(f"lockstep's adapters differ from PEFT's: {sorted(set(grads) ^ seen)}")
        return 1
    unloaded = model.merge_and_unload()
    merged = unloaded.state_dict()
    conv1d = {f"{n}.weight" for n, m in unloaded.named_modules()
              if isinstance(m, transformers.pytorch_utils.Conv1D)}
    lockstep_merged = load_file(merged_file)
    merge_err = max((lockstep_merged[k] - (merged[k].t() if k in conv1d else merged[k]))
                    .abs().max().item() for k in lockstep_merged)
    theirs = load(directory, ours_dir)
    original = load(directory, f"{directory}/adapter")
    mine = dict(theirs.named_parameters())
    same = all(torch.equal(p, mine[n]) for n, p in original.named_parameters() if "lora_" in n)
    torch_losses = adamw_losses(directory, inputs, targets)
    our_losses = np.fromfile(losses_file, dtype=np.float64)
    loss_err = np.max(np.abs(our_losses - torch_losses) / np.abs(torch_losses))
    print(f"logits relative error {logit_err:.2e}; adapter gradients ({len(seen)}) worst "
          f"{grad_err:.2e}; merged weights largest difference {merge_err:.2e}; lockstep's PEFT "
          f"export {'loads with the same adapters' if same else 'DIFFERS'}; 20 AdamW steps' "
          f"losses ({torch_losses[0]:.6f} to {torch_losses[-1]:.6f}) worst relative error {loss_err:.2e}")
    return 0 if (logit_err <= 1e-5 and grad_err <= 1e-5 and merge_err <= 1e-6 and same
                 and loss_err <= 1e-4) else 1


def main():
    if sys.argv[1] == "make":
        return make(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "llama")
    return check(*sys.argv[2:10])


if __name__ == "__main__":
    sys.exit(main())
