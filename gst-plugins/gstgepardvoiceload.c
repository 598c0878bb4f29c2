/* gstgepardvoiceload.c: resolving a voice= value (default, registered id, prefix file, clip). */
#include "gstgepardvoiceload.h"

#include <gepard-error.h>
#include <gst/app/gstappsink.h>
#include <gst/audio/audio.h>

#include <errno.h>
#include <glib/gstdio.h>
#include <string.h>

GST_DEBUG_CATEGORY_STATIC (gst_gepard_voice_load_debug);
#define GST_CAT_DEFAULT gst_gepard_voice_load_debug

/* A local file of at most a minute decodes in well under a second; this only bounds files that
 * never end (a FIFO, a device) or a decoder that stalls. */
#define DECODE_TIMEOUT (30 * GST_SECOND)

#define TOO_LONG_MESSAGE "gepard-voice-clip-too-long"

/* Formats GStreamer decodes whose files start with a signature. A speaker prefix holds small bf16
 * values (gepard-model.md §3.7), so its first bytes are never one of these: the low 16 bits of
 * each little-endian value are zero. */
static gboolean
looks_like_audio (const guint8 *head, gsize n)
{
  static const char *const magic[] = {"RIFF",
                                      "RIFX",
                                      "RF64",
                                      "fLaC",
                                      "OggS",
                                      "ID3",
                                      "FORM",
                                      ".snd",
                                      "caff",
                                      "wvpk",
                                      "MAC ",
                                      "#!AMR",
                                      "\x1a\x45\xdf\xa3",
                                      "\x30\x26\xb2\x75" /* ASF */};
  for (guint i = 0; i < G_N_ELEMENTS (magic); i++)
    {
      gsize len = strlen (magic[i]);
      if (n >= len && memcmp (head, magic[i], len) == 0)
        return TRUE;
    }
  /* ISO media (m4a, mp4, 3gp): a box size, then "ftyp" */
  if (n >= 8 && memcmp (head + 4, "ftyp", 4) == 0)
    return TRUE;
  /* an MPEG audio or ADTS frame sync: eleven set bits */
  if (n >= 2 && head[0] == 0xff && (head[1] & 0xe0) == 0xe0)
    return TRUE;
  return FALSE;
}

typedef struct
{
  GMutex lock;
  GArray *samples; /* float */
  gsize max_samples;
  gboolean too_long;
} Clip;

static GstFlowReturn
clip_new_sample (GstAppSink *sink, gpointer user_data)
{
  Clip *clip = user_data;
  g_autoptr (GstSample) sample = gst_app_sink_pull_sample (sink);
  if (sample == NULL)
    return GST_FLOW_EOS;
  GstBuffer *buffer = gst_sample_get_buffer (sample);
  GstMapInfo map;
  if (buffer == NULL || !gst_buffer_map (buffer, &map, GST_MAP_READ))
    return GST_FLOW_OK;
  gsize n = map.size / sizeof (float);
  g_mutex_lock (&clip->lock);
  gboolean too_long = clip->samples->len + n > clip->max_samples;
  if (too_long)
    clip->too_long = TRUE;
  else
    {
      /* F32LE was asked for; on a big-endian host the bytes still need turning */
      guint start = clip->samples->len;
      g_array_append_vals (clip->samples, map.data, n);
#if G_BYTE_ORDER == G_BIG_ENDIAN
      guint32 *words = (guint32 *)&g_array_index (clip->samples, float, start);
      for (gsize i = 0; i < n; i++)
        words[i] = GUINT32_FROM_LE (words[i]);
#else
      (void)start;
#endif
    }
  g_mutex_unlock (&clip->lock);
  gst_buffer_unmap (buffer, &map);
  if (too_long)
    {
      /* stop reading at once and tell the waiting thread why the stream ends */
      gst_element_post_message (GST_ELEMENT (sink),
                                gst_message_new_application (
                                    GST_OBJECT (sink), gst_structure_new_empty (TOO_LONG_MESSAGE)));
      return GST_FLOW_EOS;
    }
  return GST_FLOW_OK;
}

/* Decodes `path` to mono float samples at `rate` through
 * filesrc ! decodebin ! audioconvert ! audioresample ! capsfilter ! appsink, the same path the
 * clone pipeline takes (pipelines/clone.txt), so both give the same samples for one file. */
static GArray *
decode_clip (const char *path, int rate, GError **error)
{
  g_autoptr (GError) local = NULL;
  g_autofree char *description
      = g_strdup_printf ("filesrc name=src ! decodebin ! audioconvert ! audioresample "
                         "! audio/x-raw, format=F32LE, rate=%d, channels=1, layout=interleaved "
                         "! appsink name=sink sync=false",
                         rate);
  g_autoptr (GstElement) pipeline = gst_parse_launch (description, &local);
  if (pipeline == NULL)
    {
      g_set_error (error, GST_CORE_ERROR, GST_CORE_ERROR_MISSING_PLUGIN,
                   "Cannot build the pipeline that decodes reference clips: %s", local->message);
      return NULL;
    }
  g_autoptr (GstElement) src = gst_bin_get_by_name (GST_BIN (pipeline), "src");
  g_autoptr (GstElement) sink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
  g_object_set (src, "location", path, NULL);

  Clip clip = {0};
  g_mutex_init (&clip.lock);
  clip.samples = g_array_new (FALSE, FALSE, sizeof (float));
  clip.max_samples = (gsize)GST_GEPARD_VOICE_MAX_CLIP_SECONDS * rate;
  GstAppSinkCallbacks callbacks = {.new_sample = clip_new_sample};
  gst_app_sink_set_callbacks (GST_APP_SINK (sink), &callbacks, &clip, NULL);

  g_autoptr (GstBus) bus = gst_element_get_bus (pipeline);
  gboolean ok = FALSE;
  gst_element_set_state (pipeline, GST_STATE_PLAYING);
  /* a failed state change leaves its error on the bus, so the wait below reports it */
  gint64 deadline = g_get_monotonic_time () + DECODE_TIMEOUT / GST_USECOND;
  for (;;)
    {
      gint64 left = deadline - g_get_monotonic_time ();
      g_autoptr (GstMessage) message = gst_bus_timed_pop_filtered (
          bus, MAX (left, 0) * GST_USECOND,
          GST_MESSAGE_ERROR | GST_MESSAGE_EOS | GST_MESSAGE_APPLICATION);
      if (message == NULL)
        {
          g_set_error (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_BUSY,
                       "Decoding the reference clip %s took longer than %d s; give a regular "
                       "audio file",
                       path, (int)(DECODE_TIMEOUT / GST_SECOND));
          break;
        }
      if (GST_MESSAGE_TYPE (message) == GST_MESSAGE_ERROR)
        {
          g_autoptr (GError) failure = NULL;
          g_autofree char *debug = NULL;
          gst_message_parse_error (message, &failure, &debug);
          GST_DEBUG ("decoding %s failed: %s (%s)", path, failure->message, debug);
          g_set_error (error, failure->domain, failure->code,
                       "Cannot decode the reference clip %s as audio: %s. Give a recording in a "
                       "format GStreamer decodes (WAV, FLAC, Ogg, MP3, …)",
                       path, failure->message);
          break;
        }
      if (GST_MESSAGE_TYPE (message) == GST_MESSAGE_APPLICATION
          && !gst_message_has_name (message, TOO_LONG_MESSAGE))
        continue;
      /* EOS, or the clip went past the limit */
      ok = TRUE;
      break;
    }
  /* joins the streaming threads: no callback runs after this */
  gst_element_set_state (pipeline, GST_STATE_NULL);

  g_autoptr (GArray) samples = clip.samples;
  g_mutex_clear (&clip.lock);
  if (!ok)
    return NULL;
  if (clip.too_long)
    {
      g_set_error (error, GST_STREAM_ERROR, GST_STREAM_ERROR_FORMAT,
                   "The reference clip %s is longer than %d s; trim it to a few seconds of clear "
                   "speech",
                   path, GST_GEPARD_VOICE_MAX_CLIP_SECONDS);
      return NULL;
    }
  if (samples->len == 0)
    {
      g_set_error (error, GST_STREAM_ERROR, GST_STREAM_ERROR_FORMAT,
                   "The reference clip %s holds no audio", path);
      return NULL;
    }
  GST_DEBUG ("decoded %s: %u samples at %d Hz", path, samples->len, rate);
  return g_steal_pointer (&samples);
}

static GepardVoice *
load_file (GepardEngine *engine, const char *path, GError **error)
{
  const GepardModelConfig *config = gepard_engine_get_config (engine);
  gsize prefix_size = gepard_voice_get_prefix_file_size (config);
  GStatBuf st;
  if (g_stat (path, &st) != 0)
    {
      int saved = errno;
      g_set_error (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_OPEN_READ,
                   "Cannot read the voice file %s: %s", path, g_strerror (saved));
      return NULL;
    }

  if (prefix_size > 0 && (gsize)st.st_size == prefix_size)
    {
      guint8 head[16] = {0};
      gsize n = 0;
      FILE *file = g_fopen (path, "rb");
      if (file == NULL)
        {
          int saved = errno;
          g_set_error (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_OPEN_READ,
                       "Cannot read the voice file %s: %s", path, g_strerror (saved));
          return NULL;
        }
      n = fread (head, 1, sizeof head, file);
      fclose (file);
      if (!looks_like_audio (head, n))
        {
          GST_DEBUG ("%s: a speaker prefix file", path);
          return gepard_voice_load_prefix_file (path, config, error);
        }
    }

  GepardCodec *codec = gepard_engine_get_codec (engine);
  int rate = codec != NULL ? gepard_codec_get_config (codec)->sample_rate : 22050;
  g_autoptr (GArray) samples = decode_clip (path, rate, error);
  if (samples == NULL)
    return NULL;
  return gepard_voice_new_from_audio (engine, path, (const float *)samples->data, samples->len,
                                      error);
}

GepardVoice *
gst_gepard_voice_load (GepardEngine *engine, const char *voice, GError **error)
{
  static gsize debug_once = 0;
  if (g_once_init_enter (&debug_once))
    {
      GST_DEBUG_CATEGORY_INIT (gst_gepard_voice_load_debug, "gepardvoiceload", 0,
                               "Gepard voice= values");
      g_once_init_leave (&debug_once, 1);
    }
  g_return_val_if_fail (engine != NULL, NULL);

  if (voice == NULL || voice[0] == '\0' || g_str_equal (voice, "default"))
    {
      GepardVoice *def = gepard_engine_lookup_voice (engine, "default");
      if (def != NULL)
        return def;
      /* gepard-model.md §3.2: no reference means no prefix at all */
      return gepard_voice_new ("default", NULL, 0, gepard_engine_get_config (engine)->hidden_size);
    }

  GepardVoice *known = gepard_engine_lookup_voice (engine, voice);
  if (known != NULL)
    return known;

  if (g_file_test (voice, G_FILE_TEST_IS_REGULAR))
    return load_file (engine, voice, error);

  g_set_error (error, GST_RESOURCE_ERROR, GST_RESOURCE_ERROR_NOT_FOUND,
               "Unknown voice “%s”: give “default”, the id of a voice registered with the engine, "
               "or the path of a reference clip (audio GStreamer decodes, at most %d s) or of a "
               "speaker prefix file",
               voice, GST_GEPARD_VOICE_MAX_CLIP_SECONDS);
  return NULL;
}
