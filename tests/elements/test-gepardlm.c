/* gepardlm: sentences in, one buffer of 32 codes per frame out, on a frame timeline that runs on
 * across sentences; sampling is reproducible from the seed; a flush or a stop in the middle of a
 * sentence ends its generation at once; configuration mistakes are element errors a user can act
 * on. */
#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>

#include "gepard-engine.h"
#include "gepard-hub.h"
#include "gepard-test-model.h"

#include <stdlib.h>
#include <string.h>

#define TEXT_CAPS "text/x-raw, format = (string) utf8"
#define CODES_CAPS "audio/x-gepard-codes, channels = (int) 32, framerate = (fraction) 22050/1024"
#define CHANNELS 32

static char *work_dir;
static char *model_dir;
static char *cfg_model_dir; /* the same weights, asking for text-CFG at 2 */

/* the FSQ levels of the channels of a frame (gepard-model.md §3.6) */
static const int levels[4] = {8, 7, 6, 6};

static GstClockTime
frame_pts (guint64 n)
{
  return gst_util_uint64_scale_int_round (n * 1024, GST_SECOND, 22050);
}

static GstHarness *
lm_harness (const char *first_property, ...)
{
  GstElement *lm = gst_element_factory_make ("gepardlm", NULL);
  fail_unless (lm != NULL);
  g_object_set (lm, "model", model_dir, "device", "cpu", NULL);
  va_list args;
  va_start (args, first_property);
  g_object_set_valist (G_OBJECT (lm), first_property, args);
  va_end (args);
  GstHarness *h = gst_harness_new_with_element (lm, "sink", "src");
  gst_object_unref (lm);
  gst_harness_set_src_caps_str (h, TEXT_CAPS);
  return h;
}

static GstBuffer *
text_buffer (const char *text)
{
  return *text ? gst_buffer_new_memdup (text, strlen (text)) : gst_buffer_new ();
}

/* Every buffer the harness holds, checked for shape and range; codes appended to `codes`. Returns
 * how many frames it took; `largest` (may be NULL) gets the most frames a buffer held. */
static guint
take_frames_counted (GstHarness *h, GArray *codes, guint64 *next_frame, guint *largest)
{
  guint n = 0;
  GstBuffer *buffer;
  while ((buffer = gst_harness_try_pull (h)) != NULL)
    {
      gsize size = gst_buffer_get_size (buffer);
      fail_unless (size > 0 && size % (CHANNELS * 4) == 0, "a buffer of %zu bytes", size);
      guint frames = (guint)(size / (CHANNELS * 4));
      g_autofree gint32 *frame = g_new (gint32, (gsize)frames * CHANNELS);
      gst_buffer_extract (buffer, 0, frame, size);
      for (guint i = 0; i < frames * CHANNELS; i++)
        fail_unless (frame[i] >= 0 && frame[i] < levels[i % CHANNELS % 4], "channel %u has code %d",
                     i % CHANNELS, frame[i]);
      /* gstreamer-notes.md §5 item 11: from the frame counter, continuous, no drift */
      guint64 k = *next_frame;
      *next_frame += frames;
      fail_unless_equals_uint64 (GST_BUFFER_PTS (buffer), frame_pts (k));
      fail_unless_equals_uint64 (GST_BUFFER_DURATION (buffer),
                                 frame_pts (k + frames) - frame_pts (k));
      fail_unless_equals_uint64 (GST_BUFFER_OFFSET (buffer), k);
      fail_unless_equals_uint64 (GST_BUFFER_OFFSET_END (buffer), k + frames);
      /* the turn's first frame, and then the first of every later sentence (an utterance of its
       * own, decoded from a fresh codec state) */
      if (k == 0)
        fail_unless (GST_BUFFER_FLAG_IS_SET (buffer, GST_BUFFER_FLAG_DISCONT));
      g_array_append_vals (codes, frame, frames * CHANNELS);
      gst_buffer_unref (buffer);
      n += frames;
      if (largest != NULL)
        *largest = MAX (*largest, frames);
    }
  return n;
}

static guint
take_frames (GstHarness *h, GArray *codes, guint64 *next_frame)
{
  guint largest = 0;
  guint n = take_frames_counted (h, codes, next_frame, &largest);
  /* one buffer per frame unless asked otherwise */
  fail_unless (n == 0 || largest == 1);
  return n;
}

static const char *const turn[] = {"Hello there.", "This is Gepard."};

/* The frames of `turn` from a fresh element. */
static GArray *
run_turn (guint64 seed, double temperature, int max_frames, guint counts[2])
{
  GstHarness *h
      = lm_harness ("seed", seed, "temperature", temperature, "max-frames", max_frames, NULL);
  GArray *codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  guint64 next = 0;
  for (int i = 0; i < 2; i++)
    {
      fail_unless_equals_int (gst_harness_push (h, text_buffer (turn[i])), GST_FLOW_OK);
      counts[i] = take_frames (h, codes, &next);
    }
  gst_harness_teardown (h);
  return codes;
}

GST_START_TEST (test_frames_on_one_timeline)
{
  GstHarness *h = lm_harness ("max-frames", 12, "seed", (guint64)5, NULL);
  g_autoptr (GArray) codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  guint64 next = 0;

  fail_unless_equals_int (gst_harness_push (h, text_buffer (turn[0])), GST_FLOW_OK);
  guint n_first = take_frames (h, codes, &next);
  fail_unless_equals_int (gst_harness_push (h, text_buffer (turn[1])), GST_FLOW_OK);
  guint n_second = take_frames (h, codes, &next);
  /* max-frames bounds each sentence on its own; the timeline runs on across them */
  fail_unless (n_first >= 1 && n_first <= 12, "first sentence: %u frames", n_first);
  fail_unless (n_second >= 1 && n_second <= 12, "second sentence: %u frames", n_second);

  guint64 frames = 0;
  g_object_get (h->element, "frames", &frames, NULL);
  fail_unless_equals_uint64 (frames, n_first + n_second);

  GstCaps *caps = gst_pad_get_current_caps (h->sinkpad);
  GstCaps *expected = gst_caps_from_string (CODES_CAPS);
  fail_unless (gst_caps_is_equal (caps, expected));
  gst_caps_unref (caps);
  gst_caps_unref (expected);

  /* EOS follows the last frame, on a time segment from zero */
  fail_unless (gst_harness_push_event (h, gst_event_new_eos ()));
  gboolean saw_segment = FALSE, saw_eos = FALSE;
  GstEvent *event;
  while ((event = gst_harness_try_pull_event (h)) != NULL)
    {
      if (GST_EVENT_TYPE (event) == GST_EVENT_SEGMENT)
        {
          const GstSegment *segment;
          gst_event_parse_segment (event, &segment);
          fail_unless_equals_int (segment->format, GST_FORMAT_TIME);
          fail_unless_equals_uint64 (segment->start, 0);
          saw_segment = TRUE;
        }
      saw_eos |= GST_EVENT_TYPE (event) == GST_EVENT_EOS;
      gst_event_unref (event);
    }
  fail_unless (saw_segment && saw_eos);
  fail_unless_equals_int (gst_harness_buffers_in_queue (h), 0);
  gst_harness_teardown (h);
}
GST_END_TEST;

GST_START_TEST (test_max_frames_bounds_each_sentence)
{
  guint counts[2];
  /* a model that has not stopped after 3 frames is cut there, sentence by sentence */
  g_autoptr (GArray) codes = run_turn (11, -1, 3, counts);
  fail_unless (counts[0] <= 3 && counts[1] <= 3, "%u and %u frames", counts[0], counts[1]);
  g_autoptr (GArray) longer = run_turn (11, -1, 40, counts);
  fail_unless (counts[0] + counts[1] > 6, "a longer bound gave only %u + %u frames", counts[0],
               counts[1]);
}
GST_END_TEST;

GST_START_TEST (test_seed_determinism)
{
  guint a_counts[2], b_counts[2], c_counts[2];
  g_autoptr (GArray) a = run_turn (3, -1, 25, a_counts);
  g_autoptr (GArray) b = run_turn (3, -1, 25, b_counts);
  g_autoptr (GArray) c = run_turn (4, -1, 25, c_counts);

  /* same seed: the same frames, sentence by sentence */
  fail_unless_equals_int (a_counts[0], b_counts[0]);
  fail_unless_equals_int (a->len, b->len);
  fail_unless (memcmp (a->data, b->data, a->len * 4) == 0);
  /* another seed: other frames */
  fail_unless (a->len != c->len || memcmp (a->data, c->data, a->len * 4) != 0);

  /* greedy sampling draws nothing from the seed: the temperature reaches the engine */
  g_autoptr (GArray) greedy_a = run_turn (3, 0, 25, a_counts);
  g_autoptr (GArray) greedy_c = run_turn (4, 0, 25, c_counts);
  fail_unless_equals_int (greedy_a->len, greedy_c->len);
  fail_unless (memcmp (greedy_a->data, greedy_c->data, greedy_a->len * 4) == 0);
  fail_unless (greedy_a->len != a->len || memcmp (greedy_a->data, a->data, a->len * 4) != 0);
}
GST_END_TEST;

/* The greedy frames of turn[0] from `model` at text-CFG scale `cfg_scale` and repetition penalty
 * `penalty`. */
static GArray *
greedy_frames_penalised (const char *model, double cfg_scale, double penalty)
{
  GstHarness *h = lm_harness ("model", model, "temperature", 0.0, "cfg-scale", cfg_scale,
                              "repetition-penalty", penalty, "max-frames", 25, NULL);
  GArray *codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  guint64 next = 0;
  fail_unless_equals_int (gst_harness_push (h, text_buffer (turn[0])), GST_FLOW_OK);
  fail_unless (take_frames (h, codes, &next) > 0);
  gst_harness_teardown (h);
  return codes;
}

static GArray *
greedy_frames (const char *model, double cfg_scale)
{
  return greedy_frames_penalised (model, cfg_scale, 1.0);
}

static gboolean
same_frames (const GArray *a, const GArray *b)
{
  return a->len == b->len && memcmp (a->data, b->data, a->len * 4) == 0;
}

GST_START_TEST (test_repetition_penalty)
{
  GstHarness *h = lm_harness (NULL);
  double penalty = 0;
  g_object_get (h->element, "repetition-penalty", &penalty, NULL);
  gst_harness_teardown (h);
  fail_unless (penalty == 1.0, "the default penalty is %g, not 1 (off)", penalty);

  /* the penalty reaches the engine: codes of the frames before lose their lead, even greedy */
  g_autoptr (GArray) plain = greedy_frames (model_dir, 1.0);
  g_autoptr (GArray) penalised = greedy_frames_penalised (model_dir, 1.0, 4.0);
  fail_unless (!same_frames (plain, penalised));
}
GST_END_TEST;

GST_START_TEST (test_cfg_scale)
{
  g_autoptr (GArray) plain = greedy_frames (model_dir, 1.0);
  g_autoptr (GArray) unset = greedy_frames (model_dir, -1.0);
  g_autoptr (GArray) guided = greedy_frames (model_dir, 2.0);
  /* the scale reaches the engine: the text-free branch moves the frames */
  fail_unless (!same_frames (plain, guided));
  /* a model that names no scale is spoken without CFG */
  fail_unless (same_frames (plain, unset));

  /* one that names a scale (model.safetensors metadata gepard.cfg_scale) is spoken with it
   * unless the property says otherwise */
  g_autoptr (GArray) named = greedy_frames (cfg_model_dir, -1.0);
  g_autoptr (GArray) named_explicit = greedy_frames (cfg_model_dir, 2.0);
  g_autoptr (GArray) named_off = greedy_frames (cfg_model_dir, 1.0);
  fail_unless (same_frames (named, named_explicit));
  fail_unless (same_frames (named_off, plain));
}
GST_END_TEST;

GST_START_TEST (test_blank_sentences_skipped)
{
  GstHarness *h = lm_harness ("max-frames", 5, NULL);
  g_autoptr (GArray) codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  guint64 next = 0;

  fail_unless_equals_int (gst_harness_push (h, text_buffer ("")), GST_FLOW_OK);
  fail_unless_equals_int (gst_harness_push (h, text_buffer (" \t\n\u3000 ")), GST_FLOW_OK);
  fail_unless_equals_int (gst_harness_push (h, gst_buffer_new_memdup ("\0\0", 2)), GST_FLOW_OK);
  fail_unless_equals_int (gst_harness_buffers_in_queue (h), 0);
  /* and the turn goes on from frame zero */
  fail_unless_equals_int (gst_harness_push (h, text_buffer ("Hi.")), GST_FLOW_OK);
  fail_unless (take_frames (h, codes, &next) > 0);
  gst_harness_teardown (h);
}
GST_END_TEST;

/* ---- interruptions ---- */

/* A sentence long enough to be in the middle of when interrupted: at the tiny model's speed its
 * 2000 frames take seconds unless its stop head fires, and seed 1 (checked below) lets it run. */
#define LONG_SEED 1
#define LONG_FRAMES 2000

typedef struct
{
  GstHarness *h;
  GstFlowReturn ret;
  gint64 returned; /* monotonic µs */
} Pusher;

static gpointer
push_sentence (gpointer data)
{
  Pusher *p = data;
  p->ret = gst_harness_push (p->h, text_buffer ("A sentence that goes on for a while."));
  p->returned = g_get_monotonic_time ();
  return NULL;
}

/* Pushes a long sentence from another thread and returns once its first frame is out. */
static GThread *
start_long_sentence (GstHarness *h, Pusher *p)
{
  p->h = h;
  GThread *thread = g_thread_new ("push", push_sentence, p);
  GstBuffer *first = gst_harness_pull (h);
  fail_unless (first != NULL);
  gst_buffer_unref (first);
  return thread;
}

static guint
count_uncancelled_long_sentence (void)
{
  GstHarness *h = lm_harness ("seed", (guint64)LONG_SEED, "max-frames", LONG_FRAMES, NULL);
  fail_unless_equals_int (
      gst_harness_push (h, text_buffer ("A sentence that goes on for a while.")), GST_FLOW_OK);
  guint n = gst_harness_buffers_in_queue (h);
  gst_harness_teardown (h);
  return n;
}

/* The engine the element uses: the process-wide one for (model, device). */
static GepardEngine *
shared_engine (void)
{
  GError *error = NULL;
  GepardEngine *engine = gepard_engine_get_shared (model_dir, "cpu", &error);
  fail_unless (engine != NULL);
  return engine;
}

/* Waits up to `timeout` µs for the engine to end one more utterance than in `before`; the frames
 * it made since then in `frames`. */
static gboolean
wait_utterance_ended (GepardEngine *engine, const GepardEngineStats *before, gint64 timeout,
                      guint64 *frames)
{
  gint64 deadline = g_get_monotonic_time () + timeout;
  GepardEngineStats stats;
  do
    {
      gepard_engine_get_stats (engine, &stats);
      *frames = stats.frames - before->frames;
      if (stats.utterances > before->utterances)
        return TRUE;
      g_usleep (1000);
    }
  while (g_get_monotonic_time () < deadline);
  return FALSE;
}

GST_START_TEST (test_flush_cancels)
{
  guint full = count_uncancelled_long_sentence ();
  fail_unless (full >= 200, "the long sentence has only %u frames", full);

  GstHarness *h = lm_harness ("seed", (guint64)LONG_SEED, "max-frames", LONG_FRAMES, NULL);
  GepardEngine *engine = shared_engine ();
  GepardEngineStats before;
  gepard_engine_get_stats (engine, &before);
  Pusher p = {0};
  GThread *thread = start_long_sentence (h, &p);

  gint64 flushed = g_get_monotonic_time ();
  fail_unless (gst_harness_push_event (h, gst_event_new_flush_start ()));
  g_thread_join (thread);
  fail_unless_equals_int (p.ret, GST_FLOW_FLUSHING);
  fail_unless (p.returned - flushed < G_TIME_SPAN_SECOND / 2, "returned %.0f ms after the flush",
               (p.returned - flushed) / 1000.0);
  /* the engine ended the utterance at once, far short of its length */
  guint64 generated = 0;
  fail_unless (wait_utterance_ended (engine, &before, G_TIME_SPAN_SECOND / 2, &generated));
  fail_unless (generated < full, "the engine made %" G_GUINT64_FORMAT " of %u frames", generated,
               full);
  /* and nothing comes late from the cancelled generation */
  guint64 frames = 0, later = 0;
  g_object_get (h->element, "frames", &frames, NULL);
  g_usleep (50 * 1000);
  g_object_get (h->element, "frames", &later, NULL);
  fail_unless_equals_uint64 (later, frames);
  fail_unless (frames <= generated);
  gepard_engine_unref (engine);

  /* after FLUSH_STOP the element takes sentences again, on a new timeline from zero */
  fail_unless (gst_harness_push_event (h, gst_event_new_flush_stop (TRUE)));
  GstSegment segment;
  gst_segment_init (&segment, GST_FORMAT_TIME);
  fail_unless (gst_harness_push_event (h, gst_event_new_segment (&segment)));
  GstBuffer *stale;
  while ((stale = gst_harness_try_pull (h)) != NULL)
    gst_buffer_unref (stale);
  g_object_set (h->element, "max-frames", 4, NULL);
  fail_unless_equals_int (gst_harness_push (h, text_buffer ("Again.")), GST_FLOW_OK);
  g_autoptr (GArray) codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  guint64 next = 0;
  guint n = take_frames (h, codes, &next);
  fail_unless (n >= 1 && n <= 4);
  gst_harness_teardown (h);
}
GST_END_TEST;

GST_START_TEST (test_stop_mid_sentence)
{
  GstHarness *h = lm_harness ("seed", (guint64)LONG_SEED, "max-frames", LONG_FRAMES, NULL);
  Pusher p = {0};
  GThread *thread = start_long_sentence (h, &p);

  gint64 before = g_get_monotonic_time ();
  fail_unless_equals_int (gst_element_set_state (h->element, GST_STATE_NULL),
                          GST_STATE_CHANGE_SUCCESS);
  gint64 after = g_get_monotonic_time ();
  g_thread_join (thread);
  fail_unless (after - before < G_TIME_SPAN_SECOND / 2, "set_state (NULL) took %.0f ms",
               (after - before) / 1000.0);
  fail_unless_equals_int (p.ret, GST_FLOW_FLUSHING);

  /* and it starts again */
  fail_unless_equals_int (gst_element_set_state (h->element, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_SUCCESS);
  gst_harness_teardown (h);
}
GST_END_TEST;

static GstPadProbeReturn
hold_first_buffer (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  GMutex *held = user_data;
  g_mutex_lock (held);
  g_mutex_unlock (held);
  return GST_PAD_PROBE_REMOVE;
}

/* One long sentence generated whole while downstream takes nothing (the scheduler thread only
 * queues frames); then they all come out, in order: its frames, with how many buffers carried
 * them and the most one held. */
static GArray *
run_held_sentence (guint frames_per_buffer, guint *n_buffers, guint *largest)
{
  GMutex held;
  g_mutex_init (&held);
  g_mutex_lock (&held);
  GstHarness *h = lm_harness ("seed", (guint64)LONG_SEED, "max-frames", 300, "frames-per-buffer",
                              frames_per_buffer, NULL);
  GstPad *src = gst_element_get_static_pad (h->element, "src");
  gst_pad_add_probe (src, GST_PAD_PROBE_TYPE_BUFFER, hold_first_buffer, &held, NULL);
  GepardEngine *engine = shared_engine ();
  GepardEngineStats before;
  gepard_engine_get_stats (engine, &before);
  Pusher p = {0};
  p.h = h;
  GThread *thread = g_thread_new ("push", push_sentence, &p);

  guint64 generated = 0;
  fail_unless (wait_utterance_ended (engine, &before, 30 * G_TIME_SPAN_SECOND, &generated));
  fail_unless_equals_uint64 (generated, 300);
  fail_unless_equals_int (gst_harness_buffers_in_queue (h), 0);
  g_mutex_unlock (&held);
  g_thread_join (thread);
  fail_unless_equals_int (p.ret, GST_FLOW_OK);
  *n_buffers = gst_harness_buffers_in_queue (h);
  GArray *codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  guint64 next = 0;
  *largest = 0;
  fail_unless_equals_uint64 (take_frames_counted (h, codes, &next, largest), generated);
  guint64 pushed = 0;
  g_object_get (h->element, "frames", &pushed, NULL);
  fail_unless_equals_uint64 (pushed, generated);

  gst_object_unref (src);
  gepard_engine_unref (engine);
  gst_harness_teardown (h);
  g_mutex_clear (&held);
  return codes;
}

GST_START_TEST (test_engine_never_waits_for_downstream)
{
  guint n_buffers, largest;
  g_autoptr (GArray) codes = run_held_sentence (1, &n_buffers, &largest);
  fail_unless_equals_int (n_buffers, 300);
  fail_unless_equals_int (largest, 1);
}
GST_END_TEST;

GST_START_TEST (test_frames_per_buffer)
{
  /* the frames that piled up behind the held first one leave 8 to a buffer: the same frames on
   * the same timeline in far fewer buffers */
  guint n_buffers, largest, one_buffers, one_largest;
  g_autoptr (GArray) codes = run_held_sentence (8, &n_buffers, &largest);
  g_autoptr (GArray) one_each = run_held_sentence (1, &one_buffers, &one_largest);
  fail_unless_equals_int (largest, 8);
  fail_unless (n_buffers >= 300 / 8 && n_buffers < 300 / 8 + 4, "%u buffers", n_buffers);
  fail_unless_equals_int (codes->len, one_each->len);
  fail_unless (memcmp (codes->data, one_each->data, codes->len * sizeof (gint32)) == 0);
}
GST_END_TEST;

/* ---- errors ---- */

/* The message of the error the element posts when it cannot start, or NULL if it started. */
static char *
start_error (GstElement *element)
{
  GstBus *bus = gst_bus_new ();
  gst_element_set_bus (element, bus);
  GstStateChangeReturn ret = gst_element_set_state (element, GST_STATE_PAUSED);
  char *text = NULL;
  GstMessage *message = gst_bus_pop_filtered (bus, GST_MESSAGE_ERROR);
  if (message != NULL)
    {
      GError *error = NULL;
      gst_message_parse_error (message, &error, NULL);
      text = g_strdup (error->message);
      g_error_free (error);
      gst_message_unref (message);
    }
  fail_unless ((ret == GST_STATE_CHANGE_FAILURE) == (text != NULL));
  gst_element_set_state (element, GST_STATE_NULL);
  gst_element_set_bus (element, NULL);
  gst_object_unref (bus);
  return text;
}

GST_START_TEST (test_bad_model)
{
  GstElement *lm = gst_element_factory_make ("gepardlm", NULL);
  g_autofree char *missing = g_build_filename (work_dir, "no-such-model", NULL);
  g_object_set (lm, "model", missing, "device", "cpu", NULL);
  g_autofree char *message = start_error (lm);
  fail_unless (message != NULL && strstr (message, missing) != NULL, "error: %s", message);

  /* no model at all: the default voice (installed or in the source tree) where there is one,
     else an error that says which property to set */
  g_object_set (lm, "model", NULL, NULL);
  g_autofree char *default_voice = gepard_hub_default_model ();
  g_autofree char *unset = start_error (lm);
  if (default_voice != NULL)
    fail_unless (unset == NULL, "error: %s", unset);
  else
    fail_unless (unset != NULL && strstr (unset, "model property") != NULL, "error: %s", unset);
  gst_object_unref (lm);
}
GST_END_TEST;

GST_START_TEST (test_default_model)
{
  /* no model named: GEPARD_MODEL's, the same frames as naming it */
  g_setenv ("GEPARD_MODEL", model_dir, TRUE);
  g_autoptr (GArray) named = g_array_new (FALSE, FALSE, sizeof (gint32));
  g_autoptr (GArray) unnamed = g_array_new (FALSE, FALSE, sizeof (gint32));
  GArray *runs[2] = {named, unnamed};
  for (int run = 0; run < 2; run++)
    {
      GstHarness *h = run == 0
                          ? lm_harness ("seed", (guint64)5, "max-frames", 12, NULL)
                          : lm_harness ("model", NULL, "seed", (guint64)5, "max-frames", 12, NULL);
      guint64 next = 0;
      fail_unless_equals_int (gst_harness_push (h, text_buffer (turn[0])), GST_FLOW_OK);
      fail_unless (take_frames (h, runs[run], &next) > 0);
      gst_harness_teardown (h);
    }
  fail_unless_equals_int (named->len, unnamed->len);
  fail_unless (memcmp (named->data, unnamed->data, named->len * 4) == 0);

  /* a default model that cannot be loaded: the error says so and names it */
  g_autofree char *missing = g_build_filename (work_dir, "no-default-model", NULL);
  g_setenv ("GEPARD_MODEL", missing, TRUE);
  GstElement *lm = gst_element_factory_make ("gepardlm", NULL);
  g_object_set (lm, "device", "cpu", NULL);
  g_autofree char *message = start_error (lm);
  g_unsetenv ("GEPARD_MODEL");
  fail_unless (message != NULL && strstr (message, "default model") != NULL
                   && strstr (message, missing) != NULL,
               "error: %s", message);
  gst_object_unref (lm);
}
GST_END_TEST;

GST_START_TEST (test_bad_device)
{
  /* the engine serves no GPU yet (and this host may have none): either way an element error */
  GstElement *lm = gst_element_factory_make ("gepardlm", NULL);
  g_object_set (lm, "model", model_dir, "device", "cuda:0", NULL);
  g_autofree char *message = start_error (lm);
  fail_unless (message != NULL && strstr (message, "cuda:0") != NULL, "error: %s", message);
  g_object_set (lm, "device", "abacus", NULL);
  g_autofree char *unknown = start_error (lm);
  fail_unless (unknown != NULL && strstr (unknown, "abacus") != NULL, "error: %s", unknown);
  gst_object_unref (lm);
}
GST_END_TEST;

GST_START_TEST (test_voice)
{
  GstElement *lm = gst_element_factory_make ("gepardlm", NULL);
  g_object_set (lm, "model", model_dir, "device", "cpu", "voice", "no-such-voice", NULL);
  g_autofree char *message = start_error (lm);
  fail_unless (message != NULL && strstr (message, "no-such-voice") != NULL, "error: %s", message);
  gst_object_unref (lm);

  /* a prefix file for the tiny model (8 queries × hidden 64, gepard-voice.h) changes the frames
   * of the same text and seed */
  g_autofree char *prefix_path = g_build_filename (work_dir, "voice.bin", NULL);
  float prefix[8 * 64];
  for (guint i = 0; i < G_N_ELEMENTS (prefix); i++)
    prefix[i] = (float)((int)(i * 37 % 101) - 50) / 25.0f;
  fail_unless (g_file_set_contents (prefix_path, (const char *)prefix, sizeof prefix, NULL));

  g_autoptr (GArray) with_default = g_array_new (FALSE, FALSE, sizeof (gint32));
  g_autoptr (GArray) with_prefix = g_array_new (FALSE, FALSE, sizeof (gint32));
  GArray *runs[2] = {with_default, with_prefix};
  for (int run = 0; run < 2; run++)
    {
      GstHarness *h = lm_harness ("seed", (guint64)9, "max-frames", 20, "voice",
                                  run == 0 ? "default" : prefix_path, NULL);
      guint64 next = 0;
      fail_unless_equals_int (gst_harness_push (h, text_buffer (turn[0])), GST_FLOW_OK);
      fail_unless (take_frames (h, runs[run], &next) > 0);
      gst_harness_teardown (h);
    }
  fail_unless (with_default->len != with_prefix->len
               || memcmp (with_default->data, with_prefix->data, with_default->len * 4) != 0);
}
GST_END_TEST;

GST_START_TEST (test_registered)
{
  GstElementFactory *factory = gst_element_factory_find ("gepardlm");
  fail_unless (factory != NULL);
  fail_unless_equals_string (gst_element_factory_get_metadata (factory, GST_ELEMENT_METADATA_KLASS),
                             "Filter/Audio/Text");
  gst_object_unref (factory);

  /* gst-inspect-1.0 lists it with its properties, in the test's registry environment */
  char *out = NULL;
  int status = 0;
  char *argv[] = {"gst-inspect-1.0", "gepardlm", NULL};
  fail_unless (g_spawn_sync (NULL, argv, NULL, G_SPAWN_SEARCH_PATH | G_SPAWN_STDERR_TO_DEV_NULL,
                             NULL, NULL, &out, NULL, &status, NULL));
  fail_unless (g_spawn_check_wait_status (status, NULL));
  fail_unless (strstr (out, "max-frames") != NULL && strstr (out, "audio/x-gepard-codes") != NULL);
  g_free (out);
}
GST_END_TEST;

static Suite *
gepardlm_suite (void)
{
  Suite *s = suite_create ("gepardlm");
  TCase *tc = tcase_create ("general");
  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_registered);
  tcase_add_test (tc, test_frames_on_one_timeline);
  tcase_add_test (tc, test_max_frames_bounds_each_sentence);
  tcase_add_test (tc, test_seed_determinism);
  tcase_add_test (tc, test_cfg_scale);
  tcase_add_test (tc, test_repetition_penalty);
  tcase_add_test (tc, test_blank_sentences_skipped);
  tcase_add_test (tc, test_flush_cancels);
  tcase_add_test (tc, test_stop_mid_sentence);
  tcase_add_test (tc, test_engine_never_waits_for_downstream);
  tcase_add_test (tc, test_frames_per_buffer);
  tcase_add_test (tc, test_bad_model);
  tcase_add_test (tc, test_default_model);
  tcase_add_test (tc, test_bad_device);
  tcase_add_test (tc, test_voice);
  return s;
}

int
main (int argc, char **argv)
{
  gst_check_init (&argc, &argv);

  work_dir = g_dir_make_tmp ("gepardlm-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 7 --codec none", model_dir);
  cfg_model_dir = g_build_filename (work_dir, "tiny-cfg", NULL);
  gepard_test_make_model ("--preset tiny --seed 7 --codec none --cfg-scale 2", cfg_model_dir);

  int failed = gst_check_run_suite (gepardlm_suite (), "gepardlm", __FILE__);

  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (model_dir);
  g_free (work_dir);
  return failed;
}
