"""Corpus for the tokenizer parity test (test_tokenizer_parity.py).

Lines are bytes without b"\\n" (gepard-tokenize reads one line per '\\n'). They come from

* the seed sentences in tests/data/tokenizer/*.txt, as written, decomposed (NFD) and mutated
  (case, splices across languages, inserted whitespace, punctuation, digits, contractions, emoji,
  added tokens whole and broken, random characters);
* random characters drawn by Unicode general category;
* constructed hard cases: combining-mark stacks in every order, Hangul jamo, emoji ZWJ sequences,
  skin tones, flags and keycaps, runs of every kind of whitespace, long lines;
* invalid UTF-8: corrupted seed lines and random bytes.

Everything is drawn from one random.Random, so a seed reproduces the corpus.
"""

import ctypes
import ctypes.util
import pathlib
import random
import sys
import unicodedata

REPO = pathlib.Path(__file__).resolve().parents[2]
SEED_DIR = REPO / "tests" / "data" / "tokenizer"

CATEGORIES = [
    "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps", "Pe",
    "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf",
]

# White_Space, plus look-alikes that are not whitespace (ZWSP, ZWNJ, ZWJ, word joiner, BOM,
# Mongolian vowel separator).
SPACES = [
    " ", "\t", "\r", "\x0b", "\x0c", "\x85", "\xa0", "\u1680", "\u2000", "\u2001", "\u2002",
    "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028",
    "\u2029", "\u202f", "\u205f", "\u3000", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff",
    "\u180e", "\r\r", "  ", "\t\t",
]

PUNCTUATION = list("!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~") + [
    "...", "…", "—", "–", "«", "»", "„", "“", "”", "‘", "’", "¿", "¡", "。", "、", "，", "！",
    "？", "：", "；", "「", "」", "『", "』", "·", "•", "§", "¶", "†", "‰", "′", "″", "©", "®",
    "™", "€", "£", "¥", "₹", "₽", "°", "±", "×", "÷", "∞", "≈", "≠", "√", "∑", "→", "⇒",
    "٫", "،", "؛", "؟", "।", "॥", "๏", "๚",
]

CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Re", "'rE",
                "'VE", "'vE", "'M", "'LL", "'Ll", "'lL", "'D", "'ſ", "'x", "'", "’s", "'sa"]

EMOJI = [
    "😀", "😂", "🥲", "🎉", "👍", "👍🏻", "👍🏼", "👍🏽", "👍🏾", "👍🏿", "👩‍💻", "👩🏾‍💻",
    "👨‍👩‍👧‍👦", "🧑‍🤝‍🧑", "🏳️‍🌈", "🏳‍⚧", "❤️", "❤", "✈️", "☺️", "🇩🇪", "🇯🇵", "🇺🇸", "🇺🇦", "🇧🇷",
    "🇦", "🇿🇿", "1️⃣", "#️⃣", "*⃣", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🫠", "🦄", "🐈‍⬛", "👁️‍🗨️", "🤷🏽‍♀️",
    "\U0001f3fb", "\u200d", "\ufe0f", "\u20e3",
]

MARKS = ["\u0300", "\u0301", "\u0302", "\u0303", "\u0308", "\u030a", "\u030c", "\u0323",
         "\u0327", "\u0328", "\u0331", "\u0334", "\u0345", "\u05b0", "\u05bc", "\u0651",
         "\u064e", "\u093c", "\u094d", "\u0e31", "\u0e48", "\u3099", "\u309a", "\u1ab0",
         "\u20d7", "\ufe20"]

NUMBERS = ["0", "7", "42", "2026", "3.14159", "1,000,000", "-17", "+1 (555) 010-2368",
           "１２３", "٣٤٥", "४२", "๓๔", "²", "½", "Ⅻ", "①", "〇", "12:30", "1e-9", "0x1F"]


def _seed_files(seed_dir):
    files = {}
    for path in sorted(pathlib.Path(seed_dir).glob("*.txt")):
        lines = [line for line in path.read_text(encoding="utf-8").split("\n") if line]
        files[path.stem] = lines
    return files


def _glib_classes(code_points):
    """For each code point, which of \\p{L}, \\p{M}, \\p{N} GLib's PCRE2 puts it in, or None when
    libglib cannot be loaded."""
    name = ctypes.util.find_library("glib-2.0") or "libglib-2.0.so.0"
    try:
        glib = ctypes.CDLL(name)
    except OSError:
        return None
    glib.g_regex_new.restype = ctypes.c_void_p
    glib.g_regex_new.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    glib.g_regex_replace_literal.restype = ctypes.c_void_p
    glib.g_regex_replace_literal.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_char_p,
        ctypes.c_int, ctypes.c_void_p]
    glib.g_free.argtypes = [ctypes.c_void_p]
    glib.g_regex_unref.argtypes = [ctypes.c_void_p]
    # one character per line, so that what a class removes leaves an empty line
    text = "\n".join(chr(c) for c in code_points).encode("utf-8", "surrogatepass")
    classes = {c: set() for c in code_points}
    g_regex_optimize = 1 << 13  # JIT; without it every match re-validates the whole text
    for label, pattern in (("L", rb"\p{L}"), ("M", rb"\p{M}"), ("N", rb"\p{N}")):
        regex = glib.g_regex_new(pattern, g_regex_optimize, 0, None)
        if not regex:
            return None
        out = glib.g_regex_replace_literal(regex, text, len(text), 0, b"", 0, None)
        glib.g_regex_unref(regex)
        if not out:
            return None
        left = ctypes.string_at(out).decode("utf-8").split("\n")
        glib.g_free(out)
        for c, rest in zip(code_points, left):
            if rest == "":
                classes[c].add(label)
    return classes


def _python_classes(c):
    ch = chr(c)
    major = unicodedata.category(ch)[0]
    return {major} & {"L", "M", "N"}


_POOL = None


def char_pool():
    global _POOL
    if _POOL is None:
        _POOL = CharPool()
    return _POOL


class CharPool:
    """Assigned code points by general category, as Python's unicodedata knows them: no
    surrogates (Cs), no private use (Co), no unassigned (Cn).

    Also left out, when GLib can be asked: code points whose letter / mark / number class in GLib's
    PCRE2 differs from unicodedata's. PCRE2 carries its own Unicode tables (10.42:
    Unicode 14.0), the Rust `tokenizers` has Oniguruma's (Unicode 15 and later); where Python is
    newer than PCRE2, characters added since then are unassigned for PCRE2 (so neither letters nor
    marks) and the regex splits them differently from the reference. No choice in the tokenizer
    can fix that short of carrying Unicode tables of its own.
    """

    def __init__(self):
        by_category = {c: [] for c in CATEGORIES}
        candidates = []
        for c in range(0x110000):
            cat = unicodedata.category(chr(c))
            if cat in by_category and c != 0x0A:
                candidates.append(c)
        glib = _glib_classes([c for c in candidates if c != 0])
        self.excluded = []
        for c in candidates:
            if glib is not None and c != 0 and glib[c] != _python_classes(c):
                self.excluded.append(c)
                continue
            by_category[unicodedata.category(chr(c))].append(c)
        self.by_category = {k: v for k, v in by_category.items() if v}
        self.categories = sorted(self.by_category)

    def char(self, rng, category=None):
        category = category or rng.choice(self.categories)
        return chr(rng.choice(self.by_category[category]))

    def string(self, rng, n):
        return "".join(self.char(rng) for _ in range(n))


def _mutate(rng, pool, text, all_lines, added_tokens):
    words = text.split(" ")
    ops = rng.randint(1, 4)
    for _ in range(ops):
        op = rng.randrange(12)
        i = rng.randrange(len(words) + 1)
        if op == 0:
            words.insert(i, rng.choice(SPACES) * rng.randint(1, 4))
        elif op == 1:
            words.insert(i, "".join(rng.choice(PUNCTUATION) for _ in range(rng.randint(1, 5))))
        elif op == 2 and words:
            j = min(i, len(words) - 1)
            words[j] = words[j] + rng.choice(CONTRACTIONS)
        elif op == 3:
            words.insert(i, rng.choice(NUMBERS))
        elif op == 4:
            words.insert(i, "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4))))
        elif op == 5:
            token = rng.choice(added_tokens)
            if rng.random() < 0.3:
                cut = rng.randrange(1, len(token))
                token = token[:cut] if rng.random() < 0.5 else token[cut:]
            if rng.random() < 0.5 and words:
                j = min(i, len(words) - 1)
                k = rng.randint(0, len(words[j]))
                words[j] = words[j][:k] + token + words[j][k:]
            else:
                words.insert(i, token)
        elif op == 6 and words:
            j = min(i, len(words) - 1)
            words[j] = rng.choice([str.upper, str.lower, str.title, str.swapcase])(words[j])
        elif op == 7:
            words.insert(i, pool.string(rng, rng.randint(1, 6)))
        elif op == 8:
            other = rng.choice(all_lines).split(" ")
            a = rng.randrange(len(other))
            words[i:i] = other[a:a + rng.randint(1, 6)]
        elif op == 9 and words:
            j = min(i, len(words) - 1)
            words[j] = unicodedata.normalize(rng.choice(["NFD", "NFKD", "NFKC"]), words[j])
        elif op == 10 and len(words) > 1:
            del words[min(i, len(words) - 1)]
        else:
            j = min(i, max(len(words) - 1, 0))
            if words:
                k = rng.randint(0, len(words[j]))
                marks = "".join(rng.choice(MARKS) for _ in range(rng.randint(1, 3)))
                words[j] = words[j][:k] + marks + words[j][k:]
    return rng.choice([" ", " ", " ", "", "  ", "\t", "\u3000"]).join(words)


def _mark_stack(rng, pool):
    base = rng.choice(["a", "e", "o", "A", "q", "ᄀ", "が", "क", "ש", "ا", "ω", "и", "", " ", "1"])
    marks = [rng.choice(MARKS) if rng.random() < 0.6 else pool.char(rng, rng.choice(["Mn", "Mc", "Me"]))
             for _ in range(rng.randint(1, 6))]
    rng.shuffle(marks)
    return base + "".join(marks)


def _hangul(rng):
    out = []
    for _ in range(rng.randint(1, 6)):
        out.append(chr(0x1100 + rng.randrange(19)))
        out.append(chr(0x1161 + rng.randrange(21)))
        if rng.random() < 0.6:
            out.append(chr(0x11A8 + rng.randrange(27)))
        if rng.random() < 0.2:
            out.append(chr(0xAC00 + rng.randrange(11172)))
    return "".join(out)


def _invalid_utf8(rng, valid_lines):
    kind = rng.randrange(4)
    if kind == 0:
        data = bytearray(rng.choice(valid_lines).encode("utf-8"))
        for _ in range(rng.randint(1, 4)):
            data.insert(rng.randint(0, len(data)), rng.randrange(0x80, 0x100))
        return bytes(data)
    if kind == 1:
        data = rng.choice(valid_lines).encode("utf-8")
        cut = rng.randint(0, len(data))
        return data[:cut] + data[cut + 1:]
    if kind == 2:
        pieces = [b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xf4\x90\x80\x80",
                  b"\xf0\x9f\x98", b"\xe2\x82", b"\xc3", b"\xff", b"\xfe", b"\x80\x80", b"\xf8\x88\x80\x80\x80",
                  b"\xef\xbf\xbd", b"a", b" ", b"\x00", b"\xc2\xa0", b"\xe3\x80\x80", b"'s"]
        return b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 10)))
    return bytes(rng.choice([rng.randrange(0x80, 0x100), rng.randrange(0x00, 0x100)])
                 for _ in range(rng.randint(1, 30))).replace(b"\n", b"\xff")


def build_corpus(seed, n_lines=24000, added_tokens=(), seed_dir=SEED_DIR):
    """Returns `n_lines` lines (bytes without b"\\n"), the same for the same seed."""
    rng = random.Random(seed)
    pool = char_pool()
    files = _seed_files(seed_dir)
    seeds = [line for lines in files.values() for line in lines]
    added = list(added_tokens) or ["<|endoftext|>"]
    lines = [line.encode("utf-8") for line in seeds]
    lines += [unicodedata.normalize("NFD", line).encode("utf-8") for line in seeds]

    while len(lines) < n_lines:
        r = rng.random()
        if r < 0.40:
            text = _mutate(rng, pool, rng.choice(seeds), seeds, added)
        elif r < 0.55:
            text = pool.string(rng, rng.randint(1, 40))
        elif r < 0.62:
            text = " ".join(_mark_stack(rng, pool) for _ in range(rng.randint(1, 4)))
        elif r < 0.66:
            text = _hangul(rng)
        elif r < 0.72:
            parts = [rng.choice(SPACES + PUNCTUATION + EMOJI + NUMBERS + CONTRACTIONS + ["a", "B", "é", "字"])
                     for _ in range(rng.randint(1, 16))]
            text = "".join(parts)
        elif r < 0.76:
            text = "".join(rng.choice(SPACES) for _ in range(rng.randint(1, 8)))
            if rng.random() < 0.5:
                text = rng.choice(["", "x", "é", "1", "!"]) + text + rng.choice(["", "y", "字", "2", "?"])
        elif r < 0.79:
            # long lines cross the windows the C side cuts the regex's work into
            text = rng.choice(SPACES[:3]).join(rng.choice(seeds) for _ in range(rng.randint(10, 60)))
        elif r < 0.82:
            token = rng.choice(added)
            text = token * rng.randint(1, 3) + pool.string(rng, rng.randint(0, 3)) + rng.choice(added)
        elif r < 0.85:
            text = unicodedata.normalize("NFD", rng.choice(seeds)).swapcase()
        else:
            lines.append(_invalid_utf8(rng, seeds))
            continue
        lines.append(text.replace("\n", " ").encode("utf-8"))
    rng.shuffle(lines)
    return lines[:n_lines]


def expected_text(line):
    """What the reference encodes for a line: invalid UTF-8 replaced as Python does."""
    return line.decode("utf-8", "replace")


if __name__ == "__main__":
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    corpus = build_corpus(seed)
    sys.stdout.buffer.write(b"\n".join(corpus) + b"\n")
