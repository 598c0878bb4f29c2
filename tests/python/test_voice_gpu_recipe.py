"""The default voice's whole recipe through tools/voice/gpu-recipe.sh, run here on the CPU at toy size.

tools/voice/recipe.sh end to end (corpus, espeak-ng speech, the shipped codec's encoding, tokenizer,
LM, export) as gpu-recipe.sh drives it on a GPU host: started detached, followed, and left as a
snapshot of slimmed LM runs in OUT's parts. `gpu-recipe.sh unpack` puts the snapshot in its place
and the main LM's run where the next start is seeded from; the slimmed run exports to a checkpoint
directory the C engine loads, and a second start resumes the LM at the step the first one reached
(as after a lost machine) and trains it on. A second start while a recipe runs is refused, and
following on a machine where none was started (a fresh one) says so at once. A variant named in
GPU_RECIPE_FORKS starts from the main LM's run and trains on beside it, and the shipped codec's
decoder is tuned beside them (CODEC_TUNE_MINUTES), its encoder left as it was; with LM_MINUTES=0 a
new decoder of another width trains alone.

Needs espeak-ng (scripts/lib.sh installs it), models/voice/codec.nemo and gepard-inspect from
$GEPARD_BUILD_DIR/tools (default <repo>/build).
"""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR") or HERE.parents[1])
BUILD_DIR = Path(os.environ.get("GEPARD_BUILD_DIR") or SOURCE_DIR / "build")
INSPECT = BUILD_DIR / "tools" / "gepard-inspect"
SCRIPT = SOURCE_DIR / "tools" / "voice" / "gpu-recipe.sh"
CODEC = SOURCE_DIR / "models" / "voice" / "codec.nemo"


def step_of(run):
    return json.loads((run / "checkpoint" / "state.json").read_text())["step"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed")
    if not CODEC.is_file():
        pytest.skip(f"{CODEC} is missing")
    root = tmp_path_factory.mktemp("gpu-recipe")
    env = dict(os.environ)
    env.update({
        # recipe.sh and the tools it runs call python3: this one, with torch
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "GPU_RECIPE_RUN": str(root / "run"), "VOICE_WORK": str(root / "work"),
        "CORPUS_ARGS": "--size 120 --word-lists 20", "SPEECH_LIMIT": "40",
        "TOKENIZER_ARGS": "--vocab-size 300",
        "LM_ARGS": "--preset tiny --threads 2 --warmup 2 --log-every 2 --eval-every 1000 --valid-count 4",
        "LM_BATCH": "--max-tokens 3000 --max-batch 8", "LM_MINUTES": "0.15",
        "RECIPE_RESERVE_S": "5", "GPU_RECIPE_POLL_S": "1",
        "GPU_RECIPE_SEED": str(root / "seed"), "GPU_RECIPE_SNAPSHOT": str(root / "snapshot"),
        "GPU_RECIPE_COMPILE_CACHE": str(root / "compile-cache"), "GPU_RECIPE_STEPS": str(root / "lm-steps"),
    })
    return root, env


def gpu_recipe(env, out, *args, timeout=600):
    env = dict(env, OUT=str(out))
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_recipe_snapshot_exports_and_resumes(toy):
    root, env = toy
    first = gpu_recipe(env, root / "out1", "start", "6", "500")
    print(first.stdout[-3000:], first.stderr[-2000:])
    assert first.returncode == 0
    assert "gpu-recipe: the recipe ended, exit status 0" in first.stdout
    unpacked = gpu_recipe(env, root / "out1", "unpack", str(root / "out1"))
    assert unpacked.returncode == 0, unpacked.stderr
    snap = root / "snapshot"
    assert "recipe: finished" in (snap / "logs" / "recipe.log").read_text()
    assert not list(snap.glob("codec-tuned*"))

    reached = step_of(snap / "lm")
    assert reached > 0
    # recipe.sh's own LM options reach the run, the test's (later) ones over them
    hp = json.loads((snap / "lm" / "checkpoint" / "state.json").read_text())["train"]
    assert (hp["text_dropout"], hp["own_frames"], hp["frame_blank"], hp["warmup"]) == (0.15, 0.4, 0.3, 2)
    assert (snap / "lm" / "tokenizer.json").is_file()
    assert step_of(root / "seed" / "lm") == reached
    assert step_of(root / "lm-steps" / "lm" / f"{reached:06d}") == reached

    # the slimmed run exports to a checkpoint directory the C engine loads
    model = root / "model"
    subprocess.run([sys.executable, str(SOURCE_DIR / "tools" / "voice" / "lm.py"), "export", str(snap / "lm"),
                    str(model)], check=True, timeout=300)
    for name in ("config.json", "gepard_config.json", "tokenizer.json", "model.safetensors"):
        assert (model / name).is_file(), name
    if INSPECT.exists():
        shown = subprocess.run([str(INSPECT), "model", str(model)], capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr

    # a fresh start seeded with the unpacked snapshot resumes the LM where it was and trains on, a
    # variant forked from it beside it with an option of its own; a compile cache kept here goes
    # into the LM's run there and comes back with the snapshot (the LMs here run eager: it stays
    # as it was), kept here again and not in the seed
    kept = root / "compile-cache" / "lm" / "NVIDIA-H100-80GB-HBM3.bin"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(os.urandom(1000))
    cache = kept.read_bytes()
    env = dict(env, LM_MINUTES="0.3", LM_VARIANTS="blank:--frame-blank 0.2", GPU_RECIPE_FORKS="blank",
               CODEC_TUNE_MINUTES="0.1", CODEC_TUNE_ARGS="--batch 2 --max-frames 8 --warmup 2 --save-minutes 0.05")
    second = gpu_recipe(env, root / "out2", "start", "6", "1")
    assert second.returncode == 0, second.stderr
    assert f"gpu-recipe: resuming lm at step {reached}" in second.stdout
    assert f"gpu-recipe: blank starts from lm at step {reached}" in second.stdout
    # on a corpus drawn anew for that step: sentences the LM has not read
    assert f"gpu-recipe: corpus seed {reached + 1}" in second.stdout
    assert "gpu-recipe: lm compiles with the cache of NVIDIA-H100-80GB-HBM3.bin" in second.stdout
    assert (root / "run" / "lm" / "compile-cache" / kept.name).read_bytes() == cache
    refused = gpu_recipe(env, root / "out3", "start", "6", "1")
    assert refused.returncode != 0
    assert "a recipe is running already" in refused.stderr
    refused = gpu_recipe(dict(env, GPU_RECIPE_RUN=str(root / "unforked"), GPU_RECIPE_FORKS="wide"), root / "out3",
                         "start", "6", "1")
    assert refused.returncode != 0
    assert "GPU_RECIPE_FORKS names wide, which LM_VARIANTS does not" in refused.stderr
    assert not (root / "unforked").exists()
    deadline = time.time() + 600
    while True:
        followed = gpu_recipe(env, root / "out2", "follow", "60")
        assert followed.returncode == 0, followed.stderr
        if "the recipe ended" in followed.stdout or time.time() > deadline:
            break
    print(followed.stdout[-3000:])
    assert "gpu-recipe: the recipe ended, exit status 0" in followed.stdout
    assert gpu_recipe(env, root / "out2", "unpack", str(root / "out2")).returncode == 0
    assert step_of(snap / "lm") > reached
    assert step_of(root / "seed" / "lm") == step_of(snap / "lm")
    # each step brought back is kept: the mean of the two is a run that exports
    steps = sorted((root / "lm-steps" / "lm").iterdir())
    assert [step_of(k) for k in steps] == [reached, step_of(snap / "lm")]
    assert not (steps[-1] / "compile-cache").exists()
    subprocess.run([sys.executable, str(SOURCE_DIR / "tools" / "voice" / "lm.py"), "average", *map(str, steps),
                    "--out", str(root / "mean")], check=True, timeout=300)
    assert step_of(root / "mean") == step_of(snap / "lm")
    assert step_of(snap / "lm-blank") > reached
    hp = json.loads((snap / "lm-blank" / "checkpoint" / "state.json").read_text())["train"]
    assert (hp["frame_blank"], hp["text_dropout"]) == (0.2, 0.15)
    assert not (root / "seed" / "lm-blank").exists()
    shutil.rmtree(root / "compile-cache")
    assert gpu_recipe(env, root / "out2", "unpack", str(root / "out2")).returncode == 0
    for name in ("lm", "lm-blank"):
        assert (snap / name / "compile-cache" / kept.name).read_bytes() == cache
        assert (root / "compile-cache" / name / kept.name).read_bytes() == cache
    assert not (root / "seed" / "lm" / "compile-cache").exists()
    # one too large to come back from a call stays where it is, the weights come back alone
    capped = gpu_recipe(dict(env, GPU_RECIPE_COMPILE_CACHE_MB="0"), root / "out5", "follow", "1")
    assert capped.returncode == 0, capped.stderr
    assert "gpu-recipe: lm's compile cache (" in capped.stdout and "too large to bring back" in capped.stdout
    parts = b"".join(p.read_bytes() for p in sorted((root / "out5").glob("voice-run.tar.part*")))
    with tarfile.open(fileobj=io.BytesIO(parts)) as tar:
        names = tar.getnames()
    assert any(n.endswith("checkpoint/state.json") for n in names)
    assert not [n for n in names if "compile-cache" in n]
    assert "recipe: finished" in (snap / "logs" / "recipe.log").read_text()
    assert (root / "work" / "corpus" / "seed").read_text().strip() == str(reached + 1)
    # the tuned codec: only its decoder changed; finished, its run is no longer in the seed
    assert not (root / "seed" / "codec-tuned.ckpt").exists() and not (snap / "codec-tuned.ckpt").exists()
    sys.path.insert(0, str(SOURCE_DIR / "tools" / "voice"))
    import codec

    shipped, tuned = (codec.read_nemo(p)[1] for p in (CODEC, snap / "codec-tuned.nemo"))
    assert shipped.keys() == tuned.keys()
    assert all(torch.equal(shipped[k], tuned[k]) for k in shipped if k.startswith("audio_encoder."))
    assert any(not torch.equal(shipped[k], tuned[k]) for k in shipped if k.startswith("audio_decoder."))


def test_decoder_alone(toy):
    """LM_MINUTES=0: a session that trains the codec's decoder alone (no LM run to seed it, none
    started), here a new one of another width on the shipped codec's encoder, and beside it a
    variant with the adversarial losses, and finishes when both tunings do; both tuned codecs come
    back, their finished runs stay there."""
    root, env = toy
    sys.path.insert(0, str(SOURCE_DIR / "tools" / "voice"))
    import codec

    dirs = {name: root / f"decoder-{name}" for name in ("run", "work", "seed", "snapshot", "steps")}
    env = dict(env, GPU_RECIPE_RUN=str(dirs["run"]), VOICE_WORK=str(dirs["work"]), GPU_RECIPE_SEED=str(dirs["seed"]),
               GPU_RECIPE_SNAPSHOT=str(dirs["snapshot"]), GPU_RECIPE_STEPS=str(dirs["steps"]), LM_MINUTES="0",
               CODEC_TUNE_MINUTES="0.1",
               CODEC_TUNE_ARGS="--batch 2 --max-frames 8 --warmup 2 --save-minutes 0.05 --decoder-channels 64",
               CODEC_TUNE_VARIANTS="adv:--adversarial-weight 0.1")
    started = gpu_recipe(env, root / "decoder-out", "start", "6", "500")
    print(started.stdout[-3000:], started.stderr[-2000:])
    assert started.returncode == 0
    assert "gpu-recipe: the recipe ended, exit status 0" in started.stdout
    assert gpu_recipe(env, root / "decoder-out", "unpack", str(root / "decoder-out")).returncode == 0
    snap = dirs["snapshot"]
    log = (snap / "logs" / "recipe.log").read_text()
    assert "no LM (LM_MINUTES=0)" in log and "recipe: finished" in log
    assert not (dirs["run"] / "lm").exists() and not list(snap.glob("lm*"))
    assert "codec-tuned-adv: eval" in log
    assert not (dirs["seed"] / "lm").exists()
    shipped = codec.load_codec(CODEC)
    kept = shipped.state_dict()
    for name in ("codec-tuned", "codec-tuned-adv"):
        assert not (dirs["seed"] / f"{name}.ckpt").exists()
        tuned = codec.load_codec(snap / f"{name}.nemo")
        assert tuned.widths() == dict(shipped.widths(), decoder_channels=64)
        new = tuned.state_dict()
        assert all(torch.equal(kept[k], new[k]) for k in kept if not k.startswith("audio_decoder."))
    assert "codec: adversarial losses" in (snap / "logs" / "codec-tuned-adv.out").read_text()
    assert "adversarial" not in (snap / "logs" / "codec-tuned.out").read_text()


def test_follow_on_a_bare_machine_says_so_at_once(toy):
    root, env = toy
    began = time.time()
    followed = gpu_recipe(dict(env, GPU_RECIPE_RUN=str(root / "never-started")), root / "out4", "follow", "300")
    assert followed.returncode != 0
    assert "no recipe was started on this machine" in followed.stderr
    assert time.time() - began < 60
