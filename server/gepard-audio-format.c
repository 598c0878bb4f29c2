/* gepard-audio-format.c: output_format parsing, caps and WAV headers. */
#include "gepard-audio-format.h"

#include "gepard-api-error.h"

#include <string.h>

static const char *const encodings[] = {"pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw"};

static const char *
member_string (JsonObject *object, const char *name, GError **error)
{
  JsonNode *node = json_object_get_member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return NULL;
  if (!JSON_NODE_HOLDS_VALUE (node) || json_node_get_value_type (node) != G_TYPE_STRING)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                   "output_format.%s must be a string", name);
      return NULL;
    }
  const char *text = json_node_get_string (node);
  g_autofree char *full_name = g_strconcat ("output_format.", name, NULL);
  return gepard_api_error_check_text (text, full_name, error) ? text : NULL;
}

gboolean
gepard_output_format_parse (JsonNode *node, GepardOutputFormat *format, GError **error)
{
  GError *local = NULL;

  if (node == NULL || !JSON_NODE_HOLDS_OBJECT (node))
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "output_format must be an object with container, encoding and "
                           "sample_rate");
      return FALSE;
    }
  JsonObject *object = json_node_get_object (node);

  const char *container = member_string (object, "container", &local);
  if (local != NULL)
    {
      g_propagate_error (error, local);
      return FALSE;
    }
  if (g_strcmp0 (container, "raw") == 0)
    format->container = GEPARD_CONTAINER_RAW;
  else if (g_strcmp0 (container, "wav") == 0)
    format->container = GEPARD_CONTAINER_WAV;
  else
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNSUPPORTED_FORMAT,
                   "Unsupported output_format.container \"%s\": use raw or wav",
                   container != NULL ? container : "");
      return FALSE;
    }

  const char *encoding = member_string (object, "encoding", &local);
  if (local != NULL)
    {
      g_propagate_error (error, local);
      return FALSE;
    }
  gsize i;
  for (i = 0; i < G_N_ELEMENTS (encodings); i++)
    if (g_strcmp0 (encoding, encodings[i]) == 0)
      break;
  if (i == G_N_ELEMENTS (encodings))
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNSUPPORTED_FORMAT,
                   "Unsupported output_format.encoding \"%s\": use pcm_s16le, pcm_f32le, "
                   "pcm_mulaw or pcm_alaw",
                   encoding != NULL ? encoding : "");
      return FALSE;
    }
  format->encoding = (GepardEncoding)i;

  JsonNode *rate = json_object_get_member (object, "sample_rate");
  if (rate == NULL || !JSON_NODE_HOLDS_VALUE (rate)
      || (json_node_get_value_type (rate) != G_TYPE_INT64
          && json_node_get_value_type (rate) != G_TYPE_DOUBLE))
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "output_format.sample_rate must be a number");
      return FALSE;
    }
  double value = json_node_get_value_type (rate) == G_TYPE_INT64 ? (double)json_node_get_int (rate)
                                                                 : json_node_get_double (rate);
  if (!(value >= GEPARD_MIN_SAMPLE_RATE && value <= GEPARD_MAX_SAMPLE_RATE)
      || value != (double)(int)value)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNSUPPORTED_FORMAT,
                   "Unsupported output_format.sample_rate %g: use a whole number of Hz from %d "
                   "to %d",
                   value, GEPARD_MIN_SAMPLE_RATE, GEPARD_MAX_SAMPLE_RATE);
      return FALSE;
    }
  format->sample_rate = (int)value;
  return TRUE;
}

const char *
gepard_output_format_pipeline_name (const GepardOutputFormat *format)
{
  switch (format->encoding)
    {
    case GEPARD_ENCODING_PCM_MULAW:
      return "tts-stream-mulaw.txt";
    case GEPARD_ENCODING_PCM_ALAW:
      return "tts-stream-alaw.txt";
    default:
      return "tts-stream.txt";
    }
}

char *
gepard_output_format_caps (const GepardOutputFormat *format)
{
  /* the G.711 encoders take S16 at the rate they emit */
  const char *sample_format = format->encoding == GEPARD_ENCODING_PCM_F32LE ? "F32LE" : "S16LE";
  return g_strdup_printf ("audio/x-raw, format=(string)%s, rate=(int)%d, channels=(int)1, "
                          "layout=(string)interleaved",
                          sample_format, format->sample_rate);
}

guint
gepard_output_format_bytes_per_sample (const GepardOutputFormat *format)
{
  switch (format->encoding)
    {
    case GEPARD_ENCODING_PCM_F32LE:
      return 4;
    case GEPARD_ENCODING_PCM_S16LE:
      return 2;
    default:
      return 1;
    }
}

const char *
gepard_output_format_content_type (const GepardOutputFormat *format)
{
  return format->container == GEPARD_CONTAINER_WAV ? "audio/wav" : "application/octet-stream";
}

static void
put_u16 (guint8 *p, guint16 v)
{
  p[0] = v & 0xff;
  p[1] = v >> 8;
}

static void
put_u32 (guint8 *p, guint32 v)
{
  put_u16 (p, v & 0xffff);
  put_u16 (p + 2, v >> 16);
}

GBytes *
gepard_output_format_wav_header (const GepardOutputFormat *format)
{
  /* WAVE_FORMAT_PCM, _IEEE_FLOAT, _ALAW, _MULAW; non-PCM formats carry cbSize = 0 */
  guint16 tag;
  switch (format->encoding)
    {
    case GEPARD_ENCODING_PCM_F32LE:
      tag = 3;
      break;
    case GEPARD_ENCODING_PCM_ALAW:
      tag = 6;
      break;
    case GEPARD_ENCODING_PCM_MULAW:
      tag = 7;
      break;
    default:
      tag = 1;
      break;
    }
  guint fmt_size = tag == 1 ? 16 : 18;
  gsize size = 12 + 8 + fmt_size + 8;
  guint8 *h = g_malloc0 (size);
  guint bytes = gepard_output_format_bytes_per_sample (format);

  memcpy (h, "RIFF", 4);
  put_u32 (h + 4, 0xffffffffu);
  memcpy (h + 8, "WAVE", 4);
  memcpy (h + 12, "fmt ", 4);
  put_u32 (h + 16, fmt_size);
  put_u16 (h + 20, tag);
  put_u16 (h + 22, 1);
  put_u32 (h + 24, (guint32)format->sample_rate);
  put_u32 (h + 28, (guint32)format->sample_rate * bytes);
  put_u16 (h + 32, (guint16)bytes);
  put_u16 (h + 34, (guint16)(bytes * 8));
  /* cbSize, when present, stays 0 */
  memcpy (h + 20 + fmt_size, "data", 4);
  put_u32 (h + 24 + fmt_size, 0xffffffffu);
  return g_bytes_new_take (h, size);
}
