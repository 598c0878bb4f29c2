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

/* "gpu": the GPU ids, the memory fraction and whether an MPS daemon shares the GPU */
static void
add_placement (JsonBuilder *b, const GepardServerConfig *config)
{
  json_builder_set_member_name (b, "gpu");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "device_ids");
  json_builder_begin_array (b);
  for (guint i = 0; i < config->n_gpu_device_ids; i++)
    json_builder_add_int_value (b, config->gpu_device_ids[i]);
  json_builder_end_array (b);
  json_builder_set_member_name (b, "memory_utilization");
  json_builder_add_double_value (b, config->gpu_memory_utilization);
  json_builder_set_member_name (b, "mps");
  json_builder_add_boolean_value (b, config->mps);
  json_builder_end_object (b);
}

/* "running" and "waiting": an engine's utterances, or all engines' */
static void
add_streams (JsonBuilder *b, const GepardEngineStats *stats)
{
  json_builder_set_member_name (b, "running");
  json_builder_add_int_value (b, stats->running);
  json_builder_set_member_name (b, "waiting");
  json_builder_add_int_value (b, stats->waiting);
}

/* "engines": one entry per engine (one per GPU in use, or the CPU's). */
static void
add_engines (JsonBuilder *b, GepardEnginePool *engines)
{
  json_builder_set_member_name (b, "engines");
  json_builder_begin_array (b);
  for (guint i = 0; i < gepard_engine_pool_get_size (engines); i++)
    {
      GepardEngine *engine = gepard_engine_pool_get (engines, i);
      GepardEngineStats stats;
      gepard_engine_get_stats (engine, &stats);
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "gpu");
      const GepardDeviceInfo *device = gepard_engine_get_device (engine);
      if (device->kind == GEPARD_BACKEND_CUDA)
        json_builder_add_int_value (b, device->device_index);
      else
        json_builder_add_null_value (b);
      json_builder_set_member_name (b, "device");
      json_builder_add_string_value (b, gepard_engine_get_device_description (engine));
      add_streams (b, &stats);
      json_builder_end_object (b);
    }
  json_builder_end_array (b);
}

void
gepard_routes_health (GepardServer *server, SoupServerMessage *msg)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  gboolean ready = server->engines != NULL;

  json_builder_begin_object (b);
  json_builder_set_member_name (b, "status");
  /* a draining server is out of rotation: load balancers stop sending it work */
  json_builder_add_string_value (b, server->draining      ? "draining"
                                    : ready               ? "ok"
                                    : server->downloading ? "downloading"
                                                          : "loading");
  if (!ready)
    {
      json_builder_set_member_name (b, "reason");
      json_builder_add_string_value (b, server->loading_reason);
    }
  else
    {
      GepardEngine *first = gepard_engine_pool_get (server->engines, 0);
      GepardEngineStats stats;
      gepard_engine_pool_get_stats (server->engines, &stats);
      json_builder_set_member_name (b, "model");
      json_builder_add_string_value (b, server->config.model);
      /* all engines: the first's device, the streams of all */
      json_builder_set_member_name (b, "engine");
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "device");
      json_builder_add_string_value (b, gepard_engine_get_device_description (first));
      json_builder_set_member_name (b, "test_model");
      json_builder_add_boolean_value (b, gepard_engine_is_test_model (first));
      add_streams (b, &stats);
      json_builder_end_object (b);
      add_engines (b, server->engines);
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
  add_placement (b, &server->config);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (
      msg, ready && !server->draining ? SOUP_STATUS_OK : SOUP_STATUS_SERVICE_UNAVAILABLE, root);
}

void
gepard_routes_metrics (GepardServer *server, SoupServerMessage *msg)
{
  char *text = gepard_metrics_render (server->metrics, server->engines, server->engines != NULL);
  soup_server_message_set_status (msg, SOUP_STATUS_OK, NULL);
  soup_server_message_set_response (msg, "text/plain; version=0.0.4; charset=utf-8",
                                    SOUP_MEMORY_TAKE, text, strlen (text));
}
