/* gepard-tokenizer.c: byte-level BPE from a Hugging Face tokenizer.json, id for id what the
 * `tokenizers` library computes for the layout Qwen3.5 uses (gepard-model.md §4).
 *
 * encode(text):
 *   1. invalid UTF-8 → U+FFFD per maximal subpart (as Python's decode("utf-8", "replace"));
 *   2. added tokens with normalized:false are cut out of the raw text (leftmost, longest match);
 *   3. every other stretch is NFC-normalized, then added tokens with normalized:true are cut out;
 *   4. the rest is split by the pre-tokenizer regex (behavior Isolated), each piece spelled in the
 *      GPT-2 byte alphabet and merged by rank-ordered BPE.
 * The tokenizer is immutable once loaded, so encode and decode may run on many threads. */
#include "gepard-tokenizer.h"
#include "gepard-error.h"
#include "gepard-json.h"

#include <json-glib/json-glib.h>
#include <string.h>

/* The id → token table is dense; ids above this are refused instead of allocated. Real
 * vocabularies stay below 2^18 (Qwen3.5: 248077 ids). */
#define MAX_TOKEN_ID (1 << 24)
/* tokenizer.json needs five levels; gepard_json_check refuses deeper input before json-glib sees
 * it (gepard-json.h) */
#define MAX_JSON_DEPTH GEPARD_JSON_MAX_DEPTH
/* The Qwen3.5 regex runs on windows of at least this many bytes (see split_window_end). */
#define SPLIT_WINDOW_BYTES 256

/* gepard-model.md §4, the Split pattern of Qwen3.5's pre-tokenizer. */
static const char qwen35_split_regex[]
    = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
      "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The same for PCRE2. Oniguruma's \s in the reference is the White_Space property; PCRE2's \s
 * also matches U+180E MONGOLIAN VOWEL SEPARATOR (kept in its \h from before Unicode 6.3), so the
 * class is spelled out. */
#define WHITE_SPACE_CLASS                                                                          \
  "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"    \
  "\\x{205F}\\x{3000}"
static const char qwen35_split_regex_pcre2[]
    = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
      "?[^" WHITE_SPACE_CLASS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|[" WHITE_SPACE_CLASS
      "]*[\\r\\n]+|[" WHITE_SPACE_CLASS "]+(?![^" WHITE_SPACE_CLASS "])|[" WHITE_SPACE_CLASS "]+";

/* The `regex` crate's \w, which `tokenizers` uses to decide single_word matches. */
static const char word_char_regex[] = "^[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";

/* Code points that the reference NFC (the `unicode-normalization-alignments` crate inside
 * `tokenizers`, Unicode 9.0 data) does not know, while GLib's newer tables give them a combining
 * class, a decomposition or a composition: the reference treats them as plain starters (class 0,
 * never decomposed or composed), and so does the normalizer below. Every older character keeps its
 * NFC data across Unicode versions (the stability policy), so with these the two agree. Found by
 * probing the reference normalizer with every code point that has NFC data in GLib; the parity
 * test tests/python/test_tokenizer_parity.py probes it again on each run. */
static const struct
{
  gunichar first, last;
} reference_nfc_starters[] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08D3},   {0x09FE, 0x09FE},
    {0x0C3C, 0x0C3C},   {0x0D3B, 0x0D3C},   {0x0EBA, 0x0EBA},   {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
    {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x11930, 0x11930}, {0x11935, 0x11935}, {0x11938, 0x11938}, {0x1193D, 0x1193E},
    {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97},
    {0x11F41, 0x11F42}, {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136},
    {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

typedef struct
{
  const char *content; /* in GepardTokenizer.strings */
  gint32 id;
  gboolean special;
  gboolean normalized;
  gboolean lstrip;
  gboolean rstrip;
  gboolean single_word;
} AddedToken;

/* A byte trie of added-token patterns; node 0 is the root, whose children are also indexed by
 * byte in root_child for the scan over every text position. */
typedef struct
{
  gint32 first_child;
  gint32 next_sibling;
  gint32 token; /* index into GepardTokenizer.added, -1 when no pattern ends here */
  guint8 byte;
} TrieNode;

typedef struct
{
  GArray *nodes; /* TrieNode */
  gint32 root_child[256];
  guint n_patterns;
} AddedTrie;

/* Open-addressing hash of the merges: (left id, right id) → (rank, merged id). */
typedef struct
{
  guint64 key; /* 0: empty slot */
  gint32 rank;
  gint32 merged;
} MergeSlot;

/* The BPE model's vocabulary: an open-addressing hash over (bytes, length), so that merged
 * tokens can be looked up without building C strings. */
typedef struct
{
  const char *token; /* in GepardTokenizer.strings */
  guint32 len;
  gint32 id;
} VocabEntry;

typedef struct
{
  guint32 entry; /* index + 1 into entries; 0: empty */
  guint32 hash;
} VocabSlot;

typedef struct
{
  VocabEntry *entries;
  guint n_entries;
  guint capacity;
  VocabSlot *slots;
  gsize mask;
} Vocab;

struct _GepardTokenizer
{
  GStringChunk *strings;
  Vocab vocab;
  GHashTable *added_ids; /* content → id */
  const char **id_to_token;
  guint n_ids;

  MergeSlot *merges;
  gsize merge_mask;
  gsize n_merges;
  gboolean ignore_merges;

  gboolean nfc;
  GRegex *split;
  gboolean split_is_qwen35;
  GRegex *word_char;

  AddedToken *added;
  guint n_added;
  AddedTrie raw_trie;        /* normalized:false, matched on the raw text */
  AddedTrie normalized_trie; /* normalized:true, matched after normalization */

  gint32 byte_ids[256]; /* vocabulary id of each byte's alphabet character, -1 if absent */
};

/* --- the GPT-2 byte alphabet ---------------------------------------------------------------- */

/* Bytes that are printable Latin-1 stand for themselves; the other 68 are numbered from U+0100 in
 * byte order. */
static gboolean
byte_is_printable (guint b)
{
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

typedef struct
{
  char utf8[256][3];
  guint8 utf8_len[256];
  gint16 char_to_byte[0x144]; /* the alphabet spans U+0000..U+0143 */
} ByteAlphabet;

static gpointer
byte_alphabet_init (gpointer data)
{
  ByteAlphabet *alphabet = g_new0 (ByteAlphabet, 1);
  guint extra = 0;

  for (guint c = 0; c < G_N_ELEMENTS (alphabet->char_to_byte); c++)
    alphabet->char_to_byte[c] = -1;
  for (guint b = 0; b < 256; b++)
    {
      gunichar c = byte_is_printable (b) ? b : 0x100 + extra++;
      alphabet->utf8_len[b] = g_unichar_to_utf8 (c, alphabet->utf8[b]);
      alphabet->char_to_byte[c] = b;
    }
  return alphabet;
}

static const ByteAlphabet *
byte_alphabet (void)
{
  static GOnce once = G_ONCE_INIT;
  return g_once (&once, byte_alphabet_init, NULL);
}

/* --- UTF-8 repair ---------------------------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at `s`, or 0 when there is none; then `*subpart` is the
 * length of the maximal subpart to replace by one U+FFFD (Unicode §3.9 "U+FFFD substitution of
 * maximal subparts", which Python's "replace" error handler follows). */
static gsize
utf8_sequence (const guchar *s, gsize avail, gsize *subpart)
{
  guchar b = s[0];
  guchar lo = 0x80, hi = 0xBF;
  gsize need;

  if (b < 0x80)
    return 1;
  if (b >= 0xC2 && b <= 0xDF)
    need = 1;
  else if (b == 0xE0)
    need = 2, lo = 0xA0;
  else if (b == 0xED)
    need = 2, hi = 0x9F;
  else if (b >= 0xE1 && b <= 0xEF)
    need = 2;
  else if (b == 0xF0)
    need = 3, lo = 0x90;
  else if (b >= 0xF1 && b <= 0xF3)
    need = 3;
  else if (b == 0xF4)
    need = 3, hi = 0x8F;
  else
    {
      *subpart = 1;
      return 0;
    }
  for (gsize k = 1; k <= need; k++)
    {
      if (k >= avail || s[k] < lo || s[k] > hi)
        {
          *subpart = k;
          return 0;
        }
      lo = 0x80;
      hi = 0xBF;
    }
  return need + 1;
}

static gboolean
utf8_is_valid (const char *s, gsize len)
{
  gsize i = 0, subpart;

  while (i < len)
    {
      if ((guchar)s[i] < 0x80)
        {
          i++;
          continue;
        }
      gsize n = utf8_sequence ((const guchar *)s + i, len - i, &subpart);
      if (n == 0)
        return FALSE;
      i += n;
    }
  return TRUE;
}

static void
append_valid_utf8 (GString *out, const char *s, gsize len)
{
  gsize i = 0, run = 0, subpart;

  while (i < len)
    {
      if ((guchar)s[i] < 0x80)
        {
          i++;
          continue;
        }
      gsize n = utf8_sequence ((const guchar *)s + i, len - i, &subpart);
      if (n > 0)
        {
          i += n;
          continue;
        }
      g_string_append_len (out, s + run, i - run);
      g_string_append (out, "\xEF\xBF\xBD");
      i += subpart;
      run = i;
    }
  g_string_append_len (out, s + run, len - run);
}

char *
gepard_tokenizer_replace_invalid_utf8 (const char *text, gssize length, gsize *out_length)
{
  g_return_val_if_fail (text != NULL || length == 0, NULL);

  gsize len = length < 0 ? strlen (text) : (gsize)length;
  GString *out = g_string_sized_new (len + 1);
  append_valid_utf8 (out, text, len);
  if (out_length)
    *out_length = out->len;
  return g_string_free (out, FALSE);
}

/* --- normalizer ------------------------------------------------------------------------------ */

static gboolean
is_reference_nfc_starter (gunichar c)
{
  gsize lo = 0, hi = G_N_ELEMENTS (reference_nfc_starters);

  while (lo < hi)
    {
      gsize mid = (lo + hi) / 2;
      if (c < reference_nfc_starters[mid].first)
        hi = mid;
      else if (c > reference_nfc_starters[mid].last)
        lo = mid + 1;
      else
        return TRUE;
    }
  return FALSE;
}

typedef struct
{
  gunichar c;
  guint8 ccc; /* canonical combining class as the reference knows it */
} NfcChar;

static guint8
reference_ccc (gunichar c)
{
  /* no character below U+0300 has a combining class */
  if (c < 0x300 || is_reference_nfc_starter (c))
    return 0;
  return g_unichar_combining_class (c);
}

/* Full canonical decomposition of valid UTF-8 `s` (UAX #15 D68), Hangul included. */
static void
nfc_decompose (GArray *chars, const char *s, gsize len)
{
  const char *end = s + len;

  g_array_set_size (chars, 0);
  for (const char *p = s; p < end;)
    {
      if ((guchar)*p < 0x80)
        {
          NfcChar ch = {(guchar)*p++, 0};
          g_array_append_val (chars, ch);
          continue;
        }
      gunichar c = g_utf8_get_char (p);
      p = g_utf8_next_char (p);
      /* canonical decompositions start at U+00C0 */
      if (c < 0xC0 || is_reference_nfc_starter (c))
        {
          NfcChar ch = {c, reference_ccc (c)};
          g_array_append_val (chars, ch);
          continue;
        }
      gunichar parts[G_UNICHAR_MAX_DECOMPOSITION_LENGTH];
      gsize n = g_unichar_fully_decompose (c, FALSE, parts, G_N_ELEMENTS (parts));
      for (gsize k = 0; k < n; k++)
        {
          NfcChar ch = {parts[k], reference_ccc (parts[k])};
          g_array_append_val (chars, ch);
        }
    }
}

/* Canonical ordering (UAX #15 D108): each run of non-starters sorted stably by class. A counting
 * sort keeps long runs linear, which matters for hostile input. */
static void
nfc_reorder (NfcChar *v, gsize n, GArray *scratch)
{
  for (gsize i = 0; i < n;)
    {
      if (v[i].ccc == 0)
        {
          i++;
          continue;
        }
      gsize run = i;
      while (i < n && v[i].ccc != 0)
        i++;
      gsize run_len = i - run;
      NfcChar *r = v + run;
      if (run_len <= 32)
        {
          for (gsize j = 1; j < run_len; j++)
            {
              NfcChar ch = r[j];
              gsize k = j;
              for (; k > 0 && r[k - 1].ccc > ch.ccc; k--)
                r[k] = r[k - 1];
              r[k] = ch;
            }
          continue;
        }
      gsize start[257] = {0};
      for (gsize j = 0; j < run_len; j++)
        start[r[j].ccc + 1]++;
      for (guint c = 1; c < 257; c++)
        start[c] += start[c - 1];
      g_array_set_size (scratch, run_len);
      NfcChar *sorted = (NfcChar *)scratch->data;
      for (gsize j = 0; j < run_len; j++)
        sorted[start[r[j].ccc]++] = r[j];
      memcpy (r, sorted, run_len * sizeof (NfcChar));
    }
}

/* Canonical composition (UAX #15 D117): each character joins the last starter when it is not
 * blocked from it (nothing between, or everything between of a lower class) and the pair has a
 * primary composite. Returns the new length. */
static gsize
nfc_compose (NfcChar *v, gsize n)
{
  gssize starter = -1;
  guint8 last_ccc = 0;
  gsize out = 0;

  for (gsize i = 0; i < n; i++)
    {
      NfcChar ch = v[i];
      gunichar composed;
      /* no character below U+0300 is the second of a pair */
      if (starter >= 0 && ch.c >= 0x300 && (out == (gsize)starter + 1 || last_ccc < ch.ccc)
          && !is_reference_nfc_starter (ch.c) && !is_reference_nfc_starter (v[starter].c)
          && g_unichar_compose (v[starter].c, ch.c, &composed))
        {
          v[starter].c = composed;
          continue;
        }
      if (ch.ccc == 0)
        starter = out;
      last_ccc = ch.ccc;
      v[out++] = ch;
    }
  return out;
}

/* Appends the normalizer's output for valid UTF-8 `s`: NFC computed from GLib's character data
 * (g_utf8_normalize shifts its whole buffer at every composition, which is quadratic on long
 * text), with the reference's view of the characters it does not know. */
static void
normalize_append (const GepardTokenizer *tokenizer, const char *s, gsize len, GString *out)
{
  gsize ascii = 0;

  while (ascii < len && (guchar)s[ascii] < 0x80)
    ascii++;
  if (!tokenizer->nfc || ascii == len)
    {
      /* ASCII alone is always in NFC */
      g_string_append_len (out, s, len);
      return;
    }

  /* the last ASCII character may compose with what follows */
  if (ascii > 0)
    ascii--;
  g_string_append_len (out, s, ascii);
  g_autoptr (GArray) chars = g_array_sized_new (FALSE, FALSE, sizeof (NfcChar), len - ascii);
  g_autoptr (GArray) scratch = g_array_new (FALSE, FALSE, sizeof (NfcChar));
  nfc_decompose (chars, s + ascii, len - ascii);
  NfcChar *v = (NfcChar *)chars->data;
  nfc_reorder (v, chars->len, scratch);
  gsize n = nfc_compose (v, chars->len);
  for (gsize i = 0; i < n; i++)
    {
      char utf8[6];
      g_string_append_len (out, utf8, g_unichar_to_utf8 (v[i].c, utf8));
    }
}

/* --- added tokens ---------------------------------------------------------------------------- */

static void
trie_init (AddedTrie *trie)
{
  TrieNode root = {-1, -1, -1, 0};

  trie->nodes = g_array_new (FALSE, FALSE, sizeof (TrieNode));
  g_array_append_val (trie->nodes, root);
  for (guint b = 0; b < 256; b++)
    trie->root_child[b] = -1;
  trie->n_patterns = 0;
}

static void
trie_clear (AddedTrie *trie)
{
  g_clear_pointer (&trie->nodes, g_array_unref);
}

#define TRIE_NODE(trie, i) (&g_array_index ((trie)->nodes, TrieNode, (i)))

/* The first token inserted for a pattern keeps it, as in the reference's matcher. */
static void
trie_insert (AddedTrie *trie, const char *pattern, gsize len, gint32 token)
{
  gint32 node = 0;

  for (gsize i = 0; i < len; i++)
    {
      guint8 b = pattern[i];
      gint32 child = i == 0 ? trie->root_child[b] : TRIE_NODE (trie, node)->first_child;
      if (i > 0)
        while (child >= 0 && TRIE_NODE (trie, child)->byte != b)
          child = TRIE_NODE (trie, child)->next_sibling;
      if (child < 0)
        {
          TrieNode fresh = {-1, TRIE_NODE (trie, node)->first_child, -1, b};
          child = trie->nodes->len;
          g_array_append_val (trie->nodes, fresh);
          TRIE_NODE (trie, node)->first_child = child;
          if (i == 0)
            trie->root_child[b] = child;
        }
      node = child;
    }
  if (TRIE_NODE (trie, node)->token < 0)
    {
      TRIE_NODE (trie, node)->token = token;
      trie->n_patterns++;
    }
}

/* The longest pattern that starts at s[pos]: its token, or -1. */
static gint32
trie_longest (const AddedTrie *trie, const char *s, gsize len, gsize pos, gsize *match_end)
{
  gint32 node = trie->root_child[(guint8)s[pos]];
  gint32 best = -1;
  gsize q = pos + 1;

  while (node >= 0)
    {
      const TrieNode *n = TRIE_NODE (trie, node);
      if (n->token >= 0)
        {
          best = n->token;
          *match_end = q;
        }
      if (q >= len)
        break;
      guint8 b = s[q++];
      node = n->first_child;
      while (node >= 0 && TRIE_NODE (trie, node)->byte != b)
        node = TRIE_NODE (trie, node)->next_sibling;
    }
  return best;
}

/* \s of the `regex` crate: the White_Space property. */
static gboolean
is_white_space (gunichar c)
{
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680
         || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F
         || c == 0x3000;
}

static gboolean
is_word_char_at (const GepardTokenizer *tokenizer, const char *s, const char *end)
{
  const char *next = g_utf8_next_char (s);
  return g_regex_match_full (tokenizer->word_char, s, MIN (next, end) - s, 0, 0, NULL, NULL);
}

typedef struct
{
  gsize start;
  gsize end;
  gint32 token; /* index into GepardTokenizer.added, -1 for text still to tokenize */
} Span;

static void
push_span (GArray *spans, gsize start, gsize end, gint32 token)
{
  Span span = {start, end, token};
  g_array_append_val (spans, span);
}

/* Cuts the added tokens of `trie` out of `s` as the reference's AddedVocabulary::find_matches
 * does: leftmost-longest matches, the scan resuming after each match whether or not it is kept;
 * single_word matches need a non-word character (or the text's edge) on both sides; lstrip and
 * rstrip take the whitespace around the match into the token. */
static void
find_added_tokens (const GepardTokenizer *tokenizer, const AddedTrie *trie, const char *s,
                   gsize len, GArray *spans)
{
  gsize start_offset = 0, pos = 0;

  g_array_set_size (spans, 0);
  if (len == 0)
    return;
  if (trie->n_patterns == 0)
    {
      push_span (spans, 0, len, -1);
      return;
    }
  while (pos < len)
    {
      gsize match_end = 0;
      gint32 token = trie->root_child[(guint8)s[pos]] < 0
                         ? -1
                         : trie_longest (trie, s, len, pos, &match_end);
      if (token < 0)
        {
          pos++;
          continue;
        }

      const AddedToken *added = &tokenizer->added[token];
      gsize start = pos, stop = match_end;
      pos = match_end;
      if (added->single_word)
        {
          gboolean space_before
              = start == 0
                || !is_word_char_at (tokenizer, g_utf8_find_prev_char (s, s + start), s + len);
          gboolean space_after = stop == len || !is_word_char_at (tokenizer, s + stop, s + len);
          if (!space_before || !space_after)
            continue;
        }
      if (added->lstrip)
        {
          gsize new_start = start;
          while (new_start > 0)
            {
              const char *prev = g_utf8_find_prev_char (s, s + new_start);
              if (!is_white_space (g_utf8_get_char (prev)))
                break;
              new_start = prev - s;
            }
          start = MAX (new_start, start_offset);
        }
      if (added->rstrip)
        while (stop < len && is_white_space (g_utf8_get_char (s + stop)))
          stop = g_utf8_next_char (s + stop) - s;
      if (start_offset < start)
        push_span (spans, start_offset, start, -1);
      push_span (spans, start, stop, token);
      start_offset = stop;
    }
  if (start_offset != len)
    push_span (spans, start_offset, len, -1);
}

/* --- vocabulary ----------------------------------------------------------------------------- */

static inline guint32
token_hash (const char *s, gsize len)
{
  /* FNV-1a */
  guint32 h = 2166136261u;
  for (gsize i = 0; i < len; i++)
    h = (h ^ (guchar)s[i]) * 16777619u;
  return h;
}

static void
vocab_init (Vocab *vocab)
{
  vocab->capacity = 1024;
  vocab->entries = g_new (VocabEntry, vocab->capacity);
  vocab->n_entries = 0;
  vocab->slots = g_new0 (VocabSlot, 2 * vocab->capacity);
  vocab->mask = 2 * vocab->capacity - 1;
}

static void
vocab_clear (Vocab *vocab)
{
  g_clear_pointer (&vocab->entries, g_free);
  g_clear_pointer (&vocab->slots, g_free);
}

static VocabSlot *
vocab_find_slot (const Vocab *vocab, const char *s, gsize len, guint32 hash)
{
  for (gsize i = hash & vocab->mask;; i = (i + 1) & vocab->mask)
    {
      VocabSlot *slot = &vocab->slots[i];
      if (slot->entry == 0)
        return slot;
      const VocabEntry *entry = &vocab->entries[slot->entry - 1];
      if (slot->hash == hash && entry->len == len && memcmp (entry->token, s, len) == 0)
        return slot;
    }
}

/* The id of the token spelled by s[0..len), or -1. */
static gint32
vocab_lookup (const Vocab *vocab, const char *s, gsize len)
{
  if (vocab->slots == NULL)
    return -1;
  const VocabSlot *slot = vocab_find_slot (vocab, s, len, token_hash (s, len));
  return slot->entry ? vocab->entries[slot->entry - 1].id : -1;
}

/* Sets the id of `token` (in GepardTokenizer.strings), adding the token if it is new: a repeated
 * name takes its last id, as json-glib keeps the last of repeated members. */
static void
vocab_set (Vocab *vocab, const char *token, gsize len, gint32 id)
{
  guint32 hash = token_hash (token, len);
  VocabSlot *slot = vocab_find_slot (vocab, token, len, hash);

  if (slot->entry)
    {
      vocab->entries[slot->entry - 1].id = id;
      return;
    }
  if (vocab->n_entries == vocab->capacity)
    {
      /* keep the table at most half full */
      vocab->capacity *= 2;
      vocab->entries = g_renew (VocabEntry, vocab->entries, vocab->capacity);
      g_free (vocab->slots);
      vocab->slots = g_new0 (VocabSlot, 2 * vocab->capacity);
      vocab->mask = 2 * vocab->capacity - 1;
      for (guint e = 0; e < vocab->n_entries; e++)
        {
          const VocabEntry *entry = &vocab->entries[e];
          guint32 h = token_hash (entry->token, entry->len);
          gsize i = h & vocab->mask;
          while (vocab->slots[i].entry != 0)
            i = (i + 1) & vocab->mask;
          vocab->slots[i] = (VocabSlot){e + 1, h};
        }
      slot = vocab_find_slot (vocab, token, len, hash);
    }
  vocab->entries[vocab->n_entries] = (VocabEntry){token, len, id};
  *slot = (VocabSlot){++vocab->n_entries, hash};
}

/* --- BPE ------------------------------------------------------------------------------------- */

static inline guint64
merge_key (gint32 left, gint32 right)
{
  /* ids are below 2^24, so the + 1 that keeps 0 free for empty slots cannot overflow */
  return (((guint64)(guint32)left << 32) | (guint32)right) + 1;
}

static inline gsize
merge_hash (guint64 key)
{
  key ^= key >> 33;
  key *= G_GUINT64_CONSTANT (0xff51afd7ed558ccd);
  key ^= key >> 33;
  return (gsize)key;
}

static gboolean
merge_lookup (const GepardTokenizer *tokenizer, gint32 left, gint32 right, gint32 *rank,
              gint32 *merged)
{
  guint64 key = merge_key (left, right);

  if (tokenizer->merges == NULL)
    return FALSE;
  for (gsize i = merge_hash (key) & tokenizer->merge_mask;; i = (i + 1) & tokenizer->merge_mask)
    {
      const MergeSlot *slot = &tokenizer->merges[i];
      if (slot->key == 0)
        return FALSE;
      if (slot->key == key)
        {
          *rank = slot->rank;
          *merged = slot->merged;
          return TRUE;
        }
    }
}

static MergeSlot *
merge_find_slot (MergeSlot *merges, gsize mask, guint64 key)
{
  for (gsize i = merge_hash (key) & mask;; i = (i + 1) & mask)
    if (merges[i].key == 0 || merges[i].key == key)
      return &merges[i];
}

/* A later merge of the same pair replaces the earlier one, as when the reference collects its
 * merges into a map. */
static void
merge_insert (GepardTokenizer *tokenizer, gint32 left, gint32 right, gint32 rank, gint32 merged)
{
  guint64 key = merge_key (left, right);

  if (tokenizer->merges == NULL || 2 * (tokenizer->n_merges + 1) > tokenizer->merge_mask + 1)
    {
      /* keep the table at most half full */
      gsize old_size = tokenizer->merges ? tokenizer->merge_mask + 1 : 0;
      gsize size = MAX (2 * old_size, 1024);
      MergeSlot *grown = g_new0 (MergeSlot, size);
      for (gsize i = 0; i < old_size; i++)
        if (tokenizer->merges[i].key != 0)
          *merge_find_slot (grown, size - 1, tokenizer->merges[i].key) = tokenizer->merges[i];
      g_free (tokenizer->merges);
      tokenizer->merges = grown;
      tokenizer->merge_mask = size - 1;
    }
  MergeSlot *slot = merge_find_slot (tokenizer->merges, tokenizer->merge_mask, key);
  if (slot->key == 0)
    tokenizer->n_merges++;
  *slot = (MergeSlot){key, rank, merged};
}

typedef struct
{
  gint32 id;
  gint32 prev;
  gint32 next;
  gint32 len; /* bytes covered; 0 once merged into its left neighbour */
} Symbol;

typedef struct
{
  gint32 rank;
  gint32 pos;
  gint32 merged;
} Candidate;

/* Lowest rank first; among equal ranks (the same pair twice) the leftmost. */
static inline gboolean
candidate_before (const Candidate *a, const Candidate *b)
{
  return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void
heap_push (GArray *heap, Candidate c)
{
  g_array_append_val (heap, c);
  Candidate *h = (Candidate *)heap->data;
  for (guint i = heap->len - 1; i > 0;)
    {
      guint parent = (i - 1) / 2;
      if (!candidate_before (&h[i], &h[parent]))
        break;
      Candidate t = h[i];
      h[i] = h[parent];
      h[parent] = t;
      i = parent;
    }
}

static Candidate
heap_pop (GArray *heap)
{
  Candidate *h = (Candidate *)heap->data;
  Candidate top = h[0];
  guint n = heap->len - 1;

  h[0] = h[n];
  g_array_set_size (heap, n);
  for (guint i = 0;;)
    {
      guint l = 2 * i + 1, r = l + 1, best = i;
      if (l < n && candidate_before (&h[l], &h[best]))
        best = l;
      if (r < n && candidate_before (&h[r], &h[best]))
        best = r;
      if (best == i)
        break;
      Candidate t = h[i];
      h[i] = h[best];
      h[best] = t;
      i = best;
    }
  return top;
}

typedef struct
{
  GArray *ids;
  GArray *symbols; /* Symbol */
  GArray *heap;    /* Candidate */
  GString *word;
  GString *normalized;
  GArray *raw_spans;        /* Span */
  GArray *normalized_spans; /* Span */
} EncodeState;

static void
encode_state_clear (EncodeState *state)
{
  g_clear_pointer (&state->symbols, g_array_unref);
  g_clear_pointer (&state->heap, g_array_unref);
  if (state->word)
    g_string_free (state->word, TRUE);
  if (state->normalized)
    g_string_free (state->normalized, TRUE);
  g_clear_pointer (&state->raw_spans, g_array_unref);
  g_clear_pointer (&state->normalized_spans, g_array_unref);
}

/* One pre-tokenized piece through the BPE model (the reference's BPE::tokenize). */
static gboolean
bpe_piece (const GepardTokenizer *tokenizer, EncodeState *state, const guint8 *piece, gsize n,
           GError **error)
{
  const ByteAlphabet *alphabet = byte_alphabet ();

  if (tokenizer->ignore_merges)
    {
      /* ignore_merges: a piece that is itself in the vocabulary is one token */
      g_string_truncate (state->word, 0);
      for (gsize i = 0; i < n; i++)
        g_string_append_len (state->word, alphabet->utf8[piece[i]], alphabet->utf8_len[piece[i]]);
      gint32 id = vocab_lookup (&tokenizer->vocab, state->word->str, state->word->len);
      if (id >= 0)
        {
          g_array_append_val (state->ids, id);
          return TRUE;
        }
    }
  for (gsize i = 0; i < n; i++)
    if (tokenizer->byte_ids[piece[i]] < 0)
      {
        g_set_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_UNKNOWN_TOKEN,
                     "byte 0x%02x (\"%s\") has no token in the vocabulary", piece[i],
                     alphabet->utf8[piece[i]]);
        return FALSE;
      }
  if (n == 1)
    {
      g_array_append_val (state->ids, tokenizer->byte_ids[piece[0]]);
      return TRUE;
    }

  g_array_set_size (state->symbols, n);
  g_array_set_size (state->heap, 0);
  Symbol *sym = (Symbol *)state->symbols->data;
  for (gsize i = 0; i < n; i++)
    {
      sym[i].id = tokenizer->byte_ids[piece[i]];
      sym[i].prev = (gint32)i - 1;
      sym[i].next = i + 1 < n ? (gint32)i + 1 : -1;
      sym[i].len = 1;
    }
  for (gsize i = 0; i + 1 < n; i++)
    {
      Candidate c = {0, (gint32)i, 0};
      if (merge_lookup (tokenizer, sym[i].id, sym[i + 1].id, &c.rank, &c.merged))
        heap_push (state->heap, c);
    }
  while (state->heap->len > 0)
    {
      Candidate top = heap_pop (state->heap);
      gint32 rank, merged;
      Symbol *cur = &sym[top.pos];
      if (cur->len == 0 || cur->next < 0)
        continue;
      /* a stale candidate: the pair at this position has changed since it was queued */
      if (!merge_lookup (tokenizer, cur->id, sym[cur->next].id, &rank, &merged)
          || merged != top.merged)
        continue;

      Symbol *right = &sym[cur->next];
      cur->id = top.merged;
      cur->len += right->len;
      cur->next = right->next;
      right->len = 0;
      if (cur->next >= 0)
        sym[cur->next].prev = top.pos;

      Candidate c = {0, 0, 0};
      if (cur->prev >= 0
          && merge_lookup (tokenizer, sym[cur->prev].id, cur->id, &c.rank, &c.merged))
        {
          c.pos = cur->prev;
          heap_push (state->heap, c);
        }
      if (cur->next >= 0
          && merge_lookup (tokenizer, cur->id, sym[cur->next].id, &c.rank, &c.merged))
        {
          c.pos = top.pos;
          heap_push (state->heap, c);
        }
    }
  for (gint32 i = 0; i >= 0; i = sym[i].next)
    g_array_append_val (state->ids, sym[i].id);
  return TRUE;
}

/* --- pre-tokenizer ---------------------------------------------------------------------------- */

/* Where the window that starts at `pos` ends. PCRE2 validates the whole subject's UTF-8 on every
 * match when the regex is not JIT-compiled, which makes one long subject quadratic; windows keep
 * that cost bounded. A window may only end at w when the Qwen3.5 regex gives the same matches on
 * the two halves as on the whole: s[w-1] an ASCII letter or digit and s[w] a space or an ASCII
 * digit. Then no match spans w (letter runs stop at a space or digit, digits are single, and the
 * punctuation and whitespace alternatives cannot include a letter or digit), no alternative looks
 * past the letter or digit at w - 1 (the only lookahead, (?!\S), follows whitespace), and the
 * regex has no lookbehind, so matching from w sees nothing before it. */
static gsize
split_window_end (const char *s, gsize len, gsize pos)
{
  for (gsize w = pos + SPLIT_WINDOW_BYTES; w < len; w++)
    if ((s[w] == ' ' || g_ascii_isdigit (s[w])) && g_ascii_isalnum (s[w - 1]))
      return w;
  return len;
}

static gboolean
encode_pretokenized (const GepardTokenizer *tokenizer, EncodeState *state, const char *s, gsize len,
                     GError **error)
{
  gsize pos = 0;

  while (pos < len)
    {
      gsize end = tokenizer->split_is_qwen35 ? split_window_end (s, len, pos) : len;
      const char *window = s + pos;
      gsize window_len = end - pos, prev = 0;
      g_autoptr (GMatchInfo) match = NULL;
      GError *local_error = NULL;

      g_regex_match_full (tokenizer->split, window, window_len, 0, 0, &match, &local_error);
      while (local_error == NULL && g_match_info_matches (match))
        {
          gint start, stop;
          g_match_info_fetch_pos (match, 0, &start, &stop);
          /* behavior Isolated: the stretches between matches are pieces too */
          if ((gsize)start > prev
              && !bpe_piece (tokenizer, state, (const guint8 *)window + prev, start - prev, error))
            return FALSE;
          if (stop > start
              && !bpe_piece (tokenizer, state, (const guint8 *)window + start, stop - start, error))
            return FALSE;
          prev = MAX (prev, (gsize)stop);
          g_match_info_next (match, &local_error);
        }
      if (local_error)
        {
          g_propagate_prefixed_error (error, local_error, "pre-tokenizer regex: ");
          return FALSE;
        }
      if (prev < window_len
          && !bpe_piece (tokenizer, state, (const guint8 *)window + prev, window_len - prev, error))
        return FALSE;
      pos = end;
    }
  return TRUE;
}

/* --- encode ---------------------------------------------------------------------------------- */

static gboolean
encode_valid (const GepardTokenizer *tokenizer, EncodeState *state, const char *text, gsize len,
              GError **error)
{
  find_added_tokens (tokenizer, &tokenizer->raw_trie, text, len, state->raw_spans);
  for (guint i = 0; i < state->raw_spans->len; i++)
    {
      const Span *raw = &g_array_index (state->raw_spans, Span, i);
      if (raw->token >= 0)
        {
          g_array_append_val (state->ids, tokenizer->added[raw->token].id);
          continue;
        }

      g_string_truncate (state->normalized, 0);
      normalize_append (tokenizer, text + raw->start, raw->end - raw->start, state->normalized);
      const char *n = state->normalized->str;
      find_added_tokens (tokenizer, &tokenizer->normalized_trie, n, state->normalized->len,
                         state->normalized_spans);
      for (guint j = 0; j < state->normalized_spans->len; j++)
        {
          const Span *span = &g_array_index (state->normalized_spans, Span, j);
          if (span->token >= 0)
            g_array_append_val (state->ids, tokenizer->added[span->token].id);
          else if (!encode_pretokenized (tokenizer, state, n + span->start, span->end - span->start,
                                         error))
            return FALSE;
        }
    }
  return TRUE;
}

GArray *
gepard_tokenizer_encode (const GepardTokenizer *tokenizer, const char *text, gssize length,
                         GError **error)
{
  g_return_val_if_fail (tokenizer != NULL, NULL);
  g_return_val_if_fail (text != NULL || length == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  gsize len = length < 0 ? strlen (text) : (gsize)length;
  g_autofree char *repaired = NULL;
  if (!utf8_is_valid (text, len))
    text = repaired = gepard_tokenizer_replace_invalid_utf8 (text, len, &len);

  EncodeState state = {
      .ids = g_array_sized_new (FALSE, FALSE, sizeof (gint32), len / 3 + 8),
      .symbols = g_array_new (FALSE, FALSE, sizeof (Symbol)),
      .heap = g_array_new (FALSE, FALSE, sizeof (Candidate)),
      .word = g_string_new (NULL),
      .normalized = g_string_new (NULL),
      .raw_spans = g_array_new (FALSE, FALSE, sizeof (Span)),
      .normalized_spans = g_array_new (FALSE, FALSE, sizeof (Span)),
  };
  gboolean ok = encode_valid (tokenizer, &state, text, len, error);
  encode_state_clear (&state);
  if (!ok)
    {
      g_array_unref (state.ids);
      return NULL;
    }
  return state.ids;
}

char *
gepard_tokenizer_normalize (const GepardTokenizer *tokenizer, const char *text, gssize length,
                            gsize *out_length)
{
  g_return_val_if_fail (tokenizer != NULL, NULL);
  g_return_val_if_fail (text != NULL || length == 0, NULL);

  gsize len = length < 0 ? strlen (text) : (gsize)length;
  g_autofree char *repaired = NULL;
  if (!utf8_is_valid (text, len))
    text = repaired = gepard_tokenizer_replace_invalid_utf8 (text, len, &len);

  GString *out = g_string_sized_new (len + 1);
  normalize_append (tokenizer, text, len, out);
  if (out_length)
    *out_length = out->len;
  return g_string_free (out, FALSE);
}

/* --- decode ---------------------------------------------------------------------------------- */

/* The ByteLevel decoder maps a token whose characters all belong to the byte alphabet back to
 * those bytes and passes any other token (an added token such as "<|im_start|>" with a character
 * outside the alphabet) through as its UTF-8. */
static void
append_token_bytes (GString *out, const char *token)
{
  const ByteAlphabet *alphabet = byte_alphabet ();
  gsize start = out->len;

  for (const char *p = token; *p;)
    {
      gunichar c = g_utf8_get_char_validated (p, -1);
      if (c >= G_N_ELEMENTS (alphabet->char_to_byte) || alphabet->char_to_byte[c] < 0)
        {
          g_string_truncate (out, start);
          g_string_append (out, token);
          return;
        }
      g_string_append_c (out, (char)alphabet->char_to_byte[c]);
      p = g_utf8_next_char (p);
    }
}

char *
gepard_tokenizer_decode_len (const GepardTokenizer *tokenizer, const gint32 *ids, gsize n_ids,
                             gsize *out_length)
{
  g_return_val_if_fail (tokenizer != NULL, NULL);
  g_return_val_if_fail (ids != NULL || n_ids == 0, NULL);

  g_autoptr (GString) bytes = g_string_new (NULL);
  for (gsize i = 0; i < n_ids; i++)
    {
      if (ids[i] < 0 || (guint)ids[i] >= tokenizer->n_ids || !tokenizer->id_to_token[ids[i]])
        continue;
      append_token_bytes (bytes, tokenizer->id_to_token[ids[i]]);
    }
  return gepard_tokenizer_replace_invalid_utf8 (bytes->str, bytes->len, out_length);
}

char *
gepard_tokenizer_decode (const GepardTokenizer *tokenizer, const gint32 *ids, gsize n_ids)
{
  return gepard_tokenizer_decode_len (tokenizer, ids, n_ids, NULL);
}

/* --- lookups --------------------------------------------------------------------------------- */

gint32
gepard_tokenizer_token_to_id (const GepardTokenizer *tokenizer, const char *token)
{
  gpointer value;

  g_return_val_if_fail (tokenizer != NULL, -1);
  g_return_val_if_fail (token != NULL, -1);

  if (g_hash_table_lookup_extended (tokenizer->added_ids, token, NULL, &value))
    return GPOINTER_TO_INT (value);
  return vocab_lookup (&tokenizer->vocab, token, strlen (token));
}

const char *
gepard_tokenizer_id_to_token (const GepardTokenizer *tokenizer, gint32 id)
{
  g_return_val_if_fail (tokenizer != NULL, NULL);

  if (id < 0 || (guint)id >= tokenizer->n_ids)
    return NULL;
  return tokenizer->id_to_token[id];
}

guint
gepard_tokenizer_get_n_ids (const GepardTokenizer *tokenizer)
{
  g_return_val_if_fail (tokenizer != NULL, 0);
  return tokenizer->n_ids;
}

/* --- loading --------------------------------------------------------------------------------- */

void
gepard_tokenizer_free (GepardTokenizer *tokenizer)
{
  if (tokenizer == NULL)
    return;
  vocab_clear (&tokenizer->vocab);
  g_clear_pointer (&tokenizer->added_ids, g_hash_table_unref);
  g_free (tokenizer->id_to_token);
  g_free (tokenizer->merges);
  g_clear_pointer (&tokenizer->split, g_regex_unref);
  g_clear_pointer (&tokenizer->word_char, g_regex_unref);
  g_free (tokenizer->added);
  trie_clear (&tokenizer->raw_trie);
  trie_clear (&tokenizer->normalized_trie);
  if (tokenizer->strings)
    g_string_chunk_free (tokenizer->strings);
  g_free (tokenizer);
}

static gboolean invalid (GError **error, const char *format, ...) G_GNUC_PRINTF (2, 3);
static gboolean unsupported (GError **error, const char *format, ...) G_GNUC_PRINTF (2, 3);

/* Sets a GEPARD_TOKENIZER_ERROR_INVALID error and returns FALSE. */
static gboolean
invalid (GError **error, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  g_autofree char *message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_INVALID, "tokenizer.json: %s",
               message);
  return FALSE;
}

/* Sets a GEPARD_TOKENIZER_ERROR_UNSUPPORTED error naming the feature and returns FALSE. */
static gboolean
unsupported (GError **error, const char *format, ...)
{
  va_list args;
  va_start (args, format);
  g_autofree char *message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_UNSUPPORTED,
               "tokenizer.json: unsupported %s", message);
  return FALSE;
}

static gboolean
add_vocab_entry (GepardTokenizer *tokenizer, const char *name, gsize len, gint64 id, GError **error)
{
  if (id < 0 || id >= MAX_TOKEN_ID)
    return invalid (error, "model.vocab[\"%s\"] must be an id from 0 to %d", name,
                    MAX_TOKEN_ID - 1);
  vocab_set (&tokenizer->vocab, g_string_chunk_insert_len (tokenizer->strings, name, len), len, id);
  return TRUE;
}

/* Merge `index` (its rank) of `left` and `right`; `merged` is scratch. */
static gboolean
add_merge (GepardTokenizer *tokenizer, guint index, const char *left, gsize left_len,
           const char *right, gsize right_len, GString *merged, GError **error)
{
  g_string_truncate (merged, 0);
  g_string_append_len (merged, left, left_len);
  g_string_append_len (merged, right, right_len);
  gint32 left_id = vocab_lookup (&tokenizer->vocab, left, left_len);
  gint32 right_id = vocab_lookup (&tokenizer->vocab, right, right_len);
  gint32 merged_id = vocab_lookup (&tokenizer->vocab, merged->str, merged->len);
  if (left_id < 0 || right_id < 0)
    return invalid (error, "model.merges[%u]: \"%.*s\" is not in the vocabulary", index,
                    (int)(left_id < 0 ? left_len : right_len), left_id < 0 ? left : right);
  if (merged_id < 0)
    return invalid (error, "model.merges[%u]: the merged token \"%s\" is not in the vocabulary",
                    index, merged->str);
  merge_insert (tokenizer, left_id, right_id, index, merged_id);
  return TRUE;
}

/* json-glib builds a node for every JSON value, which for the ~250k vocabulary entries and
 * ~250k merges of a Qwen-sized tokenizer.json costs most of a second. The two tables are therefore
 * located in the text, read by the strict readers below, and replaced by "{}" and "[]" in the text
 * json-glib parses; json-glib still parses everything else, and reads the tables itself when they
 * cannot be located plainly (a key spelled with escapes, a repeated member). */
typedef struct
{
  const char *vocab; /* the text of model.vocab, or NULL when json-glib reads it */
  gsize vocab_len;
  const char *merges; /* the text of model.merges, or NULL */
  gsize merges_len;
} ModelTables;

static gboolean
key_is (const char *key, gsize len, const char *name)
{
  return key && len == strlen (name) && memcmp (key, name, len) == 0;
}

/* Finds the text of model.vocab and model.merges by following the nesting of objects, arrays and
 * strings. It need not validate: json-glib parses the rest, and the table readers are strict. */
static void
find_model_tables (const char *s, gsize len, ModelTables *tables)
{
  char kinds[MAX_JSON_DEPTH + 1] = {0};
  const char *keys[3] = {NULL, NULL, NULL};
  gsize key_lens[3] = {0, 0, 0};
  guint depth = 0, n_vocab = 0, n_merges = 0;
  gboolean expect_key = FALSE;
  int recording = 0; /* 1: inside model.vocab, 2: inside model.merges */
  gsize record_start = 0;

  memset (tables, 0, sizeof *tables);
  for (gsize i = 0; i < len;)
    {
      char c = s[i];
      if (c == '"')
        {
          gsize start = ++i;
          while (i < len && s[i] != '"')
            i += s[i] == '\\' ? 2 : 1;
          if (i >= len)
            goto give_up;
          if (expect_key && depth <= 2)
            {
              keys[depth] = s + start;
              key_lens[depth] = i - start;
            }
          expect_key = FALSE;
          i++;
          continue;
        }
      if (c == '{' || c == '[')
        {
          if (depth == 2 && recording == 0 && kinds[1] == '{' && kinds[2] == '{'
              && key_is (keys[1], key_lens[1], "model"))
            {
              if (c == '{' && key_is (keys[2], key_lens[2], "vocab"))
                recording = 1;
              else if (c == '[' && key_is (keys[2], key_lens[2], "merges"))
                recording = 2;
              record_start = i;
            }
          if (depth == MAX_JSON_DEPTH)
            goto give_up;
          kinds[++depth] = c;
          expect_key = c == '{';
        }
      else if (c == '}' || c == ']')
        {
          if (depth == 0)
            goto give_up;
          depth--;
          if (recording && depth == 2)
            {
              if (recording == 1)
                {
                  tables->vocab = s + record_start;
                  tables->vocab_len = i + 1 - record_start;
                  n_vocab++;
                }
              else
                {
                  tables->merges = s + record_start;
                  tables->merges_len = i + 1 - record_start;
                  n_merges++;
                }
              recording = 0;
            }
          expect_key = FALSE;
        }
      else if (c == ',')
        expect_key = depth >= 1 && kinds[depth] == '{';
      i++;
    }
  if (depth != 0 || recording)
    goto give_up;
  /* json-glib keeps the last of repeated members; let it decide */
  if (n_vocab > 1)
    tables->vocab = NULL;
  if (n_merges > 1)
    tables->merges = NULL;
  return;

give_up:
  memset (tables, 0, sizeof *tables);
}

/* `json` with model.vocab replaced by "{}" and model.merges by "[]". */
static char *
model_tables_skeleton (const char *json, gsize len, const ModelTables *tables, gsize *out_len)
{
  struct
  {
    const char *text;
    gsize len;
    const char *replacement;
  } cuts[2]
      = {{tables->vocab, tables->vocab_len, "{}"}, {tables->merges, tables->merges_len, "[]"}};
  GString *out = g_string_sized_new (len / 8);
  const char *p = json;

  if (cuts[0].text == NULL || (cuts[1].text && cuts[1].text < cuts[0].text))
    {
      typeof (cuts[0]) t = cuts[0];
      cuts[0] = cuts[1];
      cuts[1] = t;
    }
  for (guint k = 0; k < 2; k++)
    {
      if (cuts[k].text == NULL)
        continue;
      g_string_append_len (out, p, cuts[k].text - p);
      g_string_append (out, cuts[k].replacement);
      p = cuts[k].text + cuts[k].len;
    }
  g_string_append_len (out, p, json + len - p);
  *out_len = out->len;
  return g_string_free (out, FALSE);
}

static void
skip_json_space (const char *s, gsize len, gsize *i)
{
  while (*i < len && (s[*i] == ' ' || s[*i] == '\t' || s[*i] == '\n' || s[*i] == '\r'))
    (*i)++;
}

static gboolean
read_hex4 (const char *s, gsize len, gsize i, gunichar *value)
{
  if (i + 4 > len)
    return FALSE;
  *value = 0;
  for (gsize k = 0; k < 4; k++)
    {
      int digit = g_ascii_xdigit_value (s[i + k]);
      if (digit < 0)
        return FALSE;
      *value = *value * 16 + digit;
    }
  return TRUE;
}

/* Reads the JSON string that starts at s[*i] into `out`, escapes decoded (RFC 8259 §7). */
static gboolean
read_json_string (const char *s, gsize len, gsize *i, GString *out, const char *what,
                  GError **error)
{
  gsize p = *i;

  g_string_truncate (out, 0);
  if (p >= len || s[p] != '"')
    return invalid (error, "%s: expected a string at offset %" G_GSIZE_FORMAT, what, p);
  p++;
  for (;;)
    {
      gsize run = p;
      while (p < len && (guchar)s[p] >= 0x20 && s[p] != '"' && s[p] != '\\')
        p++;
      g_string_append_len (out, s + run, p - run);
      if (p >= len)
        return invalid (error, "%s: unterminated string", what);
      if (s[p] == '"')
        break;
      if (s[p] != '\\')
        return invalid (error, "%s: control character in a string", what);
      if (p + 1 >= len)
        return invalid (error, "%s: unterminated string", what);
      char escape = s[p + 1];
      p += 2;
      switch (escape)
        {
        case '"':
        case '\\':
        case '/':
          g_string_append_c (out, escape);
          break;
        case 'b':
          g_string_append_c (out, '\b');
          break;
        case 'f':
          g_string_append_c (out, '\f');
          break;
        case 'n':
          g_string_append_c (out, '\n');
          break;
        case 'r':
          g_string_append_c (out, '\r');
          break;
        case 't':
          g_string_append_c (out, '\t');
          break;
        case 'u':
          {
            gunichar c, low;
            if (!read_hex4 (s, len, p, &c))
              return invalid (error, "%s: bad \\u escape", what);
            p += 4;
            if (c >= 0xD800 && c <= 0xDBFF)
              {
                if (p + 6 > len || s[p] != '\\' || s[p + 1] != 'u'
                    || !read_hex4 (s, len, p + 2, &low) || low < 0xDC00 || low > 0xDFFF)
                  return invalid (error, "%s: unpaired surrogate escape", what);
                p += 6;
                c = 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
              }
            else if (c >= 0xDC00 && c <= 0xDFFF)
              return invalid (error, "%s: unpaired surrogate escape", what);
            else if (c == 0)
              return invalid (error, "%s: \\u0000 in a string", what);
            char utf8[6];
            g_string_append_len (out, utf8, g_unichar_to_utf8 (c, utf8));
            break;
          }
        default:
          return invalid (error, "%s: bad escape \\%c", what, escape);
        }
    }
  if (!utf8_is_valid (out->str, out->len))
    return invalid (error, "%s: a string is not UTF-8", what);
  *i = p + 1;
  return TRUE;
}

/* A JSON number that is an integer (no fraction, no exponent), as json-glib reads it into an
 * int64; values beyond the id range come out as MAX_TOKEN_ID. */
static gboolean
read_json_integer (const char *s, gsize len, gsize *i, gint64 *value)
{
  gsize p = *i;
  gboolean negative = FALSE;
  gint64 v = 0;

  if (p < len && s[p] == '-')
    {
      negative = TRUE;
      p++;
    }
  if (p >= len || !g_ascii_isdigit (s[p]))
    return FALSE;
  if (s[p] == '0')
    p++;
  else
    for (; p < len && g_ascii_isdigit (s[p]); p++)
      v = MIN (v * 10 + (s[p] - '0'), MAX_TOKEN_ID);
  if (p < len && (s[p] == '.' || s[p] == 'e' || s[p] == 'E' || g_ascii_isdigit (s[p])))
    return FALSE;
  *value = negative ? -v : v;
  *i = p;
  return TRUE;
}

static gboolean
read_vocab_text (GepardTokenizer *tokenizer, const char *s, gsize len, GError **error)
{
  g_autoptr (GString) name = g_string_new (NULL);
  gsize i = 1; /* past the '{' */

  skip_json_space (s, len, &i);
  if (i < len && s[i] == '}')
    i++;
  else
    for (;;)
      {
        gint64 id;
        if (!read_json_string (s, len, &i, name, "model.vocab", error))
          return FALSE;
        skip_json_space (s, len, &i);
        if (i >= len || s[i] != ':')
          return invalid (error, "model.vocab: expected ':' after \"%s\"", name->str);
        i++;
        skip_json_space (s, len, &i);
        if (!read_json_integer (s, len, &i, &id))
          id = -1;
        if (!add_vocab_entry (tokenizer, name->str, name->len, id, error))
          return FALSE;
        skip_json_space (s, len, &i);
        if (i < len && s[i] == ',')
          {
            i++;
            skip_json_space (s, len, &i);
            continue;
          }
        if (i < len && s[i] == '}')
          {
            i++;
            break;
          }
        return invalid (error, "model.vocab: expected ',' or '}' after \"%s\"", name->str);
      }
  if (i != len)
    return invalid (error, "model.vocab: trailing text");
  return TRUE;
}

static gboolean
read_merges_text (GepardTokenizer *tokenizer, const char *s, gsize len, GError **error)
{
  g_autoptr (GString) left = g_string_new (NULL);
  g_autoptr (GString) right = g_string_new (NULL);
  g_autoptr (GString) merged = g_string_new (NULL);
  gsize i = 1; /* past the '[' */

  skip_json_space (s, len, &i);
  if (i < len && s[i] == ']')
    i++;
  else
    for (guint index = 0;; index++)
      {
        const char *l, *r;
        gsize l_len, r_len;
        if (i < len && s[i] == '"')
          {
            /* the legacy "left right" form */
            if (!read_json_string (s, len, &i, left, "model.merges", error))
              return FALSE;
            const char *space = strchr (left->str, ' ');
            if (space == NULL)
              return invalid (error, "model.merges[%u] \"%s\" is not \"left right\"", index,
                              left->str);
            l = left->str;
            l_len = space - left->str;
            r = space + 1;
            r_len = left->len - l_len - 1;
          }
        else if (i < len && s[i] == '[')
          {
            i++;
            skip_json_space (s, len, &i);
            if (!read_json_string (s, len, &i, left, "model.merges", error))
              return FALSE;
            skip_json_space (s, len, &i);
            if (i >= len || s[i] != ',')
              return invalid (error, "model.merges[%u] must be [left, right]", index);
            i++;
            skip_json_space (s, len, &i);
            if (!read_json_string (s, len, &i, right, "model.merges", error))
              return FALSE;
            skip_json_space (s, len, &i);
            if (i >= len || s[i] != ']')
              return invalid (error, "model.merges[%u] must be [left, right]", index);
            i++;
            l = left->str;
            l_len = left->len;
            r = right->str;
            r_len = right->len;
          }
        else
          return invalid (error, "model.merges[%u] must be \"left right\" or [left, right]", index);
        if (!add_merge (tokenizer, index, l, l_len, r, r_len, merged, error))
          return FALSE;
        skip_json_space (s, len, &i);
        if (i < len && s[i] == ',')
          {
            i++;
            skip_json_space (s, len, &i);
            continue;
          }
        if (i < len && s[i] == ']')
          {
            i++;
            break;
          }
        return invalid (error, "model.merges: expected ',' or ']' after entry %u", index);
      }
  if (i != len)
    return invalid (error, "model.merges: trailing text");
  return TRUE;
}

/* Every member of `object` must be one of `allowed` (NULL-terminated). */
static gboolean
check_members (JsonObject *object, const char *path, const char *const *allowed, GError **error)
{
  JsonObjectIter iter;
  const char *name;

  json_object_iter_init (&iter, object);
  while (json_object_iter_next (&iter, &name, NULL))
    if (!g_strv_contains (allowed, name))
      return unsupported (error, "member \"%s\" in %s", name, path);
  return TRUE;
}

/* A member that may be absent or null: NULL then, without error. */
static JsonNode *
optional_member (JsonObject *object, const char *name)
{
  JsonNode *node = json_object_get_member (object, name);
  return node && !JSON_NODE_HOLDS_NULL (node) ? node : NULL;
}

static gboolean
node_is_string (JsonNode *node)
{
  return JSON_NODE_HOLDS_VALUE (node) && json_node_get_value_type (node) == G_TYPE_STRING;
}

static gboolean
node_is_bool (JsonNode *node)
{
  return JSON_NODE_HOLDS_VALUE (node) && json_node_get_value_type (node) == G_TYPE_BOOLEAN;
}

static gboolean
node_is_int (JsonNode *node)
{
  return JSON_NODE_HOLDS_VALUE (node) && json_node_get_value_type (node) == G_TYPE_INT64;
}

/* An optional boolean member; `*value` keeps its default when the member is absent. */
static gboolean
get_bool (JsonObject *object, const char *path, const char *name, gboolean *value, GError **error)
{
  JsonNode *node = json_object_get_member (object, name);

  if (node == NULL)
    return TRUE;
  if (!node_is_bool (node))
    return invalid (error, "%s.%s must be true or false", path, name);
  *value = json_node_get_boolean (node);
  return TRUE;
}

/* The "type" member of a component object. */
static const char *
get_type (JsonNode *node, const char *path, GError **error)
{
  if (!JSON_NODE_HOLDS_OBJECT (node))
    {
      invalid (error, "%s must be an object", path);
      return NULL;
    }
  JsonNode *type = json_object_get_member (json_node_get_object (node), "type");
  if (type == NULL || !node_is_string (type))
    {
      invalid (error, "%s needs a string member \"type\"", path);
      return NULL;
    }
  return json_node_get_string (type);
}

/* A ByteLevel component whose options only move offsets, never ids, so that any value is fine;
 * add_prefix_space and use_regex of the pre-tokenizer are checked by the caller. */
static gboolean
check_byte_level (JsonObject *object, const char *path, GError **error)
{
  static const char *const members[]
      = {"type", "add_prefix_space", "trim_offsets", "use_regex", NULL};
  gboolean ignored = FALSE;

  if (!check_members (object, path, members, error))
    return FALSE;
  for (guint i = 1; members[i]; i++)
    if (!get_bool (object, path, members[i], &ignored, error))
      return FALSE;
  return TRUE;
}

static gboolean
load_normalizer (GepardTokenizer *tokenizer, JsonObject *root, GError **error)
{
  JsonNode *node = optional_member (root, "normalizer");

  tokenizer->nfc = FALSE;
  if (node == NULL)
    return TRUE;
  const char *type = get_type (node, "normalizer", error);
  if (type == NULL)
    return FALSE;
  JsonObject *object = json_node_get_object (node);
  if (g_str_equal (type, "NFC"))
    {
      static const char *const members[] = {"type", NULL};
      tokenizer->nfc = TRUE;
      return check_members (object, "normalizer", members, error);
    }
  if (!g_str_equal (type, "Sequence"))
    return unsupported (error, "normalizer \"%s\" (Gepard implements NFC)", type);

  /* a Sequence of NFC normalizers is NFC (or nothing when empty): NFC is idempotent */
  static const char *const members[] = {"type", "normalizers", NULL};
  if (!check_members (object, "normalizer", members, error))
    return FALSE;
  JsonNode *list = json_object_get_member (object, "normalizers");
  if (list == NULL || !JSON_NODE_HOLDS_ARRAY (list))
    return invalid (error, "normalizer.normalizers must be an array");
  JsonArray *array = json_node_get_array (list);
  for (guint i = 0; i < json_array_get_length (array); i++)
    {
      const char *inner
          = get_type (json_array_get_element (array, i), "normalizer.normalizers[]", error);
      if (inner == NULL)
        return FALSE;
      if (!g_str_equal (inner, "NFC"))
        return unsupported (error, "normalizer \"%s\" in a Sequence (Gepard implements NFC)",
                            inner);
      static const char *const nfc_members[] = {"type", NULL};
      if (!check_members (json_array_get_object_element (array, i), "normalizer.normalizers[]",
                          nfc_members, error))
        return FALSE;
      tokenizer->nfc = TRUE;
    }
  return TRUE;
}

static gboolean
load_split (GepardTokenizer *tokenizer, JsonNode *node, GError **error)
{
  static const char *const members[] = {"type", "pattern", "behavior", "invert", NULL};
  const char *path = "pre_tokenizer Split";
  JsonObject *object = json_node_get_object (node);

  if (!check_members (object, path, members, error))
    return FALSE;

  JsonNode *behavior = json_object_get_member (object, "behavior");
  if (behavior == NULL || !node_is_string (behavior))
    return invalid (error, "%s needs a string \"behavior\"", path);
  if (!g_str_equal (json_node_get_string (behavior), "Isolated"))
    return unsupported (error, "%s behavior \"%s\" (Gepard implements Isolated)", path,
                        json_node_get_string (behavior));

  gboolean invert = FALSE;
  if (!get_bool (object, path, "invert", &invert, error))
    return FALSE;
  if (invert)
    return unsupported (error, "%s with invert true", path);

  JsonNode *pattern = json_object_get_member (object, "pattern");
  if (pattern == NULL || !JSON_NODE_HOLDS_OBJECT (pattern))
    return invalid (error, "%s needs an object \"pattern\"", path);
  JsonObject *pattern_object = json_node_get_object (pattern);
  if (json_object_has_member (pattern_object, "String"))
    return unsupported (error, "%s with a String pattern (Gepard implements Regex)", path);
  static const char *const pattern_members[] = {"Regex", NULL};
  if (!check_members (pattern_object, "pre_tokenizer Split pattern", pattern_members, error))
    return FALSE;
  JsonNode *regex = json_object_get_member (pattern_object, "Regex");
  if (regex == NULL || !node_is_string (regex))
    return invalid (error, "%s pattern needs a string \"Regex\"", path);

  const char *source = json_node_get_string (regex);
  tokenizer->split_is_qwen35 = g_str_equal (source, qwen35_split_regex);
  GError *local_error = NULL;
  /* G_REGEX_OPTIMIZE JIT-compiles the pattern; GLib compiles with PCRE2_UCP, so the classes follow
   * Unicode as Oniguruma's do in the reference. Qwen3.5's pattern is compiled in its PCRE2
   * spelling (see qwen35_split_regex_pcre2); other patterns as they are. */
  tokenizer->split = g_regex_new (tokenizer->split_is_qwen35 ? qwen35_split_regex_pcre2 : source,
                                  G_REGEX_OPTIMIZE, 0, &local_error);
  if (tokenizer->split == NULL)
    {
      unsupported (error, "%s regex \"%s\": %s", path, source, local_error->message);
      g_error_free (local_error);
      return FALSE;
    }
  /* GLib JIT-compiles at the first match; do it now, not in concurrent encodes */
  g_regex_match (tokenizer->split, "a", 0, NULL);
  return TRUE;
}

static gboolean
load_pre_tokenizer (GepardTokenizer *tokenizer, JsonObject *root, GError **error)
{
  static const char *const members[] = {"type", "pretokenizers", NULL};
  JsonNode *node = optional_member (root, "pre_tokenizer");

  if (node == NULL)
    return unsupported (error, "pre_tokenizer null (Gepard implements Sequence[Split, ByteLevel])");
  const char *type = get_type (node, "pre_tokenizer", error);
  if (type == NULL)
    return FALSE;
  if (!g_str_equal (type, "Sequence"))
    return unsupported (
        error, "pre_tokenizer \"%s\" (Gepard implements Sequence[Split, ByteLevel])", type);
  JsonObject *object = json_node_get_object (node);
  if (!check_members (object, "pre_tokenizer", members, error))
    return FALSE;
  JsonNode *list = json_object_get_member (object, "pretokenizers");
  if (list == NULL || !JSON_NODE_HOLDS_ARRAY (list))
    return invalid (error, "pre_tokenizer.pretokenizers must be an array");
  JsonArray *array = json_node_get_array (list);
  guint n = json_array_get_length (array);
  const char *first = NULL, *second = NULL;
  if (n == 2)
    {
      first = get_type (json_array_get_element (array, 0), "pre_tokenizer.pretokenizers[0]", error);
      if (first == NULL)
        return FALSE;
      second
          = get_type (json_array_get_element (array, 1), "pre_tokenizer.pretokenizers[1]", error);
      if (second == NULL)
        return FALSE;
    }
  if (n != 2 || !g_str_equal (first, "Split") || !g_str_equal (second, "ByteLevel"))
    return unsupported (error,
                        "pre_tokenizer Sequence of %u pre-tokenizers (Gepard implements [Split, "
                        "ByteLevel])",
                        n);

  if (!load_split (tokenizer, json_array_get_element (array, 0), error))
    return FALSE;

  JsonObject *byte_level = json_array_get_object_element (array, 1);
  gboolean add_prefix_space = FALSE, use_regex = FALSE;
  if (!check_byte_level (byte_level, "pre_tokenizer ByteLevel", error)
      || !get_bool (byte_level, "pre_tokenizer ByteLevel", "add_prefix_space", &add_prefix_space,
                    error)
      || !get_bool (byte_level, "pre_tokenizer ByteLevel", "use_regex", &use_regex, error))
    return FALSE;
  if (add_prefix_space)
    return unsupported (error, "pre_tokenizer ByteLevel with add_prefix_space true");
  if (use_regex)
    return unsupported (error, "pre_tokenizer ByteLevel with use_regex true");
  return TRUE;
}

static gboolean
load_post_processor_and_decoder (JsonObject *root, GError **error)
{
  /* with add_special_tokens=False a post-processor adds nothing; ByteLevel's only moves offsets */
  JsonNode *node = optional_member (root, "post_processor");
  if (node)
    {
      const char *type = get_type (node, "post_processor", error);
      if (type == NULL)
        return FALSE;
      if (!g_str_equal (type, "ByteLevel"))
        return unsupported (error, "post_processor \"%s\"", type);
      if (!check_byte_level (json_node_get_object (node), "post_processor", error))
        return FALSE;
    }

  node = optional_member (root, "decoder");
  if (node == NULL)
    return unsupported (error, "decoder null (Gepard implements ByteLevel)");
  const char *type = get_type (node, "decoder", error);
  if (type == NULL)
    return FALSE;
  if (!g_str_equal (type, "ByteLevel"))
    return unsupported (error, "decoder \"%s\" (Gepard implements ByteLevel)", type);
  return check_byte_level (json_node_get_object (node), "decoder", error);
}

static gboolean
check_null_or_empty (JsonObject *model, const char *name, GError **error)
{
  JsonNode *node = optional_member (model, name);

  if (node == NULL)
    return TRUE;
  if (node_is_string (node) && json_node_get_string (node)[0] == '\0')
    return TRUE;
  return unsupported (error, "model.%s (Gepard implements a BPE without it)", name);
}

/* The two halves of merge `index`, as pointers into the JSON tree (or into `merge`'s string). */
static gboolean
parse_merge (JsonNode *node, guint index, const char **left, gsize *left_len, const char **right,
             gsize *right_len, GError **error)
{
  if (node_is_string (node))
    {
      /* the legacy "left right" form; byte-level tokens never contain a space */
      const char *merge = json_node_get_string (node);
      const char *space = strchr (merge, ' ');
      if (space == NULL)
        return invalid (error, "model.merges[%u] \"%s\" is not \"left right\"", index, merge);
      *left = merge;
      *left_len = space - merge;
      *right = space + 1;
      *right_len = strlen (space + 1);
      return TRUE;
    }
  if (JSON_NODE_HOLDS_ARRAY (node))
    {
      JsonArray *pair = json_node_get_array (node);
      if (json_array_get_length (pair) == 2 && node_is_string (json_array_get_element (pair, 0))
          && node_is_string (json_array_get_element (pair, 1)))
        {
          *left = json_array_get_string_element (pair, 0);
          *left_len = strlen (*left);
          *right = json_array_get_string_element (pair, 1);
          *right_len = strlen (*right);
          return TRUE;
        }
    }
  return invalid (error, "model.merges[%u] must be \"left right\" or [left, right]", index);
}

static gboolean
load_model (GepardTokenizer *tokenizer, JsonObject *root, const ModelTables *tables, GError **error)
{
  static const char *const members[] = {"type",
                                        "dropout",
                                        "unk_token",
                                        "continuing_subword_prefix",
                                        "end_of_word_suffix",
                                        "fuse_unk",
                                        "byte_fallback",
                                        "ignore_merges",
                                        "vocab",
                                        "merges",
                                        NULL};
  JsonNode *node = json_object_get_member (root, "model");

  if (node == NULL || !JSON_NODE_HOLDS_OBJECT (node))
    return invalid (error, "needs an object \"model\"");
  JsonObject *model = json_node_get_object (node);
  JsonNode *type = json_object_get_member (model, "type");
  if (type && !node_is_string (type))
    return invalid (error, "model.type must be a string");
  if (type && !g_str_equal (json_node_get_string (type), "BPE"))
    return unsupported (error, "model \"%s\" (Gepard implements BPE)", json_node_get_string (type));
  if (!check_members (model, "model", members, error))
    return FALSE;
  if (optional_member (model, "dropout"))
    return unsupported (error, "model.dropout");
  if (optional_member (model, "unk_token"))
    return unsupported (error, "model.unk_token (Gepard implements a byte-level BPE without one)");
  if (!check_null_or_empty (model, "continuing_subword_prefix", error)
      || !check_null_or_empty (model, "end_of_word_suffix", error))
    return FALSE;

  /* fuse_unk only matters with an unk_token, which is refused above */
  gboolean fuse_unk = FALSE, byte_fallback = FALSE;
  if (!get_bool (model, "model", "fuse_unk", &fuse_unk, error)
      || !get_bool (model, "model", "byte_fallback", &byte_fallback, error)
      || !get_bool (model, "model", "ignore_merges", &tokenizer->ignore_merges, error))
    return FALSE;
  if (byte_fallback)
    return unsupported (error, "model.byte_fallback true");

  JsonNode *vocab_node = json_object_get_member (model, "vocab");
  if (vocab_node == NULL || !JSON_NODE_HOLDS_OBJECT (vocab_node))
    return invalid (error, "model.vocab must be an object");
  JsonNode *merges_node = json_object_get_member (model, "merges");
  if (merges_node == NULL || !JSON_NODE_HOLDS_ARRAY (merges_node))
    return invalid (error, "model.merges must be an array");

  vocab_init (&tokenizer->vocab);
  if (tables->vocab)
    {
      /* json-glib saw "{}" in its place */
      if (json_object_get_size (json_node_get_object (vocab_node)) != 0)
        return invalid (error, "model.vocab is not where it was found");
      if (!read_vocab_text (tokenizer, tables->vocab, tables->vocab_len, error))
        return FALSE;
    }
  else
    {
      JsonObjectIter iter;
      const char *name;
      JsonNode *value;
      json_object_iter_init (&iter, json_node_get_object (vocab_node));
      while (json_object_iter_next (&iter, &name, &value))
        if (!add_vocab_entry (tokenizer, name, strlen (name),
                              node_is_int (value) ? json_node_get_int (value) : -1, error))
          return FALSE;
    }

  if (tables->merges)
    {
      if (json_array_get_length (json_node_get_array (merges_node)) != 0)
        return invalid (error, "model.merges is not where it was found");
      return read_merges_text (tokenizer, tables->merges, tables->merges_len, error);
    }
  JsonArray *merges = json_node_get_array (merges_node);
  g_autoptr (GString) merged = g_string_new (NULL);
  for (guint i = 0; i < json_array_get_length (merges); i++)
    {
      const char *left = NULL, *right = NULL;
      gsize left_len = 0, right_len = 0;
      if (!parse_merge (json_array_get_element (merges, i), i, &left, &left_len, &right, &right_len,
                        error)
          || !add_merge (tokenizer, i, left, left_len, right, right_len, merged, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
load_added_tokens (GepardTokenizer *tokenizer, JsonObject *root, GError **error)
{
  static const char *const members[]
      = {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special", NULL};
  JsonNode *node = json_object_get_member (root, "added_tokens");

  if (node == NULL)
    return TRUE;
  if (!JSON_NODE_HOLDS_ARRAY (node))
    return invalid (error, "added_tokens must be an array");
  JsonArray *array = json_node_get_array (node);
  guint n = json_array_get_length (array);
  tokenizer->added = g_new0 (AddedToken, MAX (n, 1));
  for (guint i = 0; i < n; i++)
    {
      JsonNode *element = json_array_get_element (array, i);
      if (!JSON_NODE_HOLDS_OBJECT (element))
        return invalid (error, "added_tokens[%u] must be an object", i);
      JsonObject *object = json_node_get_object (element);
      if (!check_members (object, "added_tokens[]", members, error))
        return FALSE;
      JsonNode *id = json_object_get_member (object, "id");
      JsonNode *content = json_object_get_member (object, "content");
      if (id == NULL || !node_is_int (id) || json_node_get_int (id) < 0
          || json_node_get_int (id) >= MAX_TOKEN_ID)
        return invalid (error, "added_tokens[%u].id must be an id from 0 to %d", i,
                        MAX_TOKEN_ID - 1);
      if (content == NULL || !node_is_string (content))
        return invalid (error, "added_tokens[%u].content must be a string", i);
      const char *text = json_node_get_string (content);
      if (text[0] == '\0' || !g_utf8_validate (text, -1, NULL))
        return invalid (error, "added_tokens[%u].content must be non-empty UTF-8", i);

      AddedToken *added = &tokenizer->added[i];
      added->id = json_node_get_int (id);
      added->content = g_string_chunk_insert (tokenizer->strings, text);
      if (!get_bool (object, "added_tokens[]", "special", &added->special, error))
        return FALSE;
      added->normalized = !added->special; /* the reference's default */
      if (!get_bool (object, "added_tokens[]", "normalized", &added->normalized, error)
          || !get_bool (object, "added_tokens[]", "lstrip", &added->lstrip, error)
          || !get_bool (object, "added_tokens[]", "rstrip", &added->rstrip, error)
          || !get_bool (object, "added_tokens[]", "single_word", &added->single_word, error))
        return FALSE;

      if (g_hash_table_contains (tokenizer->added_ids, added->content))
        return invalid (error, "added token \"%s\" appears twice", added->content);
      /* the reference gives an added token that is also a vocabulary entry the vocabulary's id */
      gint32 vocab_id = vocab_lookup (&tokenizer->vocab, added->content, strlen (added->content));
      if (vocab_id >= 0 && vocab_id != added->id)
        return invalid (error, "added token \"%s\" has id %d, but the vocabulary gives it %d",
                        added->content, added->id, vocab_id);
      g_hash_table_insert (tokenizer->added_ids, (gpointer)added->content,
                           GINT_TO_POINTER (added->id));
      tokenizer->n_ids = MAX (tokenizer->n_ids, (guint)added->id + 1);
      tokenizer->n_added++;
    }

  /* the reference matches special tokens first, then the others, each in file order */
  for (int pass = 0; pass < 2; pass++)
    for (guint i = 0; i < tokenizer->n_added; i++)
      {
        AddedToken *added = &tokenizer->added[i];
        if (added->special != (pass == 0))
          continue;
        if (added->single_word && tokenizer->word_char == NULL)
          {
            GError *local_error = NULL;
            tokenizer->word_char = g_regex_new (word_char_regex, G_REGEX_OPTIMIZE, 0, &local_error);
            if (tokenizer->word_char == NULL)
              {
                unsupported (error, "single_word added tokens: %s", local_error->message);
                g_error_free (local_error);
                return FALSE;
              }
            g_regex_match (tokenizer->word_char, "a", 0, NULL);
          }
        if (!added->normalized)
          {
            trie_insert (&tokenizer->raw_trie, added->content, strlen (added->content), i);
            continue;
          }
        /* normalized tokens match the normalizer's form of their content */
        g_autoptr (GString) pattern = g_string_new (NULL);
        normalize_append (tokenizer, added->content, strlen (added->content), pattern);
        trie_insert (&tokenizer->normalized_trie, pattern->str, pattern->len, i);
      }
  return TRUE;
}

static gboolean
build_id_table (GepardTokenizer *tokenizer, GError **error)
{
  for (guint i = 0; i < tokenizer->vocab.n_entries; i++)
    tokenizer->n_ids = MAX (tokenizer->n_ids, (guint)tokenizer->vocab.entries[i].id + 1);
  tokenizer->id_to_token = g_try_new0 (const char *, MAX (tokenizer->n_ids, 1));
  if (tokenizer->id_to_token == NULL)
    return invalid (error, "no memory for %u ids", tokenizer->n_ids);
  for (guint i = 0; i < tokenizer->vocab.n_entries; i++)
    {
      const VocabEntry *entry = &tokenizer->vocab.entries[i];
      if (tokenizer->id_to_token[entry->id])
        return invalid (error, "model.vocab gives id %d to both \"%s\" and \"%s\"", entry->id,
                        tokenizer->id_to_token[entry->id], entry->token);
      tokenizer->id_to_token[entry->id] = entry->token;
    }
  for (guint i = 0; i < tokenizer->n_added; i++)
    {
      const AddedToken *added = &tokenizer->added[i];
      const char *previous = tokenizer->id_to_token[added->id];
      if (previous && !g_str_equal (previous, added->content))
        return invalid (error, "id %d is both \"%s\" and the added token \"%s\"", added->id,
                        previous, added->content);
      tokenizer->id_to_token[added->id] = added->content;
    }

  const ByteAlphabet *alphabet = byte_alphabet ();
  for (guint b = 0; b < 256; b++)
    tokenizer->byte_ids[b]
        = vocab_lookup (&tokenizer->vocab, alphabet->utf8[b], alphabet->utf8_len[b]);
  return TRUE;
}

static gboolean
load_tokenizer (GepardTokenizer *tokenizer, JsonObject *root, const ModelTables *tables,
                GError **error)
{
  static const char *const members[]
      = {"version",       "truncation",     "padding", "added_tokens", "normalizer",
         "pre_tokenizer", "post_processor", "decoder", "model",        NULL};

  if (!check_members (root, "the top level", members, error))
    return FALSE;
  JsonNode *version = json_object_get_member (root, "version");
  if (version && !node_is_string (version))
    return invalid (error, "version must be a string");
  if (version && !g_str_equal (json_node_get_string (version), "1.0"))
    return unsupported (error, "version \"%s\"", json_node_get_string (version));
  if (optional_member (root, "truncation"))
    return unsupported (error, "truncation (Gepard never truncates)");
  if (optional_member (root, "padding"))
    return unsupported (error, "padding (Gepard never pads)");

  return load_normalizer (tokenizer, root, error) && load_pre_tokenizer (tokenizer, root, error)
         && load_post_processor_and_decoder (root, error)
         && load_model (tokenizer, root, tables, error)
         && load_added_tokens (tokenizer, root, error) && build_id_table (tokenizer, error);
}

GepardTokenizer *
gepard_tokenizer_new_from_data (const char *json, gssize length, GError **error)
{
  g_return_val_if_fail (json != NULL || length == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  gsize len = length < 0 ? strlen (json) : (gsize)length;
  GepardJsonCheck check;
  if (!gepard_json_check (json, len, &check))
    {
      /* \u0000 would silently cut a token's C string short */
      invalid (error, "%s at byte %" G_GSIZE_FORMAT, check.problem, check.offset);
      return NULL;
    }

  ModelTables tables;
  g_autofree char *skeleton = NULL;
  const char *text = json;
  gsize text_len = len;
  find_model_tables (json, len, &tables);
  if (tables.vocab || tables.merges)
    text = skeleton = model_tables_skeleton (json, len, &tables, &text_len);

  g_autoptr (JsonParser) parser = json_parser_new ();
  GError *local_error = NULL;
  if (!json_parser_load_from_data (parser, text, text_len, &local_error))
    {
      g_set_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_INVALID,
                   "tokenizer.json is not valid JSON: %s", local_error->message);
      g_error_free (local_error);
      return NULL;
    }
  JsonNode *root = json_parser_get_root (parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      invalid (error, "the top level must be an object");
      return NULL;
    }

  g_autoptr (GepardTokenizer) tokenizer = g_new0 (GepardTokenizer, 1);
  tokenizer->strings = g_string_chunk_new (64 * 1024);
  tokenizer->added_ids = g_hash_table_new (g_str_hash, g_str_equal);
  trie_init (&tokenizer->raw_trie);
  trie_init (&tokenizer->normalized_trie);
  if (!load_tokenizer (tokenizer, json_node_get_object (root), &tables, error))
    return NULL;
  return g_steal_pointer (&tokenizer);
}

GepardTokenizer *
gepard_tokenizer_new_from_file (const char *path, GError **error)
{
  g_autofree char *contents = NULL;
  gsize length = 0;

  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (!g_file_get_contents (path, &contents, &length, error))
    return NULL;
  GError *local_error = NULL;
  GepardTokenizer *tokenizer = gepard_tokenizer_new_from_data (contents, length, &local_error);
  if (tokenizer == NULL)
    g_propagate_prefixed_error (error, local_error, "%s: ", path);
  return tokenizer;
}
