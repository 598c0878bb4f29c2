/* gepard-server: the Cartesia-compatible TTS server.
 *
 *   gepard-server --model DIR|REPO_ID [--codec PATH] --port N [--host H]
 *
 * Settings come from flags and TTS_* variables (server/README.md). The port opens at once and
 * GET /health answers 503 with the reason while the model loads on a worker thread; generation
 * routes answer 503 until then too. Everything else runs on the main loop. */
#include "gepard-server.h"

#include "gepard-build-config.h"
#include "gepard-hub-download.h"
#include "gepard-hub.h"

#include <glib-unix.h>
#include <gst/gst.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *const pipeline_names[]
    = {"tts-stream.txt", "tts-stream-mulaw.txt", "tts-stream-alaw.txt", "clone.txt"};

typedef struct
{
  GepardEnginePool *engines;
  GepardVoiceStore *voices;
  GepardVoiceDbCluster *cluster;
  GepardVoiceDb *db; /* also inside voices: migrated before the server says it is ready */
  GepardServer *server;
  char *codec_path; /* the codec file fetched for a --codec repo id, or NULL */
} Loaded;

static void
loaded_free (gpointer data)
{
  Loaded *loaded = data;
  gepard_voice_store_free (loaded->voices);
  gepard_voice_db_cluster_free (loaded->cluster);
  gepard_engine_pool_unref (loaded->engines);
  g_free (loaded->codec_path);
  g_free (loaded);
}

/* ---- requests ---- */

static const char *
route_of (const char *path)
{
  static const char *const routes[]
      = {"/tts/bytes", "/tts/sse", "/tts/websocket", "/health", "/metrics", "/"};
  for (gsize i = 0; i < G_N_ELEMENTS (routes); i++)
    if (g_str_equal (path, routes[i]))
      return routes[i];
  if (g_str_has_prefix (path, "/voices"))
    return "/voices";
  if (g_str_has_prefix (path, "/playground/"))
    return "/playground";
  return "other";
}

static void
send_api_error (SoupServerMessage *msg, guint version, GepardApiError code, const char *message)
{
  g_autoptr (GError) error = g_error_new_literal (GEPARD_API_ERROR, code, message);
  g_autofree char *request_id = gepard_http_new_request_id ();
  gepard_http_send_error (msg, version, error, request_id);
}

/* ---- the route table: every route, for dispatch and for --list-routes ---- */

typedef void (*RouteHandler) (GepardServer *server, SoupServerMessage *msg, const char *path,
                              GHashTable *query, guint version);

typedef struct
{
  const char *path;     /* exact, or ending in "{id}" or "{file}": any rest of the path */
  const char *methods;  /* what it answers (others get 405) */
  gboolean open;        /* answers without the API key */
  RouteHandler handler; /* NULL: the WebSocket upgrade (gepard-routes-websocket.c) */
} Route;

/* A browser gets the playground page; an API client Cartesia's status object. */
static void
route_root (GepardServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
            guint version)
{
  if (gepard_routes_playground_wants_page (msg, path))
    {
      if (server->config.playground)
        gepard_routes_playground (server, msg, path, query, version);
      else
        send_api_error (msg, version, GEPARD_API_ERROR_NOT_FOUND, "No such route");
      return;
    }
  gepard_routes_root (server, msg, version);
}

static void
route_health (GepardServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
              guint version)
{
  gepard_routes_health (server, msg);
}

static void
route_metrics (GepardServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
               guint version)
{
  gepard_routes_metrics (server, msg);
}

static void
route_tts_bytes (GepardServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
                 guint version)
{
  gepard_routes_tts_bytes (server, msg, query, version);
}

static void
route_tts_sse (GepardServer *server, SoupServerMessage *msg, const char *path, GHashTable *query,
               guint version)
{
  gepard_routes_tts_sse (server, msg, query, version);
}

static const Route routes[] = {
    {"/", "GET", FALSE, route_root},
    {"/health", "GET", TRUE, route_health},
    {"/metrics", "GET", FALSE, route_metrics},
    {"/tts/bytes", "POST", FALSE, route_tts_bytes},
    {"/tts/sse", "POST", FALSE, route_tts_sse},
    {"/tts/websocket", "GET", FALSE, NULL},
    {"/voices", "GET", FALSE, gepard_routes_voices},
    {"/voices/clone", "POST", FALSE, gepard_routes_voices},
    {"/voices/{id}", "GET,DELETE", FALSE, gepard_routes_voices},
    {"/playground/{file}", "GET", TRUE, gepard_routes_playground},
};

/* the routes of the playground are there only while it is on */
static gboolean
route_enabled (const GepardServerConfig *config, const Route *route)
{
  return config->playground || route->handler != gepard_routes_playground;
}

static const Route *
find_route (const GepardServerConfig *config, const char *path)
{
  for (gsize i = 0; i < G_N_ELEMENTS (routes); i++)
    {
      const char *wildcard = strchr (routes[i].path, '{');
      if (!route_enabled (config, &routes[i]))
        continue;
      if (wildcard == NULL ? g_str_equal (path, routes[i].path)
                           : strncmp (path, routes[i].path, wildcard - routes[i].path) == 0)
        return &routes[i];
    }
  return NULL;
}

static gboolean
method_allowed (const Route *route, const char *method)
{
  g_auto (GStrv) methods = g_strsplit (route->methods, ",", -1);
  if (g_str_equal (method, "HEAD"))
    method = "GET";
  return g_strv_contains ((const char *const *)methods, method)
         || route->handler == gepard_routes_voices; /* it answers 405 with the methods itself */
}

static void
print_routes (const GepardServerConfig *config)
{
  for (gsize i = 0; i < G_N_ELEMENTS (routes); i++)
    if (route_enabled (config, &routes[i]))
      g_print ("%s %s %s\n", routes[i].methods, routes[i].path, routes[i].open ? "open" : "key");
}

/* The page at / is open too: it holds no secret, and asks for the key itself. */
static gboolean
route_is_open (GepardServer *server, const Route *route, SoupServerMessage *msg, const char *path)
{
  if (route == NULL)
    return FALSE;
  return route->open
         || (route->handler == route_root && server->config.playground
             && gepard_routes_playground_wants_page (msg, path));
}

static void
on_message_finished (SoupServerMessage *msg, gpointer user_data)
{
  GepardServer *server = user_data;
  server->requests_in_flight--;
}

static void
handle_request (SoupServer *soup, SoupServerMessage *msg, const char *path, GHashTable *query,
                gpointer user_data)
{
  GepardServer *server = user_data;
  guint version = gepard_http_get_version (msg, query, FALSE);
  const char *method = soup_server_message_get_method (msg);
  const Route *route = find_route (&server->config, path);

  if (gepard_http_handle_cors (server, msg))
    return;
  /* health stays open so that orchestrators can probe without the key */
  if (!route_is_open (server, route, msg, path))
    {
      if (!gepard_http_check_api_key (server, msg, query))
        {
          send_api_error (msg, version, GEPARD_API_ERROR_UNAUTHORIZED,
                          "Invalid or missing API key");
          return;
        }
    }
  if (route == NULL || route->handler == NULL)
    {
      send_api_error (msg, version, GEPARD_API_ERROR_NOT_FOUND, "No such route");
      return;
    }
  if (server->draining && !route->open)
    {
      send_api_error (msg, version, GEPARD_API_ERROR_UNAVAILABLE, GEPARD_SERVER_DRAINING_MESSAGE);
      return;
    }
  if (!method_allowed (route, method))
    {
      g_autofree char *message = g_strdup_printf ("Use %s", route->methods);
      send_api_error (msg, version, GEPARD_API_ERROR_METHOD_NOT_ALLOWED, message);
      return;
    }
  /* counted until it is answered, for the shutdown to wait for */
  server->requests_in_flight++;
  g_signal_connect (msg, "finished", G_CALLBACK (on_message_finished), server);
  route->handler (server, msg, path, query, version);
}

static void
on_request_finished (SoupServer *soup, SoupServerMessage *msg, gpointer user_data)
{
  GepardServer *server = user_data;
  GUri *uri = soup_server_message_get_uri (msg);
  gepard_metrics_count_request (server->metrics, route_of (uri != NULL ? g_uri_get_path (uri) : ""),
                                soup_server_message_get_status (msg));
}

/* ---- startup ---- */

/* Identity of the model's voices: its configuration files' digest, so that a voice is refused by
 * a different model and kept across moves of the checkpoint directory. */
static char *
model_identity (GepardEngine *engine)
{
  static const char *const files[] = {"config.json", "gepard_config.json"};
  const char *dir = gepard_engine_get_model_dir (engine);
  g_autoptr (GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);
  for (gsize i = 0; dir != NULL && i < G_N_ELEMENTS (files); i++)
    {
      g_autofree char *path = g_build_filename (dir, files[i], NULL);
      g_autofree char *text = NULL;
      gsize length = 0;
      g_checksum_update (checksum, (const guchar *)files[i], -1);
      if (g_file_get_contents (path, &text, &length, NULL))
        g_checksum_update (checksum, (const guchar *)text, (gssize)length);
    }
  const GepardModelConfig *config = gepard_engine_get_config (engine);
  return g_strdup_printf ("gepard-%dx%d-%.16s", config->compressor_queries, config->hidden_size,
                          g_checksum_get_string (checksum));
}

/* On the loading thread: DATABASE_URL (or TTS_DATABASE_URL), else a private cluster, which may take
 * seconds to start. A model that cannot clone, or no PostgreSQL to run, keeps the local store. */
static gboolean
open_voice_db (GepardServer *server, Loaded *loaded, GError **error)
{
  const GepardModelConfig *config = gepard_engine_pool_get_config (loaded->engines);
  const char *url = g_getenv ("DATABASE_URL");
  if (url == NULL || url[0] == '\0')
    url = g_getenv ("TTS_DATABASE_URL");
  if (url != NULL && url[0] == '\0')
    url = NULL;

  if (gepard_voice_get_prefix_file_size (config) == 0)
    {
      g_print ("gepard-server: this model cannot clone voices; serving its built-in voices only\n");
      return TRUE;
    }
  if (url == NULL)
    {
      g_autofree char *bindir = gepard_voice_db_find_pg_bindir ();
      if (bindir == NULL)
        {
          g_print ("gepard-server: no DATABASE_URL and no PostgreSQL installed: serving built-in "
                   "voices only, cloning is unavailable\n");
          return TRUE;
        }
      g_autofree char *dir = server->config.data_dir != NULL
                                 ? g_strdup (server->config.data_dir)
                                 : gepard_voice_db_default_cluster_dir ();
      g_print ("gepard-server: no DATABASE_URL: running a private PostgreSQL cluster in %s "
               "(--data-dir or TTS_DATA_DIR to move it)\n",
               dir);
      g_autoptr (GError) cluster_error = NULL;
      loaded->cluster = gepard_voice_db_start_private_cluster (dir, &cluster_error);
      if (loaded->cluster == NULL)
        {
          /* a development convenience that failed: speech goes on without cloned voices */
          g_printerr ("gepard-server: could not run the private PostgreSQL cluster (%s); serving "
                      "built-in voices only, cloning is unavailable\n",
                      cluster_error->message);
          return TRUE;
        }
      url = gepard_voice_db_cluster_get_conninfo (loaded->cluster);
    }
  else
    g_print ("gepard-server: voices in the PostgreSQL database of DATABASE_URL\n");

  g_autofree char *model = model_identity (gepard_engine_pool_get (loaded->engines, 0));
  GepardVoiceDbOptions options = {
      .conninfo = url,
      .model = model,
      .rows = config->compressor_queries,
      .hidden = config->hidden_size,
  };
  GepardVoiceDb *db = gepard_voice_db_new (&options, error);
  if (db == NULL)
    return FALSE;
  loaded->db = db;
  loaded->voices = gepard_voice_store_new_db (loaded->engines, loaded->voices, db);
  return TRUE;
}

/* ---- models from the Hugging Face hub ---- */

typedef struct
{
  GepardServer *server;
  char *reason;
  gboolean downloading;
} LoadingState;

static gboolean
apply_loading_state (gpointer data)
{
  LoadingState *state = data;
  GepardServer *server = state->server;
  /* updates queued by the loading thread arrive in order, all before its result */
  if (server->engines == NULL)
    {
      g_free (server->loading_reason);
      server->loading_reason = g_steal_pointer (&state->reason);
      server->downloading = state->downloading;
    }
  g_free (state->reason);
  g_free (state);
  return G_SOURCE_REMOVE;
}

/* From the loading thread: what /health says until the server is ready. */
static void
post_loading_state (GepardServer *server, gboolean downloading, char *reason)
{
  LoadingState *state = g_new0 (LoadingState, 1);
  state->server = server;
  state->reason = reason;
  state->downloading = downloading;
  /* an idle source of the main loop, never a call on this thread */
  g_idle_add_full (G_PRIORITY_DEFAULT, apply_loading_state, state, NULL);
}

typedef struct
{
  GepardServer *server;
  char *file;         /* the file last logged */
  int logged_percent; /* of the whole download, last logged */
  gint64 logged_at;   /* monotonic time of the last log line */
  gint64 posted_at;   /* of the last /health update */
} DownloadLog;

static void
on_download_progress (const GepardHubProgress *p, gpointer user_data)
{
  DownloadLog *log = user_data;
  gint64 now = g_get_monotonic_time ();

  if (p->note != NULL)
    g_print ("gepard-server: %s\n", p->note);
  if (p->file == NULL)
    return;
  double mib = 1024.0 * 1024.0;
  int percent = p->bytes_total > 0 ? (int)(p->bytes_done * 100 / p->bytes_total) : 0;
  gboolean new_file = g_strcmp0 (log->file, p->file) != 0;
  if (percent < log->logged_percent) /* the next repo's download */
    log->logged_percent = percent;
  if (new_file)
    {
      g_free (log->file);
      log->file = g_strdup (p->file);
      if (p->file_total >= 0)
        g_print ("gepard-server: downloading %s: %s (%.1f MiB)\n", p->repo, p->file,
                 p->file_total / mib);
      else
        g_print ("gepard-server: downloading %s: %s\n", p->repo, p->file);
    }
  else if (p->bytes_total > 0
           && (percent >= log->logged_percent + 10 || now - log->logged_at >= 10 * G_USEC_PER_SEC))
    {
      g_print ("gepard-server: downloading %s: %.1f of %.1f MiB (%d%%)\n", p->repo,
               p->bytes_done / mib, p->bytes_total / mib, percent);
      log->logged_percent = percent;
      log->logged_at = now;
    }
  if (new_file || now - log->posted_at >= G_USEC_PER_SEC / 4)
    {
      post_loading_state (log->server, TRUE,
                          p->bytes_total > 0 ? g_strdup_printf (
                              "downloading %s from the hub: %s, %.1f of %.1f "
                              "MiB (%d%%)",
                              p->repo, p->file, p->bytes_done / mib, p->bytes_total / mib, percent)
                                             : g_strdup_printf ("downloading %s from the hub: %s",
                                                                p->repo, p->file));
      log->posted_at = now;
    }
}

/* Downloads into the local Hugging Face cache what a repo id given as the model (and the
 * published codec, when the model has none beside it) or as the codec needs; the engine then
 * finds it there. Paths are used as they are. */
static gboolean
fetch_from_hub (GepardServer *server, Loaded *loaded, GError **error)
{
  /* copies: a signal may end the process while this thread still downloads */
  g_autofree char *model = g_strdup (server->config.model);
  g_autofree char *codec = g_strdup (server->config.codec);
  DownloadLog log = {.server = server, .logged_at = g_get_monotonic_time ()};
  gboolean ok = TRUE;

  if (!g_file_test (model, G_FILE_TEST_IS_DIR) && gepard_hub_is_repo_id (model))
    {
      post_loading_state (server, FALSE, g_strdup_printf ("looking for %s in the cache", model));
      g_autofree char *dir = gepard_hub_fetch (model, GEPARD_HUB_REPO_MODEL, on_download_progress,
                                               &log, NULL, error);
      ok = dir != NULL;
      if (ok && codec == NULL && !gepard_hub_model_has_codec (dir))
        {
          g_print ("gepard-server: %s has no codec beside it: decoding with %s\n", model,
                   GEPARD_HUB_CODEC_REPO);
          g_autofree char *codec_dir
              = gepard_hub_fetch (GEPARD_HUB_CODEC_REPO, GEPARD_HUB_REPO_CODEC,
                                  on_download_progress, &log, NULL, error);
          ok = codec_dir != NULL;
        }
    }
  if (ok && codec != NULL && !g_file_test (codec, G_FILE_TEST_EXISTS)
      && gepard_hub_is_repo_id (codec))
    {
      g_autofree char *codec_dir = gepard_hub_fetch (codec, GEPARD_HUB_REPO_CODEC,
                                                     on_download_progress, &log, NULL, error);
      ok = codec_dir != NULL
           && (loaded->codec_path = gepard_hub_find_codec_file (codec_dir, error)) != NULL;
    }
  g_free (log.file);
  if (ok)
    post_loading_state (server, FALSE, g_strdup_printf ("loading the model %s", model));
  return ok;
}

static char *
format_gpu_ids (const GepardServerConfig *config, guint from)
{
  GString *ids = g_string_new (NULL);
  for (guint i = from; i < config->n_gpu_device_ids; i++)
    g_string_append_printf (ids, "%s%d", i > from ? "," : "", config->gpu_device_ids[i]);
  return g_string_free (ids, FALSE);
}

/* Where the engines run and what they share the GPU with, for the log. */
static void
report_placement (const GepardServerConfig *config)
{
  g_autofree char *ids = format_gpu_ids (config, 0);
  g_print ("gepard-server: device %s; GPU ids %s; GPU memory fraction %g "
           "(TTS_GPU_MEMORY_UTILIZATION)\n",
           config->device, ids, config->gpu_memory_utilization);
  if (config->mps)
    g_print ("gepard-server: NVIDIA MPS daemon found (control pipe in %s): this process's CUDA "
             "work is scheduled by it alongside the GPU's other clients\n",
             config->mps_pipe_dir);
  else
    g_print ("gepard-server: no NVIDIA MPS daemon (no control pipe in %s)\n", config->mps_pipe_dir);
}

/* An engine on the device the settings name and, when that is a GPU, one more on each further
 * GPU listed: streams are spread across them (gepard-engine-pool.h). */
static GepardEnginePool *
load_engines (const GepardServerConfig *config, GError **error)
{
  g_autoptr (GPtrArray) engines
      = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_engine_unref);
  GepardEngine *first = gepard_engine_get_shared (config->model, config->device, error);
  if (first == NULL)
    return NULL;
  g_ptr_array_add (engines, first);
  if (gepard_engine_get_device (first)->kind != GEPARD_BACKEND_CUDA)
    {
      if (config->n_gpu_device_ids > 1)
        {
          g_autofree char *others = format_gpu_ids (config, 1);
          g_print ("gepard-server: the engine runs on %s; GPUs %s are listed but unused\n",
                   gepard_engine_get_device_description (first), others);
        }
    }
  else
    for (guint i = 1; i < config->n_gpu_device_ids; i++)
      {
        int id = config->gpu_device_ids[i];
        g_autofree char *device = g_strdup_printf ("cuda:%d", id);
        GError *local = NULL;
        GepardEngine *engine = gepard_engine_get_shared (config->model, device, &local);
        if (engine == NULL)
          {
            g_propagate_prefixed_error (error, local, "GPU %d (listed in the GPU ids): ", id);
            return NULL;
          }
        g_ptr_array_add (engines, engine);
      }
  return gepard_engine_pool_new ((GepardEngine *const *)engines->pdata, engines->len);
}

static void
load_engine (GTask *task, gpointer source, gpointer task_data, GCancellable *cancellable)
{
  GepardServer *server = task_data;
  GError *error = NULL;
  Loaded *loaded = g_new0 (Loaded, 1);

  loaded->server = server;
  /* after "listening on", which scripts wait for as the first line */
  report_placement (&server->config);
  if (fetch_from_hub (server, loaded, &error))
    loaded->engines = load_engines (&server->config, &error);
  if (loaded->engines != NULL)
    loaded->voices
        = gepard_voice_store_new_local (loaded->engines, server->config.voices_dir, &error);
  if (loaded->voices != NULL)
    open_voice_db (server, loaded, &error);
  if (error != NULL)
    {
      loaded_free (loaded);
      g_task_return_error (task, error);
      return;
    }
  g_task_return_pointer (task, loaded, loaded_free);
}

static void on_voice_db_migrated (GObject *source, GAsyncResult *result, gpointer user_data);
static void become_ready (GepardServer *server, Loaded *loaded);

static void
on_engine_loaded (GObject *source, GAsyncResult *result, gpointer user_data)
{
  GMainLoop *loop = user_data;
  GepardServer *server = g_task_get_task_data (G_TASK (result));
  g_autoptr (GError) error = NULL;
  Loaded *loaded = g_task_propagate_pointer (G_TASK (result), &error);

  if (loaded == NULL)
    {
      if (error->domain == GEPARD_VOICE_DB_ERROR)
        g_printerr ("gepard-server: could not open the voice store: %s\n", error->message);
      else
        g_printerr ("gepard-server: could not load the model %s: %s\n", server->config.model,
                    error->message);
      g_object_set_data (G_OBJECT (result), "failed", GINT_TO_POINTER (1));
      server->downloading = FALSE;
      g_free (server->loading_reason);
      server->loading_reason = g_strdup_printf ("the model failed to load: %s", error->message);
      g_main_loop_quit (loop);
      return;
    }
  /* stopped at exit even when the server quits before it is ready */
  server->cluster = g_steal_pointer (&loaded->cluster);
  if (loaded->db != NULL)
    {
      g_free (server->loading_reason);
      server->loading_reason = g_strdup ("connecting to the voice database");
      gepard_voice_db_migrate_async (loaded->db, NULL, on_voice_db_migrated, loaded);
      return;
    }
  become_ready (server, loaded);
}

static void
on_voice_db_migrated (GObject *source, GAsyncResult *result, gpointer user_data)
{
  Loaded *loaded = user_data;
  GepardServer *server = loaded->server;
  g_autoptr (GError) error = NULL;

  /* the store reconnects and migrates by itself: serve the built-in voices meanwhile */
  if (!gepard_voice_db_migrate_finish (loaded->db, result, &error))
    g_printerr ("gepard-server: the voice database is not ready (%s); retrying in the "
                "background\n",
                error->message);
  become_ready (server, loaded);
}

static void
become_ready (GepardServer *server, Loaded *loaded)
{
  server->engines = g_steal_pointer (&loaded->engines);
  server->voices = g_steal_pointer (&loaded->voices);
  server->downloading = FALSE;
  if (loaded->codec_path != NULL)
    {
      /* a --codec repo id, now the file it resolved to */
      g_free (server->config.codec);
      server->config.codec = g_steal_pointer (&loaded->codec_path);
    }
  loaded_free (loaded);
  g_clear_pointer (&server->loading_reason, g_free);
  server->loading_reason = g_strdup ("ready");
  GepardEngine *first = gepard_engine_pool_get (server->engines, 0);
  g_autoptr (GString) devices = g_string_new (gepard_engine_get_device_description (first));
  for (guint i = 1; i < gepard_engine_pool_get_size (server->engines); i++)
    g_string_append_printf (
        devices, " and %s",
        gepard_engine_get_device_description (gepard_engine_pool_get (server->engines, i)));
  g_print ("gepard-server: ready: %s on %s%s\n", server->config.model, devices->str,
           gepard_engine_is_test_model (first) ? " (untrained test model)" : "");
}

static gboolean
read_pipelines (GepardServer *server, GError **error)
{
  server->pipelines = g_hash_table_new_full (g_str_hash, g_str_equal, NULL, g_free);
  for (gsize i = 0; i < G_N_ELEMENTS (pipeline_names); i++)
    {
      g_autofree char *path
          = g_build_filename (server->config.pipeline_dir, pipeline_names[i], NULL);
      char *text = NULL;
      if (!g_file_get_contents (path, &text, NULL, error))
        {
          g_prefix_error (error, "pipeline descriptions (--pipeline-dir): ");
          return FALSE;
        }
      g_hash_table_insert (server->pipelines, (gpointer)pipeline_names[i], g_strstrip (text));
    }
  if (gst_element_factory_find ("gepardtextsrc") == NULL)
    {
      g_set_error_literal (error, G_IO_ERROR, G_IO_ERROR_NOT_FOUND,
                           "the Gepard GStreamer plugin is not found: install it or add its "
                           "directory to GST_PLUGIN_PATH");
      return FALSE;
    }
  return TRUE;
}

static gboolean
listen (GepardServer *server, GError **error)
{
  const char *host = server->config.host;
  SoupServerListenOptions options = 0;
  g_autoptr (GInetAddress) address = g_strcmp0 (host, "localhost") == 0
                                         ? g_inet_address_new_loopback (G_SOCKET_FAMILY_IPV4)
                                         : g_inet_address_new_from_string (host);
  if (address == NULL)
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_INVALID_ARGUMENT, "--host %s is not an IP address",
                   host);
      return FALSE;
    }
  if (server->config.tls_cert != NULL)
    {
      g_autoptr (GTlsCertificate) certificate = g_tls_certificate_new_from_files (
          server->config.tls_cert, server->config.tls_key, error);
      if (certificate == NULL)
        return FALSE;
      soup_server_set_tls_certificate (server->soup, certificate);
      options |= SOUP_SERVER_LISTEN_HTTPS;
    }
  g_autoptr (GSocketAddress) socket_address
      = g_inet_socket_address_new (address, (guint16)server->config.port);
  if (!soup_server_listen (server->soup, socket_address, options, error))
    return FALSE;

  GSList *uris = soup_server_get_uris (server->soup);
  for (GSList *l = uris; l != NULL; l = l->next)
    {
      g_autofree char *text = g_uri_to_string (l->data);
      g_print ("gepard-server: listening on %s\n", text);
    }
  g_slist_free_full (uris, (GDestroyNotify)g_uri_unref);
  return TRUE;
}

/* Every pipeline holds a bus with two descriptors (gstreamer-notes.md §3.3). */
static void
raise_file_limit (void)
{
  struct rlimit limit;
  if (getrlimit (RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max)
    {
      limit.rlim_cur = limit.rlim_max;
      setrlimit (RLIMIT_NOFILE, &limit);
    }
}

/* ---- shutdown ---- */

/* how long the last responses and close handshakes may take once the work has ended */
#define CLOSING_GRACE_US (3 * G_USEC_PER_SEC)

typedef struct
{
  GepardServer *server;
  GMainLoop *loop;
  guint signals;        /* received so far */
  gboolean forced;      /* the deadline passed with work under way */
  gint64 deadline;      /* monotonic: the end of the drain */
  gint64 closing_until; /* monotonic: the end of the closing grace, 0 while draining */
  guint tick;           /* the drain's timer */
} Shutdown;

static gboolean
drain_tick (gpointer user_data)
{
  Shutdown *sd = user_data;
  GepardServer *server = sd->server;
  gint64 now = g_get_monotonic_time ();

  if (sd->closing_until == 0)
    {
      guint busy = gepard_routes_websocket_count_busy (server);
      /* sockets whose contexts have all ended are told to go elsewhere at once */
      gepard_routes_websocket_shutdown (server, FALSE);
      if (server->requests_in_flight == 0 && busy == 0)
        g_print ("gepard-server: every generation has ended; stopping\n");
      else if (now >= sd->deadline)
        {
          g_print ("gepard-server: shutdown deadline: stopping %u HTTP requests and %u WebSocket "
                   "contexts still under way\n",
                   server->requests_in_flight, busy);
          sd->forced = TRUE;
          gepard_routes_tts_shutdown (server);
          gepard_routes_websocket_shutdown (server, TRUE);
        }
      else
        return G_SOURCE_CONTINUE;
      sd->closing_until = now + CLOSING_GRACE_US;
    }
  /* the last responses and close frames go out, and every pipeline is down, before the engine
   * stops */
  if ((server->requests_in_flight == 0 && g_hash_table_size (server->websockets) == 0
       && gepard_tts_session_count_pipelines () == 0)
      || now >= sd->closing_until)
    {
      sd->tick = 0;
      g_main_loop_quit (sd->loop);
      return G_SOURCE_REMOVE;
    }
  return G_SOURCE_CONTINUE;
}

static gboolean
on_signal (gpointer user_data)
{
  Shutdown *sd = user_data;
  GepardServer *server = sd->server;

  if (++sd->signals > 1)
    {
      g_printerr ("gepard-server: second signal: exiting at once\n");
      /* a private PostgreSQL cluster would outlive the process */
      gepard_voice_db_cluster_free (g_steal_pointer (&server->cluster));
      _exit (1);
    }
  server->draining = TRUE;
  sd->deadline = g_get_monotonic_time () + (gint64)server->config.shutdown_timeout * G_USEC_PER_SEC;
  g_print ("gepard-server: shutting down: no new work, up to %d s for what is under way (a "
           "second signal exits at once)\n",
           server->config.shutdown_timeout);
  sd->tick = g_timeout_add (50, drain_tick, sd);
  drain_tick (sd);
  return G_SOURCE_CONTINUE;
}

int
main (int argc, char **argv)
{
  GepardServer server = {0};
  g_autoptr (GError) error = NULL;
  int status = 0;

  if (!gepard_server_config_load (&server.config, &argc, &argv, &error))
    {
      g_printerr ("gepard-server: %s\n", error->message);
      gepard_server_config_clear (&server.config);
      return 2;
    }
  if (server.config.list_routes)
    {
      print_routes (&server.config);
      gepard_server_config_clear (&server.config);
      return 0;
    }
  gst_init (NULL, NULL);
  raise_file_limit ();
  /* stdout is read by scripts waiting for the port: one line per event, at once */
  setvbuf (stdout, NULL, _IOLBF, 0);

  server.metrics = gepard_metrics_new ();
  server.loading_reason = g_strdup_printf ("loading the model %s", server.config.model);
  server.websockets = g_hash_table_new (NULL, NULL);
  server.generations = g_hash_table_new (NULL, NULL);
  server.soup = soup_server_new ("server-header", "gepard-server/" GEPARD_VERSION " ", NULL);
  soup_server_add_early_handler (server.soup, NULL, gepard_http_limit_body, &server, NULL);
  soup_server_add_handler (server.soup, NULL, handle_request, &server, NULL);
  gepard_routes_websocket_register (&server);
  g_signal_connect (server.soup, "request-finished", G_CALLBACK (on_request_finished), &server);

  GMainLoop *loop = g_main_loop_new (NULL, FALSE);
  Shutdown shutdown = {.server = &server, .loop = loop};
  if (!read_pipelines (&server, &error) || !listen (&server, &error))
    {
      g_printerr ("gepard-server: %s\n", error->message);
      status = 1;
    }
  else
    {
      guint sigint = g_unix_signal_add (SIGINT, on_signal, &shutdown);
      guint sigterm = g_unix_signal_add (SIGTERM, on_signal, &shutdown);
      GTask *task = g_task_new (NULL, NULL, on_engine_loaded, loop);
      g_task_set_task_data (task, &server, NULL);
      g_task_run_in_thread (task, load_engine);
      g_object_unref (task);
      g_main_loop_run (loop);
      /* the model did not load; a signal while it loads is a normal stop */
      if (server.engines == NULL && shutdown.signals == 0)
        status = 1;
      if (shutdown.tick != 0)
        g_source_remove (shutdown.tick);
      g_source_remove (sigint);
      g_source_remove (sigterm);
    }

  soup_server_disconnect (server.soup);
  g_object_unref (server.soup);
  g_main_loop_unref (loop);
  /* the store's workers and connections, the private cluster (pg_ctl stop), then the engine's
   * scheduler */
  gepard_voice_store_free (server.voices);
  gepard_voice_db_cluster_free (server.cluster);
  gepard_engine_pool_unref (server.engines);
  if (shutdown.signals > 0)
    g_print ("gepard-server: stopped%s\n", shutdown.forced ? " (work was cut short)" : "");
  g_clear_pointer (&server.websockets, g_hash_table_unref);
  g_clear_pointer (&server.generations, g_hash_table_unref);
  g_clear_pointer (&server.pipelines, g_hash_table_unref);
  gepard_metrics_free (server.metrics);
  g_free (server.loading_reason);
  gepard_server_config_clear (&server.config);
  return status;
}
