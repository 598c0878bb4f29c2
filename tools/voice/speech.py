"""Speech for the default voice: the corpus read by espeak-ng in several voices.

Each training sentence is read by one of the training speakers, assigned by a seeded shuffle: the
first speaker, the default voice (espeak-ng en-us+f2), reads 30 % of the sentences (--default-share),
the others share the rest equally. One more speaker is held out of training: it reads the
held-out sentences and a few train sentences, as references for a voice-cloning test and as
unseen-speaker audio for the codec's evaluation. A speaker is an espeak-ng voice (+ variant) with
a fixed pitch and speed.

espeak-ng writes 16-bit mono WAV at 22050 Hz, the codec's rate. Leading and trailing silence is
trimmed to at most 0.15 s. Synthesis runs in parallel on all cores (one espeak-ng process per
utterance).

Outputs under DATA/speech/:

    index.jsonl       {"id", "speaker", "text", "path", "samples", "split"} per utterance;
                      path is relative to DATA/speech, split is "train" or "heldout_speaker"
    wavs/SPEAKER/ID.wav
    speakers.json     the speaker table used

Run (CORPUS_DIR from tools/voice/corpus.py):

    python3 tools/voice/speech.py CORPUS_DIR DATA [--espeak-data PATH] [--limit N] [--jobs N]

On the GPU host espeak-ng comes from tools/voice/espeak-prefix.sh:

    eval "$(tools/voice/espeak-prefix.sh env)"      # sets PATH, LD_LIBRARY_PATH, ESPEAK_DATA_PATH
    python3 tools/voice/speech.py CORPUS_DIR DATA --espeak-data "$ESPEAK_DATA_PATH"

--limit N synthesizes only the first N train sentences (and N // 8 + 1 held-out ones), for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import wave
from multiprocessing import Pool
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from corpus import read_jsonl  # noqa: E402

SAMPLE_RATE = 22050
MAX_EDGE_SILENCE = int(0.15 * SAMPLE_RATE)
SILENCE_LEVEL = 64  # |sample| at or below this (16-bit) counts as silence

# name, espeak-ng voice, pitch (0-99, default 50), speed (words per minute, default 175)
# the first is the default voice: of these, the one pocketsphinx-en-us identifies best in the
# intelligibility test (espeak-ng's own reading: 48 of 48 held-out sentences, "us" 38 of 48)
TRAIN_SPEAKERS = [
    ("us_f2", "en-us+f2", 56, 165),
    ("us", "en-us", 50, 170),
    ("gb", "en", 45, 160),
    ("rp", "en-gb-x-rp", 50, 175),
    ("caribbean", "en-029", 54, 160),
    ("scotland", "en-gb-scotland", 42, 170),
    ("gb_m3", "en+m3", 36, 155),
    ("us_f4", "en-us+f4", 62, 178),
    ("lancaster", "en-gb-x-gbclan", 48, 165),
    ("midlands_f3", "en-gb-x-gbcwmd+f3", 58, 168),
    # more voices, so that cloning generalizes to one it never heard: every English accent with
    # more of espeak-ng's variants (none of them f5, the held-out speaker's)
    ("us_m1", "en-us+m1", 44, 165),
    ("gb_f1", "en+f1", 60, 170),
    ("rp_m2", "en-gb-x-rp+m2", 40, 168),
    ("caribbean_f3", "en-029+f3", 58, 172),
    ("scotland_f4", "en-gb-scotland+f4", 60, 160),
    ("us_m4", "en-us+m4", 38, 180),
    ("gb_m6", "en+m6", 46, 158),
    ("midlands_m5", "en-gb-x-gbcwmd+m5", 42, 172),
    ("us_klatt", "en-us+klatt", 50, 165),
    ("gb_klatt3", "en+klatt3", 54, 170),
    ("us_annie", "en-us+Annie", 64, 168),
    ("gb_belinda", "en+belinda", 56, 162),
    ("lancaster_f1", "en-gb-x-gbclan+f1", 62, 175),
    ("nyc_m7", "en-us-nyc+m7", 48, 185),
]
DEFAULT_SPEAKER_SHARE = 0.3  # of the train sentences, read by TRAIN_SPEAKERS[0], the default voice
HELDOUT_SPEAKER = ("rp_f5", "en-gb-x-rp+f5", 60, 162)
HELDOUT_SPEAKER_TRAIN_SENTENCES = 100


def espeak_command(espeak, voice, pitch, speed, wav_path, espeak_data=None):
    cmd = [espeak]
    if espeak_data:
        cmd.append(f"--path={espeak_data}")
    return cmd + ["-v", voice, "-p", str(pitch), "-s", str(speed), "-w", str(wav_path), "--stdin"]


def read_wav(path):
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: not 16-bit mono")
        rate = w.getframerate()
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return data, rate


def write_wav(path, samples, rate=SAMPLE_RATE):
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.ascontiguousarray(samples, dtype="<i2").tobytes())


def trim_silence(samples):
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > SILENCE_LEVEL)
    if loud.size == 0:
        return samples[:0]
    start = max(0, loud[0] - MAX_EDGE_SILENCE)
    end = min(samples.size, loud[-1] + 1 + MAX_EDGE_SILENCE)
    return samples[start:end]


def synthesize(job):
    """One utterance: espeak-ng → trimmed 16-bit wav. Returns the index row, or None on failure."""
    row, speaker, out_dir, espeak, espeak_data = job
    name, voice, pitch, speed = speaker
    rel = Path("wavs") / name / f"{row['id']}.wav"
    path = out_dir / rel
    cmd = espeak_command(espeak, voice, pitch, speed, path, espeak_data)
    result = subprocess.run(cmd, input=row["text"], capture_output=True, text=True)
    if result.returncode != 0 or not path.exists():
        print(f"speech: espeak-ng failed for {row['id']}: {result.stderr.strip()}", file=sys.stderr)
        return None
    samples, rate = read_wav(path)
    if rate != SAMPLE_RATE:
        raise ValueError(f"espeak-ng wrote {rate} Hz, expected {SAMPLE_RATE}")
    samples = trim_silence(samples)
    if samples.size < SAMPLE_RATE // 4:
        path.unlink()
        return None
    write_wav(path, samples)
    return {"id": f"{name}-{row['id']}", "speaker": name, "text": row["text"], "path": str(rel),
            "samples": int(samples.size), "split": row["split"]}


def plan(train, heldout, seed=1, limit=None, default_share=DEFAULT_SPEAKER_SHARE):
    """[(row with split, speaker)] for all utterances, deterministic for a seed."""
    rng = random.Random(seed)
    if limit is not None:
        train = train[:limit]
        heldout = heldout[: limit // 8 + 1]
    order = list(range(len(train)))
    rng.shuffle(order)
    default_count = round(default_share * len(train))
    others = TRAIN_SPEAKERS[1:]
    jobs = []
    for rank, i in enumerate(order):
        speaker = TRAIN_SPEAKERS[0] if rank < default_count else others[(rank - default_count) % len(others)]
        jobs.append(({**train[i], "split": "train"}, speaker))
    for row in heldout:
        jobs.append(({**row, "split": "heldout_speaker"}, HELDOUT_SPEAKER))
    for row in train[:min(len(train), HELDOUT_SPEAKER_TRAIN_SENTENCES if limit is None else limit // 8 + 1)]:
        jobs.append(({**row, "split": "heldout_speaker"}, HELDOUT_SPEAKER))
    jobs.sort(key=lambda j: (j[0]["split"], j[1][0], j[0]["id"]))
    return jobs


def find_espeak():
    found = shutil.which("espeak-ng")
    if not found:
        raise SystemExit("speech: espeak-ng not found (install it, or eval \"$(tools/voice/espeak-prefix.sh env)\")")
    return found


def synthesize_corpus(corpus_dir, data_dir, espeak_data=None, limit=None, jobs=None, seed=1,
                      default_share=DEFAULT_SPEAKER_SHARE):
    """Synthesize CORPUS_DIR into DATA/speech; returns the index rows."""
    corpus_dir, data_dir = Path(corpus_dir), Path(data_dir)
    train = read_jsonl(corpus_dir / "train.jsonl")
    heldout = read_jsonl(corpus_dir / "heldout.jsonl")
    out_dir = data_dir / "speech"
    for speaker in TRAIN_SPEAKERS + [HELDOUT_SPEAKER]:
        (out_dir / "wavs" / speaker[0]).mkdir(parents=True, exist_ok=True)
    espeak = find_espeak()
    work = [(row, speaker, out_dir, espeak, espeak_data)
            for row, speaker in plan(train, heldout, seed, limit, default_share)]
    processes = jobs or os.cpu_count() or 1
    with Pool(processes) as pool:
        rows = [r for r in pool.imap(synthesize, work, chunksize=16) if r is not None]
    with open(out_dir / "index.jsonl", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")
    speakers = [{"name": n, "voice": v, "pitch": p, "speed": s, "default": (n, v, p, s) == TRAIN_SPEAKERS[0],
                 "heldout": (n, v, p, s) == HELDOUT_SPEAKER}
                for n, v, p, s in TRAIN_SPEAKERS + [HELDOUT_SPEAKER]]
    (out_dir / "speakers.json").write_text(json.dumps(speakers, indent=1) + "\n")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus_dir", type=Path)
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--espeak-data", default=os.environ.get("ESPEAK_DATA_PATH"),
                        help="espeak-ng-data directory (default: $ESPEAK_DATA_PATH, else espeak's own)")
    parser.add_argument("--limit", type=int, help="synthesize only the first N train sentences")
    parser.add_argument("--jobs", type=int, help="parallel espeak-ng processes (default: all cores)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--default-share", type=float, default=DEFAULT_SPEAKER_SHARE,
                        help="fraction of the train sentences read by the default voice (default 0.3)")
    args = parser.parse_args(argv)

    rows = synthesize_corpus(args.corpus_dir, args.data_dir, args.espeak_data, args.limit, args.jobs, args.seed,
                             args.default_share)
    seconds = sum(r["samples"] for r in rows) / SAMPLE_RATE
    held = sum(1 for r in rows if r["split"] == "heldout_speaker")
    print(f"speech: {len(rows)} utterances ({held} by the held-out speaker), {seconds / 3600:.2f} h "
          f"→ {args.data_dir / 'speech'}")


if __name__ == "__main__":
    main()
