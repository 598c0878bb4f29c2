/* fuzz-json.c: the strict JSON check, and gepard_json_parse_file behind it. The check is the gate
 * in front of json-glib, so whatever it passes (as valid UTF-8) json-glib must parse too: a
 * document that passed the gate and then failed in json-glib would mean the two disagree about
 * what JSON is. */
#include "fuzz-common.h"
#include "gepard-json.h"

#include <string.h>

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const char *text = (const char *)data;
  GepardJsonCheck check = {0};
  gboolean strict = gepard_json_check (text, size, &check);
  gboolean utf8 = g_utf8_validate_len (text, size, NULL);
  g_autoptr (GError) error = NULL;
  g_autoptr (JsonNode) root = NULL;

  if (!strict)
    {
      g_assert_nonnull (check.problem);
      g_assert_cmpuint (check.offset, <=, size);
    }
  if (strict && utf8)
    {
      g_autoptr (JsonParser) parser = json_parser_new_immutable ();
      g_autoptr (GError) parse_error = NULL;

      if (!json_parser_load_from_data (parser, text, (gssize)size, &parse_error))
        {
          fprintf (stderr, "strict check passed, json-glib refused: %s\n", parse_error->message);
          abort ();
        }
    }

  root = gepard_json_parse_file (fuzz_file_from_bytes (data, size), &error);
  fuzz_check_outcome (root != NULL, error, GEPARD_FORMAT_ERROR);
  if (root != NULL)
    {
      g_assert_true (strict && utf8);
      g_assert_true (JSON_NODE_HOLDS_OBJECT (root));
    }
  return 0;
}
