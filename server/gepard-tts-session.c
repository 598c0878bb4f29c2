/* gepard-tts-session.c: a generation as a pipeline, its output marshalled to the main context.
 *
 * Threads: the pipeline's one streaming thread (gepardtextsrc's) runs gepardlm, gepardcodec, the
 * converters and the appsink callbacks in turn, so the order in which it posts events is the
 * order of the audio. Its events go into `events` under `lock`; one idle source on the main
 * context drains them. The source is attached even when posting from the main thread (a bus
 * error during the state change), so callbacks never run inside this module's own calls.
 *
 * Sentence ends: a buffer probe on gepardlm's sink pad sees each sentence go in; gepardlm
 * generates it inside that push, so the upstream pad becomes idle exactly when the sentence has
 * been spoken. A one-shot idle probe added during the push fires then. The sentence's span is
 * read from the timestamps gepardlm puts on its frames, so no frame length is assumed here.
 *
 * Flushes: gepardtextsrc splits the text into sentences; a second splitter here, fed the same
 * pieces, counts the sentences it will send (splitting does not depend on how text is cut), so
 * a flush is complete once that many sentences have been spoken. */
#include "gepard-tts-session.h"

#include "gepard-api-error.h"
#include "gepard-sentences.h"
#include "gstgepardcontext.h"

#include <gst/app/gstappsink.h>
#include <string.h>

typedef enum
{
  EVENT_AUDIO,
  EVENT_SENTENCE,
  EVENT_FLUSHED,
  EVENT_EOS,
  EVENT_ERROR,
} EventType;

typedef struct
{
  EventType type;
  GBytes *audio;
  char *text;
  double start, end;
  guint flush_id;
  GError *error;
} Event;

typedef struct
{
  guint id;
  guint sentences; /* spoken sentences that complete it */
} FlushMark;

struct _GepardTtsSession
{
  gint ref_count;
  GMainContext *context;
  GepardTtsSessionCallbacks callbacks;
  gpointer user_data;

  /* main thread */
  GstElement *pipeline; /* NULL once closed */
  GstElement *text_src;
  GepardSentenceSplitter *mirror;
  guint sentences_queued;
  guint sentences_spoken;
  GQueue flushes; /* FlushMark, oldest first */
  guint n_flushes;
  gboolean input_ended;
  gboolean closed;
  gboolean finished;
  gint64 first_text_time;
  gint64 first_audio_time;

  /* any thread, under `lock` */
  GMutex lock;
  GQueue events;
  gboolean dispatch_pending;
  gboolean shut;     /* closed: events are dropped */
  gboolean held;     /* the streaming thread waits before posting audio */
  GCond unheld;      /* held or shut changed */
  GError *bus_error; /* the first error the pipeline posted */
  char *sentence;    /* the sentence gepardlm is speaking */
  GstClockTime sentence_start;
  GstClockTime frames_end; /* end of the last frame gepardlm pushed */
};

static gint live_pipelines;

guint
gepard_tts_session_count_pipelines (void)
{
  return (guint)g_atomic_int_get (&live_pipelines);
}

static void
on_pipeline_finalized (gpointer data, GObject *where_the_object_was)
{
  g_atomic_int_add (&live_pipelines, -1);
}

static void
event_free (Event *e)
{
  g_clear_pointer (&e->audio, g_bytes_unref);
  g_free (e->text);
  g_clear_error (&e->error);
  g_free (e);
}

static GepardTtsSession *
session_ref (GepardTtsSession *s)
{
  g_atomic_int_inc (&s->ref_count);
  return s;
}

static void
session_unref (gpointer data)
{
  GepardTtsSession *s = data;
  if (!g_atomic_int_dec_and_test (&s->ref_count))
    return;
  g_warn_if_fail (s->pipeline == NULL);
  g_queue_clear_full (&s->events, (GDestroyNotify)event_free);
  g_queue_clear_full (&s->flushes, g_free);
  g_clear_error (&s->bus_error);
  g_free (s->sentence);
  g_clear_pointer (&s->mirror, gepard_sentence_splitter_free);
  g_mutex_clear (&s->lock);
  g_cond_clear (&s->unheld);
  g_main_context_unref (s->context);
  g_free (s);
}

/* ---- main thread: dispatching what the pipeline posted ---- */

static void
report_flushes (GepardTtsSession *s, gboolean all)
{
  FlushMark *mark;
  while (!s->closed && (mark = g_queue_peek_head (&s->flushes)) != NULL
         && (all || mark->sentences <= s->sentences_spoken))
    {
      g_queue_pop_head (&s->flushes);
      guint id = mark->id;
      g_free (mark);
      if (s->callbacks.flushed != NULL)
        s->callbacks.flushed (s, id, s->user_data);
    }
}

static void
handle_event (GepardTtsSession *s, Event *e)
{
  switch (e->type)
    {
    case EVENT_AUDIO:
      if (s->first_audio_time == 0)
        s->first_audio_time = g_get_monotonic_time ();
      s->callbacks.audio (s, e->audio, s->user_data);
      break;
    case EVENT_SENTENCE:
      s->sentences_spoken++;
      if (s->callbacks.sentence != NULL && e->end > e->start)
        s->callbacks.sentence (s, e->text, e->start, e->end, s->user_data);
      report_flushes (s, FALSE);
      break;
    case EVENT_FLUSHED:
      if (s->callbacks.flushed != NULL)
        s->callbacks.flushed (s, e->flush_id, s->user_data);
      break;
    case EVENT_EOS:
      report_flushes (s, TRUE);
      if (!s->closed)
        {
          s->finished = TRUE;
          s->callbacks.done (s, NULL, s->user_data);
        }
      break;
    case EVENT_ERROR:
      s->finished = TRUE;
      s->callbacks.done (s, e->error, s->user_data);
      break;
    }
}

/* Audio that queued up while this thread was busy goes out as one piece (up to MERGED_AUDIO_BYTES):
 * a loaded server then sends fewer, larger chunks instead of falling further behind. */
#define MERGED_AUDIO_BYTES (64 * 1024)

static void
merge_audio (Event *e, GQueue *events)
{
  Event *next = g_queue_peek_head (events);
  if (next == NULL || next->type != EVENT_AUDIO)
    return;
  g_autoptr (GByteArray) merged = g_byte_array_new ();
  gsize size;
  const guint8 *data = g_bytes_get_data (e->audio, &size);
  g_byte_array_append (merged, data, size);
  while ((next = g_queue_peek_head (events)) != NULL && next->type == EVENT_AUDIO
         && merged->len + g_bytes_get_size (next->audio) <= MERGED_AUDIO_BYTES)
    {
      data = g_bytes_get_data (next->audio, &size);
      g_byte_array_append (merged, data, size);
      event_free (g_queue_pop_head (events));
    }
  g_bytes_unref (e->audio);
  e->audio = g_byte_array_free_to_bytes (g_steal_pointer (&merged));
}

static gboolean
dispatch (gpointer data)
{
  GepardTtsSession *s = data;
  GQueue events = G_QUEUE_INIT;

  g_mutex_lock (&s->lock);
  events = s->events;
  g_queue_init (&s->events);
  s->dispatch_pending = FALSE;
  g_mutex_unlock (&s->lock);

  Event *e;
  while ((e = g_queue_pop_head (&events)) != NULL)
    {
      if (e->type == EVENT_AUDIO)
        merge_audio (e, &events);
      /* a callback may close the session: nothing more reaches its owner then */
      if (!s->closed && !s->finished)
        handle_event (s, e);
      event_free (e);
    }
  return G_SOURCE_REMOVE;
}

/* Any thread. */
static void
post_event (GepardTtsSession *s, Event *e)
{
  gboolean schedule;

  g_mutex_lock (&s->lock);
  if (s->shut)
    {
      g_mutex_unlock (&s->lock);
      event_free (e);
      return;
    }
  g_queue_push_tail (&s->events, e);
  schedule = !s->dispatch_pending;
  s->dispatch_pending = TRUE;
  g_mutex_unlock (&s->lock);

  if (schedule)
    {
      GSource *source = g_idle_source_new ();
      g_source_set_priority (source, G_PRIORITY_DEFAULT);
      g_source_set_callback (source, dispatch, session_ref (s), session_unref);
      g_source_set_static_name (source, "gepard-tts-session");
      g_source_attach (source, s->context);
      g_source_unref (source);
    }
}

static Event *
event_new (EventType type)
{
  Event *e = g_new0 (Event, 1);
  e->type = type;
  return e;
}

/* ---- streaming thread ---- */

static GstFlowReturn
on_new_sample (GstAppSink *sink, gpointer user_data)
{
  GepardTtsSession *s = user_data;
  GstSample *sample = gst_app_sink_pull_sample (sink);
  if (sample == NULL)
    return GST_FLOW_FLUSHING;

  /* the owner's client is behind: wait here, which stops the pipeline upstream */
  g_mutex_lock (&s->lock);
  while (s->held && !s->shut)
    g_cond_wait (&s->unheld, &s->lock);
  g_mutex_unlock (&s->lock);

  GstBuffer *buffer = gst_sample_get_buffer (sample);
  gsize size = buffer != NULL ? gst_buffer_get_size (buffer) : 0;
  if (size > 0)
    {
      Event *e = event_new (EVENT_AUDIO);
      gpointer data = g_malloc (size);
      gst_buffer_extract (buffer, 0, data, size);
      e->audio = g_bytes_new_take (data, size);
      post_event (s, e);
    }
  gst_sample_unref (sample);
  return GST_FLOW_OK;
}

static void
on_eos (GstAppSink *sink, gpointer user_data)
{
  post_event (user_data, event_new (EVENT_EOS));
}

/* Maps the pipeline's error to what a client is told. */
static GError *
api_error_from_gst (const GError *gst_error, const char *debug)
{
  if (g_error_matches (gst_error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_BUSY))
    return g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_TOO_MANY_CONTEXTS,
                        "The engine is at capacity: %s", gst_error->message);
  return g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL, "Generation failed: %s",
                      gst_error->message);
}

static GstBusSyncReply
on_bus_message (GstBus *bus, GstMessage *message, gpointer user_data)
{
  GepardTtsSession *s = user_data;

  if (GST_MESSAGE_TYPE (message) == GST_MESSAGE_ERROR)
    {
      g_autoptr (GError) error = NULL;
      g_autofree char *debug = NULL;
      gst_message_parse_error (message, &error, &debug);
      g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_MESSAGE, "MESSAGE",
                        "pipeline error from %s: %s (%s)", GST_OBJECT_NAME (message->src),
                        error->message, debug != NULL ? debug : "");
      g_mutex_lock (&s->lock);
      gboolean first = s->bus_error == NULL;
      if (first)
        s->bus_error = api_error_from_gst (error, debug);
      g_mutex_unlock (&s->lock);
      if (first)
        {
          Event *e = event_new (EVENT_ERROR);
          e->error = api_error_from_gst (error, debug);
          post_event (s, e);
        }
    }
  /* no watch reads this bus: whatever is not dropped would pile up in it; a sync handler that
   * drops a message owns it */
  gst_message_unref (message);
  return GST_BUS_DROP;
}

static GstPadProbeReturn
on_frame (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  GepardTtsSession *s = user_data;
  GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER (info);
  if (GST_BUFFER_PTS_IS_VALID (buffer))
    {
      GstClockTime end = GST_BUFFER_PTS (buffer);
      if (GST_BUFFER_DURATION_IS_VALID (buffer))
        end += GST_BUFFER_DURATION (buffer);
      g_mutex_lock (&s->lock);
      s->frames_end = end;
      g_mutex_unlock (&s->lock);
    }
  return GST_PAD_PROBE_OK;
}

static GstPadProbeReturn
on_sentence_spoken (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  GepardTtsSession *s = user_data;
  Event *e = event_new (EVENT_SENTENCE);

  g_mutex_lock (&s->lock);
  e->text = g_steal_pointer (&s->sentence);
  e->start = (double)s->sentence_start / GST_SECOND;
  e->end = (double)s->frames_end / GST_SECOND;
  g_mutex_unlock (&s->lock);
  if (e->text == NULL)
    e->text = g_strdup ("");
  post_event (s, e);
  return GST_PAD_PROBE_REMOVE;
}

static GstPadProbeReturn
on_sentence (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  GepardTtsSession *s = user_data;
  GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER (info);
  GstMapInfo map;
  char *text = NULL;

  if (gst_buffer_map (buffer, &map, GST_MAP_READ))
    {
      text = g_strndup ((const char *)map.data, map.size);
      gst_buffer_unmap (buffer, &map);
    }
  g_mutex_lock (&s->lock);
  g_free (s->sentence);
  s->sentence = text;
  s->sentence_start = s->frames_end;
  g_mutex_unlock (&s->lock);

  /* the upstream pad is busy with this push until gepardlm has spoken the sentence */
  GstPad *upstream = gst_pad_get_peer (pad);
  if (upstream != NULL)
    {
      gst_pad_add_probe (upstream, GST_PAD_PROBE_TYPE_IDLE, on_sentence_spoken, session_ref (s),
                         session_unref);
      gst_object_unref (upstream);
    }
  return GST_PAD_PROBE_OK;
}

/* ---- building ---- */

static GstElement *
get_element (GstElement *pipeline, const char *name, GError **error)
{
  GstElement *element = gst_bin_get_by_name (GST_BIN (pipeline), name);
  if (element == NULL)
    g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                 "The pipeline description has no element named \"%s\"", name);
  return element;
}

static void
set_if_property (GstElement *element, const char *name, const char *value)
{
  if (value != NULL && g_object_class_find_property (G_OBJECT_GET_CLASS (element), name) != NULL)
    g_object_set (element, name, value, NULL);
}

static gboolean
add_pad_probe (GstElement *element, const char *pad_name, GstPadProbeCallback callback,
               GepardTtsSession *s, GError **error)
{
  g_autoptr (GstPad) pad = gst_element_get_static_pad (element, pad_name);
  if (pad == NULL)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL, "%s has no %s pad",
                   GST_ELEMENT_NAME (element), pad_name);
      return FALSE;
    }
  gst_pad_add_probe (pad, GST_PAD_PROBE_TYPE_BUFFER, callback, session_ref (s), session_unref);
  return TRUE;
}

static gboolean
configure (GepardTtsSession *s, const GepardTtsSessionSetup *setup, GError **error)
{
  g_autoptr (GstElement) lm = get_element (s->pipeline, "lm", error);
  if (lm == NULL)
    return FALSE;
  g_autoptr (GstElement) codec = get_element (s->pipeline, "codec", error);
  if (codec == NULL)
    return FALSE;
  g_autoptr (GstElement) format = get_element (s->pipeline, "format", error);
  if (format == NULL)
    return FALSE;
  g_autoptr (GstElement) sink = get_element (s->pipeline, "sink", error);
  if (sink == NULL)
    return FALSE;
  s->text_src = get_element (s->pipeline, "text", error);
  if (s->text_src == NULL)
    return FALSE;
  if (!GST_IS_APP_SINK (sink) || g_signal_lookup ("push-text", G_OBJECT_TYPE (s->text_src)) == 0)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                           "The pipeline's \"text\" must be a gepardtextsrc and its \"sink\" an "
                           "appsink");
      return FALSE;
    }

  /* The engine travels as a context; model= and device= name the same engine, so that elements
   * that do not look for the context yet still share it. */
  GstContext *context = gst_gepard_engine_context_new (setup->engine);
  gst_element_set_context (s->pipeline, context);
  gst_context_unref (context);

  set_if_property (lm, "model", setup->model);
  set_if_property (lm, "device", setup->device);
  g_object_set (lm, "voice", setup->voice_id, NULL);
  if (setup->max_frames > 0)
    g_object_set (lm, "max-frames", setup->max_frames, NULL);
  if (setup->ignore_stop)
    g_object_set (lm, "ignore-stop", TRUE, NULL);
  if (setup->codec_path != NULL)
    set_if_property (codec, "codec", setup->codec_path);
  else
    {
      set_if_property (codec, "model", setup->model);
      set_if_property (codec, "device", setup->device);
    }

  g_autofree char *caps_text = gepard_output_format_caps (&setup->format);
  GstCaps *caps = gst_caps_from_string (caps_text);
  g_object_set (format, "caps", caps, NULL);
  gst_caps_unref (caps);

  GstAppSinkCallbacks callbacks = {0};
  callbacks.eos = on_eos;
  callbacks.new_sample = on_new_sample;
  gst_app_sink_set_callbacks (GST_APP_SINK (sink), &callbacks, session_ref (s), session_unref);

  g_autoptr (GstBus) bus = gst_element_get_bus (s->pipeline);
  gst_bus_set_sync_handler (bus, on_bus_message, session_ref (s), session_unref);

  return add_pad_probe (lm, "sink", on_sentence, s, error)
         && add_pad_probe (lm, "src", on_frame, s, error);
}

GepardTtsSession *
gepard_tts_session_new (const GepardTtsSessionSetup *setup,
                        const GepardTtsSessionCallbacks *callbacks, gpointer user_data,
                        GError **error)
{
  g_autoptr (GError) parse_error = NULL;
  GstElement *pipeline
      = gst_parse_launch_full (setup->description, NULL, GST_PARSE_FLAG_FATAL_ERRORS, &parse_error);
  if (pipeline == NULL)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                   "Could not build the pipeline: %s",
                   parse_error != NULL ? parse_error->message : "unknown error");
      return NULL;
    }
  if (!GST_IS_PIPELINE (pipeline))
    {
      gst_object_unref (pipeline);
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                           "The pipeline description holds a single element");
      return NULL;
    }
  g_atomic_int_inc (&live_pipelines);
  g_object_weak_ref (G_OBJECT (pipeline), on_pipeline_finalized, NULL);

  GepardTtsSession *s = g_new0 (GepardTtsSession, 1);
  s->ref_count = 1;
  s->context = g_main_context_ref_thread_default ();
  s->callbacks = *callbacks;
  s->user_data = user_data;
  s->pipeline = gst_object_ref_sink (pipeline);
  s->mirror = gepard_sentence_splitter_new (GEPARD_SENTENCES_DEFAULT_MAX_CHARS);
  g_mutex_init (&s->lock);
  g_cond_init (&s->unheld);
  g_queue_init (&s->events);
  g_queue_init (&s->flushes);
  s->frames_end = 0;

  if (!configure (s, setup, error))
    {
      gepard_tts_session_close (s);
      return NULL;
    }
  return s;
}

gboolean
gepard_tts_session_start (GepardTtsSession *s, GError **error)
{
  g_return_val_if_fail (s->pipeline != NULL, FALSE);

  /* the sink does not preroll (async=false), so this returns without waiting for audio */
  if (gst_element_set_state (s->pipeline, GST_STATE_PLAYING) != GST_STATE_CHANGE_FAILURE)
    return TRUE;

  g_mutex_lock (&s->lock);
  if (s->bus_error != NULL)
    g_propagate_error (error, g_error_copy (s->bus_error));
  else
    g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                         "The pipeline did not start");
  g_mutex_unlock (&s->lock);
  return FALSE;
}

gboolean
gepard_tts_session_push_text (GepardTtsSession *s, const char *text, GError **error)
{
  g_autoptr (GError) local = NULL;
  gboolean ok = FALSE;

  if (s->input_ended)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "The context has already received its last input");
      return FALSE;
    }
  if (text == NULL || text[0] == '\0')
    return TRUE;
  g_autoptr (GPtrArray) sentences = gepard_sentence_splitter_push (s->mirror, text, -1, &local);
  if (sentences == NULL)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                   "The transcript is not valid text: %s", local->message);
      return FALSE;
    }
  s->sentences_queued += sentences->len;
  if (s->first_text_time == 0)
    s->first_text_time = g_get_monotonic_time ();
  g_signal_emit_by_name (s->text_src, "push-text", text, &ok);
  if (!ok)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                           "The text source refused the transcript");
      return FALSE;
    }
  return TRUE;
}

guint
gepard_tts_session_flush (GepardTtsSession *s)
{
  gboolean ok = FALSE;
  guint id = ++s->n_flushes;

  if (!s->input_ended)
    {
      g_autoptr (GPtrArray) sentences = gepard_sentence_splitter_flush (s->mirror);
      s->sentences_queued += sentences->len;
      g_signal_emit_by_name (s->text_src, "flush", &ok);
    }
  if (s->sentences_spoken >= s->sentences_queued)
    {
      Event *e = event_new (EVENT_FLUSHED);
      e->flush_id = id;
      post_event (s, e);
    }
  else
    {
      FlushMark *mark = g_new (FlushMark, 1);
      mark->id = id;
      mark->sentences = s->sentences_queued;
      g_queue_push_tail (&s->flushes, mark);
    }
  return id;
}

void
gepard_tts_session_end_input (GepardTtsSession *s)
{
  gboolean ok = FALSE;

  if (s->input_ended)
    return;
  s->input_ended = TRUE;
  g_autoptr (GPtrArray) sentences = gepard_sentence_splitter_flush (s->mirror);
  s->sentences_queued += sentences->len;
  g_signal_emit_by_name (s->text_src, "end-of-text", &ok);
}

gboolean
gepard_tts_session_input_ended (GepardTtsSession *s)
{
  return s->input_ended;
}

void
gepard_tts_session_set_held (GepardTtsSession *s, gboolean held)
{
  g_mutex_lock (&s->lock);
  s->held = held;
  g_cond_broadcast (&s->unheld);
  g_mutex_unlock (&s->lock);
}

double
gepard_tts_session_get_first_audio_latency (GepardTtsSession *s)
{
  if (s->first_audio_time == 0 || s->first_text_time == 0)
    return -1;
  return (s->first_audio_time - s->first_text_time) / 1e6;
}

/* A GStreamer worker thread: never the main loop (the state change waits for the streaming
 * thread to stop) and never the streaming thread itself (that deadlocks). */
static void
stop_pipeline (GstElement *pipeline, gpointer unused)
{
  gst_element_set_state (pipeline, GST_STATE_NULL);

  /* drop the references the callbacks hold on the session now rather than at finalization */
  g_autoptr (GstBus) bus = gst_element_get_bus (pipeline);
  gst_bus_set_sync_handler (bus, NULL, NULL, NULL);
  g_autoptr (GstElement) sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  if (sink != NULL && GST_IS_APP_SINK (sink))
    {
      GstAppSinkCallbacks none = {0};
      gst_app_sink_set_callbacks (GST_APP_SINK (sink), &none, NULL, NULL);
    }
}

void
gepard_tts_session_close (GepardTtsSession *s)
{
  if (s == NULL)
    return;
  s->closed = TRUE;
  g_mutex_lock (&s->lock);
  s->shut = TRUE;
  g_queue_clear_full (&s->events, (GDestroyNotify)event_free);
  g_cond_broadcast (&s->unheld);
  g_mutex_unlock (&s->lock);

  gst_clear_object (&s->text_src);
  if (s->pipeline != NULL)
    {
      /* the call holds its own reference until the pipeline is down */
      gst_element_call_async (s->pipeline, stop_pipeline, NULL, NULL);
      gst_clear_object (&s->pipeline);
    }
  session_unref (s);
}
