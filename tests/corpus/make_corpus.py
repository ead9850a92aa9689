#!/usr/bin/env python3
# Writes the seed files of tests/corpus/ (see README.md there). Rerun after editing; it only
# overwrites the files it names. Standard library only.
import json
import os
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))


def write(kind, files):
    """Writes {name: bytes or str} under ROOT/kind; a name may start with valid/."""
    for name, data in files.items():
        path = os.path.join(ROOT, kind, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, 'wb') as f:
            f.write(data if isinstance(data, bytes) else data.encode())


# ---- config ----
OK_TAIL = "trainer:\n  steps: 5\n"
write('config', {
 'empty.yaml': '',
 'only_comment.yaml': '# nothing here\n',
 'garbage.yaml': bytes(range(256)) * 2,
 'binary_nul.yaml': b'trainer:\n  steps: 5\0\0\0\n\x00model: {}\n',
 'latin1_key.yaml': b'tr\xe4iner:\n  steps: 5\n',
 'invalid_utf8_value.yaml': b'trainer:\n  steps: \xff\xfe\xfd\n',
 'bom_then_tab.yaml': b'\xef\xbb\xbftrainer:\n\tsteps: 5\n',
 'utf16.yaml': 'trainer:\n  steps: 5\n'.encode('utf-16'),
 'deep_flow_list.yaml': 'model:\n  hidden: ' + '[' * 5000 + ']' * 5000 + '\n' + OK_TAIL,
 'deep_flow_map.yaml': 'model: ' + '{a: ' * 3000 + '1' + '}' * 3000 + '\n' + OK_TAIL,
 'deep_block_map.yaml': ''.join(' ' * i + 'k%d:\n' % i for i in range(300)) + ' ' * 300 + 'x: 1\n',
 'deep_unclosed.yaml': '[' * 20000,
 'unclosed_quote.yaml': 'trainer:\n  steps: "5\n',
 'unclosed_flow.yaml': 'trainer: {steps: 5\n',
 'two_documents.yaml': OK_TAIL + '---\n' + OK_TAIL,
 'top_level_list.yaml': '- trainer\n- steps\n',
 'top_level_scalar.yaml': 'hello\n',
 'complex_key.yaml': '? {a: 1}\n: 2\n' + OK_TAIL,
 'duplicate_section.yaml': OK_TAIL + OK_TAIL,
 'unknown_section.yaml': 'trainr:\n  steps: 5\n',
 'undefined_alias.yaml': 'trainer:\n  steps: *nope\n',
 'self_alias.yaml': 'trainer: &t\n  steps: 5\n  epochs: *t\n',
 'alias_bomb.yaml': 'a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n'
                    'c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\nmodel:\n  hidden: [*c, *c, *c, *c]\n',
 'huge_integer.yaml': 'trainer:\n  steps: 99999999999999999999999999999999\n',
 'huge_negative.yaml': 'trainer:\n  steps: 5\n  seed: -99999999999999999999999999\n',
 'huge_float.yaml': 'trainer:\n  steps: 5\noptimizer:\n  lr: 1e999999\n',
 'nan_lr.yaml': 'trainer:\n  steps: 5\noptimizer:\n  lr: .nan\n',
 'int_overflow_hidden.yaml': 'model:\n  hidden: [2147483648]\n' + OK_TAIL,
 'too_many_devices.yaml': 'trainer:\n  steps: 5\n  devices: 2000000000\n',
 'empty_devices.yaml': 'trainer:\n  steps: 5\n  devices: []\n',
 'hex_steps.yaml': 'trainer:\n  steps: 0x10\n',
 'steps_and_epochs.yaml': 'trainer:\n  steps: 5\n  epochs: 1\n',
 'no_steps.yaml': 'model:\n  hidden: [8]\n',
 'csv_without_path.yaml': 'data:\n  dataset: csv\n' + OK_TAIL,
 'betas_conflict.yaml': 'optimizer:\n  beta1: 0.9\n  betas: [0.9, 0.99]\n' + OK_TAIL,
 'long_key.yaml': 'trainer:\n  ' + 'x' * 20000 + ': 1\n',
 'crlf_bad_value.yaml': 'trainer:\r\n  steps: ten\r\n',
 # yaml-cpp 0.7's LoadAll loops forever, allocating, on a token that cannot start a node.
 'loadall_lone_comma.yaml': ',',
 'loadall_comma_after_list.yaml': '- 1\n,\n',
 'loadall_comma_after_flow.yaml': '[1], 2\n',
 'loadall_fuzz_oom.yaml': b',od\x18\x00\x00\x00\x00\x00\x00\x00:\n  step,: 0\n',  # found by fuzz_config
 'override_comment.yaml': '#set trainer.steps=[\n#set =\n#set a..b=1\n#set trainer.steps.x.y=1\n' + 'trainer:\n  steps: many\n',

 'valid/minimal.yaml': 'data:\n  dataset: synthetic\ntrainer:\n  steps: 5\n',
 # The "#set" lines are overrides to tests/fuzz/config.cc, comments to everything else.
 'valid/overrides.yaml': '#set trainer.steps=abc\n#set model.hidden=[4, 4]\n#set trainer.epochs=2\n'
                         'data:\n  dataset: synthetic\n  samples: 64\ntrainer:\n  steps: 5\n  devices: 2\n',
 # Its data path made relative to tests/corpus/config/valid/, where load_config() looks for it.
 'valid/quickstart.yaml': open(os.path.join(ROOT, '..', '..', 'configs', 'quickstart.yaml')).read()
                          .replace('../third_party/', '../../../../third_party/'),
})

# ---- csv ----
write('csv', {
 'empty.csv': '',
 'blank_lines.csv': '\n  \n\t\n\r\n',
 'header_only.csv': 'a,b,label\n',
 'one_column.csv': '1\n2\n3\n',
 'ragged.csv': '1,2,0\n3,4,5,1\n',
 'ragged_short.csv': '1,2,0\n3,1\n',
 'garbage.csv': bytes(range(256)),
 'non_utf8.csv': b'1,\xff\xfe,0\n2,3,1\n',
 'nul_bytes.csv': b'1,2,0\n3,\x004,1\n',
 'truncated_line.csv': '1,2,0\n3,4,1\n5,',
 'empty_field.csv': '1,,0\n3,4,1\n',
 'single_class.csv': '1,2,0\n3,4,0\n',
 'negative_label.csv': '1,2,-1\n3,4,1\n',
 'fractional_label.csv': '1,2,0.5\n3,4,1\n',
 'huge_label.csv': '1,2,0\n3,4,99999999999999999999\n',
 'int32_max_label.csv': '1,2,0\n3,4,2147483647\n',
 'huge_feature.csv': '1e39,2,0\n3,4,1\n',
 'huge_double.csv': '1e400,2,0\n3,4,1\n',
 'nan_feature.csv': 'nan,2,0\n3,4,1\n',
 'inf_feature.csv': '1,inf,0\n3,4,1\n',
 'hex_feature.csv': '0x10,2,0\n3,4,1\n',
 'plus_minus.csv': '+-1,2,0\n3,4,1\n',
 'quoted_fields.csv': '"1","2","0"\n"3","4","1"\n',
 'semicolons.csv': '1;2;0\n3;4;1\n',
 'bom_only.csv': b'\xef\xbb\xbf',
 'cr_only_lines.csv': '1,2,0\r3,4,1\r',
 'long_number.csv': '1' * 5000 + ',2,0\n3,4,1\n',
 # A 36 KB file that made load_csv reserve lines x columns floats (576 MB; 2 TB from 2 MB).
 'wide_line_then_blank_lines.csv': ','.join(['0'] * 12000) + '\n' * 12000 + 'x\n',

 'valid/small.csv': '1,2.5,0\n-3,4e1,1\n0.5,6,2\n',
 'valid/crlf_bom_spaces.csv': b'\xef\xbb\xbf 1 ,\t2 , 0\r\n\r\n+3,4,1\r\n',
})

# ---- idx ----
def idx(magic, dims, data):
    """An IDX file: big-endian magic and dimensions, then one byte per element."""
    return struct.pack('>I', magic) + b''.join(struct.pack('>I', d) for d in dims) + bytes(data)
px = list(range(12))
write('idx', {
 'images-empty.idx': b'',
 'images-short_magic.idx': b'\x00\x00\x08',
 'images-wrong_type.idx': idx(0x00000903, [3, 2, 2], px),
 'images-float_type.idx': idx(0x00000d03, [3, 2, 2], [0] * 48),
 'images-zero_dims.idx': idx(0x00000800, [], []),
 'images-nonzero_high_bytes.idx': idx(0x01000803, [3, 2, 2], px),
 'images-truncated_header.idx': idx(0x00000803, [3, 2, 2], [])[:10],
 'images-truncated_data.idx': idx(0x00000803, [3, 2, 2], px[:11]),
 'images-extra_data.idx': idx(0x00000803, [3, 2, 2], px + [1]),
 'images-zero_count.idx': idx(0x00000803, [0, 2, 2], []),
 'images-zero_dimension.idx': idx(0x00000803, [3, 0, 2], []),
 'images-count_mismatch.idx': idx(0x00000803, [4, 2, 2], px + [1, 2, 3, 4]),
 'images-huge_dims.idx': idx(0x00000803, [0xffffffff, 0xffffffff, 0xffffffff], px),
 'images-overflow_dims.idx': idx(0x000008ff, [0xffffffff] * 255, []),
 'images-255_dims_truncated.idx': idx(0x000008ff, [1] * 10, []),
 'images-garbage.idx': bytes(range(255, -1, -1)),
 'images-text.idx': b'P5\n2 2\n255\n\x00\x01\x02\x03',
 'labels-empty.idx': b'',
 'labels-images_magic.idx': idx(0x00000803, [3, 2, 2], px),
 'labels-two_dims.idx': idx(0x00000802, [3, 1], [0, 1, 2]),
 'labels-truncated.idx': idx(0x00000801, [3], [0, 1]),
 'labels-extra.idx': idx(0x00000801, [3], [0, 1, 2, 3]),
 'labels-count_mismatch.idx': idx(0x00000801, [2], [0, 1]),
 'labels-single_class.idx': idx(0x00000801, [3], [0, 0, 0]),
 'labels-huge_count.idx': idx(0x00000801, [0xffffffff], [1, 2, 3]),
 'labels-little_endian.idx': struct.pack('<I', 0x00000801) + struct.pack('<I', 3) + bytes([0, 1, 2]),

 'valid/images.idx': idx(0x00000803, [3, 2, 2], [0, 255, 51, 102, 1, 2, 3, 4, 10, 20, 30, 40]),
 'valid/labels.idx': idx(0x00000801, [3], [0, 2, 1]),
})

# ---- safetensors ----
def fnv1a64(data, h=0xcbf29ce484222325):
    for byte in data:
        h = ((h ^ byte) * 0x100000001b3) & 0xffffffffffffffff
    return h


def st(header, data=b'', raw_header=None):
    """A safetensors file: u64 header size, the JSON header space-padded to 8 bytes, the data."""
    h = raw_header if raw_header is not None else json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * ((8 - len(h) % 8) % 8)
    return struct.pack('<Q', len(h)) + h + data


f32 = struct.pack('<6f', 1, 2, 3, 4, 5, 6)
good = {'__metadata__': {'format': 'pt'},
        'layers.0.weight': {'dtype': 'F32', 'shape': [2, 2], 'data_offsets': [0, 16]},
        'layers.0.bias': {'dtype': 'F32', 'shape': [2], 'data_offsets': [16, 24]}}


def mod(**fields):
    """`good` with fields of its first tensor replaced."""
    h = json.loads(json.dumps(good))
    h['layers.0.weight'].update(fields)
    return h


write('safetensors', {
 'empty.safetensors': b'',
 'short_size.safetensors': b'\x08\x00\x00',
 'huge_header_size.safetensors': struct.pack('<Q', 2**63) + b'{}',
 'header_past_end.safetensors': struct.pack('<Q', 4096) + b'{}      ',
 'not_json.safetensors': st(None, raw_header=b'hello world'),
 'json_array.safetensors': st([1, 2]),
 'deep_json.safetensors': st(None, raw_header=b'[' * 4000),
 'bad_utf8_key.safetensors': st(None, raw_header=b'{"\xff":1}'),
 'duplicate_key.safetensors': st(None, raw_header=b'{"a":{},"a":{}}'),
 'wrong_dtype.safetensors': st(mod(dtype='F16'), f32),
 'negative_dim.safetensors': st(mod(shape=[-2, 2]), f32),
 'float_dim.safetensors': st(mod(shape=[2.0, 2]), f32),
 'huge_dims.safetensors': st(mod(shape=[2**62, 2**62]), f32),
 'offsets_reversed.safetensors': st(mod(data_offsets=[16, 0]), f32),
 'offsets_gap.safetensors': st(mod(data_offsets=[4, 20]), f32),
 'offsets_huge.safetensors': st(mod(data_offsets=[0, 2**64 - 1]), f32),
 'truncated_data.safetensors': st(good, f32[:20]),
 'extra_data.safetensors': st(good, f32 + b'\0\0\0\0'),
 'bad_checksum.safetensors': st(dict(good, __metadata__={'lockstep.checksum': '0000000000000000'}), f32),
 'metadata_not_strings.safetensors': st(dict(good, __metadata__={'format': 1}), f32),
 'unknown_tensor_key.safetensors': st(mod(extra=1), f32),

 'valid/two_tensors.safetensors': st(good, f32),
 'valid/checksummed.safetensors':
     st(dict(good, __metadata__={'format': 'pt', 'lockstep.checksum': '%016x' % fnv1a64(f32)}), f32),
})

# ---- checkpoint .state ----
def payload(step=5, workers=2, opt=b'sgd', vectors=((b'momentum', [0.5] * 6),), tail=b''):
    p = struct.pack('<qQQqQi', step, 1, 2, 40, 0x1234, workers)
    p += bytes([len(opt)]) + opt + struct.pack('<qQQ', 5, 7, 0xabcdef)
    p += struct.pack('<I', len(vectors))
    for name, vals in vectors:
        p += struct.pack('<H', len(name)) + name + struct.pack('<Q', len(vals)) + struct.pack('<%df' % len(vals), *vals)
    return p + tail


def state(p, magic=b'LSTPSTATE', version=1, size=None, checksum=None):
    return magic + struct.pack('<IQQ', version, len(p) if size is None else size,
                               fnv1a64(p) if checksum is None else checksum) + p


P = payload()
write('state', {
 'empty.state': b'',
 'short_magic.state': b'LSTP',
 'wrong_magic.state': state(P, magic=b'LSTPSTATX'),
 'wrong_version.state': state(P, version=2),
 'truncated_header.state': state(P)[:20],
 'size_too_big.state': state(P, size=len(P) + 1),
 'size_huge.state': state(P, size=2**64 - 1),
 'truncated_payload.state': state(P)[:-3],
 'bad_checksum.state': state(P, checksum=0),
 'negative_step.state': state(payload(step=-1)),
 'zero_workers.state': state(payload(workers=0)),
 'unknown_optimizer.state': state(payload(opt=b'adam')),
 'empty_vector_name.state': state(payload(vectors=((b'', [1.0]),))),
 'duplicate_vector.state': state(payload(vectors=((b'm', [1.0]), (b'm', [2.0])))),
 'vector_length_huge.state': state(payload(vectors=((b'm', []),))[:-8] + struct.pack('<Q', 2**62)),
 'vector_count_huge.state': state(payload(vectors=())[:-4] + struct.pack('<I', 2**32 - 1)),
 'trailing_bytes.state': state(payload(tail=b'\0')),

 'valid/sgd_momentum.state': state(P),
 'valid/adamw.state': state(payload(opt=b'adamw', vectors=((b'adamw.m', [0.1] * 3),
                                                           (b'adamw.v', [0.2] * 3)))),
})

# ---- tokens: *.bin through load_tokens (auto format, vocab 50257), *.txt through load_text;
# context 4 ----
def llmc(tokens, version=1, count=None, fmt='H'):
    """llm.c's .bin: 256 little-endian int32 (magic, version, count), then the tokens."""
    header = [20240520, version, len(tokens) if count is None else count] + [0] * 253
    return struct.pack('<256i', *header) + struct.pack('<%d%s' % (len(tokens), fmt), *tokens)


def raw(tokens):
    return struct.pack('<%dH' % len(tokens), *tokens)


T = list(range(10))
write('tokens', {
 'empty.bin': b'',
 'magic_only.bin': struct.pack('<i', 20240520),
 'truncated_header.bin': llmc(T)[:1000],
 'version_3.bin': llmc(T, version=3),
 'version_0.bin': llmc(T, version=0),
 'negative_count.bin': llmc(T, count=-1),
 'count_too_big.bin': llmc(T, count=11),
 'count_huge.bin': llmc(T, count=2**31 - 1),
 'count_too_small.bin': llmc(T, count=9),
 'truncated_tokens.bin': llmc(T)[:-1],
 'version_2_with_uint16.bin': llmc(T, version=2),
 'token_out_of_vocab.bin': llmc(T[:7] + [50257] + T[8:]),
 'uint32_out_of_vocab.bin': llmc(T[:3] + [2**32 - 1] + T[4:], version=2, fmt='I'),
 'too_few_tokens.bin': llmc(T[:4]),
 # Found by fuzz_tokens: a header that counts no tokens decoded them with memcpy(null, ..., 0).
 'no_tokens_uint32.bin': llmc([], version=2, fmt='I'),
 'raw_odd_size.bin': raw(T) + b'\x01',
 'raw_out_of_vocab.bin': raw(T[:5] + [65535]),
 'raw_too_few.bin': raw(T[:4]),
 'empty.txt': b'',
 'latin1.txt': b'first line\nsecond l\xefne\n',
 'overlong.txt': b'abcd\xc0\xafefgh',
 'surrogate.txt': b'abcd\xed\xa0\x80efgh',
 'above_max.txt': b'abcd\xf4\x90\x80\x80efgh',
 'truncated_sequence.txt': b'abcdefgh\xe2\x82',
 'lone_continuation.txt': b'abcd\x80efgh',
 'utf16.txt': 'hello world\n'.encode('utf-16'),
 'too_short.txt': b'abcd',

 'valid/gpt2.bin': llmc(list(range(0, 50257, 997))),
 'valid/uint32.bin': llmc([50000, 5, 7000, 50256, 9, 11], version=2, fmt='I'),
 'valid/nanogpt.bin': raw(list(range(0, 50257, 1009))),
 'valid/utf8.txt': 'h\u00e9llo w\u00f6rld \u20ac \U0001f600\n'.encode(),
})
write('config', {
 'tokens_without_path.yaml': 'model: {type: gpt, vocab_size: 50257}\ndata: {dataset: tokens}\n' + OK_TAIL,
 'tokens_without_vocab.yaml': 'model: {type: gpt}\ndata: {dataset: tokens, path: t.bin}\n' + OK_TAIL,
 'text_with_mlp.yaml': 'data: {dataset: text, path: t.txt}\n' + OK_TAIL,
 'gpt_heads_mismatch.yaml': 'model: {type: gpt, d_model: 10, n_head: 4}\n'
                            'data: {dataset: text, path: t.txt}\n' + OK_TAIL,
})

# ---- tokenizer: *.tiktoken through Tokenizer::load as rank files, *.json as tokenizer.json ----
import base64


def ranks(tokens):
    """A tiktoken rank file: "BASE64 RANK" per line, rank = position."""
    return b''.join(base64.b64encode(t) + b' %d\n' % i for i, t in enumerate(tokens))


BYTES = [bytes([b]) for b in range(256)]
MERGED = [b'ab', b'abc', b' a', b' ab', b'\xc3\xa9']


def stand_in(b):
    """GPT-2's printable character for byte b (vocab.json's alphabet)."""
    keep = [c for c in range(256) if 33 <= c <= 126 or 161 <= c <= 172 or c >= 174]
    return chr(b) if b in keep else chr(256 + [c for c in range(256) if c not in keep].index(b))


def tokenizer_json(model_type='BPE', pre='ByteLevel', prefix=False, merges=None, **parts):
    vocab = {''.join(stand_in(b) for b in t): i for i, t in enumerate(BYTES + MERGED)}
    vocab['<|endoftext|>'] = len(vocab)
    shown = lambda t: ''.join(stand_in(b) for b in t)
    pairs = [(b'a', b'b'), (b'ab', b'c'), (b' ', b'a'), (b' a', b'b'), (b'\xc3', b'\xa9')]
    return json.dumps({
        'version': '1.0', 'normalizer': None,
        'pre_tokenizer': {'type': pre, 'add_prefix_space': prefix, 'use_regex': True},
        'added_tokens': [{'id': len(vocab) - 1, 'content': '<|endoftext|>', 'special': True}],
        'model': {'type': model_type, 'dropout': None, 'vocab': vocab,
                  'merges': merges if merges is not None else [shown(a) + ' ' + shown(b) for a, b in pairs]},
        **parts,
    }, indent=1)


def split_then_bytes(pattern, behavior='Isolated'):
    return {'type': 'Sequence', 'pretokenizers': [
        {'type': 'Split', 'pattern': pattern, 'behavior': behavior, 'invert': False},
        {'type': 'ByteLevel', 'add_prefix_space': False, 'use_regex': False}]}


GOOD = ranks(BYTES + MERGED)
write('tokenizer', {
 'empty.tiktoken': b'',
 'no_rank.tiktoken': b'YQ==\n',
 'bad_base64.tiktoken': b'Y!== 0\n',
 'base64_nonzero_padding_bits.tiktoken': b'YR== 0\n',
 'negative_rank.tiktoken': b'YQ== -1\n',
 'rank_too_big.tiktoken': b'YQ== 99999999999\n',
 'duplicate_rank.tiktoken': GOOD + base64.b64encode(b'zz') + b' 3\n',
 'duplicate_token.tiktoken': GOOD + base64.b64encode(b'ab') + b' %d\n' % (256 + len(MERGED)),
 'rank_gap.tiktoken': GOOD + base64.b64encode(b'zz') + b' %d\n' % (300 + len(MERGED)),
 'missing_byte.tiktoken': ranks(BYTES[:200]),
 'truncated.tiktoken': GOOD[:-3],
 'crlf.tiktoken': GOOD.replace(b'\n', b'\r\n'),
 'endoftext_ranked.tiktoken': GOOD + base64.b64encode(b'<|endoftext|>') + b' %d\n' % (256 + len(MERGED)),
 'not_json.json': b'{"model": ',
 'wordpiece.json': tokenizer_json(model_type='WordPiece'),
 'whitespace_pre.json': tokenizer_json(pre='Whitespace'),
 'bad_regex.json': tokenizer_json(pre_tokenizer=split_then_bytes({'Regex': '(?<=a+)b'})),
 'bad_split_behavior.json': tokenizer_json(pre_tokenizer=split_then_bytes({'Regex': 'a'}, 'Sideways')),
 'split_pattern_neither.json': tokenizer_json(pre_tokenizer=split_then_bytes({'Glob': 'a*'})),
 'no_byte_level.json': tokenizer_json(pre_tokenizer={'type': 'Digits', 'individual_digits': True}),
 'lowercase_normalizer.json': tokenizer_json(normalizer={'type': 'Lowercase'}),
 'byte_fallback.json': tokenizer_json(model={'type': 'BPE', 'byte_fallback': True, 'vocab': {}, 'merges': []}),
 'roberta_post.json': tokenizer_json(post_processor={'type': 'RobertaProcessing'}),
 'template_unknown_token.json': tokenizer_json(post_processor={
     'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': '<s>', 'type_id': 0}},
                                              {'Sequence': {'id': 'A', 'type_id': 0}}],
     'special_tokens': {}}),
 'single_word_added.json': tokenizer_json(added_tokens=[
     {'id': len(BYTES + MERGED), 'content': '<|endoftext|>', 'special': True, 'single_word': True}]),
 'merge_unknown_token.json': tokenizer_json(merges=['a zz']),
 'merge_result_missing.json': tokenizer_json(merges=['b a']),
 'merge_twice.json': tokenizer_json(merges=['a b', 'a b']),
 'merge_one_token.json': tokenizer_json(merges=['ab']),
 'valid/small.tiktoken': GOOD,
 'valid/tokenizer.json': tokenizer_json(),
 'valid/prefix_space.json': tokenizer_json(prefix=True),
 'valid/llama3_like.json': tokenizer_json(pre_tokenizer=split_then_bytes(
     {'Regex': "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}),
     normalizer={'type': 'NFC'}),
})
