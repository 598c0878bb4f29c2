/* gepard-inspect: shows what Gepard loads from a model, tensor by tensor if asked. */
#include "gepard-backend.h"
#include "gepard-checkpoint.h"
#include "gepard-error.h"
#include "gepard-generate.h"
#include "gepard-hub.h"
#include "gepard-model.h"

#include <locale.h>
#include <string.h>

static int
fail (GError *error)
{
  g_printerr ("gepard-inspect: %s\n", error->message);
  return 1;
}

static void
print_ids (GepardTokenizer *tokenizer, const char *text)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) ids = gepard_tokenizer_encode (tokenizer, text, -1, &error);
  if (ids == NULL)
    {
      g_print ("  tokenization failed: %s\n", error->message);
      return;
    }
  g_print ("text            “%s”\n", text);
  g_print ("token ids       ");
  for (guint i = 0; i < ids->len; i++)
    g_print ("%s%d", i ? " " : "", g_array_index (ids, gint32, i));
  g_print ("  (%u tokens)\n", ids->len);
  g_print ("tokens          ");
  for (guint i = 0; i < ids->len; i++)
    {
      gint32 id = g_array_index (ids, gint32, i);
      g_autofree char *piece = gepard_tokenizer_decode (tokenizer, &id, 1);
      g_autofree char *escaped = g_strescape (piece, "");
      g_print ("%s[%s]", i ? " " : "", escaped);
    }
  g_print ("\n");
}

static int
inspect_model (const char *model, const char *text, const char *device)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (model, &error);
  if (checkpoint == NULL)
    return fail (error);

  const GepardModelConfig *c = gepard_checkpoint_get_config (checkpoint);
  const char *test_model = gepard_checkpoint_get_metadata (checkpoint, "gepard.test_model");

  g_print ("model           %s\n", gepard_checkpoint_get_dir (checkpoint));
  if (test_model != NULL)
    g_print (
        "                UNTRAINED TEST MODEL (preset %s, random weights): it does not speak\n",
        test_model);
  g_print ("backbone        %d layers, hidden %d, %d q heads / %d kv heads × %d, MLP %d\n",
           c->n_layers, c->hidden_size, c->n_q_heads, c->n_kv_heads, c->head_dim,
           c->intermediate_size);
  g_print ("embedding       %d × %d\n", c->vocab_size, c->hidden_size);
  g_print ("rope            theta %g, partial factor %g (%d rotary dims)\n", c->rope_theta,
           c->partial_rotary_factor, (int)(c->head_dim * c->partial_rotary_factor));
  g_print ("audio heads     %d (levels", c->n_audio_heads);
  for (int i = 0; i < 4 && i < c->n_audio_heads; i++)
    g_print (" %d", c->head_levels[i]);
  g_print (" …), frame embedding %d per channel\n", c->audio_embed_dim);
  if (c->voice_cloning)
    g_print ("compressor      %d queries, %d blocks, %d heads, FFN %d\n", c->compressor_queries,
             c->compressor_layers, c->compressor_heads, c->compressor_ffn_hidden);
  else
    g_print ("compressor      none (no voice cloning)\n");
  g_print ("special ids     SOT %d, EOT %d, SOS %d, tokenizer length %d\n", c->start_of_text,
           c->end_of_text, c->start_of_speech, c->tokenizer_length);
  g_print ("repetition      %s (target %d tokens, below %d, at most %d×)\n",
           c->repetition_enabled ? "on" : "off", c->repetition_target_tokens,
           c->repetition_apply_below, c->repetition_max_repeats);
  g_print ("tensors         %u, %.1f MiB (%s)\n", gepard_checkpoint_get_n_tensors (checkpoint),
           gepard_checkpoint_get_n_bytes (checkpoint) / (1024.0 * 1024.0), c->model_dtype);
  const char *codec = gepard_checkpoint_get_codec_path (checkpoint);
  g_print ("codec           %s\n",
           codec ? codec : "none found (neither beside the model nor cached)");

  GepardDeviceInfo info = {0};
  g_autofree char *fallback = NULL;
  if (gepard_backend_select (device, &info, &fallback, &error))
    {
      g_print ("device          %s%s%s\n", info.description, fallback ? " — " : "",
               fallback ? fallback : "");
      gepard_device_info_clear (&info);
    }
  else
    g_print ("device          %s\n", error->message);

  if (text != NULL)
    print_ids (gepard_checkpoint_get_tokenizer (checkpoint), text);
  return 0;
}

/* ---- lm / generate: the model's outputs for given inputs, for comparison with other
 * implementations ---------------------------------------------------------------------------- */

typedef struct
{
  char *ids;
  char *text;
  char *ref_codes;
  gboolean null_prefix;
  char *frames;
  char *inv_freq;
  char *output;
  int max_frames;
  gboolean greedy;
  double temperature;
  double cfg_scale;
  int top_k;
  gint64 seed;
} LmOptions;

static GArray *
parse_ids (const char *text, GError **error)
{
  g_auto (GStrv) words = g_strsplit_set (text, " ,\t\n", -1);
  GArray *ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  for (int i = 0; words[i] != NULL; i++)
    {
      gint64 id;
      if (*words[i] == '\0')
        continue;
      if (!g_ascii_string_to_signed (words[i], 10, 0, G_MAXINT32, &id, error))
        {
          g_array_unref (ids);
          return NULL;
        }
      gint32 value = (gint32)id;
      g_array_append_val (ids, value);
    }
  return ids;
}

/* a [T, channels] integer tensor named `name` from a safetensors file, as gint32 */
static gint32 *
read_codes (const char *path, const char *name, int channels, int *n_rows, GError **error)
{
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, error);
  if (file == NULL)
    return NULL;
  const GepardTensor *t = gepard_safetensors_lookup (file, name);
  if (t == NULL || t->n_dims != 2 || t->shape[1] != channels
      || (t->dtype != GEPARD_DTYPE_I32 && t->dtype != GEPARD_DTYPE_I64))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                   "%s: needs an I32 or I64 tensor “%s” of shape [T, %d]", path, name, channels);
      return NULL;
    }
  gint32 *codes = g_new (gint32, t->n_elements);
  for (guint64 i = 0; i < t->n_elements; i++)
    {
      gint64 v;
      if (t->dtype == GEPARD_DTYPE_I32)
        {
          gint32 v32;
          memcpy (&v32, t->data + i * 4, 4);
          v = v32;
        }
      else
        memcpy (&v, t->data + i * 8, 8);
      codes[i] = (gint32)CLAMP (v, G_MININT32, G_MAXINT32);
    }
  *n_rows = (int)t->shape[0];
  return codes;
}

static void
add_f32 (GepardSafetensorsWriter *writer, const char *name, const float *data, gint64 rows,
         gint64 cols)
{
  gint64 shape[2] = {rows, cols};
  gepard_safetensors_writer_add_data (writer, name, GEPARD_DTYPE_F32, cols > 0 ? 2 : 1, shape,
                                      data);
}

typedef struct
{
  const GepardModel *model;
  const GepardModelConfig *config;
  GArray *ids;
  float *prefix;
  int n_prefix;
} LmInputs;

static gboolean
prepare_inputs (const GepardCheckpoint *checkpoint, const LmOptions *o, GepardModel **model,
                LmInputs *in, GError **error)
{
  GepardRopeMode mode = GEPARD_ROPE_INV_FREQ_BF16;
  if (o->inv_freq != NULL && g_strcmp0 (o->inv_freq, "f32") == 0)
    mode = GEPARD_ROPE_INV_FREQ_F32;
  else if (o->inv_freq != NULL && g_strcmp0 (o->inv_freq, "bf16") != 0)
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                   "--inv-freq must be bf16 or f32");
      return FALSE;
    }
  *model = gepard_model_new (checkpoint, mode, error);
  if (*model == NULL)
    return FALSE;
  in->model = *model;
  in->config = gepard_model_get_config (*model);
  int h = in->config->hidden_size;

  if (o->ids != NULL)
    in->ids = parse_ids (o->ids, error);
  else if (o->text != NULL)
    {
      g_autoptr (GArray) text_ids = gepard_tokenizer_encode (
          gepard_checkpoint_get_tokenizer (checkpoint), o->text, -1, error);
      if (text_ids == NULL)
        return FALSE;
      in->ids = gepard_text_layout (in->config, (const gint32 *)text_ids->data, text_ids->len);
    }
  else
    g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "give --ids or --text");
  if (in->ids == NULL)
    return FALSE;
  if (in->ids->len == 0)
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "no input ids");
      return FALSE;
    }

  if (o->ref_codes != NULL)
    {
      int n_ref = 0;
      g_autofree gint32 *codes
          = read_codes (o->ref_codes, "codes", in->config->n_audio_heads, &n_ref, error);
      if (codes == NULL)
        return FALSE;
      in->n_prefix = in->config->compressor_queries;
      in->prefix = g_new (float, (gsize)in->n_prefix *h);
      if (!gepard_model_compress (*model, codes, n_ref, in->prefix, error))
        return FALSE;
    }
  else if (o->null_prefix)
    {
      const float *null_prefix = gepard_model_get_null_prefix (*model);
      if (null_prefix == NULL)
        {
          g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                       "this model has no null prefix");
          return FALSE;
        }
      in->n_prefix = in->config->compressor_queries;
      in->prefix = g_memdup2 (null_prefix, sizeof (float) * in->n_prefix * h);
    }
  return TRUE;
}

/* One prefill over [prefix | ids], then one cached decode step per forced frame; writes what a
 * reference implementation computes for the same schedule. */
static int
inspect_lm (const char *path, const LmOptions *o)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (path, &error);
  if (checkpoint == NULL)
    return fail (error);
  g_autoptr (GepardModel) model = NULL;
  LmInputs in = {0};
  if (!prepare_inputs (checkpoint, o, &model, &in, &error))
    return fail (error);
  g_autoptr (GArray) ids = in.ids;
  g_autofree float *prefix = in.prefix;
  const GepardModelConfig *c = in.config;
  int h = c->hidden_size, n_logits = gepard_model_get_n_head_logits (model);

  int n_frames = 0;
  g_autofree gint32 *frames = NULL;
  if (o->frames != NULL
      && (frames = read_codes (o->frames, "frames", c->n_audio_heads, &n_frames, &error)) == NULL)
    return fail (error);

  int prefill = in.n_prefix + (int)ids->len;
  g_autofree float *embeds = g_new (float, (gsize)prefill *h);
  g_autofree float *prefill_hidden = g_new (float, (gsize)prefill *h);
  g_autofree float *step_hidden = g_new (float, (gsize)MAX (n_frames, 1) * h);
  g_autofree float *frame_embeds = g_new (float, (gsize)MAX (n_frames, 1) * h);
  g_autofree float *logits = g_new (float, (gsize)(n_frames + 1) * n_logits);
  g_autofree float *stop = g_new (float, n_frames + 1);

  if (in.n_prefix > 0)
    memcpy (embeds, prefix, sizeof (float) * in.n_prefix * h);
  if (!gepard_model_embed_tokens (model, (const gint32 *)ids->data, ids->len,
                                  embeds + (gsize)in.n_prefix * h, &error))
    return fail (error);

  g_autoptr (GepardKvCache) cache = gepard_kv_cache_new (model);
  gepard_model_forward (model, cache, embeds, prefill, prefill_hidden);
  gepard_model_heads (model, prefill_hidden + (gsize)(prefill - 1) * h, logits, &stop[0]);
  for (int j = 0; j < n_frames; j++)
    {
      float *e = frame_embeds + (gsize)j * h, *hid = step_hidden + (gsize)j * h;
      if (!gepard_model_embed_frame (model, frames + (gsize)j * c->n_audio_heads, e, &error))
        return fail (error);
      gepard_model_forward (model, cache, e, 1, hid);
      gepard_model_heads (model, hid, logits + (gsize)(j + 1) * n_logits, &stop[j + 1]);
    }

  g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
  if (in.n_prefix > 0)
    add_f32 (writer, "prefix", prefix, in.n_prefix, h);
  add_f32 (writer, "prefill_hidden", prefill_hidden, prefill, h);
  add_f32 (writer, "step_hidden", step_hidden, n_frames, h);
  add_f32 (writer, "frame_embeds", frame_embeds, n_frames, h);
  add_f32 (writer, "head_logits", logits, n_frames + 1, n_logits);
  add_f32 (writer, "stop_logits", stop, n_frames + 1, 0);
  if (!gepard_safetensors_writer_write (writer, o->output, &error))
    return fail (error);
  return 0;
}

static gboolean
collect_frame (const gint32 *codes, int index, gpointer user_data)
{
  GArray *frames = user_data;
  g_array_append_vals (frames, codes, 32);
  return TRUE;
}

static int
inspect_generate (const char *path, const LmOptions *o)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (path, &error);
  if (checkpoint == NULL)
    return fail (error);
  g_autoptr (GepardModel) model = NULL;
  LmInputs in = {0};
  if (!prepare_inputs (checkpoint, o, &model, &in, &error))
    return fail (error);
  g_autoptr (GArray) ids = in.ids;
  g_autofree float *prefix = in.prefix;

  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.temperature = o->greedy ? 0.0f : (float)o->temperature;
  sampling.top_k = o->top_k;
  sampling.cfg_scale = (float)o->cfg_scale;
  sampling.max_frames = o->max_frames;
  sampling.seed = (guint64)o->seed;

  g_autoptr (GArray) frames = g_array_new (FALSE, FALSE, sizeof (gint32));
  gint64 start = g_get_monotonic_time ();
  int n = gepard_generate (model, prefix, in.n_prefix, (const gint32 *)ids->data, ids->len,
                           &sampling, collect_frame, frames, &error);
  double seconds = (g_get_monotonic_time () - start) / 1e6;
  if (n < 0)
    return fail (error);
  double audio = n / in.config->frame_rate_hz;
  g_printerr ("%d frames (%.2f s of audio) in %.2f s: real-time factor %.3f\n", n, audio, seconds,
              audio > 0 ? seconds / audio : 0.0);

  if (o->output != NULL)
    {
      g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
      gint64 shape[2] = {n, 32};
      gepard_safetensors_writer_add_data (writer, "frames", GEPARD_DTYPE_I32, 2, shape,
                                          frames->data);
      if (in.n_prefix > 0)
        add_f32 (writer, "prefix", prefix, in.n_prefix, in.config->hidden_size);
      if (!gepard_safetensors_writer_write (writer, o->output, &error))
        return fail (error);
    }
  return 0;
}

static int
inspect_tensors (const char *path)
{
  g_autoptr (GError) error = NULL;

  if (g_file_test (path, G_FILE_TEST_IS_REGULAR))
    {
      g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, &error);
      if (file == NULL)
        return fail (error);
      for (guint i = 0; i < gepard_safetensors_get_n_tensors (file); i++)
        {
          const GepardTensor *t = gepard_safetensors_get_nth (file, i);
          g_autofree char *shape = gepard_tensor_shape_to_string (t);
          g_print ("%s %s %s\n", t->name, gepard_dtype_name (t->dtype), shape);
        }
      return 0;
    }

  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (path, &error);
  if (checkpoint == NULL)
    return fail (error);
  g_print ("%u tensors\n", gepard_checkpoint_get_n_tensors (checkpoint));
  return 0;
}

int
main (int argc, char **argv)
{
  setlocale (LC_ALL, "");
  g_autofree char *text = NULL, *device = NULL;
  g_auto (GStrv) rest = NULL;
  LmOptions lm = {.max_frames = 2000, .temperature = 0.4, .cfg_scale = 1.0, .seed = 0};
  GOptionEntry entries[] = {
      {"ids", 0, 0, G_OPTION_ARG_STRING, &lm.ids, "Input token ids, laid out (lm, generate)",
       "IDS"},
      {"ref-codes", 0, 0, G_OPTION_ARG_FILENAME, &lm.ref_codes,
       "Reference codes for the compressor prefix: safetensors with “codes” [T, 32]", "FILE"},
      {"null-prefix", 0, 0, G_OPTION_ARG_NONE, &lm.null_prefix, "Use the learned null prefix",
       NULL},
      {"frames", 0, 0, G_OPTION_ARG_FILENAME, &lm.frames,
       "Forced frames for the decode steps (lm): safetensors with “frames” [F, 32]", "FILE"},
      {"inv-freq", 0, 0, G_OPTION_ARG_STRING, &lm.inv_freq,
       "RoPE inverse frequencies: bf16 (GEPARD's runner, default) or f32", "MODE"},
      {"output", 'o', 0, G_OPTION_ARG_FILENAME, &lm.output,
       "Write the results to this safetensors file", "FILE"},
      {"max-frames", 0, 0, G_OPTION_ARG_INT, &lm.max_frames, "At most this many frames (generate)",
       "N"},
      {"greedy", 0, 0, G_OPTION_ARG_NONE, &lm.greedy, "Argmax instead of sampling (generate)",
       NULL},
      {"temperature", 0, 0, G_OPTION_ARG_DOUBLE, &lm.temperature, "Sampling temperature (0.4)",
       "T"},
      {"top-k", 0, 0, G_OPTION_ARG_INT, &lm.top_k, "Top-k (0: off)", "K"},
      {"cfg-scale", 0, 0, G_OPTION_ARG_DOUBLE, &lm.cfg_scale, "Text CFG scale (1: off)", "W"},
      {"seed", 0, 0, G_OPTION_ARG_INT64, &lm.seed, "Sampling seed", "N"},
      {"text", 't', 0, G_OPTION_ARG_STRING, &text, "Tokenize this sentence (model)", "TEXT"},
      {"device", 'd', 0, G_OPTION_ARG_STRING, &device, "auto (default), cpu, cuda or cuda:N",
       "DEVICE"},
      {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_STRING_ARRAY, &rest, NULL, "COMMAND ARGS"},
      {NULL},
  };
  g_autoptr (GOptionContext) context = g_option_context_new ("COMMAND ARG — what Gepard loads");
  g_option_context_set_description (
      context, "Commands:\n"
               "  model MODEL     the model's config, tensors, tokenizer, codec "
               "and the device it would run on\n"
               "  tensors FILE    the tensors of a safetensors file or model\n"
               "  lm MODEL        hidden states, head and stop logits for --ids "
               "(prefill) and --frames (decode steps) into --output\n"
               "  generate MODEL  frames for --ids or --text (layout applied), and the "
               "prefix they were conditioned on, into --output\n");
  g_option_context_add_main_entries (context, entries, NULL);
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (context, &argc, &argv, &error))
    return fail (error);

  if (rest == NULL || g_strv_length (rest) != 2)
    {
      g_printerr ("gepard-inspect: give a command and its argument (see --help)\n");
      return 2;
    }
  if (strcmp (rest[0], "model") == 0)
    return inspect_model (rest[1], text, device);
  if (strcmp (rest[0], "tensors") == 0)
    return inspect_tensors (rest[1]);
  lm.text = text;
  if (strcmp (rest[0], "lm") == 0 || strcmp (rest[0], "generate") == 0)
    {
      if (lm.output == NULL && strcmp (rest[0], "lm") == 0)
        {
          g_printerr ("gepard-inspect: lm needs --output FILE\n");
          return 2;
        }
      int status = strcmp (rest[0], "lm") == 0 ? inspect_lm (rest[1], &lm)
                                               : inspect_generate (rest[1], &lm);
      g_free (lm.ids);
      g_free (lm.ref_codes);
      g_free (lm.frames);
      g_free (lm.inv_freq);
      g_free (lm.output);
      return status;
    }
  g_printerr ("gepard-inspect: unknown command “%s” (see --help)\n", rest[0]);
  return 2;
}
