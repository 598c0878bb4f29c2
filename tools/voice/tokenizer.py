#!/usr/bin/env python3
"""Trains the default voice's tokenizer: a byte-level BPE on the corpus text, in Qwen3.5's layout.

The layout is exactly that of tools/make-base-tokenizer.py (gepard-model.md §4: NFC normalizer,
Split(regex, "isolated") + ByteLevel pre-tokenizer, ByteLevel decoder, no BOS), which this module
imports rather than repeats. The BPE has `--vocab-size` entries, the 256 byte tokens included, and
the 33 Qwen3.5/GEPARD added tokens follow with the next ids (1024…1056 for the default size), so
SOT/EOT/SOS are <tts_text_bos>/<tts_text_eod>/<|audio_start|> at base+29, base+30 and base+26.
lm.py reads those ids from the file; the C tokenizer (gepard-core) loads it like any Qwen3.5
tokenizer.json.

The corpus is CORPUS_DIR/train.jsonl, one {"id", "text"} object a line. Every text is used as
written and in lower case (the way much TTS input arrives). The output is deterministic for a given
corpus and `tokenizers` version.

The default size is small so that the pieces the LM must learn to pronounce are few and frequent:
an LM trained on codes of espeak-ng's speech (log-mel frames of the recipe's speech, not a codec's:
a check that runs on the CPU) read the text with 1024 or 300 entries and ignored it with 4096.
Validation CE after 600 steps (1.97 M parameters, 8000 sentences, 8.8 h, 20 CPU minutes), with
each utterance's own text against another's: 4096 entries 0.933 / 0.932, 1024 0.895 / 0.948,
300 0.871 / 0.919; espeak-ng's phonemes as the text, the most a tokenizer could give, 0.870 / 0.946.

    python3 tools/voice/tokenizer.py CORPUS_DIR --output RUN_DIR/tokenizer.json [--vocab-size 1024]
"""

import argparse
import importlib.util
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_VOCAB_SIZE = 1024
# ids of the GEPARD roles among the added tokens (gepard-model.md §4: 248070, 248073, 248074, 248076
# counted from 248044), and of the backbone config's eos/pad ids
SPECIAL_ROLES = {
    "start_of_speech": "<|audio_start|>",
    "end_of_speech": "<|audio_end|>",
    "start_of_text": "<tts_text_bos>",
    "end_of_text": "<tts_text_eod>",
    "tts_pad": "<|audio_pad|>",
    "im_end": "<|im_end|>",
    "endoftext": "<|endoftext|>",
}


def load_base_tokenizer_module():
    """tools/make-base-tokenizer.py as a module (its file name is not an identifier)."""
    path = REPO / "tools" / "make-base-tokenizer.py"
    spec = importlib.util.spec_from_file_location("make_base_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpus_texts(corpus_dir):
    """The texts of CORPUS_DIR/train.jsonl, in file order."""
    texts = []
    with open(pathlib.Path(corpus_dir) / "train.jsonl", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            record = json.loads(line)
            if not isinstance(record.get("text"), str):
                raise SystemExit(f"{corpus_dir}/train.jsonl line {n}: no \"text\" string")
            texts.append(record["text"])
    if not texts:
        raise SystemExit(f"{corpus_dir}/train.jsonl has no texts")
    return texts


def train_tokenizer(texts, vocab_size=DEFAULT_VOCAB_SIZE):
    """A `tokenizers.Tokenizer` in Qwen3.5's layout trained on texts (and their lower-case forms).

    A corpus too small for vocab_size merges gives a smaller BPE; the added tokens still follow it
    directly."""
    mbt = load_base_tokenizer_module()
    lines = list(texts) + [t.lower() for t in texts]
    return mbt.train_qwen35_layout(lines, vocab_size)


def special_ids(tokenizer_json):
    """{role: id} for the GEPARD roles and "tokeniser_length", from a tokenizer.json dict."""
    added = {t["content"]: t["id"] for t in tokenizer_json["added_tokens"]}
    missing = [c for c in SPECIAL_ROLES.values() if c not in added]
    if missing:
        raise ValueError(f"tokenizer.json lacks the GEPARD special tokens {missing}")
    ids = {role: added[content] for role, content in SPECIAL_ROLES.items()}
    n_ids = max(max(added.values()), max(tokenizer_json["model"]["vocab"].values())) + 1
    ids["tokeniser_length"] = n_ids
    return ids


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus_dir", type=pathlib.Path, help="directory holding train.jsonl")
    parser.add_argument("--output", type=pathlib.Path, required=True, help="tokenizer.json to write")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help="BPE entries, the 256 byte tokens included (default %(default)s)")
    args = parser.parse_args(argv)

    texts = corpus_texts(args.corpus_dir)
    tokenizer = train_tokenizer(texts, args.vocab_size)
    text = tokenizer.to_str(pretty=True) + "\n"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text, encoding="utf-8")

    base = tokenizer.get_vocab_size(with_added_tokens=False)
    ids = special_ids(json.loads(text))
    n_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
    print(f"{args.output}: {base} BPE entries + 33 added tokens ({ids['tokeniser_length']} ids); "
          f"{len(texts)} texts, {n_tokens} tokens, {n_tokens / len(texts):.1f} tokens per text")
    if base < args.vocab_size:
        print(f"note: the corpus gave only {base} of {args.vocab_size} BPE entries", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
