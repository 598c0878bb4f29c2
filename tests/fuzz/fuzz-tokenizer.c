/* fuzz-tokenizer.c: gepard_tokenizer_new_from_data on arbitrary bytes (tokenizer.json comes with
 * a model, which may come from anywhere). A tokenizer that loads is then used: a few texts are
 * encoded and decoded, and the id tables are walked, so that what loading accepted is also safe to
 * run. */
#include "fuzz-common.h"
#include "gepard-tokenizer.h"

#include <string.h>

/* the id table walk is capped: a loaded vocabulary may declare ids up to 2^24 */
#define MAX_IDS_WALKED 4096

static const char *const texts[] = {
    "Hello, world! It's 2025.",        "  leading spaces\n\nand\r\nnewlines\t",
    "Grüße, naïve café — ½ 東京 🎉",    "<|im_start|>user\nhi<|im_end|>",
    "e\xcc\x81 \xef\xbf\xbd \xff\xfe",
};

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

static void
use_tokenizer (const GepardTokenizer *tokenizer)
{
  guint n_ids = gepard_tokenizer_get_n_ids (tokenizer);

  for (guint i = 0; i < G_N_ELEMENTS (texts); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (GArray) ids = gepard_tokenizer_encode (tokenizer, texts[i], -1, &error);
      g_autofree char *normalized = gepard_tokenizer_normalize (tokenizer, texts[i], -1, NULL);
      g_autofree char *decoded = NULL;
      gsize decoded_len;

      /* a byte missing from a small vocabulary is the one refusal encoding may give */
      fuzz_check_outcome (ids != NULL, error, GEPARD_TOKENIZER_ERROR);
      g_assert_nonnull (normalized);
      if (ids == NULL)
        continue;
      for (guint k = 0; k < ids->len; k++)
        {
          gint32 id = g_array_index (ids, gint32, k);

          g_assert_cmpint (id, >=, 0);
          g_assert_cmpuint ((guint)id, <, n_ids);
          g_assert_nonnull (gepard_tokenizer_id_to_token (tokenizer, id));
        }
      decoded = gepard_tokenizer_decode_len (tokenizer, (const gint32 *)ids->data, ids->len,
                                             &decoded_len);
      g_assert_true (fuzz_utf8_valid (decoded, decoded_len));
    }

  for (guint id = 0; id < MIN (n_ids, MAX_IDS_WALKED); id++)
    {
      const char *token = gepard_tokenizer_id_to_token (tokenizer, (gint32)id);
      gint32 ids[] = {(gint32)id, -1, (gint32)n_ids};
      g_autofree char *decoded = NULL;
      gsize decoded_len;

      if (token != NULL)
        g_assert_cmpint (gepard_tokenizer_token_to_id (tokenizer, token), >=, 0);
      /* unknown ids are skipped, never read */
      decoded = gepard_tokenizer_decode_len (tokenizer, ids, G_N_ELEMENTS (ids), &decoded_len);
      g_assert_true (fuzz_utf8_valid (decoded, decoded_len));
    }
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardTokenizer) tokenizer
      = gepard_tokenizer_new_from_data ((const char *)data, (gssize)size, &error);

  fuzz_check_outcome (tokenizer != NULL, error, GEPARD_TOKENIZER_ERROR);
  if (tokenizer != NULL)
    use_tokenizer (tokenizer);
  return 0;
}
