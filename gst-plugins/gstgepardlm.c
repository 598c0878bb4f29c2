/* gstgepardlm.c: gepardlm, the GEPARD language model as an element.
 *
 * Threads: the engine's scheduler thread only appends each frame to the sentence's queue and
 * signals; the streaming thread that brought the sentence (upstream's, inside the chain function)
 * waits on that queue and pushes, so a slow downstream never holds up the engine. Sentences are
 * generated one after the other: the next is submitted when the previous one has ended, so the
 * output order is the input order with nothing to reorder, and no extra thread is needed
 * (gstreamer-notes.md §3.3).
 */

/**
 * SECTION:element-gepardlm
 * @title: gepardlm
 *
 * Turns each sentence of text (one buffer per sentence, as gepardtextsrc sends them) into GEPARD
 * frames: one buffer per frame holding the frame's 32 channel codes, pushed as soon as the engine
 * samples it, timestamped on one frame timeline for the whole turn. With frames-per-buffer above
 * 1, frames that piled up while downstream was busy go out together (up to that many in a buffer,
 * never two sentences in one), so that gepardcodec decodes them in one job: on a GPU, one pass of
 * several frames instead of one pass each. The model runs in the
 * process-wide engine for (model, device), shared with every other pipeline naming the same
 * model and device.
 *
 * ## Example launch line
 * |[
 * gst-launch-1.0 gepardtextsrc text="Hello there." ! gepardlm model=/path/to/model ! \
 *     gepardcodec model=/path/to/model ! audioconvert ! audioresample ! autoaudiosink
 * ]|
 */
#include "gstgepardlm.h"

#include "gstgepardelements.h"
#include "gstgepardengine.h"
#include "gstgepardvoiceload.h"

#include "gepard-engine.h"
#include "gepard-tokenizer.h"
#include "gepard-voice.h"

GST_DEBUG_CATEGORY_STATIC (gst_gepard_lm_debug);
#define GST_CAT_DEFAULT gst_gepard_lm_debug

/* the codec's hop and rate: a frame is 1024 samples at 22050 Hz (nanocodec.md §1) */
#define FRAME_SAMPLES 1024
#define SAMPLE_RATE 22050

#define DEFAULT_DEVICE "auto"
#define DEFAULT_VOICE "default"
#define DEFAULT_TEMPERATURE -1.0
#define DEFAULT_TOP_K 0
#define DEFAULT_REPETITION_PENALTY 1.0
#define DEFAULT_CFG_SCALE -1.0
#define DEFAULT_MAX_FRAMES 2000
#define DEFAULT_FRAMES_PER_BUFFER 1
#define DEFAULT_SEED 0

enum
{
  PROP_0,
  PROP_MODEL,
  PROP_DEVICE,
  PROP_VOICE,
  PROP_TEMPERATURE,
  PROP_TOP_K,
  PROP_REPETITION_PENALTY,
  PROP_CFG_SCALE,
  PROP_MAX_FRAMES,
  PROP_IGNORE_STOP,
  PROP_SEED,
  PROP_FRAMES,
  PROP_FRAMES_PER_BUFFER,
};

/* One sentence's frames on their way from the engine's scheduler thread to the streaming thread.
 * The engine holds a reference through the utterance's user data, so a frame or `done` that
 * arrives after a flush, or after the element is gone, touches only this. */
typedef struct
{
  gatomicrefcount ref_count;
  GMutex lock;
  GCond cond;
  GArray *codes; /* gint32 [n][32]: frames sampled, not yet taken by the streaming thread */
  gboolean ended;
  GepardUtteranceEnd end;
  GError *error;    /* why the engine failed it (end FAILED) */
  gint interrupted; /* atomic; flush or stop: the streaming thread returns, queued frames are
                       dropped */
} Generation;

struct _GstGepardLm
{
  GstElement parent;
  GstPad *sinkpad;
  GstPad *srcpad;

  /* properties; GST_OBJECT_LOCK */
  char *model;
  char *device;
  char *voice;
  double temperature;
  int top_k;
  double repetition_penalty;
  double cfg_scale;
  int max_frames;
  gboolean ignore_stop;
  guint64 seed;
  guint frames_per_buffer;
  guint64 frames_pushed;

  GepardEngine *context_engine; /* from a "gepard.engine" context; GST_OBJECT_LOCK */

  /* from start () to stop () */
  GepardEngine *engine;
  GepardVoice *prefix;

  /* streaming thread (and state changes while it is stopped) */
  guint64 n_frames;    /* the next frame's number in the turn: its PTS and offset */
  guint64 n_sentences; /* sentences submitted in the turn: the next one's seed offset */
  gboolean need_segment;
  gboolean discont;

  /* lock: what FLUSH_START and PAUSED→READY need to stop the streaming thread from another
   * thread */
  GMutex lock;
  gboolean flushing;
  Generation *generation;
  GepardUtterance *utterance;
};

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE (
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS (GEPARD_TEXT_CAPS));

static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE (
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS (GEPARD_CODES_CAPS));

#define gst_gepard_lm_parent_class parent_class
G_DEFINE_TYPE (GstGepardLm, gst_gepard_lm, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE (gepardlm, "gepardlm", GST_RANK_NONE, GST_TYPE_GEPARD_LM,
                                       GST_DEBUG_CATEGORY_INIT (gst_gepard_lm_debug, "gepardlm", 0,
                                                                "GEPARD language model"));

/* ---- the hand-over from the scheduler thread ---- */

static Generation *
generation_new (void)
{
  Generation *g = g_new0 (Generation, 1);
  g_atomic_ref_count_init (&g->ref_count);
  g_mutex_init (&g->lock);
  g_cond_init (&g->cond);
  g->codes = g_array_new (FALSE, FALSE, sizeof (gint32));
  return g;
}

static Generation *
generation_ref (Generation *g)
{
  g_atomic_ref_count_inc (&g->ref_count);
  return g;
}

static void
generation_unref (gpointer data)
{
  Generation *g = data;
  if (!g_atomic_ref_count_dec (&g->ref_count))
    return;
  g_array_unref (g->codes);
  g_clear_error (&g->error);
  g_mutex_clear (&g->lock);
  g_cond_clear (&g->cond);
  g_free (g);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC (Generation, generation_unref)

/* Scheduler thread: queue and return at once, whatever downstream is doing. */
static void
on_frame (GepardUtterance *utterance, const gint32 *codes, int index, gpointer user_data)
{
  Generation *g = user_data;
  g_mutex_lock (&g->lock);
  if (!g->interrupted)
    g_array_append_vals (g->codes, codes, GEPARD_CODES_CHANNELS);
  g_cond_signal (&g->cond);
  g_mutex_unlock (&g->lock);
}

static void
on_done (GepardUtterance *utterance, GepardUtteranceEnd end, int n_frames, gpointer user_data)
{
  Generation *g = user_data;
  g_mutex_lock (&g->lock);
  g->ended = TRUE;
  g->end = end;
  if (end == GEPARD_UTTERANCE_FAILED && gepard_utterance_get_error (utterance) != NULL)
    g->error = g_error_copy (gepard_utterance_get_error (utterance));
  g_cond_signal (&g->cond);
  g_mutex_unlock (&g->lock);
}

static const GepardUtteranceCallbacks utterance_callbacks = {on_frame, on_done};

/* Any thread: the streaming thread stops waiting, the engine stops generating, and every later
 * sentence is refused until FLUSH_STOP or the next start. */
static void
gst_gepard_lm_interrupt (GstGepardLm *self)
{
  g_mutex_lock (&self->lock);
  self->flushing = TRUE;
  Generation *g = self->generation ? generation_ref (self->generation) : NULL;
  GepardUtterance *u = self->utterance ? gepard_utterance_ref (self->utterance) : NULL;
  g_mutex_unlock (&self->lock);

  /* the waiter first: a `done` that the cancel brings must not look like a normal end to it */
  if (g != NULL)
    {
      g_mutex_lock (&g->lock);
      g_atomic_int_set (&g->interrupted, TRUE);
      g_cond_broadcast (&g->cond);
      g_mutex_unlock (&g->lock);
      generation_unref (g);
    }
  if (u != NULL)
    {
      gepard_utterance_cancel (u);
      gepard_utterance_unref (u);
    }
}

/* ---- timestamps and sticky events ---- */

/* gstreamer-notes.md §5 item 11: from the frame counter, never a sum of rounded durations, so
 * the timeline does not drift. */
static GstClockTime
frame_pts (guint64 n)
{
  return gst_util_uint64_scale_int_round (n * FRAME_SAMPLES, GST_SECOND, SAMPLE_RATE);
}

/* A new turn (start, stream start, flush): frames count from zero on a fresh segment. */
static void
gst_gepard_lm_reset_turn (GstGepardLm *self)
{
  self->n_frames = 0;
  self->n_sentences = 0;
  self->need_segment = TRUE;
  self->discont = TRUE;
}

/* Our output is frame time from the start of the turn whatever upstream's text segment was, and
 * its caps are fixed: stream-start, caps and segment go out before the first frame or EOS even
 * when upstream sent none of them. */
static gboolean
gst_gepard_lm_ensure_events (GstGepardLm *self)
{
  GstEvent *sticky = gst_pad_get_sticky_event (self->srcpad, GST_EVENT_STREAM_START, 0);
  if (sticky != NULL)
    gst_event_unref (sticky);
  else
    {
      g_autofree char *stream_id
          = gst_pad_create_stream_id (self->srcpad, GST_ELEMENT (self), NULL);
      if (!gst_pad_push_event (self->srcpad, gst_event_new_stream_start (stream_id)))
        GST_DEBUG_OBJECT (self, "downstream did not take stream-start");
    }
  if (!gst_pad_has_current_caps (self->srcpad))
    {
      GstCaps *caps = gst_pad_get_pad_template_caps (self->srcpad);
      gboolean ok = gst_pad_push_event (self->srcpad, gst_event_new_caps (caps));
      gst_caps_unref (caps);
      if (!ok)
        return FALSE;
    }
  if (self->need_segment)
    {
      GstSegment segment;
      gst_segment_init (&segment, GST_FORMAT_TIME);
      self->need_segment = FALSE;
      gst_pad_push_event (self->srcpad, gst_event_new_segment (&segment));
    }
  return TRUE;
}

/* ---- streaming ---- */

/* n frames ([n][32] codes) in one buffer */
static GstFlowReturn
gst_gepard_lm_push_frames_buffer (GstGepardLm *self, const gint32 *codes, guint n)
{
  if (!gst_gepard_lm_ensure_events (self))
    return GST_FLOW_NOT_NEGOTIATED;

  GstBuffer *buffer
      = gst_buffer_new_memdup (codes, (gsize)n * GEPARD_CODES_CHANNELS * sizeof (gint32));
  guint64 first = self->n_frames;
  self->n_frames += n;
  GST_BUFFER_PTS (buffer) = frame_pts (first);
  GST_BUFFER_DURATION (buffer) = frame_pts (first + n) - frame_pts (first);
  GST_BUFFER_OFFSET (buffer) = first;
  GST_BUFFER_OFFSET_END (buffer) = first + n;
  if (self->discont)
    {
      GST_BUFFER_FLAG_SET (buffer, GST_BUFFER_FLAG_DISCONT);
      self->discont = FALSE;
    }
  GstFlowReturn ret = gst_pad_push (self->srcpad, buffer);
  if (ret == GST_FLOW_OK)
    {
      GST_OBJECT_LOCK (self);
      self->frames_pushed += n;
      GST_OBJECT_UNLOCK (self);
    }
  return ret;
}

/* Pushes the generation's frames as they come until it ends. Waits with no lock but the
 * generation's own; FLUSH_START and PAUSED→READY wake it through `interrupted`, and a push
 * blocked downstream is released by the flush travelling downstream. */
static GstFlowReturn
gst_gepard_lm_push_frames (GstGepardLm *self, Generation *g, guint *n_pushed,
                           gint64 *first_frame_time, GepardUtteranceEnd *end)
{
  g_autoptr (GArray) taken = g_array_new (FALSE, FALSE, sizeof (gint32));
  GST_OBJECT_LOCK (self);
  const guint per_buffer = self->frames_per_buffer;
  GST_OBJECT_UNLOCK (self);

  for (;;)
    {
      g_mutex_lock (&g->lock);
      while (g->codes->len == 0 && !g->ended && !g->interrupted)
        g_cond_wait (&g->cond, &g->lock);
      if (g->interrupted)
        {
          g_mutex_unlock (&g->lock);
          return GST_FLOW_FLUSHING;
        }
      /* swap arrays: the scheduler thread appends to an empty one while we push these */
      GArray *swap = g->codes;
      g->codes = taken;
      taken = swap;
      gboolean ended = g->ended;
      *end = g->end;
      g_mutex_unlock (&g->lock);
      if (*first_frame_time == 0 && taken->len > 0)
        *first_frame_time = g_get_monotonic_time ();

      guint n_taken = taken->len / GEPARD_CODES_CHANNELS;
      for (guint i = 0; i < n_taken;)
        {
          /* frames that piled up while downstream was slow are dropped too */
          if (g_atomic_int_get (&g->interrupted))
            return GST_FLOW_FLUSHING;
          guint n = MIN (per_buffer, n_taken - i);
          GstFlowReturn ret = gst_gepard_lm_push_frames_buffer (
              self, &g_array_index (taken, gint32, (gsize)i * GEPARD_CODES_CHANNELS), n);
          if (ret != GST_FLOW_OK)
            return ret;
          *n_pushed += n;
          i += n;
        }
      g_array_set_size (taken, 0);
      /* only this element cancels its utterances, and only when it is being flushed or stopped */
      if (ended && *end == GEPARD_UTTERANCE_FAILED)
        return GST_FLOW_ERROR; /* the caller posts the engine's error */
      if (ended)
        return *end == GEPARD_UTTERANCE_CANCELLED ? GST_FLOW_FLUSHING : GST_FLOW_OK;
    }
}

static const char *
utterance_end_name (GepardUtteranceEnd end)
{
  switch (end)
    {
    case GEPARD_UTTERANCE_STOPPED:
      return "the stop head";
    case GEPARD_UTTERANCE_MAX_FRAMES:
      return "max-frames";
    case GEPARD_UTTERANCE_CANCELLED:
      return "cancellation";
    case GEPARD_UTTERANCE_FAILED:
      return "an engine failure";
    }
  return "?";
}

static GstFlowReturn
gst_gepard_lm_generate (GstGepardLm *self, const GArray *ids)
{
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  GST_OBJECT_LOCK (self);
  /* a negative temperature keeps the production operating point (gepard-model.md §3.4) */
  if (self->temperature >= 0)
    sampling.temperature = (float)self->temperature;
  sampling.top_k = self->top_k;
  sampling.repetition_penalty = (float)self->repetition_penalty;
  /* a negative scale keeps the one the model asks for (1, off, unless it names one) */
  sampling.cfg_scale
      = self->cfg_scale >= 0 ? (float)self->cfg_scale : gepard_engine_get_cfg_scale (self->engine);
  sampling.max_frames = self->max_frames;
  sampling.ignore_stop = self->ignore_stop;
  /* seed + sentence index: every sentence of a turn differs, and a turn replays exactly */
  sampling.seed = self->seed + self->n_sentences;
  GST_OBJECT_UNLOCK (self);

  int n_prefix = 0;
  const float *prefix = gepard_voice_get_prefix (self->prefix, &n_prefix);

  g_autoptr (Generation) g = generation_new ();
  g_mutex_lock (&self->lock);
  if (self->flushing)
    {
      g_mutex_unlock (&self->lock);
      return GST_FLOW_FLUSHING;
    }
  self->generation = generation_ref (g);
  g_mutex_unlock (&self->lock);

  gint64 submitted = g_get_monotonic_time ();
  g_autoptr (GError) error = NULL;
  GepardUtterance *u = gepard_engine_submit (self->engine, (const gint32 *)ids->data, (int)ids->len,
                                             prefix, n_prefix, &sampling, &utterance_callbacks,
                                             generation_ref (g), generation_unref, &error);
  if (u == NULL)
    {
      generation_unref (g); /* a refused submit leaves the user data to us */
      g_mutex_lock (&self->lock);
      g_clear_pointer (&self->generation, generation_unref);
      g_mutex_unlock (&self->lock);
      if (g_error_matches (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_BUSY))
        GST_ELEMENT_ERROR (
            self, RESOURCE, BUSY,
            ("The GEPARD engine has no room for another sentence: %s", error->message), (NULL));
      else
        GST_ELEMENT_ERROR (self, STREAM, FAILED,
                           ("The GEPARD engine refused the sentence: %s", error->message), (NULL));
      return GST_FLOW_ERROR;
    }
  self->n_sentences++;
  /* each sentence is its own utterance: the codec starts its decoder over at the mark */
  self->discont = TRUE;

  g_mutex_lock (&self->lock);
  self->utterance = gepard_utterance_ref (u);
  gboolean flushing = self->flushing;
  g_mutex_unlock (&self->lock);
  /* a flush between the two locked sections could not see the utterance to cancel it */
  if (flushing)
    gepard_utterance_cancel (u);

  guint n_pushed = 0;
  gint64 first_frame_time = 0;
  GepardUtteranceEnd end = GEPARD_UTTERANCE_CANCELLED;
  guint64 first_frame = self->n_frames;
  GstFlowReturn ret = gst_gepard_lm_push_frames (self, g, &n_pushed, &first_frame_time, &end);
  /* downstream stopped taking frames, or a flush: the engine must not go on for nothing */
  if (ret != GST_FLOW_OK)
    gepard_utterance_cancel (u);
  if (ret == GST_FLOW_ERROR && end == GEPARD_UTTERANCE_FAILED)
    GST_ELEMENT_ERROR (self, STREAM, FAILED,
                       ("The GEPARD engine failed the sentence: %s",
                        g->error != NULL ? g->error->message : "unknown error"),
                       (NULL));

  g_mutex_lock (&self->lock);
  g_clear_pointer (&self->generation, generation_unref);
  g_clear_pointer (&self->utterance, gepard_utterance_unref);
  g_mutex_unlock (&self->lock);
  gepard_utterance_unref (u);

  /* the first frame's latency is also the gap between two sentences' frames, since the next
   * sentence is submitted when this one ends */
  if (ret == GST_FLOW_OK)
    GST_INFO_OBJECT (self,
                     "sentence %" G_GUINT64_FORMAT ": %u tokens, frames %" G_GUINT64_FORMAT
                     "–%" G_GUINT64_FORMAT ", first after %.1f ms, ended by %s after %.1f ms",
                     self->n_sentences - 1, ids->len, first_frame, first_frame + n_pushed,
                     first_frame_time ? (first_frame_time - submitted) / 1000.0 : 0.0,
                     utterance_end_name (end), (g_get_monotonic_time () - submitted) / 1000.0);
  else
    GST_DEBUG_OBJECT (self, "sentence stopped after %u frames: %s", n_pushed,
                      gst_flow_get_name (ret));
  return ret;
}

/* Whitespace and NULs only: nothing to say. Invalid UTF-8 counts as text (the tokenizer
 * replaces it). */
static gboolean
text_is_blank (const char *text, gsize length)
{
  const char *p = text, *end = text + length;
  while (p < end)
    {
      gunichar c = g_utf8_get_char_validated (p, end - p);
      if (c == (gunichar)-1 || c == (gunichar)-2)
        return FALSE;
      if (c != 0 && !g_unichar_isspace (c))
        return FALSE;
      p = c == 0 ? p + 1 : g_utf8_next_char (p);
    }
  return TRUE;
}

static GstFlowReturn
gst_gepard_lm_chain (GstPad *pad, GstObject *parent, GstBuffer *buffer)
{
  GstGepardLm *self = GST_GEPARD_LM (parent);
  GstMapInfo map;

  if (!gst_buffer_map (buffer, &map, GST_MAP_READ))
    {
      gst_buffer_unref (buffer);
      GST_ELEMENT_ERROR (self, STREAM, FAILED, ("Could not read a text buffer."), (NULL));
      return GST_FLOW_ERROR;
    }
  const char *text = (const char *)map.data;
  gsize length = map.size;
  /* producers that count the terminating NUL are common; it is not text */
  while (length > 0 && text[length - 1] == '\0')
    length--;

  if (text_is_blank (text, length))
    {
      GST_DEBUG_OBJECT (self, "skipping a blank sentence of %" G_GSIZE_FORMAT " bytes", map.size);
      gst_buffer_unmap (buffer, &map);
      gst_buffer_unref (buffer);
      return GST_FLOW_OK;
    }

  g_autoptr (GError) error = NULL;
  g_autoptr (GArray) ids
      = gepard_tokenizer_encode (gepard_engine_get_tokenizer (self->engine), text, length, &error);
  g_autofree char *excerpt = g_strndup (text, MIN (length, 60));
  gst_buffer_unmap (buffer, &map);
  gst_buffer_unref (buffer);

  if (ids == NULL)
    {
      GST_ELEMENT_ERROR (self, STREAM, FAILED,
                         ("Could not tokenize the sentence “%s”: %s", excerpt, error->message),
                         (NULL));
      return GST_FLOW_ERROR;
    }
  if (ids->len == 0)
    {
      GST_ELEMENT_WARNING (self, STREAM, FAILED,
                           ("The sentence “%s” has no tokens; it is skipped.", excerpt), (NULL));
      return GST_FLOW_OK;
    }
  GST_DEBUG_OBJECT (self, "sentence “%s”: %u tokens", excerpt, ids->len);
  return gst_gepard_lm_generate (self, ids);
}

static gboolean
gst_gepard_lm_sink_event (GstPad *pad, GstObject *parent, GstEvent *event)
{
  GstGepardLm *self = GST_GEPARD_LM (parent);

  switch (GST_EVENT_TYPE (event))
    {
    case GST_EVENT_FLUSH_START:
      /* not serialized: the streaming thread may be waiting on the engine right now */
      gst_gepard_lm_interrupt (self);
      return gst_pad_event_default (pad, parent, event);
    case GST_EVENT_FLUSH_STOP:
      g_mutex_lock (&self->lock);
      self->flushing = FALSE;
      g_mutex_unlock (&self->lock);
      gst_gepard_lm_reset_turn (self);
      return gst_pad_event_default (pad, parent, event);
    case GST_EVENT_STREAM_START:
      gst_gepard_lm_reset_turn (self);
      return gst_pad_event_default (pad, parent, event);
    case GST_EVENT_CAPS:
      /* text caps in, the fixed codes caps out */
      gst_event_unref (event);
      return gst_gepard_lm_ensure_events (self);
    case GST_EVENT_SEGMENT:
      /* upstream's segment is in text time; ours is frame time from the start of the turn */
      gst_event_unref (event);
      return gst_gepard_lm_ensure_events (self);
    case GST_EVENT_GAP:
      /* a gap in text has no place on the frame timeline */
      gst_event_unref (event);
      return TRUE;
    case GST_EVENT_EOS:
      /* sentences are generated in the chain function, so every frame is out by now */
      gst_gepard_lm_ensure_events (self);
      return gst_pad_event_default (pad, parent, event);
    default:
      return gst_pad_event_default (pad, parent, event);
    }
}

/* ---- state ---- */

static gboolean
gst_gepard_lm_start (GstGepardLm *self)
{
  GST_OBJECT_LOCK (self);
  g_autofree char *model = g_strdup (self->model);
  g_autofree char *device = g_strdup (self->device ? self->device : DEFAULT_DEVICE);
  g_autofree char *voice = g_strdup (self->voice ? self->voice : DEFAULT_VOICE);
  self->frames_pushed = 0;
  GST_OBJECT_UNLOCK (self);

  g_autoptr (GError) error = NULL;
  g_autoptr (GepardEngine) engine = gst_gepard_engine_acquire_or_default (
      GST_ELEMENT (self), model, device, &self->context_engine, &error);
  if (engine == NULL && error == NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("No model set and no default model installed: set the model property to "
                          "a GEPARD model directory or a Hugging Face repo id (or "
                          "GEPARD_MODEL), or give the pipeline an engine through a "
                          "\"gepard.engine\" GstContext."),
                         (NULL));
      return FALSE;
    }
  if (engine == NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, OPEN_READ,
                         ("Could not load the GEPARD model “%s” on device “%s”: %s",
                          model != NULL ? model : "(the default model)", device, error->message),
                         ("gst_gepard_engine_acquire failed"));
      return FALSE;
    }
  if (model == NULL)
    model = g_strdup (gepard_engine_get_model_dir (engine));
  const GepardModelConfig *config = gepard_engine_get_config (engine);
  if (config->n_audio_heads != GEPARD_CODES_CHANNELS)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("The model “%s” predicts %d channels per frame; gepardlm needs %d.",
                          model, config->n_audio_heads, GEPARD_CODES_CHANNELS),
                         (NULL));
      return FALSE;
    }
  g_autoptr (GepardVoice) prefix = gst_gepard_voice_load (engine, voice, &error);
  if (prefix == NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, NOT_FOUND,
                         ("Could not use the voice “%s”: %s", voice, error->message), (NULL));
      return FALSE;
    }

  GST_INFO_OBJECT (self, "model %s on %s%s, voice %s", model,
                   gepard_engine_get_device_description (engine),
                   gepard_engine_is_test_model (engine) ? " (untrained test model)" : "", voice);
  self->engine = g_steal_pointer (&engine);
  self->prefix = g_steal_pointer (&prefix);
  g_mutex_lock (&self->lock);
  self->flushing = FALSE;
  g_mutex_unlock (&self->lock);
  gst_gepard_lm_reset_turn (self);
  return TRUE;
}

/* After the pads are deactivated: the streaming thread has left the chain function. Utterances
 * still ending in the engine keep their own engine reference. */
static void
gst_gepard_lm_stop (GstGepardLm *self)
{
  g_clear_pointer (&self->prefix, gepard_voice_unref);
  g_clear_pointer (&self->engine, gepard_engine_unref);
}

static GstStateChangeReturn
gst_gepard_lm_change_state (GstElement *element, GstStateChange transition)
{
  GstGepardLm *self = GST_GEPARD_LM (element);

  switch (transition)
    {
    case GST_STATE_CHANGE_READY_TO_PAUSED:
      if (!gst_gepard_lm_start (self))
        return GST_STATE_CHANGE_FAILURE;
      break;
    case GST_STATE_CHANGE_PAUSED_TO_READY:
      /* before the pads deactivate: that waits for the streaming thread, which may be waiting on
       * the engine */
      gst_gepard_lm_interrupt (self);
      break;
    default:
      break;
    }

  GstStateChangeReturn ret = GST_ELEMENT_CLASS (parent_class)->change_state (element, transition);
  if (ret == GST_STATE_CHANGE_FAILURE)
    {
      if (transition == GST_STATE_CHANGE_READY_TO_PAUSED)
        gst_gepard_lm_stop (self);
      return ret;
    }

  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY)
    gst_gepard_lm_stop (self);
  return ret;
}

/* ---- GObject ---- */

static void
gst_gepard_lm_set_property (GObject *object, guint prop_id, const GValue *value, GParamSpec *pspec)
{
  GstGepardLm *self = GST_GEPARD_LM (object);

  GST_OBJECT_LOCK (self);
  switch (prop_id)
    {
    case PROP_MODEL:
      g_free (self->model);
      self->model = g_value_dup_string (value);
      break;
    case PROP_DEVICE:
      g_free (self->device);
      self->device = g_value_dup_string (value);
      break;
    case PROP_VOICE:
      g_free (self->voice);
      self->voice = g_value_dup_string (value);
      break;
    case PROP_TEMPERATURE:
      self->temperature = g_value_get_double (value);
      break;
    case PROP_TOP_K:
      self->top_k = g_value_get_int (value);
      break;
    case PROP_REPETITION_PENALTY:
      self->repetition_penalty = g_value_get_double (value);
      break;
    case PROP_CFG_SCALE:
      self->cfg_scale = g_value_get_double (value);
      break;
    case PROP_MAX_FRAMES:
      self->max_frames = g_value_get_int (value);
      break;
    case PROP_IGNORE_STOP:
      self->ignore_stop = g_value_get_boolean (value);
      break;
    case PROP_SEED:
      self->seed = g_value_get_uint64 (value);
      break;
    case PROP_FRAMES_PER_BUFFER:
      self->frames_per_buffer = g_value_get_uint (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
  GST_OBJECT_UNLOCK (self);
}

static void
gst_gepard_lm_get_property (GObject *object, guint prop_id, GValue *value, GParamSpec *pspec)
{
  GstGepardLm *self = GST_GEPARD_LM (object);

  GST_OBJECT_LOCK (self);
  switch (prop_id)
    {
    case PROP_MODEL:
      g_value_set_string (value, self->model);
      break;
    case PROP_DEVICE:
      g_value_set_string (value, self->device);
      break;
    case PROP_VOICE:
      g_value_set_string (value, self->voice);
      break;
    case PROP_TEMPERATURE:
      g_value_set_double (value, self->temperature);
      break;
    case PROP_TOP_K:
      g_value_set_int (value, self->top_k);
      break;
    case PROP_REPETITION_PENALTY:
      g_value_set_double (value, self->repetition_penalty);
      break;
    case PROP_CFG_SCALE:
      g_value_set_double (value, self->cfg_scale);
      break;
    case PROP_MAX_FRAMES:
      g_value_set_int (value, self->max_frames);
      break;
    case PROP_IGNORE_STOP:
      g_value_set_boolean (value, self->ignore_stop);
      break;
    case PROP_SEED:
      g_value_set_uint64 (value, self->seed);
      break;
    case PROP_FRAMES:
      g_value_set_uint64 (value, self->frames_pushed);
      break;
    case PROP_FRAMES_PER_BUFFER:
      g_value_set_uint (value, self->frames_per_buffer);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
  GST_OBJECT_UNLOCK (self);
}

static void
gst_gepard_lm_set_context (GstElement *element, GstContext *context)
{
  GstGepardLm *self = GST_GEPARD_LM (element);

  gst_gepard_engine_set_context (element, context, &self->context_engine);
  GST_ELEMENT_CLASS (parent_class)->set_context (element, context);
}

/* Neighbours looking for an engine (gstgepardengine.h) get the one in use. */
static gboolean
gst_gepard_lm_query (GstPad *pad, GstObject *parent, GstQuery *query)
{
  GstGepardLm *self = GST_GEPARD_LM (parent);

  if (GST_QUERY_TYPE (query) == GST_QUERY_CONTEXT
      && gst_gepard_engine_answer_query (query, self->engine))
    return TRUE;
  return gst_pad_query_default (pad, parent, query);
}

static void
gst_gepard_lm_finalize (GObject *object)
{
  GstGepardLm *self = GST_GEPARD_LM (object);

  g_clear_pointer (&self->context_engine, gepard_engine_unref);
  g_free (self->model);
  g_free (self->device);
  g_free (self->voice);
  g_mutex_clear (&self->lock);
  G_OBJECT_CLASS (parent_class)->finalize (object);
}

static void
gst_gepard_lm_class_init (GstGepardLmClass *klass)
{
  GObjectClass *gobject_class = G_OBJECT_CLASS (klass);
  GstElementClass *element_class = GST_ELEMENT_CLASS (klass);

  gobject_class->set_property = gst_gepard_lm_set_property;
  gobject_class->get_property = gst_gepard_lm_get_property;
  gobject_class->finalize = gst_gepard_lm_finalize;

  g_object_class_install_property (
      gobject_class, PROP_MODEL,
      g_param_spec_string ("model", "Model",
                           "GEPARD model: a checkpoint directory or a Hugging Face repo id "
                           "(owner/name[@revision]) in the local cache. Unset: the engine an "
                           "application shares through a \"gepard.engine\" GstContext, else the "
                           "default model (GEPARD_MODEL, else the installed default voice).",
                           NULL,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_DEVICE,
      g_param_spec_string ("device", "Device",
                           "Where the model runs: auto, cpu, cuda or cuda:N. Elements naming the "
                           "same model and device share one engine.",
                           DEFAULT_DEVICE,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_VOICE,
      g_param_spec_string ("voice", "Voice",
                           "Speaker: default, a voice id registered with the engine, a speaker "
                           "prefix file, or a reference audio clip. Resolved when the element "
                           "starts.",
                           DEFAULT_VOICE,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_TEMPERATURE,
      g_param_spec_double ("temperature", "Temperature",
                           "Sampling temperature of every channel; 0 is greedy, negative keeps the "
                           "model's operating point (0.4). Applies from the next sentence.",
                           -1.0, 10.0, DEFAULT_TEMPERATURE,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_TOP_K,
      g_param_spec_int ("top-k", "Top k",
                        "Sample each channel among its k most likely codes (ties kept); 0 "
                        "samples among all. Applies from the next sentence.",
                        0, 1024, DEFAULT_TOP_K,
                        G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_REPETITION_PENALTY,
      g_param_spec_double ("repetition-penalty", "Repetition penalty",
                           "Above 1 makes a channel's codes of the last 32 frames less likely, "
                           "below 1 more (gepard-model.md §3.4: a positive logit is divided by "
                           "it, a negative one multiplied); 1 is off. Applies from the next "
                           "sentence.",
                           0.1, 10.0, DEFAULT_REPETITION_PENALTY,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_CFG_SCALE,
      g_param_spec_double ("cfg-scale", "Text CFG scale",
                           "Text classifier-free guidance (gepard-model.md §3.4): 1 is off; above "
                           "1 each frame leans further toward the text, away from what the model "
                           "says without it (a second branch runs beside each sentence, about "
                           "twice the work); negative keeps the scale the model asks for (off "
                           "unless it names one). Applies from the next sentence.",
                           -1.0, 10.0, DEFAULT_CFG_SCALE,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_MAX_FRAMES,
      g_param_spec_int ("max-frames", "Maximum frames",
                        "Frames at most per sentence (21.5 per second of speech) when the model "
                        "does not stop on its own. Applies from the next sentence.",
                        1, 100000, DEFAULT_MAX_FRAMES,
                        G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_IGNORE_STOP,
      g_param_spec_boolean (
          "ignore-stop", "Ignore stop",
          "For benchmarks: run every sentence to max-frames whatever the stop "
          "head says, so that each sentence has a fixed length. Applies from "
          "the next sentence.",
          FALSE, G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_SEED,
      g_param_spec_uint64 ("seed", "Seed",
                           "Sampling seed; sentence i of a turn uses seed + i, so the same text, "
                           "voice and seed give the same frames. Applies from the next sentence.",
                           0, G_MAXUINT64, DEFAULT_SEED,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_FRAMES,
      g_param_spec_uint64 ("frames", "Frames", "Frames pushed since the element started.", 0,
                           G_MAXUINT64, 0, G_PARAM_READABLE | G_PARAM_STATIC_STRINGS));
  g_object_class_install_property (
      gobject_class, PROP_FRAMES_PER_BUFFER,
      g_param_spec_uint ("frames-per-buffer", "Frames per buffer",
                         "Frames at most in one output buffer: frames that piled up while "
                         "downstream was busy go out together, so that gepardcodec decodes them in "
                         "one job (on a GPU, one pass). 1: a buffer for every frame. Applies from "
                         "the next sentence.",
                         1, 256, DEFAULT_FRAMES_PER_BUFFER,
                         G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));

  gst_element_class_add_static_pad_template (element_class, &sink_template);
  gst_element_class_add_static_pad_template (element_class, &src_template);
  gst_element_class_set_static_metadata (
      element_class, "GEPARD language model", "Filter/Audio/Text",
      "Generates GEPARD speech frames for each sentence of text with the shared engine", "Gepard");

  element_class->change_state = GST_DEBUG_FUNCPTR (gst_gepard_lm_change_state);
  element_class->set_context = GST_DEBUG_FUNCPTR (gst_gepard_lm_set_context);
}

static void
gst_gepard_lm_init (GstGepardLm *self)
{
  self->sinkpad = gst_pad_new_from_static_template (&sink_template, "sink");
  gst_pad_set_chain_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_lm_chain));
  gst_pad_set_event_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_lm_sink_event));
  gst_pad_set_query_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_lm_query));
  gst_element_add_pad (GST_ELEMENT (self), self->sinkpad);

  self->srcpad = gst_pad_new_from_static_template (&src_template, "src");
  gst_pad_use_fixed_caps (self->srcpad);
  gst_pad_set_query_function (self->srcpad, GST_DEBUG_FUNCPTR (gst_gepard_lm_query));
  gst_element_add_pad (GST_ELEMENT (self), self->srcpad);

  self->device = g_strdup (DEFAULT_DEVICE);
  self->voice = g_strdup (DEFAULT_VOICE);
  self->temperature = DEFAULT_TEMPERATURE;
  self->cfg_scale = DEFAULT_CFG_SCALE;
  self->top_k = DEFAULT_TOP_K;
  self->repetition_penalty = DEFAULT_REPETITION_PENALTY;
  self->max_frames = DEFAULT_MAX_FRAMES;
  self->frames_per_buffer = DEFAULT_FRAMES_PER_BUFFER;
  self->seed = DEFAULT_SEED;
  g_mutex_init (&self->lock);
}
