/* gepardvoiceenc and gst_gepard_voice_load: a clip in any format GStreamer decodes gives the
 * speaker prefix gepard_voice_new_from_audio gives for the same decoded samples; clips out of the
 * duration range are bus errors naming their length; every accepted voice= form resolves, and
 * anything else is refused. */
#include <gepard-error.h>
#include <gepard-hub.h>
#include <gepard-voice.h>
#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <gst/check/gstcheck.h>
#include <gmodule.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gepard-test-model.h"

static char *work_dir;
static char *model_dir;

typedef GepardVoice *(*VoiceLoadFunc) (GepardEngine *engine, const char *voice, GError **error);

/* gst_gepard_voice_load lives in the plugin: take it from the module the registry loads */
static VoiceLoadFunc
voice_load_func (void)
{
  g_autoptr (GstPlugin) plugin = gst_registry_find_plugin (gst_registry_get (), "gepard");
  fail_unless (plugin != NULL, "the gepard plugin is not in the registry");
  GModule *module = g_module_open (gst_plugin_get_filename (plugin), G_MODULE_BIND_LAZY);
  fail_unless (module != NULL, "cannot open the gepard plugin: %s", g_module_error ());
  gpointer symbol = NULL;
  fail_unless (g_module_symbol (module, "gst_gepard_voice_load", &symbol));
  /* stays open for the rest of the process, like the plugin itself */
  return (VoiceLoadFunc)symbol;
}

static GepardEngine *
get_engine (void)
{
  g_autoptr (GError) error = NULL;
  GepardEngine *engine = gepard_engine_get_shared (model_dir, "cpu", &error);
  fail_unless (engine != NULL, "cannot load the test model: %s", error ? error->message : "");
  return engine;
}

static gsize
prefix_size (GepardEngine *engine)
{
  return gepard_voice_get_prefix_file_size (gepard_engine_get_config (engine));
}

static char *
path_in_work_dir (const char *name)
{
  return g_build_filename (work_dir, name, NULL);
}

/* Runs `pipeline` from NULL to its end. TRUE on EOS; FALSE on an error, whose message is stored
 * in `message` when given. */
static gboolean
run_pipeline (GstElement *pipeline, char **message)
{
  g_autoptr (GstBus) bus = gst_element_get_bus (pipeline);
  gst_element_set_state (pipeline, GST_STATE_PLAYING);
  g_autoptr (GstMessage) msg
      = gst_bus_timed_pop_filtered (bus, 60 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (msg != NULL, "the pipeline neither ended nor failed within 60 s");
  gboolean eos = GST_MESSAGE_TYPE (msg) == GST_MESSAGE_EOS;
  if (!eos && message != NULL)
    {
      g_autoptr (GError) error = NULL;
      gst_message_parse_error (msg, &error, NULL);
      *message = g_strdup (error->message);
    }
  return eos;
}

/* Writes an audio file: `source` is a gst-launch description producing raw audio, `encoder` the
 * elements that turn it into a file. */
static char *
write_audio (const char *name, const char *source, const char *encoder)
{
  char *path = path_in_work_dir (name);
  g_autofree char *description
      = g_strdup_printf ("%s ! %s ! filesink name=out location=\"%s\"", source, encoder, path);
  g_autoptr (GError) error = NULL;
  g_autoptr (GstElement) pipeline = gst_parse_launch (description, &error);
  fail_unless (pipeline != NULL && error == NULL, "%s", error ? error->message : "");
  fail_unless (run_pipeline (pipeline, NULL), "cannot write %s", path);
  gst_element_set_state (pipeline, GST_STATE_NULL);
  return path;
}

/* Loud sines with high partials: the untrained test codec maps quiet or low audio to the centre
 * code of every channel, so only loud audio tells clips apart. */
#define SOURCE_A                                                                                   \
  "audiotestsrc wave=sine freq=3000 volume=0.9 samplesperbuffer=1050 num-buffers=42 "              \
  "! audio/x-raw, format=S16LE, rate=22050, channels=1"
#define SOURCE_B                                                                                   \
  "audiotestsrc wave=square freq=330 volume=0.9 samplesperbuffer=1050 num-buffers=42 "             \
  "! audio/x-raw, format=S16LE, rate=22050, channels=1"

/* The decode path of the clone pipeline, written out here: mono float at 22050 Hz. */
static GArray *
decode_samples (const char *path)
{
  g_autofree char *description
      = g_strdup_printf ("filesrc location=\"%s\" ! decodebin ! audioconvert ! audioresample ! "
                         "audio/x-raw, format=F32LE, rate=22050, channels=1 ! "
                         "appsink name=sink sync=false wait-on-eos=false",
                         path);
  g_autoptr (GstElement) pipeline = gst_parse_launch (description, NULL);
  g_autoptr (GstElement) sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  fail_unless (run_pipeline (pipeline, NULL));
  GArray *samples = g_array_new (FALSE, FALSE, sizeof (float));
  GstSample *sample;
  while ((sample = gst_app_sink_try_pull_sample (GST_APP_SINK (sink), 0)) != NULL)
    {
      GstMapInfo map;
      fail_unless (gst_buffer_map (gst_sample_get_buffer (sample), &map, GST_MAP_READ));
      g_array_append_vals (samples, map.data, map.size / sizeof (float));
      gst_buffer_unmap (gst_sample_get_buffer (sample), &map);
      gst_sample_unref (sample);
    }
  gst_element_set_state (pipeline, GST_STATE_NULL);
  return samples;
}

/* What gepard-core gives for the decoded samples of `path`, as prefix file bytes. */
static GBytes *
core_prefix (GepardEngine *engine, const char *path)
{
  g_autoptr (GArray) samples = decode_samples (path);
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) voice = gepard_voice_new_from_audio (
      engine, path, (const float *)samples->data, samples->len, &error);
  fail_unless (voice != NULL, "%s", error ? error->message : "");
  return gepard_voice_to_prefix_bytes (voice, NULL);
}

typedef struct
{
  GPtrArray *buffers; /* GstBuffer* */
  GstCaps *caps;
  char *error;
} Output;

static void
output_clear (Output *out)
{
  g_clear_pointer (&out->buffers, g_ptr_array_unref);
  gst_clear_caps (&out->caps);
  g_clear_pointer (&out->error, g_free);
}

static void
collect_output (GstElement *sink, Output *out)
{
  out->buffers = g_ptr_array_new_with_free_func ((GDestroyNotify)gst_buffer_unref);
  GstSample *sample;
  while ((sample = gst_app_sink_try_pull_sample (GST_APP_SINK (sink), 0)) != NULL)
    {
      g_ptr_array_add (out->buffers, gst_buffer_ref (gst_sample_get_buffer (sample)));
      if (out->caps == NULL)
        out->caps = gst_caps_ref (gst_sample_get_caps (sample));
      gst_sample_unref (sample);
    }
}

/* filesrc ! decodebin ! audioconvert ! audioresample ! gepardvoiceenc ! appsink */
static void
run_encoder (const char *path, const char *properties, Output *out)
{
  g_autofree char *description
      = g_strdup_printf ("filesrc location=\"%s\" ! decodebin ! audioconvert ! audioresample ! "
                         "gepardvoiceenc name=enc device=cpu %s ! "
                         "appsink name=sink sync=false wait-on-eos=false",
                         path, properties ? properties : "");
  g_autoptr (GError) error = NULL;
  g_autoptr (GstElement) pipeline = gst_parse_launch (description, &error);
  fail_unless (pipeline != NULL && error == NULL, "%s", error ? error->message : "");
  g_autoptr (GstElement) enc = gst_bin_get_by_name (GST_BIN (pipeline), "enc");
  g_autoptr (GstElement) sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  g_object_set (enc, "model", model_dir, NULL);
  memset (out, 0, sizeof *out);
  if (!run_pipeline (pipeline, &out->error))
    fail_unless (out->error != NULL);
  collect_output (sink, out);
  gst_element_set_state (pipeline, GST_STATE_NULL);
}

static GBytes *
buffer_bytes (GstBuffer *buffer)
{
  GstMapInfo map;
  fail_unless (gst_buffer_map (buffer, &map, GST_MAP_READ));
  GBytes *bytes = g_bytes_new (map.data, map.size);
  gst_buffer_unmap (buffer, &map);
  return bytes;
}

/* Exactly one buffer, of the prefix's size and caps. */
static GBytes *
single_prefix (GepardEngine *engine, Output *out)
{
  fail_unless (out->error == NULL, "the encoder failed: %s", out->error);
  fail_unless_equals_int (out->buffers->len, 1);
  const GepardModelConfig *config = gepard_engine_get_config (engine);
  GstStructure *s = gst_caps_get_structure (out->caps, 0);
  fail_unless (gst_structure_has_name (s, "application/x-gepard-voice"));
  int rows = 0, hidden = 0;
  fail_unless (gst_structure_get_int (s, "rows", &rows));
  fail_unless (gst_structure_get_int (s, "hidden", &hidden));
  fail_unless_equals_int (rows, config->compressor_queries);
  fail_unless_equals_int (hidden, config->hidden_size);
  GBytes *bytes = buffer_bytes (g_ptr_array_index (out->buffers, 0));
  fail_unless_equals_uint64 (g_bytes_get_size (bytes), (guint64)rows * hidden * 4);
  return bytes;
}

static void
assert_bytes_equal (GBytes *a, GBytes *b)
{
  fail_unless_equals_uint64 (g_bytes_get_size (a), g_bytes_get_size (b));
  fail_unless (g_bytes_equal (a, b), "the prefixes differ");
}

static void
assert_voice_bytes (GepardVoice *voice, GBytes *expected)
{
  g_autoptr (GBytes) bytes = gepard_voice_to_prefix_bytes (voice, NULL);
  fail_unless (bytes != NULL);
  assert_bytes_equal (bytes, expected);
}

/* ---- the element ---- */

GST_START_TEST (test_wav_equals_core)
{
  g_autoptr (GepardEngine) engine = get_engine ();
  g_autofree char *wav = write_audio ("a.wav", SOURCE_A, "wavenc");
  g_autofree char *other = write_audio ("b.wav", SOURCE_B, "wavenc");
  Output out;
  run_encoder (wav, NULL, &out);
  g_autoptr (GBytes) prefix = single_prefix (engine, &out);
  output_clear (&out);

  /* 22050 Hz mono on both paths: the element sees exactly the samples decoded here */
  g_autoptr (GBytes) expected = core_prefix (engine, wav);
  assert_bytes_equal (prefix, expected);

  /* and the audio matters */
  run_encoder (other, NULL, &out);
  g_autoptr (GBytes) other_prefix = single_prefix (engine, &out);
  output_clear (&out);
  fail_if (g_bytes_equal (prefix, other_prefix));

  /* the bytes are a prefix file */
  g_autofree char *file = path_in_work_dir ("a.prefix");
  fail_unless (g_file_set_contents (file, g_bytes_get_data (prefix, NULL),
                                    (gssize)g_bytes_get_size (prefix), NULL));
  g_autoptr (GepardVoice) voice
      = gepard_voice_load_prefix_file (file, gepard_engine_get_config (engine), NULL);
  fail_unless (voice != NULL);
  assert_voice_bytes (voice, prefix);
}

GST_END_TEST;

GST_START_TEST (test_resampled_equals_core)
{
  /* 44.1 kHz stereo: audioconvert and audioresample run, deterministically, on both paths */
  g_autoptr (GepardEngine) engine = get_engine ();
  g_autofree char *wav = write_audio (
      "stereo.wav",
      "audiotestsrc wave=sine freq=2500 volume=0.9 samplesperbuffer=2100 num-buffers=42 "
      "! audio/x-raw, format=S16LE, rate=44100, channels=2",
      "wavenc");
  Output out;
  run_encoder (wav, NULL, &out);
  g_autoptr (GBytes) prefix = single_prefix (engine, &out);
  output_clear (&out);
  g_autoptr (GBytes) expected = core_prefix (engine, wav);
  assert_bytes_equal (prefix, expected);
}

GST_END_TEST;

GST_START_TEST (test_flac_and_vorbis)
{
  g_autoptr (GepardEngine) engine = get_engine ();
  g_autofree char *wav = write_audio ("a.wav", SOURCE_A, "wavenc");
  g_autofree char *flac = write_audio ("a.flac", SOURCE_A, "flacenc");
  g_autofree char *ogg = write_audio ("a.ogg", SOURCE_A, "audioconvert ! vorbisenc ! oggmux");
  Output out;
  run_encoder (wav, NULL, &out);
  g_autoptr (GBytes) from_wav = single_prefix (engine, &out);
  output_clear (&out);

  /* FLAC is lossless: the same 16-bit samples, so the same prefix as the WAV */
  run_encoder (flac, NULL, &out);
  g_autoptr (GBytes) from_flac = single_prefix (engine, &out);
  output_clear (&out);
  assert_bytes_equal (from_flac, from_wav);

  /* Vorbis is lossy: its own decoded samples give its prefix */
  run_encoder (ogg, NULL, &out);
  g_autoptr (GBytes) from_ogg = single_prefix (engine, &out);
  output_clear (&out);
  g_autoptr (GBytes) expected = core_prefix (engine, ogg);
  assert_bytes_equal (from_ogg, expected);
  const float *values = g_bytes_get_data (from_ogg, NULL);
  for (gsize i = 0; i < g_bytes_get_size (from_ogg) / 4; i++)
    fail_unless (isfinite (values[i]));
}

GST_END_TEST;

GST_START_TEST (test_too_short)
{
  /* 0.2 s, under the default min-duration of 0.5 s */
  g_autofree char *wav = write_audio ("short.wav",
                                      "audiotestsrc volume=0.9 samplesperbuffer=441 num-buffers=10 "
                                      "! audio/x-raw, format=S16LE, rate=22050, channels=1",
                                      "wavenc");
  Output out;
  run_encoder (wav, NULL, &out);
  fail_unless (out.error != NULL, "a 0.2 s clip was accepted");
  fail_unless (strstr (out.error, "too short") != NULL, "%s", out.error);
  fail_unless (strstr (out.error, "0.20 s") != NULL, "%s", out.error);
  fail_unless_equals_int (out.buffers->len, 0);
  output_clear (&out);

  /* min-duration 0 lets it through to the codec, which still wants one frame */
  g_autofree char *tiny = write_audio ("tiny.wav",
                                       "audiotestsrc volume=0.9 samplesperbuffer=500 num-buffers=1 "
                                       "! audio/x-raw, format=S16LE, rate=22050, channels=1",
                                       "wavenc");
  run_encoder (tiny, "min-duration=0", &out);
  fail_unless (out.error != NULL, "a clip under one frame was accepted");
  fail_unless (strstr (out.error, "500 samples") != NULL, "%s", out.error);
  output_clear (&out);

  /* and a clip just over the limit passes */
  g_autoptr (GepardEngine) engine = get_engine ();
  run_encoder (wav, "min-duration=0.15", &out);
  g_autoptr (GBytes) prefix = single_prefix (engine, &out);
  output_clear (&out);
}

GST_END_TEST;

GST_START_TEST (test_too_long)
{
  g_autofree char *wav = write_audio ("a.wav", SOURCE_A, "wavenc");
  Output out;
  run_encoder (wav, "max-duration=1.0", &out);
  fail_unless (out.error != NULL, "a 2 s clip passed max-duration=1");
  fail_unless (strstr (out.error, "too long") != NULL, "%s", out.error);
  fail_unless (strstr (out.error, "1.00 s") != NULL, "%s", out.error);
  fail_unless_equals_int (out.buffers->len, 0);
  output_clear (&out);
}

GST_END_TEST;

GST_START_TEST (test_properties_and_settings)
{
  g_autoptr (GstElement) enc = gst_element_factory_make ("gepardvoiceenc", NULL);
  fail_unless (enc != NULL);
  g_autofree char *model = NULL, *device = NULL;
  double min_duration = 0, max_duration = 0;
  g_object_get (enc, "model", &model, "device", &device, "min-duration", &min_duration,
                "max-duration", &max_duration, NULL);
  fail_unless (model == NULL);
  fail_unless_equals_string (device, "auto");
  fail_unless_equals_float (min_duration, 0.5);
  fail_unless_equals_float (max_duration, 60.0);
  GParamSpec *spec = g_object_class_find_property (G_OBJECT_GET_CLASS (enc), "max-duration");
  fail_unless (spec->flags & GST_PARAM_MUTABLE_PLAYING);
  spec = g_object_class_find_property (G_OBJECT_GET_CLASS (enc), "model");
  fail_unless (spec->flags & GST_PARAM_MUTABLE_READY);

  /* no model: the default voice (installed or in the source tree) where there is one, else the
     state change fails with a sentence saying what to set */
  g_autoptr (GstBus) bus = gst_bus_new ();
  gst_element_set_bus (enc, bus);
  g_autofree char *default_voice = gepard_hub_default_model ();
  if (default_voice != NULL)
    {
      fail_unless_equals_int (gst_element_set_state (enc, GST_STATE_PAUSED),
                              GST_STATE_CHANGE_SUCCESS);
    }
  else
    {
      fail_unless_equals_int (gst_element_set_state (enc, GST_STATE_PAUSED),
                              GST_STATE_CHANGE_FAILURE);
      g_autoptr (GstMessage) msg = gst_bus_pop_filtered (bus, GST_MESSAGE_ERROR);
      fail_unless (msg != NULL);
      g_autoptr (GError) error = NULL;
      gst_message_parse_error (msg, &error, NULL);
      fail_unless (strstr (error->message, "model property") != NULL, "%s", error->message);
    }
  gst_element_set_state (enc, GST_STATE_NULL);

  /* a model directory that is not there */
  g_object_set (enc, "model", "/no/such/model", "device", "cpu", NULL);
  fail_unless_equals_int (gst_element_set_state (enc, GST_STATE_PAUSED), GST_STATE_CHANGE_FAILURE);
  g_autoptr (GstMessage) msg2 = gst_bus_pop_filtered (bus, GST_MESSAGE_ERROR);
  fail_unless (msg2 != NULL);
  g_autoptr (GError) error2 = NULL;
  gst_message_parse_error (msg2, &error2, NULL);
  fail_unless (strstr (error2->message, "/no/such/model") != NULL, "%s", error2->message);
  gst_element_set_state (enc, GST_STATE_NULL);
  gst_element_set_bus (enc, NULL);
}

GST_END_TEST;

GST_START_TEST (test_clone_pipeline)
{
  /* the server's description, fed the file's bytes through its appsrc */
  g_autoptr (GepardEngine) engine = get_engine ();
  g_autofree char *wav = write_audio ("a.wav", SOURCE_A, "wavenc");
  g_autofree char *clone_txt
      = g_build_filename (g_getenv ("GEPARD_SOURCE_DIR"), "pipelines", "clone.txt", NULL);
  g_autofree char *description = NULL;
  fail_unless (g_file_get_contents (clone_txt, &description, NULL, NULL));
  g_autoptr (GError) error = NULL;
  g_autoptr (GstElement) pipeline = gst_parse_launch (description, &error);
  fail_unless (pipeline != NULL && error == NULL, "%s", error ? error->message : "");
  g_autoptr (GstElement) src = gst_bin_get_by_name (GST_BIN (pipeline), "clip");
  g_autoptr (GstElement) enc = gst_bin_get_by_name (GST_BIN (pipeline), "encoder");
  g_autoptr (GstElement) sink = gst_bin_get_by_name (GST_BIN (pipeline), "prefix");
  fail_unless (src != NULL && enc != NULL && sink != NULL);
  g_object_set (enc, "model", model_dir, "device", "cpu", NULL);
  /* the server pulls as buffers come; here everything is read after the end */
  g_object_set (sink, "wait-on-eos", FALSE, NULL);

  char *data = NULL;
  gsize size = 0;
  fail_unless (g_file_get_contents (wav, &data, &size, NULL));
  gst_element_set_state (pipeline, GST_STATE_PLAYING);
  /* in pieces, as an upload arrives */
  gsize half = size / 2;
  fail_unless_equals_int (
      gst_app_src_push_buffer (GST_APP_SRC (src), gst_buffer_new_memdup (data, half)), GST_FLOW_OK);
  fail_unless_equals_int (
      gst_app_src_push_buffer (GST_APP_SRC (src), gst_buffer_new_memdup (data + half, size - half)),
      GST_FLOW_OK);
  g_free (data);
  gst_app_src_end_of_stream (GST_APP_SRC (src));

  g_autoptr (GstBus) bus = gst_element_get_bus (pipeline);
  g_autoptr (GstMessage) msg
      = gst_bus_timed_pop_filtered (bus, 60 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (msg != NULL && GST_MESSAGE_TYPE (msg) == GST_MESSAGE_EOS);
  Output out = {0};
  collect_output (sink, &out);
  gst_element_set_state (pipeline, GST_STATE_NULL);
  g_autoptr (GBytes) prefix = single_prefix (engine, &out);
  output_clear (&out);
  g_autoptr (GBytes) expected = core_prefix (engine, wav);
  assert_bytes_equal (prefix, expected);
}

GST_END_TEST;

/* ---- gst_gepard_voice_load ---- */

GST_START_TEST (test_load_default_and_registered)
{
  VoiceLoadFunc load = voice_load_func ();
  g_autoptr (GepardEngine) engine = get_engine ();
  const char *defaults[] = {NULL, "", "default"};
  for (guint i = 0; i < G_N_ELEMENTS (defaults); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (GepardVoice) voice = load (engine, defaults[i], &error);
      fail_unless (voice != NULL && error == NULL);
      int rows = -1;
      fail_unless (gepard_voice_get_prefix (voice, &rows) == NULL);
      fail_unless_equals_int (rows, 0);
      fail_unless_equals_string (gepard_voice_get_id (voice), "default");
    }

  const GepardModelConfig *config = gepard_engine_get_config (engine);
  g_autofree float *values = g_new0 (float, prefix_size (engine) / 4);
  values[3] = 0.25f;
  g_autoptr (GepardVoice) registered
      = gepard_voice_new ("8d0f6e52-1c1e-4a57-a2b2-5d1f0f9d7c11", values,
                          config->compressor_queries, config->hidden_size);
  gepard_engine_add_voice (engine, registered);
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) found = load (engine, "8d0f6e52-1c1e-4a57-a2b2-5d1f0f9d7c11", &error);
  fail_unless (found == registered);
  gepard_engine_remove_voice (engine, "8d0f6e52-1c1e-4a57-a2b2-5d1f0f9d7c11");
}

GST_END_TEST;

GST_START_TEST (test_load_files)
{
  VoiceLoadFunc load = voice_load_func ();
  g_autoptr (GepardEngine) engine = get_engine ();
  g_autofree char *wav = write_audio ("a.wav", SOURCE_A, "wavenc");
  g_autofree char *flac = write_audio ("a.flac", SOURCE_A, "flacenc");
  Output out;
  run_encoder (wav, NULL, &out);
  g_autoptr (GBytes) prefix = single_prefix (engine, &out);
  output_clear (&out);

  /* a clip: decoded as the clone pipeline decodes it, so the element's prefix */
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) from_wav = load (engine, wav, &error);
  fail_unless (from_wav != NULL, "%s", error ? error->message : "");
  fail_unless_equals_string (gepard_voice_get_id (from_wav), wav);
  assert_voice_bytes (from_wav, prefix);
  g_autoptr (GepardVoice) from_flac = load (engine, flac, &error);
  fail_unless (from_flac != NULL, "%s", error ? error->message : "");
  fail_unless_equals_string (gepard_voice_get_id (from_flac), flac);
  assert_voice_bytes (from_flac, prefix);

  /* a prefix file */
  g_autofree char *file = path_in_work_dir ("voice.prefix");
  fail_unless (g_file_set_contents (file, g_bytes_get_data (prefix, NULL),
                                    (gssize)g_bytes_get_size (prefix), NULL));
  g_autoptr (GepardVoice) from_file = load (engine, file, &error);
  fail_unless (from_file != NULL, "%s", error ? error->message : "");
  fail_unless_equals_string (gepard_voice_get_id (from_file), file);
  assert_voice_bytes (from_file, prefix);

  /* a file of a prefix's size is read as one, so a broken value is the prefix reader's error */
  g_autofree guint8 *bad = g_memdup2 (g_bytes_get_data (prefix, NULL), g_bytes_get_size (prefix));
  guint32 nan = GUINT32_TO_LE (0x7fc00000u);
  memcpy (bad + 8, &nan, 4);
  g_autofree char *bad_file = path_in_work_dir ("nan.prefix");
  fail_unless (
      g_file_set_contents (bad_file, (const char *)bad, (gssize)prefix_size (engine), NULL));
  fail_unless (load (engine, bad_file, &error) == NULL);
  fail_unless (g_error_matches (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT), "%s",
               error->message);
  g_clear_error (&error);

  /* unless it starts like an audio container: then it is decoded, and this one is no clip */
  memcpy (bad, "RIFF", 4);
  g_autofree char *riff = path_in_work_dir ("riff.bin");
  fail_unless (g_file_set_contents (riff, (const char *)bad, (gssize)prefix_size (engine), NULL));
  fail_unless (load (engine, riff, &error) == NULL);
  fail_if (error->domain == GEPARD_FORMAT_ERROR, "%s", error->message);
  fail_unless (strstr (error->message, riff) != NULL, "%s", error->message);
  g_clear_error (&error);
}

GST_END_TEST;

GST_START_TEST (test_load_refused)
{
  VoiceLoadFunc load = voice_load_func ();
  g_autoptr (GepardEngine) engine = get_engine ();
  g_autoptr (GError) error = NULL;

  /* neither default, nor a known id, nor a file */
  const char *garbage[] = {"no-such-voice", "/no/such/clip.wav", "0a1b2c3d-0000-0000-0000-0"};
  for (guint i = 0; i < G_N_ELEMENTS (garbage); i++)
    {
      fail_unless (load (engine, garbage[i], &error) == NULL);
      fail_unless (g_error_matches (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_NOT_FOUND));
      fail_unless (strstr (error->message, garbage[i]) != NULL, "%s", error->message);
      fail_unless (strstr (error->message, "default") != NULL, "%s", error->message);
      fail_unless (strstr (error->message, "registered") != NULL, "%s", error->message);
      fail_unless (strstr (error->message, "prefix file") != NULL, "%s", error->message);
      g_clear_error (&error);
    }
  fail_unless (load (engine, work_dir, &error) == NULL);
  fail_unless (g_error_matches (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_NOT_FOUND));
  g_clear_error (&error);

  /* a file that is not audio */
  g_autofree char *text = path_in_work_dir ("notes.txt");
  fail_unless (g_file_set_contents (text, "hello, this is not a recording\n", -1, NULL));
  fail_unless (load (engine, text, &error) == NULL);
  fail_unless (strstr (error->message, "Cannot decode") != NULL, "%s", error->message);
  g_clear_error (&error);

  /* a clip over a minute */
  g_autofree char *long_wav
      = write_audio ("long.wav",
                     "audiotestsrc volume=0.5 samplesperbuffer=22050 num-buffers=61 "
                     "! audio/x-raw, format=S16LE, rate=22050, channels=1",
                     "wavenc");
  fail_unless (load (engine, long_wav, &error) == NULL);
  fail_unless (g_error_matches (error, GST_STREAM_ERROR, GST_STREAM_ERROR_FORMAT), "%s",
               error->message);
  fail_unless (strstr (error->message, "longer than 60 s") != NULL, "%s", error->message);
  g_clear_error (&error);

  /* a clip under one frame */
  g_autofree char *tiny = write_audio ("tiny.wav",
                                       "audiotestsrc volume=0.9 samplesperbuffer=500 num-buffers=1 "
                                       "! audio/x-raw, format=S16LE, rate=22050, channels=1",
                                       "wavenc");
  fail_unless (load (engine, tiny, &error) == NULL);
  fail_unless (g_error_matches (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT),
               "%s", error->message);
}

GST_END_TEST;

static Suite *
gepardvoiceenc_suite (void)
{
  Suite *s = suite_create ("gepardvoiceenc");
  TCase *tc = tcase_create ("general");
  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_wav_equals_core);
  tcase_add_test (tc, test_resampled_equals_core);
  tcase_add_test (tc, test_flac_and_vorbis);
  tcase_add_test (tc, test_too_short);
  tcase_add_test (tc, test_too_long);
  tcase_add_test (tc, test_properties_and_settings);
  tcase_add_test (tc, test_clone_pipeline);
  tcase_add_test (tc, test_load_default_and_registered);
  tcase_add_test (tc, test_load_files);
  tcase_add_test (tc, test_load_refused);
  return s;
}

int
main (int argc, char **argv)
{
  gst_check_init (&argc, &argv);
  work_dir = g_dir_make_tmp ("gepardvoiceenc-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  /* seed 2: a tiny codec whose encoder reaches codes off the centre for loud audio */
  gepard_test_make_model ("--preset tiny --seed 2", model_dir);

  int failed = gst_check_run_suite (gepardvoiceenc_suite (), "gepardvoiceenc", __FILE__);

  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (model_dir);
  g_free (work_dir);
  return failed;
}
