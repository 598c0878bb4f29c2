/* gepard-sentences.c: the incremental sentence splitter (see gepard-sentences.h).
 *
 * The splitter keeps the unfinished part of the turn in one buffer and scans it left to right.
 * At each terminator it decides, from the text around it, whether the sentence ends there. A
 * decision that needs text which has not arrived yet is put off until it has (or until the turn
 * ends): that, and looking at most LOOKAHEAD_MAX characters ahead, is what makes the sentences
 * independent of how the text was cut into pieces. */
#include "gepard-sentences.h"

#include <string.h>

/* How far past a terminator the splitter looks (terminators, closing quotes, whitespace and the
 * next word together). A longer run is decided as if it ended there, so a pathological input
 * (ten thousand "!" or spaces) cannot keep a decision pending forever. */
#define LOOKAHEAD_MAX 64

G_DEFINE_QUARK (gepard - sentences - error - quark, gepard_sentences_error)

struct _GepardSentenceSplitter
{
  GString *text;    /* the turn's text; bytes before `start` are already returned */
  gsize start;      /* byte offset where the current sentence begins */
  gsize scan;       /* byte offset up to which no sentence ends: [start, scan) is decided */
  guint scan_chars; /* characters in [start, scan) */
  guint max_chars;
};

typedef enum
{
  SCAN_CONTINUE, /* no sentence ends here: go on */
  SCAN_WAIT,     /* the answer depends on text that has not arrived yet */
  SCAN_BOUNDARY, /* the sentence ends here */
} ScanVerdict;

typedef enum
{
  TERM_NONE,
  TERM_PERIOD,   /* . : numbers, abbreviations and URLs use it too */
  TERM_ELLIPSIS, /* … */
  TERM_STRONG,   /* ! ? and other terminators that need whitespace after them */
  TERM_WIDE,     /* CJK and full-width terminators: no space follows them in those scripts */
} TermKind;

static TermKind
term_kind (gunichar c)
{
  switch (c)
    {
    case '.':
      return TERM_PERIOD;
    case 0x2026: /* … */
      return TERM_ELLIPSIS;
    case '!':
    case '?':
    case 0x037E: /* Greek question mark */
    case 0x0589: /* Armenian full stop */
    case 0x061F: /* Arabic question mark */
    case 0x06D4: /* Arabic full stop */
    case 0x0964: /* Devanagari danda */
    case 0x0965: /* Devanagari double danda */
    case 0x203C: /* ‼ */
    case 0x2047: /* ⁇ */
    case 0x2048: /* ⁈ */
    case 0x2049: /* ⁉ */
      return TERM_STRONG;
    case 0x1362: /* Ethiopic full stop: Ethiopic separates words without spaces */
    case 0x3002: /* 。 */
    case 0xFF01: /* ！ */
    case 0xFF0E: /* ． */
    case 0xFF1F: /* ？ */
    case 0xFF61: /* ｡ */
      return TERM_WIDE;
    default:
      return TERM_NONE;
    }
}

/* Marks that only ever close: right after a terminator they belong to its sentence. */
static gboolean
is_closer (gunichar c)
{
  switch (c)
    {
    case ')':
    case ']':
    case '}':
    case 0x2019: /* ’ */
    case 0x201D: /* ” */
    case 0x3009: /* 〉 */
    case 0x300B: /* 》 */
    case 0x300D: /* 」 */
    case 0x300F: /* 』 */
    case 0x3011: /* 】 */
    case 0x3015: /* 〕 */
    case 0x3017: /* 〗 */
    case 0x3019: /* 〙 */
    case 0x301B: /* 〛 */
    case 0xFF09: /* ） */
    case 0xFF3D: /* ］ */
    case 0xFF5D: /* ｝ */
    case 0xFF63: /* ｣ */
      return TRUE;
    default:
      return FALSE;
    }
}

/* Marks that open in one language and close in another (“ closes German „…“, » opens Danish
 * »…«), or open and close alike ("): after a terminator they close its sentence unless a letter
 * or digit follows them directly. */
static gboolean
is_ambiguous_quote (gunichar c)
{
  switch (c)
    {
    case '"':
    case '\'':
    case '*': /* Markdown emphasis, as LLMs write it: **Done.** */
    case '_':
    case 0x00AB: /* « */
    case 0x00BB: /* » */
    case 0x2018: /* ‘ */
    case 0x201C: /* “ */
    case 0x2039: /* ‹ */
    case 0x203A: /* › */
    case 0xFF02: /* ＂ */
    case 0xFF07: /* ＇ */
      return TRUE;
    default:
      return FALSE;
    }
}

static gboolean
is_line_break (gunichar c)
{
  return c == '\n' || c == '\v' || c == '\f' || c == 0x85 || c == 0x2028 || c == 0x2029;
}

/* Chinese and Japanese, whose sentences follow each other without a space. */
static gboolean
is_cjk (gunichar c)
{
  GUnicodeScript script = g_unichar_get_script (c);
  return script == G_UNICODE_SCRIPT_HAN || script == G_UNICODE_SCRIPT_HIRAGANA
         || script == G_UNICODE_SCRIPT_KATAKANA || script == G_UNICODE_SCRIPT_BOPOMOFO;
}

/* Whether a character gives the speech something to say: letters, marks, numbers and symbols
 * (emoji, currency) do; punctuation, whitespace and invisible format characters do not. */
static gboolean
is_spoken (gunichar c)
{
  switch (g_unichar_type (c))
    {
    case G_UNICODE_CONTROL:
    case G_UNICODE_FORMAT:
    case G_UNICODE_UNASSIGNED:
    case G_UNICODE_PRIVATE_USE:
    case G_UNICODE_SURROGATE:
    case G_UNICODE_CONNECT_PUNCTUATION:
    case G_UNICODE_DASH_PUNCTUATION:
    case G_UNICODE_CLOSE_PUNCTUATION:
    case G_UNICODE_FINAL_PUNCTUATION:
    case G_UNICODE_INITIAL_PUNCTUATION:
    case G_UNICODE_OTHER_PUNCTUATION:
    case G_UNICODE_OPEN_PUNCTUATION:
    case G_UNICODE_LINE_SEPARATOR:
    case G_UNICODE_PARAGRAPH_SEPARATOR:
    case G_UNICODE_SPACE_SEPARATOR:
      return FALSE;
    default:
      return TRUE;
    }
}

/* Abbreviations that are never the last word of a sentence, as written before their final dot
 * (case matters: "No. 5" but "I said no."). Abbreviations that may end a sentence (etc, Inc,
 * Ltd, usw) are not listed: the case of the next word decides for them. */
static const char *const never_final_abbreviations[] = {
    /* English titles and references */
    "Mr", "Mrs", "Ms", "Mx", "Dr", "Prof", "St", "Mt", "Ft", "Jr", "Sr", "Rev", "Hon", "Gen", "Col",
    "Lt", "Sgt", "Capt", "Cmdr", "Gov", "Sen", "Rep", "Pres", "No", "Nos", "Vol", "Fig", "Figs",
    "Eq", "Ref", "p", "pp", "vs", "Vs", "cf", "Cf", "ca", "Ca", "approx", "Approx", "e.g", "E.g",
    "i.e", "I.e",
    /* Spanish and French */
    "Sra", "Srta", "Dra", "Mme", "Mlle", "Mgr",
    /* German */
    "Hr", "Hrn", "Fr", "Nr", "z.B", "Z.B", "d.h", "D.h", "u.a", "U.a", "bzw", "Bzw", "vgl", "Vgl",
    "evtl", "Evtl", "ggf", "Ggf", "inkl", "Inkl", "sog", "Abs", "Bd", "Jh", "Mio", "Mrd", "Tsd",
    /* Russian */
    "т.е", "Т.е", "т.к", "Т.к", "т.н", "им", "ул", "проф", "акад", "тыс", "млн", "млрд", "рис",
    "стр", "гл", "см"};

/* German nouns that follow an ordinal number ("am 3. Oktober"): the dot there ends no
 * sentence even though a capitalised word follows. */
static const char *const german_ordinal_nouns[]
    = {"Januar",     "Jänner",      "Februar",      "März",        "April",   "Mai",
       "Juni",       "Juli",        "August",       "September",   "Oktober", "November",
       "Dezember",   "Jahrhundert", "Jahrhunderts", "Jahrtausend", "Mal",     "Platz",
       "Klasse",     "Stock",       "Liga",         "Bundesliga",  "Auflage", "Kapitel",
       "Geburtstag", "Jahrestag",   "Todestag",     "Weltkrieg",   "Advent"};

static gboolean
in_list (const char *const *list, gsize n, const char *word, gsize length)
{
  for (gsize i = 0; i < n; i++)
    if (strlen (list[i]) == length && memcmp (list[i], word, length) == 0)
      return TRUE;
  return FALSE;
}

/* The character at byte offset `pos`; FALSE at the end of the buffered text. */
static gboolean
peek (const GepardSentenceSplitter *self, gsize pos, gunichar *c)
{
  if (pos >= self->text->len)
    return FALSE;
  *c = g_utf8_get_char (self->text->str + pos);
  return TRUE;
}

static gsize
step (const GepardSentenceSplitter *self, gsize pos)
{
  return g_utf8_next_char (self->text->str + pos) - self->text->str;
}

static gsize
step_back (const GepardSentenceSplitter *self, gsize pos)
{
  return g_utf8_prev_char (self->text->str + pos) - self->text->str;
}

/* The word right before byte offset `end` in the current sentence: letters (with marks) and the
 * dots between them ("e.g", "U.S"), or a run of digits. Returns its byte offset; `*is_number`
 * says which kind it is. An empty word has offset `end`. */
static gsize
word_before (const GepardSentenceSplitter *self, gsize end, gboolean *is_number)
{
  gsize begin = end;
  gunichar c;

  *is_number = FALSE;
  if (end == self->start)
    return end;
  c = g_utf8_get_char (self->text->str + step_back (self, end));
  if (g_unichar_isdigit (c))
    {
      while (begin > self->start)
        {
          gsize prev = step_back (self, begin);
          if (!g_unichar_isdigit (g_utf8_get_char (self->text->str + prev)))
            break;
          begin = prev;
        }
      *is_number = TRUE;
      return begin;
    }
  while (begin > self->start)
    {
      gsize prev = step_back (self, begin);
      c = g_utf8_get_char (self->text->str + prev);
      if (!g_unichar_isalpha (c) && !g_unichar_ismark (c) && c != '.')
        break;
      begin = prev;
    }
  /* a dot only joins letters: ".NET." is the word "NET" */
  while (begin < end && self->text->str[begin] == '.')
    begin++;
  return begin;
}

/* "J", "R" or dotted capitals like "U.S": initials, which a capitalised name follows. The lone
 * pronoun "I" is not one ("So did I. Then…"). */
static gboolean
is_initials (const char *word, gsize length)
{
  const char *p = word, *end = word + length;
  guint letters = 0;

  while (p < end)
    {
      gunichar c = g_utf8_get_char (p);
      p = g_utf8_next_char (p);
      if (!g_unichar_isupper (c) && !g_unichar_istitle (c))
        return FALSE;
      letters++;
      if (p < end && *p != '.')
        return FALSE; /* two letters in a row: a word, not an initial */
      if (p < end)
        p++;
    }
  return letters > 1 || (letters == 1 && !(length == 1 && word[0] == 'I'));
}

/* Whether the sentence so far holds a « with no » after it (French and Russian quotes), so that
 * a » after a space still closes it: « Bonjour. » */
static gboolean
has_open_guillemet (const GepardSentenceSplitter *self, gsize end)
{
  gint depth = 0;
  for (const char *p = self->text->str + self->start; p < self->text->str + end;
       p = g_utf8_next_char (p))
    {
      gunichar c = g_utf8_get_char (p);
      if (c == 0x00AB || c == 0x2039)
        depth++;
      else if ((c == 0x00BB || c == 0x203A) && depth > 0)
        depth--;
    }
  return depth > 0;
}

/* Decides the terminator at `self->scan`. On SCAN_BOUNDARY `*pos` is where the sentence ends;
 * on SCAN_CONTINUE it is where scanning goes on and `*n_chars` how many characters that skips. */
static ScanVerdict
classify_terminator (const GepardSentenceSplitter *self, gboolean final, gsize *pos, guint *n_chars)
{
  const gsize run_start = self->scan;
  gsize p = run_start, q;
  guint used = 0, n_terms = 0, n_periods = 0;
  gboolean has_wide = FALSE, has_strong = FALSE, only_fullwidth_stops = TRUE;
  gboolean closed_bracket = FALSE, open_guillemet = FALSE, guillemet_checked = FALSE;
  gunichar c, next = 0;

  /* the run of terminators ("?!", "...") and the closing marks attached to it */
  for (;;)
    {
      TermKind kind;

      if (used >= LOOKAHEAD_MAX)
        goto boundary;
      if (!peek (self, p, &c))
        break;
      kind = term_kind (c);
      if (kind != TERM_NONE)
        {
          n_terms++;
          n_periods += kind == TERM_PERIOD;
          has_wide |= kind == TERM_WIDE;
          has_strong |= kind == TERM_STRONG;
          only_fullwidth_stops &= c == 0xFF0E;
          p = step (self, p);
          used++;
          continue;
        }
      if (is_closer (c))
        {
          closed_bracket |= c == ')' || c == ']' || c == '}';
          p = step (self, p);
          used++;
          continue;
        }
      if (is_ambiguous_quote (c))
        {
          gunichar after;
          q = step (self, p);
          if (!peek (self, q, &after))
            {
              if (!final)
                return SCAN_WAIT;
            }
          else if (g_unichar_isalnum (after))
            break; /* it opens what follows: 。“好的” */
          if (c == 0x00BB || c == 0x203A)
            guillemet_checked = TRUE; /* «Правда?» closed its guillemet */
          p = q;
          used++;
          continue;
        }
      if (g_unichar_isspace (c) && !is_line_break (c) && !has_wide)
        {
          /* « Bonjour. » : a closing guillemet after a space, when one is open */
          gunichar after = 0;
          guint u = used;
          if (!guillemet_checked)
            {
              open_guillemet = has_open_guillemet (self, run_start);
              guillemet_checked = TRUE;
            }
          if (!open_guillemet)
            break;
          q = p;
          while (u < LOOKAHEAD_MAX && peek (self, q, &after) && g_unichar_isspace (after)
                 && !is_line_break (after))
            {
              q = step (self, q);
              u++;
            }
          if (q >= self->text->len && u < LOOKAHEAD_MAX && !final)
            return SCAN_WAIT;
          if (q < self->text->len && u < LOOKAHEAD_MAX && (after == 0x00BB || after == 0x203A))
            {
              p = step (self, q);
              used = u + 1;
              open_guillemet = FALSE;
              continue;
            }
        }
      break;
    }

  if (!peek (self, p, &next))
    {
      if (!final)
        return SCAN_WAIT;
      goto boundary;
    }

  if (has_wide)
    {
      /* ３．１４: a full-width decimal point */
      if (only_fullwidth_stops && n_terms == 1 && g_unichar_isdigit (next))
        goto go_on;
      goto boundary;
    }

  if (!g_unichar_isspace (next))
    {
      /* 好的!我们走: an ASCII ! or ? in Chinese or Japanese text */
      if (has_strong && is_cjk (next))
        goto boundary;
      /* 3.14, example.com, e.g, Yahoo!'s, "Hi."she */
      goto go_on;
    }

  /* "Really?" she asked: a question or an exclamation ends its sentence whatever follows, unless
   * it sits in brackets: "He said (really!) that" */
  if (has_strong && !closed_bracket)
    goto boundary;

  /* A dot or an ellipsis, then whitespace: who writes a single dot right after a word may be
   * abbreviating it. */
  {
    const gboolean single_period = n_terms == 1 && n_periods == 1 && p == step (self, run_start);
    gboolean is_number = FALSE;
    gsize word = single_period ? word_before (self, run_start, &is_number) : run_start;
    const char *w = self->text->str + word;
    const gsize word_len = run_start - word;
    guint newlines = 0;

    if (single_period && word_len > 0 && !is_number
        && (in_list (never_final_abbreviations, G_N_ELEMENTS (never_final_abbreviations), w,
                     word_len)
            || is_initials (w, word_len)))
      goto go_on;

    /* the whitespace; a blank line in it ends the sentence whatever comes next */
    q = p;
    while (peek (self, q, &c) && g_unichar_isspace (c))
      {
        if (is_line_break (c) && (++newlines == 2 || c == 0x2029))
          goto boundary;
        q = step (self, q);
        if (++used >= LOOKAHEAD_MAX)
          goto boundary;
      }
    /* then opening quotes and brackets, up to the first letter or digit */
    while (peek (self, q, &c) && !g_unichar_isalnum (c) && g_unichar_ispunct (c))
      {
        q = step (self, q);
        if (++used >= LOOKAHEAD_MAX)
          goto boundary;
      }
    if (q >= self->text->len)
      {
        if (!final)
          return SCAN_WAIT;
        goto boundary;
      }

    /* "I was... thinking", "etc. and", "approx. five": a lowercase word goes on the sentence */
    if (g_unichar_islower (c))
      goto go_on;

    if (single_period && is_number && word_len <= 3)
      {
        /* "1. Buy milk": a list number opening the sentence */
        if (word == self->start)
          goto go_on;
        /* "am 3. Oktober": a German ordinal before a month or a similar noun */
        if (word_len <= 2)
          {
            gsize noun_end = q;
            while (peek (self, noun_end, &c) && (g_unichar_isalpha (c) || g_unichar_ismark (c)))
              {
                noun_end = step (self, noun_end);
                if (++used >= LOOKAHEAD_MAX)
                  goto boundary;
              }
            if (noun_end >= self->text->len && !final)
              return SCAN_WAIT;
            if (in_list (german_ordinal_nouns, G_N_ELEMENTS (german_ordinal_nouns),
                         self->text->str + q, noun_end - q))
              goto go_on;
          }
      }
  }

boundary:
  *pos = p;
  *n_chars = 0;
  return SCAN_BOUNDARY;

go_on:
  *pos = p;
  *n_chars = g_utf8_strlen (self->text->str + run_start, p - run_start);
  return SCAN_CONTINUE;
}

/* Decides the line break at `self->scan`: a blank line (two line breaks with only whitespace
 * between them) or U+2029 is a paragraph break and ends the sentence; a single line break is
 * whitespace, since hard-wrapped text breaks lines inside sentences. */
static ScanVerdict
classify_line_break (const GepardSentenceSplitter *self, gboolean final, gsize *pos, guint *n_chars)
{
  gsize q;
  guint used = 1;
  gunichar c;

  if (g_utf8_get_char (self->text->str + self->scan) == 0x2029)
    goto boundary;
  q = step (self, self->scan);
  while (peek (self, q, &c) && g_unichar_isspace (c))
    {
      if (is_line_break (c))
        goto boundary;
      q = step (self, q);
      if (++used >= LOOKAHEAD_MAX)
        break;
    }
  if (q >= self->text->len && used < LOOKAHEAD_MAX && !final)
    return SCAN_WAIT;
  *pos = q;
  *n_chars = used;
  return SCAN_CONTINUE;

boundary:
  *pos = self->scan;
  *n_chars = 0;
  return SCAN_BOUNDARY;
}

static gboolean
is_clause_mark (gunichar c, gboolean *needs_space)
{
  switch (c)
    {
    case ',':
    case ';':
    case ':':
    case 0x060C:           /* Arabic comma */
    case 0x2013:           /* – */
    case 0x2014:           /* — */
      *needs_space = TRUE; /* 1,000 and 12:30 are no clauses */
      return TRUE;
    case 0x3001: /* 、 */
    case 0xFF0C: /* ， */
    case 0xFF1A: /* ： */
    case 0xFF1B: /* ； */
      *needs_space = FALSE;
      return TRUE;
    default:
      return FALSE;
    }
}

/* Where to cut a sentence that reached max_chars characters without ending: after the last
 * clause mark, else before the last space, within its first max_chars characters and past the
 * first quarter of them (so no tiny piece is cut off), else right after max_chars characters,
 * moved back so that combining marks and joined emoji stay whole. */
static gsize
find_cut (const GepardSentenceSplitter *self)
{
  const guint min_chars = self->max_chars / 4;
  gsize p = self->start, clause = 0, space = 0, cut;
  gunichar c, after;

  for (guint i = 0; i < self->max_chars; i++)
    {
      gsize n = step (self, p);
      gboolean needs_space;

      c = g_utf8_get_char (self->text->str + p);
      if (i >= min_chars)
        {
          if (is_clause_mark (c, &needs_space)
              && (!needs_space || (peek (self, n, &after) && g_unichar_isspace (after))))
            clause = n;
          else if (g_unichar_isspace (c))
            space = p;
        }
      p = n;
    }
  if (clause)
    return clause;
  if (space)
    return space;

  cut = p;
  while (cut > self->start && peek (self, cut, &c))
    {
      gsize prev = step_back (self, cut);
      gunichar before = g_utf8_get_char (self->text->str + prev);
      if (!g_unichar_ismark (c) && c != 0x200D && before != 0x200D)
        break;
      cut = prev;
    }
  return cut > self->start ? cut : p;
}

/* Appends the sentence in [from, to) to `out`: trimmed, whitespace runs made one space, and
 * only if it has something to say. */
static void
emit (const GepardSentenceSplitter *self, gsize from, gsize to, GPtrArray *out)
{
  GString *sentence = g_string_sized_new (to - from);
  gboolean space = FALSE, spoken = FALSE;
  const char *end = self->text->str + to;

  for (const char *p = self->text->str + from; p < end; p = g_utf8_next_char (p))
    {
      gunichar c = g_utf8_get_char (p);
      if (g_unichar_isspace (c))
        {
          space = sentence->len > 0;
          continue;
        }
      if (space)
        g_string_append_c (sentence, ' ');
      space = FALSE;
      spoken |= is_spoken (c);
      g_string_append_len (sentence, p, g_utf8_next_char (p) - p);
    }
  if (spoken)
    g_ptr_array_add (out, g_string_free (sentence, FALSE));
  else
    g_string_free (sentence, TRUE);
}

static void
end_sentence (GepardSentenceSplitter *self, gsize end, GPtrArray *out)
{
  emit (self, self->start, end, out);
  self->start = self->scan = end;
  self->scan_chars = 0;
}

/* Scans as far as the buffered text allows; `final`: no more text comes, so the end of the
 * buffer is the end of the turn. */
static void
advance (GepardSentenceSplitter *self, gboolean final, GPtrArray *out)
{
  for (;;)
    {
      ScanVerdict verdict;
      gsize pos = 0;
      guint n_chars = 0;
      gunichar c;

      if (self->scan == self->start)
        {
          /* a sentence never starts with whitespace, and a paragraph break in whitespace
           * between sentences has nothing to end */
          while (peek (self, self->start, &c) && g_unichar_isspace (c))
            self->start = step (self, self->start);
          self->scan = self->start;
        }
      /* max_chars reached with more to come: cut; and a decision that skipped past max_chars
       * (a terminator run) cuts too, so that no sentence is longer than max_chars */
      if (self->scan_chars > self->max_chars
          || (self->scan_chars == self->max_chars && self->scan < self->text->len))
        {
          end_sentence (self, find_cut (self), out);
          continue;
        }
      if (!peek (self, self->scan, &c))
        return;

      if (term_kind (c) != TERM_NONE)
        verdict = classify_terminator (self, final, &pos, &n_chars);
      else if (is_line_break (c))
        verdict = classify_line_break (self, final, &pos, &n_chars);
      else
        {
          verdict = SCAN_CONTINUE;
          pos = step (self, self->scan);
          n_chars = 1;
        }

      switch (verdict)
        {
        case SCAN_WAIT:
          g_assert (!final);
          return;
        case SCAN_CONTINUE:
          self->scan = pos;
          self->scan_chars += n_chars;
          break;
        case SCAN_BOUNDARY:
          if (self->scan_chars + g_utf8_strlen (self->text->str + self->scan, pos - self->scan)
              > self->max_chars)
            end_sentence (self, find_cut (self), out);
          else
            end_sentence (self, pos, out);
          break;
        }
    }
}

GepardSentenceSplitter *
gepard_sentence_splitter_new (guint max_chars)
{
  GepardSentenceSplitter *self = g_new0 (GepardSentenceSplitter, 1);
  self->text = g_string_new (NULL);
  gepard_sentence_splitter_set_max_chars (self, max_chars);
  return self;
}

void
gepard_sentence_splitter_free (GepardSentenceSplitter *splitter)
{
  if (splitter == NULL)
    return;
  g_string_free (splitter->text, TRUE);
  g_free (splitter);
}

void
gepard_sentence_splitter_set_max_chars (GepardSentenceSplitter *splitter, guint max_chars)
{
  g_return_if_fail (splitter != NULL);
  splitter->max_chars = MAX (max_chars, GEPARD_SENTENCES_MIN_MAX_CHARS);
}

guint
gepard_sentence_splitter_get_max_chars (const GepardSentenceSplitter *splitter)
{
  g_return_val_if_fail (splitter != NULL, 0);
  return splitter->max_chars;
}

GPtrArray *
gepard_sentence_splitter_push (GepardSentenceSplitter *splitter, const char *text, gssize length,
                               GError **error)
{
  GPtrArray *sentences;
  const char *invalid;

  g_return_val_if_fail (splitter != NULL, NULL);
  g_return_val_if_fail (text != NULL || length == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (length < 0)
    length = strlen (text);
  if (!g_utf8_validate (text, length, &invalid))
    {
      g_set_error (error, GEPARD_SENTENCES_ERROR, GEPARD_SENTENCES_ERROR_INVALID_UTF8,
                   "invalid UTF-8 at byte offset %" G_GSIZE_FORMAT, (gsize)(invalid - text));
      return NULL;
    }

  /* drop what was returned once it is at least half the buffer: each byte moves O(1) times */
  if (splitter->start > 0 && splitter->start * 2 >= splitter->text->len)
    {
      g_string_erase (splitter->text, 0, splitter->start);
      splitter->scan -= splitter->start;
      splitter->start = 0;
    }
  g_string_append_len (splitter->text, text, length);

  sentences = g_ptr_array_new_with_free_func (g_free);
  advance (splitter, FALSE, sentences);
  return sentences;
}

GPtrArray *
gepard_sentence_splitter_flush (GepardSentenceSplitter *splitter)
{
  GPtrArray *sentences;

  g_return_val_if_fail (splitter != NULL, NULL);

  sentences = g_ptr_array_new_with_free_func (g_free);
  advance (splitter, TRUE, sentences);
  emit (splitter, splitter->start, splitter->text->len, sentences);
  gepard_sentence_splitter_reset (splitter);
  return sentences;
}

void
gepard_sentence_splitter_reset (GepardSentenceSplitter *splitter)
{
  g_return_if_fail (splitter != NULL);
  g_string_truncate (splitter->text, 0);
  splitter->start = splitter->scan = 0;
  splitter->scan_chars = 0;
}

gboolean
gepard_sentence_splitter_is_empty (const GepardSentenceSplitter *splitter)
{
  g_return_val_if_fail (splitter != NULL, TRUE);
  for (const char *p = splitter->text->str + splitter->start; *p; p = g_utf8_next_char (p))
    if (!g_unichar_isspace (g_utf8_get_char (p)))
      return FALSE;
  return TRUE;
}

char **
gepard_sentences_split (const char *text, gssize length, guint max_chars, GError **error)
{
  g_autoptr (GepardSentenceSplitter) splitter = gepard_sentence_splitter_new (max_chars);
  g_autoptr (GPtrArray) sentences = NULL;
  g_autoptr (GPtrArray) rest = NULL;

  sentences = gepard_sentence_splitter_push (splitter, text, length, error);
  if (sentences == NULL)
    return NULL;
  rest = gepard_sentence_splitter_flush (splitter);
  for (guint i = 0; i < rest->len; i++)
    g_ptr_array_add (sentences, g_steal_pointer (&rest->pdata[i]));
  g_ptr_array_add (sentences, NULL);
  g_ptr_array_set_free_func (sentences, NULL);
  return (char **)g_ptr_array_free (g_steal_pointer (&sentences), FALSE);
}
