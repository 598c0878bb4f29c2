/* gstgepardcodec.c: gepardcodec, NanoCodec's causal decoder as an element.
 *
 * A plain GstElement rather than a GstAudioDecoder: one frame in gives one buffer out at once, so
 * the base class's frame queue has nothing to do, and three of its habits would hurt here
 * (gstreamer-notes.md §5 items 12–13): it resyncs to every input timestamp (tolerance 0), it holds
 * custom serialized events until the next output buffer, and it posts an error at EOS when input
 * came but no output did. Timestamps come from a sample counter instead (§5 item 11). Decoding
 * runs in the chain function, on gepardlm's streaming thread: no thread of its own (§3.3).
 */

/**
 * SECTION:element-gepardcodec
 * @title: gepardcodec
 *
 * Decodes GEPARD frames (32 channel codes each, from gepardlm) into 22050 Hz mono F32 audio, 1024
 * samples per frame, each frame as soon as it arrives. The decoder is causal with no lookahead and
 * keeps its per-layer state between frames, so the streamed audio is bit for bit what a one-shot
 * decode of the whole utterance gives (nanocodec.md §6.1).
 *
 * The codec is the one that comes with the model: `model=`, or with no model set the engine of the
 * gepardlm upstream (or of a "gepard.engine" GstContext the application set). Those frames decode
 * through the engine's codec service, which batches every stream's new frames into one pass per
 * engine iteration. A NanoCodec file of its own (`codec=`) decodes here instead.
 *
 * ## Example launch line
 * |[
 * gst-launch-1.0 gepardtextsrc text="Hello there." ! gepardlm model=/path/to/model ! \
 *     gepardcodec ! audioconvert ! audioresample ! autoaudiosink
 * ]|
 */
#include "gstgepardcodec.h"

#include "gstgepardelements.h"
#include "gstgepardengine.h"

#include "gepard-engine.h"

#include <string.h>

GST_DEBUG_CATEGORY_STATIC (gst_gepard_codec_debug);
#define GST_CAT_DEFAULT gst_gepard_codec_debug

#define SAMPLE_RATE 22050

#define DEFAULT_DEVICE "auto"

enum
{
  PROP_0,
  PROP_MODEL,
  PROP_DEVICE,
  PROP_CODEC,
};

struct _GstGepardCodec
{
  GstElement parent;
  GstPad *sinkpad;
  GstPad *srcpad;

  /* properties; GST_OBJECT_LOCK */
  char *model;
  char *device;
  char *codec_path;

  GepardEngine *context_engine; /* from a "gepard.engine" context; GST_OBJECT_LOCK */

  /* from start () (or the first frame, when the engine comes from upstream) to stop () */
  gboolean opened;
  GepardEngine *engine;        /* when the codec is the model's */
  GepardAudioDecoder *decoder; /* then: decoding through the engine's codec service */
  GepardCodec *own_codec;      /* when it comes from the codec property */
  GepardCodecStream *stream;   /* then: decoding here, on the streaming thread */
  GepardCodec *codec;          /* the one in use, owned by one of the two above */
  char *source;                /* the model or codec file, for messages */
  int samples_per_frame;
  int levels[GEPARD_CODES_CHANNELS];

  /* streaming thread */
  gboolean anchored;     /* the sample counter is placed on the timeline */
  guint64 offset;        /* the next output sample's number on the timeline */
  gboolean stream_dirty; /* the decoder state holds something since its last reset */
  gboolean discont;
  guint64 n_frames; /* frames decoded since start: named in errors */
};

static GstStaticPadTemplate sink_template = GST_STATIC_PAD_TEMPLATE (
    "sink", GST_PAD_SINK, GST_PAD_ALWAYS, GST_STATIC_CAPS (GEPARD_CODES_CAPS));

static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE (
    "src", GST_PAD_SRC, GST_PAD_ALWAYS,
    GST_STATIC_CAPS ("audio/x-raw, format = (string) F32LE, rate = (int) 22050, "
                     "channels = (int) 1, layout = (string) interleaved"));

#define gst_gepard_codec_parent_class parent_class
G_DEFINE_TYPE (GstGepardCodec, gst_gepard_codec, GST_TYPE_ELEMENT);
GST_ELEMENT_REGISTER_DEFINE_WITH_CODE (
    gepardcodec, "gepardcodec", GST_RANK_NONE, GST_TYPE_GEPARD_CODEC,
    GST_DEBUG_CATEGORY_INIT (gst_gepard_codec_debug, "gepardcodec", 0, "NanoCodec decoder"));

/* ---- timeline ---- */

/* gstreamer-notes.md §5 item 11: every timestamp is a function of the sample count alone */
static GstClockTime
sample_pts (guint64 sample)
{
  return gst_util_uint64_scale_int_round (sample, GST_SECOND, SAMPLE_RATE);
}

/* Start, stream start, flush or discontinuity: the decoder forgets the frames before, and the
 * next frame places the counter on the timeline again. */
static void
gst_gepard_codec_reset (GstGepardCodec *self)
{
  if (self->stream != NULL && self->stream_dirty)
    gepard_codec_stream_reset (self->stream);
  if (self->decoder != NULL && self->stream_dirty)
    gepard_audio_decoder_reset (self->decoder);
  self->stream_dirty = FALSE;
  self->anchored = FALSE;
  self->discont = TRUE;
}

/* The first frame after a reset places the counter: at its PTS (rounded to a sample) when it has
 * one, else where the counter was (0 at start). Later input timestamps are not followed: frames
 * are exactly 1024 samples, so the counter is right, and following rounded or jittered input
 * timestamps is what makes a timeline drift (§5 item 12). */
static void
gst_gepard_codec_anchor (GstGepardCodec *self, GstBuffer *buffer)
{
  if (GST_BUFFER_PTS_IS_VALID (buffer))
    self->offset
        = gst_util_uint64_scale_int_round (GST_BUFFER_PTS (buffer), SAMPLE_RATE, GST_SECOND);
  self->anchored = TRUE;
  GST_DEBUG_OBJECT (self, "timeline placed at sample %" G_GUINT64_FORMAT, self->offset);
}

/* ---- streaming ---- */

static gboolean gst_gepard_codec_open_from_context (GstGepardCodec *self);

/* Codes the decoder cannot take, reported by frame and channel so a broken producer can be
 * found. */
static gboolean
gst_gepard_codec_check_codes (GstGepardCodec *self, const gint32 *codes, int n_frames)
{
  for (int f = 0; f < n_frames; f++)
    for (int c = 0; c < GEPARD_CODES_CHANNELS; c++)
      {
        gint32 code = codes[f * GEPARD_CODES_CHANNELS + c];
        int levels = self->levels[c];
        if (code < 0 || code >= levels)
          {
            GST_ELEMENT_ERROR (
                self, STREAM, DECODE,
                ("Frame %" G_GUINT64_FORMAT " has code %d in channel %d, outside that channel's %d "
                 "levels (0 to %d): the frames do not come from a GEPARD model for this codec.",
                 self->n_frames + f, code, c, levels, levels - 1),
                ("channel %d is codebook %d, FSQ dimension %d", c, c / 4, c % 4));
            return FALSE;
          }
      }
  return TRUE;
}

static GstFlowReturn
gst_gepard_codec_chain (GstPad *pad, GstObject *parent, GstBuffer *buffer)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (parent);
  const gsize frame_bytes = GEPARD_CODES_CHANNELS * sizeof (gint32);
  gsize size = gst_buffer_get_size (buffer);

  if (size == 0 || size % frame_bytes != 0)
    {
      GST_ELEMENT_ERROR (self, STREAM, FORMAT,
                         ("A buffer of %" G_GSIZE_FORMAT " bytes is not a whole number of frames "
                          "(%" G_GSIZE_FORMAT " bytes each).",
                          size, frame_bytes),
                         (NULL));
      gst_buffer_unref (buffer);
      return GST_FLOW_ERROR;
    }
  int n_frames = (int)(size / frame_bytes);

  if (!self->opened && !gst_gepard_codec_open_from_context (self))
    {
      gst_buffer_unref (buffer);
      return GST_FLOW_ERROR;
    }

  /* a private aligned copy: the buffer's memory may start anywhere */
  g_autofree gint32 *codes = g_new (gint32, (gsize)n_frames * GEPARD_CODES_CHANNELS);
  gst_buffer_extract (buffer, 0, codes, size);
  if (!gst_gepard_codec_check_codes (self, codes, n_frames))
    {
      gst_buffer_unref (buffer);
      return GST_FLOW_ERROR;
    }

  /* gepardlm marks the first frame of every utterance: each one is decoded from a zero state,
   * like the reference decodes each utterance on its own, and its audio starts with DISCONT */
  if (GST_BUFFER_IS_DISCONT (buffer) && self->stream_dirty)
    {
      GST_DEBUG_OBJECT (self, "discontinuity: decoder state reset");
      gst_gepard_codec_reset (self);
    }
  if (!self->anchored)
    gst_gepard_codec_anchor (self, buffer);
  gst_buffer_unref (buffer);

  gsize n_samples = (gsize)n_frames * self->samples_per_frame;
  GstBuffer *out = gst_buffer_new_allocate (NULL, n_samples * sizeof (float), NULL);
  GstMapInfo map;
  gst_buffer_map (out, &map, GST_MAP_WRITE);
  g_autoptr (GError) error = NULL;
  gboolean ok = self->decoder != NULL ? gepard_audio_decoder_decode (self->decoder, codes, n_frames,
                                                                     (float *)map.data, &error)
                                      : gepard_codec_stream_decode (self->stream, codes, n_frames,
                                                                    (float *)map.data, &error);
  gst_buffer_unmap (out, &map);
  if (!ok)
    {
      gst_buffer_unref (out);
      GST_ELEMENT_ERROR (
          self, STREAM, DECODE,
          ("Could not decode frame %" G_GUINT64_FORMAT ": %s", self->n_frames, error->message),
          (NULL));
      return GST_FLOW_ERROR;
    }
  self->stream_dirty = TRUE;
  self->n_frames += n_frames;

  GST_BUFFER_PTS (out) = sample_pts (self->offset);
  GST_BUFFER_DURATION (out) = sample_pts (self->offset + n_samples) - sample_pts (self->offset);
  GST_BUFFER_OFFSET (out) = self->offset;
  GST_BUFFER_OFFSET_END (out) = self->offset + n_samples;
  self->offset += n_samples;
  if (self->discont)
    {
      GST_BUFFER_FLAG_SET (out, GST_BUFFER_FLAG_DISCONT);
      self->discont = FALSE;
    }
  return gst_pad_push (self->srcpad, out);
}

static gboolean
gst_gepard_codec_sink_event (GstPad *pad, GstObject *parent, GstEvent *event)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (parent);

  switch (GST_EVENT_TYPE (event))
    {
    case GST_EVENT_CAPS:
      {
        /* the codes caps are fixed, and so are ours */
        gst_event_unref (event);
        GstCaps *caps = gst_pad_get_pad_template_caps (self->srcpad);
        gboolean ok = gst_pad_push_event (self->srcpad, gst_event_new_caps (caps));
        gst_caps_unref (caps);
        return ok;
      }
    case GST_EVENT_SEGMENT:
      {
        /* frame time is audio time; anything else (bytes from a file of codes) becomes a time
         * segment from zero, which is where the counter starts */
        const GstSegment *in;
        gst_event_parse_segment (event, &in);
        if (in->format == GST_FORMAT_TIME)
          return gst_pad_event_default (pad, parent, event);
        gst_event_unref (event);
        GstSegment segment;
        gst_segment_init (&segment, GST_FORMAT_TIME);
        return gst_pad_push_event (self->srcpad, gst_event_new_segment (&segment));
      }
    case GST_EVENT_FLUSH_STOP:
    case GST_EVENT_STREAM_START:
      /* a new stream, or running time starting over: the counter too */
      gst_gepard_codec_reset (self);
      self->offset = 0;
      return gst_pad_event_default (pad, parent, event);
    default:
      /* decoding is synchronous: nothing is held back, so EOS and every other event just follow
       * the audio of the frames before them */
      return gst_pad_event_default (pad, parent, event);
    }
}

/* ---- state ---- */

/* Checks `codec` fits the codes caps and makes ready to decode with it. */
static gboolean
gst_gepard_codec_prepare (GstGepardCodec *self, GepardCodec *codec)
{
  const GepardCodecConfig *config = gepard_codec_get_config (codec);

  if (config->latent_dim != GEPARD_CODES_CHANNELS || config->sample_rate != SAMPLE_RATE
      || config->fsq_n_dims <= 0)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("The codec of “%s” takes %d channels per frame at %d Hz; gepardcodec "
                          "needs %d channels at %d Hz.",
                          self->source, config->latent_dim, config->sample_rate,
                          GEPARD_CODES_CHANNELS, SAMPLE_RATE),
                         (NULL));
      return FALSE;
    }
  self->codec = codec;
  /* channel i is FSQ dimension i % n_dims of codebook i / n_dims (nanocodec.md §4) */
  for (int c = 0; c < GEPARD_CODES_CHANNELS; c++)
    self->levels[c] = config->fsq_levels[c % config->fsq_n_dims];
  self->samples_per_frame = config->samples_per_frame;
  self->opened = TRUE;
  GST_INFO_OBJECT (self, "codec from %s, %d samples per frame, decoding %s", self->source,
                   self->samples_per_frame,
                   self->decoder != NULL ? "through the engine's codec service" : "here");
  return TRUE;
}

/* The codec of `engine`, decoded through its codec service. */
static gboolean
gst_gepard_codec_use_engine (GstGepardCodec *self, GepardEngine *engine)
{
  g_autoptr (GError) error = NULL;

  self->engine = engine;
  g_free (self->source);
  self->source = g_strdup (gepard_engine_get_model_dir (engine));
  self->decoder = gepard_engine_new_audio_decoder (engine, &error);
  if (self->decoder == NULL)
    {
      GST_ELEMENT_ERROR (
          self, RESOURCE, NOT_FOUND,
          ("The model “%s” has no codec: there is no codec.nemo or codec.safetensors in its "
           "directory and no nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps in the Hugging Face "
           "cache. Put the codec beside the model or set the codec property to a NanoCodec "
           ".nemo or .safetensors file.",
           self->source),
          ("%s", error->message));
      return FALSE;
    }
  return gst_gepard_codec_prepare (self, gepard_audio_decoder_get_codec (self->decoder));
}

/* The first frame came with no model and no codec file set: by now the gepardlm upstream runs
 * and answers for its engine (it starts after us), or the bin has cached its announcement. */
static gboolean
gst_gepard_codec_open_from_context (GstGepardCodec *self)
{
  g_autoptr (GError) error = NULL;
  GepardEngine *engine
      = gst_gepard_engine_acquire (GST_ELEMENT (self), NULL, NULL, &self->context_engine, &error);

  if (engine == NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("No codec: set the model property to a GEPARD model directory or repo "
                          "id, or the codec property to a NanoCodec .nemo or .safetensors file, "
                          "or place gepardcodec after a gepardlm that has a model."),
                         (NULL));
      return FALSE;
    }
  return gst_gepard_codec_use_engine (self, engine);
}

static void
gst_gepard_codec_stop (GstGepardCodec *self)
{
  g_clear_pointer (&self->stream, gepard_codec_stream_free);
  g_clear_pointer (&self->decoder, gepard_audio_decoder_free);
  self->codec = NULL;
  g_clear_pointer (&self->own_codec, gepard_codec_free);
  g_clear_pointer (&self->engine, gepard_engine_unref);
  g_clear_pointer (&self->source, g_free);
  self->opened = FALSE;
}

/* The model's codec (through the engine it shares with gepardlm) when model= is set, else a
 * codec file when codec= is, else the engine of a "gepard.engine" context — found now, or at the
 * first frame when it comes from the gepardlm upstream. */
static gboolean
gst_gepard_codec_start (GstGepardCodec *self)
{
  GST_OBJECT_LOCK (self);
  g_autofree char *model = g_strdup (self->model);
  g_autofree char *device = g_strdup (self->device ? self->device : DEFAULT_DEVICE);
  g_autofree char *codec_path = g_strdup (self->codec_path);
  GST_OBJECT_UNLOCK (self);
  g_autoptr (GError) error = NULL;
  gboolean ok = TRUE;

  self->stream_dirty = FALSE;
  self->offset = 0;
  self->n_frames = 0;
  gst_gepard_codec_reset (self);

  if (model != NULL && *model == '\0')
    g_clear_pointer (&model, g_free);
  if (codec_path != NULL && *codec_path == '\0')
    g_clear_pointer (&codec_path, g_free);

  if (model == NULL && codec_path != NULL)
    {
      self->source = g_strdup (codec_path);
      self->own_codec = gepard_codec_new (codec_path, &error);
      if (self->own_codec == NULL)
        {
          GST_ELEMENT_ERROR (self, RESOURCE, OPEN_READ,
                             ("Could not load the codec “%s”: %s", codec_path, error->message),
                             (NULL));
          ok = FALSE;
        }
      else
        {
          self->stream = gepard_codec_stream_new (self->own_codec);
          ok = gst_gepard_codec_prepare (self, self->own_codec);
        }
    }
  else
    {
      if (codec_path != NULL)
        GST_INFO_OBJECT (self, "model set: codec property %s not used", codec_path);
      GepardEngine *engine = gst_gepard_engine_acquire (GST_ELEMENT (self), model, device,
                                                        &self->context_engine, &error);
      if (engine != NULL)
        ok = gst_gepard_codec_use_engine (self, engine);
      else if (error != NULL)
        {
          GST_ELEMENT_ERROR (self, RESOURCE, OPEN_READ,
                             ("Could not load the GEPARD model “%s” on device “%s” for its codec: "
                              "%s",
                              model, device, error->message),
                             (NULL));
          ok = FALSE;
        }
      else
        GST_DEBUG_OBJECT (self, "no model yet: taking the engine of the first frame's producer");
    }
  if (!ok)
    gst_gepard_codec_stop (self);
  return ok;
}

static GstStateChangeReturn
gst_gepard_codec_change_state (GstElement *element, GstStateChange transition)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (element);

  if (transition == GST_STATE_CHANGE_READY_TO_PAUSED && !gst_gepard_codec_start (self))
    return GST_STATE_CHANGE_FAILURE;

  GstStateChangeReturn ret = GST_ELEMENT_CLASS (parent_class)->change_state (element, transition);

  /* after the pads are deactivated, so no chain function is decoding any more */
  if ((transition == GST_STATE_CHANGE_PAUSED_TO_READY)
      || (transition == GST_STATE_CHANGE_READY_TO_PAUSED && ret == GST_STATE_CHANGE_FAILURE))
    gst_gepard_codec_stop (self);
  return ret;
}

/* ---- GObject ---- */

static void
gst_gepard_codec_set_property (GObject *object, guint prop_id, const GValue *value,
                               GParamSpec *pspec)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (object);

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
    case PROP_CODEC:
      g_free (self->codec_path);
      self->codec_path = g_value_dup_string (value);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
  GST_OBJECT_UNLOCK (self);
}

static void
gst_gepard_codec_get_property (GObject *object, guint prop_id, GValue *value, GParamSpec *pspec)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (object);

  GST_OBJECT_LOCK (self);
  switch (prop_id)
    {
    case PROP_MODEL:
      g_value_set_string (value, self->model);
      break;
    case PROP_DEVICE:
      g_value_set_string (value, self->device);
      break;
    case PROP_CODEC:
      g_value_set_string (value, self->codec_path);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
  GST_OBJECT_UNLOCK (self);
}

static void
gst_gepard_codec_set_context (GstElement *element, GstContext *context)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (element);

  gst_gepard_engine_set_context (element, context, &self->context_engine);
  GST_ELEMENT_CLASS (parent_class)->set_context (element, context);
}

/* LATENCY: the decoder has no lookahead, so a frame's audio leaves as soon as the frame arrives
 * and upstream's latency is the whole answer: the default handler forwards it unchanged. A context
 * query for an engine gets the one in use. */
static gboolean
gst_gepard_codec_query (GstPad *pad, GstObject *parent, GstQuery *query)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (parent);

  if (GST_QUERY_TYPE (query) == GST_QUERY_CONTEXT
      && gst_gepard_engine_answer_query (query, self->engine))
    return TRUE;
  return gst_pad_query_default (pad, parent, query);
}

static void
gst_gepard_codec_finalize (GObject *object)
{
  GstGepardCodec *self = GST_GEPARD_CODEC (object);

  g_clear_pointer (&self->context_engine, gepard_engine_unref);
  g_free (self->model);
  g_free (self->device);
  g_free (self->codec_path);
  G_OBJECT_CLASS (parent_class)->finalize (object);
}

static void
gst_gepard_codec_class_init (GstGepardCodecClass *klass)
{
  GObjectClass *gobject_class = G_OBJECT_CLASS (klass);
  GstElementClass *element_class = GST_ELEMENT_CLASS (klass);

  gobject_class->set_property = gst_gepard_codec_set_property;
  gobject_class->get_property = gst_gepard_codec_get_property;
  gobject_class->finalize = gst_gepard_codec_finalize;

  g_object_class_install_property (
      gobject_class, PROP_MODEL,
      g_param_spec_string ("model", "Model",
                           "GEPARD model whose codec decodes: a checkpoint directory or a Hugging "
                           "Face repo id, as given to gepardlm. Wins over codec when both are set. "
                           "With neither, the codec of the engine gepardlm upstream uses (or of a "
                           "\"gepard.engine\" GstContext) decodes.",
                           NULL,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_DEVICE,
      g_param_spec_string ("device", "Device",
                           "Device of the model's engine: auto, cpu, cuda or cuda:N. Give the "
                           "same value as gepardlm's so both share one engine.",
                           DEFAULT_DEVICE,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_CODEC,
      g_param_spec_string ("codec", "Codec",
                           "NanoCodec checkpoint (.nemo or .safetensors) to decode with when no "
                           "model is set.",
                           NULL,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));

  gst_element_class_add_static_pad_template (element_class, &sink_template);
  gst_element_class_add_static_pad_template (element_class, &src_template);
  gst_element_class_set_static_metadata (
      element_class, "NanoCodec decoder", "Codec/Decoder/Audio",
      "Decodes GEPARD frames into 22050 Hz audio as they arrive, with NanoCodec's causal decoder",
      "Gepard");

  element_class->change_state = GST_DEBUG_FUNCPTR (gst_gepard_codec_change_state);
  element_class->set_context = GST_DEBUG_FUNCPTR (gst_gepard_codec_set_context);
}

static void
gst_gepard_codec_init (GstGepardCodec *self)
{
  self->sinkpad = gst_pad_new_from_static_template (&sink_template, "sink");
  gst_pad_set_chain_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_codec_chain));
  gst_pad_set_event_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_codec_sink_event));
  gst_pad_set_query_function (self->sinkpad, GST_DEBUG_FUNCPTR (gst_gepard_codec_query));
  gst_element_add_pad (GST_ELEMENT (self), self->sinkpad);

  self->srcpad = gst_pad_new_from_static_template (&src_template, "src");
  gst_pad_use_fixed_caps (self->srcpad);
  gst_pad_set_query_function (self->srcpad, GST_DEBUG_FUNCPTR (gst_gepard_codec_query));
  gst_element_add_pad (GST_ELEMENT (self), self->srcpad);

  self->device = g_strdup (DEFAULT_DEVICE);
}
