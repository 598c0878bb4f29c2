/* gepard-tokenizer.h: Hugging Face tokenizer.json, byte-level BPE as Qwen3.5 uses it
 * (gepard-model.md §4): added tokens matched in the raw text first, then the NFC normalizer, the
 * Split pre-tokenizer regex (isolated), the ByteLevel alphabet, rank-ordered BPE merges. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct _GepardTokenizer GepardTokenizer;

GepardTokenizer *gepard_tokenizer_new_from_file (const char *path, GError **error);
GepardTokenizer *gepard_tokenizer_new_from_data (const char *json, gssize length, GError **error);
void gepard_tokenizer_free (GepardTokenizer *tokenizer);

/* Token ids of `text` (`length` bytes, or -1 when NUL-terminated), without any special tokens
 * added, as `tokenizers`' encode(text, add_special_tokens=False). Invalid UTF-8 is first replaced
 * by U+FFFD per maximal subpart, as Python's bytes.decode("utf-8", "replace") does.
 * Thread-safe. Returns a GArray of gint32. */
GArray *gepard_tokenizer_encode (const GepardTokenizer *tokenizer, const char *text, gssize length,
                                 GError **error);

/* UTF-8 text of `ids` (ByteLevel decoding; added tokens as their content). Invalid UTF-8 that the
 * ids spell is replaced by U+FFFD. Unknown ids are skipped. */
char *gepard_tokenizer_decode (const GepardTokenizer *tokenizer, const gint32 *ids, gsize n_ids);
/* The same, with the length in `out_length` (may be NULL): ids may spell NUL bytes. */
char *gepard_tokenizer_decode_len (const GepardTokenizer *tokenizer, const gint32 *ids, gsize n_ids,
                                   gsize *out_length);

/* -1 when the token (vocabulary or added) does not exist */
gint32 gepard_tokenizer_token_to_id (const GepardTokenizer *tokenizer, const char *token);
/* NULL when no token has this id */
const char *gepard_tokenizer_id_to_token (const GepardTokenizer *tokenizer, gint32 id);
/* highest id + 1, over the vocabulary and the added tokens */
guint gepard_tokenizer_get_n_ids (const GepardTokenizer *tokenizer);

/* `text` (`length` bytes, or -1 when NUL-terminated) with every invalid UTF-8 sequence replaced by
 * U+FFFD per maximal subpart, exactly as Python's bytes.decode("utf-8", "replace"). NUL bytes are
 * kept, so the result's length is stored in `out_length` (may be NULL); the result is also
 * NUL-terminated. */
char *gepard_tokenizer_replace_invalid_utf8 (const char *text, gssize length, gsize *out_length);

/* What the tokenizer's normalizer makes of `text` (invalid UTF-8 replaced first, as in encode):
 * NFC as the reference implementation computes it, or the text unchanged when the tokenizer has
 * no normalizer. Length in `out_length` (may be NULL), since NUL bytes are kept. */
char *gepard_tokenizer_normalize (const GepardTokenizer *tokenizer, const char *text, gssize length,
                                  gsize *out_length);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardTokenizer, gepard_tokenizer_free)

G_END_DECLS
