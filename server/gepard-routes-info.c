/* gepard-routes-info.c: GET /, /health and /metrics. */
#include "gepard-server.h"

#include <string.h>

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
      gboolean store_ok = TRUE;
      g_autofree char *store = gepard_voice_store_describe (server->voices, &store_ok);
      json_builder_set_member_name (b, "voice_store");
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "status");
      json_builder_add_string_value (b, store_ok ? "ok" : "degraded");
      json_builder_set_member_name (b, "description");
      json_builder_add_string_value (b, store);
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
