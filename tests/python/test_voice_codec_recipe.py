"""The default voice's data and codec recipe: tools/voice/corpus.py, speech.py and codec.py.

Fast checks on the CPU with a tiny codec (decoder base 64, encoder base 2) and a handful of
sentences read by espeak-ng (a Debian package, installed by scripts/lib.sh):

* the corpus is deterministic for a seed, has at least 40 held-out sentences, none of them in
  train, each with its own name, and no train sentence uses a held-out name, verb or place;
* the codec's state dict at the published width has exactly the names, shapes, dtypes and order
  of tests/data/nanocodec-tensors.txt (nanocodec.md Appendix A);
* a few training steps reduce the loss on fixed segments, and a checkpoint resumes;
* the exported .nemo loads in the C codec (gepard-codec-tool from $GEPARD_BUILD_DIR/tools,
  default <repo>/build): C decode = torch decode within max |Δ| ≤ 2⁻¹⁵ (one 16-bit PCM step; both
  are fp32, measured ~1e-7), streamed in chunks of 3 frames too; C encode gives torch's codes
  except where a value lies within 1e-4 of an FSQ rounding boundary;
* encode writes codes.pt in the documented format, and its codes are the model's codes.
"""

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR") or HERE.parents[1])
BUILD_DIR = Path(os.environ.get("GEPARD_BUILD_DIR") or SOURCE_DIR / "build")
CODEC_TOOL = BUILD_DIR / "tools" / "gepard-codec-tool"
TENSOR_LIST = SOURCE_DIR / "tests" / "data" / "nanocodec-tensors.txt"

sys.path.insert(0, str(SOURCE_DIR / "tools" / "voice"))
import codec  # noqa: E402
import corpus  # noqa: E402
import speech  # noqa: E402

TINY = {"decoder_channels": 64, "encoder_channels": 2}
DECODE_MAX_ABS = 2.0 ** -15
FSQ_MARGIN = 1e-4


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machines running this are small and shared
    yield
    torch.set_num_threads(threads)


# ---- corpus ----------------------------------------------------------------------------------------


def test_corpus_is_deterministic_and_heldout_is_disjoint():
    first = corpus.build_corpus(seed=5, size=3000, heldout_count=48)
    second = corpus.build_corpus(seed=5, size=3000, heldout_count=48)
    assert first == second
    other = corpus.build_corpus(seed=6, size=3000, heldout_count=48)
    assert other != first

    train, heldout = first
    assert len(train) == 3000
    assert len({r["id"] for r in train}) == len(train)
    assert len({r["text"] for r in train}) == len(train)
    assert len(heldout) >= 40
    train_texts = {r["text"] for r in train}
    assert not train_texts & {r["text"] for r in heldout}
    # every held-out sentence names its own person and no train sentence uses held-out words
    names = [next(w for w in r["text"].replace(",", " ").split() if w in corpus.HELDOUT_NAMES) for r in heldout]
    assert len(set(names)) == len(heldout)
    assert not any(corpus.mentions_heldout(t) for t in train_texts)
    for r in train:
        words = r["text"].split()
        assert corpus.MIN_WORDS <= len(words) <= 40 and r["text"].isascii()


def test_word_lists_read_the_dictionary_without_held_out_words(tmp_path):
    """A quarter of the corpus are lists of dictionary words: only plain words (no possessives,
    capitals inside or held-out and blocked words), deterministic; none without a dictionary. The
    generated sentences fill their slots from the same words."""
    words = ["ladle", "remnant", "Jamaica", "bequeath", "Percival", "sharpened", "damn", "ladle's",
             "McDonald", "AC", "urbanity", "tongs", "fetal", "egging"]
    path = tmp_path / "words"
    path.write_text("\n".join(words) + "\n")
    assert corpus.dictionary_words(path) == sorted(["ladle", "remnant", "Jamaica", "bequeath", "urbanity",
                                                    "tongs", "fetal", "egging"])
    train, _ = corpus.build_corpus(seed=3, size=400, words_file=path)
    assert train == corpus.build_corpus(seed=3, size=400, words_file=path)[0]
    lists = [r["text"] for r in train if r["id"].startswith("w")]
    assert 90 <= len(lists) <= 100 and len(train) == 400
    allowed = {w.lower() for w in corpus.dictionary_words(path)}
    for text in lists:
        said = text.rstrip(".").replace(",", "").replace(" and ", " ").split()
        assert 4 <= len(said) <= 8 and {w.lower() for w in said} <= allowed and text[0].isupper()
    # the generated sentences' names, places and objects come from the dictionary too, never a
    # held-out or blocked word of it
    train, _ = corpus.build_corpus(seed=3, size=400, fortunes_dir=tmp_path / "none", words_file=path)
    generated = [r["text"] for r in train if r["id"].startswith("g")]
    assert len(generated) == 300 and any("Jamaica" in t for t in generated) and any(" tongs " in t for t in generated)
    assert not any(corpus.mentions_heldout(t) or corpus.is_blocked(t) for t in generated)
    train, _ = corpus.build_corpus(seed=3, size=400, words_file=tmp_path / "none")
    assert not any(r["id"].startswith("w") for r in train) and len(train) == 400


def test_composed_sentences_put_numbers_in_many_frames():
    """Half the generated sentences are composed from parts (opening, subject, adverb, verb,
    quantity, adjective, objects, ending) in a few clause shapes, with the dictionary's words; none
    holds a held-out template's frame."""
    words = corpus.SlotWords(["Jamaica", "remnants", "ladled", "famous", "gladly"])
    rng = random.Random(4)
    texts = [corpus.composed_sentence(rng, words) for _ in range(400)]
    assert len(set(texts)) > 390
    for text in texts:
        assert (text[0].isupper() or text[0].isdigit()) and text[-1] in ".?" and "  " not in text
        assert corpus.MIN_WORDS <= len(text.split()) <= corpus.MAX_WORDS
    assert all(word in " ".join(texts) for word in ("Jamaica", "remnants", "ladled", "famous", "gladly"))
    assert len({text.split(",")[0] for text in texts if ", " in text}) > 30  # openings
    train, _ = corpus.build_corpus(seed=5, size=3000, fortunes_dir=None)
    generated = [r["text"] for r in train if r["id"].startswith("g")]
    assert len(generated) >= 2000
    assert not any(frame in text.lower() for text in generated for frame in corpus.HELDOUT_FRAMES)
    assert sum(text.startswith("Had ") for text in generated) > 0.03 * len(generated)


def test_fortune_sentences_are_cleaned():
    if not Path(corpus.DEFAULT_FORTUNES_DIR).is_dir():
        pytest.skip("fortunes are not installed")
    train, _ = corpus.build_corpus(seed=1, size=2000)
    fortunes = [r["text"] for r in train if r["id"].startswith("f")]
    assert len(fortunes) > 500
    for text in fortunes:
        assert corpus.clean_sentence(text) == text
        assert not corpus.is_blocked(text)


# ---- speech ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    root = tmp_path_factory.mktemp("voice")
    train, heldout = corpus.build_corpus(seed=2, size=200, heldout_count=40)
    corpus_dir = root / "corpus"
    corpus_dir.mkdir()
    corpus.write_jsonl(corpus_dir / "train.jsonl", train)
    corpus.write_jsonl(corpus_dir / "heldout.jsonl", heldout)
    # enough sentences that every train speaker reads one beside the default speaker's share
    rows = speech.synthesize_corpus(corpus_dir, root / "data", limit=34, jobs=2)
    assert len(rows) >= 34
    return root / "data"


def test_speech_index_and_wavs(data_dir):
    rows = codec.read_index(data_dir)
    speakers = {r["speaker"] for r in rows if r["split"] == "train"}
    assert len(speakers) == len(speech.TRAIN_SPEAKERS)
    per_speaker = [sum(1 for r in rows if r["speaker"] == s[0]) for s in speech.TRAIN_SPEAKERS]
    assert per_speaker[0] == round(speech.DEFAULT_SPEAKER_SHARE * 34) == max(per_speaker)
    held = [r for r in rows if r["split"] == "heldout_speaker"]
    assert held and {r["speaker"] for r in held} == {speech.HELDOUT_SPEAKER[0]}
    assert not speakers & {speech.HELDOUT_SPEAKER[0]}
    for r in rows:
        samples = codec.read_wav_int16(data_dir / "speech" / r["path"])
        assert samples.size == r["samples"] > speech.SAMPLE_RATE // 4
        assert np.abs(samples.astype(np.int32)).max() > 1000


# ---- codec -----------------------------------------------------------------------------------------


def test_state_dict_matches_published_layout():
    expected = []
    for line in TENSOR_LIST.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, shape, dtype = line.split()
            expected.append((name, tuple(int(s) for s in shape.split(",")), dtype))
    model = codec.NanoCodec(decoder_channels=864, encoder_channels=24)
    got = [(k, tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in model.state_dict().items()]
    assert got == expected


def test_data_dependent_start_gives_the_codes_something_to_say(data_dir):
    """initialize_from_data: with torch's default init the narrow encoder's latent is nearly
    constant over time, so every frame gets the same code; after it the codes vary and the
    decoder's output is as loud as the audio, without an offset."""
    segments = fixed_segments(data_dir, frames=16)
    torch.manual_seed(0)
    model = codec.NanoCodec(**TINY)
    assert codec.codes_used(model, segments) < 1.5
    codec.initialize_from_data(model, segments)
    assert codec.codes_used(model, segments) > 3.0
    with torch.no_grad():
        y, _ = model(segments)
    ratio = float(y.std()) / float(segments.std())
    print(f"\ncodes used {codec.codes_used(model, segments):.2f}, output/audio deviation {ratio:.3f}")
    assert 0.5 < ratio < 2.0 and abs(float(y.mean())) < 0.1 * float(segments.std())


def test_latent_bound_loss_only_beyond_the_bound():
    quantizer = codec.GroupFSQ()
    inside = torch.zeros(1, 32, 4) - quantizer.shift
    assert float(codec.latent_bound_loss(quantizer, inside + 1.9, 2.0)) == 0.0
    outside = inside + 3.0
    assert float(codec.latent_bound_loss(quantizer, outside, 2.0)) == pytest.approx(1.0)


def fixed_segments(data_dir, frames=8, count=4):
    rows = codec.read_index(data_dir, "train")[:count]
    out = []
    for r in rows:
        x = codec.read_wav_int16(data_dir / "speech" / r["path"]).astype(np.float32) / 32768.0
        out.append(x[: frames * codec.SAMPLES_PER_FRAME])
    return torch.from_numpy(np.stack(out))


def segment_loss(ckpt, segments):
    model = codec.load_codec(ckpt)
    with torch.no_grad():
        y, _ = model(segments)
        losses = codec.SpectralLoss()(y, segments)
    return float(losses["sc"] + losses["logmag"] + losses["mel"])


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory):
    """(initial checkpoint, trained checkpoint) of a tiny codec."""
    work = tmp_path_factory.mktemp("codec")
    common = ["--batch", "4", "--min-frames", "6", "--max-frames", "8", "--lr", "3e-3", "--warmup", "2",
              "--decoder-channels", str(TINY["decoder_channels"]),
              "--encoder-channels", str(TINY["encoder_channels"]), "--device", "cpu", "--log-every", "10"]
    ckpt = work / "codec.pt"
    codec.main(["train", str(data_dir), "--ckpt", str(ckpt), "--steps", "0"] + common)
    initial = work / "initial.pt"
    shutil.copy(ckpt, initial)
    codec.main(["train", str(data_dir), "--ckpt", str(ckpt), "--resume", "--steps", "10"] + common)
    codec.main(["train", str(data_dir), "--ckpt", str(ckpt), "--resume", "--steps", "20"] + common)
    return initial, ckpt


def test_training_reduces_loss_and_resumes(data_dir, trained):
    initial, ckpt = trained
    segments = fixed_segments(data_dir)
    before, after = segment_loss(initial, segments), segment_loss(ckpt, segments)
    print(f"\nloss on fixed segments: {before:.3f} before, {after:.3f} after 20 steps")
    assert after < 0.9 * before
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["step"] == 20 and state["widths"] == TINY
    assert all(m is not None and m.dtype == torch.bfloat16 for m in state["exp_avg"])


def test_frozen_encoder_keeps_the_codes(data_dir, trained, tmp_path):
    """--freeze-encoder-after: the decoder trains on, the encoder (hence every code) stays as it was."""
    _, ckpt = trained
    frozen = tmp_path / "frozen.pt"
    shutil.copy(ckpt, frozen)
    codec.main(["train", str(data_dir), "--ckpt", str(frozen), "--resume", "--steps", "24",
                "--freeze-encoder-after", "0", "--batch", "2", "--device", "cpu"])
    before = torch.load(ckpt, map_location="cpu", weights_only=True)
    after = torch.load(frozen, map_location="cpu", weights_only=True)
    assert after["step"] == 24 and after["freeze_encoder_after"] == 0
    encoder = [k for k in before["model"] if k.startswith("audio_encoder.")]
    decoder = [k for k in before["model"] if k.startswith("audio_decoder.")]
    assert encoder and all(torch.equal(before["model"][k], after["model"][k]) for k in encoder)
    assert any(not torch.equal(before["model"][k], after["model"][k]) for k in decoder)


def test_decoder_trains_on_the_encoders_codes(data_dir, trained, tmp_path):
    """--codes: with the encoder frozen, the decoder learns from the encoder's codes of whole
    utterances, each segment's codes the frames its audio spans; no encoder moments are kept."""
    _, ckpt = trained
    codes = tmp_path / "codes.pt"
    codec.main(["encode", str(ckpt), str(data_dir), "--out", str(codes), "--device", "cpu"])

    rows = codec.read_index(data_dir, "train")
    audio, offsets, lengths = codec.load_audio(data_dir, rows)
    segments = codec.SegmentSampler(audio, offsets, lengths, "cpu", seed=0)
    sampler = codec.CodeSegmentSampler(codes, segments, rows, 32, seed=3)
    segment_codes, x = sampler.sample(4)
    assert segment_codes.shape == (4, 32, 32) and x.shape == (4, 32 * codec.SAMPLES_PER_FRAME)
    by_id = {u["id"]: u["codes"] for u in torch.load(codes, weights_only=False)["utterances"]}
    frame = codec.SAMPLES_PER_FRAME
    for b in range(4):  # each segment is some utterance's frames s … s+31 and their audio
        found = [(r["id"], s) for r, o, n in zip(rows, offsets, lengths)
                 for s in range(max(0, -(-int(n) // frame) - 31))
                 if np.array_equal(audio[o + s * frame: o + min(int(n), (s + 32) * frame)],
                                   (x[b, : min(int(n) - s * frame, 32 * frame)] * 32768).round().numpy())]
        assert len(found) == 1
        uid, s = found[0]
        assert torch.equal(segment_codes[b].T, by_id[uid][s: s + 32].long())
    model = codec.load_codec(ckpt)
    alone = model.encode(x)  # the encoder sees only the segment: its edges differ
    assert (segment_codes[:, :, 12:20] == alone[:, :, 12:20]).float().mean() > 0.95

    decoder_run = tmp_path / "decoder.pt"
    shutil.copy(ckpt, decoder_run)
    codec.main(["train", str(data_dir), "--ckpt", str(decoder_run), "--resume", "--steps", "24",
                "--freeze-encoder-after", "0", "--codes", str(codes), "--batch", "2", "--min-frames", "6",
                "--max-frames", "6", "--device", "cpu"])
    before = torch.load(ckpt, map_location="cpu", weights_only=True)
    after = torch.load(decoder_run, map_location="cpu", weights_only=True)
    names = list(before["model"])
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in names if k.startswith("audio_encoder."))
    assert any(not torch.equal(before["model"][k], after["model"][k]) for k in names if k.startswith("audio_decoder."))
    params = [n for n, _ in codec.NanoCodec(**after["widths"]).named_parameters()]
    moments = dict(zip(params, after["exp_avg"]))
    assert all((moments[n] is None) == n.startswith("audio_encoder.") for n in params)


def exported_and_encoded(trained, data_dir, tmp_path):
    """The trained codec exported (tmp_path/codec.nemo) and its codes of the data (tmp_path/codes.pt)."""
    _, ckpt = trained
    nemo, codes = tmp_path / "codec.nemo", tmp_path / "codes.pt"
    codec.main(["export", str(ckpt), str(nemo)])
    codec.main(["encode", str(nemo), str(data_dir), "--out", str(codes), "--device", "cpu"])
    return nemo, codes


def test_decoder_tuned_from_an_exported_codec(data_dir, trained, tmp_path):
    """--init: a new run starts from an exported codec's weights and widths (step 0 is that codec),
    then with the encoder frozen from the start tunes the decoder alone on the codes."""
    nemo, codes = exported_and_encoded(trained, data_dir, tmp_path)
    start, tuned = tmp_path / "start.pt", tmp_path / "tuned.pt"
    common = ["--init", str(nemo), "--freeze-encoder-after", "0", "--codes", str(codes), "--batch", "2",
              "--min-frames", "6", "--max-frames", "6", "--lr", "1e-3", "--warmup", "2", "--device", "cpu"]
    codec.main(["train", str(data_dir), "--ckpt", str(start), "--steps", "0"] + common)
    codec.main(["train", str(data_dir), "--ckpt", str(tuned), "--resume", "--steps", "12"] + common)
    exported = codec.load_codec(nemo).state_dict()
    first = torch.load(start, map_location="cpu", weights_only=True)
    after = torch.load(tuned, map_location="cpu", weights_only=True)
    assert first["widths"] == after["widths"] == TINY
    assert all(torch.equal(first["model"][k], v) for k, v in exported.items())
    assert after["step"] == 12
    names = list(exported)
    assert all(torch.equal(after["model"][k], exported[k]) for k in names if k.startswith("audio_encoder."))
    assert any(not torch.equal(after["model"][k], exported[k]) for k in names if k.startswith("audio_decoder."))
    again = tmp_path / "again.pt"
    codec.main(["encode", str(tuned), str(data_dir), "--out", str(again), "--device", "cpu"])
    old, new = (torch.load(p, weights_only=False)["utterances"] for p in (codes, again))
    assert all(torch.equal(a["codes"], b["codes"]) for a, b in zip(old, new))


def test_new_decoder_on_an_exported_codecs_encoder(data_dir, trained, tmp_path):
    """--init with another --decoder-channels: the codec's encoder and quantizer (so the codes an LM
    learned) under a new decoder of that width, trained alone on the codes and as loud as the audio
    from its first step."""
    nemo, codes = exported_and_encoded(trained, data_dir, tmp_path)
    wider = dict(TINY, decoder_channels=2 * TINY["decoder_channels"])
    start, trained_on = tmp_path / "start.pt", tmp_path / "wide.pt"
    common = ["--init", str(nemo), "--decoder-channels", str(wider["decoder_channels"]), "--freeze-encoder-after",
              "0", "--codes", str(codes), "--batch", "2", "--min-frames", "6", "--max-frames", "6", "--lr", "1e-3",
              "--warmup", "2", "--device", "cpu"]
    codec.main(["train", str(data_dir), "--ckpt", str(start), "--steps", "0"] + common)
    codec.main(["train", str(data_dir), "--ckpt", str(trained_on), "--resume", "--steps", "6"] + common)
    exported = codec.load_codec(nemo).state_dict()
    first = torch.load(start, map_location="cpu", weights_only=True)
    after = torch.load(trained_on, map_location="cpu", weights_only=True)
    assert first["widths"] == after["widths"] == wider and after["step"] == 6
    for k, v in exported.items():
        if not k.startswith("audio_decoder."):
            assert torch.equal(first["model"][k], v) and torch.equal(after["model"][k], v), k
    assert any(not torch.equal(first["model"][k], after["model"][k]) for k in first["model"]
               if k.startswith("audio_decoder."))
    model = codec.NanoCodec(**wider)
    model.load_state_dict(first["model"])
    first_codes = torch.load(codes, weights_only=False)["utterances"][0]["codes"].T[None].long()
    loudness = float(model.decode(first_codes).std())
    assert 0.01 < loudness < 1.0
    again = tmp_path / "again.pt"
    codec.main(["encode", str(trained_on), str(data_dir), "--out", str(again), "--device", "cpu"])
    old, new = (torch.load(p, weights_only=False)["utterances"] for p in (codes, again))
    assert all(torch.equal(a["codes"], b["codes"]) for a, b in zip(old, new))


def test_adversarial_decoder_training_resumes_its_discriminators(data_dir, trained, tmp_path):
    """--adversarial-weight: the decoder trains against HiFi-GAN's discriminators (least squares and
    feature matching, logged with the spectral losses); the checkpoint holds them and their AdamW
    moments, a resumed run takes them back, and the export is the codec alone."""
    nemo, codes = exported_and_encoded(trained, data_dir, tmp_path)
    run = tmp_path / "adversarial.pt"
    common = ["--init", str(nemo), "--freeze-encoder-after", "0", "--codes", str(codes), "--batch", "2",
              "--min-frames", "6", "--max-frames", "6", "--warmup", "2", "--device", "cpu", "--log-every", "1",
              "--adversarial-weight", "1"]
    codec.main(["train", str(data_dir), "--ckpt", str(run), "--resume", "--steps", "3"] + common)
    first = torch.load(run, map_location="cpu", weights_only=True)
    assert first["step"] == 3 and first["discriminators"]
    assert all(m is not None for m in first["discriminators_exp_avg"])
    fresh = codec.Discriminators()
    assert any(not torch.equal(v, first["discriminators"][k]) for k, v in fresh.state_dict().items())
    codec.main(["train", str(data_dir), "--ckpt", str(run), "--resume", "--steps", "3"] + common)  # no step
    again = torch.load(run, map_location="cpu", weights_only=True)
    assert all(torch.equal(v, again["discriminators"][k]) for k, v in first["discriminators"].items())
    codec.main(["train", str(data_dir), "--ckpt", str(run), "--resume", "--steps", "5"] + common)
    after = torch.load(run, map_location="cpu", weights_only=True)
    assert after["step"] == 5
    assert any(not torch.equal(v, after["discriminators"][k]) for k, v in first["discriminators"].items())
    assert all(torch.isfinite(v).all() for v in after["model"].values())
    exported = tmp_path / "adversarial.nemo"
    codec.main(["export", str(run), str(exported)])
    assert codec.read_nemo(exported)[1].keys() == codec.read_nemo(nemo)[1].keys()


def test_adversarial_losses():
    """The discriminators score every waveform length (folded by each period, padded where it does
    not divide); least squares: 0 for the discriminators when they tell speech (1) from the
    decoder's output (0) perfectly, and 0 feature matching for an output that is the speech."""
    torch.manual_seed(0)
    discriminators = codec.Discriminators()
    x = torch.randn(2, 4097)
    outs = discriminators(x)
    assert len(outs) == len(codec.Discriminators.PERIODS) + len(codec.Discriminators.RESOLUTIONS)
    for scores, features in outs:
        assert scores.shape[0] == 2 and features and torch.isfinite(scores).all()
    real, fake = [(torch.ones(2, 3), []) for _ in range(2)], [(torch.zeros(2, 3), []) for _ in range(2)]
    assert float(codec.discriminator_loss(real, fake)) == 0.0
    adversarial, matching = codec.generator_losses(outs, outs)
    assert float(matching.detach()) == 0.0 and float(adversarial.detach()) > 0.0
    y = (x + 0.1 * torch.randn_like(x)).requires_grad_()
    adversarial, matching = codec.generator_losses(outs, discriminators(y))
    (adversarial + matching).backward()
    assert float(matching.detach()) > 0.0 and y.grad.abs().sum() > 0


def run_tool(*args):
    if not os.access(CODEC_TOOL, os.X_OK):
        pytest.skip(f"{CODEC_TOOL} is not built")
    r = subprocess.run([str(CODEC_TOOL)] + [str(a) for a in args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"gepard-codec-tool {' '.join(map(str, args))}: {r.stderr}"


def test_export_decodes_in_c_like_torch(data_dir, trained, tmp_path):
    from safetensors.numpy import load_file, save_file

    _, ckpt = trained
    nemo = tmp_path / "codec.nemo"
    codec.main(["export", str(ckpt), str(nemo)])
    model = codec.load_codec(nemo)
    reference = codec.load_codec(ckpt)
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        assert torch.equal(a, b)

    row = codec.read_index(data_dir, "heldout_speaker")[0]
    x = codec.read_wav_int16(data_dir / "speech" / row["path"]).astype(np.float32) / 32768.0
    x = codec.pad_to_frames(torch.from_numpy(x))[None]
    codes = model.encode(x)[0].T.numpy().astype(np.int32)  # [T, 32]
    expected = model.decode(torch.from_numpy(codes).T[None].long())[0].numpy()

    save_file({"codes": np.ascontiguousarray(codes)}, str(tmp_path / "codes.safetensors"))
    for chunk in (None, 3):
        out = tmp_path / f"decoded-{chunk}.safetensors"
        run_tool("decode", nemo, tmp_path / "codes.safetensors", out, *(["--chunk", chunk] if chunk else []))
        samples = load_file(str(out))["samples"]
        assert samples.shape == expected.shape
        err = float(np.abs(samples - expected).max())
        print(f"\nC decode (chunk {chunk}) vs torch: max |Δ| {err:.3g} (limit {DECODE_MAX_ABS:.3g})")
        assert err <= DECODE_MAX_ABS

    save_file({"samples": np.ascontiguousarray(x[0].numpy())}, str(tmp_path / "audio.safetensors"))
    run_tool("encode", nemo, tmp_path / "audio.safetensors", tmp_path / "encoded.safetensors")
    c_codes = load_file(str(tmp_path / "encoded.safetensors"))["codes"]
    assert c_codes.shape == codes.shape
    with torch.no_grad():
        y = model.vector_quantizer.compress(model.audio_encoder(x[:, None]))[0].T.numpy()
    margin = np.abs(0.5 - np.abs(y - np.round(y)))
    differ = c_codes != codes
    print(f"C encode vs torch: {int(differ.sum())} of {codes.size} codes differ")
    assert np.all(margin[differ] < FSQ_MARGIN)


def test_encode_writes_documented_codes(data_dir, trained, tmp_path):
    _, ckpt = trained
    out = tmp_path / "codes.pt"
    codec.main(["encode", str(ckpt), str(data_dir), "--out", str(out), "--device", "cpu"])
    payload = torch.load(out, map_location="cpu", weights_only=True)
    assert payload["format"] == "gepard-codes-1"
    assert payload["sample_rate"] == 22050 and payload["samples_per_frame"] == 1024
    assert payload["levels"] == [8, 7, 6, 6] * 8
    assert payload["levels_per_group"] == [8, 7, 6, 6] and payload["num_groups"] == 8
    rows = codec.read_index(data_dir)
    assert [u["id"] for u in payload["utterances"]] == [r["id"] for r in rows]
    levels = torch.tensor(payload["levels"])
    model = codec.load_codec(ckpt)
    for u, r in zip(payload["utterances"], rows):
        assert u["text"] == r["text"] and u["speaker"] == r["speaker"] and u["split"] == r["split"]
        c = u["codes"]
        assert c.dtype == torch.uint8 and c.shape == (-(-r["samples"] // 1024), 32)
        assert bool((c.long() < levels).all())
    # utterances of one length are encoded as a batch; alone they give the same codes, up to
    # values on an FSQ rounding boundary
    for u, r in list(zip(payload["utterances"], rows))[:3]:
        x = codec.read_wav_int16(data_dir / "speech" / r["path"]).astype(np.float32) / 32768.0
        x = codec.pad_to_frames(torch.from_numpy(x))[None]
        with torch.no_grad():
            y = model.vector_quantizer.compress(model.audio_encoder(x[:, None]))[0].T.numpy()
        differ = (model.encode(x)[0].T.to(torch.uint8) != u["codes"]).numpy()
        assert np.all(np.abs(0.5 - np.abs(y - np.round(y)))[differ] < FSQ_MARGIN)


def test_eval_reports_distances(data_dir, trained, tmp_path, capsys):
    _, ckpt = trained
    codec.main(["eval", str(ckpt), str(data_dir), "--limit", "2", "--out", str(tmp_path / "eval"),
                "--wavs", "1", "--device", "cpu"])
    assert "snr_db" in capsys.readouterr().out
    assert len(list((tmp_path / "eval").glob("*.wav"))) == 2
