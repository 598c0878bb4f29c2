/* gepard-nemo-config.c: the codec hyperparameters of an AudioCodecModel's model_config.yaml.
 *
 * Hydra builds each module as `_target_(**kwargs)`, so every key under audio_encoder,
 * vector_quantizer and audio_decoder is a constructor argument. A key this reader does not know
 * could change what the class computes, so it is refused rather than ignored; everything outside
 * those three sections (trainer, optim, datasets, losses, …) is ignored. */
#include "gepard-nemo.h"

#include "gepard-error.h"
#include "gepard-yaml.h"

#include <stdarg.h>
#include <string.h>

#define MAX_CONFIG_INT (1 << 24)

typedef struct
{
  const GepardYamlNode *root; /* the document, for interpolations */
  const GepardYamlNode *node; /* the section's mapping */
  const char *name;           /* "audio_encoder", … */
  GHashTable *used;           /* keys read so far */
} Section;

#define MAX_INTERPOLATION_HOPS 8

static gboolean config_fail (GError **error, GepardFormatError code, const char *format, ...)
    G_GNUC_PRINTF (3, 4);

static gboolean
config_fail (GError **error, GepardFormatError code, const char *format, ...)
{
  va_list args;
  g_autofree char *message = NULL;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_FORMAT_ERROR, code, "model_config.yaml: %s", message);
  return FALSE;
}

/* OmegaConf interpolations "${a.b.c}" name another value by its absolute path. NeMo resolves
 * them before it saves a model, but a hand-edited or older file may keep some; following plain
 * absolute paths costs little. Relative paths and resolvers ("${oc.env:X}") are refused. */
static gboolean
resolve (const GepardYamlNode *root, const GepardYamlNode *node, const char *what,
         const GepardYamlNode **out, GError **error)
{
  for (int hops = 0;; hops++)
    {
      const char *s = node->kind == GEPARD_YAML_SCALAR ? node->scalar : "";
      gsize len = strlen (s);
      g_autofree char *path = NULL;
      g_auto (GStrv) parts = NULL;
      const GepardYamlNode *target = root;

      if (!(len > 3 && g_str_has_prefix (s, "${") && s[len - 1] == '}'))
        {
          *out = node;
          return TRUE;
        }
      if (hops >= MAX_INTERPOLATION_HOPS)
        return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                            "%s (line %d): interpolations nest deeper than %d", what, node->line,
                            MAX_INTERPOLATION_HOPS);
      path = g_strndup (s + 2, len - 3);
      for (const char *c = path; *c != '\0'; c++)
        if (!g_ascii_isalnum (*c) && *c != '_' && *c != '.' && *c != '-')
          return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                              "%s (line %d): only absolute ${a.b} interpolations are supported, "
                              "not %s",
                              what, node->line, s);
      if (path[0] == '.')
        return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                            "%s (line %d): relative interpolation %s is not supported", what,
                            node->line, s);
      parts = g_strsplit (path, ".", -1);
      for (guint i = 0; parts[i] != NULL && target != NULL; i++)
        {
          if (target->kind == GEPARD_YAML_SEQUENCE && g_ascii_isdigit (parts[i][0]))
            {
              guint64 index;

              if (!g_ascii_string_to_unsigned (parts[i], 10, 0, G_MAXUINT, &index, NULL)
                  || index >= target->items->len)
                target = NULL;
              else
                target = g_ptr_array_index (target->items, (guint)index);
            }
          else
            target = gepard_yaml_mapping_lookup (target, parts[i]);
        }
      if (target == NULL)
        return config_fail (error, GEPARD_FORMAT_ERROR_MISSING,
                            "%s (line %d): interpolation %s names nothing", what, node->line, s);
      node = target;
    }
}

/* The value of `key` with interpolations followed, or NULL when absent. A null value is an
 * error: Hydra would pass None, which none of these constructors accepts. */
static gboolean
section_get (Section *section, const char *key, const GepardYamlNode **out, GError **error)
{
  const GepardYamlNode *value = gepard_yaml_mapping_lookup (section->node, key);
  g_autofree char *what = g_strconcat (section->name, ".", key, NULL);

  g_hash_table_add (section->used, (gpointer)key);
  *out = NULL;
  if (value == NULL)
    return TRUE;
  if (!resolve (section->root, value, what, &value, error))
    return FALSE;
  if (gepard_yaml_node_is_null (value))
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "%s (line %d) is null", what,
                        value->line);
  *out = value;
  return TRUE;
}

static gboolean
read_int (Section *section, const char *key, gboolean required, int default_value, int *out,
          GError **error)
{
  const GepardYamlNode *value;
  gint64 v;

  if (!section_get (section, key, &value, error))
    return FALSE;
  if (value == NULL)
    {
      if (required)
        return config_fail (error, GEPARD_FORMAT_ERROR_MISSING, "%s.%s is missing", section->name,
                            key);
      *out = default_value;
      return TRUE;
    }
  if (!gepard_yaml_node_get_int (value, 1, MAX_CONFIG_INT, &v))
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE,
                        "%s.%s (line %d) is not an integer between 1 and %d", section->name, key,
                        value->line, MAX_CONFIG_INT);
  *out = (int)v;
  return TRUE;
}

/* A list of positive integers, block or flow style; absent gives `defaults`. */
static gboolean
read_int_list (Section *section, const char *key, const int *defaults, int n_defaults, int max,
               int *out, int *n_out, GError **error)
{
  const GepardYamlNode *value;
  g_autofree char *what = g_strconcat (section->name, ".", key, NULL);

  if (!section_get (section, key, &value, error))
    return FALSE;
  if (value == NULL)
    {
      if (defaults == NULL)
        return config_fail (error, GEPARD_FORMAT_ERROR_MISSING, "%s.%s is missing", section->name,
                            key);
      memcpy (out, defaults, sizeof (int) * (gsize)n_defaults);
      *n_out = n_defaults;
      return TRUE;
    }
  if (value->kind != GEPARD_YAML_SEQUENCE || value->items->len == 0)
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "%s.%s (line %d) is not a list",
                        section->name, key, value->line);
  if (value->items->len > (guint)max)
    return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                        "%s.%s (line %d) has %u entries (at most %d supported)", section->name, key,
                        value->line, value->items->len, max);
  for (guint i = 0; i < value->items->len; i++)
    {
      const GepardYamlNode *item = g_ptr_array_index (value->items, i);
      gint64 v;

      if (!resolve (section->root, item, what, &item, error))
        return FALSE;
      if (!gepard_yaml_node_get_int (item, 1, MAX_CONFIG_INT, &v))
        return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE,
                            "%s.%s (line %d): entry %u is not an integer between 1 and %d",
                            section->name, key, value->line, i, MAX_CONFIG_INT);
      out[i] = (int)v;
    }
  *n_out = (int)value->items->len;
  return TRUE;
}

/* A string out of `names` (NULL-terminated); absent gives `default_index` (-1: required). */
static gboolean
read_choice (Section *section, const char *key, const char *const *names, int default_index,
             int *out, GError **error)
{
  const GepardYamlNode *value;
  const char *s;
  g_autofree char *known = NULL;

  if (!section_get (section, key, &value, error))
    return FALSE;
  if (value == NULL)
    {
      if (default_index < 0)
        return config_fail (error, GEPARD_FORMAT_ERROR_MISSING, "%s.%s is missing", section->name,
                            key);
      *out = default_index;
      return TRUE;
    }
  s = gepard_yaml_node_get_string (value);
  if (s == NULL || value->kind != GEPARD_YAML_SCALAR)
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "%s.%s (line %d) is not a string",
                        section->name, key, value->line);
  for (int i = 0; names[i] != NULL; i++)
    {
      if (strcmp (s, names[i]) == 0)
        {
          *out = i;
          return TRUE;
        }
    }
  known = g_strjoinv (", ", (char **)names);
  return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                      "%s.%s is “%s” (line %d); Gepard implements %s", section->name, key, s,
                      value->line, known);
}

static gboolean
read_bool (Section *section, const char *key, gboolean default_value, gboolean *out, GError **error)
{
  const GepardYamlNode *value;

  if (!section_get (section, key, &value, error))
    return FALSE;
  if (value == NULL)
    {
      *out = default_value;
      return TRUE;
    }
  if (!gepard_yaml_node_get_bool (value, out))
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "%s.%s (line %d) is not true or false",
                        section->name, key, value->line);
  return TRUE;
}

/* `_target_` names the class by its import path; only the last component matters here, the
 * module moved between NeMo versions (nanocodec.md §0, S1 vs S2). */
static gboolean
check_target (Section *section, const char *expected, const char *why, GError **error)
{
  const GepardYamlNode *value;
  const char *target;
  const char *class_name;

  if (!section_get (section, "_target_", &value, error))
    return FALSE;
  if (value == NULL)
    return config_fail (error, GEPARD_FORMAT_ERROR_MISSING, "%s._target_ is missing",
                        section->name);
  target = gepard_yaml_node_get_string (value);
  if (target == NULL || value->kind != GEPARD_YAML_SCALAR)
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "%s._target_ (line %d) is not a string",
                        section->name, value->line);
  class_name = strrchr (target, '.');
  class_name = class_name != NULL ? class_name + 1 : target;
  if (strcmp (class_name, expected) != 0)
    return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                        "%s._target_ is %s (line %d); Gepard implements %s (%s)", section->name,
                        target, value->line, expected, why);
  return TRUE;
}

/* Every key of the section must have been read: an argument this reader does not know about may
 * change the computation. Hydra's own flags that do not reach the constructor are allowed. */
static gboolean
check_unknown_keys (Section *section, GError **error)
{
  for (guint i = 0; i < section->node->keys->len; i++)
    {
      const char *key = g_ptr_array_index (section->node->keys, i);
      const GepardYamlNode *value = g_ptr_array_index (section->node->items, i);

      if (g_hash_table_contains (section->used, key) || strcmp (key, "_recursive_") == 0
          || strcmp (key, "_convert_") == 0)
        continue;
      return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                          "%s.%s (line %d) is not an argument Gepard knows", section->name, key,
                          value->line);
    }
  return TRUE;
}

static gboolean
section_open (Section *section, const GepardYamlNode *root, const char *name, GError **error)
{
  section->root = root;
  section->name = name;
  section->node = gepard_yaml_mapping_lookup (root, name);
  section->used = g_hash_table_new (g_str_hash, g_str_equal);
  if (section->node == NULL || gepard_yaml_node_is_null (section->node))
    return config_fail (error, GEPARD_FORMAT_ERROR_MISSING, "the %s section is missing", name);
  if (section->node->kind != GEPARD_YAML_MAPPING)
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "%s (line %d) is not a mapping", name,
                        section->node->line);
  return TRUE;
}

static void
section_clear (Section *section)
{
  g_clear_pointer (&section->used, g_hash_table_unref);
}

static const int default_resblock_kernels[] = {3, 7, 11};
static const int default_resblock_dilations[] = {1, 3, 5};
static const char *const activation_names[] = {"lrelu", "half_snake", NULL};
static const char *const output_activation_names[] = {"clamp", "tanh", NULL};
static const char *const pad_mode_names[] = {"zeros", "replicate", "reflect", NULL};

G_STATIC_ASSERT (GEPARD_CODEC_ACTIVATION_LRELU == 0 && GEPARD_CODEC_ACTIVATION_HALF_SNAKE == 1);
G_STATIC_ASSERT (GEPARD_CODEC_OUTPUT_CLAMP == 0 && GEPARD_CODEC_OUTPUT_TANH == 1);
G_STATIC_ASSERT (GEPARD_CODEC_PAD_ZEROS == 0 && GEPARD_CODEC_PAD_REPLICATE == 1
                 && GEPARD_CODEC_PAD_REFLECT == 2);

/* nanocodec.md §3.1: HiFiGANEncoder(encoded_dim, down_sample_rates, base_channels, in/out kernel
 * sizes 7, resblock kernels (3, 7, 11), dilations (1, 3, 5), activation, pad_mode "reflect") */
static gboolean
read_encoder (const GepardYamlNode *root, GepardCodecConfig *config, GError **error)
{
  GepardCodecEncoderConfig *enc = &config->encoder;
  Section s = {0};
  int activation = 0, pad_mode = 0;
  gboolean ok;

  ok = section_open (&s, root, "audio_encoder", error)
       && check_target (&s, "HiFiGANEncoder", "the non-causal encoder, nanocodec.md §3", error)
       && read_int (&s, "encoded_dim", TRUE, 0, &config->latent_dim, error)
       && read_int_list (&s, "down_sample_rates", NULL, 0, GEPARD_CODEC_MAX_STAGES,
                         enc->down_sample_rates, &enc->n_stages, error)
       && read_int (&s, "base_channels", TRUE, 0, &enc->base_channels, error)
       && read_int (&s, "in_kernel_size", FALSE, 7, &enc->in_kernel_size, error)
       && read_int (&s, "out_kernel_size", FALSE, 7, &enc->out_kernel_size, error)
       && read_int_list (&s, "resblock_kernel_sizes", default_resblock_kernels, 3,
                         GEPARD_CODEC_MAX_RESBLOCK_KERNELS, enc->resblock_kernel_sizes,
                         &enc->n_resblock_kernel_sizes, error)
       && read_int_list (&s, "resblock_dilation_sizes", default_resblock_dilations, 3,
                         GEPARD_CODEC_MAX_RESBLOCK_DILATIONS, enc->resblock_dilation_sizes,
                         &enc->n_resblock_dilation_sizes, error)
       && read_choice (&s, "activation", activation_names, -1, &activation, error)
       && read_choice (&s, "pad_mode", pad_mode_names, GEPARD_CODEC_PAD_REFLECT, &pad_mode, error)
       && check_unknown_keys (&s, error);
  section_clear (&s);
  enc->activation = (GepardCodecActivation)activation;
  enc->pad_mode = (GepardCodecPadMode)pad_mode;
  return ok;
}

/* nanocodec.md §2.1: CausalHiFiGANDecoder(input_dim, up_sample_rates, base_channels,
 * in_kernel_size 7, out_kernel_size 3, resblock kernels (3, 7, 11), dilations (1, 3, 5),
 * activation, output_activation, pad_mode, n_groups_equal_to_out_channels) */
static gboolean
read_decoder (const GepardYamlNode *root, GepardCodecConfig *config, GError **error)
{
  GepardCodecDecoderConfig *dec = &config->decoder;
  Section s = {0};
  int input_dim = 0, activation = 0, output_activation = 0, pad_mode = 0;
  gboolean ok;

  /* the decoder's causal convs pad with zeros whatever pad_mode says (nanocodec.md §2.3), so
   * its default matters little; the grouped transposed convs are opt-in in NeMo */
  ok = section_open (&s, root, "audio_decoder", error)
       && check_target (&s, "CausalHiFiGANDecoder",
                        "the causal decoder that streams, nanocodec.md §2", error)
       && read_int (&s, "input_dim", TRUE, 0, &input_dim, error)
       && read_int_list (&s, "up_sample_rates", NULL, 0, GEPARD_CODEC_MAX_STAGES,
                         dec->up_sample_rates, &dec->n_stages, error)
       && read_int (&s, "base_channels", TRUE, 0, &dec->base_channels, error)
       && read_int (&s, "in_kernel_size", FALSE, 7, &dec->in_kernel_size, error)
       && read_int (&s, "out_kernel_size", FALSE, 3, &dec->out_kernel_size, error)
       && read_int_list (&s, "resblock_kernel_sizes", default_resblock_kernels, 3,
                         GEPARD_CODEC_MAX_RESBLOCK_KERNELS, dec->resblock_kernel_sizes,
                         &dec->n_resblock_kernel_sizes, error)
       && read_int_list (&s, "resblock_dilation_sizes", default_resblock_dilations, 3,
                         GEPARD_CODEC_MAX_RESBLOCK_DILATIONS, dec->resblock_dilation_sizes,
                         &dec->n_resblock_dilation_sizes, error)
       && read_choice (&s, "activation", activation_names, -1, &activation, error)
       && read_choice (&s, "output_activation", output_activation_names, -1, &output_activation,
                       error)
       && read_choice (&s, "pad_mode", pad_mode_names, GEPARD_CODEC_PAD_ZEROS, &pad_mode, error)
       && read_bool (&s, "n_groups_equal_to_out_channels", FALSE,
                     &dec->n_groups_equal_to_out_channels, error)
       && check_unknown_keys (&s, error);
  section_clear (&s);
  if (!ok)
    return FALSE;
  dec->activation = (GepardCodecActivation)activation;
  dec->output_activation = (GepardCodecOutputActivation)output_activation;
  dec->pad_mode = (GepardCodecPadMode)pad_mode;
  /* nanocodec.md §1: the encoder's output is the decoder's input */
  if (input_dim != config->latent_dim)
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE,
                        "audio_decoder.input_dim %d differs from audio_encoder.encoded_dim %d",
                        input_dim, config->latent_dim);
  return TRUE;
}

/* nanocodec.md §4: GroupFiniteScalarQuantizer(num_groups, num_levels_per_group, eps 1e-3) */
static gboolean
read_quantizer (const GepardYamlNode *root, GepardCodecConfig *config, GError **error)
{
  Section s = {0};
  const GepardYamlNode *eps;
  gboolean ok;

  ok = section_open (&s, root, "vector_quantizer", error)
       && check_target (&s, "GroupFiniteScalarQuantizer",
                        "finite scalar quantization, nanocodec.md §4", error)
       && read_int (&s, "num_groups", TRUE, 0, &config->fsq_groups, error)
       && read_int_list (&s, "num_levels_per_group", NULL, 0, GEPARD_CODEC_MAX_FSQ_DIMS,
                         config->fsq_levels, &config->fsq_n_dims, error);
  if (ok)
    {
      config->fsq_eps = 1e-3;
      if (!section_get (&s, "eps", &eps, error))
        ok = FALSE;
      else if (eps != NULL && !gepard_yaml_node_get_double (eps, &config->fsq_eps))
        ok = config_fail (error, GEPARD_FORMAT_ERROR_SHAPE,
                          "vector_quantizer.eps (line %d) is not a number", eps->line);
    }
  ok = ok && check_unknown_keys (&s, error);
  section_clear (&s);
  return ok;
}

static gboolean
read_top_int (const GepardYamlNode *root, const char *key, int *out, GError **error)
{
  const GepardYamlNode *value = gepard_yaml_mapping_lookup (root, key);
  gint64 v;

  if (value == NULL)
    return config_fail (error, GEPARD_FORMAT_ERROR_MISSING, "%s is missing", key);
  if (!resolve (root, value, key, &value, error))
    return FALSE;
  if (!gepard_yaml_node_get_int (value, 1, MAX_CONFIG_INT, &v))
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE,
                        "%s (line %d) is not an integer between 1 and %d", key, value->line,
                        MAX_CONFIG_INT);
  *out = (int)v;
  return TRUE;
}

gboolean
gepard_nemo_parse_codec_config (const char *yaml, gsize len, GepardCodecConfig *config,
                                GError **error)
{
  g_autoptr (GepardYamlNode) root = NULL;
  g_autoptr (GError) local_error = NULL;
  const GepardYamlNode *target;
  GepardCodecConfig parsed;

  g_return_val_if_fail (yaml != NULL || len == 0, FALSE);
  g_return_val_if_fail (config != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  root = gepard_yaml_parse (yaml, len, &local_error);
  if (root == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, local_error->code, "model_config.yaml: %s",
                   local_error->message);
      return FALSE;
    }
  if (root->kind != GEPARD_YAML_MAPPING)
    return config_fail (error, GEPARD_FORMAT_ERROR_SHAPE, "the document is not a mapping");

  /* NeMo records the model class as `target`; a file of another model is not a codec */
  target = gepard_yaml_mapping_lookup (root, "target");
  if (target != NULL && !gepard_yaml_node_is_null (target))
    {
      const char *s = gepard_yaml_node_get_string (target);

      if (s == NULL || target->kind != GEPARD_YAML_SCALAR
          || !(strcmp (s, "AudioCodecModel") == 0 || g_str_has_suffix (s, ".AudioCodecModel")))
        return config_fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                            "target (line %d) is not an AudioCodecModel", target->line);
    }

  memset (&parsed, 0, sizeof parsed);
  if (!read_top_int (root, "sample_rate", &parsed.sample_rate, error)
      || !read_top_int (root, "samples_per_frame", &parsed.samples_per_frame, error)
      || !read_encoder (root, &parsed, error) || !read_quantizer (root, &parsed, error)
      || !read_decoder (root, &parsed, error))
    return FALSE;

  if (!gepard_codec_config_validate (&parsed, &local_error))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, local_error->code, "model_config.yaml: %s",
                   local_error->message);
      return FALSE;
    }
  *config = parsed;
  return TRUE;
}
