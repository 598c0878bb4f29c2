/* gepard-audio-format.h: Cartesia's output_format (cartesia-protocol.md §1.3) and what it takes to
 * produce it: the pipeline description, the caps after audioresample, and the WAV header. */
#pragma once

#include <json-glib/json-glib.h>

G_BEGIN_DECLS

typedef enum
{
  GEPARD_CONTAINER_RAW,
  GEPARD_CONTAINER_WAV,
} GepardContainer;

typedef enum
{
  GEPARD_ENCODING_PCM_S16LE,
  GEPARD_ENCODING_PCM_F32LE,
  GEPARD_ENCODING_PCM_MULAW,
  GEPARD_ENCODING_PCM_ALAW,
} GepardEncoding;

#define GEPARD_MIN_SAMPLE_RATE 8000
#define GEPARD_MAX_SAMPLE_RATE 48000

typedef struct
{
  GepardContainer container;
  GepardEncoding encoding;
  int sample_rate;
} GepardOutputFormat;

/* An output_format object. mp3 and anything outside the enumerations is
 * GEPARD_API_ERROR_UNSUPPORTED_FORMAT; a wrong type is GEPARD_API_ERROR_BAD_REQUEST. */
gboolean gepard_output_format_parse (JsonNode *node, GepardOutputFormat *format, GError **error);

/* The file in pipelines/ that produces `format`'s samples. */
const char *gepard_output_format_pipeline_name (const GepardOutputFormat *format);
/* The caps for the pipeline's capsfilter named "format" (raw PCM before any G.711 encoder). */
char *gepard_output_format_caps (const GepardOutputFormat *format);
guint gepard_output_format_bytes_per_sample (const GepardOutputFormat *format);
const char *gepard_output_format_content_type (const GepardOutputFormat *format);
/* A 44-byte (PCM) or 46-byte WAV header whose sizes say "until the end of the stream", since
 * the length is not known when streaming starts. */
GBytes *gepard_output_format_wav_header (const GepardOutputFormat *format);

G_END_DECLS
