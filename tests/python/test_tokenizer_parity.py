"""Parity of gepard-tokenize (gepard-core's tokenizer) with the PyPI `tokenizers` library.

A byte-level BPE in exactly Qwen3.5's layout (gepard-model.md §4) is trained with `tokenizers` on a
corpus built fresh on every run (tests/python/tokenizer_corpus.py; the seed is printed, and
GEPARD_TEST_SEED replays it). Every line of that corpus must encode to the ids that
tokenizer.encode(line, add_special_tokens=False) gives, and ids must decode to the same text as
tokenizer.decode(ids, skip_special_tokens=False).

Run after building: ninja -C build tools/gepard-tokenize; then pytest tests/python.
"""

import importlib.util
import json
import os
import pathlib
import random
import secrets
import subprocess
import sys
import unicodedata

import pytest

HERE = pathlib.Path(__file__).resolve().parent
SOURCE_DIR = pathlib.Path(os.environ.get("GEPARD_SOURCE_DIR", HERE.parents[1]))
BUILD_DIR = pathlib.Path(os.environ.get("GEPARD_BUILD_DIR", SOURCE_DIR / "build"))
TOOL = BUILD_DIR / "tools" / "gepard-tokenize"

sys.path.insert(0, str(HERE))
import tokenizer_corpus  # noqa: E402

tokenizers = pytest.importorskip("tokenizers")


def _load_make_base_tokenizer():
    path = SOURCE_DIR / "tools" / "make-base-tokenizer.py"
    spec = importlib.util.spec_from_file_location("make_base_tokenizer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mbt = _load_make_base_tokenizer()

SEED = int(os.environ.get("GEPARD_TEST_SEED") or secrets.randbits(32))
N_LINES = 22000
TRAINED_VOCAB = 3000
SHOW = 5


def say(config, message):
    """Prints past pytest's output capture, so that the numbers show in every run."""
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        print(message)
        return
    with capture.global_and_fixture_disabled():
        print(message)


@pytest.fixture(scope="module")
def tool():
    if not TOOL.exists():
        pytest.fail("%s is missing: build it with ninja -C %s tools/gepard-tokenize" % (TOOL, BUILD_DIR))
    return TOOL


@pytest.fixture(scope="module")
def corpus(pytestconfig):
    lines = tokenizer_corpus.build_corpus(SEED, N_LINES, added_tokens=mbt.ADDED_TOKENS)
    assert len(lines) >= 20000
    say(pytestconfig, "\ntokenizer corpus: seed %d (GEPARD_TEST_SEED=%d replays it), %d lines, %d bytes, "
        "%d lines of invalid UTF-8" % (SEED, SEED, len(lines), sum(len(line) + 1 for line in lines),
                                       sum(not _is_utf8(line) for line in lines)))
    return lines


def _is_utf8(line):
    try:
        line.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizer")


@pytest.fixture(scope="module")
def trained(corpus, workdir):
    """A Qwen3.5-layout tokenizer trained on this run's corpus (the seeds included)."""
    texts = [tokenizer_corpus.expected_text(line) for line in corpus] + mbt.seed_lines()
    tokenizer = mbt.train_qwen35_layout(texts, TRAINED_VOCAB)
    path = workdir / "trained.json"
    path.write_text(tokenizer.to_str(), encoding="utf-8")
    return path


def run_tool(tool, path, lines, *options):
    data = b"\n".join(lines) + b"\n" if lines else b""
    args = [str(tool), *options] + ([str(path)] if path is not None else [])
    result = subprocess.run(args, input=data, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")
    return result.stdout


def encode_with_tool(tool, path, lines):
    out = run_tool(tool, path, lines).split(b"\n")
    assert out[-1] == b"" and len(out) == len(lines) + 1, "one output line per input line"
    return [[int(x) for x in row.split()] for row in out[:-1]]


def assert_same_ids(tool, path, lines, label):
    reference = tokenizers.Tokenizer.from_file(str(path))
    texts = [tokenizer_corpus.expected_text(line) for line in lines]
    expected = [e.ids for e in reference.encode_batch(texts, add_special_tokens=False)]
    got = encode_with_tool(tool, path, lines)
    bad = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    if bad:
        report = ["%s: %d of %d lines differ (seed %d)" % (label, len(bad), len(lines), SEED)]
        for i in bad[:SHOW]:
            report.append("  line %r\n    gepard     %s\n    tokenizers %s" % (lines[i], got[i], expected[i]))
        pytest.fail("\n".join(report))
    n_ids = sum(len(ids) for ids in expected)
    print("%s: %d lines, %d ids, all equal" % (label, len(lines), n_ids))


def test_encode_parity(tool, trained, corpus):
    assert_same_ids(tool, trained, corpus, "trained tokenizer")


def test_encode_parity_ignore_merges(tool, trained, corpus, workdir):
    data = json.loads(trained.read_text(encoding="utf-8"))
    data["model"]["ignore_merges"] = True
    path = workdir / "ignore_merges.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    # the reference reads the flag back
    assert json.loads(tokenizers.Tokenizer.from_file(str(path)).to_str())["model"]["ignore_merges"]
    assert_same_ids(tool, path, corpus, "trained tokenizer, ignore_merges")


def test_encode_parity_base_tokenizer(tool, corpus):
    assert_same_ids(tool, SOURCE_DIR / "models" / "tokenizer.json", corpus, "models/tokenizer.json")


def test_encode_parity_merges_as_strings(tool, trained, corpus, workdir):
    """The legacy "left right" form of the merges, and a compact file."""
    data = json.loads(trained.read_text(encoding="utf-8"))
    data["model"]["merges"] = [" ".join(pair) for pair in data["model"]["merges"]]
    path = workdir / "string_merges.json"
    path.write_text(json.dumps(data, ensure_ascii=True, separators=(",", ":")), encoding="utf-8")
    assert_same_ids(tool, path, corpus[:4000], "trained tokenizer, string merges, ASCII-escaped JSON")


def test_encode_parity_added_token_flags(tool, trained, corpus, workdir):
    """Non-special added tokens with lstrip, rstrip, single_word and normalized, which Qwen3.5 does
    not use but tokenizer.json allows."""
    data = json.loads(trained.read_text(encoding="utf-8"))
    next_id = max(t["id"] for t in data["added_tokens"]) + 1
    extra = [
        ("<mask>", dict(lstrip=True, rstrip=False, single_word=False, normalized=False)),
        ("[SEP]", dict(lstrip=False, rstrip=True, single_word=False, normalized=False)),
        ("<both>", dict(lstrip=True, rstrip=True, single_word=False, normalized=False)),
        ("qwzx", dict(lstrip=False, rstrip=False, single_word=True, normalized=True)),
        ("café", dict(lstrip=False, rstrip=False, single_word=False, normalized=True)),
        ("naïve", dict(lstrip=False, rstrip=False, single_word=True, normalized=False)),
        ("zzq", dict(lstrip=True, rstrip=True, single_word=True, normalized=True)),
        ("ｶﾀ", dict(lstrip=False, rstrip=False, single_word=False, normalized=True)),
    ]
    for i, (content, flags) in enumerate(extra):
        data["added_tokens"].append(dict(id=next_id + i, content=content, special=False, **flags))
    path = workdir / "flags.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")

    rng = random.Random(SEED)
    contexts = [" ", "  ", "\t", "x", "_", "1", "é", "字", "!", "\u3000", "\xa0", "", "\r"]
    lines = []
    for _ in range(6000):
        parts = []
        for _ in range(rng.randint(1, 5)):
            token = rng.choice(extra)[0]
            if rng.random() < 0.3:
                token = unicodedata.normalize("NFD", token)
            parts += [rng.choice(contexts) * rng.randint(0, 3), token]
        parts.append(rng.choice(contexts) * rng.randint(0, 3))
        lines.append("".join(parts).encode("utf-8"))
    assert_same_ids(tool, path, lines + corpus[:6000], "added tokens with flags")


def test_decode_parity(tool, trained, corpus):
    reference = tokenizers.Tokenizer.from_file(str(trained))
    rng = random.Random(SEED)
    n_ids = reference.get_vocab_size(with_added_tokens=True)
    id_lists = [e.ids for e in reference.encode_batch(
        [tokenizer_corpus.expected_text(line) for line in corpus[:8000]], add_special_tokens=False)]
    # random ids: byte tokens that spell broken UTF-8, added tokens, ids that do not exist
    for _ in range(4000):
        id_lists.append([rng.choice([rng.randrange(n_ids), rng.randrange(256), rng.randrange(n_ids + 50)])
                         for _ in range(rng.randint(0, 12))])
    expected = [reference.decode(ids, skip_special_tokens=False) for ids in id_lists]
    out = run_tool(tool, trained, [" ".join(map(str, ids)).encode() for ids in id_lists], "--decode")

    # a decoded text may itself contain '\n'; walk the output with the expected texts
    pos = 0
    for ids, text in zip(id_lists, expected):
        want = text.encode("utf-8") + b"\n"
        if out[pos:pos + len(want)] != want:
            pytest.fail("decode of %s (seed %d):\n  gepard     %r\n  tokenizers %r"
                        % (ids, SEED, out[pos:pos + len(want)], want))
        pos += len(want)
    assert pos == len(out)
    print("decode: %d id lists, all equal" % len(id_lists))


def test_replace_invalid_utf8_like_python(tool):
    rng = random.Random(SEED)
    interesting = [0x00, 0x41, 0x7F, 0x80, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0, 0xE1, 0xEC, 0xED,
                   0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF, 0x9F, 0xA0, 0x8F, 0x90]
    lines = []
    for _ in range(30000):
        n = rng.randint(0, 12)
        lines.append(bytes(rng.choice(interesting) if rng.random() < 0.7 else rng.randrange(256)
                           for _ in range(n)).replace(b"\n", b"\xc3"))
    # the tool takes no tokenizer in this mode
    out = run_tool(tool, None, lines, "--replace-invalid")
    expected = b"".join(line.decode("utf-8", "replace").encode("utf-8") + b"\n" for line in lines)
    if out != expected:
        got = out.split(b"\n")
        for line, row in zip(lines, got):
            want = line.decode("utf-8", "replace").encode("utf-8")
            if row != want:
                pytest.fail("%r (seed %d):\n  gepard %r\n  python %r" % (line, SEED, row, want))
        pytest.fail("outputs differ")
    print("UTF-8 repair: %d random byte strings, all equal" % len(lines))


def _glib():
    import ctypes
    import ctypes.util
    try:
        glib = ctypes.CDLL(ctypes.util.find_library("glib-2.0") or "libglib-2.0.so.0")
    except OSError:
        return None
    glib.g_unichar_combining_class.restype = ctypes.c_int
    glib.g_unichar_combining_class.argtypes = [ctypes.c_uint32]
    glib.g_unichar_decompose.restype = ctypes.c_int
    glib.g_unichar_decompose.argtypes = [ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32),
                                         ctypes.POINTER(ctypes.c_uint32)]
    return glib


def test_normalizer_like_reference(tool, trained, corpus):
    """NFC on every code point that has NFC data (a combining class, a decomposition, a part in a
    composition) in Python's or GLib's tables, probed next to marks of other classes, and on the
    corpus. This is what keeps the table of characters the reference's Unicode 9.0 data does not
    know (reference_nfc_starters in gepard-tokenizer.c) right."""
    import ctypes

    candidates = set()
    for c in range(0x110000):
        ch = chr(c)
        if unicodedata.category(ch) == "Cs":
            continue
        if unicodedata.combining(ch) or unicodedata.decomposition(ch):
            candidates.add(c)
    glib = _glib()
    if glib is not None:
        a, b = ctypes.c_uint32(), ctypes.c_uint32()
        for c in range(0x110000):
            if 0xD800 <= c < 0xE000:
                continue
            if glib.g_unichar_combining_class(c):
                candidates.add(c)
            if glib.g_unichar_decompose(c, ctypes.byref(a), ctypes.byref(b)) and a.value != c:
                candidates.update({c, a.value} | ({b.value} if b.value else set()))
    probes = []
    for c in sorted(candidates):
        x = chr(c)
        nfd = unicodedata.normalize("NFD", x)
        probes += [x, nfd, "q\u0301" + x, "q" + x + "\u0334", "a" + x + "\u0323", "\u1100" + x + "\u0301",
                   nfd + "\u0345" + x]
    probes = [p.encode("utf-8") for p in probes if "\n" not in p]
    lines = probes + corpus
    reference = tokenizers.normalizers.NFC()
    out = run_tool(tool, trained, lines, "--normalize").split(b"\n")
    assert len(out) == len(lines) + 1
    bad = []
    for line, row in zip(lines, out):
        want = reference.normalize_str(tokenizer_corpus.expected_text(line)).encode("utf-8")
        if row != want:
            bad.append((line, row, want))
    if bad:
        pytest.fail("%d of %d normalizations differ (seed %d), e.g.\n%s" % (
            len(bad), len(lines), SEED,
            "\n".join("  %r\n    gepard     %r\n    tokenizers %r" % t for t in bad[:SHOW])))
    print("NFC: %d code points probed, %d lines, all equal" % (len(candidates), len(lines)))


def test_cli_lines(tool):
    path = SOURCE_DIR / "models" / "tokenizer.json"
    reference = tokenizers.Tokenizer.from_file(str(path))

    def run(data, *options):
        return subprocess.run([str(tool), *options, str(path)], input=data, capture_output=True)

    # '\n' ends a line; the '\r' before it is part of the line; a last line without '\n' counts
    result = run(b"a\r\n\nb")
    assert result.returncode == 0
    rows = result.stdout.split(b"\n")
    assert rows[1] == b"" and rows[3] == b"" and len(rows) == 4
    assert [int(x) for x in rows[0].split()] == reference.encode("a\r", add_special_tokens=False).ids
    assert [int(x) for x in rows[2].split()] == reference.encode("b", add_special_tokens=False).ids
    assert run(b"").stdout == b""
    assert run(b"\n").stdout == b"\n"

    assert run(b"1 2 x\n", "--decode").returncode == 1
    failed = subprocess.run([str(tool), "/nonexistent/tokenizer.json"], input=b"a\n", capture_output=True)
    assert failed.returncode == 1 and b"nonexistent" in failed.stderr
    broken = subprocess.run([str(tool), str(SOURCE_DIR / "tests" / "data" / "tokenizer" / "en.txt")],
                            input=b"a\n", capture_output=True)
    assert broken.returncode == 1 and broken.stdout == b""


def test_make_base_tokenizer_reproduces_file(workdir):
    out = workdir / "base.json"
    subprocess.run([sys.executable, str(SOURCE_DIR / "tools" / "make-base-tokenizer.py"), "--output",
                    str(out)], check=True, timeout=300)
    committed = (SOURCE_DIR / "models" / "tokenizer.json").read_bytes()
    assert out.read_bytes() == committed, (
        "tools/make-base-tokenizer.py no longer reproduces models/tokenizer.json with tokenizers %s"
        % tokenizers.__version__)
    data = json.loads(committed)
    assert len(data["model"]["vocab"]) == mbt.BASE_VOCAB_SIZE
    assert [t["content"] for t in data["added_tokens"]] == mbt.ADDED_TOKENS
    assert [t["id"] for t in data["added_tokens"]] == list(range(4096, 4096 + 33))
    assert all(t["special"] and not t["normalized"] for t in data["added_tokens"])
    assert len(committed) < 1 << 20
