/* gepardcodec: each frame decodes at once into 1024 samples equal, bit for bit, to a one-shot
 * decode of the whole stream; timestamps come from the sample counter and never drift; a flush or
 * a discontinuity starts the decoder afresh; bad codes and a missing codec are element errors a
 * user can act on. */
#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

#include <glib/gstdio.h>

#include "gepard-codec.h"
#include "gepard-test-model.h"

#include <stdlib.h>
#include <string.h>

#define CODES_CAPS "audio/x-gepard-codes, channels = (int) 32, framerate = (fraction) 22050/1024"
#define AUDIO_CAPS                                                                                 \
  "audio/x-raw, format = (string) F32LE, rate = (int) 22050, channels = (int) 1, layout = "        \
  "(string) interleaved"
#define CHANNELS 32
#define FRAME_SAMPLES 1024

static char *work_dir;
static char *codec_path; /* a NanoCodec file alone */
static char *model_dir;  /* a model with its codec beside it */
static char *bare_dir;   /* a model without one */

static const int levels[4] = {8, 7, 6, 6};

static GstClockTime
sample_pts (guint64 n)
{
  return gst_util_uint64_scale_int_round (n, GST_SECOND, 22050);
}

/* n frames of valid codes, reproducible from `seed` */
static gint32 *
random_codes (guint32 seed, int n_frames)
{
  GRand *rand = g_rand_new_with_seed (seed);
  gint32 *codes = g_new (gint32, n_frames * CHANNELS);
  for (int i = 0; i < n_frames * CHANNELS; i++)
    codes[i] = g_rand_int_range (rand, 0, levels[i % CHANNELS % 4]);
  g_rand_free (rand);
  return codes;
}

static GstHarness *
codec_harness (const char *property, const char *value)
{
  GstElement *codec = gst_element_factory_make ("gepardcodec", NULL);
  fail_unless (codec != NULL);
  g_object_set (codec, "device", "cpu", property, value, NULL);
  GstHarness *h = gst_harness_new_with_element (codec, "sink", "src");
  gst_object_unref (codec);
  gst_harness_set_src_caps_str (h, CODES_CAPS);
  return h;
}

/* one buffer per frame, timestamped like gepardlm's output unless `pts` is given */
static GstBuffer *
frame_buffer (const gint32 *codes, GstClockTime pts)
{
  GstBuffer *buffer = gst_buffer_new_memdup (codes, CHANNELS * sizeof (gint32));
  GST_BUFFER_PTS (buffer) = pts;
  return buffer;
}

static GstClockTime
lm_pts (guint64 frame)
{
  return sample_pts (frame * FRAME_SAMPLES);
}

/* Pulls n_frames buffers: 1024 samples each in [-1, 1], on the sample-counter timeline from
 * `first_sample`, the first one marked DISCONT when `discont`; their samples go to `samples`. */
static void
pull_audio (GstHarness *h, int n_frames, guint64 first_sample, gboolean discont, float *samples)
{
  for (int k = 0; k < n_frames; k++)
    {
      GstBuffer *buffer = gst_harness_pull (h);
      fail_unless (buffer != NULL);
      fail_unless_equals_int (gst_buffer_get_size (buffer), FRAME_SAMPLES * sizeof (float));
      float *frame = samples + (gsize)k * FRAME_SAMPLES;
      gst_buffer_extract (buffer, 0, frame, FRAME_SAMPLES * sizeof (float));
      for (int i = 0; i < FRAME_SAMPLES; i++)
        fail_unless (frame[i] >= -1.0f && frame[i] <= 1.0f, "sample %g", frame[i]);

      /* gstreamer-notes.md §5 item 11: pts of sample N is round(N·10⁹/22050), exactly */
      guint64 n = first_sample + (guint64)k * FRAME_SAMPLES;
      fail_unless_equals_uint64 (GST_BUFFER_PTS (buffer), sample_pts (n));
      fail_unless_equals_uint64 (GST_BUFFER_DURATION (buffer),
                                 sample_pts (n + FRAME_SAMPLES) - sample_pts (n));
      fail_unless_equals_uint64 (GST_BUFFER_OFFSET (buffer), n);
      fail_unless_equals_uint64 (GST_BUFFER_OFFSET_END (buffer), n + FRAME_SAMPLES);
      fail_unless_equals_int (GST_BUFFER_FLAG_IS_SET (buffer, GST_BUFFER_FLAG_DISCONT),
                              discont && k == 0);
      gst_buffer_unref (buffer);
    }
}

static float *
one_shot (const char *path, const gint32 *codes, int n_frames)
{
  GError *error = NULL;
  GepardCodec *codec = gepard_codec_new (path, &error);
  fail_unless (codec != NULL);
  float *samples = g_new (float, (gsize)n_frames *FRAME_SAMPLES);
  fail_unless (gepard_codec_decode (codec, codes, n_frames, samples, &error));
  gepard_codec_free (codec);
  return samples;
}

#define N_FRAMES 100

GST_START_TEST (test_streamed_equals_one_shot)
{
  g_autofree gint32 *codes = random_codes (1, N_FRAMES);
  g_autofree float *expected = one_shot (codec_path, codes, N_FRAMES);
  g_autofree float *samples = g_new (float, N_FRAMES *FRAME_SAMPLES);

  GstHarness *h = codec_harness ("codec", codec_path);
  for (int k = 0; k < N_FRAMES; k++)
    {
      fail_unless_equals_int (gst_harness_push (h, frame_buffer (codes + k * CHANNELS, lm_pts (k))),
                              GST_FLOW_OK);
      /* each frame's audio is out before the next frame comes in */
      fail_unless_equals_int (gst_harness_buffers_in_queue (h), 1);
      pull_audio (h, 1, (guint64)k * FRAME_SAMPLES, k == 0, samples + k * FRAME_SAMPLES);
    }
  fail_unless (memcmp (samples, expected, sizeof (float) * N_FRAMES * FRAME_SAMPLES) == 0);

  GstCaps *caps = gst_pad_get_current_caps (h->sinkpad);
  GstCaps *want = gst_caps_from_string (AUDIO_CAPS);
  fail_unless (gst_caps_is_equal (caps, want));
  gst_caps_unref (caps);
  gst_caps_unref (want);
  gst_harness_teardown (h);
}
GST_END_TEST;

GST_START_TEST (test_timestamps_do_not_follow_input)
{
  /* input stamped at whole milliseconds (drifting 0.44 ms a frame), and input with none at all:
   * the output timeline is the sample counter's either way */
  g_autofree gint32 *codes = random_codes (2, N_FRAMES);
  g_autofree float *samples = g_new (float, N_FRAMES *FRAME_SAMPLES);
  GstHarness *h = codec_harness ("codec", codec_path);
  for (int k = 0; k < N_FRAMES; k++)
    fail_unless_equals_int (
        gst_harness_push (h, frame_buffer (codes + k * CHANNELS, k * 46 * GST_MSECOND)),
        GST_FLOW_OK);
  pull_audio (h, N_FRAMES, 0, TRUE, samples);
  gst_harness_teardown (h);

  h = codec_harness ("codec", codec_path);
  for (int k = 0; k < N_FRAMES; k++)
    fail_unless_equals_int (
        gst_harness_push (h, frame_buffer (codes + k * CHANNELS, GST_CLOCK_TIME_NONE)),
        GST_FLOW_OK);
  pull_audio (h, N_FRAMES, 0, TRUE, samples);
  /* 100 frames end exactly at sample 102400 */
  fail_unless_equals_uint64 (sample_pts (N_FRAMES * FRAME_SAMPLES), 4643990930);
  gst_harness_teardown (h);

  /* the first frame places the timeline: a stream starting at one second */
  h = codec_harness ("codec", codec_path);
  for (int k = 0; k < 3; k++)
    fail_unless_equals_int (
        gst_harness_push (h, frame_buffer (codes + k * CHANNELS, GST_SECOND + lm_pts (k))),
        GST_FLOW_OK);
  pull_audio (h, 3, 22050, TRUE, samples);
  gst_harness_teardown (h);
}
GST_END_TEST;

GST_START_TEST (test_flush_and_discont_restart_the_decoder)
{
  enum
  {
    N = 8
  };
  g_autofree gint32 *codes = random_codes (3, N);
  g_autofree float *expected = one_shot (codec_path, codes, N);
  g_autofree float *samples = g_new (float, N *FRAME_SAMPLES);
  GstHarness *h = codec_harness ("codec", codec_path);

  for (int k = 0; k < N; k++)
    gst_harness_push (h, frame_buffer (codes + k * CHANNELS, lm_pts (k)));
  pull_audio (h, N, 0, TRUE, samples);
  fail_unless (memcmp (samples, expected, sizeof (float) * N * FRAME_SAMPLES) == 0);

  /* the same frames again, continuing the stream: the decoder's state makes other samples */
  for (int k = 0; k < N; k++)
    gst_harness_push (h, frame_buffer (codes + k * CHANNELS, lm_pts (N + k)));
  GstBuffer *continued = gst_harness_pull (h);
  float first[FRAME_SAMPLES];
  gst_buffer_extract (continued, 0, first, sizeof first);
  fail_unless (memcmp (first, expected, sizeof first) != 0);
  gst_buffer_unref (continued);
  for (int k = 1; k < N; k++)
    gst_buffer_unref (gst_harness_pull (h));

  /* after a flush: the decoder from zero, the timeline from zero */
  fail_unless (gst_harness_push_event (h, gst_event_new_flush_start ()));
  fail_unless (gst_harness_push_event (h, gst_event_new_flush_stop (TRUE)));
  GstSegment segment;
  gst_segment_init (&segment, GST_FORMAT_TIME);
  fail_unless (gst_harness_push_event (h, gst_event_new_segment (&segment)));
  for (int k = 0; k < N; k++)
    gst_harness_push (h, frame_buffer (codes + k * CHANNELS, lm_pts (k)));
  pull_audio (h, N, 0, TRUE, samples);
  fail_unless (memcmp (samples, expected, sizeof (float) * N * FRAME_SAMPLES) == 0);

  /* a discontinuity: the decoder from zero, the timeline where the frame says */
  for (int k = 0; k < N; k++)
    {
      GstBuffer *buffer = frame_buffer (codes + k * CHANNELS, lm_pts (2 * N + k));
      if (k == 0)
        GST_BUFFER_FLAG_SET (buffer, GST_BUFFER_FLAG_DISCONT);
      gst_harness_push (h, buffer);
    }
  pull_audio (h, N, 2 * N * FRAME_SAMPLES, TRUE, samples);
  fail_unless (memcmp (samples, expected, sizeof (float) * N * FRAME_SAMPLES) == 0);
  gst_harness_teardown (h);
}
GST_END_TEST;

GST_START_TEST (test_codec_from_model)
{
  /* the model's codec, through the engine; a codec property set as well loses */
  enum
  {
    N = 5
  };
  g_autofree gint32 *codes = random_codes (4, N);
  g_autofree char *beside = g_build_filename (model_dir, "codec.nemo", NULL);
  g_autofree float *expected = one_shot (beside, codes, N);
  g_autofree float *samples = g_new (float, N *FRAME_SAMPLES);

  GstElement *codec = gst_element_factory_make ("gepardcodec", NULL);
  g_object_set (codec, "device", "cpu", "model", model_dir, "codec", "/no/such/codec.nemo", NULL);
  GstHarness *h = gst_harness_new_with_element (codec, "sink", "src");
  gst_object_unref (codec);
  gst_harness_set_src_caps_str (h, CODES_CAPS);
  for (int k = 0; k < N; k++)
    fail_unless_equals_int (gst_harness_push (h, frame_buffer (codes + k * CHANNELS, lm_pts (k))),
                            GST_FLOW_OK);
  pull_audio (h, N, 0, TRUE, samples);
  fail_unless (memcmp (samples, expected, sizeof (float) * N * FRAME_SAMPLES) == 0);
  gst_harness_teardown (h);
}
GST_END_TEST;

/* ---- errors ---- */

static char *
pop_error (GstBus *bus)
{
  GstMessage *message = gst_bus_pop_filtered (bus, GST_MESSAGE_ERROR);
  if (message == NULL)
    return NULL;
  GError *error = NULL;
  gst_message_parse_error (message, &error, NULL);
  char *text = g_strdup (error->message);
  g_error_free (error);
  gst_message_unref (message);
  return text;
}

/* The error an element posts on a codes buffer, with the flow it returned. */
static char *
push_error (GstBuffer *buffer)
{
  GstHarness *h = codec_harness ("codec", codec_path);
  GstBus *bus = gst_bus_new ();
  gst_element_set_bus (h->element, bus);
  fail_unless_equals_int (gst_harness_push (h, buffer), GST_FLOW_ERROR);
  fail_unless_equals_int (gst_harness_buffers_in_queue (h), 0);
  char *text = pop_error (bus);
  gst_element_set_bus (h->element, NULL);
  gst_object_unref (bus);
  gst_harness_teardown (h);
  return text;
}

GST_START_TEST (test_bad_codes)
{
  g_autofree gint32 *codes = random_codes (5, 1);
  /* channel 5 is FSQ dimension 1 of codebook 1: 7 levels, 0 to 6 */
  codes[5] = 7;
  g_autofree char *high = push_error (frame_buffer (codes, 0));
  fail_unless (high != NULL && strstr (high, "channel 5") != NULL, "error: %s", high);

  codes[5] = 0;
  codes[30] = -1;
  g_autofree char *negative = push_error (frame_buffer (codes, 0));
  fail_unless (negative != NULL && strstr (negative, "channel 30") != NULL, "error: %s", negative);

  /* not a whole frame */
  g_autofree char *partial = push_error (gst_buffer_new_memdup (codes, 100));
  fail_unless (partial != NULL && strstr (partial, "100 bytes") != NULL, "error: %s", partial);
}
GST_END_TEST;

/* The error an element posts when it cannot start. */
static char *
start_error (const char *property, const char *value)
{
  GstElement *codec = gst_element_factory_make ("gepardcodec", NULL);
  if (property != NULL)
    g_object_set (codec, "device", "cpu", property, value, NULL);
  GstBus *bus = gst_bus_new ();
  gst_element_set_bus (codec, bus);
  fail_unless_equals_int (gst_element_set_state (codec, GST_STATE_PAUSED),
                          GST_STATE_CHANGE_FAILURE);
  char *text = pop_error (bus);
  fail_unless (text != NULL);
  gst_element_set_state (codec, GST_STATE_NULL);
  gst_element_set_bus (codec, NULL);
  gst_object_unref (bus);
  gst_object_unref (codec);
  return text;
}

GST_START_TEST (test_missing_codec)
{
  /* a model with no codec beside it and none in the (empty) Hugging Face cache */
  g_autofree char *bare = start_error ("model", bare_dir);
  fail_unless (strstr (bare, bare_dir) != NULL && strstr (bare, "codec.nemo") != NULL
                   && strstr (bare, "codec property") != NULL,
               "error: %s", bare);

  g_autofree char *missing = g_build_filename (work_dir, "no-such-codec.nemo", NULL);
  g_autofree char *file = start_error ("codec", missing);
  fail_unless (strstr (file, missing) != NULL, "error: %s", file);

  /* neither: it starts (the engine may come from the gepardlm upstream, which starts after it),
   * and the first frame, with no engine to be found, is the error */
  GstHarness *h = codec_harness ("device", "cpu");
  GstBus *bus = gst_bus_new ();
  gst_element_set_bus (h->element, bus);
  g_autofree gint32 *codes = random_codes (1, 2);
  fail_unless_equals_int (gst_harness_push (h, frame_buffer (codes, 0)), GST_FLOW_ERROR);
  g_autofree char *none = pop_error (bus);
  fail_unless (none != NULL && strstr (none, "model property") != NULL
                   && strstr (none, "codec property") != NULL,
               "error: %s", none);
  gst_element_set_bus (h->element, NULL);
  gst_object_unref (bus);
  gst_harness_teardown (h);
}
GST_END_TEST;

/* No lookahead: a frame's audio leaves when the frame arrives, so the codec adds no latency to
 * what upstream reports. */
GST_START_TEST (test_latency)
{
  GstHarness *h = codec_harness ("codec", codec_path);
  gst_harness_set_upstream_latency (h, 46 * GST_MSECOND);
  gst_harness_play (h);
  fail_unless_equals_uint64 (gst_harness_query_latency (h), 46 * GST_MSECOND);
  gst_harness_teardown (h);
}
GST_END_TEST;

GST_START_TEST (test_registered)
{
  GstElementFactory *factory = gst_element_factory_find ("gepardcodec");
  fail_unless (factory != NULL);
  fail_unless_equals_string (gst_element_factory_get_metadata (factory, GST_ELEMENT_METADATA_KLASS),
                             "Codec/Decoder/Audio");
  gst_object_unref (factory);

  char *out = NULL;
  int status = 0;
  char *argv[] = {"gst-inspect-1.0", "gepardcodec", NULL};
  fail_unless (g_spawn_sync (NULL, argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDERR_TO_DEV_NULL,
                             NULL, NULL, &out, NULL, &status, NULL));
  fail_unless (g_spawn_check_wait_status (status, NULL));
  fail_unless (strstr (out, "codec") != NULL && strstr (out, "F32LE") != NULL);
  g_free (out);
}
GST_END_TEST;

static Suite *
gepardcodec_suite (void)
{
  Suite *s = suite_create ("gepardcodec");
  TCase *tc = tcase_create ("general");
  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_latency);
  tcase_add_test (tc, test_registered);
  tcase_add_test (tc, test_streamed_equals_one_shot);
  tcase_add_test (tc, test_timestamps_do_not_follow_input);
  tcase_add_test (tc, test_flush_and_discont_restart_the_decoder);
  tcase_add_test (tc, test_codec_from_model);
  tcase_add_test (tc, test_bad_codes);
  tcase_add_test (tc, test_missing_codec);
  return s;
}

int
main (int argc, char **argv)
{
  gst_check_init (&argc, &argv);

  work_dir = g_dir_make_tmp ("gepardcodec-XXXXXX", NULL);
  /* an empty Hugging Face cache: a model without a codec finds none there either */
  g_autofree char *cache = g_build_filename (work_dir, "hf-cache", NULL);
  g_mkdir (cache, 0700);
  g_setenv ("HF_HUB_CACHE", cache, TRUE);
  g_setenv ("HF_HOME", cache, TRUE);

  codec_path = g_build_filename (work_dir, "codec.nemo", NULL);
  model_dir = g_build_filename (work_dir, "model", NULL);
  bare_dir = g_build_filename (work_dir, "bare", NULL);
  gepard_test_make_model ("--codec-only --preset tiny --seed 3", codec_path);
  gepard_test_make_model ("--preset tiny --seed 8", model_dir);
  gepard_test_make_model ("--preset tiny --seed 8 --codec none", bare_dir);

  int failed = gst_check_run_suite (gepardcodec_suite (), "gepardcodec", __FILE__);

  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (codec_path);
  g_free (model_dir);
  g_free (bare_dir);
  g_free (work_dir);
  return failed;
}
