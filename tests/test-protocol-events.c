/* The events gepard-server sends, read back with json-glib as a client would: the chunk event
 * (built by hand for speed) must be valid JSON with the audio intact, whatever the context id
 * holds and whatever the audio's length modulo 3. */
#include "gepard-api-error.h"
#include "gepard-protocol.h"

#include <json-glib/json-glib.h>
#include <string.h>

static JsonObject *
parse_event (const char *text, JsonParser *parser)
{
  g_autoptr (GError) error = NULL;
  if (!json_parser_load_from_data (parser, text, -1, &error))
    g_error ("not JSON (%s): %s", error->message, text);
  JsonNode *root = json_parser_get_root (parser);
  g_assert_true (JSON_NODE_HOLDS_OBJECT (root));
  return json_node_get_object (root);
}

static void
check_chunk (const char *context_id, gsize size, double step_time, guint flush_id)
{
  g_autofree guint8 *audio = g_malloc (MAX (size, 1));
  for (gsize i = 0; i < size; i++)
    audio[i] = (guint8)(i * 131 + 7);
  g_autofree char *text = gepard_event_chunk (context_id, audio, size, step_time, flush_id);
  g_autoptr (JsonParser) parser = json_parser_new ();
  JsonObject *event = parse_event (text, parser);

  g_assert_cmpstr (json_object_get_string_member (event, "type"), ==, "chunk");
  if (context_id != NULL)
    g_assert_cmpstr (json_object_get_string_member (event, "context_id"), ==, context_id);
  else
    g_assert_true (json_object_get_null_member (event, "context_id"));
  g_assert_false (json_object_get_boolean_member (event, "done"));
  g_assert_cmpint (json_object_get_int_member (event, "status_code"), ==, 206);
  g_assert_cmpfloat_with_epsilon (json_object_get_double_member (event, "step_time"), step_time,
                                  1e-12);
  if (flush_id > 0)
    g_assert_cmpint (json_object_get_int_member (event, "flush_id"), ==, flush_id);
  else
    g_assert_false (json_object_has_member (event, "flush_id"));
  gsize decoded_size;
  g_autofree guint8 *decoded
      = g_base64_decode (json_object_get_string_member (event, "data"), &decoded_size);
  g_assert_cmpmem (decoded, decoded_size, audio, size);
}

static void
test_chunk_audio_lengths (void)
{
  for (gsize size = 0; size <= 9; size++)
    check_chunk ("ctx-1", size, 1.25, 0);
  check_chunk ("ctx-1", 4096, 0.0, 0);
  check_chunk ("ctx-1", 64 * 1024, 12345.678, 3);
}

static void
test_chunk_context_ids (void)
{
  const char *ids[] = {
      "",         "plain", "with \"quotes\" and \\ backslash", "tab\tnew\nline\x01", "ünïcødé ☃ 𝄞",
      "</script>"};
  for (guint i = 0; i < G_N_ELEMENTS (ids); i++)
    check_chunk (ids[i], 5, 3.5e-5, 0);
  check_chunk (NULL, 5, 1e300, 0);
}

/* json-glib decodes "\\" + octal digits into a byte that need not be UTF-8: such a string is
 * refused, and the error event that answers it is JSON (found by fuzz-ws-message). */
static void
test_request_strings_are_utf8 (void)
{
  const char *requests[] = {
      "{\"context_id\": \"a\\333b\", \"transcript\": \"Hi.\"}",
      "{\"context_id\": \"c\", \"transcript\": \"Hi \\377.\"}",
      "{\"context_id\": \"c\", \"voice\": \"v\\333\"}",
      "{\"context_id\": \"c\", \"voice\": {\"id\": \"v\\333\"}}",
      "{\"context_id\": \"c\", \"voice\": {\"mode\": \"\\333\", \"id\": \"v\"}}",
      "{\"context_id\": \"c\", \"output_format\": {\"container\": \"r\\333\", \"encoding\": "
      "\"pcm_s16le\", \"sample_rate\": 24000}}",
  };
  for (guint i = 0; i < G_N_ELEMENTS (requests); i++)
    {
      g_auto (GepardTtsRequest) request = {0};
      g_autoptr (GError) error = NULL;
      g_assert_false (
          gepard_tts_request_parse (requests[i], strlen (requests[i]), &request, &error));
      g_assert_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST);
      g_assert_nonnull (strstr (error->message, "is not UTF-8 text"));
      g_autofree char *text = gepard_event_error (request.context_id, error, "test");
      g_autoptr (JsonParser) parser = json_parser_new ();
      JsonObject *event = parse_event (text, parser);
      g_assert_cmpstr (json_object_get_string_member (event, "type"), ==, "error");
    }
  /* an HTTP error body is UTF-8 JSON whatever its message quotes */
  g_autoptr (GError) quoting
      = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST, "Unsupported \"r\xdb\"");
  const char *content_type = NULL;
  g_autofree char *body
      = gepard_api_error_http_body (quoting, GEPARD_API_VERSION_LATEST, "test", &content_type);
  g_assert_cmpstr (content_type, ==, "application/json");
  g_autoptr (JsonParser) body_parser = json_parser_new ();
  parse_event (body, body_parser);
  /* escapes JSON defines still work */
  const char *valid = "{\"context_id\": \"\\u00e9\\n\"}";
  g_auto (GepardTtsRequest) request = {0};
  g_autoptr (GError) error = NULL;
  g_assert_true (gepard_tts_request_parse (valid, strlen (valid), &request, &error));
  g_assert_cmpstr (request.context_id, ==, "\xc3\xa9\n");
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/protocol/chunk/audio-lengths", test_chunk_audio_lengths);
  g_test_add_func ("/protocol/chunk/context-ids", test_chunk_context_ids);
  g_test_add_func ("/protocol/request/strings-are-utf8", test_request_strings_are_utf8);
  return g_test_run ();
}
