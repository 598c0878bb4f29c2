/* fuzz-server-common.h: what the fuzz targets of gepard-server's parsers share. */
#pragma once

#include "fuzz-common.h"
#include "gepard-api-error.h"
#include "gepard-protocol.h"

#include <json-glib/json-glib.h>

/* Every event the server writes is one JSON object whose envelope the strictest client validates
 * (cartesia-protocol.md §3.3), for whatever context id a request carried. */
static inline void
fuzz_check_event (char *event, const char *type, const char *context_id)
{
  g_autoptr (JsonParser) parser = json_parser_new_immutable ();
  g_autoptr (GError) error = NULL;
  if (!json_parser_load_from_data (parser, event, -1, &error))
    {
      fprintf (stderr, "an event is not JSON (%s): %s\n", error->message, event);
      abort ();
    }
  JsonNode *root = json_parser_get_root (parser);
  g_assert_true (JSON_NODE_HOLDS_OBJECT (root));
  JsonObject *object = json_node_get_object (root);
  g_assert_cmpstr (json_object_get_string_member (object, "type"), ==, type);
  g_assert_true (json_object_has_member (object, "done"));
  g_assert_true (json_object_has_member (object, "status_code"));
  JsonNode *id = json_object_get_member (object, "context_id");
  g_assert_nonnull (id);
  if (context_id == NULL)
    g_assert_true (JSON_NODE_HOLDS_NULL (id));
  else
    g_assert_cmpstr (json_node_get_string (id), ==, context_id);
  g_free (event);
}

/* The parse of `data`: refused with a GEPARD_API_ERROR that names its status, or accepted with
 * the strings a request may hold; an error event for either outcome is well formed. */
static inline gboolean
fuzz_parse_request (const uint8_t *data, size_t size, GepardTtsRequest *request)
{
  g_autoptr (GError) error = NULL;
  gboolean ok = gepard_tts_request_parse ((const char *)data, size, request, &error);
  fuzz_check_outcome (ok, error, GEPARD_API_ERROR);
  if (!ok)
    {
      guint status = gepard_api_error_get_status (error);
      g_assert_true (status >= 400 && status < 500);
      fuzz_check_event (gepard_event_error (request->context_id, error, "fuzz"), "error",
                        request->context_id);
      return FALSE;
    }
  if (request->has_output_format)
    {
      g_assert_cmpint (request->output_format.sample_rate, >=, GEPARD_MIN_SAMPLE_RATE);
      g_assert_cmpint (request->output_format.sample_rate, <=, GEPARD_MAX_SAMPLE_RATE);
    }
  return TRUE;
}
