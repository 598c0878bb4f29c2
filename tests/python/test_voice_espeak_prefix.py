"""tools/voice/espeak-prefix.sh: espeak-ng packed for a GPU host without it (its .debs and the
English part of espeak-ng-data), unpacked into a prefix that reads every speaker of the recipe
exactly as the installed espeak-ng does.

Needs espeak-ng installed (scripts/lib.sh installs it), apt-get and dpkg, and Debian's mirror.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR") or HERE.parents[1])
SCRIPT = SOURCE_DIR / "tools" / "voice" / "espeak-prefix.sh"
sys.path.insert(0, str(SOURCE_DIR / "tools" / "voice"))

import speech  # noqa: E402


def test_packed_espeak_reads_every_speaker_as_the_installed_one(tmp_path):
    for tool in ("espeak-ng", "apt-get", "dpkg"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    env = dict(os.environ, GEPARD_PREFIX=str(tmp_path / "prefix"))
    packed = subprocess.run(["bash", str(SCRIPT), "pack"], env=env, capture_output=True, text=True, timeout=600)
    if packed.returncode != 0 and "Failed to fetch" in packed.stderr:
        pytest.skip("Debian's mirror cannot be reached")
    assert packed.returncode == 0, packed.stderr
    debs = tmp_path / "prefix" / "espeak" / "debs"
    names = sorted(p.name for p in debs.iterdir())
    assert "espeak-ng-data-en.tar.gz" in names and not [n for n in names if n.startswith("espeak-ng-data_")]
    assert sum(p.stat().st_size for p in debs.iterdir()) < 8 * 2**20

    exports = subprocess.run(["bash", str(SCRIPT), "env"], env=env, capture_output=True, text=True, timeout=300)
    assert exports.returncode == 0, exports.stderr
    values = dict(line.removeprefix("export ").split("=", 1) for line in exports.stdout.splitlines())
    root = tmp_path / "prefix" / "espeak" / "root"
    data = Path(values["ESPEAK_DATA_PATH"])
    assert [p.name for p in (data / "espeak-ng-data").glob("*_dict")] == ["en_dict"]
    assert (Path(values["FORTUNES_DIR"]) / "fortunes").is_file() and Path(values["WORDS_FILE"]).is_file()

    text = "On the 3rd of May, Doctor Okafor paid 41 dollars for seven blue kettles."
    for name, voice, pitch, speed in [*speech.TRAIN_SPEAKERS, speech.HELDOUT_SPEAKER]:
        wavs = []
        for espeak, espeak_data in (("espeak-ng", None), (str(root / "usr" / "bin" / "espeak-ng"), data)):
            wav = tmp_path / f"{name}-{len(wavs)}.wav"
            cmd = speech.espeak_command(espeak, voice, pitch, speed, wav, espeak_data)
            subprocess.run(cmd, input=text, text=True, check=True, timeout=60, capture_output=True)
            wavs.append(wav.read_bytes())
        assert len(wavs[0]) > 20000, name
        assert wavs[0] == wavs[1], f"{name} ({voice}) reads otherwise from the packed prefix"
