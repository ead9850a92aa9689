"""The ids transformers' apply_chat_template gives conversations, for the C++ chat template test.

    chat_template.py TOKENIZER_DIR MESSAGES.json OUT_DIR

MESSAGES.json holds a list of conversations (lists of {"role", "content"}). For each template
(chatml: SmolLM2's published template, the chatml rendering Qwen2 shares; llama3: Llama 3's),
writes OUT_DIR/<template>.<i>.u32, the ids of conversation i as little-endian uint32.
"""
import json
import pathlib
import struct
import sys

from transformers import PreTrainedTokenizerFast

# The templates as published in the models' tokenizer_config.json (SmolLM2-135M-Instruct;
# Meta-Llama-3-8B-Instruct). SmolLM2's adds its own system message when a conversation has
# none; the test's conversations all have one.
TEMPLATES = {
    "chatml": (
        "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
        "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    "llama3": (
        "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
        "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
        "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = "
        "bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt "
        "%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"),
}


def main(tokenizer_dir, messages_file, out_dir):
    tok = PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)
    conversations = json.loads(pathlib.Path(messages_file).read_text())
    out = pathlib.Path(out_dir)
    for name, template in TEMPLATES.items():
        tok.chat_template = template
        for i, messages in enumerate(conversations):
            ids = tok.apply_chat_template(messages, tokenize=True)
            (out / f"{name}.{i}.u32").write_bytes(struct.pack(f"<{len(ids)}I", *ids))


if __name__ == "__main__":
    main(*sys.argv[1:])
