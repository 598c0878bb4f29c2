/* test-tokenizer.c: the tokenizer of gepard-core on small tokenizer.json files written here. Parity
 * with the `tokenizers` library on a large corpus is tests/python/test_tokenizer_parity.py. */
#include "gepard-error.h"
#include "gepard-tokenizer.h"

#include <json-glib/json-glib.h>
#include <string.h>

/* gepard-model.md §4 */
static const char qwen35_regex[]
    = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
      "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* --- writing small tokenizer.json files ------------------------------------------------------ */

/* The GPT-2 byte alphabet: printable Latin-1 bytes stand for themselves, the others are numbered
 * from U+0100. */
static gunichar
byte_char (guint b)
{
  guint extra = 0;
  for (guint c = 0; c < b; c++)
    if (!((c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE))
      extra++;
  if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
    return b;
  return 0x100 + extra;
}

/* `text` spelled in the byte alphabet, as vocabulary entries are */
static char *
byte_spelling (const char *text)
{
  GString *out = g_string_new (NULL);
  for (const char *p = text; *p; p++)
    g_string_append_unichar (out, byte_char ((guchar)*p));
  return g_string_free (out, FALSE);
}

static void
append_json_string (GString *out, const char *s)
{
  g_string_append_c (out, '"');
  for (const char *p = s; *p; p++)
    {
      if (*p == '"' || *p == '\\')
        g_string_append_c (out, '\\');
      if ((guchar)*p < 0x20)
        g_string_append_printf (out, "\\u%04x", (guchar)*p);
      else
        g_string_append_c (out, *p);
    }
  g_string_append_c (out, '"');
}

typedef struct
{
  /* merges as plain text, "left right" per line, in rank order; inside a token '_' stands for a
   * space and '~' for a newline (make_json spells everything in the byte alphabet) */
  const char *merges;
  const char *extra_tokens;   /* space-separated tokens reachable by no merge */
  const char *added_tokens;   /* a JSON array, NULL: [] */
  const char *normalizer;     /* JSON, NULL: {"type": "NFC"} */
  const char *pre_tokenizer;  /* JSON, NULL: Qwen3.5's */
  const char *decoder;        /* JSON, NULL: ByteLevel */
  const char *model_extra;    /* more members of "model" */
  const char *top_extra;      /* more members of the top level */
  gboolean merges_as_strings; /* "a b" instead of ["a", "b"] */
  const char *vocab_key;      /* how "vocab" is spelled, NULL: vocab */
  guint omit_bytes;           /* leave this many byte tokens (from 0x00) out of the vocabulary */
} Spec;

static char *
plain_to_bytes (const char *plain)
{
  g_autofree char *spaced = g_strdup (plain);
  g_strdelimit (spaced, "_", ' ');
  g_strdelimit (spaced, "~", '\n');
  return byte_spelling (spaced);
}

static char *
pre_tokenizer_json (const char *regex, const char *behavior)
{
  GString *out = g_string_new ("{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                               "\"pattern\": {\"Regex\": ");
  append_json_string (out, regex);
  g_string_append_printf (out,
                          "}, \"behavior\": \"%s\", \"invert\": false}, {\"type\": \"ByteLevel\", "
                          "\"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": "
                          "false}]}",
                          behavior);
  return g_string_free (out, FALSE);
}

static char *
make_json (const Spec *spec)
{
  GString *out = g_string_new ("{\"version\": \"1.0\", \"truncation\": null, \"padding\": null");
  g_autofree char *qwen = pre_tokenizer_json (qwen35_regex, "Isolated");
  guint next_id = 256;

  g_string_append_printf (out, ", \"added_tokens\": %s",
                          spec->added_tokens ? spec->added_tokens : "[]");
  g_string_append_printf (out, ", \"normalizer\": %s",
                          spec->normalizer ? spec->normalizer : "{\"type\": \"NFC\"}");
  g_string_append_printf (out, ", \"pre_tokenizer\": %s",
                          spec->pre_tokenizer ? spec->pre_tokenizer : qwen);
  g_string_append (out, ", \"post_processor\": null");
  g_string_append_printf (
      out, ", \"decoder\": %s",
      spec->decoder ? spec->decoder
                    : "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": "
                      "true, \"use_regex\": true}");
  g_string_append (out, ", \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
                        "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, "
                        "\"fuse_unk\": false, \"byte_fallback\": false");
  if (spec->model_extra)
    g_string_append_printf (out, ", %s", spec->model_extra);

  g_string_append_printf (out, ", \"%s\": {", spec->vocab_key ? spec->vocab_key : "vocab");
  gboolean first = TRUE;
  for (guint b = spec->omit_bytes; b < 256; b++)
    {
      char utf8[8] = {0};
      g_unichar_to_utf8 (byte_char (b), utf8);
      g_string_append (out, first ? "" : ", ");
      append_json_string (out, utf8);
      g_string_append_printf (out, ": %u", b);
      first = FALSE;
    }
  g_auto (GStrv) merge_lines = g_strsplit (spec->merges ? spec->merges : "", "\n", -1);
  g_autoptr (GPtrArray) merge_pairs = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GHashTable) seen = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  for (guint i = 0; merge_lines[i]; i++)
    {
      if (merge_lines[i][0] == '\0')
        continue;
      g_auto (GStrv) halves = g_strsplit (merge_lines[i], " ", 2);
      g_assert_cmpuint (g_strv_length (halves), ==, 2);
      char *left = plain_to_bytes (halves[0]);
      char *right = plain_to_bytes (halves[1]);
      char *merged = g_strconcat (left, right, NULL);
      if (!g_hash_table_contains (seen, merged))
        {
          g_string_append (out, ", ");
          append_json_string (out, merged);
          g_string_append_printf (out, ": %u", next_id++);
          g_hash_table_add (seen, g_strdup (merged));
        }
      g_ptr_array_add (merge_pairs, left);
      g_ptr_array_add (merge_pairs, right);
      g_free (merged);
    }
  g_auto (GStrv) extra = g_strsplit (spec->extra_tokens ? spec->extra_tokens : "", " ", -1);
  for (guint i = 0; extra[i]; i++)
    if (extra[i][0])
      {
        g_autofree char *token = plain_to_bytes (extra[i]);
        g_string_append (out, ", ");
        append_json_string (out, token);
        g_string_append_printf (out, ": %u", next_id++);
      }
  g_string_append (out, "}, \"merges\": [");
  for (guint i = 0; i < merge_pairs->len; i += 2)
    {
      g_string_append (out, i ? ", " : "");
      if (spec->merges_as_strings)
        {
          g_autofree char *joined
              = g_strconcat (merge_pairs->pdata[i], " ", (char *)merge_pairs->pdata[i + 1], NULL);
          append_json_string (out, joined);
        }
      else
        {
          g_string_append_c (out, '[');
          append_json_string (out, merge_pairs->pdata[i]);
          g_string_append (out, ", ");
          append_json_string (out, merge_pairs->pdata[i + 1]);
          g_string_append_c (out, ']');
        }
    }
  g_string_append (out, "]}");
  if (spec->top_extra)
    g_string_append_printf (out, ", %s", spec->top_extra);
  g_string_append (out, "}");
  return g_string_free (out, FALSE);
}

static GepardTokenizer *
make_tokenizer (const Spec *spec)
{
  g_autofree char *json = make_json (spec);
  g_autoptr (GError) error = NULL;
  GepardTokenizer *tokenizer = gepard_tokenizer_new_from_data (json, -1, &error);
  g_assert_no_error (error);
  g_assert_nonnull (tokenizer);
  return tokenizer;
}

static void
expect_error (const Spec *spec, gint code, const char *in_message)
{
  g_autofree char *json = make_json (spec);
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardTokenizer) tokenizer = gepard_tokenizer_new_from_data (json, -1, &error);
  g_assert_null (tokenizer);
  g_assert_error (error, GEPARD_TOKENIZER_ERROR, code);
  if (in_message && !strstr (error->message, in_message))
    g_error ("\"%s\" does not name \"%s\"", error->message, in_message);
}

/* --- encoding --------------------------------------------------------------------------------- */

static GArray *
encode (const GepardTokenizer *tokenizer, const char *text, gssize length)
{
  g_autoptr (GError) error = NULL;
  GArray *ids = gepard_tokenizer_encode (tokenizer, text, length, &error);
  g_assert_no_error (error);
  g_assert_nonnull (ids);
  return ids;
}

/* The ids of `text`, written as the text of each token joined by '·' ("it·'s"), so that the
 * expected tokenization is easy to read. */
static char *
encode_to_plain (const GepardTokenizer *tokenizer, const char *text)
{
  g_autoptr (GArray) ids = encode (tokenizer, text, -1);
  GString *out = g_string_new (NULL);
  for (guint i = 0; i < ids->len; i++)
    {
      gint32 id = g_array_index (ids, gint32, i);
      g_autofree char *piece = gepard_tokenizer_decode (tokenizer, &id, 1);
      if (i)
        g_string_append (out, "\xc2\xb7");
      g_string_append (out, piece);
    }
  return g_string_free (out, FALSE);
}

#define assert_tokens(tokenizer, text, expected)                                                   \
  G_STMT_START                                                                                     \
  {                                                                                                \
    g_autofree char *got_ = encode_to_plain ((tokenizer), (text));                                 \
    g_assert_cmpstr (got_, ==, (expected));                                                        \
  }                                                                                                \
  G_STMT_END

static gboolean
same_ids (GArray *a, GArray *b)
{
  return a->len == b->len && memcmp (a->data, b->data, a->len * sizeof (gint32)) == 0;
}

/* --- tests ----------------------------------------------------------------------------------- */

static void
test_replace_invalid_utf8 (void)
{
  /* expected values are Python's bytes.decode("utf-8", "replace") */
  static const struct
  {
    const char *in;
    gssize len;
    const char *out;
  } cases[] = {
      {"abc", -1, "abc"},
      {"\xff", -1, "\xEF\xBF\xBD"},
      {"\xe2\x82", -1, "\xEF\xBF\xBD"},
      {"\xe2\x82\xac", -1, "\xe2\x82\xac"},
      {"\xe0\x80\xaf", -1, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xed\xa0\x80", -1, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xf0\x90\x80", -1, "\xEF\xBF\xBD"},
      {"\xf4\x90\x80\x80", -1, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"\xc0\xaf", -1, "\xEF\xBF\xBD\xEF\xBF\xBD"},
      {"a\xf1\x80\x80\xe1\x80\xc2"
       "b",
       -1,
       "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"
       "b"},
      {"\xf0\x9f\x98\x80\x80", -1, "\xf0\x9f\x98\x80\xEF\xBF\xBD"},
      {"\xc2\x41", -1, "\xEF\xBF\xBD\x41"},
  };

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      gsize len = 0;
      g_autofree char *out
          = gepard_tokenizer_replace_invalid_utf8 (cases[i].in, cases[i].len, &len);
      g_assert_cmpstr (out, ==, cases[i].out);
      g_assert_cmpuint (len, ==, strlen (cases[i].out));
    }

  /* NUL bytes are text like any other */
  gsize len = 0;
  g_autofree char *out = gepard_tokenizer_replace_invalid_utf8 ("a\0\xff", 3, &len);
  g_assert_cmpuint (len, ==, 5);
  g_assert_cmpmem (out, len, "a\0\xEF\xBF\xBD", 5);
}

static void
test_byte_level_basics (void)
{
  Spec spec = {.merges = "h e\nl l\nhe ll\nhell o"};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  assert_tokens (tokenizer, "hello", "hello");
  assert_tokens (tokenizer, "help", "he·l·p");
  assert_tokens (tokenizer, "", "");
  /* every byte has its token, so any text encodes */
  g_autoptr (GArray) ids = encode (tokenizer, "\xc3\xa9", -1);
  g_assert_cmpuint (ids->len, ==, 2);
  g_assert_cmpint (g_array_index (ids, gint32, 0), ==, 0xc3);
  g_assert_cmpint (g_array_index (ids, gint32, 1), ==, 0xa9);
  g_assert_cmpuint (gepard_tokenizer_get_n_ids (tokenizer), ==, 256 + 4);
  g_assert_cmpstr (gepard_tokenizer_id_to_token (tokenizer, 256 + 3), ==, "hello");
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "hell"), ==, 256 + 2);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "\xc4\xa0"), ==, ' ');
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "nope"), ==, -1);
  g_assert_null (gepard_tokenizer_id_to_token (tokenizer, -1));
  g_assert_null (gepard_tokenizer_id_to_token (tokenizer, 100000));
}

static void
test_merge_ranks (void)
{
  /* the lowest rank merges first wherever it is: (b c) outranks (a b), so "abc" is a·bc → abc,
   * never ab·c; equal ranks go left to right */
  Spec spec = {.merges = "b c\na b\na bc"};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  assert_tokens (tokenizer, "abc", "abc");
  assert_tokens (tokenizer, "ab", "ab");
  assert_tokens (tokenizer, "aaaa", "a·a·a·a");

  /* aaaaa: (a a) at 0 and 2 first, then (aa a) on the right; (aa aa) is no merge */
  Spec spec2 = {.merges = "a a\naa a\naaa a"};
  g_autoptr (GepardTokenizer) leftmost = make_tokenizer (&spec2);
  assert_tokens (leftmost, "aaaaa", "aa·aaa");
  assert_tokens (leftmost, "aaaa", "aa·aa");
  assert_tokens (leftmost, "aaa", "aaa");
}

static void
test_merges_string_form (void)
{
  Spec arrays = {.merges = "h e\nl l\nhe ll\nhell o\n_ w\n_w o"};
  Spec strings = arrays;
  strings.merges_as_strings = TRUE;
  g_autoptr (GepardTokenizer) a = make_tokenizer (&arrays);
  g_autoptr (GepardTokenizer) b = make_tokenizer (&strings);
  const char *text = "hello world, hello wo";
  g_autoptr (GArray) ids_a = encode (a, text, -1);
  g_autoptr (GArray) ids_b = encode (b, text, -1);
  g_assert_true (same_ids (ids_a, ids_b));
  assert_tokens (b, text, "hello· wo·r·l·d·,· ·hello· wo");
}

static void
test_added_tokens_split_first (void)
{
  Spec spec = {
      .merges = "< |\n| >",
      .added_tokens = "[{\"id\": 300, \"content\": \"<|x|>\", \"single_word\": false, \"lstrip\": "
                      "false, \"rstrip\": false, \"normalized\": false, \"special\": true},"
                      "{\"id\": 301, \"content\": \"<|x|>y\", \"single_word\": false, \"lstrip\": "
                      "false, \"rstrip\": false, \"normalized\": false, \"special\": true}]",
  };
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  g_autoptr (GArray) ids = encode (tokenizer, "a<|x|>b", -1);
  g_assert_cmpuint (ids->len, ==, 3);
  g_assert_cmpint (g_array_index (ids, gint32, 0), ==, 'a');
  g_assert_cmpint (g_array_index (ids, gint32, 1), ==, 300);
  g_assert_cmpint (g_array_index (ids, gint32, 2), ==, 'b');
  /* the longest match wins */
  g_autoptr (GArray) longest = encode (tokenizer, "<|x|>y<|x|>", -1);
  g_assert_cmpuint (longest->len, ==, 2);
  g_assert_cmpint (g_array_index (longest, gint32, 0), ==, 301);
  g_assert_cmpint (g_array_index (longest, gint32, 1), ==, 300);
  /* an incomplete token is plain text: the regex and the merges see it */
  assert_tokens (tokenizer, "<|x|", "<|·x·|");
  g_autoptr (GArray) partial = encode (tokenizer, "<|x|", -1);
  g_assert_cmpuint (partial->len, ==, 3);
  /* the added token splits a word that the regex would keep whole */
  assert_tokens (tokenizer, "ab<|x|>cd", "a·b·<|x|>·c·d");
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<|x|>"), ==, 300);
  g_assert_cmpstr (gepard_tokenizer_id_to_token (tokenizer, 301), ==, "<|x|>y");
  g_assert_cmpuint (gepard_tokenizer_get_n_ids (tokenizer), ==, 302);
}

static void
test_added_tokens_normalized (void)
{
  /* "e\u0301" as a raw token matches only the raw decomposed text; "\u00e9" as a normalized
   * token matches the NFC form of either spelling */
  Spec spec = {
      .added_tokens
      = "[{\"id\": 400, \"content\": \"xe\\u0301\", \"single_word\": false, \"lstrip\": "
        "false, \"rstrip\": false, \"normalized\": false, \"special\": true},"
        "{\"id\": 401, \"content\": \"\\u00e9t\\u00e9\", \"single_word\": false, "
        "\"lstrip\": false, \"rstrip\": false, \"normalized\": true, \"special\": "
        "false}]",
  };
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  g_autoptr (GArray) raw = encode (tokenizer, "xe\xcc\x81", -1);
  g_assert_cmpuint (raw->len, ==, 1);
  g_assert_cmpint (g_array_index (raw, gint32, 0), ==, 400);
  g_autoptr (GArray) composed = encode (tokenizer, "x\xc3\xa9", -1);
  g_assert_cmpuint (composed->len, ==, 3);

  g_autoptr (GArray) summer = encode (tokenizer, "\xc3\xa9t\xc3\xa9", -1);
  g_autoptr (GArray) summer_nfd = encode (tokenizer, "e\xcc\x81te\xcc\x81", -1);
  g_assert_cmpuint (summer->len, ==, 1);
  g_assert_cmpint (g_array_index (summer, gint32, 0), ==, 401);
  g_assert_true (same_ids (summer, summer_nfd));
}

static void
test_added_token_flags (void)
{
  /* as the reference's AddedVocabulary: lstrip/rstrip take the whitespace next to the token,
   * single_word needs non-word characters around it */
  Spec spec = {
      .added_tokens
      = "[{\"id\": 500, \"content\": \"<m>\", \"single_word\": false, \"lstrip\": true, "
        "\"rstrip\": true, \"normalized\": false, \"special\": true},"
        "{\"id\": 501, \"content\": \"cat\", \"single_word\": true, \"lstrip\": false, "
        "\"rstrip\": false, \"normalized\": true, \"special\": false}]",
  };
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  assert_tokens (tokenizer, "a  <m>\t b", "a·<m>·b");
  assert_tokens (tokenizer, "a cat b", "a· ·cat· ·b");
  assert_tokens (tokenizer, "cat", "cat");
  assert_tokens (tokenizer, "cats", "c·a·t·s");
  assert_tokens (tokenizer, "a_cat", "a·_·c·a·t");
  assert_tokens (tokenizer, "(cat)", "(·cat·)");
}

static void
test_nfc (void)
{
  Spec spec = {.merges = "\xc3 \xa9\ncaf \xc3\xa9\nc a\nca f"};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  g_autoptr (GArray) composed = encode (tokenizer, "caf\xc3\xa9", -1);
  g_autoptr (GArray) decomposed = encode (tokenizer, "cafe\xcc\x81", -1);
  g_assert_true (same_ids (composed, decomposed));
  g_assert_cmpuint (composed->len, ==, 1);

  /* canonical reordering: dot below (220) before acute (230) whatever the input order */
  g_autoptr (GArray) a = encode (tokenizer, "q\xcc\x81\xcc\xa3", -1);
  g_autoptr (GArray) b = encode (tokenizer, "q\xcc\xa3\xcc\x81", -1);
  g_assert_true (same_ids (a, b));
  g_autofree char *normalized
      = gepard_tokenizer_normalize (tokenizer, "q\xcc\x81\xcc\xa3", -1, NULL);
  g_assert_cmpstr (normalized, ==, "q\xcc\xa3\xcc\x81");
  /* singletons and Hangul */
  g_autofree char *angstrom = gepard_tokenizer_normalize (tokenizer, "\xe2\x84\xab", -1, NULL);
  g_assert_cmpstr (angstrom, ==, "\xc3\x85");
  g_autofree char *hangul
      = gepard_tokenizer_normalize (tokenizer, "\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab", -1, NULL);
  g_assert_cmpstr (hangul, ==, "\xed\x95\x9c");
  /* a mark the reference's Unicode 9.0 tables do not know (U+1AC1, class 230 since Unicode 14)
   * is a starter there: nothing is reordered around it */
  g_autofree char *unknown
      = gepard_tokenizer_normalize (tokenizer, "a\xe1\xab\x81\xcc\xa3", -1, NULL);
  g_assert_cmpstr (unknown, ==, "a\xe1\xab\x81\xcc\xa3");
  /* NUL is kept and composes with nothing */
  gsize len = 0;
  g_autofree char *with_nul = gepard_tokenizer_normalize (tokenizer, "e\0\xcc\x81", 4, &len);
  g_assert_cmpmem (with_nul, len, "e\0\xcc\x81", 4);

  /* without a normalizer the text is taken as it is */
  Spec none = {.normalizer = "null"};
  g_autoptr (GepardTokenizer) raw = make_tokenizer (&none);
  g_autoptr (GArray) raw_composed = encode (raw, "\xc3\xa9", -1);
  g_autoptr (GArray) raw_decomposed = encode (raw, "e\xcc\x81", -1);
  g_assert_false (same_ids (raw_composed, raw_decomposed));

  /* a Sequence of NFC is NFC */
  Spec sequence
      = {.normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}"};
  g_autoptr (GepardTokenizer) seq = make_tokenizer (&sequence);
  g_autoptr (GArray) seq_decomposed = encode (seq, "e\xcc\x81", -1);
  g_assert_true (same_ids (raw_composed, seq_decomposed));
}

static void
test_regex_pieces (void)
{
  Spec spec
      = {.merges = "1 2\n2 3\ni t\nt '\n' s\nT '\n' S\n_ _\n_ b\n_ w\nl l\n' ll\n~ ~\n! !\n_ !"};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  /* gepard-model.md §4: digits are single pieces, so "12" never merges */
  assert_tokens (tokenizer, "123", "1·2·3");
  assert_tokens (tokenizer, "x12y", "x·1·2·y");
  /* contractions, case-insensitively, split from the word before: "t'" never forms */
  assert_tokens (tokenizer, "it's", "it·'s");
  assert_tokens (tokenizer, "IT'S", "I·T·'S");
  assert_tokens (tokenizer, "we'll", "w·e·'ll");
  /* whitespace: a run leaves its last space to the next word */
  assert_tokens (tokenizer, "a   b", "a·  · b");
  assert_tokens (tokenizer, "a\n\nb", "a·\n\n·b");
  assert_tokens (tokenizer, "a \t", "a· ·\t");
  /* punctuation takes one space in front of it; "!!" (rank 12) merges before " !" (13) */
  assert_tokens (tokenizer, "x !!", "x· ·!!");
  assert_tokens (tokenizer, "x  !!", "x· · ·!!");
}

static void
test_ignore_merges (void)
{
  Spec off = {.merges = "a b", .extra_tokens = "abc"};
  Spec on = {.merges = "a b", .extra_tokens = "abc", .model_extra = "\"ignore_merges\": true"};
  g_autoptr (GepardTokenizer) merging = make_tokenizer (&off);
  g_autoptr (GepardTokenizer) ignoring = make_tokenizer (&on);

  assert_tokens (merging, "abc", "ab·c");
  assert_tokens (ignoring, "abc", "abc");
  g_autoptr (GArray) whole = encode (ignoring, "abc", -1);
  g_assert_cmpuint (whole->len, ==, 1);
  /* a piece that is not a vocabulary entry still merges */
  assert_tokens (ignoring, "abd", "ab·d");
}

static void
test_decode (void)
{
  Spec spec = {
      .merges = "h e\nl l\nhe ll\nhell o\n_ w",
      .added_tokens = "[{\"id\": 300, \"content\": \"<|im_start|>\", \"single_word\": false, "
                      "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": "
                      "true}, {\"id\": 301, \"content\": \"\\u00ff!\", \"single_word\": false, "
                      "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": "
                      "true}]",
  };
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);
  const char *texts[] = {"hello world", "<|im_start|>caf\xc3\xa9 \xe2\x82\xac 2026\n\t!", "",
                         "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "e\xcc\x81"};

  for (guint i = 0; i < G_N_ELEMENTS (texts); i++)
    {
      g_autoptr (GArray) ids = encode (tokenizer, texts[i], -1);
      g_autofree char *text = gepard_tokenizer_decode (tokenizer, (gint32 *)ids->data, ids->len);
      g_autofree char *nfc = gepard_tokenizer_normalize (tokenizer, texts[i], -1, NULL);
      g_assert_cmpstr (text, ==, nfc);
    }

  /* ids that spell invalid UTF-8 decode to U+FFFD; unknown ids are skipped */
  gint32 broken[] = {0xc3, 'a', -5, 100000, 0xe2, 0x82};
  g_autofree char *replaced = gepard_tokenizer_decode (tokenizer, broken, G_N_ELEMENTS (broken));
  g_assert_cmpstr (replaced, ==,
                   "\xEF\xBF\xBD"
                   "a\xEF\xBF\xBD");
  /* an added token whose characters are all in the byte alphabet goes through it, as in the
   * reference's ByteLevel decoder: "\u00ff!" is the byte 0xff and '!' */
  gint32 y[] = {301};
  g_autofree char *y_text = gepard_tokenizer_decode (tokenizer, y, 1);
  g_assert_cmpstr (y_text, ==, "\xEF\xBF\xBD!");
  /* NUL bytes survive with the length */
  gint32 nul[] = {'a', 0, 'b'};
  gsize len = 0;
  g_autofree char *with_nul = gepard_tokenizer_decode_len (tokenizer, nul, 3, &len);
  g_assert_cmpmem (with_nul, len, "a\0b", 3);
}

static void
test_invalid_utf8_input (void)
{
  Spec spec = {0};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);
  g_autoptr (GArray) broken = encode (tokenizer, "a\xff\xe2\x82z", -1);
  g_autoptr (GArray) replaced = encode (tokenizer, "a\xEF\xBF\xBD\xEF\xBF\xBDz", -1);
  g_assert_true (same_ids (broken, replaced));
  g_autoptr (GArray) nul = encode (tokenizer, "a\0b", 3);
  g_assert_cmpuint (nul->len, ==, 3);
  g_assert_cmpint (g_array_index (nul, gint32, 1), ==, 0);
}

static void
test_unknown_byte (void)
{
  /* without the byte tokens 0x00..0x40 the text "A" (0x41) still encodes, " " does not */
  Spec spec = {.omit_bytes = 0x41};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) ok = encode (tokenizer, "A", -1);
  g_assert_cmpuint (ok->len, ==, 1);
  g_autoptr (GArray) ids = gepard_tokenizer_encode (tokenizer, "A B", -1, &error);
  g_assert_null (ids);
  g_assert_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_UNKNOWN_TOKEN);
}

static void
test_unsupported (void)
{
  static const struct
  {
    Spec spec;
    const char *named;
  } cases[] = {
      {{.normalizer = "{\"type\": \"Lowercase\"}"}, "Lowercase"},
      {{.normalizer = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": "
                      "\"NFKC\"}]}"},
       "NFKC"},
      {{.pre_tokenizer = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": "
                         "true, \"use_regex\": true}"},
       "ByteLevel"},
      {{.pre_tokenizer
        = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
          "\"pattern\": {\"String\": \" \"}, \"behavior\": \"Isolated\", \"invert\": "
          "false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
          "\"trim_offsets\": false, \"use_regex\": false}]}"},
       "String pattern"},
      {{.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                         "\"pattern\": {\"Regex\": \" \"}, \"behavior\": \"Removed\", \"invert\": "
                         "false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                         "\"trim_offsets\": false, \"use_regex\": false}]}"},
       "Removed"},
      {{.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                         "\"pattern\": {\"Regex\": \" \"}, \"behavior\": \"Isolated\", \"invert\": "
                         "true}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                         "\"trim_offsets\": false, \"use_regex\": false}]}"},
       "invert"},
      {{.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                         "\"pattern\": {\"Regex\": \" \"}, \"behavior\": \"Isolated\", \"invert\": "
                         "false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
                         "\"trim_offsets\": false, \"use_regex\": false}]}"},
       "add_prefix_space"},
      {{.pre_tokenizer = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                         "\"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\", \"invert\": "
                         "false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                         "\"trim_offsets\": false, \"use_regex\": false}]}"},
       "regex"},
      {{.pre_tokenizer = "null"}, "pre_tokenizer"},
      {{.decoder = "{\"type\": \"WordPiece\", \"prefix\": \"##\", \"cleanup\": true}"},
       "WordPiece"},
      {{.decoder = "null"}, "decoder"},
      {{.model_extra = "\"byte_fallback\": true"}, "byte_fallback"},
      {{.top_extra = "\"extra_feature\": 1"}, "extra_feature"},
  };

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    expect_error (&cases[i].spec, GEPARD_TOKENIZER_ERROR_UNSUPPORTED, cases[i].named);

  /* members of the model and the top level that change the ids */
  static const struct
  {
    const char *json;
    const char *named;
  } texts[] = {
      {"\"unk_token\": \"<unk>\"", "unk_token"},
      {"\"dropout\": 0.1", "dropout"},
      {"\"continuing_subword_prefix\": \"##\"", "continuing_subword_prefix"},
      {"\"end_of_word_suffix\": \"</w>\"", "end_of_word_suffix"},
  };
  for (guint i = 0; i < G_N_ELEMENTS (texts); i++)
    {
      g_autofree char *pre = pre_tokenizer_json (qwen35_regex, "Isolated");
      g_autofree char *full = g_strdup_printf (
          "{\"pre_tokenizer\": %s, \"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": "
          "\"BPE\", %s, \"vocab\": {}, \"merges\": []}}",
          pre, texts[i].json);
      g_autoptr (GError) error = NULL;
      g_autoptr (GepardTokenizer) tokenizer = gepard_tokenizer_new_from_data (full, -1, &error);
      g_assert_null (tokenizer);
      g_assert_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_UNSUPPORTED);
      g_assert_nonnull (strstr (error->message, texts[i].named));
    }
  /* top-level members (json-glib keeps the last of a repeated member, so these replace the nulls
   * make_json writes) */
  static const struct
  {
    const char *json;
    const char *named;
  } top[] = {
      {"\"truncation\": {\"max_length\": 5}", "truncation"},
      {"\"padding\": {}", "padding"},
      {"\"version\": \"2.0\"", "version"},
      {"\"post_processor\": {\"type\": \"TemplateProcessing\"}", "TemplateProcessing"},
  };
  for (guint i = 0; i < G_N_ELEMENTS (top); i++)
    {
      Spec spec = {.top_extra = top[i].json};
      expect_error (&spec, GEPARD_TOKENIZER_ERROR_UNSUPPORTED, top[i].named);
    }
}

static void
test_malformed (void)
{
  /* whole documents that are not a tokenizer */
  static const char *const documents[] = {
      "",
      "{",
      "[]",
      "null",
      "42",
      "{\"model\": 5}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}",
      "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}",
      "\xff\xfe{}",
      "{\"a\": \"\\u0000\"}",
  };
  for (guint i = 0; i < G_N_ELEMENTS (documents); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (GepardTokenizer) tokenizer
          = gepard_tokenizer_new_from_data (documents[i], -1, &error);
      g_assert_null (tokenizer);
      g_assert_nonnull (error);
      g_assert_true (error->domain == GEPARD_TOKENIZER_ERROR);
    }
  g_autoptr (GError) nul_error = NULL;
  g_assert_null (gepard_tokenizer_new_from_data ("{\"a\":\0 1}", 9, &nul_error));
  g_assert_error (nul_error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_INVALID);

  /* deep nesting is refused before it reaches the recursive parser */
  GString *deep = g_string_new ("{\"a\": ");
  for (guint i = 0; i < 100000; i++)
    g_string_append_c (deep, '[');
  g_autoptr (GError) deep_error = NULL;
  g_assert_null (gepard_tokenizer_new_from_data (deep->str, deep->len, &deep_error));
  g_assert_error (deep_error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_INVALID);
  g_string_free (deep, TRUE);

  /* well-formed JSON with wrong members or types */
  static const struct
  {
    Spec spec;
    const char *named;
  } cases[] = {
      {{.model_extra = "\"ignore_merges\": \"yes\""}, "ignore_merges"},
      {{.vocab_key = "vocabulary"}, "vocabulary"},
      {{.merges = "x q"}, NULL},
      {{.added_tokens = "{}"}, "added_tokens"},
      {{.added_tokens = "[5]"}, "added_tokens"},
      {{.added_tokens = "[{\"id\": 300}]"}, "content"},
      {{.added_tokens = "[{\"id\": \"300\", \"content\": \"x\"}]"}, "id"},
      {{.added_tokens = "[{\"id\": -1, \"content\": \"x\"}]"}, "id"},
      {{.added_tokens = "[{\"id\": 300, \"content\": \"\"}]"}, "content"},
      {{.added_tokens = "[{\"id\": 300, \"content\": \"x\", \"special\": 1}]"}, "special"},
      {{.added_tokens = "[{\"id\": 300, \"content\": \"<a>\"}, {\"id\": 301, \"content\": "
                        "\"<a>\"}]"},
       "twice"},
      {{.added_tokens = "[{\"id\": 5, \"content\": \"<a>\"}]"}, "id 5"},
      {{.added_tokens = "[{\"id\": 300, \"content\": \"a\"}]"}, "vocabulary gives"},
      {{.normalizer = "{\"normalizers\": []}"}, "type"},
      {{.normalizer = "5"}, "normalizer"},
      {{.pre_tokenizer = "{\"type\": \"Sequence\"}"}, "pretokenizers"},
  };
  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      Spec spec = cases[i].spec;
      if (spec.vocab_key)
        {
          /* "vocabulary" is an unknown member and "vocab" is missing */
          g_autofree char *json = make_json (&spec);
          g_autoptr (GError) error = NULL;
          g_assert_null (gepard_tokenizer_new_from_data (json, -1, &error));
          g_assert_nonnull (error);
          continue;
        }
      if (spec.merges)
        {
          /* a merge whose result is missing from the vocabulary */
          g_autofree char *json = make_json (&spec);
          char *entry = strstr (json, "\"xq\": ");
          g_assert_nonnull (entry);
          memcpy (entry, "\"zz\"", 4);
          g_autoptr (GError) error = NULL;
          g_assert_null (gepard_tokenizer_new_from_data (json, -1, &error));
          g_assert_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_INVALID);
          g_assert_nonnull (strstr (error->message, "xq"));
          continue;
        }
      expect_error (&spec, GEPARD_TOKENIZER_ERROR_INVALID, cases[i].named);
    }

  /* vocabulary and merges entries of the wrong type, through both readers of the tables */
  static const char *const tables[] = {
      "\"vocab\": {\"a\": \"0\"}, \"merges\": []",
      "\"vocab\": {\"a\": 1.5}, \"merges\": []",
      "\"vocab\": {\"a\": -1}, \"merges\": []",
      "\"vocab\": {\"a\": 1e3}, \"merges\": []",
      "\"vocab\": {\"a\": 99999999999}, \"merges\": []",
      "\"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []",
      "\"vocab\": [], \"merges\": []",
      "\"vocab\": {\"a\": 0}, \"merges\": {}",
      "\"vocab\": {\"a\": 0}, \"merges\": [\"a\"]",
      "\"vocab\": {\"a\": 0}, \"merges\": [[\"a\"]]",
      "\"vocab\": {\"a\": 0}, \"merges\": [[\"a\", 1]]",
      "\"vocab\": {\"a\": 0}, \"merges\": [\"a a\"]",
      "\"vocab\": {\"a\": 0}, \"merges\": [5]",
      "\"vocab\": {\"a\\ud800\": 0}, \"merges\": []",

      "\"vocab\": {\"a\": 0 \"b\": 1}, \"merges\": []",
      "\"vocab\": {\"a\": 0,}, \"merges\": []",
  };
  g_autofree char *pre = pre_tokenizer_json (qwen35_regex, "Isolated");
  for (guint i = 0; i <= G_N_ELEMENTS (tables); i++)
    for (guint escaped = 0; escaped < 2; escaped++)
      {
        /* the last case is for the direct reader only: json-glib takes "\q" for "q" */
        if (i == G_N_ELEMENTS (tables) && escaped)
          continue;
        g_autofree char *members = g_strdup (
            i < G_N_ELEMENTS (tables) ? tables[i] : "\"vocab\": {\"a\\q\": 0}, \"merges\": []");
        GString *text = g_string_new (members);
        if (escaped)
          {
            /* spelled with escapes, the members are read by json-glib */
            g_string_replace (text, "\"vocab\"", "\"voc\\u0061b\"", 1);
            g_string_replace (text, "\"merges\"", "\"merge\\u0073\"", 1);
          }
        g_autofree char *model = g_string_free (text, FALSE);
        g_autofree char *json = g_strdup_printf ("{\"pre_tokenizer\": %s, \"decoder\": {\"type\": "
                                                 "\"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
                                                 "%s}}",
                                                 pre, model);
        g_autoptr (GError) error = NULL;
        g_autoptr (GepardTokenizer) tokenizer = gepard_tokenizer_new_from_data (json, -1, &error);
        if (tokenizer)
          g_error ("accepted: %s", json);
        g_assert_error (error, GEPARD_TOKENIZER_ERROR, GEPARD_TOKENIZER_ERROR_INVALID);
      }
}

/* Every prefix and many random corruptions of a valid file: an error or a tokenizer that works,
 * never a crash (the build runs the tests with MALLOC_PERTURB_ and, under a sanitizer, would show
 * any read out of bounds). */
static void
test_corrupted_files (void)
{
  Spec spec = {
      .merges = "h e\nl l\nhe ll\nhell o\n_ w\n\xc3 \xa9",
      .added_tokens = "[{\"id\": 300, \"content\": \"<|x|>\", \"single_word\": true, \"lstrip\": "
                      "true, \"rstrip\": true, \"normalized\": true, \"special\": true}]",
  };
  g_autofree char *json = make_json (&spec);
  gsize len = strlen (json);
  guint loaded = 0;

  for (gsize cut = 0; cut < len; cut++)
    {
      g_autoptr (GError) error = NULL;
      g_autofree char *prefix = g_strndup (json, cut);
      g_autoptr (GepardTokenizer) tokenizer = gepard_tokenizer_new_from_data (prefix, cut, &error);
      g_assert_null (tokenizer);
      g_assert_true (error->domain == GEPARD_TOKENIZER_ERROR);
    }

  GRand *rand = g_rand_new_with_seed (1234);
  static const char noise[] = "{}[]\",:\\ 0a-\xc3\xa9\xff";
  for (guint round = 0; round < 3000; round++)
    {
      g_autofree char *copy = g_strdup (json);
      guint n_changes = g_rand_int_range (rand, 1, 4);
      for (guint k = 0; k < n_changes; k++)
        copy[g_rand_int_range (rand, 0, len)] = noise[g_rand_int_range (rand, 0, sizeof noise - 1)];
      g_autoptr (GError) error = NULL;
      g_autoptr (GepardTokenizer) tokenizer = gepard_tokenizer_new_from_data (copy, len, &error);
      if (tokenizer == NULL)
        {
          g_assert_nonnull (error);
          continue;
        }
      loaded++;
      g_autoptr (GError) encode_error = NULL;
      g_autoptr (GArray) ids
          = gepard_tokenizer_encode (tokenizer, "hello <|x|> w\xc3\xa9 12", -1, &encode_error);
      g_assert_true ((ids == NULL) != (encode_error == NULL));
      if (ids)
        g_free (gepard_tokenizer_decode (tokenizer, (gint32 *)ids->data, ids->len));
    }
  g_rand_free (rand);
  g_test_message ("%u of 3000 corrupted files still loaded", loaded);
}

/* The tables read directly and the same tables read through json-glib give one tokenizer. */
static void
test_table_readers_agree (void)
{
  Spec direct
      = {.merges = "h e\nl l\nhe ll\nhell o\n_ w\n\xc3 \xa9\n_w o", .merges_as_strings = TRUE};
  Spec escaped = direct;
  escaped.vocab_key = "voc\\u0061b";
  g_autoptr (GepardTokenizer) a = make_tokenizer (&direct);
  g_autoptr (GepardTokenizer) b = make_tokenizer (&escaped);
  const char *text = "hello world, caf\xc3\xa9 w\xc3\xa9 hellohello";

  g_autoptr (GArray) ids_a = encode (a, text, -1);
  g_autoptr (GArray) ids_b = encode (b, text, -1);
  g_assert_true (same_ids (ids_a, ids_b));
  g_assert_cmpuint (gepard_tokenizer_get_n_ids (a), ==, gepard_tokenizer_get_n_ids (b));
  for (guint id = 0; id < gepard_tokenizer_get_n_ids (a); id++)
    g_assert_cmpstr (gepard_tokenizer_id_to_token (a, id), ==,
                     gepard_tokenizer_id_to_token (b, id));
}

static void
test_ids_with_gaps (void)
{
  /* test models move the added tokens to Qwen3.5's ids (gepard-model.md §4) */
  Spec spec = {
      .added_tokens = "[{\"id\": 248070, \"content\": \"<|audio_start|>\", \"special\": true, "
                      "\"normalized\": false}, {\"id\": 248076, \"content\": \"<|audio_pad|>\", "
                      "\"special\": true, \"normalized\": false}]",
  };
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);

  g_assert_cmpuint (gepard_tokenizer_get_n_ids (tokenizer), ==, 248077);
  g_assert_null (gepard_tokenizer_id_to_token (tokenizer, 248071));
  g_assert_null (gepard_tokenizer_id_to_token (tokenizer, 1000));
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<|audio_pad|>"), ==, 248076);
  g_autoptr (GArray) ids = encode (tokenizer, "<|audio_start|>hi<|audio_pad|>", -1);
  g_assert_cmpuint (ids->len, ==, 4);
  g_assert_cmpint (g_array_index (ids, gint32, 0), ==, 248070);
  g_assert_cmpint (g_array_index (ids, gint32, 3), ==, 248076);
  gint32 back[] = {248070, 'h', 248071, 248076};
  g_autofree char *text = gepard_tokenizer_decode (tokenizer, back, G_N_ELEMENTS (back));
  g_assert_cmpstr (text, ==, "<|audio_start|>h<|audio_pad|>");
}

static char *
long_mixed_text (guint repeats)
{
  static const char *const parts[] = {
      "The quick brown fox's 12 jumps; ",
      "caf\xc3\xa9 cre\xcc\x80me  \t",
      "\xe4\xbd\xa0\xe5\xa5\xbd\xe4\xb8\x96\xe7\x95\x8c\xe3\x80\x82",
      "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4 ",
      "!!! ??? ...\r\n",
      "x2y3 z   \n\n  w",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 ",
      "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x92\xbb  ",
      "I'LL we've ",
  };
  GString *out = g_string_new (NULL);
  for (guint i = 0; i < repeats; i++)
    g_string_append (out, parts[(i * 7) % G_N_ELEMENTS (parts)]);
  return g_string_free (out, FALSE);
}

/* The Qwen3.5 regex runs on windows of long text; a pattern that matches the same but is not
 * recognised runs on the whole text. Both must give the same ids. */
static void
test_long_text_windows (void)
{
  g_autofree char *other_regex = g_strconcat (qwen35_regex, "|x(?!)", NULL);
  g_autofree char *other_pre = pre_tokenizer_json (other_regex, "Isolated");
  Spec windowed = {.merges = "_ b\nT h\nTh e\n_ q\n\xc3 \xa9\n! !"};
  Spec whole = windowed;
  whole.pre_tokenizer = other_pre;
  g_autoptr (GepardTokenizer) a = make_tokenizer (&windowed);
  g_autoptr (GepardTokenizer) b = make_tokenizer (&whole);
  g_autofree char *text = long_mixed_text (3000);

  g_autoptr (GArray) ids_a = encode (a, text, -1);
  g_autoptr (GArray) ids_b = encode (b, text, -1);
  g_assert_true (same_ids (ids_a, ids_b));
  g_autofree char *back = gepard_tokenizer_decode (a, (gint32 *)ids_a->data, ids_a->len);
  g_autofree char *nfc = gepard_tokenizer_normalize (a, text, -1, NULL);
  g_assert_cmpstr (back, ==, nfc);
}

typedef struct
{
  const GepardTokenizer *tokenizer;
  const char *text;
  GArray *ids;
} ThreadJob;

static gpointer
encode_in_thread (gpointer data)
{
  ThreadJob *job = data;
  for (guint i = 0; i < 20; i++)
    {
      g_autoptr (GArray) ids = gepard_tokenizer_encode (job->tokenizer, job->text, -1, NULL);
      if (i == 0)
        job->ids = g_array_ref (ids);
      else if (!same_ids (ids, job->ids))
        return GINT_TO_POINTER (1);
    }
  return NULL;
}

static void
test_threads (void)
{
  Spec spec = {.merges = "_ b\nT h\nTh e\n_ q\n\xc3 \xa9\n! !"};
  g_autoptr (GepardTokenizer) tokenizer = make_tokenizer (&spec);
  g_autofree char *text = long_mixed_text (400);
  g_autoptr (GArray) expected = encode (tokenizer, text, -1);
  ThreadJob jobs[4];
  GThread *threads[4];

  for (guint i = 0; i < 4; i++)
    {
      jobs[i] = (ThreadJob){tokenizer, text, NULL};
      threads[i] = g_thread_new ("encode", encode_in_thread, &jobs[i]);
    }
  for (guint i = 0; i < 4; i++)
    {
      g_assert_null (g_thread_join (threads[i]));
      g_assert_true (same_ids (jobs[i].ids, expected));
      g_array_unref (jobs[i].ids);
    }
}

/* A tokenizer.json the size of Qwen3.5's: 248k vocabulary entries, 247k merges. */
static void
test_full_size_vocabulary (void)
{
  const guint n_merges = 247587;
  GString *json = g_string_new (NULL);
  g_autoptr (GPtrArray) tokens = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GHashTable) known = g_hash_table_new (g_str_hash, g_str_equal);
  g_autoptr (GString) merges = g_string_new (NULL);
  GRand *rand = g_rand_new_with_seed (7);

  for (guint b = 0; b < 256; b++)
    {
      char *token = g_malloc0 (8);
      g_unichar_to_utf8 (byte_char (b), token);
      g_ptr_array_add (tokens, token);
      g_hash_table_add (known, token);
    }
  for (guint m = 0; m < n_merges;)
    {
      /* mostly short tokens, so that the merged ones stay short */
      double r1 = g_rand_double (rand), r2 = g_rand_double (rand);
      const char *left = tokens->pdata[(guint)(r1 * r1 * r1 * tokens->len)];
      const char *right = tokens->pdata[(guint)(r2 * r2 * r2 * tokens->len)];
      if (strlen (left) + strlen (right) > 24)
        continue;
      char *merged = g_strconcat (left, right, NULL);
      if (g_hash_table_contains (known, merged))
        {
          g_free (merged);
          continue;
        }
      g_ptr_array_add (tokens, merged);
      g_hash_table_add (known, merged);
      g_string_append (merges, m ? ", [" : "[");
      append_json_string (merges, left);
      g_string_append (merges, ", ");
      append_json_string (merges, right);
      g_string_append_c (merges, ']');
      m++;
    }
  g_rand_free (rand);

  g_autofree char *pre = pre_tokenizer_json (qwen35_regex, "Isolated");
  g_string_append_printf (
      json,
      "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": %u, \"content\": "
      "\"<|endoftext|>\", \"special\": true, \"normalized\": false}], "
      "\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": %s, \"decoder\": "
      "{\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {",
      tokens->len, pre);
  for (guint i = 0; i < tokens->len; i++)
    {
      g_string_append (json, i ? ",\n  " : "");
      append_json_string (json, tokens->pdata[i]);
      g_string_append_printf (json, ": %u", i);
    }
  g_string_append_printf (json, "}, \"merges\": [%s]}}", merges->str);

  gint64 start = g_get_monotonic_time ();
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardTokenizer) tokenizer
      = gepard_tokenizer_new_from_data (json->str, json->len, &error);
  gint64 loaded = g_get_monotonic_time ();
  g_assert_no_error (error);
  g_test_message ("%u entries, %u merges, %.1f MB of JSON: loaded in %.3f s", tokens->len, n_merges,
                  json->len / 1e6, (loaded - start) / 1e6);
  g_string_free (json, TRUE);

  g_assert_cmpuint (gepard_tokenizer_get_n_ids (tokenizer), ==, tokens->len + 1);
  g_assert_cmpstr (gepard_tokenizer_id_to_token (tokenizer, tokens->len - 1), ==,
                   tokens->pdata[tokens->len - 1]);
  g_autofree char *text = long_mixed_text (5000);
  start = g_get_monotonic_time ();
  g_autoptr (GArray) ids = encode (tokenizer, text, -1);
  gint64 encoded = g_get_monotonic_time ();
  g_test_message ("encoded %zu bytes into %u ids in %.3f s", strlen (text), ids->len,
                  (encoded - start) / 1e6);
  /* the merges did some work */
  g_assert_cmpuint (ids->len, <, strlen (text));
  g_autofree char *back = gepard_tokenizer_decode (tokenizer, (gint32 *)ids->data, ids->len);
  g_autofree char *nfc = gepard_tokenizer_normalize (tokenizer, text, -1, NULL);
  g_assert_cmpstr (back, ==, nfc);
}

static void
test_base_tokenizer_file (void)
{
  const char *source = g_getenv ("GEPARD_SOURCE_DIR");
  g_autofree char *path
      = g_build_filename (source ? source : ".", "models", "tokenizer.json", NULL);
  if (!g_file_test (path, G_FILE_TEST_EXISTS))
    {
      g_test_skip ("models/tokenizer.json not found (set GEPARD_SOURCE_DIR)");
      return;
    }
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardTokenizer) tokenizer = gepard_tokenizer_new_from_file (path, &error);
  g_assert_no_error (error);

  /* gepard-model.md §4: the 33 added tokens in order right after the 4096 BPE entries */
  g_assert_cmpuint (gepard_tokenizer_get_n_ids (tokenizer), ==, 4096 + 33);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<|endoftext|>"), ==, 4096);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<|audio_start|>"), ==, 4096 + 26);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<tts_text_bos>"), ==, 4096 + 29);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<tts_text_eod>"), ==, 4096 + 30);
  g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, "<|audio_pad|>"), ==, 4096 + 32);
  g_autoptr (GArray) ids = encode (tokenizer, "<tts_text_bos>Hello there<tts_text_eod>", -1);
  g_assert_cmpint (g_array_index (ids, gint32, 0), ==, 4096 + 29);
  g_assert_cmpint (g_array_index (ids, gint32, ids->len - 1), ==, 4096 + 30);

  g_autoptr (GError) missing_error = NULL;
  g_assert_null (gepard_tokenizer_new_from_file ("/nonexistent/tokenizer.json", &missing_error));
  g_assert_error (missing_error, G_FILE_ERROR, G_FILE_ERROR_NOENT);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_test_add_func ("/tokenizer/replace-invalid-utf8", test_replace_invalid_utf8);
  g_test_add_func ("/tokenizer/byte-level", test_byte_level_basics);
  g_test_add_func ("/tokenizer/merge-ranks", test_merge_ranks);
  g_test_add_func ("/tokenizer/merges-string-form", test_merges_string_form);
  g_test_add_func ("/tokenizer/added-tokens/split-first", test_added_tokens_split_first);
  g_test_add_func ("/tokenizer/added-tokens/normalized", test_added_tokens_normalized);
  g_test_add_func ("/tokenizer/added-tokens/flags", test_added_token_flags);
  g_test_add_func ("/tokenizer/added-tokens/ids-with-gaps", test_ids_with_gaps);
  g_test_add_func ("/tokenizer/nfc", test_nfc);
  g_test_add_func ("/tokenizer/regex-pieces", test_regex_pieces);
  g_test_add_func ("/tokenizer/ignore-merges", test_ignore_merges);
  g_test_add_func ("/tokenizer/decode", test_decode);
  g_test_add_func ("/tokenizer/invalid-utf8-input", test_invalid_utf8_input);
  g_test_add_func ("/tokenizer/unknown-byte", test_unknown_byte);
  g_test_add_func ("/tokenizer/unsupported", test_unsupported);
  g_test_add_func ("/tokenizer/malformed", test_malformed);
  g_test_add_func ("/tokenizer/corrupted-files", test_corrupted_files);
  g_test_add_func ("/tokenizer/table-readers-agree", test_table_readers_agree);
  g_test_add_func ("/tokenizer/long-text-windows", test_long_text_windows);
  g_test_add_func ("/tokenizer/threads", test_threads);
  g_test_add_func ("/tokenizer/full-size-vocabulary", test_full_size_vocabulary);
  g_test_add_func ("/tokenizer/base-tokenizer-file", test_base_tokenizer_file);

  return g_test_run ();
}
