"""Tests of the default voice's tokenizer and LM steps (tools/voice/tokenizer.py, tools/voice/lm.py).

Everything runs on the CPU in seconds with the "tiny" model shape, on a synthetic corpus written
here: three speakers, short sentences of a small word list, and codes that follow the text (each
character gives two frames of a fixed code vector, shifted per speaker), so that a few steps of
training visibly lower the loss.

* the trained tokenizer has exactly the layout of models/tokenizer.json (Qwen3.5's, §4 of
  gepard-model.md) with the 33 added tokens right after the BPE, and gepard-tokenize (the C
  tokenizer) encodes text to the same ids as `tokenizers`;
* a few training steps, then a resumed run, lower the loss;
* the alignment loss ranks a head's walks over the text (one lasting the utterance lowest, one
  racing through it higher, backwards or elsewhere high), a run resumed with it lowers it and
  exports the same tensors, and `lm.py walk` prints the heads' walks;
* the export loads in the C engine (gepard-inspect) and in tests/python/gepard_reference.py;
* greedy generation: `lm.py sample` and `gepard-inspect generate --greedy` give the same frames,
  frame for frame, with no prefix (the default voice), with the null prefix, and with the C
  compressor's prefix for a reference clip; the two compressors' prefixes agree to the tolerance
  of test_lm_parity.py (the C one does fp32 attention math, torch's SDPA rounds in between, so
  frames from each side's own prefix may part at a near tie).

Run after building: ninja -C build tools/gepard-inspect tools/gepard-tokenize; then
pytest tests/python/test_voice_lm_recipe.py (GEPARD_BUILD_DIR / GEPARD_SOURCE_DIR as elsewhere).
"""

import importlib.util
import json
import os
import pathlib
import random
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")
try:
    from transformers.models.qwen3_5 import modeling_qwen3_5  # noqa: F401  (transformers ≥ 5)
except ImportError:
    pytest.skip("this transformers has no Qwen3.5 (needs 5.x)", allow_module_level=True)

from safetensors.numpy import load_file, save_file  # noqa: E402
from safetensors.torch import load_file as load_pt, save_file as save_pt  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
SOURCE_DIR = pathlib.Path(os.environ.get("GEPARD_SOURCE_DIR") or HERE.parents[1])
BUILD_DIR = pathlib.Path(os.environ.get("GEPARD_BUILD_DIR") or SOURCE_DIR / "build")
INSPECT = BUILD_DIR / "tools" / "gepard-inspect"
TOKENIZE = BUILD_DIR / "tools" / "gepard-tokenize"

sys.path.insert(0, str(HERE))
import gepard_reference as ref  # noqa: E402

LEVELS = [8, 7, 6, 6] * 8
SPEAKERS = ["anna", "ben", "cara"]
WORDS = ("the quick brown fox jumps over a lazy dog while seven small voices read clear "
         "numbers like 42 and 1999 aloud").split()
SENTENCES = ["The quick brown fox jumps over a lazy dog.", "Seven voices.", "Hi"]
MAX_FRAMES = 40
TRAIN_STEPS = 60
PREFIX_TOL = 0.04  # max rel of the compressor output, as test_lm_parity.py's TOL_PREFIX
ARGMAX_MARGIN = 0.03  # × max |head logit|: a near tie, as in test_lm_parity.py
STOP_LOGIT_THRESHOLD = 2.0 ** -7  # §3.4: bf16(sigmoid(x)) > 0.5 ⇔ x > 2⁻⁷


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


voice_tokenizer = _load("voice_tokenizer", SOURCE_DIR / "tools" / "voice" / "tokenizer.py")
lm = _load("voice_lm", SOURCE_DIR / "tools" / "voice" / "lm.py")


def _run(cmd, **kwargs):
    return subprocess.run([str(c) for c in cmd], capture_output=True, timeout=300, **kwargs)


def _need(tool):
    if not os.access(tool, os.X_OK):
        pytest.skip(f"{tool} is not built (ninja -C {BUILD_DIR} tools/{tool.name})")


def synthetic_codes(text, speaker):
    """Two frames per character: a code vector fixed by the character, shifted by the speaker."""
    shift = SPEAKERS.index(speaker)
    rows = []
    for ch in text.lower():
        row = [(zlib.crc32(f"{ch}:{i}".encode()) + shift * (i % 3)) % LEVELS[i] for i in range(32)]
        rows += [row, row]
    return torch.tensor(rows, dtype=torch.int64)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One CPU thread for this module (the machines that run CI are shared), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """CORPUS_DIR/train.jsonl and DATA/codes.pt in the layout of the corpus and codec steps."""
    out = tmp_path_factory.mktemp("voice-data")
    rng = random.Random(7)
    utterances = []
    for n in range(90):
        speaker = SPEAKERS[0] if n % 2 == 0 else SPEAKERS[1 + (n // 2) % 2]
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))).capitalize() + "."
        utterances.append({"id": f"u{n:03d}", "speaker": speaker, "text": text, "split": "train",
                           "codes": synthetic_codes(text, speaker).to(torch.uint8)})
    for n in range(4):  # codec.py's held-out speaker: never trained on
        utterances.append({"id": f"h{n}", "speaker": "dora", "text": "Held out.", "split": "heldout_speaker",
                           "codes": synthetic_codes("held out.", "anna").to(torch.uint8)})
    torch.save({"levels": LEVELS, "utterances": utterances}, out / "codes.pt")
    with open(out / "train.jsonl", "w", encoding="utf-8") as f:
        for u in utterances:
            f.write(json.dumps({"id": u["id"], "text": u["text"]}) + "\n")
    return out


@pytest.fixture(scope="module")
def tokenizer_json(data, tmp_path_factory):
    path = tmp_path_factory.mktemp("voice-tokenizer") / "tokenizer.json"
    assert voice_tokenizer.main([str(data), "--output", str(path), "--vocab-size", "400"]) == 0
    return path


@pytest.fixture(scope="module")
def run_dir(data, tokenizer_json, tmp_path_factory):
    """A tiny model trained for TRAIN_STEPS steps in two runs: the second resumes the first."""
    run = tmp_path_factory.mktemp("voice-run")
    common = ["train", "--data", str(data / "codes.pt"), "--run", str(run), "--preset", "tiny",
              "--lr", "3e-3", "--warmup", "4", "--max-tokens", "1500", "--valid-count", "6",
              "--log-every", "1", "--eval-every", "0", "--threads", "1", "--device", "cpu"]
    # the first run's batches built ahead in a worker process, as on a GPU
    assert lm.main(common + ["--tokenizer", str(tokenizer_json), "--steps", str(TRAIN_STEPS // 2),
                             "--prefetch", "2"]) == 0
    with pytest.raises(SystemExit):  # a second start without --resume must not overwrite it
        lm.main(common + ["--steps", str(TRAIN_STEPS)])
    assert lm.main(common + ["--resume", "--steps", str(TRAIN_STEPS)]) == 0
    return run


def checkpoint_model(run_dir):
    """The run's model from its checkpoint, in eval mode."""
    state, tensors = lm.read_checkpoint(run_dir)
    model = lm.build_model(state["model"])
    lm.load_model_weights(model, tensors, "model/")
    return model.eval()


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("voice-export")
    assert lm.main(["export", str(run_dir), str(out)]) == 0
    return out


# ---- tokenizer -----------------------------------------------------------------------------------

def test_tokenizer_layout(tokenizer_json):
    """The Qwen3.5 layout of models/tokenizer.json, the 33 added tokens right after the BPE."""
    mine = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    base = json.loads((SOURCE_DIR / "models" / "tokenizer.json").read_text(encoding="utf-8"))
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        assert mine[key] == base[key], key
    model_options = {k: v for k, v in mine["model"].items() if k not in ("vocab", "merges")}
    assert model_options == {k: v for k, v in base["model"].items() if k not in ("vocab", "merges")}
    n_bpe = len(mine["model"]["vocab"])
    assert sorted(mine["model"]["vocab"].values()) == list(range(n_bpe))
    assert 300 < n_bpe <= 400
    mbt = voice_tokenizer.load_base_tokenizer_module()
    assert [t["content"] for t in mine["added_tokens"]] == mbt.ADDED_TOKENS
    assert [t["id"] for t in mine["added_tokens"]] == list(range(n_bpe, n_bpe + 33))
    assert all(t["special"] and not t["normalized"] for t in mine["added_tokens"])
    ids = lm.tokenizer_special_ids(tokenizer_json)
    assert (ids["start_of_speech"], ids["start_of_text"], ids["end_of_text"], ids["tts_pad"]) == (
        n_bpe + 26, n_bpe + 29, n_bpe + 30, n_bpe + 32)  # §4: 248070, 248073, 248074, 248076
    assert ids["tokeniser_length"] == n_bpe + 33


def test_c_tokenizer_encodes_the_same(tokenizer_json, data):
    from tokenizers import Tokenizer

    _need(TOKENIZE)
    texts = [json.loads(line)["text"] for line in (data / "train.jsonl").read_text().splitlines()]
    texts += SENTENCES + ["Numbers 2026 and 3.14, don't stop!", "ÜBER café — naïve 日本語 🎉",
                          "<tts_text_bos>hello<|audio_start|>", "  spaced\tout  "]
    reference = Tokenizer.from_file(str(tokenizer_json))
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    r = _run([TOKENIZE, tokenizer_json], input=("\n".join(texts) + "\n").encode("utf-8"))
    assert r.returncode == 0, r.stderr.decode()
    got = [[int(x) for x in line.split()] for line in r.stdout.decode().split("\n")[:-1]]
    assert got == expected


# ---- training ------------------------------------------------------------------------------------

def test_training_lowers_loss(run_dir):
    records = [json.loads(line) for line in (run_dir / "train.log").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, TRAIN_STEPS + 1))  # resumed, not restarted
    first = {k: np.mean([r[k] for r in records[:5]]) for k in ("loss", "ce", "stop")}
    last = {k: np.mean([r[k] for r in records[-5:]]) for k in ("loss", "ce", "stop")}
    print(f"\nvoice LM, steps 1-5 → {TRAIN_STEPS - 4}-{TRAIN_STEPS}: "
          + ", ".join(f"{k} {first[k]:.3f} → {last[k]:.3f}" for k in first))
    assert last["loss"] < 0.75 * first["loss"]
    assert last["ce"] < 0.9 * first["ce"]  # the heads learn, not only the stop head
    state = json.loads((run_dir / lm.CHECKPOINT / "state.json").read_text())
    assert state["step"] == TRAIN_STEPS
    for name in state["files"]:
        assert (run_dir / lm.CHECKPOINT / name).stat().st_size <= lm.SHARD_BYTES + (1 << 20)


def test_resumed_run_takes_new_batches(run_dir, data, tmp_path, capsys):
    """A run resumed with other --max-tokens/--max-batch/--lr goes on with them (and says so)."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(run), "--resume",
                    "--steps", str(TRAIN_STEPS + 2), "--max-tokens", "3000", "--max-batch", "8", "--lr", "1e-3",
                    "--text-gap", "16", "--frame-noise", "0.1", "--own-frames", "0.5",
                    "--frame-blank", "0.3", "--bpe-dropout", "0.1", "--text-dropout", "0.2",
                    "--log-every", "1", "--eval-every", "1", "--threads", "1", "--device", "cpu"]) == 0
    assert "max_tokens 1500 → 3000" in capsys.readouterr().out
    last = json.loads((run / "train.log").read_text().splitlines()[-1])
    # validation: the CE with each utterance's own text and with another's (what the text is worth)
    assert last["step"] == TRAIN_STEPS + 2
    assert np.isfinite([last["valid_ce"], last["valid_ce_other_text"], last["valid_ce_empty_text"]]).all()
    state = json.loads((run / lm.CHECKPOINT / "state.json").read_text())
    assert state["step"] == TRAIN_STEPS + 2
    assert (state["train"]["max_tokens"], state["train"]["max_batch"], state["train"]["lr"]) == (3000, 8, 1e-3)
    assert state["train"]["text_gap"] == 16 and state["train"]["frame_noise"] == 0.1
    assert state["train"]["own_frames"] == 0.5 and state["train"]["frame_blank"] == 0.3
    assert state["train"]["bpe_dropout"] == 0.1 and state["train"]["text_dropout"] == 0.2
    assert state["train"]["warmup"] == 4  # not given: kept


def test_cooldown_brings_the_learning_rate_down_at_the_end(run_dir, data, tmp_path):
    """--cooldown C: over the plan's last C steps the learning rate falls linearly towards 0; before
    them it is the schedule's own. A resumed run may be given one."""
    assert [lm.cooldown_factor(r, 4) for r in (9, 4, 3, 1, 0, -1)] == [1, 1, 0.75, 0.25, 0, 0]
    assert lm.cooldown_factor(0.5, 0) == 1
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    end = TRAIN_STEPS + 4
    assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(run), "--resume", "--steps", str(end),
                    "--cooldown", "3", "--log-every", "1", "--eval-every", "0", "--threads", "1",
                    "--device", "cpu"]) == 0
    records = [json.loads(line) for line in (run / "train.log").read_text().splitlines()][-4:]
    state = json.loads((run / lm.CHECKPOINT / "state.json").read_text())
    assert state["train"]["cooldown"] == 3
    peak, warmup = state["train"]["lr"], state["train"]["warmup"]
    scheduled = [lm.learning_rate(s, peak, warmup, (s - warmup) / (end - warmup)) for s in range(TRAIN_STEPS, end)]
    assert [r["lr"] for r in records] == pytest.approx([x * f for x, f in zip(scheduled, (1, 1, 2 / 3, 1 / 3))],
                                                       rel=1e-9)


def test_alignment_loss_prefers_a_walk_over_the_whole_utterance():
    """alignment_loss is low for a head that walks over the text tokens in order while the frames
    last, and higher for one that races through the text and stays on its last token, and high for
    one that walks backwards, races through the text and then looks elsewhere, or ignores it."""
    n, text, frames = 12, [2, 3, 4], list(range(5, 11))
    key = torch.eye(n)[None, None]  # [B=1, Hkv=1, N, D=N]: key j is one-hot j

    def loss_for(targets):
        query = torch.zeros(1, 2, n, n)
        for row, target in zip(frames, targets):
            query[0, :, row, target] = 8.0  # both query heads look at `target` from frame `row`
        request = {"rows": torch.tensor([frames]), "row_len": torch.tensor([len(frames)]),
                   "cols": torch.tensor([text]), "col_len": torch.tensor([len(text)]), "heads": [0, 1]}
        return float(lm.alignment_loss(query, key, 1.0, request))

    walking = loss_for([2, 2, 3, 3, 4, 4])
    racing = loss_for([2, 3, 4, 4, 4, 4])  # a monotonic walk too, but off the diagonal
    leaving = loss_for([2, 3, 4, 0, 1, 0])
    backward = loss_for([4, 4, 3, 3, 2, 2])
    ignoring = loss_for([0, 1, 0, 1, 0, 1])
    print(f"\nalignment loss: walking {walking:.3f}, racing {racing:.3f}, leaving {leaving:.3f}, "
          f"backward {backward:.3f}, ignoring the text {ignoring:.3f}")
    assert walking < 0.2
    assert racing > walking + 0.1 and leaving > 1.0 and ignoring > 1.0 and backward > 5.0


def test_alignment_loss_trains(run_dir, exported, data, tmp_path):
    """A run resumed with --align-weight logs the alignment loss, lowers it, and exports the same
    tensors (the loss adds nothing to the model)."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    steps = 24
    assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(run), "--resume",
                    "--steps", str(TRAIN_STEPS + steps), "--align-weight", "1", "--log-every", "1",
                    "--eval-every", "0", "--threads", "1", "--device", "cpu"]) == 0
    records = [json.loads(line) for line in (run / "train.log").read_text().splitlines()][-steps:]
    align = [r["align"] for r in records]
    print(f"\nalignment loss over {steps} steps: {np.mean(align[:4]):.3f} → {np.mean(align[-4:]):.3f}")
    assert np.isfinite(align).all() and np.mean(align[-4:]) < 0.9 * np.mean(align[:4])
    state = json.loads((run / lm.CHECKPOINT / "state.json").read_text())
    assert state["train"]["align_weight"] == 1.0 and state["train"]["align_layers"] == ""
    out = tmp_path / "export"
    assert lm.main(["export", str(run), str(out)]) == 0
    ours, before = load_pt(str(out / "model.safetensors")), load_pt(str(exported / "model.safetensors"))
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in before.items()}


def test_walk_shows_where_the_heads_look(exported, data, capsys):
    """lm.py walk prints, for generated speech and for teacher-forced codes, each aligned head's
    walk over the text and the frame where it first reaches the last token."""
    assert lm.walk_summary([0, 0, -1, 1, 2, 2], 3) == "last token at frame 4 of 6 (67 %): 0.2"
    assert lm.walk_summary([0, 1, 1], 3).startswith("last token at never")
    assert lm.main(["walk", str(exported), "--text", "Seven voices.", "--codes", str(data / "codes.pt"),
                    "--count", "2", "--max-frames", "20", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("'Seven voices.': ") == 1 and out.count(" frames\n") == 3
    assert out.count("  layer 1 head 0: last token at ") == 3 and out.count("  layer 1 head 2: ") == 3


def test_text_gap_moves_only_the_frames(run_dir, data, tokenizer_json):
    """--text-gap: a gap moves the positions of an example's frames (not its prefix or text) past
    the text; no gap is the engine's layout, positions 0…N−1; the model sees the positions."""
    levels, records = lm.load_codes(data / "codes.pt")
    special = lm.tokenizer_special_ids(tokenizer_json)
    kept, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set())
    examples = [(kept[0], "null", None), (kept[1], "none", None)]
    plain = lm.collate(examples, lm.COMPRESSOR_QUERIES)
    moved = lm.collate(examples, lm.COMPRESSOR_QUERIES, [0, 5])
    width = plain["index"].shape[1]
    assert torch.equal(plain["positions"], torch.arange(width).expand(2, width))
    assert torch.equal(moved["positions"][0], plain["positions"][0])
    n = len(kept[1].ids)  # example 1 has no prefix: text at 0…n−1, frames from n on
    assert torch.equal(moved["positions"][1, :n], torch.arange(n))
    assert torch.equal(moved["positions"][1, n:], torch.arange(n, width) + 5)

    model = checkpoint_model(run_dir)
    with torch.no_grad():
        zero = lm.collate(examples, lm.COMPRESSOR_QUERIES, [0, 0])
        ce = [float(lm.batch_loss(model, b)["ce"]) for b in (plain, zero, moved)]
    assert ce[0] == ce[1] and ce[2] != ce[0]
    assert lm.text_gaps(4, 0, random.Random(1)) == [0, 0, 0, 0]
    gaps = lm.text_gaps(400, 6, random.Random(1))
    assert set(gaps) == set(range(7)) and 150 < gaps.count(0) < 250


def test_frame_noise_moves_codes_one_level():
    """--frame-noise: the frames the model reads get codes moved to a neighbouring level, inside
    each channel's levels, at the rate asked; p = 0 reads the true frames."""
    torch.manual_seed(3)
    frames = torch.stack([torch.randint(0, level, (2000,)) for level in LEVELS], 1)
    assert lm.noisy_frames(frames, LEVELS, 0.0) is frames
    moved = lm.noisy_frames(frames, LEVELS, 1.0)
    assert torch.equal((moved - frames).abs(), torch.ones_like(frames))
    assert bool((moved >= 0).all()) and bool((moved < torch.tensor(LEVELS)).all())
    rate = float((lm.noisy_frames(frames, LEVELS, 0.2) != frames).float().mean())
    assert 0.18 < rate < 0.22


def test_own_frames_replace_whole_frames(run_dir, data, tokenizer_json):
    """--own-frames: a share of the read frames, whole frames, become the model's predictions of
    them; p = 0 reads the true frames and changes nothing in the loss, p = 1 changes the loss."""
    torch.manual_seed(4)
    frames = torch.stack([torch.randint(0, level, (3000,)) for level in LEVELS], 1)
    predicted = torch.stack([torch.randint(0, level, (3000,)) for level in LEVELS], 1)
    assert lm.own_frames(frames, predicted, 0.0) is frames
    assert torch.equal(lm.own_frames(frames, predicted, 1.0), predicted)
    mixed = lm.own_frames(frames, predicted, 0.3)
    whole = (mixed == predicted).all(1) | (mixed == frames).all(1)
    assert bool(whole.all())
    rate = float((mixed != frames).any(1).float().mean())
    assert 0.27 < rate < 0.33

    levels, records = lm.load_codes(data / "codes.pt")
    special = lm.tokenizer_special_ids(tokenizer_json)
    kept, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set())
    batch = lm.collate([(kept[0], "none", None), (kept[1], "none", None)], lm.COMPRESSOR_QUERIES)
    model = checkpoint_model(run_dir)
    with torch.no_grad():
        plain = float(lm.batch_loss(model, batch)["ce"])
        off, own = (float(lm.batch_loss(model, batch, own_frame_share=p)["ce"]) for p in (0.0, 1.0))
        blind = float(lm.batch_loss(model, batch, frame_blank=1.0)["ce"])
    assert plain == off and own != plain and blind != plain


def test_blanked_frames_at_the_rate_asked():
    """--frame-blank: each read frame is hidden from the model with probability p."""
    torch.manual_seed(5)
    assert not bool(lm.blanked_frames(1000, 0.0, "cpu").any())
    assert bool(lm.blanked_frames(1000, 1.0, "cpu").all())
    rate = float(lm.blanked_frames(20000, 0.4, "cpu").float().mean())
    assert 0.38 < rate < 0.42


def test_bpe_dropout_spells_the_same_text_in_pieces(data, tokenizer_json):
    """--bpe-dropout: each utterance keeps other tokenizations of its text, in more (shorter)
    pieces that decode to the same text, laid out like the engine's; an example takes one of
    them half of the time."""
    from tokenizers import Tokenizer

    levels, records = lm.load_codes(data / "codes.pt")
    special = lm.tokenizer_special_ids(tokenizer_json)
    plain, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set())
    kept, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set(), bpe_dropout=0.3)
    assert all(not u.variants for u in plain)
    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    longer = 0
    for u, p in zip(kept, plain):
        assert u.tokens == p.tokens and len(u.variants) == lm.BPE_VARIANTS
        for tokens, ids in u.variants:
            assert tokenizer.decode(tokens) == tokenizer.decode(u.tokens)
            assert ids == lm.text_layout(tokens, special)
            longer += len(tokens) > len(u.tokens)
    assert longer > len(kept)  # most variants are in more pieces
    rng = random.Random(7)
    spelled = [kept[0].spelled(rng, 0.5) for _ in range(400)]
    assert 150 < sum(s is not kept[0] for s in spelled) < 250
    assert all(s.codes is kept[0].codes for s in spelled)
    assert plain[0].spelled(rng, 1.0) is plain[0]


def test_held_out_speaker_is_left_out(data, tokenizer_json):
    levels, records = lm.load_codes(data / "codes.pt")
    special = lm.tokenizer_special_ids(tokenizer_json)
    kept, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set())
    assert len(kept) == 90 and "dora" not in {u.speaker for u in kept}
    kept, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, {"cara"})
    assert {u.speaker for u in kept} == {"anna", "ben"}


def test_batches_built_ahead_are_the_loops(data, tokenizer_json):
    """The batches a worker process builds ahead are those the loop would build, epoch after
    epoch, and a run resumed mid-epoch gets the same ones from there."""
    levels, records = lm.load_codes(data / "codes.pt")
    special = lm.tokenizer_special_ids(tokenizer_json)
    utterances, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set(), 0.1)
    plan = lm.VoicePlan(utterances, lm.default_speaker_of(utterances))
    hp = {"seed": 7, "max_tokens": 3000, "max_batch": 96, "text_gap": 16, "text_dropout": 0.2}
    per_epoch = len(lm.make_batches(utterances, hp["max_tokens"], hp["max_batch"], 7000))
    assert per_epoch > 2
    count = per_epoch * 2 + 3  # into a third epoch

    def first(iterator, n):
        return [next(iterator) for _ in range(n)]

    in_loop = first(lm.training_batches(lm.TrainingBatches(utterances, plan, hp, 0, 0, 0), 0, False), count)
    ahead = first(lm.training_batches(lm.TrainingBatches(utterances, plan, hp, 0, 0, 0), 3, False), count)
    step, epoch, index, _ = in_loop[per_epoch + 1]
    resumed = first(lm.training_batches(lm.TrainingBatches(utterances, plan, hp, step, epoch, index), 2, False),
                    count - step)
    assert [x[:3] for x in in_loop[:per_epoch]] == [(i, 0, i) for i in range(per_epoch)]
    assert in_loop[per_epoch][1:3] == (1, 0)
    for a, b in zip(in_loop, ahead, strict=True):
        assert a[:3] == b[:3]
        assert a[3].keys() == b[3].keys()
        for key, value in a[3].items():
            assert (value is None and b[3][key] is None) or torch.equal(value, b[3][key]), (a[:3], key)
    for a, b in zip(in_loop[step:], resumed):
        assert a[:3] == b[:3] and all(
            (v is None and b[3][k] is None) or torch.equal(v, b[3][k]) for k, v in a[3].items())
    assert len(resumed) == count - step


def test_compiled_backbone_trains_the_same(data, tokenizer_json, tmp_path):
    """--compile (torch.compile of the backbone, in place) logs the eager run's losses and saves
    the same tensor names, also with recipe.sh's options (own frames: a forward pass without
    gradients before each step; hidden frames; empty texts)."""
    logs = []
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        run = tmp_path / name
        assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(run), "--preset", "tiny",
                        "--tokenizer", str(tokenizer_json), "--steps", "3", "--max-tokens", "1500",
                        "--log-every", "1", "--eval-every", "0", "--threads", "1", "--device", "cpu",
                        "--own-frames", "0.4", "--frame-blank", "0.3", "--text-dropout", "0.15", *extra]) == 0
        logs.append([json.loads(line) for line in (run / "train.log").read_text().splitlines()])
        names = sorted(lm.read_checkpoint(run)[1])
        assert not any("_orig_mod" in n for n in names)
    assert [r["step"] for r in logs[1]] == [1, 2, 3]
    for eager, compiled in zip(*logs):
        assert compiled["loss"] == pytest.approx(eager["loss"], rel=1e-3)


def test_compile_cache_serves_a_fresh_machine(data, tokenizer_json, tmp_path):
    """--compile keeps torch.compile's work in RUN/compile-cache/DEVICE.bin: a run elsewhere that
    starts with that file (and an empty torch cache of its own, as on a fresh machine) compiles
    nothing, where the first run compiled every graph; even a run twice as deep, as each layer is
    compiled alone and all of them run one code."""
    counts = []
    for name, layers in (("first", "2"), ("second", "4")):
        run = tmp_path / name
        if name == "second":
            shutil.copytree(tmp_path / "first" / lm.COMPILE_CACHE, run / lm.COMPILE_CACHE)
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"torch-cache-{name}"))
        result = _run([sys.executable, SOURCE_DIR / "tools" / "voice" / "lm.py", "train", "--data",
                       data / "codes.pt", "--run", run, "--preset", "tiny", "--tokenizer", tokenizer_json,
                       "--num-hidden-layers", layers, "--steps", "2", "--max-tokens", "1500", "--eval-every", "0",
                       "--threads", "1", "--device", "cpu", "--compile"], env=env, text=True)
        assert result.returncode == 0, result.stderr
        assert (run / lm.COMPILE_CACHE / "cpu.bin").stat().st_size > 0
        line = next(line for line in result.stdout.splitlines() if line.startswith("compile: "))
        counts.append([int(word) for word in line.split() if word.isdigit()])
    assert counts[0][0] == 0 and counts[0][1] > 0, counts
    assert counts[1] == [counts[0][1], 0], counts


def test_checkpoint_round_trip(run_dir):
    """Weights and AdamW moments come back (in bf16) into a fresh model and optimizer."""
    state, tensors = lm.read_checkpoint(run_dir)
    model = lm.build_model(state["model"])
    lm.load_model_weights(model, tensors, "model/")
    optimizer = lm.make_optimizer(model, 1e-3, 0.1, (0.9, 0.95))
    lm.restore_optimizer(optimizer, model, tensors, "cpu")
    trained = [p for p in model.parameters() if p.requires_grad]
    assert all(p in optimizer.state for p in trained)
    p = model.model.layers[0].self_attn.q_proj.weight
    assert torch.equal(p.detach().to(torch.bfloat16), tensors["model/model.layers.0.self_attn.q_proj.weight"])
    assert float(optimizer.state[p]["step"]) == TRAIN_STEPS


def test_slimmed_run_resumes_from_the_same_weights(run_dir, data, tmp_path, capsys):
    """slim keeps the weights and the run's state without AdamW's moments (a third of the size); the
    slimmed run resumes at the same step with fresh moments and a learning rate that warms up again."""
    slim = tmp_path / "slim"
    assert lm.main(["slim", str(run_dir), str(slim)]) == 0
    state, tensors = lm.read_checkpoint(slim)
    full_state, full = lm.read_checkpoint(run_dir)
    assert state["step"] == full_state["step"] == TRAIN_STEPS
    assert set(tensors) == {k for k in full if k.startswith("model/")}
    assert all(torch.equal(tensors[k], full[k]) for k in tensors)
    size = lambda run: sum(f.stat().st_size for f in (run / lm.CHECKPOINT).iterdir())  # noqa: E731
    assert size(slim) < 0.4 * size(run_dir)
    assert (slim / "tokenizer.json").read_bytes() == (run_dir / "tokenizer.json").read_bytes()
    with pytest.raises(SystemExit):
        lm.main(["slim", str(run_dir), str(run_dir)])

    assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(slim), "--resume",
                    "--steps", str(TRAIN_STEPS + 2), "--log-every", "1", "--eval-every", "0",
                    "--threads", "1", "--device", "cpu"]) == 0
    assert "warms up again over 4 steps" in capsys.readouterr().out
    records = [json.loads(line) for line in (slim / "train.log").read_text().splitlines()]
    assert [r["step"] for r in records[-2:]] == [TRAIN_STEPS + 1, TRAIN_STEPS + 2]
    peak, end = full_state["train"]["lr"], TRAIN_STEPS + 2
    # the step's own learning rate (cosine over --steps), times 1/4 and 2/4 of the new warmup
    expected = [lm.learning_rate(s, peak, 4, (s - 4) / (end - 4)) * f for s, f in ((TRAIN_STEPS, 0.25),
                                                                                    (TRAIN_STEPS + 1, 0.5))]
    assert [r["lr"] for r in records[-2:]] == pytest.approx(expected, rel=1e-9)
    state = json.loads((slim / lm.CHECKPOINT / "state.json").read_text())
    assert state["step"] == TRAIN_STEPS + 2


def test_average_of_checkpoints(run_dir, data, tmp_path):
    """average: the element-wise mean of one training's checkpoints, as a slimmed run of the last
    that exports like any other; runs of another shape and a single run are refused."""
    later = tmp_path / "later"
    shutil.copytree(run_dir, later)
    assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(later), "--resume",
                    "--steps", str(TRAIN_STEPS + 2), "--eval-every", "0", "--threads", "1", "--device", "cpu"]) == 0
    mean = tmp_path / "mean"
    assert lm.main(["average", str(run_dir), str(later), "--out", str(mean)]) == 0
    (_, a), (b_state, b), (state, m) = (lm.read_checkpoint(r) for r in (run_dir, later, mean))
    weights = sorted(k for k in b if k.startswith("model/"))
    assert sorted(m) == weights
    assert all(torch.equal(m[k], ((a[k].float() + b[k].float()) / 2).to(torch.bfloat16)) for k in weights)
    assert any(not torch.equal(m[k], b[k]) for k in weights)
    assert state["step"] == b_state["step"] == TRAIN_STEPS + 2
    assert state["averaged_steps"] == [TRAIN_STEPS, TRAIN_STEPS + 2]
    assert (mean / "tokenizer.json").read_bytes() == (run_dir / "tokenizer.json").read_bytes()
    assert lm.main(["export", str(mean), str(tmp_path / "model")]) == 0
    assert (tmp_path / "model" / "model.safetensors").is_file()

    other = tmp_path / "other"
    lm.write_checkpoint(other, {k: v for k, v in b.items() if k != weights[0]}, b_state)
    for runs, message in (([str(run_dir), str(other)], "is not the same model"), ([str(run_dir)], "two runs or more"),
                          ([str(run_dir), str(mean)], "writes a new run directory")):
        with pytest.raises(SystemExit, match=message):
            lm.main(["average", *runs, "--out", str(mean)])


def test_deepened_run_computes_the_same_and_trains_on(run_dir, data, tmp_path, capsys):
    """--num-hidden-layers on a resumed run deepens it: each layer doubled, the copies' residual
    outputs zeroed, so that the model's outputs are exactly those of before; training goes on from
    there with fresh AdamW moments and moves the copies. Fewer layers or another width is refused."""
    state, tensors = lm.read_checkpoint(run_dir)
    spec = json.loads(json.dumps(state["model"]))
    old = spec["shape"]["num_hidden_layers"]
    grown = lm.deepen(spec, tensors, 2 * old)
    assert spec["shape"]["num_hidden_layers"] == spec["backbone"]["num_hidden_layers"] == 2 * old
    assert spec["backbone"]["layer_types"] == ["full_attention"] * (2 * old)
    assert all(k.startswith("model/") for k in grown)
    shallow = checkpoint_model(run_dir)
    deep = lm.build_model(spec)
    lm.load_model_weights(deep, grown, "model/")
    deep.eval()
    special = lm.tokenizer_special_ids(run_dir / "tokenizer.json")
    ids = lm.text_layout([5, 9, 17, 3, 11], special)
    gen = torch.Generator().manual_seed(0)
    frames = torch.stack([torch.randint(0, level, (6,), generator=gen) for level in spec["head_levels"]], 1)
    with torch.no_grad():
        before = lm.forced_outputs(shallow, ids, shallow.null_prefix, frames)
        after = lm.forced_outputs(deep, ids, deep.null_prefix, frames)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])

    run = tmp_path / "deep"
    shutil.copytree(run_dir, run)
    common = ["train", "--data", str(data / "codes.pt"), "--run", str(run), "--resume", "--log-every", "1",
              "--eval-every", "0", "--threads", "1", "--device", "cpu"]
    with pytest.raises(SystemExit, match="can only grow deeper"):
        lm.main(common + ["--num-hidden-layers", "1", "--steps", str(TRAIN_STEPS + 2)])
    with pytest.raises(SystemExit, match="keeps its shape"):
        lm.main(common + ["--hidden-size", "96", "--steps", str(TRAIN_STEPS + 2)])
    capsys.readouterr()
    assert lm.main(common + ["--num-hidden-layers", str(2 * old), "--steps", str(TRAIN_STEPS + 2)]) == 0
    out = capsys.readouterr().out
    assert f"deepened from {old} to {2 * old} layers" in out and "warms up again" in out
    state, tensors = lm.read_checkpoint(run)
    assert state["step"] == TRAIN_STEPS + 2 and state["model"]["shape"]["num_hidden_layers"] == 2 * old
    assert tensors["model/model.layers.1.mlp.down_proj.weight"].abs().max() > 0
    # resumed at its own depth, it is not deepened again
    assert lm.main(common + ["--num-hidden-layers", str(2 * old), "--steps", str(TRAIN_STEPS + 3)]) == 0
    assert "deepened from" not in capsys.readouterr().out
    assert lm.read_checkpoint(run)[0]["step"] == TRAIN_STEPS + 3


def test_diverged_run_stops_and_keeps_its_checkpoint(run_dir, data, tmp_path, capsys, monkeypatch):
    """A loss gone NaN (a learning rate too high for the model, say) stops the run at the next log
    line with an error, and the checkpoint saved before stays as it was: no NaN weights to export."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    before = {f.name: f.read_bytes() for f in (run / lm.CHECKPOINT).iterdir()}
    batch_loss = lm.batch_loss

    def diverging(*args, **kwargs):
        losses = batch_loss(*args, **kwargs)
        losses["loss"] = losses["loss"] * float("nan")
        return losses

    monkeypatch.setattr(lm, "batch_loss", diverging)
    assert lm.main(["train", "--data", str(data / "codes.pt"), "--run", str(run), "--resume",
                    "--steps", str(TRAIN_STEPS + 4), "--log-every", "2", "--eval-every", "0",
                    "--threads", "1", "--device", "cpu"]) == 1
    assert f"the loss is not finite at step {TRAIN_STEPS + 2}" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in (run / lm.CHECKPOINT).iterdir()} == before


# ---- export --------------------------------------------------------------------------------------

def test_export_layout(exported):
    names = sorted(os.listdir(exported))
    for required in ("config.json", "gepard_config.json", "model.safetensors", "tokenizer.json"):
        assert required in names
    with open(exported / "model.safetensors", "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert {v["dtype"] for v in tensors.values()} == {"BF16"}
    # §2.3: 2 + 11 per layer backbone tensors, 103 of the audio overlay, 33 of the compressor and the
    # null prefix (293 for the 14-layer gepard-1.0); no lm_head
    cfg = json.loads((exported / "config.json").read_text())
    assert len(tensors) == 2 + 11 * cfg["num_hidden_layers"] + 103 + 33 + 1
    assert "lm_head.weight" not in tensors and tensors["null_prefix"]["shape"] == [8, cfg["hidden_size"]]
    assert cfg["rope_parameters"]["partial_rotary_factor"] == 1.0 and cfg["partial_rotary_factor"] == 1.0
    gepard = json.loads((exported / "gepard_config.json").read_text())
    assert list(gepard["audio_heads"]) == [f"level_audio_{i}" for i in range(32)]
    assert list(gepard["audio_heads"].values()) == LEVELS


def test_export_names_its_cfg_scale(run_dir, tmp_path):
    """export --cfg-scale W writes the scale the engine speaks the model with (safetensors
    metadata gepard.cfg_scale), and only then."""
    def metadata(path):
        with open(path / "model.safetensors", "rb") as f:
            return json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]

    assert lm.main(["export", str(run_dir), str(tmp_path / "plain")]) == 0
    assert lm.main(["export", str(run_dir), str(tmp_path / "guided"), "--cfg-scale", "1.5"]) == 0
    assert "gepard.cfg_scale" not in metadata(tmp_path / "plain")
    assert metadata(tmp_path / "guided")["gepard.cfg_scale"] == "1.5"


def test_export_loads_in_c(exported):
    _need(INSPECT)
    r = _run([INSPECT, "model", exported, "--text", SENTENCES[0]])
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()
    assert "2 layers, hidden 64, 4 q heads / 2 kv heads × 16" in out, out
    assert "compressor      8 queries, 2 blocks, 4 heads" in out, out
    special = lm.tokenizer_special_ids(exported / "tokenizer.json")
    assert f"SOT {special['start_of_text']}, EOT {special['end_of_text']}, SOS {special['start_of_speech']}" in out


def test_export_loads_in_reference(exported):
    """gepard_reference.py (transformers' Qwen3_5TextModel + overlay) loads it strictly, and
    lm.py's own bf16 inference gives the very same greedy frames."""
    ids = ref.layout_ids(str(exported), SENTENCES[0])
    g = ref.generate_greedy(str(exported), ids, max_frames=MAX_FRAMES)
    model, special, _ = lm.load_for_inference(exported, "cpu")
    assert ids == lm.text_layout(ref.tokenize(str(exported), SENTENCES[0]), special)
    frames, _ = lm.generate(model, ids, None, MAX_FRAMES, greedy=True)
    assert np.array_equal(frames.numpy(), g["frames"])
    ref._CACHE.clear()


# ---- greedy generation against the C engine -----------------------------------------------------

def _c_generate(exported, text, out, *options, max_frames=MAX_FRAMES):
    r = _run([INSPECT, "generate", exported, "--text", text, "--greedy", "--max-frames", max_frames,
              "--output", out, *options])
    assert r.returncode == 0, r.stderr.decode()
    return load_file(str(out))["frames"]


@pytest.mark.parametrize("text", SENTENCES)
@pytest.mark.parametrize("voice", ["default", "null", "codes"])
def test_greedy_frames_match_c(exported, data, voice, text, tmp_path):
    _need(INSPECT)
    options, sample_options, c_prefix = [], [], None
    if voice == "null":
        options, sample_options = ["--null-prefix"], ["--voice", "null"]
    elif voice == "codes":
        clip = torch.load(data / "codes.pt", weights_only=False)["utterances"][5]["codes"]
        codes_path = tmp_path / "ref-codes.safetensors"
        save_file({"codes": clip.numpy().astype(np.int32)}, str(codes_path))
        options = ["--ref-codes", str(codes_path)]
        # the C compressor's prefix, fed to lm.py: the same prefix on both sides
        lm_out = tmp_path / "lm.safetensors"
        r = _run([INSPECT, "lm", exported, "--text", text, "--ref-codes", codes_path, "--output", lm_out])
        assert r.returncode == 0, r.stderr.decode()
        c_prefix = load_file(str(lm_out))["prefix"]
        save_file({"prefix": c_prefix}, str(tmp_path / "prefix.safetensors"))
        sample_options = ["--prefix", str(tmp_path / "prefix.safetensors")]
        model, _, _ = lm.load_for_inference(exported, "cpu")
        with torch.no_grad():
            mine = model.ref_compressor(clip[None])[0].float().numpy()
        rel = float(np.max(np.abs(mine - c_prefix)) / np.max(np.abs(c_prefix)))
        print(f"\ncompressor prefix, lm.py vs C: max rel {rel:.4f}")
        assert rel <= PREFIX_TOL

    print(f"\n{voice} {text!r}: " + compare_greedy(exported, text, voice, options, sample_options, c_prefix,
                                                   tmp_path))


def compare_greedy(exported, text, voice, options, sample_options, c_prefix, tmp_path, max_frames=MAX_FRAMES,
                   cfg_scale=1.0):
    """Greedy frames of the C engine (gepard-inspect generate) and of lm.py sample for the same
    text, prefix and text-CFG scale: identical, or parted only at a near tie of lm.py's own logits.
    A line saying which."""
    cfg = ["--cfg-scale", str(cfg_scale)]
    c_frames = _c_generate(exported, text, tmp_path / "c.safetensors", *options, *cfg, max_frames=max_frames)
    out = tmp_path / "py.safetensors"
    assert lm.main(["sample", str(exported), "--text", text, "--greedy", "--max-frames", str(max_frames),
                    "--output", str(out), "--threads", "1", *sample_options, *cfg]) == 0
    py_frames = load_file(str(out))["frames"]
    assert py_frames.dtype == np.int32 and py_frames.shape[1] == 32
    where = f"{voice} {text!r}"
    n = min(len(c_frames), len(py_frames))
    first = next((j for j in range(n) if not np.array_equal(c_frames[j], py_frames[j])), None)
    if first is None and len(c_frames) == len(py_frames):
        note = "identical"
    else:
        # Both sides round to bf16 where §1.9 says, but sum their GEMMs in different orders: a
        # greedy choice may flip where two levels are within that noise, and from there on the
        # histories differ. Allowed only at such a near tie in lm.py's own logits.
        model, special, _ = lm.load_for_inference(exported, "cpu")
        ids = ref.layout_ids(str(exported), text)
        prefix = None
        if voice == "null":
            prefix = model.null_prefix
        elif voice == "codes":
            prefix = torch.from_numpy(c_prefix).to(torch.bfloat16)
        j = first if first is not None else n
        logits, stop = lm.forced_outputs(model, ids, prefix, py_frames[:j], cfg_scale, lm.text_layout([], special))
        scale = float(logits[logits > -1e8].abs().max())
        if first is not None:
            row = logits[first]
            heads = np.nonzero(c_frames[first] != py_frames[first])[0]
            top2 = torch.topk(row[heads], 2, dim=-1).values
            gaps = (top2[:, 0] - top2[:, 1]).numpy()
            assert np.all(gaps <= ARGMAX_MARGIN * scale), (
                f"{where}: frame {first} differs in heads {heads.tolist()}, lm.py top-2 gaps {gaps}")
            note = f"near tie at frame {first}, heads {heads.tolist()}, gaps {np.round(gaps, 4).tolist()}"
        else:
            assert abs(float(stop[n]) - STOP_LOGIT_THRESHOLD) <= ARGMAX_MARGIN * scale, (
                f"{where}: C {len(c_frames)} frames, lm.py {len(py_frames)}, stop logit {float(stop[n]):.4f}")
            note = f"same frames, stop differs at a near tie (logit {float(stop[n]):.4f})"
    return f"C {len(c_frames)} frames, lm.py {len(py_frames)}: {note}"


@pytest.mark.parametrize("cfg_scale", [0.5, 2.0])
@pytest.mark.parametrize("voice", ["default", "null"])
def test_cfg_frames_match_c(exported, voice, cfg_scale, tmp_path):
    """Text-CFG (§3.4: the empty text's branch beside the text's, u + w·(c − u)): lm.py and the C
    reference loop give the same greedy frames."""
    _need(INSPECT)
    options, sample_options = (["--null-prefix"], ["--voice", "null"]) if voice == "null" else ([], [])
    print(f"\ncfg {cfg_scale} {voice}: " + compare_greedy(exported, SENTENCES[0], voice, options, sample_options,
                                                          None, tmp_path, cfg_scale=cfg_scale))


def test_text_dropout_reads_the_empty_text(data, tokenizer_json):
    """--text-dropout P: a share P of a batch's examples read the empty text (the layout of no
    tokens, as text-CFG's second branch), their frames as they would be otherwise."""
    levels, records = lm.load_codes(data / "codes.pt")
    special = lm.tokenizer_special_ids(tokenizer_json)
    utterances, _ = lm.prepare_utterances(records, levels, tokenizer_json, special, 600, set())
    plan = lm.VoicePlan(utterances, lm.default_speaker_of(utterances))
    empty = lm.text_layout([], special)
    assert empty == [special["start_of_text"], special["end_of_text"], special["start_of_speech"]]
    indices = list(range(len(utterances)))
    dropped = 0
    for step in range(20):
        kept = lm.training_examples(utterances, plan, {"text_dropout": 0.0}, indices, empty, random.Random(step))
        some = lm.training_examples(utterances, plan, {"text_dropout": 0.3}, indices, empty, random.Random(step))
        assert all(u.ids != empty for u, _, _ in kept)
        for (u, _, _), (v, _, _) in zip(kept, some):
            assert v.codes is u.codes and v.speaker == u.speaker
            if v.ids == empty:
                assert v.tokens == []
                dropped += 1
            else:
                assert v.ids == u.ids
    assert 0.2 < dropped / (20 * len(utterances)) < 0.4
    batch = lm.collate(some, lm.COMPRESSOR_QUERIES)
    assert len(batch["text_ids"]) == sum(len(u.ids) for u, _, _ in some)


def test_stop_fires_after_the_first_frame(exported, tmp_path):
    """§3.4: stop is never checked before frame 0; a stop head that always fires gives one frame on
    both sides."""
    _need(INSPECT)
    model_dir = tmp_path / "always-stop"
    shutil.copytree(exported, model_dir)
    tensors = load_pt(str(model_dir / "model.safetensors"))
    tensors["stop_head.bias"] = torch.full_like(tensors["stop_head.bias"], 30.0)
    save_pt(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    c_frames = _c_generate(model_dir, SENTENCES[1], tmp_path / "c.safetensors")
    out = tmp_path / "py.safetensors"
    assert lm.main(["sample", str(model_dir), "--text", SENTENCES[1], "--greedy", "--output", str(out),
                    "--threads", "1"]) == 0
    py_frames = load_file(str(out))["frames"]
    assert len(c_frames) == len(py_frames) == 1
    assert np.array_equal(c_frames, py_frames)


SHIPPED_VOICE = SOURCE_DIR / "models" / "voice"


@pytest.mark.parametrize("text", ["Imogen baked seventy-three violins in Lisbon.", "It is ten past four."])
def test_shipped_voice_greedy_frames_match_c(text, tmp_path):
    """The default voice (models/voice, trained by tools/voice/recipe.sh): the C engine speaks it
    as lm.py does, greedy, over a whole sentence."""
    _need(INSPECT)
    if not (SHIPPED_VOICE / "config.json").exists():
        pytest.skip("this tree ships no trained voice")
    print(f"\nshipped voice {text!r}: " + compare_greedy(SHIPPED_VOICE, text, "default", [], [], None, tmp_path,
                                                          max_frames=200))
