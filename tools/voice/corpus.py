"""Text corpus for the default voice: Debian fortunes sentences plus generated sentences.

Three sources, all available offline:

* Debian's fortune cookie files (packages ``fortunes-min`` and ``fortunes``, installed under
  /usr/share/games/fortunes; ``tools/voice/espeak-prefix.sh`` also carries them to the GPU host).
  Each cookie is split into sentences; a sentence is kept when it is short plain prose: 3 to 25
  words, ASCII after quote folding, almost no symbols, not shouting. A few collections are left out
  as a whole (pictures, code, and the sets with the most offensive or political content), and so
  is any sentence with a word of BLOCKED_WORDS; the offensive package ``fortunes-off`` is never
  read.
* Sentences generated with a seeded RNG, half from templates (numbers, dates, times, money,
  names, places, phone numbers, measurements) and half composed from parts — an opening, a
  subject, an adverb, a verb, a quantity, an adjective, the objects, an ending — in a few clause
  shapes (composed_sentence), so that numbers and words come in many frames. Their names, places,
  objects, verbs, adjectives and adverbs come half the time from short lists and, where the
  dictionary below is at hand, half the time from the dictionary's words of that kind
  (SlotWords): "Quinton packed 2 periscopes in Sydney.", "On Friday evening, Quinton nervously
  packed about 45 rusty periscopes near the bridge."
* Word lists from Debian's English dictionary (package ``wamerican``, /usr/share/dict/
  american-english): "Ladle, remnant, Jamaica and bequeath." — 4 to 8 random words each, a
  quarter of the corpus by default. Fortunes and templates repeat a few thousand words; a voice
  must read words it never heard, and these teach it the spelling of tens of thousands.

A second, disjoint set of templates, names, verbs and places makes the held-out sentences used by
the speech-recognition test; no generated sentence holds one of those templates' frames
(HELDOUT_FRAMES). Every held-out sentence has its own name, number and verb, so a
recogniser's transcript tells them apart; no train sentence contains a held-out name, place or
verb, and no held-out sentence is in train.

The output is deterministic for a given seed, fortunes directory and dictionary:

    CORPUS_DIR/train.jsonl     {"id": "f000012", "text": "..."} per line (ids f… fortunes, g… generated,
                               w… word lists)
    CORPUS_DIR/heldout.jsonl   {"id": "h000", "text": "..."} per line

Run:

    python3 tools/voice/corpus.py CORPUS_DIR [--seed 1] [--size 30000] [--heldout 48]
        [--fortunes-dir /usr/share/games/fortunes] [--words-file /usr/share/dict/american-english]
        [--word-lists N (default size / 4)]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

DEFAULT_FORTUNES_DIR = "/usr/share/games/fortunes"
DEFAULT_WORDS_FILE = "/usr/share/dict/american-english"
DICTIONARY_WORD = re.compile(r"[A-Za-z][a-z]{2,13}")  # no possessives, abbreviations or capitals inside

# whole collections left out: pictures, source code, non-English text, and the sets whose
# cookies are most often offensive, sexual or political
EXCLUDED_COLLECTIONS = {
    "art", "ascii-art", "perl", "translate-me", "drugs", "ethnic", "men-women", "love",
    "politics", "linuxcookie",
}

MIN_WORDS = 3
MAX_WORDS = 25
MAX_SYMBOLS = 1  # characters outside letters, digits, space and . , ; : ' " ! ? - ( )

QUOTE_FOLDING = str.maketrans({
    "\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-",
    "\u00a0": " ", "`": "'",
})
PLAIN_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:'\"!?-()")
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')]*\s+(?=[\"'(]?[A-Z0-9])")
ATTRIBUTION = re.compile(r"^\s*(--|-- |~~|\u2014)")

# ---- generated sentences ---------------------------------------------------------------------------

TRAIN_NAMES = [
    "Anna", "Ben", "Clara", "Daniel", "Emma", "Felix", "Grace", "Henry", "Iris", "Jack", "Karen",
    "Leo", "Maria", "Nathan", "Olivia", "Peter", "Rachel", "Samuel", "Sophie", "Thomas", "Victor",
    "Wendy", "Alice", "Bruno", "Chloe", "David", "Ella", "Frank", "George", "Hannah", "Isaac",
    "Julia", "Kevin", "Laura", "Martin", "Nina", "Oscar", "Paula", "Robert", "Sarah", "Tim",
    "Ursula", "Walter", "Yvonne", "Adam", "Bella", "Carl", "Diana", "Eric", "Fiona", "Lucy", "Mark",
]
TRAIN_SURNAMES = [
    "Smith", "Johnson", "Brown", "Taylor", "Miller", "Wilson", "Moore", "Clark", "Lewis", "Walker",
    "Hall", "Young", "King", "Wright", "Green", "Baker", "Adams", "Nelson", "Carter", "Mitchell",
    "Roberts", "Turner", "Phillips", "Campbell", "Parker", "Evans", "Edwards", "Collins", "Stewart",
]
TRAIN_PLACES = [
    "London", "Paris", "Berlin", "Madrid", "Rome", "Vienna", "Dublin", "Boston", "Chicago",
    "Denver", "Seattle", "Toronto", "Sydney", "Tokyo", "Cairo", "Lisbon", "Prague", "Oslo",
    "Helsinki", "Athens", "Warsaw", "Budapest", "Amsterdam", "Brussels", "Geneva", "Montreal",
    "Vancouver", "Houston", "Phoenix", "Atlanta", "Miami", "Dallas", "Edinburgh", "Glasgow",
    "Manchester", "Liverpool", "Bristol", "Munich", "Hamburg", "Milan", "Naples", "Seville",
]
TRAIN_OBJECTS = [
    "apples", "books", "chairs", "tickets", "letters", "boxes", "bottles", "pencils", "candles",
    "cups", "shirts", "lamps", "keys", "stamps", "plates", "towels", "maps", "coins", "flowers",
    "eggs", "oranges", "blankets", "batteries", "notebooks", "umbrellas", "baskets", "spoons",
]
TRAIN_VERBS_PAST = [
    "bought", "sold", "found", "ordered", "packed", "counted", "carried", "delivered", "lost",
    "collected", "returned", "wrapped", "sent", "received", "moved", "checked", "cleaned", "opened",
]
TRAIN_ACTIVITIES = [
    "the meeting", "the concert", "the train", "the flight", "the lecture", "the game", "dinner",
    "the appointment", "the interview", "the ferry", "the bus", "the party", "the rehearsal",
    "the class", "the match", "lunch", "the show", "the tour",
]
TRAIN_UNITS = [
    ("kilometers", 1, 900), ("miles", 1, 500), ("meters", 1, 3000), ("kilograms", 1, 250),
    ("liters", 1, 80), ("degrees", -20, 45), ("minutes", 2, 180), ("hours", 2, 72),
    ("percent", 1, 100), ("centimeters", 1, 300), ("grams", 5, 950), ("pounds", 1, 400),
]
TRAIN_ADJECTIVES = [
    "new", "red", "blue", "green", "broken", "tiny", "heavy", "wooden", "shiny", "empty", "spare",
    "warm", "cheap", "rusty", "fresh", "plastic", "silver", "yellow", "strange", "large", "small",
    "round", "dusty", "clean", "antique", "ordinary", "famous", "useful", "expensive", "portable",
]
ADJECTIVE_ENDINGS = ("ous", "ful", "ive", "able", "ible", "less")
TRAIN_ADVERBS = [
    "carefully", "slowly", "quickly", "finally", "suddenly", "happily", "proudly", "nervously",
    "gently", "secretly", "gladly", "calmly", "eagerly", "easily", "politely", "silently", "neatly",
    "patiently", "cheerfully", "boldly", "hastily", "almost", "already", "also", "never", "often",
    "once", "twice", "soon", "still", "probably",
]
TRAIN_SUBJECTS = [
    "She", "He", "They", "We", "I", "My sister", "Our neighbor", "The teacher", "Her uncle",
    "His grandmother", "The driver", "A stranger", "The children", "Everyone", "The new manager",
]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]
ORDINALS = {1: "st", 2: "nd", 3: "rd", 21: "st", 22: "nd", 23: "rd", 31: "st"}

SMALL_NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                 "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
                 "seventeen", "eighteen", "nineteen"]
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]

# held-out vocabulary: none of these words occurs in a train sentence, and every one is in
# pocketsphinx-en-us's dictionary (the recognition test spells the numbers out)
HELDOUT_NAMES = [
    "Bartholomew", "Cassandra", "Desmond", "Rupert", "Fitzgerald", "Gwendolyn", "Horatio",
    "Imogen", "Jeremiah", "Katarina", "Leopold", "Millicent", "Nathaniel", "Ophelia", "Percival",
    "Rosalind", "Sebastian", "Theodora", "Ulysses", "Valentina", "Winifred", "Xavier", "Yolanda",
    "Zachariah", "Archibald", "Beatrix", "Cornelius", "Delphine", "Ebenezer", "Florentina",
    "Gideon", "Henrietta", "Ignatius", "Josephine", "Lysander", "Marguerite", "Octavius",
    "Penelope", "Reginald", "Seraphina", "Tobias", "Evangeline", "Maximilian", "Anastasia",
    "Barnaby", "Clementine", "Ferdinand", "Genevieve", "Humphrey", "Gertrude",
]
HELDOUT_VERBS = [
    "painted", "juggled", "polished", "repaired", "borrowed", "photographed", "measured",
    "decorated", "inspected", "assembled", "sharpened", "weighed", "folded", "planted", "stitched",
    "harvested", "engraved", "varnished", "sketched", "dismantled", "catalogued", "scrubbed",
    "labelled", "refurbished", "sorted", "calibrated", "ironed", "sanded", "glazed", "restored",
    "auctioned", "stacked", "tuned", "baked", "washed", "carved", "knitted", "brewed", "welded",
    "smuggled", "rescued", "hammered", "scraped", "feathered", "whittled", "quilted", "embroidered",
    "buttered", "pickled", "bottled",
]
HELDOUT_OBJECTS = [
    "violins", "lanterns", "telescopes", "kettles", "saddles", "hammocks", "trumpets", "canoes",
    "accordions", "chandeliers", "typewriters", "wheelbarrows", "pianos", "drums",
    "candles", "radios", "anchors", "ladders", "guitars", "clocks", "bagpipes",
    "barometers", "buckets", "fiddles", "lighthouses",
]
HELDOUT_PLACES = [
    "Reykjavik", "Madrid", "Valparaiso", "Timbuktu", "Kathmandu", "Zanzibar", "Samarkand",
    "Lisbon", "Tasmania", "Patagonia", "Casablanca", "Saskatoon", "Winnipeg", "Anchorage",
    "Honolulu", "Santiago", "Nairobi", "Mandalay", "Dublin", "Ljubljana", "Bratislava", "Zagreb",
    "Montevideo", "Asuncion", "Galway",
]
# words that drop a fortune sentence (mild profanity, sexual and violent words)
BLOCKED_WORDS = {
    "ass", "asses", "arse", "bastard", "bitch", "bloody", "crap", "damn", "damned", "dick", "fuck",
    "fucking", "shit", "piss", "pissed", "sex", "sexy", "sexual", "naked", "nude", "porn", "whore",
    "slut", "rape", "kill", "killed", "killing", "murder", "suicide", "drunk", "drug", "drugs",
    "nazi", "nigger", "faggot", "gay", "jew", "jews", "penis", "breasts", "orgasm", "virgin",
    "hell", "bomb", "gun", "guns", "die", "dead", "death",
}
HELDOUT_WORDS = {w.lower() for w in HELDOUT_NAMES + HELDOUT_VERBS + HELDOUT_OBJECTS + HELDOUT_PLACES}


def number_words(n):
    """English words for 0 <= n < 1,000,000 (used where a sentence spells a number out)."""
    if n < 20:
        return SMALL_NUMBERS[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else "-" + SMALL_NUMBERS[n % 10])
    if n < 1000:
        rest = n % 100
        return SMALL_NUMBERS[n // 100] + " hundred" + ("" if rest == 0 else " and " + number_words(rest))
    rest = n % 1000
    head = number_words(n // 1000) + " thousand"
    if rest == 0:
        return head
    return head + (" and " if rest < 100 else " ") + number_words(rest)


def ordinal(day):
    return f"{day}{ORDINALS.get(day, 'th')}"


def clock_time(rng):
    hour, minute = rng.randint(1, 12), rng.choice([0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55])
    style = rng.randrange(3)
    if style == 0:
        return f"{hour}:{minute:02d} {rng.choice(['a.m.', 'p.m.'])}"
    if style == 1:
        return f"{rng.randint(0, 23):02d}:{minute:02d}"
    if minute == 0:
        return f"{number_words(hour)} o'clock"
    return f"half past {number_words(hour)}" if minute == 30 else f"{minute} past {hour}"


def date_phrase(rng):
    month, day = rng.choice(MONTHS), rng.randint(1, 28)
    style = rng.randrange(4)
    if style == 0:
        return f"{month} {ordinal(day)}"
    if style == 1:
        return f"{month} {day}, {rng.randint(1900, 2039)}"
    if style == 2:
        return f"the {ordinal(day)} of {month}"
    return f"{rng.choice(WEEKDAYS)}, {month} {ordinal(day)}"


def money(rng):
    style = rng.randrange(4)
    if style == 0:
        return f"${rng.randint(1, 999)}.{rng.randint(0, 99):02d}"
    if style == 1:
        return f"{number_words(rng.randint(2, 99))} dollars"
    if style == 2:
        return f"{rng.randint(2, 500)} euros"
    return f"${rng.randint(1, 90) * 100:,}"


class SlotWords:
    """What fills a generated sentence's name, place, object, verb, adjective and adverb slots: the
    lists above and, given a dictionary's words (dictionary_words: none held out or blocked), half
    the time a word of the dictionary of that kind (a capitalised word for a name, surname or place,
    a lower-case one ending in -s for the objects, in -ed for the verb, in ADJECTIVE_ENDINGS for
    the adjective and in -ly for the adverb), so that the numbers, dates and names of the sentence
    frames come with words no list names."""

    def __init__(self, dictionary=()):
        self.proper = [w for w in dictionary if w[0].isupper() and not w.endswith("s")]
        self.plurals = [w for w in dictionary if w.islower() and w.endswith("s") and not w.endswith("ss")
                        and len(w) >= 4]
        self.past = [w for w in dictionary if w.islower() and w.endswith("ed") and len(w) >= 5]
        self.adjectives = [w for w in dictionary if w.islower() and w.endswith(ADJECTIVE_ENDINGS)]
        self.adverbs = [w for w in dictionary if w.islower() and w.endswith("ly") and len(w) >= 6]

    def pick(self, rng, listed, opened):
        return rng.choice(opened) if opened and rng.random() < 0.5 else rng.choice(listed)

    def name(self, rng):
        return self.pick(rng, TRAIN_NAMES, self.proper)

    def surname(self, rng):
        return self.pick(rng, TRAIN_SURNAMES, self.proper)

    def place(self, rng):
        return self.pick(rng, TRAIN_PLACES, self.proper)

    def objects(self, rng):
        return self.pick(rng, TRAIN_OBJECTS, self.plurals)

    def verb(self, rng):
        return self.pick(rng, TRAIN_VERBS_PAST, self.past)

    def adjective(self, rng):
        return self.pick(rng, TRAIN_ADJECTIVES, self.adjectives)

    def adverb(self, rng):
        return self.pick(rng, TRAIN_ADVERBS, self.adverbs)


def full_name(rng, w):
    return f"{w.name(rng)} {w.surname(rng)}"


def count_phrase(rng):
    n = rng.choice([rng.randint(2, 19), rng.randint(20, 99), rng.randint(100, 2000)])
    return str(n) if rng.random() < 0.6 else number_words(n)


TRAIN_TEMPLATES = [
    lambda r, w: f"{w.name(r)} {w.verb(r)} {count_phrase(r)} {w.objects(r)} in {w.place(r)}.",
    lambda r, w: f"{r.choice(TRAIN_ACTIVITIES).capitalize()} starts at {clock_time(r)} on {r.choice(WEEKDAYS)}.",
    lambda r, w: f"{full_name(r, w)} was born on {date_phrase(r)} in {w.place(r)}.",
    lambda r, w: f"The ticket to {w.place(r)} costs {money(r)}.",
    lambda r, w: (f"Please call {w.name(r)} at {r.randint(200, 999)} {r.randint(100, 999)} "
                  f"{r.randint(1000, 9999)}."),
    lambda r, w: (f"It is {r.randint(2, 30)} degrees in {w.place(r)} "
                  f"this {r.choice(['morning', 'afternoon', 'evening'])}."),
    lambda r, w: f"We drove {r.randint(5, 900)} kilometers from {w.place(r)} to {w.place(r)}.",
    lambda r, w: f"Did {w.name(r)} pay {money(r)} for the {r.choice(TRAIN_OBJECTS)[:-1]}?",
    lambda r, w: f"On {date_phrase(r)}, {w.name(r)} moved to {w.place(r)}.",
    lambda r, w: f"{w.name(r)} and {w.name(r)} met at {clock_time(r)} near the station.",
    lambda r, w: f"The package weighs {r.randint(1, 40)}.{r.randint(0, 9)} kilograms.",
    lambda r, w: (lambda u: f"The distance was {r.randint(u[1], u[2])} {u[0]}.")(r.choice(TRAIN_UNITS)),
    lambda r, w: f"Room {r.randint(1, 60)}{r.randint(0, 20):02d} is on the {ordinal(r.randint(1, 30))} floor.",
    lambda r, w: f"{full_name(r, w)} scored {r.randint(0, 100)} points in the final.",
    lambda r, w: f"The year {r.randint(1066, 2039)} was a busy one for {w.place(r)}.",
    lambda r, w: f"My flight leaves {w.place(r)} at {clock_time(r)} and lands in {w.place(r)}.",
    lambda r, w: f"{w.name(r)} saved {money(r)} in {r.choice(MONTHS)}.",
    lambda r, w: (f"About {r.randint(2, 99)} percent of the {w.objects(r)} "
                  f"were {r.choice(['red', 'blue', 'green', 'broken', 'new', 'old'])}."),
    lambda r, w: f"The meeting with {full_name(r, w)} is on {r.choice(WEEKDAYS)} at {clock_time(r)}.",
    lambda r, w: f"Order number {r.randint(10000, 99999)} ships to {w.place(r)} on {date_phrase(r)}.",
    lambda r, w: f"There are {count_phrase(r)} {w.objects(r)} on the table, and {count_phrase(r)} in the box.",
    lambda r, w: f"{w.name(r)} asked whether {w.place(r)} is far from {w.place(r)}.",
    lambda r, w: f"Turn left after {r.randint(100, 900)} meters and walk to {w.place(r)} Street.",
    lambda r, w: f"The train to {w.place(r)} is {r.randint(2, 55)} minutes late.",
]

# The held-out templates' own frames: no generated sentence holds one (the held-out sentences stay
# new sentences in new frames, not new words in known ones).
HELDOUT_FRAMES = ("yesterday evening", "beside the harbor", "before sunrise", "for the festival",
                  "nobody expected")


def composed_opening(r):
    part = r.choice(["morning", "afternoon", "evening", "night"])
    return r.choice([
        lambda: r.choice(["Last night", "This morning", "After lunch", "Later that day", "At last",
                          "Last week", "Every summer", "Once a year", "Meanwhile", "Luckily"]),
        lambda: f"On {r.choice(WEEKDAYS)} {part}",
        lambda: f"Early on {r.choice(WEEKDAYS)}",
        lambda: f"{number_words(r.randint(2, 12)).capitalize()} days ago",
        lambda: f"At {clock_time(r)}",
        lambda: f"On {date_phrase(r)}",
        lambda: f"Back in {r.randint(1950, 2030)}",
        lambda: f"After the {r.choice(['storm', 'game', 'meeting', 'concert', 'holidays'])}",
    ])()


def composed_subject(r, w):
    return r.choice([lambda: w.name(r), lambda: full_name(r, w), lambda: r.choice(TRAIN_SUBJECTS)])()


def composed_quantity(r):
    if r.random() < 0.15:
        return r.choice(["a dozen", "several", "a few", "many", "some", "two hundred"])
    return r.choice(["", "", "about ", "nearly ", "almost ", "at least ", "more than ", "only ",
                     "over ", "just "]) + count_phrase(r)


def composed_ending(r, w):
    return r.choice([
        lambda: "",
        lambda: f" in {w.place(r)}",
        lambda: f" near the {r.choice(['station', 'river', 'school', 'market', 'bridge', 'old mill'])}",
        lambda: f" at {clock_time(r)}",
        lambda: f" on {r.choice(WEEKDAYS)}",
        lambda: f" on {date_phrase(r)}",
        lambda: f" for {w.name(r)}",
        lambda: f" with {full_name(r, w)}",
        lambda: f" in {r.choice(MONTHS)}",
        lambda: r.choice([" at home", " last week", " after dinner", " behind the house",
                          " in the garden", " on the way back", " without a word"]),
    ])()


def composed_sentence(r, w):
    """A sentence put together from parts — an opening, a subject, an adverb, a past verb, a
    quantity, an adjective, the objects, an ending — in one of a few clause shapes, so that the
    generated sentences' numbers and words come in many frames rather than the templates' few:
    "On Friday evening, Quinton nervously packed about 45 rusty periscopes near the bridge." """
    subject, verb = composed_subject(r, w), w.verb(r)
    # a subject inside the sentence is not capitalised, unless it is a name or "I"
    inner = subject[0].lower() + subject[1:] if subject in TRAIN_SUBJECTS and subject != "I" else subject
    adverb = f"{w.adverb(r)} " if r.random() < 0.5 else ""
    adjective = f"{w.adjective(r)} " if r.random() < 0.5 else ""
    things = f"{composed_quantity(r)} {adjective}{w.objects(r)}"
    shape = r.randrange(5)
    if shape == 0:
        text = f"{composed_opening(r)}, {inner} {adverb}{verb} {things}{composed_ending(r, w)}."
    elif shape == 1:
        text = f"{subject} {adverb}{verb} {things}{composed_ending(r, w)}."
    elif shape == 2:
        said = r.choice(["said", "wrote", "thought", "heard", "told us", "explained"])
        text = f"{w.name(r)} {said} that {inner} {verb} {things}{composed_ending(r, w)}."
    elif shape == 3:
        text = f"Had {inner} {adverb}{verb} {things}{composed_ending(r, w)}?"
    else:
        text = f"{things} were {adverb}{verb}{composed_ending(r, w)}."
    return text[0].upper() + text[1:]


def generated_sentence(r, w):
    """A generated sentence: half the time from TRAIN_TEMPLATES, half the time composed; never in
    a held-out template's frame."""
    while True:
        text = r.choice(TRAIN_TEMPLATES)(r, w) if r.random() < 0.5 else composed_sentence(r, w)
        if not any(frame in text.lower() for frame in HELDOUT_FRAMES):
            return text


def heldout_sentences(rng, count):
    """``count`` sentences in held-out templates; each has its own name, verb and number."""
    if count > min(len(HELDOUT_NAMES), len(HELDOUT_VERBS)):
        raise ValueError(f"at most {min(len(HELDOUT_NAMES), len(HELDOUT_VERBS))} held-out sentences")
    names = rng.sample(HELDOUT_NAMES, count)
    verbs = rng.sample(HELDOUT_VERBS, count)
    numbers = rng.sample(range(3, 97), count)
    templates = [
        lambda n, v, k: (f"{n} {v} {number_words(k)} {rng.choice(HELDOUT_OBJECTS)} "
                         f"beside the harbor of {rng.choice(HELDOUT_PLACES)}."),
        lambda n, v, k: f"Yesterday evening {n} quietly {v} exactly {k} old {rng.choice(HELDOUT_OBJECTS)}.",
        lambda n, v, k: (f"In {rng.choice(HELDOUT_PLACES)}, {n} {v} {number_words(k)} "
                         f"{rng.choice(HELDOUT_OBJECTS)} before sunrise."),
        lambda n, v, k: f"Nobody expected that {n} {v} {k} {rng.choice(HELDOUT_OBJECTS)} for the festival.",
    ]
    return [templates[i % len(templates)](names[i], verbs[i], numbers[i]) for i in range(count)]


# ---- fortunes --------------------------------------------------------------------------------------


def fortune_files(directory):
    """Collection files of a fortunes directory (no .dat indexes, no .u8 copies), sorted."""
    directory = Path(directory)
    files = []
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.suffix not in (".dat", ".u8") and path.name not in EXCLUDED_COLLECTIONS:
            files.append(path)
    return files


def cookies(path):
    """The cookies of one fortune file (separated by lines holding a single %)."""
    text = path.read_bytes().decode("utf-8", errors="replace")
    current = []
    for line in text.splitlines():
        if line.strip() == "%":
            if current:
                yield current
            current = []
        else:
            current.append(line)
    if current:
        yield current


def clean_sentence(sentence):
    """The sentence if it is short plain prose, else None."""
    s = " ".join(sentence.translate(QUOTE_FOLDING).split())
    if not s or not s.isascii():
        return None
    words = s.split()
    if not (MIN_WORDS <= len(words) <= MAX_WORDS):
        return None
    if sum(1 for c in s if c not in PLAIN_CHARS) > MAX_SYMBOLS:
        return None
    if s.count('"') % 2 or s.count("(") != s.count(")"):
        return None
    letters = [c for c in s if c.isalpha()]
    if len(letters) < 8 or sum(c.isupper() for c in letters) > 0.3 * len(letters):
        return None
    if not s[0].isupper() or s[-1] not in ".!?":
        return None
    if re.search(r"\b[A-Z]:|\.\.|\d{5,}|\bQ\b|:$", s):  # dialogue tags, ellipses, long codes
        return None
    return s


def fortune_sentences(directory):
    """Clean sentences from all kept collections, in file order, without duplicates."""
    seen, out = set(), []
    for path in fortune_files(directory):
        for lines in cookies(path):
            # an attribution line ("-- Mark Twain") and what follows it are not prose
            body = []
            for line in lines:
                if ATTRIBUTION.match(line):
                    break
                body.append(line)
            text = " ".join(" ".join(body).split())
            for sentence in SENTENCE_END.split(text):
                s = clean_sentence(sentence)
                if s and s not in seen:
                    seen.add(s)
                    out.append(s)
    return out


def is_blocked(sentence):
    return any(w.lower() in BLOCKED_WORDS for w in re.findall(r"[A-Za-z]+", sentence))


def mentions_heldout(sentence):
    return any(w.lower() in HELDOUT_WORDS for w in re.findall(r"[A-Za-z]+", sentence))


# ---- word lists -------------------------------------------------------------------------------------


def dictionary_words(path):
    """The dictionary's plain words, sorted: 3 to 14 letters, capitalised or not, none held out
    or blocked."""
    with open(path, encoding="utf-8", errors="replace") as f:
        words = {line.strip() for line in f}
    return sorted(w for w in words if DICTIONARY_WORD.fullmatch(w) and not mentions_heldout(w) and not is_blocked(w))


def word_list_sentence(rng, words):
    """4 to 8 random words: "Ladle, remnant, Jamaica and bequeath." """
    picked = [rng.choice(words) for _ in range(rng.randint(4, 8))]
    picked[0] = picked[0][0].upper() + picked[0][1:]
    return ", ".join(picked[:-1]) + " and " + picked[-1] + "."


# ---- assembly --------------------------------------------------------------------------------------


def build_corpus(seed=1, size=30000, heldout_count=48, fortunes_dir=DEFAULT_FORTUNES_DIR,
                 words_file=DEFAULT_WORDS_FILE, word_lists=None):
    """(train, heldout): lists of {"id", "text"}; deterministic for the same seed and inputs.
    word_lists (default size // 4) of the size are word-list sentences where words_file exists."""
    rng = random.Random(seed)
    lists, words = [], []
    if words_file and Path(words_file).is_file():
        words = dictionary_words(words_file)
        list_rng = random.Random(seed * 7919 + 2)
        count = size // 4 if word_lists is None else min(word_lists, size)
        lists = list(dict.fromkeys(word_list_sentence(list_rng, words) for _ in range(count)))
    else:
        print(f"corpus: no dictionary {words_file}; no word lists", file=sys.stderr)
    heldout_texts = heldout_sentences(random.Random(seed * 7919 + 1), heldout_count)
    held = set(heldout_texts)

    fortunes = []
    if fortunes_dir and Path(fortunes_dir).is_dir():
        fortunes = [s for s in fortune_sentences(fortunes_dir)
                    if not mentions_heldout(s) and not is_blocked(s) and s not in held]
    else:
        print(f"corpus: no fortunes directory {fortunes_dir}; generated sentences only", file=sys.stderr)
    rng.shuffle(fortunes)
    fortunes = fortunes[: min((size * 3) // 4, size - len(lists))]  # at most 3/4 of the corpus

    generated, seen = [], set(fortunes) | held | set(lists)
    slots = SlotWords(words)
    attempts = 0
    while len(fortunes) + len(lists) + len(generated) < size and attempts < size * 20:
        attempts += 1
        s = generated_sentence(rng, slots)
        if s not in seen and not mentions_heldout(s):
            seen.add(s)
            generated.append(s)

    train = [{"id": f"f{i:06d}", "text": t} for i, t in enumerate(fortunes)]
    train += [{"id": f"g{i:06d}", "text": t} for i, t in enumerate(generated)]
    train += [{"id": f"w{i:06d}", "text": t} for i, t in enumerate(lists)]
    rng.shuffle(train)
    heldout = [{"id": f"h{i:03d}", "text": t} for i, t in enumerate(heldout_texts)]
    return train, heldout


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=True) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus_dir", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--size", type=int, default=30000, help="train sentences (default 30000)")
    parser.add_argument("--heldout", type=int, default=48, help="held-out sentences (default 48)")
    parser.add_argument("--fortunes-dir", default=DEFAULT_FORTUNES_DIR)
    parser.add_argument("--words-file", default=DEFAULT_WORDS_FILE)
    parser.add_argument("--word-lists", type=int, help="word-list sentences (default size / 4)")
    args = parser.parse_args(argv)

    train, heldout = build_corpus(args.seed, args.size, args.heldout, args.fortunes_dir, args.words_file,
                                  args.word_lists)
    args.corpus_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(args.corpus_dir / "train.jsonl", train)
    write_jsonl(args.corpus_dir / "heldout.jsonl", heldout)
    kinds = {k: sum(1 for r in train if r["id"].startswith(k)) for k in "fgw"}
    words = sum(len(r["text"].split()) for r in train)
    distinct = len({w.strip(".,").lower() for r in train for w in r["text"].split()})
    print(f"corpus: {len(train)} train sentences ({kinds['f']} from fortunes, {kinds['g']} generated, "
          f"{kinds['w']} word lists; {words} words, {distinct} distinct), {len(heldout)} held out "
          f"→ {args.corpus_dir}")


if __name__ == "__main__":
    main()
