/* gepard-sentences.h: splitting a turn of text into sentences, incrementally, for any script.
 *
 * Text may arrive in arbitrary pieces (word by word, mid-sentence, as an LLM streams it). A
 * sentence is returned as soon as enough text has arrived to be sure it ends there, and the
 * sentences do not depend on how the text was cut into pieces: feeding character by character
 * gives the same sentences as feeding everything at once.
 *
 * A sentence ends
 *  - after . ! ? … and their relatives (‼ ⁇ ؟ ۔ । ॥ ։, the Greek question mark) when
 *    whitespace follows, or when ! or ? are followed directly by Chinese or Japanese text;
 *  - after the full-width and CJK terminators 。！？｡．። even when no space follows;
 *  - at a paragraph break (a blank line, or U+2029);
 *  - and the quotes, brackets and emphasis marks that close right after the terminator stay
 *    with it ("Really?" she asked → «"Really?"» and «she asked»).
 * It does not end
 *  - inside numbers, versions, URLs and e-mail addresses (3.14, 1,000.5, example.com), as no
 *    whitespace follows the dot;
 *  - after abbreviations that never end a sentence (Mr. Dr. St. Prof. Jr. No. e.g. i.e. vs.,
 *    z.B. d.h. Nr., т.е., …) or after a single capital initial (J. R. R. Tolkien);
 *  - after a dot or an ellipsis followed by a lowercase word ("I was... thinking", "etc. and"),
 *    so abbreviations that may end a sentence (etc. Inc. Ltd. usw.) end one only before a
 *    capitalised word; nor after ! or ? closed by a bracket before a lowercase word
 *    ("He said (really!) that");
 *  - after a list number at the start of a sentence ("1. Buy milk") or a German ordinal before
 *    a month or a similar noun ("am 3. Oktober", "im 19. Jahrhundert").
 * A sentence that grows past `max_chars` characters without ending is cut at the last comma
 * (or semicolon, colon, dash) of its first `max_chars` characters, else at the last space, else
 * after `max_chars` characters, never between a character and its combining marks, so that a
 * runaway input cannot stall the pipeline.
 *
 * Returned sentences are trimmed, every run of whitespace inside them is one space, and
 * sentences with nothing to speak (only punctuation and whitespace) are dropped. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Errors from the sentence splitter. */
#define GEPARD_SENTENCES_ERROR (gepard_sentences_error_quark ())
GQuark gepard_sentences_error_quark (void);

typedef enum
{
  GEPARD_SENTENCES_ERROR_INVALID_UTF8, /* the text is not UTF-8 (or holds a NUL byte) */
} GepardSentencesError;

/* A sentence longer than this many characters is cut. */
#define GEPARD_SENTENCES_DEFAULT_MAX_CHARS 400
/* The smallest cut length: shorter would chop words. */
#define GEPARD_SENTENCES_MIN_MAX_CHARS 16

typedef struct _GepardSentenceSplitter GepardSentenceSplitter;

/* `max_chars`: see above; clamped to at least GEPARD_SENTENCES_MIN_MAX_CHARS. */
GepardSentenceSplitter *gepard_sentence_splitter_new (guint max_chars);
void gepard_sentence_splitter_free (GepardSentenceSplitter *splitter);

/* Changes the cut length for the text that follows. */
void gepard_sentence_splitter_set_max_chars (GepardSentenceSplitter *splitter, guint max_chars);
guint gepard_sentence_splitter_get_max_chars (const GepardSentenceSplitter *splitter);

/* Appends `text` (`length` bytes, or -1 when NUL-terminated; whole UTF-8 characters) to the
 * current turn. Returns the sentences it completed, in order (a GPtrArray of UTF-8 strings that
 * frees them, possibly empty), or NULL with GEPARD_SENTENCES_ERROR_INVALID_UTF8 naming the byte
 * offset in `text`; invalid text is not appended. */
GPtrArray *gepard_sentence_splitter_push (GepardSentenceSplitter *splitter, const char *text,
                                          gssize length, GError **error);

/* Ends the current turn: returns the sentences of everything still buffered, the last one
 * possibly unfinished (usually zero or one sentence). The splitter is then empty. */
GPtrArray *gepard_sentence_splitter_flush (GepardSentenceSplitter *splitter);

/* Drops everything buffered. */
void gepard_sentence_splitter_reset (GepardSentenceSplitter *splitter);

/* TRUE when nothing but whitespace is buffered. */
gboolean gepard_sentence_splitter_is_empty (const GepardSentenceSplitter *splitter);

/* All the sentences of a whole text, as a NULL-terminated array, or NULL with an error when it
 * is not UTF-8. */
char **gepard_sentences_split (const char *text, gssize length, guint max_chars, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardSentenceSplitter, gepard_sentence_splitter_free)

G_END_DECLS
