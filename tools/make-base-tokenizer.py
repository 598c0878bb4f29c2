#!/usr/bin/env python3
"""Builds models/tokenizer.json, Gepard's small base tokenizer.

A byte-level BPE in exactly the layout of the Qwen3.5 tokenizer (gepard-model.md §4): NFC
normalizer, pre-tokenizer Sequence[Split(regex, "isolated"), ByteLevel(add_prefix_space=False,
use_regex=False)], ByteLevel decoder, 4096 BPE entries (the 256 byte tokens included) trained on
the seed texts in tests/data/tokenizer/, then the 33 Qwen3.5/GEPARD added tokens in the order of
§4 with the ids right after the base vocabulary (4096…4128). Test models are made from it by
rewriting those ids to the real ones (248044…248076).

The output is deterministic: running the script again reproduces the file byte for byte (with the
same `tokenizers` version; the parity test checks this).

    python3 tools/make-base-tokenizer.py [--output models/tokenizer.json] [--check]

The module is also imported by tests/python/test_tokenizer_parity.py, which trains tokenizers of
the same layout on other text.
"""

import argparse
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
SEED_DIR = REPO / "tests" / "data" / "tokenizer"
DEFAULT_OUTPUT = REPO / "models" / "tokenizer.json"
BASE_VOCAB_SIZE = 4096

# gepard-model.md §4: the Split pattern of Qwen3.5's pre-tokenizer.
QWEN35_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
    r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# gepard-model.md §4: the 33 added tokens, ids 248044…248076 in Qwen3.5, in this order.
ADDED_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
]
assert len(ADDED_TOKENS) == 33


def qwen35_layout_tokenizer():
    """An untrained tokenizer with Qwen3.5's model options, normalizer, pre-tokenizer and decoder
    (as transformers' Qwen3_5Tokenizer builds them)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    tokenizer = Tokenizer(
        BPE(
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_qwen35_layout(lines, vocab_size, added_tokens=ADDED_TOKENS):
    """Trains a byte-level BPE of `vocab_size` entries (the 256 byte tokens included) on `lines`
    and appends `added_tokens` as special tokens with the next ids."""
    from tokenizers import AddedToken, pre_tokenizers, trainers

    tokenizer = qwen35_layout_tokenizer()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=0,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(lines, trainer=trainer)
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False, lstrip=False, rstrip=False,
                       single_word=False)
            for t in added_tokens
        ]
    )
    return tokenizer


def seed_lines(seed_dir=SEED_DIR):
    """The seed sentences, file by file in name order."""
    lines = []
    for path in sorted(pathlib.Path(seed_dir).glob("*.txt")):
        lines.extend(line for line in path.read_text(encoding="utf-8").split("\n") if line)
    return lines


def base_training_corpus(seed_dir=SEED_DIR):
    """The seed sentences as written and in lower case (the way much TTS input arrives)."""
    lines = seed_lines(seed_dir)
    return lines + [line.lower() for line in lines]


def build_base_tokenizer_json():
    tokenizer = train_qwen35_layout(base_training_corpus(), BASE_VOCAB_SIZE)
    if tokenizer.get_vocab_size(with_added_tokens=False) != BASE_VOCAB_SIZE:
        raise SystemExit(
            "the seed texts gave only %d BPE entries, not %d"
            % (tokenizer.get_vocab_size(with_added_tokens=False), BASE_VOCAB_SIZE)
        )
    return tokenizer.to_str(pretty=True) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=pathlib.Path, default=DEFAULT_OUTPUT)
    parser.add_argument(
        "--check", action="store_true",
        help="compare with --output instead of writing it; exit status 1 when they differ")
    args = parser.parse_args(argv)

    text = build_base_tokenizer_json().encode("utf-8")
    if args.check:
        same = args.output.exists() and args.output.read_bytes() == text
        if not same:
            import tokenizers
            print("%s differs from what tokenizers %s builds" % (args.output, tokenizers.__version__),
                  file=sys.stderr)
        return 0 if same else 1
    args.output.write_bytes(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
