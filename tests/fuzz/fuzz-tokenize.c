/* fuzz-tokenize.c: the project's tokenizer (models/tokenizer.json) on arbitrary bytes, as the
 * server hands it transcripts: invalid UTF-8, NUL bytes, lone combining marks, text that looks like
 * an added token. Every byte has a token there, so encoding must succeed; the ids must exist, and
 * decoding them must give back what the normalizer made of the text. */
#include "fuzz-common.h"
#include "gepard-tokenizer.h"

#include <string.h>

static GepardTokenizer *tokenizer;

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  const char *path = g_getenv ("GEPARD_FUZZ_TOKENIZER");
  g_autoptr (GError) error = NULL;

  fuzz_init_logging ();
  if (path == NULL)
    path = GEPARD_FUZZ_DEFAULT_TOKENIZER;
  tokenizer = gepard_tokenizer_new_from_file (path, &error);
  if (tokenizer == NULL)
    {
      fprintf (stderr, "%s\n", error->message);
      exit (1);
    }
  return 0;
}

/* TRUE when `text` holds '<', with which every added token of the project's tokenizer starts:
 * added tokens are matched before normalization, so around them decode(encode(text)) may differ
 * from normalize(text) by where NFC could compose across the token. */
static gboolean
may_hold_added_token (const uint8_t *data, size_t size)
{
  return memchr (data, '<', size) != NULL;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const char *text = (const char *)data;
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) ids = gepard_tokenizer_encode (tokenizer, text, (gssize)size, &error);
  g_autofree char *replaced = NULL, *normalized = NULL, *decoded = NULL;
  gsize replaced_len, normalized_len, decoded_len;
  guint n_ids = gepard_tokenizer_get_n_ids (tokenizer);

  g_assert_no_error (error);
  g_assert_nonnull (ids);

  replaced = gepard_tokenizer_replace_invalid_utf8 (text, (gssize)size, &replaced_len);
  g_assert_true (fuzz_utf8_valid (replaced, replaced_len));
  g_assert_cmpint (replaced[replaced_len], ==, '\0');
  if (fuzz_utf8_valid (text, size))
    g_assert_true (replaced_len == size && memcmp (replaced, text, size) == 0);

  normalized = gepard_tokenizer_normalize (tokenizer, text, (gssize)size, &normalized_len);
  g_assert_true (fuzz_utf8_valid (normalized, normalized_len));

  for (guint i = 0; i < ids->len; i++)
    {
      gint32 id = g_array_index (ids, gint32, i);

      g_assert_cmpint (id, >=, 0);
      g_assert_cmpuint ((guint)id, <, n_ids);
    }
  decoded
      = gepard_tokenizer_decode_len (tokenizer, (const gint32 *)ids->data, ids->len, &decoded_len);
  g_assert_true (fuzz_utf8_valid (decoded, decoded_len));
  if (!may_hold_added_token (data, size)
      && (decoded_len != normalized_len || memcmp (decoded, normalized, decoded_len) != 0))
    {
      fprintf (stderr, "decode(encode(text)) differs from normalize(text)\n");
      abort ();
    }
  return 0;
}
