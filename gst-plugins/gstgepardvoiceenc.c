/* gstgepardvoiceenc.c: gepardvoiceenc, the speaker encoder for voice cloning.
 *
 * SECTION:element-gepardvoiceenc
 *
 * Collects a reference clip (22050 Hz mono float) until end of stream, then runs the codec
 * encoder, GroupFSQ and the model's compressor (nanocodec.md §3–§4, gepard-model.md §3.6) and
 * pushes one buffer: the speaker prefix file's bytes, little-endian fp32 [rows][hidden]
 * (gepard-model.md §3.7), followed by end of stream. A clip shorter than min-duration or longer
 * than max-duration is a stream error naming its length.
 *
 * ## Example launch line
 * |[
 * gst-launch-1.0 filesrc location=speaker.flac ! decodebin ! audioconvert ! audioresample !
 *     gepardvoiceenc model=/models/gepard-1.0 ! filesink location=speaker.prefix
 * ]|
 * The file written is a prefix file that gepardlm voice=speaker.prefix reads.
 */
#include "gstgepardvoiceenc.h"

#include "gstgepardelements.h"
#include "gstgepardengine.h"

#include <gepard-voice.h>
#include <gst/audio/audio.h>

GST_DEBUG_CATEGORY_STATIC (gst_gepard_voice_enc_debug);
#define GST_CAT_DEFAULT gst_gepard_voice_enc_debug

/* nanocodec.md §3.2: the encoder takes 22050 Hz mono */
#define CODEC_RATE 22050

#define DEFAULT_MODEL NULL
#define DEFAULT_DEVICE "auto"
#define DEFAULT_MIN_DURATION 0.5
#define DEFAULT_MAX_DURATION 60.0
#define MAX_DURATION_LIMIT 600.0

enum
{
  PROP_0,
  PROP_MODEL,
  PROP_DEVICE,
  PROP_MIN_DURATION,
  PROP_MAX_DURATION,
};

struct _GstGepardVoiceEnc
{
  GstElement parent;

  GstPad *sinkpad;
  GstPad *srcpad;

  /* properties, under the object lock */
  char *model;
  char *device;
  double min_duration;
  double max_duration;

  /* from start () to stop (); streaming thread only while running */
  GepardEngine *context_engine; /* from a "gepard.engine" context; GST_OBJECT_LOCK */
  GepardEngine *engine;
  GArray *samples; /* float, the clip so far */
  gboolean failed; /* an error was posted: drop the rest of the stream */
};

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE (
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS,
    GST_STATIC_CAPS ("audio/x-raw, format = (string) F32LE, rate = (int) 22050, "
                     "channels = (int) 1, layout = (string) interleaved"));

static GstStaticPadTemplate src_template
    = GST_STATIC_PAD_TEMPLATE ("src", GST_PAD_SRC, GST_PAD_ALWAYS,
                               GST_STATIC_CAPS (GEPARD_VOICE_CAPS ", rows = (int) [ 1, MAX ], "
                                                                  "hidden = (int) [ 1, MAX ]"));

#define gst_gepard_voice_enc_parent_class parent_class
G_DEFINE_TYPE (GstGepardVoiceEnc, gst_gepard_voice_enc, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE (gepardvoiceenc, "gepardvoiceenc", GST_RANK_NONE,
                             GST_TYPE_GEPARD_VOICE_ENC);

static double
clip_seconds (GstGepardVoiceEnc *self)
{
  return (double)self->samples->len / CODEC_RATE;
}

/* ---- start and stop ---- */

static gboolean
gst_gepard_voice_enc_start (GstGepardVoiceEnc *self)
{
  GST_OBJECT_LOCK (self);
  g_autofree char *model = g_strdup (self->model);
  g_autofree char *device = g_strdup (self->device);
  double min_duration = self->min_duration, max_duration = self->max_duration;
  GST_OBJECT_UNLOCK (self);

  if (min_duration > max_duration)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("min-duration (%.2f s) is above max-duration (%.2f s): no clip could "
                          "pass; lower min-duration or raise max-duration.",
                          min_duration, max_duration),
                         (NULL));
      return FALSE;
    }

  g_autoptr (GError) error = NULL;
  GepardEngine *engine = gst_gepard_engine_acquire_or_default (GST_ELEMENT (self), model, device,
                                                               &self->context_engine, &error);
  if (engine == NULL && error == NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("No model set and no default model installed: set the model property to "
                          "a GEPARD checkpoint directory or the repo id of a cached model (or "
                          "GEPARD_MODEL), or give the pipeline an engine through a "
                          "\"gepard.engine\" GstContext."),
                         (NULL));
      return FALSE;
    }
  if (engine == NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, OPEN_READ,
                         ("Cannot load the model “%s” on device “%s”: %s",
                          model != NULL && *model != '\0' ? model : "(the default model)", device,
                          error->message),
                         (NULL));
      return FALSE;
    }
  if (model == NULL || *model == '\0')
    {
      g_free (model);
      model = g_strdup (gepard_engine_get_model_dir (engine));
    }
  /* refuse a model that cannot clone now rather than after the whole upload */
  const GepardModelConfig *config = gepard_engine_get_config (engine);
  if (gepard_engine_get_codec (engine) == NULL || gepard_voice_get_prefix_file_size (config) == 0)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("The model “%s” cannot clone voices: it needs a voice-cloning "
                          "compressor and its codec (codec.nemo) beside it.",
                          model),
                         (NULL));
      gepard_engine_unref (engine);
      return FALSE;
    }

  self->engine = engine;
  self->samples = g_array_new (FALSE, FALSE, sizeof (float));
  self->failed = FALSE;
  GST_DEBUG_OBJECT (self, "started on %s", gepard_engine_get_device_description (engine));
  return TRUE;
}

static void
gst_gepard_voice_enc_stop (GstGepardVoiceEnc *self)
{
  g_clear_pointer (&self->samples, g_array_unref);
  g_clear_pointer (&self->engine, gepard_engine_unref);
  self->failed = FALSE;
}

static GstStateChangeReturn
gst_gepard_voice_enc_change_state (GstElement *element, GstStateChange transition)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (element);

  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED && !gst_gepard_voice_enc_start (self))
    return GST_STATE_CHANGE_FAILURE;

  GstStateChangeReturn ret = GST_ELEMENT_CLASS (parent_class)->change_state (element, transition);
  if (ret == GST_STATE_CHANGE_FAILURE)
    {
      if (transition == GST_STATE_CHANGE_READY_TO_PAUSED)
        gst_gepard_voice_enc_stop (self);
      return ret;
    }

  /* after the parent deactivated the pads: no streaming thread touches the clip any more */
  if (transition == GST_STATE_CHANGE_PAUSED_TO_READY)
    gst_gepard_voice_enc_stop (self);
  return ret;
}

/* ---- data flow ---- */

static GstFlowReturn
gst_gepard_voice_enc_chain (GstPad *pad, GstObject *parent, GstBuffer *buffer)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (parent);
  if (self->failed)
    {
      gst_buffer_unref (buffer);
      return GST_FLOW_ERROR;
    }

  GST_OBJECT_LOCK (self);
  double max_duration = self->max_duration;
  GST_OBJECT_UNLOCK (self);

  GstMapInfo map;
  if (!gst_buffer_map (buffer, &map, GST_MAP_READ))
    {
      gst_buffer_unref (buffer);
      GST_ELEMENT_ERROR (self, STREAM, FAILED, ("Cannot read an input buffer."), (NULL));
      return GST_FLOW_ERROR;
    }
  gsize n = map.size / sizeof (float);
  guint start = self->samples->len;
  g_array_append_vals (self->samples, map.data, n);
  gst_buffer_unmap (buffer, &map);
  gst_buffer_unref (buffer);
#if G_BYTE_ORDER == G_BIG_ENDIAN
  guint32 *words = (guint32 *)&g_array_index (self->samples, float, start);
  for (gsize i = 0; i < n; i++)
    words[i] = GUINT32_FROM_LE (words[i]);
#else
  (void)start;
#endif

  /* refuse a clip that is too long as soon as it is, rather than hold all of it */
  if (clip_seconds (self) > max_duration)
    {
      GST_ELEMENT_ERROR (self, STREAM, FORMAT,
                         ("The reference clip is too long: %.2f s so far, more than max-duration "
                          "(%.2f s). Send a shorter clip: a few seconds of clear speech.",
                          clip_seconds (self), max_duration),
                         (NULL));
      self->failed = TRUE;
      g_array_set_size (self->samples, 0);
      return GST_FLOW_ERROR;
    }
  return GST_FLOW_OK;
}

/* At end of stream: the prefix of the whole clip, pushed as one buffer. FALSE after posting an
 * error. */
static gboolean
gst_gepard_voice_enc_finish (GstGepardVoiceEnc *self)
{
  GST_OBJECT_LOCK (self);
  double min_duration = self->min_duration;
  GST_OBJECT_UNLOCK (self);

  double seconds = clip_seconds (self);
  if (seconds < min_duration)
    {
      GST_ELEMENT_ERROR (self, STREAM, FORMAT,
                         ("The reference clip is too short: %.2f s, less than min-duration "
                          "(%.2f s). Send a longer clip: a few seconds of clear speech.",
                          seconds, min_duration),
                         (NULL));
      return FALSE;
    }

  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) voice = gepard_voice_new_from_audio (
      self->engine, "clip", (const float *)self->samples->data, self->samples->len, &error);
  g_autoptr (GBytes) bytes = voice != NULL ? gepard_voice_to_prefix_bytes (voice, &error) : NULL;
  if (bytes == NULL)
    {
      if (g_error_matches (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT))
        GST_ELEMENT_ERROR (self, STREAM, FORMAT, ("%s", error->message), (NULL));
      else
        GST_ELEMENT_ERROR (
            self, STREAM, ENCODE,
            ("Cannot compute the speaker prefix of a %.2f s clip: %s", seconds, error->message),
            (NULL));
      return FALSE;
    }
  GST_DEBUG_OBJECT (self, "prefix of a %.2f s clip: %" G_GSIZE_FORMAT " bytes", seconds,
                    g_bytes_get_size (bytes));

  const GepardModelConfig *config = gepard_engine_get_config (self->engine);
  g_autoptr (GstCaps) caps = gst_caps_new_simple ("application/x-gepard-voice", "rows", G_TYPE_INT,
                                                  config->compressor_queries, "hidden", G_TYPE_INT,
                                                  config->hidden_size, NULL);
  gst_pad_push_event (self->srcpad, gst_event_new_caps (caps));
  /* the buffer is a file's bytes, not media time */
  GstSegment segment;
  gst_segment_init (&segment, GST_FORMAT_BYTES);
  gst_pad_push_event (self->srcpad, gst_event_new_segment (&segment));

  gsize size = g_bytes_get_size (bytes);
  GstBuffer *buffer = gst_buffer_new_wrapped_bytes (bytes);
  GST_BUFFER_OFFSET (buffer) = 0;
  GST_BUFFER_OFFSET_END (buffer) = size;
  GST_BUFFER_PTS (buffer) = 0;
  GstFlowReturn ret = gst_pad_push (self->srcpad, buffer);
  if (ret != GST_FLOW_OK && ret != GST_FLOW_FLUSHING && ret != GST_FLOW_EOS)
    {
      GST_ELEMENT_FLOW_ERROR (self, ret);
      return FALSE;
    }
  return TRUE;
}

static gboolean
gst_gepard_voice_enc_sink_event (GstPad *pad, GstObject *parent, GstEvent *event)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (parent);

  switch (GST_EVENT_TYPE (event))
    {
    case GST_EVENT_CAPS:
      {
        /* the template admits only 22050 Hz mono F32LE; the output caps follow the model, not
         * the input, and go out with the prefix */
        GstCaps *caps;
        GstAudioInfo info;
        gst_event_parse_caps (event, &caps);
        gboolean ok = gst_audio_info_from_caps (&info, caps)
                      && GST_AUDIO_INFO_RATE (&info) == CODEC_RATE
                      && GST_AUDIO_INFO_CHANNELS (&info) == 1;
        gst_event_unref (event);
        return ok;
      }
    case GST_EVENT_SEGMENT:
    case GST_EVENT_GAP:
      /* a time segment and gaps mean nothing for the single prefix buffer */
      gst_event_unref (event);
      return TRUE;
    case GST_EVENT_FLUSH_STOP:
      g_array_set_size (self->samples, 0);
      self->failed = FALSE;
      return gst_pad_event_default (pad, parent, event);
    case GST_EVENT_EOS:
      if (self->failed || !gst_gepard_voice_enc_finish (self))
        {
          /* the error on the bus ends the stream: an EOS now would read as success */
          gst_event_unref (event);
          return FALSE;
        }
      return gst_pad_push_event (self->srcpad, event);
    default:
      return gst_pad_event_default (pad, parent, event);
    }
}

/* ---- GObject ---- */

static void
gst_gepard_voice_enc_set_property (GObject *object, guint prop_id, const GValue *value,
                                   GParamSpec *pspec)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (object);

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
      if (self->device == NULL)
        self->device = g_strdup (DEFAULT_DEVICE);
      break;
    case PROP_MIN_DURATION:
      self->min_duration = g_value_get_double (value);
      break;
    case PROP_MAX_DURATION:
      self->max_duration = g_value_get_double (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
  GST_OBJECT_UNLOCK (self);
}

static void
gst_gepard_voice_enc_get_property (GObject *object, guint prop_id, GValue *value, GParamSpec *pspec)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (object);

  GST_OBJECT_LOCK (self);
  switch (prop_id)
    {
    case PROP_MODEL:
      g_value_set_string (value, self->model);
      break;
    case PROP_DEVICE:
      g_value_set_string (value, self->device);
      break;
    case PROP_MIN_DURATION:
      g_value_set_double (value, self->min_duration);
      break;
    case PROP_MAX_DURATION:
      g_value_set_double (value, self->max_duration);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
  GST_OBJECT_UNLOCK (self);
}

static void
gst_gepard_voice_enc_set_context (GstElement *element, GstContext *context)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (element);

  gst_gepard_engine_set_context (element, context, &self->context_engine);
  GST_ELEMENT_CLASS (parent_class)->set_context (element, context);
}

static void
gst_gepard_voice_enc_finalize (GObject *object)
{
  GstGepardVoiceEnc *self = GST_GEPARD_VOICE_ENC (object);
  g_clear_pointer (&self->context_engine, gepard_engine_unref);
  g_free (self->model);
  g_free (self->device);
  G_OBJECT_CLASS (parent_class)->finalize (object);
}

static void
gst_gepard_voice_enc_class_init (GstGepardVoiceEncClass *klass)
{
  GObjectClass *gobject_class = G_OBJECT_CLASS (klass);
  GstElementClass *element_class = GST_ELEMENT_CLASS (klass);

  GST_DEBUG_CATEGORY_INIT (gst_gepard_voice_enc_debug, "gepardvoiceenc", 0,
                           "Gepard speaker encoder");

  gobject_class->set_property = gst_gepard_voice_enc_set_property;
  gobject_class->get_property = gst_gepard_voice_enc_get_property;
  gobject_class->finalize = gst_gepard_voice_enc_finalize;

  g_object_class_install_property (
      gobject_class, PROP_MODEL,
      g_param_spec_string ("model", "Model",
                           "The GEPARD model: a checkpoint directory with its codec (codec.nemo) "
                           "beside it, or the repo id of a model in the local Hugging Face cache. "
                           "Unset: as for gepardlm's model property.",
                           DEFAULT_MODEL,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_DEVICE,
      g_param_spec_string ("device", "Device",
                           "Where the model runs: auto, cpu, cuda or cuda:N (elements naming the "
                           "same model and device share one engine)",
                           DEFAULT_DEVICE,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_MIN_DURATION,
      g_param_spec_double ("min-duration", "Minimum duration",
                           "Shortest reference clip accepted, in seconds; a shorter clip is a "
                           "stream error",
                           0.0, MAX_DURATION_LIMIT, DEFAULT_MIN_DURATION,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));
  g_object_class_install_property (
      gobject_class, PROP_MAX_DURATION,
      g_param_spec_double ("max-duration", "Maximum duration",
                           "Longest reference clip accepted, in seconds; a longer clip is a "
                           "stream error as soon as it passes the limit",
                           0.0, MAX_DURATION_LIMIT, DEFAULT_MAX_DURATION,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));

  element_class->change_state = gst_gepard_voice_enc_change_state;
  element_class->set_context = gst_gepard_voice_enc_set_context;

  gst_element_class_add_static_pad_template (element_class, &sink_template);
  gst_element_class_add_static_pad_template (element_class, &src_template);
  gst_element_class_set_static_metadata (
      element_class, "Gepard speaker encoder", "Codec/Encoder/Audio",
      "Computes a GEPARD speaker prefix from a reference clip (22050 Hz mono) for voice cloning",
      "Gepard");
}

static void
gst_gepard_voice_enc_init (GstGepardVoiceEnc *self)
{
  self->sinkpad = gst_pad_new_from_static_template (&sink_template, "sink");
  gst_pad_set_chain_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_voice_enc_chain));
  gst_pad_set_event_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_voice_enc_sink_event));
  GST_PAD_SET_ACCEPT_TEMPLATE (self->sinkpad);
  gst_element_add_pad (GST_ELEMENT (self), self->sinkpad);

  self->srcpad = gst_pad_new_from_static_template (&src_template, "src");
  gst_pad_use_fixed_caps (self->srcpad);
  gst_element_add_pad (GST_ELEMENT (self), self->srcpad);

  self->model = g_strdup (DEFAULT_MODEL);
  self->device = g_strdup (DEFAULT_DEVICE);
  self->min_duration = DEFAULT_MIN_DURATION;
  self->max_duration = DEFAULT_MAX_DURATION;
}
