/* fuzz-yaml.c: the YAML subset parser on arbitrary bytes, and the codec configuration read from
 * it. A configuration that is accepted must survive a round trip through
 * gepard_codec_config_to_yaml: written out and read back, it writes out the same text. */
#include "fuzz-common.h"
#include "gepard-codec-config.h"
#include "gepard-nemo.h"
#include "gepard-yaml.h"

#include <string.h>

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

/* every accessor on every node; depth is bounded by the parser */
static void
walk (const GepardYamlNode *node)
{
  gint64 i;
  double d;
  gboolean b;

  g_assert_cmpint (node->line, >=, 1);
  switch (node->kind)
    {
    case GEPARD_YAML_SCALAR:
      g_assert_nonnull (node->scalar);
      (void)gepard_yaml_node_is_null (node);
      (void)gepard_yaml_node_get_int (node, G_MININT64, G_MAXINT64, &i);
      (void)gepard_yaml_node_get_int (node, 1, 1 << 20, &i);
      (void)gepard_yaml_node_get_double (node, &d);
      (void)gepard_yaml_node_get_bool (node, &b);
      (void)gepard_yaml_node_get_string (node);
      break;
    case GEPARD_YAML_MAPPING:
      g_assert_cmpuint (node->keys->len, ==, node->items->len);
      for (guint k = 0; k < node->keys->len; k++)
        {
          const char *key = g_ptr_array_index (node->keys, k);

          g_assert_true (gepard_yaml_mapping_lookup (node, key)
                         == g_ptr_array_index (node->items, k));
          walk (g_ptr_array_index (node->items, k));
        }
      break;
    case GEPARD_YAML_SEQUENCE:
      g_assert_null (gepard_yaml_mapping_lookup (node, "key"));
      for (guint k = 0; k < node->items->len; k++)
        walk (g_ptr_array_index (node->items, k));
      break;
    default:
      g_assert_not_reached ();
    }
}

static void
check_round_trip (const GepardCodecConfig *config)
{
  g_autofree char *written = gepard_codec_config_to_yaml (config);
  g_autofree char *rewritten = NULL;
  g_autoptr (GError) error = NULL;
  GepardCodecConfig again;

  if (!gepard_nemo_parse_codec_config (written, strlen (written), &again, &error))
    {
      fprintf (stderr, "an accepted configuration, written out, is refused: %s\n%s\n",
               error->message, written);
      abort ();
    }
  rewritten = gepard_codec_config_to_yaml (&again);
  if (strcmp (written, rewritten) != 0)
    {
      fprintf (stderr, "the configuration changed in a round trip:\n%s\n---\n%s\n", written,
               rewritten);
      abort ();
    }
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const char *text = (const char *)data;
  g_autoptr (GError) error = NULL;
  g_autoptr (GError) config_error = NULL;
  g_autoptr (GepardYamlNode) root = gepard_yaml_parse (text, size, &error);
  GepardCodecConfig config;
  gboolean ok;

  fuzz_check_outcome (root != NULL, error, GEPARD_FORMAT_ERROR);
  if (root != NULL)
    walk (root);

  ok = gepard_nemo_parse_codec_config (text, size, &config, &config_error);
  fuzz_check_outcome (ok, config_error, GEPARD_FORMAT_ERROR);
  if (ok)
    {
      g_assert_nonnull (root);
      check_round_trip (&config);
    }
  return 0;
}
