/* gepard-routes-info.c: GET /, /health, /metrics, /voices and /voices/{id}. */
#include "gepard-server.h"

#include <string.h>

#define DEFAULT_VOICE_PAGE 10
#define MAX_VOICE_PAGE 100
#define FIRST_PAGINATED_VERSION 20241113u

void
gepard_routes_root (GepardServer *server, SoupServerMessage *msg, guint version)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "ok");
  json_builder_add_boolean_value (b, TRUE);
  json_builder_set_member_name (b, "version");
  json_builder_add_string_value (b, "2026-08-14");
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (msg, SOUP_STATUS_OK, root);
}

void
gepard_routes_health (GepardServer *server, SoupServerMessage *msg)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  gboolean ready = server->engine != NULL;

  json_builder_begin_object (b);
  json_builder_set_member_name (b, "status");
  json_builder_add_string_value (b, ready ? "ok" : "loading");
  if (!ready)
    {
      json_builder_set_member_name (b, "reason");
      json_builder_add_string_value (b, server->loading_reason);
    }
  else
    {
      GepardEngineStats stats;
      gepard_engine_get_stats (server->engine, &stats);
      json_builder_set_member_name (b, "model");
      json_builder_add_string_value (b, server->config.model);
      json_builder_set_member_name (b, "engine");
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "device");
      json_builder_add_string_value (b, gepard_engine_get_device_description (server->engine));
      json_builder_set_member_name (b, "test_model");
      json_builder_add_boolean_value (b, gepard_engine_is_test_model (server->engine));
      json_builder_set_member_name (b, "running");
      json_builder_add_int_value (b, stats.running);
      json_builder_set_member_name (b, "waiting");
      json_builder_add_int_value (b, stats.waiting);
      json_builder_end_object (b);
      json_builder_set_member_name (b, "voice_store");
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "status");
      json_builder_add_string_value (b, "ok");
      json_builder_set_member_name (b, "description");
      json_builder_add_string_value (b, gepard_voice_store_describe (server->voices));
      json_builder_end_object (b);
      json_builder_set_member_name (b, "active_contexts");
      json_builder_add_int_value (b, gepard_metrics_get_active_contexts (server->metrics));
    }
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (msg, ready ? SOUP_STATUS_OK : SOUP_STATUS_SERVICE_UNAVAILABLE, root);
}

void
gepard_routes_metrics (GepardServer *server, SoupServerMessage *msg)
{
  char *text = gepard_metrics_render (server->metrics, server->engine, server->engine != NULL);
  soup_server_message_set_status (msg, SOUP_STATUS_OK, NULL);
  soup_server_message_set_response (msg, "text/plain; version=0.0.4; charset=utf-8",
                                    SOUP_MEMORY_TAKE, text, strlen (text));
}

static void
add_voice (JsonBuilder *b, const GepardVoiceInfo *v)
{
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "id");
  json_builder_add_string_value (b, v->id);
  json_builder_set_member_name (b, "name");
  json_builder_add_string_value (b, v->name);
  json_builder_set_member_name (b, "description");
  json_builder_add_string_value (b, v->description);
  json_builder_set_member_name (b, "language");
  json_builder_add_string_value (b, v->language);
  json_builder_set_member_name (b, "created_at");
  json_builder_add_string_value (b, v->created_at);
  json_builder_set_member_name (b, "is_owner");
  json_builder_add_boolean_value (b, FALSE);
  json_builder_set_member_name (b, "is_public");
  json_builder_add_boolean_value (b, TRUE);
  json_builder_set_member_name (b, "access");
  json_builder_add_string_value (b, "public");
  json_builder_set_member_name (b, "visibility");
  json_builder_add_string_value (b, "all");
  json_builder_set_member_name (b, "tagline");
  json_builder_add_string_value (b, "");
  json_builder_set_member_name (b, "locales");
  json_builder_begin_array (b);
  json_builder_end_array (b);
  json_builder_end_object (b);
}

static gboolean
not_found (SoupServerMessage *msg, guint version, const char *what)
{
  g_autoptr (GError) error = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_VOICE_NOT_FOUND,
                                          "Voice \"%s\" not found", what);
  g_autofree char *request_id = gepard_http_new_request_id ();
  gepard_http_send_error (msg, version, error, request_id);
  return FALSE;
}

/* The index of the voice `id` in `voices`, or -1. */
static int
find_voice (const GPtrArray *voices, const char *id)
{
  for (guint i = 0; i < voices->len; i++)
    if (g_strcmp0 (((const GepardVoiceInfo *)voices->pdata[i])->id, id) == 0)
      return (int)i;
  return -1;
}

/* Cursor pagination: clients page with starting_after=<last id> until a page comes back empty
 * (cartesia-protocol.md §4), so a cursor past the end must give an empty page, not an error. */
static void
list_voices (GepardServer *server, SoupServerMessage *msg, GHashTable *query, guint version)
{
  const GPtrArray *voices = gepard_voice_store_list (server->voices);
  const char *limit_text = query != NULL ? g_hash_table_lookup (query, "limit") : NULL;
  const char *after = query != NULL ? g_hash_table_lookup (query, "starting_after") : NULL;
  const char *before = query != NULL ? g_hash_table_lookup (query, "ending_before") : NULL;
  guint64 limit = DEFAULT_VOICE_PAGE;
  int first = 0, last = (int)voices->len; /* [first, last) */

  if (limit_text != NULL
      && !g_ascii_string_to_unsigned (limit_text, 10, 1, MAX_VOICE_PAGE, &limit, NULL))
    {
      g_autoptr (GError) error
          = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                         "limit must be a number from 1 to %d", MAX_VOICE_PAGE);
      g_autofree char *request_id = gepard_http_new_request_id ();
      gepard_http_send_error (msg, version, error, request_id);
      return;
    }
  if (after != NULL)
    {
      int i = find_voice (voices, after);
      first = i >= 0 ? i + 1 : (int)voices->len;
    }
  if (before != NULL)
    {
      int i = find_voice (voices, before);
      last = i >= 0 ? i : 0;
      if (after == NULL)
        first = MAX (0, last - (int)limit);
    }

  g_autoptr (JsonBuilder) b = json_builder_new ();
  if (version < FIRST_PAGINATED_VERSION)
    {
      /* the oldest API version answered with every voice in a bare array */
      json_builder_begin_array (b);
      for (guint i = 0; i < voices->len; i++)
        add_voice (b, voices->pdata[i]);
      json_builder_end_array (b);
    }
  else
    {
      int end = MIN (last, first + (int)limit);
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "data");
      json_builder_begin_array (b);
      for (int i = first; i < end; i++)
        add_voice (b, voices->pdata[i]);
      json_builder_end_array (b);
      json_builder_set_member_name (b, "has_more");
      json_builder_add_boolean_value (b, end < last);
      json_builder_set_member_name (b, "next_page");
      if (end < last && end > first)
        json_builder_add_string_value (b, ((const GepardVoiceInfo *)voices->pdata[end - 1])->id);
      else
        json_builder_add_null_value (b);
      json_builder_end_object (b);
    }
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (msg, SOUP_STATUS_OK, root);
}

void
gepard_routes_voices (GepardServer *server, SoupServerMessage *msg, const char *path,
                      GHashTable *query, guint version)
{
  if (server->voices == NULL)
    {
      g_autoptr (GError) error
          = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                         "The server is not ready: %s", server->loading_reason);
      g_autofree char *request_id = gepard_http_new_request_id ();
      gepard_http_send_error (msg, version, error, request_id);
      return;
    }
  if (g_str_equal (path, "/voices") || g_str_equal (path, "/voices/"))
    {
      list_voices (server, msg, query, version);
      return;
    }

  const char *id = path + strlen ("/voices/");
  const GPtrArray *voices = gepard_voice_store_list (server->voices);
  int i = find_voice (voices, id);
  if (i < 0)
    {
      g_autofree char *shown = g_utf8_make_valid (id, MIN (strlen (id), 128));
      not_found (msg, version, shown);
      return;
    }
  g_autoptr (JsonBuilder) b = json_builder_new ();
  add_voice (b, voices->pdata[i]);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (msg, SOUP_STATUS_OK, root);
}
