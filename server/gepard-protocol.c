/* gepard-protocol.c: Cartesia TTS requests in, events out. */
#include "gepard-protocol.h"

#include "gepard-api-error.h"

#include <string.h>

static gboolean
bad_type (const char *name, const char *what, GError **error)
{
  g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST, "%s must be %s", name, what);
  return FALSE;
}

static gboolean
is_string (JsonNode *node)
{
  return JSON_NODE_HOLDS_VALUE (node) && json_node_get_value_type (node) == G_TYPE_STRING;
}

/* The text of a JSON string, refused when it is not UTF-8 (gepard_api_error_check_text). */
static gboolean
text_of (JsonNode *node, const char *name, const char **out, GError **error)
{
  *out = json_node_get_string (node);
  return gepard_api_error_check_text (*out, name, error);
}

/* NULL (absent or null) is fine; anything but a string is not. */
static gboolean
read_string (JsonObject *object, const char *name, char **out, GError **error)
{
  JsonNode *node = json_object_get_member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return TRUE;
  const char *text;
  if (!is_string (node))
    return bad_type (name, "a string", error);
  if (!text_of (node, name, &text, error))
    return FALSE;
  g_free (*out);
  *out = g_strdup (text);
  return TRUE;
}

static gboolean
read_bool (JsonObject *object, const char *name, gboolean *out, GError **error)
{
  JsonNode *node = json_object_get_member (object, name);
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return TRUE;
  if (!JSON_NODE_HOLDS_VALUE (node) || json_node_get_value_type (node) != G_TYPE_BOOLEAN)
    return bad_type (name, "true or false", error);
  *out = json_node_get_boolean (node);
  return TRUE;
}

/* The voice specifier forms of cartesia-protocol.md §1.3: "<id>", {"id": …},
 * {"mode": "id", "id": …}; embeddings are refused. */
static gboolean
read_voice (JsonObject *object, char **out, GError **error)
{
  JsonNode *node = json_object_get_member (object, "voice");
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return TRUE;
  const char *text;
  if (is_string (node))
    {
      if (!text_of (node, "voice", &text, error))
        return FALSE;
      *out = g_strdup (text);
      return TRUE;
    }
  if (!JSON_NODE_HOLDS_OBJECT (node))
    return bad_type ("voice", "a voice id or an object with an id", error);
  JsonObject *voice = json_node_get_object (node);
  JsonNode *mode = json_object_get_member (voice, "mode");
  if (mode != NULL && !JSON_NODE_HOLDS_NULL (mode))
    {
      if (!is_string (mode))
        return bad_type ("voice.mode", "a string", error);
      if (!text_of (mode, "voice.mode", &text, error))
        return FALSE;
      if (strcmp (text, "id") != 0)
        {
          g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                       "voice.mode \"%s\" is not supported: give a voice id", text);
          return FALSE;
        }
    }
  JsonNode *id = json_object_get_member (voice, "id");
  if (id == NULL || !is_string (id))
    return bad_type ("voice.id", "a string", error);
  if (!text_of (id, "voice.id", &text, error))
    return FALSE;
  *out = g_strdup (text);
  return TRUE;
}

/* The frames a benchmark may force per sentence at most; gepardlm's max-frames has the same
 * bound. */
#define GEPARD_EXTENSION_MAX_FRAMES 100000

/* Gepard's extension: "gepard": {"max_frames": N, "ignore_stop": true|false}. Each sentence
 * stops after N frames at most; with ignore_stop it runs to exactly N whatever the stop head
 * says (as vLLM's ignore_eos), so that a benchmark knows how much audio each sentence makes. */
static gboolean
read_extension (JsonObject *object, GepardTtsRequest *request, GError **error)
{
  JsonNode *node = json_object_get_member (object, "gepard");
  if (node == NULL || JSON_NODE_HOLDS_NULL (node))
    return TRUE;
  if (!JSON_NODE_HOLDS_OBJECT (node))
    return bad_type ("gepard", "an object", error);
  JsonObject *extension = json_node_get_object (node);
  JsonNode *frames = json_object_get_member (extension, "max_frames");
  if (frames != NULL && !JSON_NODE_HOLDS_NULL (frames))
    {
      if (!JSON_NODE_HOLDS_VALUE (frames) || json_node_get_value_type (frames) != G_TYPE_INT64
          || json_node_get_int (frames) < 1
          || json_node_get_int (frames) > GEPARD_EXTENSION_MAX_FRAMES)
        {
          g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                       "gepard.max_frames must be an integer from 1 to %d",
                       GEPARD_EXTENSION_MAX_FRAMES);
          return FALSE;
        }
      request->max_frames = (int)json_node_get_int (frames);
    }
  if (!read_bool (extension, "ignore_stop", &request->ignore_stop, error))
    {
      g_clear_error (error);
      return bad_type ("gepard.ignore_stop", "true or false", error);
    }
  if (request->ignore_stop && request->max_frames == 0)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "gepard.ignore_stop needs gepard.max_frames");
      return FALSE;
    }
  return TRUE;
}

/* json-glib parses recursively: deep enough nesting ("[[[[…") exhausts the stack, so it is
 * measured first, outside strings, without parsing. */
#define MAX_JSON_DEPTH 64

static gboolean
json_depth_ok (const char *data, gsize length)
{
  int depth = 0;
  gboolean in_string = FALSE;

  for (gsize i = 0; i < length; i++)
    {
      char c = data[i];
      if (in_string)
        {
          if (c == '\\')
            i++;
          else if (c == '"')
            in_string = FALSE;
        }
      else if (c == '"')
        in_string = TRUE;
      else if (c == '[' || c == '{')
        {
          if (++depth > MAX_JSON_DEPTH)
            return FALSE;
        }
      else if (c == ']' || c == '}')
        depth--;
    }
  return TRUE;
}

gboolean
gepard_tts_request_parse (const char *data, gsize length, GepardTtsRequest *request, GError **error)
{
  g_autoptr (JsonParser) parser = json_parser_new_immutable ();
  g_autoptr (GError) local = NULL;

  memset (request, 0, sizeof *request);
  if (!json_depth_ok (data, length))
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                   "Invalid JSON: nested deeper than %d levels", MAX_JSON_DEPTH);
      return FALSE;
    }
  if (length > G_MAXSSIZE || !json_parser_load_from_data (parser, data, (gssize)length, &local))
    {
      /* json-glib quotes the offending input, which need not be UTF-8 (a lone surrogate escape
       * comes out as one): the message goes into JSON answers and WebSocket text frames */
      g_autofree char *reason = g_utf8_make_valid (local != NULL ? local->message : "too long", -1);
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST, "Invalid JSON: %s",
                   reason);
      return FALSE;
    }
  JsonNode *root = json_parser_get_root (parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "The request must be a JSON object");
      return FALSE;
    }
  JsonObject *object = json_node_get_object (root);

  if (!read_string (object, "context_id", &request->context_id, error)
      || !read_string (object, "transcript", &request->transcript, error)
      || !read_voice (object, &request->voice_id, error)
      || !read_bool (object, "continue", &request->continue_, error)
      || !read_bool (object, "flush", &request->flush, error)
      || !read_bool (object, "cancel", &request->cancel, error)
      || !read_bool (object, "add_timestamps", &request->add_timestamps, error)
      || !read_bool (object, "add_phoneme_timestamps", &request->add_phoneme_timestamps, error)
      || !read_extension (object, request, error))
    return FALSE;

  JsonNode *format = json_object_get_member (object, "output_format");
  if (format != NULL && !JSON_NODE_HOLDS_NULL (format))
    {
      if (!gepard_output_format_parse (format, &request->output_format, error))
        return FALSE;
      request->has_output_format = TRUE;
    }
  return TRUE;
}

gboolean
gepard_text_is_blank (const char *text)
{
  if (text == NULL)
    return TRUE;
  for (const char *p = text; *p != '\0'; p = g_utf8_next_char (p))
    if (!g_unichar_isspace (g_utf8_get_char (p)))
      return FALSE;
  return TRUE;
}

gboolean
gepard_tts_request_check_http (const GepardTtsRequest *request, gboolean sse,
                               int max_transcript_chars, GError **error)
{
  if (request->transcript == NULL || !g_utf8_validate (request->transcript, -1, NULL)
      || gepard_text_is_blank (request->transcript))
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "transcript is required and must not be empty");
      return FALSE;
    }
  if (g_utf8_strlen (request->transcript, -1) > max_transcript_chars)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_TRANSCRIPT_TOO_LONG,
                   "transcript is longer than %d characters", max_transcript_chars);
      return FALSE;
    }
  if (!request->has_output_format)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "output_format is required");
      return FALSE;
    }
  if (sse && request->output_format.container != GEPARD_CONTAINER_RAW)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNSUPPORTED_FORMAT,
                           "/tts/sse streams raw audio only: use container raw");
      return FALSE;
    }
  return TRUE;
}

gboolean
gepard_tts_request_check_new_context (const GepardTtsRequest *request, GError **error)
{
  if (!request->continue_ && gepard_text_is_blank (request->transcript) && !request->flush)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "transcript must not be empty");
      return FALSE;
    }
  if (!request->has_output_format)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "output_format is required");
      return FALSE;
    }
  if (request->output_format.container != GEPARD_CONTAINER_RAW)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNSUPPORTED_FORMAT,
                           "WebSocket contexts stream raw audio only: use container raw");
      return FALSE;
    }
  return TRUE;
}

void
gepard_tts_request_clear (GepardTtsRequest *request)
{
  g_free (request->context_id);
  g_free (request->transcript);
  g_free (request->voice_id);
  memset (request, 0, sizeof *request);
}

gboolean
gepard_voice_id_is_valid (const char *id)
{
  gsize n = id != NULL ? strlen (id) : 0;
  if (n == 0 || n > 128 || id[0] == '.')
    return FALSE;
  for (gsize i = 0; i < n; i++)
    if (!g_ascii_isalnum (id[i]) && id[i] != '.' && id[i] != '_' && id[i] != ':' && id[i] != '-')
      return FALSE;
  return TRUE;
}

/* ---- word timestamps ---- */

GepardWordTimes *
gepard_word_times_new (const char *sentence, double start, double end)
{
  GepardWordTimes *times = g_new0 (GepardWordTimes, 1);
  times->words = g_ptr_array_new_with_free_func (g_free);
  times->start = g_array_new (FALSE, FALSE, sizeof (double));
  times->end = g_array_new (FALSE, FALSE, sizeof (double));

  g_auto (GStrv) pieces = g_strsplit_set (sentence, " \t\n\r\f\v", -1);
  g_autoptr (GArray) weights = g_array_new (FALSE, FALSE, sizeof (double));
  double total = 0;
  for (char **p = pieces; *p != NULL; p++)
    {
      if ((*p)[0] == '\0')
        continue;
      double w = (double)g_utf8_strlen (*p, -1) + 1.0;
      g_ptr_array_add (times->words, g_strdup (*p));
      g_array_append_val (weights, w);
      total += w;
    }

  double span = end > start ? end - start : 0.0;
  double t = start;
  for (guint i = 0; i < times->words->len; i++)
    {
      double d = span * g_array_index (weights, double, i) / total;
      double e = i + 1 == times->words->len ? end : t + d;
      g_array_append_val (times->start, t);
      g_array_append_val (times->end, e);
      t = e;
    }
  return times;
}

void
gepard_word_times_free (GepardWordTimes *times)
{
  if (times == NULL)
    return;
  g_ptr_array_unref (times->words);
  g_array_unref (times->start);
  g_array_unref (times->end);
  g_free (times);
}

/* ---- events ---- */

static JsonBuilder *
begin_event (const char *type, const char *context_id, gboolean done, int status_code)
{
  JsonBuilder *b = json_builder_new ();
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "type");
  json_builder_add_string_value (b, type);
  json_builder_set_member_name (b, "context_id");
  if (context_id != NULL)
    json_builder_add_string_value (b, context_id);
  else
    json_builder_add_null_value (b);
  json_builder_set_member_name (b, "done");
  json_builder_add_boolean_value (b, done);
  json_builder_set_member_name (b, "status_code");
  json_builder_add_int_value (b, status_code);
  return b;
}

static char *
end_event (JsonBuilder *b)
{
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  g_object_unref (b);
  return json_to_string (root, FALSE);
}

/* `text` as a JSON string literal */
static void
append_json_string (GString *out, const char *text)
{
  g_string_append_c (out, '"');
  for (const char *c = text; *c != '\0'; c++)
    {
      if (*c == '"' || *c == '\\')
        {
          g_string_append_c (out, '\\');
          g_string_append_c (out, *c);
        }
      else if ((guchar)*c < 0x20)
        g_string_append_printf (out, "\\u%04x", (guchar)*c);
      else
        g_string_append_c (out, *c);
    }
  g_string_append_c (out, '"');
}

/* Built directly rather than through a JsonBuilder: on a loaded server, chunks are most of what
 * the main thread does. */
char *
gepard_event_chunk (const char *context_id, const guint8 *audio, gsize size, double step_time_ms,
                    guint flush_id)
{
  GString *out = g_string_sized_new (size / 3 * 4 + 192);
  g_string_append (out, "{\"type\":\"chunk\",\"context_id\":");
  if (context_id != NULL)
    append_json_string (out, context_id);
  else
    g_string_append (out, "null");
  g_string_append (out, ",\"done\":false,\"status_code\":206,\"data\":\"");
  /* g_base64_encode_step's bound: (size / 3 + 1) · 4 + 4 */
  gsize start = out->len;
  int state = 0, save = 0;
  g_string_set_size (out, start + (size / 3 + 1) * 4 + 4);
  gsize n = g_base64_encode_step (audio, size, FALSE, out->str + start, &state, &save);
  n += g_base64_encode_close (FALSE, out->str + start + n, &state, &save);
  g_string_truncate (out, start + n);
  char number[G_ASCII_DTOSTR_BUF_SIZE];
  g_string_append_printf (out, "\",\"step_time\":%s",
                          g_ascii_dtostr (number, sizeof number, step_time_ms));
  if (flush_id > 0)
    g_string_append_printf (out, ",\"flush_id\":%u", flush_id);
  g_string_append_c (out, '}');
  return g_string_free (out, FALSE);
}

static void
add_doubles (JsonBuilder *b, const char *name, GArray *values)
{
  json_builder_set_member_name (b, name);
  json_builder_begin_array (b);
  for (guint i = 0; i < values->len; i++)
    json_builder_add_double_value (b, g_array_index (values, double, i));
  json_builder_end_array (b);
}

char *
gepard_event_timestamps (const char *context_id, const GepardWordTimes *times)
{
  JsonBuilder *b = begin_event ("timestamps", context_id, FALSE, 206);
  json_builder_set_member_name (b, "word_timestamps");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "words");
  json_builder_begin_array (b);
  for (guint i = 0; i < times->words->len; i++)
    json_builder_add_string_value (b, g_ptr_array_index (times->words, i));
  json_builder_end_array (b);
  add_doubles (b, "start", times->start);
  add_doubles (b, "end", times->end);
  json_builder_end_object (b);
  return end_event (b);
}

char *
gepard_event_flush_done (const char *context_id, guint flush_id)
{
  JsonBuilder *b = begin_event ("flush_done", context_id, FALSE, 206);
  json_builder_set_member_name (b, "flush_done");
  json_builder_add_boolean_value (b, TRUE);
  json_builder_set_member_name (b, "flush_id");
  json_builder_add_int_value (b, flush_id);
  return end_event (b);
}

char *
gepard_event_done (const char *context_id)
{
  return end_event (begin_event ("done", context_id, TRUE, 200));
}

char *
gepard_event_error (const char *context_id, const GError *error, const char *request_id)
{
  guint status = gepard_api_error_get_status (error);
  const char *title = gepard_api_error_get_title (status);
  /* a text frame must be UTF-8, whatever the message quotes */
  g_autofree char *message = g_utf8_make_valid (error != NULL && error->domain == GEPARD_API_ERROR
                                                    ? error->message
                                                    : "The server could not complete the "
                                                      "request.",
                                                -1);
  g_autofree char *legacy = g_strdup_printf ("%s: %s", title, message);

  JsonBuilder *b = begin_event ("error", context_id, TRUE, (int)status);
  json_builder_set_member_name (b, "error");
  json_builder_add_string_value (b, legacy);
  json_builder_set_member_name (b, "title");
  json_builder_add_string_value (b, title);
  json_builder_set_member_name (b, "message");
  json_builder_add_string_value (b, message);
  json_builder_set_member_name (b, "error_code");
  json_builder_add_string_value (b, gepard_api_error_get_code (error));
  json_builder_set_member_name (b, "request_id");
  json_builder_add_string_value (b, request_id);
  return end_event (b);
}
