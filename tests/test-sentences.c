/* test-sentences.c: the sentence splitter of gepard-core: tricky cases in several languages and
 * scripts, the same sentences whatever the pieces the text arrives in, flush, the length cut and
 * invalid UTF-8. */
#include "gepard-sentences.h"

#include <string.h>

typedef struct
{
  const char *name;
  const char *text;
  /* the expected sentences, separated by '|' ("" for none) */
  const char *sentences;
} SplitCase;

static const SplitCase split_cases[] = {
    {"en-basic", "Hello world. How are you? I'm fine!", "Hello world.|How are you?|I'm fine!"},
    {"en-titles", "Mr. Smith met Dr. Jones at St. Mary's. They talked about Prof. Lee.",
     "Mr. Smith met Dr. Jones at St. Mary's.|They talked about Prof. Lee."},
    {"en-eg-ie", "Bring fruit, e.g. apples, i.e. something sweet. Then go.",
     "Bring fruit, e.g. apples, i.e. something sweet.|Then go."},
    {"en-eg-capital", "Pick a city, e.g. Paris. Or Rome vs. Milan.",
     "Pick a city, e.g. Paris.|Or Rome vs. Milan."},
    {"en-numbers", "It costs 3.14 dollars, or 1,000.5 cents. That is $3.50. Cheap.",
     "It costs 3.14 dollars, or 1,000.5 cents.|That is $3.50.|Cheap."},
    {"en-initials", "J. R. R. Tolkien wrote it. J.R.R. Tolkien was a scholar. So was I. Really.",
     "J. R. R. Tolkien wrote it.|J.R.R. Tolkien was a scholar.|So was I.|Really."},
    {"en-quotes", "\"Really?\" she asked. \"Yes!\" he said. \"Stop!\", she cried.",
     "\"Really?\"|she asked.|\"Yes!\"|he said.|\"Stop!\", she cried."},
    {"en-quote-spanning", "\"I came. I saw. I conquered.\" Then he left.",
     "\"I came.|I saw.|I conquered.\"|Then he left."},
    {"en-curly-quotes", "He said, “Go home.” She did. ‘Fine,’ she said.",
     "He said, “Go home.”|She did.|‘Fine,’ she said."},
    {"en-brackets", "(This is it.) Next one [really!] ends here. (Why?) No.",
     "(This is it.)|Next one [really!] ends here.|(Why?)|No."},
    {"en-urls", "Visit example.com or mail jane.doe@example.org. See https://x.org/a?b=1. Done.",
     "Visit example.com or mail jane.doe@example.org.|See https://x.org/a?b=1.|Done."},
    {"en-version", "Version 2.0.1 is out. Yahoo!'s news. Ok.",
     "Version 2.0.1 is out.|Yahoo!'s news.|Ok."},
    {"en-ellipsis", "I was... thinking. Wait… what? Fine... Let's go.",
     "I was... thinking.|Wait… what?|Fine...|Let's go."},
    {"en-etc", "Apples, pears, etc. are fruit. We have apples, pears, etc. Then we eat.",
     "Apples, pears, etc. are fruit.|We have apples, pears, etc.|Then we eat."},
    {"en-inc-jr-no", "Acme Inc. makes tools. Tom Smith Jr. is the boss, vs. Jane. No. 5 is mine.",
     "Acme Inc. makes tools.|Tom Smith Jr. is the boss, vs. Jane.|No. 5 is mine."},
    {"en-approx", "It is approx. 5 km, see p. 12. Go.", "It is approx. 5 km, see p. 12.|Go."},
    {"en-list", "1. Buy milk. 2. Call Bob.", "1. Buy milk.|2. Call Bob."},
    {"en-runs", "Wow!!! Really?! Okay...", "Wow!!!|Really?!|Okay..."},
    {"en-markdown", "This is **great.** Next.", "This is **great.**|Next."},
    {"paragraphs", "Title\n\nFirst line\nstill first. Second.\r\n\r\n\nThird",
     "Title|First line still first.|Second.|Third"},
    {"paragraph-separator", "One\u2029Two", "One|Two"},
    {"abbreviation-paragraph", "See e.g.\n\nthe next part", "See e.g.|the next part"},
    {"whitespace", "   Spaces \t everywhere .  Done  ", "Spaces everywhere .|Done"},
    {"nothing-to-say", "  ...  !!  \n\n \" ", ""},
    {"emoji-kept", "Great job. \xF0\x9F\x91\x8D", "Great job.|\xF0\x9F\x91\x8D"},
    {"de-abbreviations", "Das ist z.B. ein Test. Dr. Müller kommt um 10 Uhr, d.h. pünktlich.",
     "Das ist z.B. ein Test.|Dr. Müller kommt um 10 Uhr, d.h. pünktlich."},
    {"de-ordinals", "Am 3. Oktober feiern wir. Im 19. Jahrhundert war es so. Es war 1990. Dann kam",
     "Am 3. Oktober feiern wir.|Im 19. Jahrhundert war es so.|Es war 1990.|Dann kam"},
    {"de-quotes", "„Wirklich?“, fragte sie. „Ja.“ Er ging. Nr. 7 kam auch.",
     "„Wirklich?“, fragte sie.|„Ja.“|Er ging.|Nr. 7 kam auch."},
    {"da-guillemets", "»Hej.« Han gik.", "»Hej.«|Han gik."},
    {"zh-basic", "你好。今天天气很好！你去哪儿？我去北京。",
     "你好。|今天天气很好！|你去哪儿？|我去北京。"},
    {"zh-quotes", "他说：“我们走吧。”然后就走了。“好的。”",
     "他说：“我们走吧。”|然后就走了。|“好的。”"},
    {"zh-numbers-ellipsis", "圆周率是3.14159。他想了想……然后说好!我们走吧",
     "圆周率是3.14159。|他想了想……然后说好!|我们走吧"},
    {"zh-fullwidth-decimal", "价格是３．５元．很便宜。", "价格是３．５元．|很便宜。"},
    {"ja-basic", "こんにちは。元気ですか？「はい。」と彼は言った。",
     "こんにちは。|元気ですか？|「はい。」|と彼は言った。"},
    {"ru-basic", "Привет! Как дела? Всё хорошо, т.е. отлично. А. С. Пушкин — поэт.",
     "Привет!|Как дела?|Всё хорошо, т.е. отлично.|А. С. Пушкин — поэт."},
    {"ru-guillemets", "«Правда?» — спросила она. Он кивнул.",
     "«Правда?»|— спросила она.|Он кивнул."},
    {"fr-guillemets", "Il a dit : « Bonjour. » Puis il est parti. M. Dupont aussi.",
     "Il a dit : « Bonjour. »|Puis il est parti.|M. Dupont aussi."},
    {"hi-danda", "मैं ठीक हूँ। आप कैसे हैं?", "मैं ठीक हूँ।|आप कैसे हैं?"},
    {"ar-question", "كيف حالك؟ أنا بخير.", "كيف حالك؟|أنا بخير."},
    {"el-question", "Τι κάνεις\u037E Καλά.", "Τι κάνεις\u037E|Καλά."},
};

static GPtrArray *
expected_sentences (const char *spec)
{
  GPtrArray *out = g_ptr_array_new_with_free_func (g_free);
  g_auto (GStrv) parts = NULL;

  if (*spec == '\0')
    return out;
  parts = g_strsplit (spec, "|", -1);
  for (guint i = 0; parts[i]; i++)
    g_ptr_array_add (out, g_strdup (parts[i]));
  return out;
}

static void
take_all (GPtrArray *into, GPtrArray *from)
{
  g_assert_nonnull (from);
  for (guint i = 0; i < from->len; i++)
    g_ptr_array_add (into, g_steal_pointer (&from->pdata[i]));
  g_ptr_array_unref (from);
}

/* Feeds `text` in pieces of the given byte lengths (cycled; cut at character boundaries), then
 * flushes. */
static GPtrArray *
split_in_pieces (const char *text, const guint *lengths, guint n_lengths, guint max_chars)
{
  g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (max_chars);
  GPtrArray *out = g_ptr_array_new_with_free_func (g_free);
  const char *p = text, *end = text + strlen (text);
  guint i = 0;

  while (p < end)
    {
      const char *q = p;
      g_autoptr (GError) error = NULL;
      for (guint n = 0; n < MAX (lengths[i % n_lengths], 1) && q < end; n++)
        q = g_utf8_next_char (q);
      take_all (out, gepard_sentence_splitter_push (splitter, p, q - p, &error));
      g_assert_no_error (error);
      p = q;
      i++;
    }
  take_all (out, gepard_sentence_splitter_flush (splitter));
  g_assert_true (gepard_sentence_splitter_is_empty (splitter));
  return out;
}

static void
assert_sentences (const char *what, GPtrArray *got, GPtrArray *want)
{
  gboolean same = got->len == want->len;
  for (guint i = 0; same && i < got->len; i++)
    same = g_strcmp0 (got->pdata[i], want->pdata[i]) == 0;
  if (!same)
    {
      GString *msg = g_string_new (NULL);
      g_string_append_printf (msg, "%s: got %u sentences:", what, got->len);
      for (guint i = 0; i < got->len; i++)
        g_string_append_printf (msg, " [%s]", (char *)got->pdata[i]);
      g_string_append_printf (msg, "; expected %u:", want->len);
      for (guint i = 0; i < want->len; i++)
        g_string_append_printf (msg, " [%s]", (char *)want->pdata[i]);
      g_test_fail_printf ("%s", msg->str);
      g_string_free (msg, TRUE);
    }
}

/* Every case, fed at once, character by character, and in uneven pieces. */
static void
test_split_table (gconstpointer data)
{
  const SplitCase *c = data;
  g_autoptr (GPtrArray) want = expected_sentences (c->sentences);
  static const guint whole[] = {G_MAXUINT};
  static const guint one[] = {1};
  static const guint uneven[] = {3, 1, 7, 2, 11, 5};
  g_autoptr (GPtrArray) at_once = split_in_pieces (c->text, whole, 1, 400);
  g_autoptr (GPtrArray) by_char = split_in_pieces (c->text, one, 1, 400);
  g_autoptr (GPtrArray) in_pieces = split_in_pieces (c->text, uneven, G_N_ELEMENTS (uneven), 400);
  g_auto (GStrv) split = gepard_sentences_split (c->text, -1, 400, NULL);

  assert_sentences ("at once", at_once, want);
  assert_sentences ("char by char", by_char, want);
  assert_sentences ("uneven pieces", in_pieces, want);
  g_assert_nonnull (split);
  g_assert_cmpuint (g_strv_length (split), ==, want->len);
  for (guint i = 0; i < want->len; i++)
    g_assert_cmpstr (split[i], ==, want->pdata[i]);
}

/* A sentence is returned as soon as what follows it proves it ended, not at the flush. */
static void
test_streaming (void)
{
  g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (400);
  g_autoptr (GError) error = NULL;
  GPtrArray *out;

  /* a dot needs the next word: "Mr." or "etc." would look the same so far */
  out = gepard_sentence_splitter_push (splitter, "Hello there.", -1, &error);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
  out = gepard_sentence_splitter_push (splitter, " ", -1, &error);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
  out = gepard_sentence_splitter_push (splitter, "H", -1, &error);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "Hello there.");
  g_ptr_array_unref (out);

  /* ! and ? only need the whitespace after them */
  out = gepard_sentence_splitter_push (splitter, "ow are you? ", -1, &error);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "How are you?");
  g_ptr_array_unref (out);

  /* 。 needs one more character: it could be a closing quote */
  out = gepard_sentence_splitter_push (splitter, "你好。", -1, &error);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
  out = gepard_sentence_splitter_push (splitter, "我", -1, &error);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "你好。");
  g_ptr_array_unref (out);
  g_assert_false (gepard_sentence_splitter_is_empty (splitter));
  g_assert_no_error (error);
}

/* flush returns what is buffered now, even unfinished, and the next text starts afresh. */
static void
test_flush (void)
{
  g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (400);
  GPtrArray *out;

  out = gepard_sentence_splitter_push (splitter, "Hello wor", -1, NULL);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "Hello wor");
  g_ptr_array_unref (out);
  g_assert_true (gepard_sentence_splitter_is_empty (splitter));

  out = gepard_sentence_splitter_push (splitter, "ld. Bye", -1, NULL);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "ld.");
  g_ptr_array_unref (out);
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "Bye");
  g_ptr_array_unref (out);

  /* a pending decision is taken as a boundary at the flush */
  out = gepard_sentence_splitter_push (splitter, "Wait. ", -1, NULL);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 1);
  g_assert_cmpstr (out->pdata[0], ==, "Wait.");
  g_ptr_array_unref (out);

  /* flushing nothing, or only whitespace, gives nothing */
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
  g_ptr_array_unref (gepard_sentence_splitter_push (splitter, " \n\t ", -1, NULL));
  g_assert_true (gepard_sentence_splitter_is_empty (splitter));
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);

  /* reset drops what is buffered */
  g_ptr_array_unref (gepard_sentence_splitter_push (splitter, "Gone", -1, NULL));
  gepard_sentence_splitter_reset (splitter);
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 0);
  g_ptr_array_unref (out);
}

static void
assert_invariant_to_pieces (const char *text, guint max_chars, GPtrArray *at_once)
{
  static const guint one[] = {1};
  static const guint uneven[] = {5, 1, 2, 13, 3};
  g_autoptr (GPtrArray) by_char = split_in_pieces (text, one, 1, max_chars);
  g_autoptr (GPtrArray) in_pieces
      = split_in_pieces (text, uneven, G_N_ELEMENTS (uneven), max_chars);
  assert_sentences ("char by char", by_char, at_once);
  assert_sentences ("uneven pieces", in_pieces, at_once);
}

/* Text without terminators is cut after max_chars characters: at a comma, else a space, else
 * anywhere but inside a character's combining marks. */
static void
test_length_cut (void)
{
  static const guint whole[] = {G_MAXUINT};
  GString *words = g_string_new (NULL);
  GString *joined = g_string_new (NULL);
  GString *han = g_string_new (NULL);
  GString *accents = g_string_new (NULL);
  g_autoptr (GPtrArray) out = NULL;

  /* spaces only: every piece ends at a word, pieces rebuild the text */
  for (guint i = 0; i < 60; i++)
    g_string_append_printf (words, "%sword%u", i ? " " : "", i);
  out = split_in_pieces (words->str, whole, 1, 40);
  g_assert_cmpuint (out->len, >, 1);
  for (guint i = 0; i < out->len; i++)
    {
      const char *s = out->pdata[i];
      g_assert_cmpuint (g_utf8_strlen (s, -1), <=, 40);
      g_assert_true (g_str_has_prefix (s, "word"));
      g_string_append_printf (joined, "%s%s", i ? " " : "", s);
    }
  g_assert_cmpstr (joined->str, ==, words->str);
  assert_invariant_to_pieces (words->str, 40, out);
  g_clear_pointer (&out, g_ptr_array_unref);

  /* a comma is preferred to a later space */
  out = split_in_pieces ("aaa bbb ccc ddd, eee fff ggg hhh iii jjj kkk lll mmm", whole, 1, 40);
  g_assert_cmpuint (out->len, ==, 2);
  g_assert_cmpstr (out->pdata[0], ==, "aaa bbb ccc ddd,");
  g_assert_cmpstr (out->pdata[1], ==, "eee fff ggg hhh iii jjj kkk lll mmm");
  g_clear_pointer (&out, g_ptr_array_unref);

  /* no space at all (Chinese without punctuation): cut after exactly max_chars characters */
  for (guint i = 0; i < 100; i++)
    g_string_append (han, "字");
  out = split_in_pieces (han->str, whole, 1, 30);
  g_assert_cmpuint (out->len, ==, 4);
  for (guint i = 0; i < 3; i++)
    g_assert_cmpuint (g_utf8_strlen (out->pdata[i], -1), ==, 30);
  g_assert_cmpuint (g_utf8_strlen (out->pdata[3], -1), ==, 10);
  assert_invariant_to_pieces (han->str, 30, out);
  g_clear_pointer (&out, g_ptr_array_unref);

  /* e + U+0301 pairs: an odd cut length would split a pair; the cut moves back instead */
  for (guint i = 0; i < 50; i++)
    g_string_append (accents, "e\xCC\x81");
  out = split_in_pieces (accents->str, whole, 1, 31);
  g_assert_cmpuint (out->len, >, 1);
  for (guint i = 0; i < out->len; i++)
    {
      const char *s = out->pdata[i];
      g_assert_cmpint (s[0], ==, 'e');
      g_assert_cmpuint (g_utf8_strlen (s, -1) % 2, ==, 0);
      g_assert_cmpuint (g_utf8_strlen (s, -1), <=, 31);
    }
  assert_invariant_to_pieces (accents->str, 31, out);
  g_clear_pointer (&out, g_ptr_array_unref);

  /* the cut length is clamped */
  {
    g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (1);
    g_assert_cmpuint (gepard_sentence_splitter_get_max_chars (splitter), ==,
                      GEPARD_SENTENCES_MIN_MAX_CHARS);
    gepard_sentence_splitter_set_max_chars (splitter, 1000);
    g_assert_cmpuint (gepard_sentence_splitter_get_max_chars (splitter), ==, 1000);
  }

  g_string_free (words, TRUE);
  g_string_free (joined, TRUE);
  g_string_free (han, TRUE);
  g_string_free (accents, TRUE);
}

/* A runaway input (an LLM repeating itself without a terminator, or a flood of "!" or spaces)
 * keeps producing sentences while it streams: nothing waits for the flush. */
static void
test_runaway (void)
{
  g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (400);
  guint n_sentences = 0;
  /* words; one endless word; a flood of "!" (unspoken, dropped); floods of whitespace */
  const char *pieces[] = {"la ", "ha!", "!", " ", "\n"};

  for (guint p = 0; p < G_N_ELEMENTS (pieces); p++)
    {
      guint before = n_sentences;
      for (guint i = 0; i < 5000; i++)
        {
          g_autoptr (GPtrArray) out = gepard_sentence_splitter_push (splitter, pieces[p], -1, NULL);
          n_sentences += out->len;
          for (guint j = 0; j < out->len; j++)
            g_assert_cmpuint (g_utf8_strlen (out->pdata[j], -1), <=, 400);
        }
      if (p < 2)
        g_assert_cmpuint (n_sentences - before, >=, 5);
    }
  {
    g_autoptr (GPtrArray) out = gepard_sentence_splitter_push (splitter, "End.", -1, NULL);
    g_autoptr (GPtrArray) rest = gepard_sentence_splitter_flush (splitter);
    g_assert_cmpuint (out->len, ==, 0);
    g_assert_cmpuint (rest->len, ==, 1);
    g_assert_cmpstr (rest->pdata[0], ==, "End.");
  }
}

static void
test_invalid_utf8 (void)
{
  g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (400);
  g_autoptr (GError) error = NULL;
  g_autoptr (GPtrArray) out = NULL;
  g_auto (GStrv) split = NULL;

  g_assert_null (gepard_sentence_splitter_push (splitter, "Good. Bad \xC3\x28 text.", -1, &error));
  g_assert_error (error, GEPARD_SENTENCES_ERROR, GEPARD_SENTENCES_ERROR_INVALID_UTF8);
  g_assert_nonnull (strstr (error->message, "byte offset 10"));
  g_clear_error (&error);

  /* a NUL byte inside the given length is no text either */
  g_assert_null (gepard_sentence_splitter_push (splitter, "ab\0cd", 5, &error));
  g_assert_error (error, GEPARD_SENTENCES_ERROR, GEPARD_SENTENCES_ERROR_INVALID_UTF8);
  g_assert_nonnull (strstr (error->message, "byte offset 2"));
  g_clear_error (&error);

  /* nothing of the invalid text was kept */
  out = gepard_sentence_splitter_flush (splitter);
  g_assert_cmpuint (out->len, ==, 0);

  split = gepard_sentences_split ("\xFF", -1, 400, &error);
  g_assert_null (split);
  g_assert_error (error, GEPARD_SENTENCES_ERROR, GEPARD_SENTENCES_ERROR_INVALID_UTF8);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);

  for (guint i = 0; i < G_N_ELEMENTS (split_cases); i++)
    {
      g_autofree char *path = g_strdup_printf ("/sentences/split/%s", split_cases[i].name);
      g_test_add_data_func (path, &split_cases[i], test_split_table);
    }
  g_test_add_func ("/sentences/streaming", test_streaming);
  g_test_add_func ("/sentences/flush", test_flush);
  g_test_add_func ("/sentences/length-cut", test_length_cut);
  g_test_add_func ("/sentences/runaway", test_runaway);
  g_test_add_func ("/sentences/invalid-utf8", test_invalid_utf8);
  return g_test_run ();
}
