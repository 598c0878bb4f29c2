/* Text to a WAV file through the pipeline description the project ships (pipelines/tts-wav.txt),
 * the way an application runs it, and through gst-launch-1.0 the way a user types it: the run
 * reaches EOS without an error, and the file is a valid 16 kHz WAV holding every generated frame's
 * audio. */
#include "gepard-test-model.h"
#include "gstgepardcontext.h"

#include <gst/check/gstcheck.h>

#include <stdlib.h>
#include <string.h>

static char *work_dir;
static char *model_dir;

#define MAX_FRAMES 30

typedef struct
{
  guint16 format;
  guint16 channels;
  guint32 rate;
  guint16 bits;
  gsize data_bytes;
} Wav;

static guint32
le32 (const guint8 *p)
{
  return p[0] | p[1] << 8 | p[2] << 16 | (guint32)p[3] << 24;
}

static guint16
le16 (const guint8 *p)
{
  return p[0] | p[1] << 8;
}

/* A RIFF/WAVE file whose sizes agree with its length, walked chunk by chunk. */
static void
read_wav (const char *path, Wav *wav)
{
  g_autofree guint8 *data = NULL;
  gsize length = 0;
  fail_unless (g_file_get_contents (path, (char **)&data, &length, NULL), "no %s", path);
  fail_unless (length >= 44, "%s has %" G_GSIZE_FORMAT " bytes", path, length);
  fail_unless (memcmp (data, "RIFF", 4) == 0 && memcmp (data + 8, "WAVE", 4) == 0);
  /* wavenc rewrites the header at EOS: no placeholder sizes left (gstreamer-notes.md §5.16) */
  fail_unless_equals_uint64 (le32 (data + 4), length - 8);

  memset (wav, 0, sizeof *wav);
  gboolean have_fmt = FALSE, have_data = FALSE;
  gsize at = 12;
  while (at + 8 <= length)
    {
      guint32 size = le32 (data + at + 4);
      fail_unless (at + 8 + size <= length, "a chunk runs past the end of the file");
      if (memcmp (data + at, "fmt ", 4) == 0)
        {
          fail_unless (size >= 16);
          wav->format = le16 (data + at + 8);
          wav->channels = le16 (data + at + 10);
          wav->rate = le32 (data + at + 12);
          wav->bits = le16 (data + at + 22);
          have_fmt = TRUE;
        }
      else if (memcmp (data + at, "data", 4) == 0)
        {
          wav->data_bytes = size;
          have_data = TRUE;
        }
      at += 8 + size + (size & 1);
    }
  fail_unless (have_fmt && have_data);
}

/* Frames × 1024 samples at 22050 Hz, resampled to `rate`, within 1 %. */
static void
check_wav_rate (const char *path, guint64 frames, int rate)
{
  Wav wav;
  read_wav (path, &wav);
  fail_unless_equals_int (wav.format, 1); /* PCM */
  fail_unless_equals_int (wav.channels, 1);
  fail_unless_equals_int (wav.rate, rate);
  fail_unless_equals_int (wav.bits, 16);
  fail_unless (frames > 0);
  double expected = frames * 1024.0 * rate / 22050.0;
  double samples = wav.data_bytes / 2.0;
  fail_unless (samples >= expected * 0.99 && samples <= expected * 1.01,
               "%.0f samples for %" G_GUINT64_FORMAT " frames (expected %.0f)", samples, frames,
               expected);
}

static void
check_wav (const char *path, guint64 frames)
{
  check_wav_rate (path, frames, 16000);
}

/* The shipped description, with the values a run needs set on its named elements. */
static GstElement *
tts_wav_pipeline (const char *output)
{
  g_autofree char *path
      = g_build_filename (g_getenv ("GEPARD_SOURCE_DIR"), "pipelines", "tts-wav.txt", NULL);
  g_autofree char *description = NULL;
  fail_unless (g_file_get_contents (path, &description, NULL, NULL));
  GError *error = NULL;
  GstElement *pipeline = gst_parse_launch (g_strstrip (description), &error);
  fail_unless (pipeline != NULL && error == NULL, "%s: %s", path, error ? error->message : "");

  const char *named[] = {"text", "lm", "codec", "format", "sink"};
  for (guint i = 0; i < G_N_ELEMENTS (named); i++)
    {
      GstElement *element = gst_bin_get_by_name (GST_BIN (pipeline), named[i]);
      fail_unless (element != NULL, "%s has no element named %s", path, named[i]);
      if (g_str_equal (named[i], "lm"))
        g_object_set (element, "model", model_dir, "device", "cpu", "max-frames", MAX_FRAMES, NULL);
      else if (g_str_equal (named[i], "codec"))
        g_object_set (element, "model", model_dir, "device", "cpu", NULL);
      else if (g_str_equal (named[i], "sink"))
        g_object_set (element, "location", output, NULL);
      gst_object_unref (element);
    }
  return pipeline;
}

/* Runs to EOS (failing on an error or a minute without one); returns gepardlm's frame count. */
static guint64
run_to_eos (GstElement *pipeline)
{
  GstBus *bus = gst_element_get_bus (pipeline);
  GstMessage *message
      = gst_bus_timed_pop_filtered (bus, 60 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (message != NULL, "no EOS within a minute");
  if (GST_MESSAGE_TYPE (message) == GST_MESSAGE_ERROR)
    {
      GError *error = NULL;
      gst_message_parse_error (message, &error, NULL);
      fail ("error from %s: %s", GST_OBJECT_NAME (GST_MESSAGE_SRC (message)), error->message);
    }
  gst_message_unref (message);

  guint64 frames = 0;
  GstElement *lm = gst_bin_get_by_name (GST_BIN (pipeline), "lm");
  g_object_get (lm, "frames", &frames, NULL);
  gst_object_unref (lm);
  fail_unless_equals_int (gst_element_set_state (pipeline, GST_STATE_NULL),
                          GST_STATE_CHANGE_SUCCESS);
  /* nothing went wrong on the way down either */
  message = gst_bus_pop_filtered (bus, GST_MESSAGE_ERROR);
  fail_unless (message == NULL);
  gst_object_unref (bus);
  return frames;
}

GST_START_TEST (test_text_property)
{
  g_autofree char *output = g_build_filename (work_dir, "text-property.wav", NULL);
  GstElement *pipeline = tts_wav_pipeline (output);
  GstElement *text = gst_bin_get_by_name (GST_BIN (pipeline), "text");
  g_object_set (text, "text", "Hello there. This is Gepard.", NULL);
  gst_object_unref (text);

  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  guint64 frames = run_to_eos (pipeline);
  /* two sentences, each bounded by max-frames */
  fail_unless (frames <= 2 * MAX_FRAMES, "%" G_GUINT64_FORMAT " frames", frames);
  check_wav (output, frames);
  gst_object_unref (pipeline);
}
GST_END_TEST;

/* Any output rate through audioresample: 48 kHz from the same description, its format
 * capsfilter changed */
GST_START_TEST (test_48khz)
{
  g_autofree char *output = g_build_filename (work_dir, "48khz.wav", NULL);
  GstElement *pipeline = tts_wav_pipeline (output);
  GstElement *text = gst_bin_get_by_name (GST_BIN (pipeline), "text");
  GstElement *format = gst_bin_get_by_name (GST_BIN (pipeline), "format");
  g_object_set (text, "text", "Forty-eight kilohertz, please.", NULL);
  GstCaps *caps = gst_caps_from_string ("audio/x-raw, format=S16LE, rate=48000, channels=1");
  g_object_set (format, "caps", caps, NULL);
  gst_caps_unref (caps);
  gst_object_unref (text);
  gst_object_unref (format);

  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  guint64 frames = run_to_eos (pipeline);
  fail_unless (frames <= MAX_FRAMES, "%" G_GUINT64_FORMAT " frames", frames);
  check_wav_rate (output, frames, 48000);
  gst_object_unref (pipeline);
}
GST_END_TEST;

/* Whether the shared engines come down to `count` within a few seconds: the engine's own
 * scheduler thread may drop the last reference (that of an ended utterance it still lists) just
 * after the elements have let go of theirs. */
static gboolean
wait_shared_engines (guint count)
{
  gint64 deadline = g_get_monotonic_time () + 5 * G_TIME_SPAN_SECOND;
  while (gepard_engine_count_shared () != count && g_get_monotonic_time () < deadline)
    g_usleep (2000);
  return gepard_engine_count_shared () == count;
}

/* Two pipelines of one process share one engine: the weights are loaded once. */
GST_START_TEST (test_two_pipelines_one_engine)
{
  g_autofree char *out_a = g_build_filename (work_dir, "shared-a.wav", NULL);
  g_autofree char *out_b = g_build_filename (work_dir, "shared-b.wav", NULL);
  GstElement *a = tts_wav_pipeline (out_a);
  GstElement *b = tts_wav_pipeline (out_b);
  GstElement *text_a = gst_bin_get_by_name (GST_BIN (a), "text");
  GstElement *text_b = gst_bin_get_by_name (GST_BIN (b), "text");

  guint before = gepard_engine_count_shared ();
  fail_if (gst_element_set_state (a, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  fail_if (gst_element_set_state (b, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  /* both pipelines are running and hold the engine (their turns are still open) */
  fail_unless_equals_int (gepard_engine_count_shared (), before + 1);

  gboolean ok = FALSE;
  g_signal_emit_by_name (text_a, "push-text", "The first pipeline speaks.", &ok);
  g_signal_emit_by_name (text_a, "end-of-text", &ok);
  g_signal_emit_by_name (text_b, "push-text", "The second one too.", &ok);
  g_signal_emit_by_name (text_b, "end-of-text", &ok);
  gst_object_unref (text_a);
  gst_object_unref (text_b);
  check_wav (out_a, run_to_eos (a));
  check_wav (out_b, run_to_eos (b));
  gst_object_unref (a);
  gst_object_unref (b);
  /* and released with the last element that held it (or the last utterance, just after) */
  fail_unless (wait_shared_engines (before), "%u shared engines", gepard_engine_count_shared ());
}
GST_END_TEST;

GST_START_TEST (test_push_text)
{
  /* the application feeds the turn from its own thread, as the server does */
  g_autofree char *output = g_build_filename (work_dir, "push-text.wav", NULL);
  GstElement *pipeline = tts_wav_pipeline (output);
  GstElement *text = gst_bin_get_by_name (GST_BIN (pipeline), "text");

  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  const char *pieces[] = {"Hello there. ", "This is ", "Gepard."};
  for (guint i = 0; i < G_N_ELEMENTS (pieces); i++)
    {
      gboolean accepted = FALSE;
      g_signal_emit_by_name (text, "push-text", pieces[i], &accepted);
      fail_unless (accepted);
    }
  gboolean ended = FALSE;
  g_signal_emit_by_name (text, "end-of-text", &ended);
  fail_unless (ended);
  gst_object_unref (text);

  guint64 frames = run_to_eos (pipeline);
  fail_unless (frames <= 2 * MAX_FRAMES, "%" G_GUINT64_FORMAT " frames", frames);
  check_wav (output, frames);
  gst_object_unref (pipeline);
}
GST_END_TEST;

/* The shipped description with nothing but the text and file set: the engine comes from the
 * application through a GstContext. */
static GstElement *
bare_pipeline (const char *output, const char *text)
{
  g_autofree char *path
      = g_build_filename (g_getenv ("GEPARD_SOURCE_DIR"), "pipelines", "tts-wav.txt", NULL);
  g_autofree char *description = NULL;
  fail_unless (g_file_get_contents (path, &description, NULL, NULL));
  GstElement *pipeline = gst_parse_launch (g_strstrip (description), NULL);
  fail_unless (pipeline != NULL);
  GstElement *sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  GstElement *lm = gst_bin_get_by_name (GST_BIN (pipeline), "lm");
  GstElement *src = gst_bin_get_by_name (GST_BIN (pipeline), "text");
  g_object_set (sink, "location", output, NULL);
  g_object_set (lm, "max-frames", MAX_FRAMES, NULL);
  g_object_set (src, "text", text, NULL);
  gst_object_unref (sink);
  gst_object_unref (lm);
  gst_object_unref (src);
  return pipeline;
}

/* An application's own engine, set on the pipeline before its first state change, serves every
 * element: no model property, no engine of the process-wide registry loaded, and the frames were
 * generated and decoded by that engine. */
GST_START_TEST (test_application_engine)
{
  g_autofree char *output = g_build_filename (work_dir, "app-engine.wav", NULL);
  GError *error = NULL;
  GepardEngine *engine = gepard_engine_new (model_dir, "cpu", NULL, &error);
  fail_unless (engine != NULL);
  GstElement *pipeline = bare_pipeline (output, "An engine of my own.");
  GstContext *context = gst_gepard_engine_context_new (engine);
  gst_element_set_context (pipeline, context);
  gst_context_unref (context);

  guint before = gepard_engine_count_shared ();
  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  guint64 frames = run_to_eos (pipeline);
  fail_unless_equals_int (gepard_engine_count_shared (), before);
  check_wav (output, frames);

  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  fail_unless_equals_uint64 (stats.frames, frames);
  fail_unless_equals_uint64 (stats.decoded_frames, frames);
  gst_object_unref (pipeline);
  gepard_engine_unref (engine);
}
GST_END_TEST;

static int need_context_answers;

/* The application's synchronous bus handler answers NEED_CONTEXT with its engine. */
static GstBusSyncReply
answer_need_context (GstBus *bus, GstMessage *message, gpointer user_data)
{
  const char *type;
  if (GST_MESSAGE_TYPE (message) == GST_MESSAGE_NEED_CONTEXT
      && gst_message_parse_context_type (message, &type)
      && g_str_equal (type, GST_GEPARD_ENGINE_CONTEXT_TYPE))
    {
      GstContext *context = gst_gepard_engine_context_new (user_data);
      gst_element_set_context (GST_ELEMENT (GST_MESSAGE_SRC (message)), context);
      gst_context_unref (context);
      need_context_answers++;
    }
  return GST_BUS_PASS;
}

GST_START_TEST (test_need_context_handler)
{
  g_autofree char *output = g_build_filename (work_dir, "need-context.wav", NULL);
  GepardEngine *engine = gepard_engine_new (model_dir, "cpu", NULL, NULL);
  fail_unless (engine != NULL);
  GstElement *pipeline = bare_pipeline (output, "Asked for on the bus.");
  GstBus *bus = gst_element_get_bus (pipeline);
  gst_bus_set_sync_handler (bus, answer_need_context, engine, NULL);
  gst_object_unref (bus);

  need_context_answers = 0;
  guint before = gepard_engine_count_shared ();
  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  guint64 frames = run_to_eos (pipeline);
  fail_unless_equals_int (gepard_engine_count_shared (), before);
  check_wav (output, frames);
  /* gepardcodec asked first (it starts first, downstream); gepardlm then got the engine from
   * the bin's cache of the context set on gepardcodec, or asked too */
  fail_unless (need_context_answers >= 1);
  GepardEngineStats stats;
  gepard_engine_get_stats (engine, &stats);
  fail_unless_equals_uint64 (stats.frames, frames);
  gst_object_unref (pipeline);
  gepard_engine_unref (engine);
}
GST_END_TEST;

static GstPadProbeReturn
count_discont (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  if (GST_BUFFER_IS_DISCONT (GST_PAD_PROBE_INFO_BUFFER (info)))
    (*(int *)user_data)++;
  return GST_PAD_PROBE_OK;
}

/* Each sentence is an utterance of its own: its audio starts with DISCONT (and a decoder state
 * from zero); the timeline runs on without a gap. */
GST_START_TEST (test_discont_per_utterance)
{
  g_autofree char *output = g_build_filename (work_dir, "discont.wav", NULL);
  GstElement *pipeline = tts_wav_pipeline (output);
  GstElement *text = gst_bin_get_by_name (GST_BIN (pipeline), "text");
  GstElement *codec = gst_bin_get_by_name (GST_BIN (pipeline), "codec");
  g_object_set (text, "text", "One sentence. Another sentence. A third one.", NULL);
  GstPad *src = gst_element_get_static_pad (codec, "src");
  int disconts = 0;
  gst_pad_add_probe (src, GST_PAD_PROBE_TYPE_BUFFER, count_discont, &disconts, NULL);
  gst_object_unref (src);
  gst_object_unref (codec);
  gst_object_unref (text);

  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  guint64 frames = run_to_eos (pipeline);
  fail_unless_equals_int (disconts, 3);
  check_wav (output, frames);
  gst_object_unref (pipeline);
}
GST_END_TEST;

GST_START_TEST (test_gst_launch)
{
  /* the command line a user types (gepardcodec takes the codec of gepardlm's engine); gepardlm
   * reports nothing to the shell, so the file's length is checked against the bound */
  g_autofree char *output = g_build_filename (work_dir, "launch.wav", NULL);
  g_autofree char *model = g_strdup_printf ("model=%s", model_dir);
  g_autofree char *location = g_strdup_printf ("location=%s", output);
  char *argv[] = {"gst-launch-1.0",
                  "-q",
                  "gepardtextsrc",
                  "text=Hello there. This is Gepard.",
                  "!",
                  "gepardlm",
                  model,
                  "device=cpu",
                  "max-frames=" G_STRINGIFY (MAX_FRAMES),
                  "!",
                  "gepardcodec",
                  "!",
                  "audioconvert",
                  "!",
                  "audioresample",
                  "!",
                  "audio/x-raw,rate=16000,format=S16LE",
                  "!",
                  "wavenc",
                  "!",
                  "filesink",
                  location,
                  NULL};
  char *err = NULL;
  int status = 0;
  fail_unless (g_spawn_sync (NULL, argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL,
                             NULL, NULL, NULL, &err, &status, NULL));
  fail_unless (g_spawn_check_wait_status (status, NULL), "gst-launch-1.0 failed: %s", err);
  g_free (err);

  Wav wav;
  read_wav (output, &wav);
  fail_unless_equals_int (wav.rate, 16000);
  fail_unless_equals_int (wav.bits, 16);
  fail_unless_equals_int (wav.channels, 1);
  /* whole frames, at most two sentences of MAX_FRAMES */
  double frames = wav.data_bytes / 2.0 * 22050.0 / 16000.0 / 1024.0;
  fail_unless (frames >= 0.99 && frames <= 2 * MAX_FRAMES * 1.01, "%.2f frames", frames);
}
GST_END_TEST;

GST_START_TEST (test_elements_registered)
{
  /* gst-inspect-1.0 finds every element of the pipeline in the test's registry */
  const char *names[] = {"gepardtextsrc", "gepardlm", "gepardcodec"};
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      char *argv[] = {"gst-inspect-1.0", (char *)names[i], NULL};
      int status = 0;
      fail_unless (g_spawn_sync (NULL, argv, NULL,
                                 G_SPAWN_SEARCH_PATH | G_SPAWN_STDOUT_TO_DEV_NULL
                                     | G_SPAWN_STDERR_TO_DEV_NULL,
                                 NULL, NULL, NULL, NULL, &status, NULL));
      fail_unless (g_spawn_check_wait_status (status, NULL), "gst-inspect-1.0 %s failed", names[i]);
    }
}
GST_END_TEST;

static Suite *
pipeline_suite (void)
{
  Suite *s = suite_create ("pipeline");
  TCase *tc = tcase_create ("general");
  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_elements_registered);
  tcase_add_test (tc, test_text_property);
  tcase_add_test (tc, test_push_text);
  tcase_add_test (tc, test_48khz);
  tcase_add_test (tc, test_two_pipelines_one_engine);
  tcase_add_test (tc, test_application_engine);
  tcase_add_test (tc, test_need_context_handler);
  tcase_add_test (tc, test_discont_per_utterance);
  tcase_add_test (tc, test_gst_launch);
  return s;
}

int
main (int argc, char **argv)
{
  gst_check_init (&argc, &argv);

  work_dir = g_dir_make_tmp ("gepard-pipeline-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 7", model_dir);

  int failed = gst_check_run_suite (pipeline_suite (), "pipeline", __FILE__);

  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (model_dir);
  g_free (work_dir);
  return failed;
}
