/* gepard-codec-weights.c: NanoCodec weights from a .nemo archive or a safetensors export.
 *
 * Both formats come down to the same thing: model_config.yaml text and a set of named tensors in
 * a mapping. The config gives the geometry (gepard_codec_config_foreach_tensor), every tensor is
 * checked against it — all problems reported together, so a mismatched checkpoint is diagnosed in
 * one go — and then converted into one fp32 arena, weight norm folded (nanocodec.md §2.4). The
 * mapping is released before open() returns. */
#include "gepard-codec-weights.h"

#include "gepard-error.h"
#include "gepard-nemo.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* nanocodec.md §5: only these parts of the state dict are the codec */
static const char *const codec_prefixes[]
    = {"audio_encoder.", "vector_quantizer.", "audio_decoder.", NULL};

#define WEIGHT_G_SUFFIX ".parametrizations.weight.original0"
#define WEIGHT_V_SUFFIX ".parametrizations.weight.original1"
/* each output tensor starts on a cache line, for the kernels that read it */
#define ARENA_ALIGNMENT 64
#define MAX_LISTED_PROBLEMS 16

typedef struct
{
  char *name;
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint64 n_elements;
  float *data; /* inside the arena */
} CodecTensor;

struct _GepardCodecWeights
{
  GepardCodecConfig config;
  GPtrArray *tensors;  /* CodecTensor*, checkpoint order */
  GHashTable *by_name; /* name → CodecTensor*, borrowed */
  float *arena;        /* posix_memalign'ed */
};

static void
codec_tensor_free (gpointer data)
{
  CodecTensor *tensor = data;

  g_free (tensor->name);
  g_free (tensor);
}

void
gepard_codec_weights_free (GepardCodecWeights *weights)
{
  if (weights == NULL)
    return;
  g_clear_pointer (&weights->by_name, g_hash_table_unref);
  g_clear_pointer (&weights->tensors, g_ptr_array_unref);
  free (weights->arena);
  g_free (weights);
}

const GepardCodecConfig *
gepard_codec_weights_get_config (const GepardCodecWeights *weights)
{
  g_return_val_if_fail (weights != NULL, NULL);
  return &weights->config;
}

const float *
gepard_codec_weights_get (const GepardCodecWeights *weights, const char *name, guint *n_dims,
                          gint64 *shape)
{
  const CodecTensor *tensor;

  g_return_val_if_fail (weights != NULL, NULL);
  g_return_val_if_fail (name != NULL, NULL);

  tensor = g_hash_table_lookup (weights->by_name, name);
  if (tensor == NULL)
    return NULL;
  if (n_dims != NULL)
    *n_dims = tensor->n_dims;
  if (shape != NULL)
    memcpy (shape, tensor->shape, sizeof (gint64) * tensor->n_dims);
  return tensor->data;
}

/* ---- the tensors of either format ---- */

typedef struct
{
  const GepardTensor *tensor; /* name, shape, bytes inside the mapping */
  gboolean has_dtype;         /* tensor->dtype is meaningful */
  const char *dtype_name;     /* for messages */
} SourceTensor;

typedef struct
{
  const char *path;
  const char *yaml;
  gsize yaml_len;
  GArray *tensors;     /* SourceTensor, file order, codec parts only */
  GHashTable *by_name; /* name → index + 1 into `tensors` */
} Source;

static void
source_init (Source *source, const char *path)
{
  memset (source, 0, sizeof *source);
  source->path = path;
  source->tensors = g_array_new (FALSE, TRUE, sizeof (SourceTensor));
  source->by_name = g_hash_table_new (g_str_hash, g_str_equal);
}

static void
source_clear (Source *source)
{
  g_clear_pointer (&source->tensors, g_array_unref);
  g_clear_pointer (&source->by_name, g_hash_table_unref);
}

static void
source_add (Source *source, const GepardTensor *tensor, gboolean has_dtype, const char *dtype_name)
{
  SourceTensor entry = {tensor, has_dtype, dtype_name};

  g_array_append_val (source->tensors, entry);
  g_hash_table_insert (source->by_name, (gpointer)tensor->name,
                       GUINT_TO_POINTER (source->tensors->len));
}

static const SourceTensor *
source_lookup (const Source *source, const char *name)
{
  guint index = GPOINTER_TO_UINT (g_hash_table_lookup (source->by_name, name));

  return index == 0 ? NULL : &g_array_index (source->tensors, SourceTensor, index - 1);
}

static gboolean
is_codec_name (const char *name)
{
  for (guint i = 0; codec_prefixes[i] != NULL; i++)
    if (g_str_has_prefix (name, codec_prefixes[i]))
      return TRUE;
  return FALSE;
}

/* ---- checking against the geometry ---- */

/* One tensor the weights will hold: a plain conversion of `src`, or the fold of `g` and `src`. */
typedef struct
{
  char *name;
  const SourceTensor *src;
  const SourceTensor *g; /* weight norm g when `src` is v */
  GepardDType dtype;     /* F32 or I32 (FSQ buffers) */
} Output;

static void
output_clear (gpointer data)
{
  Output *output = data;

  g_free (output->name);
}

typedef struct
{
  const Source *source;
  const GepardCodecConfig *config;
  GHashTable *expected; /* names enumerated, owned */
  GArray *outputs;      /* Output */
  GPtrArray *problems;  /* char*, in checkpoint order */
  GepardFormatError first_code;
} Check;

static void add_problem (Check *check, GepardFormatError code, const char *format, ...)
    G_GNUC_PRINTF (3, 4);

static void
add_problem (Check *check, GepardFormatError code, const char *format, ...)
{
  va_list args;

  if (check->problems->len == 0)
    check->first_code = code;
  va_start (args, format);
  g_ptr_array_add (check->problems, g_strdup_vprintf (format, args));
  va_end (args);
}

static char *
shape_string (guint n_dims, const gint64 *shape)
{
  GString *s = g_string_new ("[");

  for (guint i = 0; i < n_dims; i++)
    g_string_append_printf (s, "%s%" G_GINT64_FORMAT, i > 0 ? ", " : "", shape[i]);
  g_string_append_c (s, ']');
  return g_string_free (s, FALSE);
}

/* The tensor exists with the dtype and shape the config implies. */
static const SourceTensor *
check_one (Check *check, const GepardCodecTensorInfo *info)
{
  const SourceTensor *src = source_lookup (check->source, info->name);

  g_hash_table_add (check->expected, g_strdup (info->name));
  if (src == NULL)
    {
      add_problem (check, GEPARD_FORMAT_ERROR_MISSING, "%s is missing", info->name);
      return NULL;
    }
  if (!src->has_dtype || src->tensor->dtype != info->dtype)
    {
      add_problem (check, GEPARD_FORMAT_ERROR_SHAPE, "%s is %s, not %s", info->name,
                   src->dtype_name, gepard_dtype_name (info->dtype));
      return NULL;
    }
  if (!gepard_tensor_has_shape (src->tensor, info->n_dims, info->shape))
    {
      g_autofree char *have = shape_string (src->tensor->n_dims, src->tensor->shape);
      g_autofree char *want = shape_string (info->n_dims, info->shape);

      add_problem (check, GEPARD_FORMAT_ERROR_SHAPE, "%s has shape %s, not %s", info->name, have,
                   want);
      return NULL;
    }
  return src;
}

static gint32 read_i32 (const guint8 *p);

/* nanocodec.md §4: the quantizer's buffers restate the config (num_levels = the levels,
 * dim_base_index = their running product); a checkpoint that disagrees with its own config would
 * decode with the wrong codebook. */
static void
check_fsq_buffer (Check *check, const GepardCodecTensorInfo *info, const SourceTensor *src)
{
  const GepardCodecConfig *config = check->config;
  gint64 base = 1;

  for (int d = 0; d < config->fsq_n_dims; d++)
    {
      gint64 expected
          = info->param == GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS ? config->fsq_levels[d] : base;
      gint32 value = read_i32 (src->tensor->data + (gsize)d * 4);

      if (value != expected)
        {
          add_problem (check, GEPARD_FORMAT_ERROR_CORRUPT,
                       "%s[%d] is %d where model_config.yaml implies %" G_GINT64_FORMAT, info->name,
                       d, value, expected);
          return;
        }
      base *= config->fsq_levels[d];
    }
}

static void
check_tensor (const GepardCodecTensorInfo *info, gpointer user_data)
{
  Check *check = user_data;
  const SourceTensor *src = check_one (check, info);
  Output output = {0};

  switch (info->param)
    {
    case GEPARD_CODEC_PARAM_WEIGHT_G:
      /* folded into "<conv>.weight" together with v, which the enumeration gives next */
      return;
    case GEPARD_CODEC_PARAM_WEIGHT_V:
      {
        gsize len = strlen (info->name);
        g_autofree char *prefix = NULL;
        g_autofree char *g_name = NULL;
        const SourceTensor *g;

        g_assert (g_str_has_suffix (info->name, WEIGHT_V_SUFFIX));
        prefix = g_strndup (info->name, len - strlen (WEIGHT_V_SUFFIX));
        g_name = g_strconcat (prefix, WEIGHT_G_SUFFIX, NULL);
        g = source_lookup (check->source, g_name);
        /* g was checked just before; a bad g already made a problem */
        if (src == NULL || g == NULL || !g->has_dtype || g->tensor->dtype != GEPARD_DTYPE_F32
            || g->tensor->n_dims != 3 || g->tensor->shape[0] != info->shape[0])
          return;
        output.name = g_strconcat (prefix, ".weight", NULL);
        output.src = src;
        output.g = g;
        output.dtype = GEPARD_DTYPE_F32;
        break;
      }
    case GEPARD_CODEC_PARAM_FSQ_DIM_BASE_INDEX:
    case GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS:
      if (src != NULL)
        check_fsq_buffer (check, info, src);
      G_GNUC_FALLTHROUGH;
    case GEPARD_CODEC_PARAM_BIAS:
    case GEPARD_CODEC_PARAM_SNAKE_ALPHA:
    default:
      if (src == NULL)
        return;
      output.name = g_strdup (info->name);
      output.src = src;
      output.dtype = info->dtype;
      break;
    }
  g_array_append_val (check->outputs, output);
}

static gboolean
report_problems (Check *check, const char *path, GError **error)
{
  g_autoptr (GString) message = NULL;
  guint n = check->problems->len;

  if (n == 0)
    return TRUE;
  message = g_string_new (NULL);
  g_string_append_printf (message, "%s: %u problem%s with the codec tensors: ", path, n,
                          n == 1 ? "" : "s");
  for (guint i = 0; i < n && i < MAX_LISTED_PROBLEMS; i++)
    g_string_append_printf (message, "%s%s", i > 0 ? "; " : "",
                            (const char *)g_ptr_array_index (check->problems, i));
  if (n > MAX_LISTED_PROBLEMS)
    g_string_append_printf (message, "; and %u more", n - MAX_LISTED_PROBLEMS);
  g_set_error_literal (error, GEPARD_FORMAT_ERROR, check->first_code, message->str);
  return FALSE;
}

/* ---- conversion ---- */

static float
read_f32 (const guint8 *p)
{
  guint32 bits;
  float value;

  memcpy (&bits, p, 4);
  bits = GUINT32_FROM_LE (bits);
  memcpy (&value, &bits, 4);
  return value;
}

static gint32
read_i32 (const guint8 *p)
{
  guint32 bits;

  memcpy (&bits, p, 4);
  return (gint32)GUINT32_FROM_LE (bits);
}

/* nanocodec.md §2.4: W[i] = v[i] · (g[i] / ‖v[i]‖₂), the norm over every dim but 0, no epsilon
 * (PyTorch's _weight_norm); accumulated and scaled in double, rounded to fp32 once. */
static gboolean
fold_weight_norm (const Output *output, float *dst, const char *path, GError **error)
{
  const GepardTensor *v = output->src->tensor;
  const GepardTensor *g = output->g->tensor;
  guint64 rows = (guint64)v->shape[0];
  guint64 row_len = rows == 0 ? 0 : v->n_elements / rows;

  for (guint64 i = 0; i < rows; i++)
    {
      const guint8 *row = v->data + i * row_len * 4;
      double sum = 0.0;
      double norm, scale;

      for (guint64 j = 0; j < row_len; j++)
        {
          double x = read_f32 (row + j * 4);

          sum += x * x;
        }
      norm = sqrt (sum);
      scale = (double)read_f32 (g->data + i * 4) / norm;
      /* a zero row would divide by zero, as it does in PyTorch: refuse it instead of producing
       * NaN audio */
      if (!(norm > 0.0) || !isfinite (scale))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                       "%s: %s: row %" G_GUINT64_FORMAT
                       " has a zero or non-finite weight norm (‖v‖ = %g, g = %g)",
                       path, output->name, i, norm, (double)read_f32 (g->data + i * 4));
          return FALSE;
        }
      for (guint64 j = 0; j < row_len; j++)
        dst[i * row_len + j] = (float)((double)read_f32 (row + j * 4) * scale);
    }
  return TRUE;
}

static gboolean
convert (const Output *output, float *dst, const char *path, GError **error)
{
  const GepardTensor *src = output->src->tensor;

  if (output->g != NULL)
    {
      if (!fold_weight_norm (output, dst, path, error))
        return FALSE;
    }
  else if (output->dtype == GEPARD_DTYPE_I32)
    {
      /* FSQ buffers are small integers (levels, mixed-radix bases), exact in fp32 below 2^24 */
      for (guint64 i = 0; i < src->n_elements; i++)
        dst[i] = (float)read_i32 (src->data + i * 4);
    }
  else
    {
      for (guint64 i = 0; i < src->n_elements; i++)
        dst[i] = read_f32 (src->data + i * 4);
    }

  /* weights are never meant to be inf or NaN; a decoder fed one produces nothing useful */
  for (guint64 i = 0; i < src->n_elements; i++)
    {
      if (!isfinite (dst[i]))
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                       "%s: %s holds a non-finite value at element %" G_GUINT64_FORMAT, path,
                       output->name, i);
          return FALSE;
        }
    }
  return TRUE;
}

static GepardCodecWeights *
build_weights (const Source *source, GError **error)
{
  g_autoptr (GepardCodecWeights) weights = g_new0 (GepardCodecWeights, 1);
  g_autoptr (GArray) outputs = NULL;
  g_autoptr (GHashTable) expected = NULL;
  g_autoptr (GPtrArray) problems = NULL;
  g_autoptr (GError) local_error = NULL;
  Check check;
  guint64 arena_floats = 0;
  guint64 cursor = 0;
  void *arena = NULL;

  weights->tensors = g_ptr_array_new_with_free_func (codec_tensor_free);
  weights->by_name = g_hash_table_new (g_str_hash, g_str_equal);

  if (!gepard_nemo_parse_codec_config (source->yaml, source->yaml_len, &weights->config,
                                       &local_error))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, local_error->code, "%s: %s", source->path,
                   local_error->message);
      return NULL;
    }

  expected = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  outputs = g_array_new (FALSE, TRUE, sizeof (Output));
  g_array_set_clear_func (outputs, output_clear);
  problems = g_ptr_array_new_with_free_func (g_free);
  check.source = source;
  check.config = &weights->config;
  check.expected = expected;
  check.outputs = outputs;
  check.problems = problems;
  check.first_code = GEPARD_FORMAT_ERROR_SHAPE;
  gepard_codec_config_foreach_tensor (&weights->config, check_tensor, &check);

  /* a codec tensor the config does not describe means the config and the weights disagree */
  for (guint i = 0; i < source->tensors->len; i++)
    {
      const SourceTensor *src = &g_array_index (source->tensors, SourceTensor, i);

      if (!g_hash_table_contains (expected, src->tensor->name))
        add_problem (&check, GEPARD_FORMAT_ERROR_SHAPE,
                     "%s is not a tensor of the codec model_config.yaml describes",
                     src->tensor->name);
    }
  if (!report_problems (&check, source->path, error))
    return NULL;

  /* every output is no larger than its source tensor, which lies inside the file, so these sums
   * cannot overflow; round each up to the arena alignment */
  for (guint i = 0; i < outputs->len; i++)
    {
      const Output *output = &g_array_index (outputs, Output, i);

      arena_floats += (output->src->tensor->n_elements + ARENA_ALIGNMENT / 4 - 1)
                      & ~(guint64)(ARENA_ALIGNMENT / 4 - 1);
    }
  if (arena_floats > G_MAXSIZE / 4
      || posix_memalign (&arena, ARENA_ALIGNMENT, MAX ((gsize)arena_floats * 4, ARENA_ALIGNMENT))
             != 0)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                   "%s: cannot allocate %" G_GUINT64_FORMAT " bytes for the codec weights",
                   source->path, arena_floats * 4);
      return NULL;
    }
  weights->arena = arena;

  for (guint i = 0; i < outputs->len; i++)
    {
      Output *output = &g_array_index (outputs, Output, i);
      const GepardTensor *src = output->src->tensor;
      CodecTensor *tensor = g_new0 (CodecTensor, 1);

      tensor->name = g_steal_pointer (&output->name);
      tensor->n_dims = src->n_dims;
      memcpy (tensor->shape, src->shape, sizeof tensor->shape);
      tensor->n_elements = src->n_elements;
      tensor->data = weights->arena + cursor;
      cursor += (src->n_elements + ARENA_ALIGNMENT / 4 - 1) & ~(guint64)(ARENA_ALIGNMENT / 4 - 1);
      g_ptr_array_add (weights->tensors, tensor);
      g_hash_table_insert (weights->by_name, tensor->name, tensor);
      output->name = g_strdup (tensor->name);
      if (!convert (output, tensor->data, source->path, error))
        return NULL;
    }
  return g_steal_pointer (&weights);
}

/* ---- the two formats ---- */

static GepardCodecWeights *
open_safetensors (const char *path, GError **error)
{
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, error);
  GepardCodecWeights *weights;
  const char *yaml;
  Source source;

  if (file == NULL)
    return NULL;
  /* the export carries the archive's model_config.yaml verbatim in its metadata */
  yaml = gepard_safetensors_get_metadata (file, "model_config.yaml");
  if (yaml == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                   "%s: no “model_config.yaml” in the safetensors metadata (not a NanoCodec "
                   "export)",
                   path);
      return NULL;
    }

  source_init (&source, path);
  source.yaml = yaml;
  source.yaml_len = strlen (yaml);
  for (guint i = 0; i < gepard_safetensors_get_n_tensors (file); i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);

      if (is_codec_name (tensor->name))
        source_add (&source, tensor, TRUE, gepard_dtype_name (tensor->dtype));
    }
  weights = build_weights (&source, error);
  source_clear (&source);
  return weights;
}

static GepardCodecWeights *
open_nemo (const char *path, GError **error)
{
  g_autoptr (GepardNemo) nemo = gepard_nemo_open (path, codec_prefixes, error);
  GepardCodecWeights *weights;
  Source source;

  if (nemo == NULL)
    return NULL;
  source_init (&source, path);
  source.yaml = gepard_nemo_get_config_yaml (nemo, &source.yaml_len);
  for (guint i = 0; i < gepard_nemo_get_n_tensors (nemo); i++)
    {
      const GepardNemoTensor *t = gepard_nemo_get_nth (nemo, i);

      source_add (&source, &t->tensor, t->has_dtype,
                  t->has_dtype ? gepard_dtype_name (t->tensor.dtype) : t->storage_type);
    }
  weights = build_weights (&source, error);
  source_clear (&source);
  return weights;
}

/* A safetensors file starts with its little-endian header length and then '{'; anything else is
 * taken for a .nemo, whose reader says what it found if it is not one either. */
static gboolean
looks_like_safetensors (const char *path)
{
  guint8 head[9];
  gssize n;
  int fd = g_open (path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);

  if (fd < 0)
    return FALSE;
  n = read (fd, head, sizeof head);
  g_close (fd, NULL);
  return n == (gssize)sizeof head && head[8] == '{';
}

GepardCodecWeights *
gepard_codec_weights_open (const char *path, GError **error)
{
  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* the content decides; the name only picks whose error a damaged file gets */
  if (looks_like_safetensors (path) || g_str_has_suffix (path, ".safetensors"))
    return open_safetensors (path, error);
  return open_nemo (path, error);
}
