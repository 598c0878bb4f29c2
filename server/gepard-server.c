/* gepard-server: the Cartesia-compatible TTS server.
 *
 *   gepard-server --model DIR|REPO_ID [--codec PATH] --port N [--host H]
 *
 * Settings come from flags and TTS_* variables (server/README.md). The port opens at once and
 * GET /health answers 503 with the reason while the model loads on a worker thread; generation
 * routes answer 503 until then too. Everything else runs on the main loop. */
#include "gepard-server.h"

#include "gepard-build-config.h"

#include <glib-unix.h>
#include <gst/gst.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

static const char *const pipeline_names[]
    = {"tts-stream.txt", "tts-stream-mulaw.txt", "tts-stream-alaw.txt", "clone.txt"};

typedef struct
{
  GepardEngine *engine;
  GepardVoiceStore *voices;
  GepardVoiceDbCluster *cluster;
  GepardVoiceDb *db; /* also inside voices: migrated before the server says it is ready */
  GepardServer *server;
} Loaded;

static void
loaded_free (gpointer data)
{
  Loaded *loaded = data;
  gepard_voice_store_free (loaded->voices);
  gepard_voice_db_cluster_free (loaded->cluster);
  if (loaded->engine != NULL)
    gepard_engine_unref (loaded->engine);
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
  return "other";
}

static void
send_api_error (SoupServerMessage *msg, guint version, GepardApiError code, const char *message)
{
  g_autoptr (GError) error = g_error_new_literal (GEPARD_API_ERROR, code, message);
  g_autofree char *request_id = gepard_http_new_request_id ();
  gepard_http_send_error (msg, version, error, request_id);
}

static void
handle_request (SoupServer *soup, SoupServerMessage *msg, const char *path, GHashTable *query,
                gpointer user_data)
{
  GepardServer *server = user_data;
  guint version = gepard_http_get_version (msg, query, FALSE);
  const char *method = soup_server_message_get_method (msg);
  gboolean get = g_str_equal (method, "GET") || g_str_equal (method, "HEAD");

  if (gepard_http_handle_cors (server, msg))
    return;
  /* health stays open so that orchestrators can probe without the key */
  if (g_str_equal (path, "/health"))
    {
      gepard_routes_health (server, msg);
      return;
    }
  if (!gepard_http_check_api_key (server, msg, query))
    {
      send_api_error (msg, version, GEPARD_API_ERROR_UNAUTHORIZED, "Invalid or missing API key");
      return;
    }

  if (g_str_equal (path, "/tts/bytes"))
    gepard_routes_tts_bytes (server, msg, query, version);
  else if (g_str_equal (path, "/tts/sse"))
    gepard_routes_tts_sse (server, msg, query, version);
  else if (g_str_equal (path, "/voices") || g_str_has_prefix (path, "/voices/"))
    gepard_routes_voices (server, msg, path, query, version);
  else if (g_str_equal (path, "/") || g_str_equal (path, "/metrics"))
    {
      if (!get)
        send_api_error (msg, version, GEPARD_API_ERROR_METHOD_NOT_ALLOWED, "Use GET");
      else if (g_str_equal (path, "/"))
        gepard_routes_root (server, msg, version);
      else
        gepard_routes_metrics (server, msg);
    }
  else
    send_api_error (msg, version, GEPARD_API_ERROR_NOT_FOUND, "No such route");
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
  const GepardModelConfig *config = gepard_engine_get_config (loaded->engine);
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

  g_autofree char *model = model_identity (loaded->engine);
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
  loaded->voices = gepard_voice_store_new_db (loaded->engine, loaded->voices, db);
  return TRUE;
}

static void
load_engine (GTask *task, gpointer source, gpointer task_data, GCancellable *cancellable)
{
  GepardServer *server = task_data;
  GError *error = NULL;
  Loaded *loaded = g_new0 (Loaded, 1);

  loaded->server = server;
  loaded->engine = gepard_engine_get_shared (server->config.model, server->config.device, &error);
  if (loaded->engine != NULL)
    loaded->voices
        = gepard_voice_store_new_local (loaded->engine, server->config.voices_dir, &error);
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
  server->engine = g_steal_pointer (&loaded->engine);
  server->voices = g_steal_pointer (&loaded->voices);
  loaded_free (loaded);
  g_clear_pointer (&server->loading_reason, g_free);
  server->loading_reason = g_strdup ("ready");
  g_print ("gepard-server: ready: %s on %s%s\n", server->config.model,
           gepard_engine_get_device_description (server->engine),
           gepard_engine_is_test_model (server->engine) ? " (untrained test model)" : "");
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

static gboolean
on_signal (gpointer user_data)
{
  g_main_loop_quit (user_data);
  return G_SOURCE_REMOVE;
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
  gst_init (NULL, NULL);
  raise_file_limit ();
  /* stdout is read by scripts waiting for the port: one line per event, at once */
  setvbuf (stdout, NULL, _IOLBF, 0);

  server.metrics = gepard_metrics_new ();
  server.loading_reason = g_strdup_printf ("loading the model %s", server.config.model);
  server.soup = soup_server_new ("server-header", "gepard-server/" GEPARD_VERSION " ", NULL);
  soup_server_add_early_handler (server.soup, NULL, gepard_http_limit_body, &server, NULL);
  soup_server_add_handler (server.soup, NULL, handle_request, &server, NULL);
  gepard_routes_websocket_register (&server);
  g_signal_connect (server.soup, "request-finished", G_CALLBACK (on_request_finished), &server);

  GMainLoop *loop = g_main_loop_new (NULL, FALSE);
  if (!read_pipelines (&server, &error) || !listen (&server, &error))
    {
      g_printerr ("gepard-server: %s\n", error->message);
      status = 1;
    }
  else
    {
      g_unix_signal_add (SIGINT, on_signal, loop);
      g_unix_signal_add (SIGTERM, on_signal, loop);
      GTask *task = g_task_new (NULL, NULL, on_engine_loaded, loop);
      g_task_set_task_data (task, &server, NULL);
      g_task_run_in_thread (task, load_engine);
      g_object_unref (task);
      g_main_loop_run (loop);
      if (server.engine == NULL)
        status = 1;
    }

  soup_server_disconnect (server.soup);
  g_object_unref (server.soup);
  g_main_loop_unref (loop);
  gepard_voice_store_free (server.voices);
  gepard_voice_db_cluster_free (server.cluster);
  if (server.engine != NULL)
    gepard_engine_unref (server.engine);
  g_clear_pointer (&server.pipelines, g_hash_table_unref);
  gepard_metrics_free (server.metrics);
  g_free (server.loading_reason);
  gepard_server_config_clear (&server.config);
  return status;
}
