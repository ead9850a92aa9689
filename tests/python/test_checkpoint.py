"""Checkpoints from Python: tensors by name as numpy arrays, and where training stood."""

import os

import numpy as np
import pytest

import lockstep
from conftest import SOURCE_DIR, mlp_config, run_cli


def test_a_checkpoint_holds_the_trained_parameters(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(checkpoint={"dir": str(tmp_path / "ckpt")}))
    trainer = lockstep.Trainer(config)
    written = []
    trainer.on_checkpoint(lambda step, file: written.append((step, file)))
    summary = trainer.run()
    assert written == [(40, summary.checkpoint)]
    saved = lockstep.load_checkpoint(tmp_path / "ckpt")
    assert saved.step == 40 and saved.workers == 2 and saved.weights_file == summary.checkpoint
    assert saved.metadata["lockstep.model"] == trainer.model
    trained = trainer.parameters()
    assert sorted(saved.parameters) == sorted(trained)
    for name, value in trained.items():
        assert saved.parameters[name].dtype == np.float32
        np.testing.assert_array_equal(saved.parameters[name], value)
    assert saved.parameters["layers.0.weight"].shape == (16, 8)
    assert set(saved.optimizer_state) == {"momentum"}
    assert dict(saved.config)["optimizer.lr"] == "0.05"
    again = lockstep.load_checkpoint(summary.checkpoint)  # the weights file itself
    np.testing.assert_array_equal(again.parameters["layers.2.bias"], trained["layers.2.bias"])


def test_init_from_starts_from_the_weights(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(checkpoint={"dir": str(tmp_path / "ckpt")}))
    first = lockstep.Trainer(config)
    first.run()
    second = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=1)))
    second.init_from(tmp_path / "ckpt")
    second.run()
    moved = second.parameters()["layers.0.weight"] - first.parameters()["layers.0.weight"]
    assert 0 < np.abs(moved).max() < 0.1  # one small step from the trained weights


def test_a_damaged_checkpoint_names_its_file(tmp_path):
    config = lockstep.Config.from_dict(mlp_config(steps=2, checkpoint={"dir": str(tmp_path)}))
    weights = lockstep.Trainer(config).run().checkpoint
    with open(weights, "r+b") as f:  # one flipped byte in the data
        f.seek(-3, 2)
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(lockstep.InputError, match=os.path.basename(weights)):
        lockstep.load_checkpoint(weights)
    (tmp_path / "empty").mkdir()
    with pytest.raises(lockstep.InputError, match="no checkpoint"):
        lockstep.load_checkpoint(tmp_path / "empty")


def text_gpt_checkpoint(tmp_path):
    """A byte-level GPT trained a few steps on the shipped play, with its checkpoint."""
    config = lockstep.Config.from_dict({
        "model": {"type": "gpt", "context": 16, "n_layer": 1, "n_head": 2, "d_model": 32},
        "data": {"dataset": "text",
                 "path": os.path.join(SOURCE_DIR, "third_party", "shakespeare", "as_you_like_it.txt"),
                 "batch_size": 4},
        "optimizer": {"type": "adamw", "lr": 0.01},
        "trainer": {"devices": 2, "steps": 6, "checkpoint": {"dir": str(tmp_path / "gpt")}},
    })
    return lockstep.Trainer(config).run().checkpoint


def test_sample_draws_what_the_cli_draws(tmp_path):
    weights = text_gpt_checkpoint(tmp_path)
    pieces = []
    drawn = lockstep.sample(tmp_path / "gpt", "ROSALIND.", tokens=40, seed=5, top_k=20,
                            on_token=lambda token, piece: pieces.append((token, piece)))
    assert drawn.text_model and drawn.prompt_text == "ROSALIND."
    assert len(drawn.tokens) == 40 and [t for t, _ in pieces] == drawn.tokens
    assert b"".join(p for _, p in pieces).decode("utf-8", "replace") == drawn.text
    code, stdout, stderr = run_cli("sample", "--checkpoint", weights, "--prompt", "ROSALIND.",
                                   "--tokens", 40, "--seed", 5, "--top-k", 20)
    assert code == 0, stderr
    assert stdout == drawn.prompt_text + drawn.text + "\n"
    assert not drawn.stopped
    # The same tokens without the key/value cache; stop_at ends them at the first other token.
    assert lockstep.sample(weights, "ROSALIND.", tokens=40, seed=5, top_k=20, kv_cache=False) == drawn
    other = next(i for i, t in enumerate(drawn.tokens) if t != drawn.tokens[0])
    stopped = lockstep.sample(weights, "ROSALIND.", tokens=40, seed=5, top_k=20,
                              stop_at=[drawn.tokens[other]])
    assert stopped.tokens == drawn.tokens[:other] and stopped.stopped
    with pytest.raises(lockstep.InputError, match=r"^stop_at: token 256 is outside"):
        lockstep.sample(weights, stop_at=[256])
    with pytest.raises(lockstep.InputError, match=r"^top_k: expected >= 0, got -2"):
        lockstep.sample(weights, top_k=-2)
    with pytest.raises(lockstep.InputError, match="backend: expected auto, cpu or cuda"):
        lockstep.sample(weights, backend="tpu")
    # Without a GPU, the fix in Python's spelling, the driver's state as `lockstep devices` says it.
    try:
        lockstep.sample(weights, tokens=1, backend="cuda")
    except lockstep.InputError as refused:
        message = str(refused)
        assert message.startswith("backend='cuda': no usable GPU (") and "pass backend='cpu'" in message
        assert "--" not in message and "insufficient" not in message


def test_export_writes_what_the_cli_writes(tmp_path):
    weights = text_gpt_checkpoint(tmp_path)
    result = lockstep.export(weights, tmp_path / "mine.safetensors", dtype="bf16")
    assert (result.step, result.tensors) == (6, len(lockstep.load_checkpoint(weights).parameters))
    code, _, stderr = run_cli("export", weights, "--out", tmp_path / "cli.safetensors",
                              "--dtype", "bf16")
    assert code == 0, stderr
    assert (tmp_path / "mine.safetensors").read_bytes() == (tmp_path / "cli.safetensors").read_bytes()
    with pytest.raises(lockstep.InputError, match="^format: expected torch, hf or peft, got 'onnx'"):
        lockstep.export(weights, tmp_path / "x", format="onnx")
    # Hugging Face's layout, in shards above max_shard_size, as transformers' save_pretrained cuts them.
    lockstep.export(weights, tmp_path / "hf", format="hf", max_shard_size="2KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    assert not (tmp_path / "hf" / "model.safetensors").exists()
    with pytest.raises(lockstep.InputError, match="^max_shard_size: expected a size in bytes"):
        lockstep.export(weights, tmp_path / "hf2", format="hf", max_shard_size="lots")


def test_a_new_run_leaves_another_runs_checkpoints_alone(tmp_path):
    # Note [A used checkpoint directory]: refused, unless it starts over (overwrite) or resumes.
    ckpt = tmp_path / "ckpt"
    first = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=4, checkpoint={"dir": str(ckpt)})))
    weights = first.run().checkpoint
    before = open(weights, "rb").read()
    again = lockstep.Trainer(lockstep.Config.from_dict(mlp_config(steps=2, checkpoint={"dir": str(ckpt)})))
    with pytest.raises(lockstep.InputError, match=r"holds the checkpoints of another run \(step 4\)"):
        again.run()
    assert open(weights, "rb").read() == before
    over = lockstep.Trainer(lockstep.Config.from_dict(
        mlp_config(steps=2, checkpoint={"dir": str(ckpt), "overwrite": True})))
    over.run()
    assert not os.path.exists(weights)
    assert lockstep.load_checkpoint(ckpt).step == 2


def test_sample_allow_special_encodes_a_chat_prompts_special_tokens(tmp_path):
    config = lockstep.Config.from_yaml(
        os.path.join(SOURCE_DIR, "configs", "sft_tiny.yaml"),
        {"trainer.steps": 2, "trainer.eval_every": 0, "trainer.log_every": 2,
         "trainer.checkpoint.dir": str(tmp_path / "sft")})
    weights = lockstep.Trainer(config).run().checkpoint
    # The chatml template's turn, as the shipped tokenizer's special tokens 1025 and 1026 open
    # and close it.
    prompt = "<|im_start|>user\nSpell river backwards.<|im_end|>\n<|im_start|>assistant\n"
    special = lockstep.sample(weights, prompt, tokens=3, temperature=0, allow_special=True)
    assert special.prompt_tokens.count(1025) == 2 and special.prompt_tokens.count(1026) == 1
    text = lockstep.sample(weights, prompt, tokens=3, temperature=0)
    assert 1025 not in text.prompt_tokens and len(text.prompt_tokens) > len(special.prompt_tokens)
    code, stdout, stderr = run_cli("sample", weights, "--allow-special", "--prompt", prompt,
                                   "--tokens", 3, "--temperature", 0)
    assert code == 0, stderr
    assert stdout == special.prompt_text + special.text + "\n"
