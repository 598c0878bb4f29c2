"""Forced-choice intelligibility: which of the held-out sentences does each recording say?

pocketsphinx (Debian's pocketsphinx and pocketsphinx-en-us) decodes each recording against a JSGF
grammar whose only sentences are the candidates, so its transcript is one of them. One word said
unlike the dictionary's pronunciation (espeak-ng's "Timbuktu", say) can leave that search with no
path through the grammar and no transcript at all; such a recording is decoded again against a
second grammar, any sequence of the candidates' words, and that transcript is matched to the
candidate nearest to it in word edit distance. A recording counts as correct when its candidate
(alone at its distance) is the sentence it was made from. With the 48 held-out sentences of
tools/voice/corpus.py (each with its own name, verb and number) chance is about 2 %.
Numbers are spelled out for the grammar (79 → seventy nine) and punctuation dropped; every word
of the held-out vocabulary is in the recognizer's dictionary.

Recordings of any rate and format GStreamer reads are converted to 16 kHz mono S16LE with
gst-launch-1.0 (wavparse ! audioconvert ! audioresample) before decoding.

    python3 tools/voice/intelligibility.py CORPUS_DIR/heldout.jsonl WAV_DIR
    python3 tools/voice/intelligibility.py CORPUS_DIR/heldout.jsonl WAV_DIR --model MODEL [--voice V]

reads WAV_DIR/<id>.wav for each sentence, prints each transcript that missed and the accuracy;
--word-error-rate adds a finer measure, the words missed when any sequence of the candidates' words
may be heard (espeak-ng's own reading by the default speaker: 40 %; see word_error_rate).
With --model, the recordings are first made there by Gepard's elements in a real pipeline,

    gepardtextsrc ! gepardlm model=MODEL voice=V ! gepardcodec model=MODEL ! audioconvert
      ! audioresample ! audio/x-raw,format=S16LE,rate=16000,channels=1 ! wavenc ! filesink

one gst-launch-1.0 per sentence, on the CPU, with the plugins of GEPARD_BUILD_DIR (default build/).
V is "default" or a reference clip to clone.

    python3 tools/voice/intelligibility.py CORPUS_DIR/heldout.jsonl WAV_DIR --teacher-forced MODEL

makes them instead without the model's own frames: espeak-ng's reading by the default speaker is
encoded by MODEL/codec.nemo, the LM predicts each frame (argmax) from the true frames before it,
and the codec decodes those predictions (teacher_forced). Passing this alone proves little: a model
that continues the frames before it without reading the text passes too. The share of codes it
predicts right is also given with each recording's frames paired with the next sentence's text;
the difference is what the text is worth to it.

    python3 tools/voice/intelligibility.py CORPUS_DIR/heldout.jsonl WAV_DIR --round-trip CODEC

makes them from espeak-ng's reading encoded and decoded by CODEC (a .nemo or a codec training
checkpoint) alone (round_trip): the most any LM speaking through that codec can reach.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import number_words  # noqa: E402

SOURCE_DIR = Path(__file__).resolve().parents[2]
MODEL_DIR = Path("/usr/share/pocketsphinx/model/en-us")
ACOUSTIC_MODEL = MODEL_DIR / "en-us"
DICTIONARY = MODEL_DIR / "cmudict-en-us.dict"


def spoken_words(text):
    """The words a reader says: lower case, numbers spelled out, hyphens as spaces, no punctuation."""
    text = re.sub(r"\d+", lambda m: " " + number_words(int(m.group())) + " ", text)
    text = text.lower().replace("-", " ")
    return re.findall(r"[a-z']+", text)


def dictionary_words(path=DICTIONARY):
    with open(path, encoding="utf-8", errors="replace") as f:
        return {line.split()[0] for line in f if line.strip()}


def sentence_grammar(sentences):
    """A JSGF grammar whose public rule is exactly the candidate sentences."""
    alternatives = " |\n    ".join(" ".join(spoken_words(s)) for s in sentences)
    return f"#JSGF V1.0;\ngrammar candidates;\npublic <sentence> =\n    {alternatives};\n"


def word_grammar(sentences):
    """A JSGF grammar of any sequence of the candidate sentences' words."""
    words = sorted({w for s in sentences for w in spoken_words(s)})
    alternatives = " |\n    ".join(words)
    return f"#JSGF V1.0;\ngrammar candidates;\npublic <sentence> = (\n    {alternatives}\n)+;\n"


def edit_distance(a, b):
    """Word-level Levenshtein distance."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def nearest(transcript, sentences):
    """Index of the candidate nearest to ``transcript`` (a word list), or None on a tie."""
    distances = [edit_distance(transcript, spoken_words(s)) for s in sentences]
    best = min(distances)
    return distances.index(best) if distances.count(best) == 1 else None


def to_raw_16k(wav, raw):
    """Any recording GStreamer reads → headerless 16 kHz mono S16LE."""
    subprocess.run(["gst-launch-1.0", "-q", "filesrc", f"location={wav}", "!", "decodebin", "!",
                    "audioconvert", "!", "audioresample", "!",
                    "audio/x-raw,format=S16LE,rate=16000,channels=1", "!", "filesink", f"location={raw}"],
                   check=True, capture_output=True)


def recognize(wavs, grammar):
    """{index: transcript words} for each of ``wavs`` that the search ends in ``grammar``."""
    if shutil.which("pocketsphinx_batch") is None or not ACOUSTIC_MODEL.is_dir():
        raise RuntimeError("pocketsphinx_batch and pocketsphinx-en-us are needed: apt-get install pocketsphinx "
                           "pocketsphinx-en-us")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "candidates.jsgf").write_text(grammar, encoding="utf-8")
        for i, wav in enumerate(wavs):
            to_raw_16k(wav, tmp / f"u{i:04d}.raw")
        (tmp / "list.ctl").write_text("".join(f"u{i:04d}\n" for i in range(len(wavs))))
        subprocess.run(["pocketsphinx_batch", "-adcin", "yes", "-cepdir", str(tmp), "-cepext", ".raw",
                        "-samprate", "16000", "-ctl", str(tmp / "list.ctl"),
                        "-jsgf", str(tmp / "candidates.jsgf"), "-hmm", str(ACOUSTIC_MODEL),
                        "-dict", str(DICTIONARY), "-hyp", str(tmp / "out.hyp"), "-logfn", str(tmp / "log")],
                       check=True, capture_output=True)
        transcripts = {}
        for line in (tmp / "out.hyp").read_text().splitlines():
            m = re.match(r"^(.*) \(u(\d+) [-\d]+\)$", line)
            if m and m.group(1).strip():
                transcripts[int(m.group(2))] = m.group(1).split()
    return transcripts


def synthesize(model, sentences, out_dir, voice="default", max_frames=400, build_dir=None, lm_options=()):
    """Each sentence through Gepard's elements into out_dir/NNN.wav (16 kHz mono); the paths.
    lm_options: more gepardlm properties ("temperature=0")."""
    build_dir = Path(build_dir or os.environ.get("GEPARD_BUILD_DIR") or SOURCE_DIR / "build")
    env = dict(os.environ, GST_PLUGIN_PATH=str(build_dir / "gst-plugins"))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    wavs = []
    for i, text in enumerate(sentences):
        wav = out_dir / f"{i:03d}.wav"
        subprocess.run(["gst-launch-1.0", "-q", "gepardtextsrc", f"text={text}", "!",
                        "gepardlm", f"model={model}", "device=cpu", f"voice={voice}", f"max-frames={max_frames}",
                        *lm_options, "!", "gepardcodec", f"model={model}", "!", "audioconvert", "!",
                        "audioresample", "!",
                        "audio/x-raw,format=S16LE,rate=16000,channels=1", "!", "wavenc", "!", "filesink",
                        f"location={wav}"], check=True, capture_output=True, env=env)
        wavs.append(wav)
    return wavs


def read_and_encode(net, text, index, speaker, out_dir):
    """espeak-ng's reading of text by speaker (out_dir/wavs/SPEAKER/readNNN.wav), encoded by the
    codec net: its codes [T, 32]."""
    import numpy as np
    import torch

    import codec
    import speech

    row = speech.synthesize(({"id": f"read{index:03d}", "text": text, "split": "test"}, speaker, out_dir,
                             shutil.which("espeak-ng"), None))
    samples, _ = speech.read_wav(Path(out_dir) / row["path"])
    audio = codec.pad_to_frames(torch.from_numpy(samples.astype(np.float32) / 32768.0))[None]
    with torch.no_grad():
        return net.encode(audio)[0].T


def write_decoded(net, codes, wav):
    """codes [T, 32] decoded by the codec net into wav (22.05 kHz, 16-bit)."""
    import numpy as np
    import torch

    import speech

    with torch.no_grad():
        pcm = net.decode(codes.T[None])[0].numpy()
    speech.write_wav(wav, np.clip(pcm * 32768.0, -32768, 32767).astype(np.int16))
    return wav


def teacher_forced(model, sentences, out_dir, speaker=None):
    """Each sentence read by espeak-ng (speaker: speech.TRAIN_SPEAKERS[0]), encoded by
    model/codec.nemo; the frames the LM predicts (argmax) from the true frames before each, decoded
    into out_dir/NNN.wav (22.05 kHz). → (paths, share of predicted codes equal to the true ones,
    the same share when the LM is given the next sentence's text instead: what the text is worth)."""
    import torch
    from tokenizers import Tokenizer

    import codec
    import lm
    import speech

    speaker = speaker or speech.TRAIN_SPEAKERS[0]
    out_dir = Path(out_dir)
    (out_dir / "wavs" / speaker[0]).mkdir(parents=True, exist_ok=True)
    net = codec.load_codec(str(Path(model) / "codec.nemo"))
    voice, special, tokenizer_path = lm.load_for_inference(model, torch.device("cpu"))
    tokenizer = Tokenizer.from_file(str(tokenizer_path))

    def predicted(text, codes):
        ids = lm.text_layout(tokenizer.encode(text, add_special_tokens=False).ids, special)
        logits, _ = lm.forced_outputs(voice, ids, None, codes[:-1])
        return logits.argmax(-1)  # head_logits leaves each channel's invalid levels at −1e9

    wavs, agree, agree_other, total = [], 0, 0, 0
    for i, text in enumerate(sentences):
        codes = read_and_encode(net, text, i, speaker, out_dir)
        with torch.no_grad():
            own = predicted(text, codes)
            other = predicted(sentences[(i + 1) % len(sentences)], codes)
        agree, total = agree + int((own == codes).sum()), total + codes.numel()
        agree_other += int((other == codes).sum())
        wavs.append(write_decoded(net, own, out_dir / f"{i:03d}.wav"))
    return wavs, agree / max(total, 1), agree_other / max(total, 1)


def round_trip(codec_path, sentences, out_dir, speaker=None):
    """Each sentence read by espeak-ng (speaker: speech.TRAIN_SPEAKERS[0]), encoded and decoded by
    the codec at codec_path (.nemo or a training checkpoint) into out_dir/NNN.wav: what the codec
    alone leaves of the words, the most any LM speaking through it can reach. → paths"""
    import codec
    import speech

    speaker = speaker or speech.TRAIN_SPEAKERS[0]
    out_dir = Path(out_dir)
    (out_dir / "wavs" / speaker[0]).mkdir(parents=True, exist_ok=True)
    net = codec.load_codec(str(codec_path))
    return [write_decoded(net, read_and_encode(net, text, i, speaker, out_dir), out_dir / f"{i:03d}.wav")
            for i, text in enumerate(sentences)]


def score(wavs, sentences):
    """(correct, misses): misses lists (sentence, transcript) of the recordings not identified.
    wavs[i] is a recording of sentences[i]; one with no transcript, or a tie, counts as missed."""
    transcripts = recognize(wavs, sentence_grammar(sentences))
    unmatched = [i for i in range(len(wavs)) if i not in transcripts]
    if unmatched:
        again = recognize([wavs[i] for i in unmatched], word_grammar(sentences))
        transcripts.update({unmatched[k]: words for k, words in again.items()})
    misses = []
    for i, sentence in enumerate(sentences):
        heard = transcripts.get(i, [])
        if nearest(heard, sentences) != i:
            misses.append((sentence, " ".join(heard)))
    return len(sentences) - len(misses), misses


def word_error_rate(wavs, sentences):
    """The share of the sentences' words that pocketsphinx gets wrong when it may hear any sequence
    of the candidates' words (word_grammar; word edit distance over the words of all): finer than
    score's forced choice, which a blurred reading still passes while it is nearer its own sentence
    than any other. A recording with no transcript counts all its words wrong."""
    transcripts = recognize(wavs, word_grammar(sentences))
    errors = words = 0
    for i, sentence in enumerate(sentences):
        said = spoken_words(sentence)
        errors += edit_distance(transcripts.get(i, []), said)
        words += len(said)
    return errors / words


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("heldout", help="heldout.jsonl of tools/voice/corpus.py")
    p.add_argument("wav_dir", help="folder of <id>.wav recordings (written there with --model)")
    p.add_argument("--model", help="synthesize the recordings first with this GEPARD model directory")
    p.add_argument("--voice", default="default", help="with --model: default, or a reference clip to clone")
    p.add_argument("--teacher-forced", metavar="MODEL",
                   help="make the recordings from MODEL's predictions of espeak-ng's frames (see above)")
    p.add_argument("--round-trip", metavar="CODEC",
                   help="make the recordings by encoding and decoding espeak-ng's reading with CODEC")
    p.add_argument("--lm-option", action="append", default=[], metavar="NAME=VALUE",
                   help="with --model: a gepardlm property, e.g. temperature=0 (repeatable)")
    p.add_argument("--word-error-rate", action="store_true",
                   help="also decode without the sentences' grammar and give the word error rate (see word_error_rate)")
    args = p.parse_args(argv)
    rows = [json.loads(line) for line in open(args.heldout, encoding="utf-8") if line.strip()]
    if args.model:
        made = synthesize(args.model, [r["text"] for r in rows], args.wav_dir, args.voice,
                          lm_options=args.lm_option)
    elif args.round_trip:
        made = round_trip(args.round_trip, [r["text"] for r in rows], args.wav_dir)
    elif args.teacher_forced:
        made, agree, agree_other = teacher_forced(args.teacher_forced, [r["text"] for r in rows], args.wav_dir)
        print(f"teacher forced: {100.0 * agree:.1f} % of the predicted codes are espeak-ng's "
              f"({100.0 * agree_other:.1f} % given the next sentence's text instead)")
    if args.model or args.teacher_forced or args.round_trip:
        for r, wav in zip(rows, made):
            wav.rename(Path(args.wav_dir) / f"{r['id']}.wav")
    wavs = [Path(args.wav_dir) / f"{r['id']}.wav" for r in rows]
    correct, misses = score(wavs, [r["text"] for r in rows])
    for sentence, heard in misses:
        print(f"missed: {sentence!r} heard as {heard!r}")
    print(f"intelligibility: {correct} of {len(rows)} identified ({100.0 * correct / len(rows):.1f} %)")
    if args.word_error_rate:
        print(f"word error rate: {100.0 * word_error_rate(wavs, [r['text'] for r in rows]):.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
