/* gepard-metrics.c: Prometheus text for GET /metrics. */
#include "gepard-metrics.h"

#include "gepard-tts-session.h"

#include <string.h>

static const double first_audio_buckets[]
    = {0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0};

struct _GepardMetrics
{
  GHashTable *requests; /* "route\tstatus" → count (guint64 in a pointer-sized box) */
  GHashTable *ended;    /* outcome → count */
  guint active_contexts;
  guint64 contexts_started;
  guint websockets;
  guint64 first_audio_counts[G_N_ELEMENTS (first_audio_buckets)];
  guint64 first_audio_count;
  double first_audio_sum;
};

GepardMetrics *
gepard_metrics_new (void)
{
  GepardMetrics *m = g_new0 (GepardMetrics, 1);
  m->requests = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  m->ended = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  return m;
}

void
gepard_metrics_free (GepardMetrics *m)
{
  if (m == NULL)
    return;
  g_hash_table_unref (m->requests);
  g_hash_table_unref (m->ended);
  g_free (m);
}

static void
increment (GHashTable *table, const char *key)
{
  guint64 *count = g_hash_table_lookup (table, key);
  if (count == NULL)
    {
      count = g_new0 (guint64, 1);
      g_hash_table_insert (table, g_strdup (key), count);
    }
  (*count)++;
}

void
gepard_metrics_count_request (GepardMetrics *m, const char *route, guint status)
{
  g_autofree char *key = g_strdup_printf ("%s\t%u", route, status);
  increment (m->requests, key);
}

void
gepard_metrics_context_started (GepardMetrics *m)
{
  m->active_contexts++;
  m->contexts_started++;
}

void
gepard_metrics_context_ended (GepardMetrics *m, const char *outcome)
{
  g_return_if_fail (m->active_contexts > 0);
  m->active_contexts--;
  increment (m->ended, outcome);
}

guint
gepard_metrics_get_active_contexts (GepardMetrics *m)
{
  return m->active_contexts;
}

void
gepard_metrics_websocket_opened (GepardMetrics *m)
{
  m->websockets++;
}

void
gepard_metrics_websocket_closed (GepardMetrics *m)
{
  if (m->websockets > 0)
    m->websockets--;
}

void
gepard_metrics_observe_first_audio (GepardMetrics *m, double seconds)
{
  for (gsize i = 0; i < G_N_ELEMENTS (first_audio_buckets); i++)
    if (seconds <= first_audio_buckets[i])
      m->first_audio_counts[i]++;
  m->first_audio_count++;
  m->first_audio_sum += seconds;
}

static int
compare_strings (gconstpointer a, gconstpointer b)
{
  return g_strcmp0 (*(const char *const *)a, *(const char *const *)b);
}

/* the table's keys in a stable order, so that the page does not shuffle between scrapes */
static GPtrArray *
sorted_keys (GHashTable *table)
{
  GPtrArray *keys = g_ptr_array_new ();
  GHashTableIter iter;
  gpointer key;
  g_hash_table_iter_init (&iter, table);
  while (g_hash_table_iter_next (&iter, &key, NULL))
    g_ptr_array_add (keys, key);
  g_ptr_array_sort (keys, compare_strings);
  return keys;
}

static void
header (GString *out, const char *name, const char *type, const char *help)
{
  g_string_append_printf (out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

char *
gepard_metrics_render (GepardMetrics *m, GepardEngine *engine, gboolean ready)
{
  GString *out = g_string_new (NULL);

  header (out, "gepard_ready", "gauge", "1 once the model is loaded and requests are served.");
  g_string_append_printf (out, "gepard_ready %d\n", ready ? 1 : 0);

  header (out, "gepard_requests_total", "counter", "HTTP requests by route and status.");
  g_autoptr (GPtrArray) keys = sorted_keys (m->requests);
  for (guint i = 0; i < keys->len; i++)
    {
      const char *key = keys->pdata[i];
      const char *tab = strchr (key, '\t');
      g_string_append_printf (
          out, "gepard_requests_total{route=\"%.*s\",status=\"%s\"} %" G_GUINT64_FORMAT "\n",
          (int)(tab - key), key, tab + 1, *(guint64 *)g_hash_table_lookup (m->requests, key));
    }

  header (out, "gepard_active_contexts", "gauge",
          "Generations in progress: HTTP requests and WebSocket contexts.");
  g_string_append_printf (out, "gepard_active_contexts %u\n", m->active_contexts);
  header (out, "gepard_contexts_total", "counter", "Generations started.");
  g_string_append_printf (out, "gepard_contexts_total %" G_GUINT64_FORMAT "\n",
                          m->contexts_started);
  header (out, "gepard_contexts_ended_total", "counter",
          "Generations ended, by outcome (done, cancelled, error, disconnected, shutdown).");
  g_autoptr (GPtrArray) outcomes = sorted_keys (m->ended);
  for (guint i = 0; i < outcomes->len; i++)
    g_string_append_printf (out,
                            "gepard_contexts_ended_total{outcome=\"%s\"} %" G_GUINT64_FORMAT "\n",
                            (const char *)outcomes->pdata[i],
                            *(guint64 *)g_hash_table_lookup (m->ended, outcomes->pdata[i]));
  header (out, "gepard_websocket_connections", "gauge", "Open WebSocket connections.");
  g_string_append_printf (out, "gepard_websocket_connections %u\n", m->websockets);
  header (out, "gepard_pipelines", "gauge",
          "GStreamer pipelines alive, including those still being torn down.");
  g_string_append_printf (out, "gepard_pipelines %u\n", gepard_tts_session_count_pipelines ());

  header (out, "gepard_first_audio_seconds", "histogram",
          "Time from a generation's first text to its first audio.");
  for (gsize i = 0; i < G_N_ELEMENTS (first_audio_buckets); i++)
    g_string_append_printf (out,
                            "gepard_first_audio_seconds_bucket{le=\"%g\"} %" G_GUINT64_FORMAT "\n",
                            first_audio_buckets[i], m->first_audio_counts[i]);
  g_string_append_printf (out,
                          "gepard_first_audio_seconds_bucket{le=\"+Inf\"} %" G_GUINT64_FORMAT "\n",
                          m->first_audio_count);
  g_string_append_printf (out, "gepard_first_audio_seconds_sum %.6f\n", m->first_audio_sum);
  g_string_append_printf (out, "gepard_first_audio_seconds_count %" G_GUINT64_FORMAT "\n",
                          m->first_audio_count);

  if (engine != NULL)
    {
      GepardEngineStats stats;
      gepard_engine_get_stats (engine, &stats);
      header (out, "gepard_engine_batch_size", "gauge",
              "Sequences in the engine's last batched step.");
      g_string_append_printf (out, "gepard_engine_batch_size %u\n", stats.running);
      header (out, "gepard_engine_waiting", "gauge", "Utterances waiting for a batch slot.");
      g_string_append_printf (out, "gepard_engine_waiting %u\n", stats.waiting);
      header (out, "gepard_engine_steps_total", "counter", "Batched forwards run.");
      g_string_append_printf (out, "gepard_engine_steps_total %" G_GUINT64_FORMAT "\n",
                              stats.steps);
      header (out, "gepard_engine_frames_total", "counter", "Frames generated.");
      g_string_append_printf (out, "gepard_engine_frames_total %" G_GUINT64_FORMAT "\n",
                              stats.frames);
      header (out, "gepard_engine_utterances_total", "counter", "Utterances (sentences) ended.");
      g_string_append_printf (out, "gepard_engine_utterances_total %" G_GUINT64_FORMAT "\n",
                              stats.utterances);
    }
  return g_string_free (out, FALSE);
}
