/* test-gepardtextsrc.c: gepardtextsrc through GstHarness and real pipelines: one buffer per
 * sentence with sentence offsets and EOS at the end of the turn, from the text and location
 * properties and from the push-text / flush / end-of-text action signals (also from another
 * thread while PLAYING), errors a user can act on, and set_state(NULL) that never hangs while
 * the streaming thread waits for text. */
#include <gst/app/gstappsink.h>
#include <gst/check/gstcheck.h>
#include <gst/check/gstharness.h>
#include <glib/gstdio.h>
#include <string.h>

#define TEXT_CAPS "text/x-raw, format = (string) utf8"

/* --- checking buffers, events and pipelines ------------------------------------------------ */

static gchar *
buffer_text (GstBuffer *buffer)
{
  GstMapInfo map;
  gchar *text;

  fail_unless (gst_buffer_map (buffer, &map, GST_MAP_READ));
  text = g_strndup ((const gchar *)map.data, map.size);
  fail_unless_equals_int (strlen (text), map.size); /* no NUL inside, none appended */
  gst_buffer_unmap (buffer, &map);
  return text;
}

/* Pulls one buffer and checks that it is sentence number `offset` with the given text. */
static void
harness_expect_sentence (GstHarness *h, const gchar *expected, guint64 offset)
{
  GstBuffer *buffer = gst_harness_pull (h);
  g_autofree gchar *text = NULL;

  fail_unless (buffer != NULL, "no buffer for \"%s\"", expected);
  text = buffer_text (buffer);
  fail_unless_equals_string (text, expected);
  fail_unless_equals_uint64 (GST_BUFFER_OFFSET (buffer), offset);
  fail_unless_equals_uint64 (GST_BUFFER_OFFSET_END (buffer), offset + 1);
  fail_if (GST_BUFFER_PTS_IS_VALID (buffer));
  fail_if (GST_BUFFER_DURATION_IS_VALID (buffer));
  gst_buffer_unref (buffer);
}

/* Checks the events a turn starts with: stream-start, our caps, an open TIME segment. */
static void
harness_expect_stream_start (GstHarness *h)
{
  GstEvent *event;
  GstCaps *caps, *expected;
  const GstSegment *segment;

  event = gst_harness_pull_event (h);
  fail_unless_equals_int (GST_EVENT_TYPE (event), GST_EVENT_STREAM_START);
  gst_event_unref (event);

  event = gst_harness_pull_event (h);
  fail_unless_equals_int (GST_EVENT_TYPE (event), GST_EVENT_CAPS);
  gst_event_parse_caps (event, &caps);
  expected = gst_caps_from_string (TEXT_CAPS);
  fail_unless (gst_caps_is_equal (caps, expected));
  gst_caps_unref (expected);
  gst_event_unref (event);

  event = gst_harness_pull_event (h);
  fail_unless_equals_int (GST_EVENT_TYPE (event), GST_EVENT_SEGMENT);
  gst_event_parse_segment (event, &segment);
  fail_unless_equals_int (segment->format, GST_FORMAT_TIME);
  fail_unless_equals_uint64 (segment->start, 0);
  fail_if (GST_CLOCK_TIME_IS_VALID (segment->stop));
  gst_event_unref (event);
}

static void
harness_expect_eos (GstHarness *h)
{
  GstEvent *event = gst_harness_pull_event (h);
  fail_unless (event != NULL);
  fail_unless_equals_int (GST_EVENT_TYPE (event), GST_EVENT_EOS);
  gst_event_unref (event);
  fail_unless_equals_int (gst_harness_buffers_in_queue (h), 0);
}

static GstHarness *
harness_new (void)
{
  GstHarness *h = gst_harness_new ("gepardtextsrc");
  gst_harness_set_sink_caps_str (h, TEXT_CAPS);
  return h;
}

static gboolean
emit_push_text (GstElement *src, const gchar *text)
{
  gboolean ok = FALSE;
  g_signal_emit_by_name (src, "push-text", text, &ok);
  return ok;
}

static gboolean
emit_simple (GstElement *src, const gchar *signal_name)
{
  gboolean ok = FALSE;
  g_signal_emit_by_name (src, signal_name, &ok);
  return ok;
}

/* The text of the next sentence at the appsink, or NULL at EOS. */
static gchar *
appsink_next_sentence (GstElement *sink, guint64 *offset)
{
  GstSample *sample = gst_app_sink_try_pull_sample (GST_APP_SINK (sink), 10 * GST_SECOND);
  GstCaps *expected;
  gchar *text;

  if (sample == NULL)
    {
      fail_unless (gst_app_sink_is_eos (GST_APP_SINK (sink)), "no sentence and no EOS in 10 s");
      return NULL;
    }
  expected = gst_caps_from_string (TEXT_CAPS);
  fail_unless (gst_caps_is_equal (gst_sample_get_caps (sample), expected));
  gst_caps_unref (expected);
  text = buffer_text (gst_sample_get_buffer (sample));
  if (offset != NULL)
    *offset = GST_BUFFER_OFFSET (gst_sample_get_buffer (sample));
  gst_sample_unref (sample);
  return text;
}

/* Plays `pipeline` to the end; its appsink "sink" must receive exactly `expected`, with
 * offsets 0, 1, 2…, then EOS, and the bus must report EOS. */
static void
pipeline_expect_sentences (GstElement *pipeline, const gchar *const *expected)
{
  GstElement *sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  GstBus *bus = gst_element_get_bus (pipeline);
  GstMessage *message;
  guint i = 0;
  gchar *text;
  guint64 offset;

  fail_unless (sink != NULL);
  fail_if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE);
  while ((text = appsink_next_sentence (sink, &offset)) != NULL)
    {
      fail_unless (expected[i] != NULL, "unexpected sentence \"%s\"", text);
      fail_unless_equals_string (text, expected[i]);
      fail_unless_equals_uint64 (offset, i);
      g_free (text);
      i++;
    }
  fail_unless (expected[i] == NULL, "sentence \"%s\" missing", expected[i]);

  message = gst_bus_timed_pop_filtered (bus, 10 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (message != NULL);
  fail_unless_equals_int (GST_MESSAGE_TYPE (message), GST_MESSAGE_EOS);
  gst_message_unref (message);

  gst_element_set_state (pipeline, GST_STATE_NULL);
  gst_object_unref (bus);
  gst_object_unref (sink);
}

/* Sets `pipeline` PLAYING and returns the error it posts, checking that it posts one. */
static GError *
pipeline_expect_error (GstElement *pipeline)
{
  GstBus *bus = gst_element_get_bus (pipeline);
  GstMessage *message;
  GError *error = NULL;

  fail_unless_equals_int (gst_element_set_state (pipeline, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_FAILURE);
  message = gst_bus_timed_pop_filtered (bus, 10 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (message != NULL);
  fail_unless_equals_int (GST_MESSAGE_TYPE (message), GST_MESSAGE_ERROR);
  gst_message_parse_error (message, &error, NULL);
  gst_message_unref (message);
  gst_object_unref (bus);
  gst_element_set_state (pipeline, GST_STATE_NULL);
  return error;
}

static gchar *
write_temp_file (const gchar *contents, gssize length)
{
  GError *error = NULL;
  gchar *path = NULL;
  gint fd = g_file_open_tmp ("gepardtextsrc-XXXXXX.txt", &path, &error);

  fail_unless (fd >= 0, "%s", error ? error->message : "");
  g_close (fd, NULL);
  fail_unless (g_file_set_contents (path, contents, length, &error));
  return path;
}

/* --- GstHarness ---------------------------------------------------------------------------- */

GST_START_TEST (test_text_property)
{
  GstHarness *h = harness_new ();

  g_object_set (h->element, "text",
                "Hello world. How are you? Dr. Smith met J. R. R. Tolkien. 你好。再见！", NULL);
  gst_harness_play (h);
  harness_expect_stream_start (h);
  harness_expect_sentence (h, "Hello world.", 0);
  harness_expect_sentence (h, "How are you?", 1);
  harness_expect_sentence (h, "Dr. Smith met J. R. R. Tolkien.", 2);
  harness_expect_sentence (h, "你好。", 3);
  harness_expect_sentence (h, "再见！", 4);
  harness_expect_eos (h);

  /* the turn comes from the property: the action signals do not mix text into it */
  fail_if (emit_push_text (h->element, "More."));
  fail_if (emit_simple (h->element, "end-of-text"));
  gst_harness_teardown (h);
}

GST_END_TEST;

GST_START_TEST (test_empty_text)
{
  GstHarness *h = harness_new ();
  GstEvent *event;

  /* nothing to say: the turn is just EOS (GstBaseSrc sends no segment before it) */
  g_object_set (h->element, "text", "  ... \n\n ", NULL);
  gst_harness_play (h);
  event = gst_harness_pull_event (h);
  fail_unless_equals_int (GST_EVENT_TYPE (event), GST_EVENT_STREAM_START);
  gst_event_unref (event);
  while ((event = gst_harness_pull_event (h)) != NULL && GST_EVENT_TYPE (event) != GST_EVENT_EOS)
    {
      gst_event_unref (event);
    }
  fail_unless (event != NULL);
  gst_event_unref (event);
  fail_unless_equals_int (gst_harness_buffers_received (h), 0);
  gst_harness_teardown (h);
}

GST_END_TEST;

/* Sentences go downstream as soon as they are complete; flush sends an unfinished one;
 * end-of-text sends the rest, then EOS. */
GST_START_TEST (test_push_text_signals)
{
  GstHarness *h = harness_new ();

  gst_harness_play (h);
  fail_unless (emit_push_text (h->element, "Hello th"));
  fail_unless (emit_push_text (h->element, "ere. How are"));
  harness_expect_stream_start (h);
  harness_expect_sentence (h, "Hello there.", 0);

  /* "How are" is no sentence yet: nothing goes until the flush */
  g_usleep (50 * G_TIME_SPAN_MILLISECOND);
  fail_unless_equals_int (gst_harness_buffers_in_queue (h), 0);
  fail_unless (emit_simple (h->element, "flush"));
  harness_expect_sentence (h, "How are", 1);

  /* invalid UTF-8 is refused and leaves the turn as it was */
  fail_if (emit_push_text (h->element, "Bad \xFF byte. "));
  fail_unless (emit_push_text (h->element, "Good"));
  fail_unless (emit_push_text (h->element, "bye. See you"));
  harness_expect_sentence (h, "Goodbye.", 2);
  fail_unless (emit_simple (h->element, "end-of-text"));
  harness_expect_sentence (h, "See you", 3);
  harness_expect_eos (h);

  /* the turn is over */
  fail_if (emit_push_text (h->element, "Too late."));
  fail_if (emit_simple (h->element, "flush"));
  fail_if (emit_simple (h->element, "end-of-text"));
  gst_harness_teardown (h);
}

GST_END_TEST;

GST_START_TEST (test_max_sentence_length)
{
  GstHarness *h = harness_new ();
  GString *text = g_string_new (NULL);
  GString *joined = g_string_new (NULL);
  GstEvent *event;

  for (guint i = 0; i < 40; i++)
    g_string_append_printf (text, "%sword%u", i ? " " : "", i);
  g_object_set (h->element, "max-sentence-length", 40, "text", text->str, NULL);
  gst_harness_play (h);
  harness_expect_stream_start (h);
  while ((event = gst_harness_pull_event (h)) != NULL && GST_EVENT_TYPE (event) != GST_EVENT_EOS)
    gst_event_unref (event);
  fail_unless (event != NULL);
  gst_event_unref (event);

  /* cut at spaces, none longer than 40 characters, nothing lost */
  fail_unless (gst_harness_buffers_in_queue (h) > 1);
  while (gst_harness_buffers_in_queue (h) > 0)
    {
      GstBuffer *buffer = gst_harness_pull (h);
      g_autofree gchar *sentence = buffer_text (buffer);
      fail_unless (g_utf8_strlen (sentence, -1) <= 40, "too long: %s", sentence);
      g_string_append_printf (joined, "%s%s", joined->len ? " " : "", sentence);
      gst_buffer_unref (buffer);
    }
  fail_unless_equals_string (joined->str, text->str);

  g_string_free (text, TRUE);
  g_string_free (joined, TRUE);
  gst_harness_teardown (h);
}

GST_END_TEST;

GST_START_TEST (test_properties)
{
  GstElement *src = gst_element_factory_make ("gepardtextsrc", NULL);
  GObjectClass *klass = G_OBJECT_GET_CLASS (src);
  GParamSpec *pspec;
  GParamSpecUInt *uint_spec;
  gchar *text = NULL, *location = NULL;
  guint max = 0;

  fail_unless (src != NULL);
  g_object_get (src, "text", &text, "location", &location, "max-sentence-length", &max, NULL);
  fail_unless (text == NULL && location == NULL);
  fail_unless_equals_int (max, 400);

  pspec = g_object_class_find_property (klass, "text");
  fail_unless (pspec != NULL && (pspec->flags & GST_PARAM_MUTABLE_READY));
  fail_unless (g_param_spec_get_blurb (pspec) && *g_param_spec_get_blurb (pspec));
  pspec = g_object_class_find_property (klass, "location");
  fail_unless (pspec != NULL && (pspec->flags & GST_PARAM_MUTABLE_READY));
  fail_unless (g_param_spec_get_blurb (pspec) && *g_param_spec_get_blurb (pspec));
  pspec = g_object_class_find_property (klass, "max-sentence-length");
  fail_unless (pspec != NULL && (pspec->flags & GST_PARAM_MUTABLE_PLAYING));
  uint_spec = G_PARAM_SPEC_UINT (pspec);
  fail_unless_equals_int (uint_spec->minimum, 16);
  fail_unless_equals_int (uint_spec->maximum, 65536);
  fail_unless_equals_int (uint_spec->default_value, 400);

  fail_unless (g_signal_lookup ("push-text", G_OBJECT_TYPE (src)) != 0);
  fail_unless (g_signal_lookup ("flush", G_OBJECT_TYPE (src)) != 0);
  fail_unless (g_signal_lookup ("end-of-text", G_OBJECT_TYPE (src)) != 0);
  gst_object_unref (src);
}

GST_END_TEST;

/* --- pipelines ------------------------------------------------------------------------------ */

GST_START_TEST (test_pipeline_text)
{
  GError *error = NULL;
  GstElement *pipeline = gst_parse_launch (
      "gepardtextsrc text=\"\\\"Really?\\\" she asked. It costs 3.14 euros, e.g. in Paris. "
      "Привет! Как дела?\" ! appsink name=sink sync=false",
      &error);
  const gchar *const expected[]
      = {"\"Really?\"", "she asked.", "It costs 3.14 euros, e.g. in Paris.",
         "Привет!",     "Как дела?",  NULL};

  fail_unless (pipeline != NULL, "%s", error ? error->message : "");
  pipeline_expect_sentences (pipeline, expected);
  gst_object_unref (pipeline);
}

GST_END_TEST;

static void
count_handoff (GstElement *sink, GstBuffer *buffer, GstPad *pad, gpointer data)
{
  g_atomic_int_inc ((gint *)data);
}

GST_START_TEST (test_pipeline_fakesink)
{
  GstElement *pipeline = gst_parse_launch (
      "gepardtextsrc text=\"One. Two. Three.\" ! fakesink name=sink signal-handoffs=true", NULL);
  GstElement *sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  GstBus *bus = gst_element_get_bus (pipeline);
  GstMessage *message;
  gint n_buffers = 0;

  g_signal_connect (sink, "handoff", G_CALLBACK (count_handoff), &n_buffers);
  gst_element_set_state (pipeline, GST_STATE_PLAYING);
  message = gst_bus_timed_pop_filtered (bus, 10 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (message != NULL);
  fail_unless_equals_int (GST_MESSAGE_TYPE (message), GST_MESSAGE_EOS);
  fail_unless_equals_int (g_atomic_int_get (&n_buffers), 3);
  gst_message_unref (message);

  gst_element_set_state (pipeline, GST_STATE_NULL);
  gst_object_unref (bus);
  gst_object_unref (sink);
  gst_object_unref (pipeline);
}

GST_END_TEST;

GST_START_TEST (test_location)
{
  /* a byte-order mark, a heading, a paragraph break and a hard-wrapped sentence */
  gchar *path = write_temp_file ("\xEF\xBB\xBF"
                                 "Chapter One\n\nIt was a dark\nand stormy night. The end.\n",
                                 -1);
  gchar *description = g_strdup_printf ("gepardtextsrc location=\"%s\" ! appsink name=sink "
                                        "sync=false",
                                        path);
  GstElement *pipeline = gst_parse_launch (description, NULL);
  const gchar *const expected[]
      = {"Chapter One", "It was a dark and stormy night.", "The end.", NULL};

  fail_unless (pipeline != NULL);
  pipeline_expect_sentences (pipeline, expected);
  gst_object_unref (pipeline);
  g_unlink (path);
  g_free (description);
  g_free (path);
}

GST_END_TEST;

GST_START_TEST (test_location_invalid_utf8)
{
  /* "Good text.\nBad " is 15 bytes: the bad sequence starts at offset 15 */
  gchar *path = write_temp_file ("Good text.\nBad \xC3\x28 byte.", -1);
  GstElement *pipeline = gst_parse_launch ("gepardtextsrc name=src ! fakesink", NULL);
  GstElement *src = gst_bin_get_by_name (GST_BIN (pipeline), "src");
  GError *error;

  g_object_set (src, "location", path, NULL);
  error = pipeline_expect_error (pipeline);
  fail_unless (g_error_matches (error, GST_STREAM_ERROR, GST_STREAM_ERROR_DECODE), "%s",
               error->message);
  fail_unless (strstr (error->message, path) != NULL, "no file name in: %s", error->message);
  fail_unless (strstr (error->message, "offset 15") != NULL, "no offset in: %s", error->message);
  fail_unless (strstr (error->message, "UTF-8") != NULL);

  g_error_free (error);
  gst_object_unref (src);
  gst_object_unref (pipeline);
  g_unlink (path);
  g_free (path);
}

GST_END_TEST;

GST_START_TEST (test_location_missing)
{
  GstElement *pipeline
      = gst_parse_launch ("gepardtextsrc location=/nonexistent/gepard/story.txt ! fakesink", NULL);
  GError *error = pipeline_expect_error (pipeline);

  fail_unless (g_error_matches (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_NOT_FOUND), "%s",
               error->message);
  fail_unless (strstr (error->message, "/nonexistent/gepard/story.txt") != NULL);
  g_error_free (error);
  gst_object_unref (pipeline);
}

GST_END_TEST;

GST_START_TEST (test_text_and_location)
{
  gchar *path = write_temp_file ("From the file.", -1);
  gchar *description = g_strdup_printf (
      "gepardtextsrc text=\"From the property.\" location=\"%s\" ! fakesink", path);
  GstElement *pipeline = gst_parse_launch (description, NULL);
  GError *error = pipeline_expect_error (pipeline);

  fail_unless (g_error_matches (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_SETTINGS), "%s",
               error->message);
  fail_unless (strstr (error->message, "not both") != NULL, "%s", error->message);
  g_error_free (error);
  gst_object_unref (pipeline);
  g_unlink (path);
  g_free (description);
  g_free (path);
}

GST_END_TEST;

/* An application thread streams text word by word, as an LLM does, while PLAYING. */
typedef struct
{
  GstElement *src;
  GMutex lock;
  GCond cond;
  gboolean first_received; /* the main thread has the first sentence */
  gboolean waited_in_vain;
  gboolean all_pushed;
} Streamer;

static const gchar *const streamed_words[]
    = {"Hello", " there", ",", " Mr.",   " Brown", ".",   " The", " weather", " is",
       " fine", " today", "!", " Shall", " we",    " go", " out", "?",        " Ok"};

static gpointer
stream_words (gpointer data)
{
  Streamer *streamer = data;

  for (guint i = 0; i < G_N_ELEMENTS (streamed_words); i++)
    {
      fail_unless (emit_push_text (streamer->src, streamed_words[i]));
      /* after "The" the first sentence is complete: it must reach the sink while the rest of
       * the turn is still to come */
      if (g_str_equal (streamed_words[i], " The"))
        {
          gint64 deadline = g_get_monotonic_time () + 10 * G_TIME_SPAN_SECOND;
          g_mutex_lock (&streamer->lock);
          while (!streamer->first_received)
            if (!g_cond_wait_until (&streamer->cond, &streamer->lock, deadline))
              {
                streamer->waited_in_vain = TRUE;
                break;
              }
          g_mutex_unlock (&streamer->lock);
        }
      g_usleep (G_TIME_SPAN_MILLISECOND);
    }
  g_mutex_lock (&streamer->lock);
  streamer->all_pushed = TRUE;
  g_mutex_unlock (&streamer->lock);
  fail_unless (emit_simple (streamer->src, "end-of-text"));
  return NULL;
}

GST_START_TEST (test_push_text_from_thread)
{
  GstElement *pipeline
      = gst_parse_launch ("gepardtextsrc name=src ! appsink name=sink sync=false", NULL);
  GstElement *sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  GstBus *bus = gst_element_get_bus (pipeline);
  const gchar *const expected[]
      = {"Hello there, Mr. Brown.", "The weather is fine today!", "Shall we go out?", "Ok", NULL};
  Streamer streamer = {0};
  GThread *thread;
  GstMessage *message;
  gchar *text;
  guint i = 0;

  streamer.src = gst_bin_get_by_name (GST_BIN (pipeline), "src");
  g_mutex_init (&streamer.lock);
  g_cond_init (&streamer.cond);

  /* a non-live source with no text yet: the pipeline stays ASYNC until the first sentence */
  fail_unless_equals_int (gst_element_set_state (pipeline, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_ASYNC);
  thread = g_thread_new ("streamer", stream_words, &streamer);

  while ((text = appsink_next_sentence (sink, NULL)) != NULL)
    {
      fail_unless (expected[i] != NULL, "unexpected sentence \"%s\"", text);
      fail_unless_equals_string (text, expected[i]);
      if (i == 0)
        {
          g_mutex_lock (&streamer.lock);
          fail_if (streamer.all_pushed, "the first sentence came only after the whole turn");
          streamer.first_received = TRUE;
          g_cond_signal (&streamer.cond);
          g_mutex_unlock (&streamer.lock);
        }
      g_free (text);
      i++;
    }
  fail_unless (expected[i] == NULL, "sentence \"%s\" missing", expected[i]);
  g_thread_join (thread);
  fail_if (streamer.waited_in_vain);

  message = gst_bus_timed_pop_filtered (bus, 10 * GST_SECOND, GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
  fail_unless (message != NULL);
  fail_unless_equals_int (GST_MESSAGE_TYPE (message), GST_MESSAGE_EOS);
  gst_message_unref (message);

  gst_element_set_state (pipeline, GST_STATE_NULL);
  g_mutex_clear (&streamer.lock);
  g_cond_clear (&streamer.cond);
  gst_object_unref (streamer.src);
  gst_object_unref (bus);
  gst_object_unref (sink);
  gst_object_unref (pipeline);
}

GST_END_TEST;

/* Text pushed before the pipeline starts waits for it. */
GST_START_TEST (test_push_before_start)
{
  GstElement *pipeline
      = gst_parse_launch ("gepardtextsrc name=src ! appsink name=sink sync=false", NULL);
  GstElement *src = gst_bin_get_by_name (GST_BIN (pipeline), "src");
  const gchar *const expected[] = {"Early text.", "Yes", NULL};

  fail_unless (emit_push_text (src, "Early text. Y"));
  fail_unless (emit_push_text (src, "es"));
  fail_unless (emit_simple (src, "end-of-text"));
  pipeline_expect_sentences (pipeline, expected);
  gst_object_unref (src);
  gst_object_unref (pipeline);
}

GST_END_TEST;

/* set_state(NULL) from another thread must return within `limit`, however the streaming
 * thread is waiting for text. */
typedef struct
{
  GstElement *pipeline;
  GMutex lock;
  GCond cond;
  gboolean done;
} StateSetter;

static gpointer
set_null (gpointer data)
{
  StateSetter *setter = data;
  gst_element_set_state (setter->pipeline, GST_STATE_NULL);
  g_mutex_lock (&setter->lock);
  setter->done = TRUE;
  g_cond_signal (&setter->cond);
  g_mutex_unlock (&setter->lock);
  return NULL;
}

static void
set_null_promptly (GstElement *pipeline)
{
  StateSetter setter = {.pipeline = pipeline};
  gint64 begin = g_get_monotonic_time ();
  gint64 deadline = begin + 5 * G_TIME_SPAN_SECOND;
  GThread *thread;
  GstState state;

  g_mutex_init (&setter.lock);
  g_cond_init (&setter.cond);
  thread = g_thread_new ("set-null", set_null, &setter);
  g_mutex_lock (&setter.lock);
  while (!setter.done)
    if (!g_cond_wait_until (&setter.cond, &setter.lock, deadline))
      break;
  g_mutex_unlock (&setter.lock);
  fail_unless (setter.done, "set_state(NULL) hung: the streaming thread was not woken");
  fail_unless (g_get_monotonic_time () - begin < 2 * G_TIME_SPAN_SECOND,
               "set_state(NULL) took %" G_GINT64_FORMAT " ms",
               (g_get_monotonic_time () - begin) / 1000);
  g_thread_join (thread);
  g_mutex_clear (&setter.lock);
  g_cond_clear (&setter.cond);
  gst_element_get_state (pipeline, &state, NULL, 0);
  fail_unless_equals_int (state, GST_STATE_NULL);
}

/* Waits until the source's streaming thread runs: it then sleeps in create() for text. */
static void
wait_for_streaming_thread (GstElement *pipeline)
{
  GstElement *src = gst_bin_get_by_name (GST_BIN (pipeline), "src");
  GstPad *pad = gst_element_get_static_pad (src, "src");
  gint64 deadline = g_get_monotonic_time () + 10 * G_TIME_SPAN_SECOND;

  while (gst_pad_get_task_state (pad) != GST_TASK_STARTED)
    {
      fail_unless (g_get_monotonic_time () < deadline, "the streaming thread never started");
      g_usleep (G_TIME_SPAN_MILLISECOND);
    }
  g_usleep (20 * G_TIME_SPAN_MILLISECOND);
  gst_object_unref (pad);
  gst_object_unref (src);
}

GST_START_TEST (test_stop_while_waiting_before_preroll)
{
  GstElement *pipeline = gst_parse_launch ("gepardtextsrc name=src ! fakesink", NULL);

  fail_unless_equals_int (gst_element_set_state (pipeline, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_ASYNC);
  wait_for_streaming_thread (pipeline);
  set_null_promptly (pipeline);
  gst_object_unref (pipeline);
}

GST_END_TEST;

GST_START_TEST (test_stop_while_waiting_mid_turn)
{
  GstElement *pipeline
      = gst_parse_launch ("gepardtextsrc name=src ! appsink name=sink sync=false", NULL);
  GstElement *src = gst_bin_get_by_name (GST_BIN (pipeline), "src");
  GstElement *sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  gchar *text;
  guint64 offset = G_MAXUINT64;

  fail_unless_equals_int (gst_element_set_state (pipeline, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_ASYNC);
  fail_unless (emit_push_text (src, "One. Tw"));
  text = appsink_next_sentence (sink, &offset);
  fail_unless_equals_string (text, "One.");
  g_free (text);
  fail_unless_equals_int (gst_element_get_state (pipeline, NULL, NULL, 10 * GST_SECOND),
                          GST_STATE_CHANGE_SUCCESS);

  /* the streaming thread now waits for the rest of "Tw…" */
  wait_for_streaming_thread (pipeline);
  set_null_promptly (pipeline);

  /* stopping dropped the unfinished turn; a new one starts from offset 0 */
  fail_unless_equals_int (gst_element_set_state (pipeline, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_ASYNC);
  fail_unless (emit_push_text (src, "Again. "));
  fail_unless (emit_simple (src, "end-of-text"));
  text = appsink_next_sentence (sink, &offset);
  fail_unless_equals_string (text, "Again.");
  fail_unless_equals_uint64 (offset, 0);
  g_free (text);
  fail_unless (appsink_next_sentence (sink, NULL) == NULL);

  gst_element_set_state (pipeline, GST_STATE_NULL);
  gst_object_unref (src);
  gst_object_unref (sink);
  gst_object_unref (pipeline);
}

GST_END_TEST;

/* After the turn's EOS the element takes no more text until READY; then a new turn starts,
 * with text pushed while in READY, and offsets from 0 again. */
GST_START_TEST (test_second_turn)
{
  GstHarness *h = harness_new ();

  gst_harness_play (h);
  fail_unless (emit_push_text (h->element, "First turn."));
  fail_unless (emit_simple (h->element, "end-of-text"));
  harness_expect_stream_start (h);
  harness_expect_sentence (h, "First turn.", 0);
  harness_expect_eos (h);
  fail_if (emit_push_text (h->element, "Too late."));

  fail_unless_equals_int (gst_element_set_state (h->element, GST_STATE_READY),
                          GST_STATE_CHANGE_SUCCESS);
  fail_unless (emit_push_text (h->element, "Second turn. And"));
  fail_unless (emit_simple (h->element, "end-of-text"));
  fail_unless_equals_int (gst_element_set_state (h->element, GST_STATE_PLAYING),
                          GST_STATE_CHANGE_SUCCESS);
  harness_expect_stream_start (h);
  harness_expect_sentence (h, "Second turn.", 0);
  harness_expect_sentence (h, "And", 1);
  harness_expect_eos (h);
  gst_harness_teardown (h);
}

GST_END_TEST;

static Suite *
gepardtextsrc_suite (void)
{
  Suite *s = suite_create ("gepardtextsrc");
  TCase *tc = tcase_create ("general");

  suite_add_tcase (s, tc);
  tcase_add_test (tc, test_properties);
  tcase_add_test (tc, test_text_property);
  tcase_add_test (tc, test_empty_text);
  tcase_add_test (tc, test_push_text_signals);
  tcase_add_test (tc, test_max_sentence_length);
  tcase_add_test (tc, test_pipeline_text);
  tcase_add_test (tc, test_pipeline_fakesink);
  tcase_add_test (tc, test_location);
  tcase_add_test (tc, test_location_invalid_utf8);
  tcase_add_test (tc, test_location_missing);
  tcase_add_test (tc, test_text_and_location);
  tcase_add_test (tc, test_push_text_from_thread);
  tcase_add_test (tc, test_push_before_start);
  tcase_add_test (tc, test_stop_while_waiting_before_preroll);
  tcase_add_test (tc, test_stop_while_waiting_mid_turn);
  tcase_add_test (tc, test_second_turn);
  return s;
}

GST_CHECK_MAIN (gepardtextsrc);
