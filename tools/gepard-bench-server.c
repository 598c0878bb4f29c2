/* gepard-bench-server.c: gepard-bench's server mode.
 *
 * C clients, each on its own WebSocket to /tts/websocket, spread over a few client threads (each
 * with its own main context and session), so that reading thousands of chunks a second is not
 * what limits a level. At each level every client connects first; once all have connected (or
 * failed), each sends its turn at once: S messages of one sentence each, "continue": true but for
 * the last. Every message asks, through Gepard's extension {"gepard": {"max_frames": F,
 * "ignore_stop": true}}, for sentences of exactly F frames, so that every stream receives the same
 * audio and the levels compare as the engine bench's do. Per stream: time to first audio (from
 * sending its first message to the first chunk that carries audio), real-time factor (time to its
 * done over the duration of the audio it received) and bytes; per level: the aggregate, audio
 * seconds of all streams per wall second from the first message sent to the last done. Errors (a
 * refused handshake, an error event, a socket closed before done) are counted, never fatal. */
#include "gepard-bench-server.h"

#include <json-glib/json-glib.h>
#include <libsoup/soup.h>

#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

/* A level gives up on its streams when none has heard from the server for this long. */
#define STALL_SECONDS 120
/* Handshakes in flight at once: a burst of C connections overflows a listening socket's
 * backlog (GSocket's default is 10), and what the kernel then drops comes back seconds later or
 * as resets. The turns all start together after the last handshake, so this does not change what
 * is measured. */
#define CONNECT_WINDOW 8

typedef enum
{
  STREAM_CONNECTING,
  STREAM_CONNECTED,
  STREAM_SENT,
  STREAM_FINISHED,
} StreamState;

typedef struct _BenchWorker BenchWorker;

typedef struct
{
  BenchWorker *level;
  int index;
  StreamState state;
  gboolean failed;
  SoupMessage *msg;
  SoupWebsocketConnection *conn;
  gint64 sent, first_audio, done;
  guint64 bytes;
} ServerStream;

/* What the client threads of a level share: the moment the turns start, once all have connected. */
typedef struct
{
  GMutex lock;
  GCond connected;
  int workers, waiting;
  gint64 start;
} LevelStart;

/* One client thread: a slice of the level's streams on its own main context. */
struct _BenchWorker
{
  const GepardBenchServerOptions *options;
  LevelStart *level_start;
  SoupSession *session;
  const char *ws_url;
  ServerStream *streams;
  int n;
  int next_connect; /* the next stream to start its handshake */
  int connecting;   /* handshakes not finished */
  int running;      /* turns sent, not finished */
  int errors;
  char *first_error;
  gint64 last_progress;
  GCancellable *cancellable;
};

static int
compare_double (const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double
percentile (double *values, int n, double p)
{
  if (n == 0)
    return 0;
  qsort (values, n, sizeof (double), compare_double);
  return values[MIN (n - 1, (int)(p * n))];
}

static void
stream_finish (ServerStream *s, const char *error)
{
  BenchWorker *level = s->level;

  if (s->state == STREAM_FINISHED)
    return;
  if (s->state == STREAM_SENT)
    level->running--;
  s->state = STREAM_FINISHED;
  if (error != NULL)
    {
      s->failed = TRUE;
      level->errors++;
      if (level->first_error == NULL)
        level->first_error = g_strdup_printf ("stream %d: %s", s->index, error);
    }
  if (s->conn != NULL && soup_websocket_connection_get_state (s->conn) == SOUP_WEBSOCKET_STATE_OPEN)
    soup_websocket_connection_close (s->conn, SOUP_WEBSOCKET_CLOSE_NORMAL, NULL);
}

/* Decoded length of base64 text, without decoding it. */
static gsize
base64_length (const char *text)
{
  gsize n = strlen (text);
  gsize padding = (n > 0 && text[n - 1] == '=') + (n > 1 && text[n - 2] == '=');
  return n / 4 * 3 - MIN (padding, n / 4 * 3);
}

static void
stream_audio (ServerStream *s, gsize size)
{
  if (size > 0 && s->first_audio == 0)
    s->first_audio = g_get_monotonic_time ();
  s->bytes += size;
}

static void
on_event (ServerStream *s, GBytes *message)
{
  g_autoptr (JsonParser) parser = json_parser_new_immutable ();
  g_autoptr (GError) error = NULL;
  gsize size;
  const char *data = g_bytes_get_data (message, &size);

  if (!json_parser_load_from_data (parser, data != NULL ? data : "", (gssize)size, &error))
    {
      g_autofree char *reason = g_strdup_printf ("unreadable event: %s", error->message);
      stream_finish (s, reason);
      return;
    }
  JsonNode *root = json_parser_get_root (parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      stream_finish (s, "an event that is not a JSON object");
      return;
    }
  JsonObject *event = json_node_get_object (root);
  const char *type = json_object_get_string_member_with_default (event, "type", "");
  if (strcmp (type, "chunk") == 0)
    stream_audio (s,
                  base64_length (json_object_get_string_member_with_default (event, "data", "")));
  else if (strcmp (type, "error") == 0)
    {
      const char *text = json_object_get_string_member_with_default (
          event, "message", json_object_get_string_member_with_default (event, "error", "?"));
      g_autofree char *reason = g_strdup_printf (
          "error event %" G_GINT64_FORMAT ": %s",
          json_object_get_int_member_with_default (event, "status_code", 0), text);
      stream_finish (s, reason);
    }
  else if (strcmp (type, "done") == 0)
    {
      s->done = g_get_monotonic_time ();
      stream_finish (s, s->bytes == 0 ? "done without audio" : NULL);
    }
}

static void
on_message (SoupWebsocketConnection *conn, gint type, GBytes *message, gpointer user_data)
{
  ServerStream *s = user_data;

  s->level->last_progress = g_get_monotonic_time ();
  if (s->state == STREAM_FINISHED)
    return;
  if (type == SOUP_WEBSOCKET_DATA_BINARY)
    stream_audio (s, g_bytes_get_size (message));
  else
    on_event (s, message);
}

static void
on_closed (SoupWebsocketConnection *conn, gpointer user_data)
{
  ServerStream *s = user_data;
  g_autofree char *reason
      = g_strdup_printf ("the socket closed before done (code %u%s%s)",
                         soup_websocket_connection_get_close_code (conn),
                         soup_websocket_connection_get_close_data (conn) != NULL ? ": " : "",
                         soup_websocket_connection_get_close_data (conn) != NULL
                             ? soup_websocket_connection_get_close_data (conn)
                             : "");
  stream_finish (s, reason);
}

static void
on_error (SoupWebsocketConnection *conn, GError *error, gpointer user_data)
{
  stream_finish (user_data, error->message);
}

static void start_connects (BenchWorker *level);

static void
on_connected (GObject *source, GAsyncResult *result, gpointer user_data)
{
  ServerStream *s = user_data;
  g_autoptr (GError) error = NULL;

  s->level->connecting--;
  s->level->last_progress = g_get_monotonic_time ();
  s->conn = soup_session_websocket_connect_finish (SOUP_SESSION (source), result, &error);
  if (s->conn == NULL)
    {
      guint status = soup_message_get_status (s->msg);
      g_autofree char *reason
          = status >= 100
                ? g_strdup_printf ("handshake refused: HTTP %u %s: %s", status,
                                   soup_message_get_reason_phrase (s->msg), error->message)
                : g_strdup (error->message);
      stream_finish (s, reason);
      start_connects (s->level);
      return;
    }
  /* chunks are small, but a stall must not turn into a protocol error */
  soup_websocket_connection_set_max_incoming_payload_size (s->conn, 0);
  g_signal_connect (s->conn, "message", G_CALLBACK (on_message), s);
  g_signal_connect (s->conn, "closed", G_CALLBACK (on_closed), s);
  g_signal_connect (s->conn, "error", G_CALLBACK (on_error), s);
  s->state = STREAM_CONNECTED;
  start_connects (s->level);
}

static void
start_connects (BenchWorker *level)
{
  while (level->connecting < CONNECT_WINDOW && level->next_connect < level->n
         && !g_cancellable_is_cancelled (level->cancellable))
    {
      ServerStream *s = &level->streams[level->next_connect++];
      s->msg = soup_message_new (SOUP_METHOD_GET, level->ws_url);
      if (level->options->api_key != NULL)
        soup_message_headers_replace (soup_message_get_request_headers (s->msg), "X-API-Key",
                                      level->options->api_key);
      level->connecting++;
      soup_session_websocket_connect_async (level->session, s->msg, NULL, NULL, G_PRIORITY_DEFAULT,
                                            level->cancellable, on_connected, s);
    }
}

static char *
turn_message (const GepardBenchServerOptions *o, int stream, int sentence)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  g_autofree char *context_id = g_strdup_printf ("bench-%d", stream);
  /* one sentence per message; the trailing space keeps it apart from the next */
  g_autofree char *text = g_strdup_printf (
      "This is sentence %d of a benchmark turn, spoken by stream %d. ", sentence + 1, stream);

  json_builder_begin_object (b);
  json_builder_set_member_name (b, "model_id");
  json_builder_add_string_value (b, "sonic-2");
  json_builder_set_member_name (b, "transcript");
  json_builder_add_string_value (b, text);
  json_builder_set_member_name (b, "voice");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "mode");
  json_builder_add_string_value (b, "id");
  json_builder_set_member_name (b, "id");
  json_builder_add_string_value (b, o->voice);
  json_builder_end_object (b);
  json_builder_set_member_name (b, "output_format");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "container");
  json_builder_add_string_value (b, "raw");
  json_builder_set_member_name (b, "encoding");
  json_builder_add_string_value (b, o->encoding);
  json_builder_set_member_name (b, "sample_rate");
  json_builder_add_int_value (b, o->sample_rate);
  json_builder_end_object (b);
  json_builder_set_member_name (b, "context_id");
  json_builder_add_string_value (b, context_id);
  json_builder_set_member_name (b, "continue");
  json_builder_add_boolean_value (b, sentence + 1 < o->sentences);
  json_builder_set_member_name (b, "gepard");
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "max_frames");
  json_builder_add_int_value (b, o->frames);
  json_builder_set_member_name (b, "ignore_stop");
  json_builder_add_boolean_value (b, TRUE);
  json_builder_end_object (b);
  json_builder_end_object (b);

  g_autoptr (JsonNode) root = json_builder_get_root (b);
  return json_to_string (root, FALSE);
}

static gboolean
check_stall (gpointer user_data)
{
  BenchWorker *level = user_data;

  if (g_get_monotonic_time () - level->last_progress < STALL_SECONDS * G_USEC_PER_SEC)
    return G_SOURCE_CONTINUE;
  g_cancellable_cancel (level->cancellable);
  for (int i = 0; i < level->n; i++)
    if (level->streams[i].state != STREAM_CONNECTING)
      stream_finish (&level->streams[i],
                     "no answer from the server for " G_STRINGIFY (STALL_SECONDS) " s");
  return G_SOURCE_CONTINUE;
}

/* A client thread: connects its streams, waits for every thread's handshakes, sends its turns
 * and reads until all of its streams are done, then closes its sockets. */
static gpointer
worker_main (gpointer data)
{
  BenchWorker *level = data;
  const GepardBenchServerOptions *o = level->options;
  GMainContext *context = g_main_context_new ();
  g_main_context_push_thread_default (context);
  level->session
      = soup_session_new_with_options ("max-conns", level->n + 16, "max-conns-per-host",
                                       level->n + 16, "timeout", 0, "idle-timeout", 0, NULL);
  /* straight to the server, whatever proxy the environment names */
  soup_session_set_proxy_resolver (level->session, NULL);
  level->cancellable = g_cancellable_new ();
  level->last_progress = g_get_monotonic_time ();
  GSource *stall = g_timeout_source_new_seconds (1);
  g_source_set_callback (stall, check_stall, level, NULL);
  g_source_attach (stall, context);

  start_connects (level);
  while (level->connecting > 0)
    g_main_context_iteration (context, TRUE);
  /* a stall cancelled the handshakes not started yet */
  for (int i = level->next_connect; i < level->n; i++)
    stream_finish (&level->streams[i], "no handshake: the server stopped answering");

  /* every turn at once, as the engine bench submits its utterances */
  LevelStart *ls = level->level_start;
  g_mutex_lock (&ls->lock);
  if (++ls->waiting == ls->workers)
    {
      ls->start = g_get_monotonic_time ();
      g_cond_broadcast (&ls->connected);
    }
  while (ls->start == 0)
    g_cond_wait (&ls->connected, &ls->lock);
  g_mutex_unlock (&ls->lock);

  level->last_progress = g_get_monotonic_time ();
  for (int i = 0; i < level->n; i++)
    {
      ServerStream *s = &level->streams[i];
      if (s->state != STREAM_CONNECTED)
        continue;
      s->state = STREAM_SENT;
      level->running++;
      s->sent = g_get_monotonic_time ();
      for (int k = 0; k < o->sentences && s->state == STREAM_SENT; k++)
        {
          g_autofree char *text = turn_message (o, s->index, k);
          soup_websocket_connection_send_text (s->conn, text);
        }
    }
  while (level->running > 0)
    g_main_context_iteration (context, TRUE);

  /* the sockets close before the next level starts */
  for (int i = 0; i < level->n; i++)
    if (level->streams[i].conn != NULL)
      {
        g_signal_handlers_disconnect_by_data (level->streams[i].conn, &level->streams[i]);
        if (soup_websocket_connection_get_state (level->streams[i].conn)
            == SOUP_WEBSOCKET_STATE_OPEN)
          soup_websocket_connection_close (level->streams[i].conn, SOUP_WEBSOCKET_CLOSE_NORMAL,
                                           NULL);
      }
  gint64 close_deadline = g_get_monotonic_time () + 2 * G_USEC_PER_SEC;
  for (;;)
    {
      gboolean open = FALSE;
      for (int i = 0; i < level->n && !open; i++)
        open = level->streams[i].conn != NULL
               && soup_websocket_connection_get_state (level->streams[i].conn)
                      != SOUP_WEBSOCKET_STATE_CLOSED;
      if (!open || g_get_monotonic_time () > close_deadline)
        break;
      g_main_context_iteration (context, FALSE);
      g_usleep (1000);
    }
  for (int i = 0; i < level->n; i++)
    {
      g_clear_object (&level->streams[i].conn);
      g_clear_object (&level->streams[i].msg);
    }
  g_source_destroy (stall);
  g_source_unref (stall);
  g_clear_object (&level->cancellable);
  g_clear_object (&level->session);
  /* what the closed sockets left on the context goes with it */
  while (g_main_context_iteration (context, FALSE))
    ;
  g_main_context_pop_thread_default (context);
  g_main_context_unref (context);
  return NULL;
}

/* Client threads for a level of n streams: half the CPUs, 2 to 8, never more than streams. */
static int
client_threads (int n)
{
  return MIN (n, CLAMP ((int)g_get_num_processors () / 2, 2, 8));
}

/* Runs one level; appends its table row to stdout and its JSON line to `json`. */
static void
run_level (const GepardBenchServerOptions *o, const char *ws_url, int n, double bytes_per_second,
           int *errors, GString *json)
{
  int n_workers = client_threads (n);
  ServerStream *streams = g_new0 (ServerStream, n);
  BenchWorker *workers = g_new0 (BenchWorker, n_workers);
  GThread **threads = g_new0 (GThread *, n_workers);
  LevelStart level_start = {.workers = n_workers};
  g_mutex_init (&level_start.lock);
  g_cond_init (&level_start.connected);

  for (int w = 0; w < n_workers; w++)
    {
      int first = (int)((gint64)n * w / n_workers), last = (int)((gint64)n * (w + 1) / n_workers);
      workers[w] = (BenchWorker){
          .options = o,
          .level_start = &level_start,
          .ws_url = ws_url,
          .streams = streams + first,
          .n = last - first,
      };
      for (int i = first; i < last; i++)
        {
          streams[i].level = &workers[w];
          streams[i].index = i;
        }
    }
  for (int w = 0; w < n_workers; w++)
    threads[w] = g_thread_new ("bench-client", worker_main, &workers[w]);
  for (int w = 0; w < n_workers; w++)
    g_thread_join (threads[w]);
  gint64 start = level_start.start;

  g_autofree double *ttfa = g_new (double, n);
  g_autofree double *rtf = g_new (double, n);
  int done = 0, level_errors = 0;
  const char *first_error = NULL;
  gint64 end = start;
  double audio_total = 0, audio_min = 0, audio_max = 0;
  guint64 bytes_total = 0;
  for (int w = 0; w < n_workers; w++)
    {
      level_errors += workers[w].errors;
      if (first_error == NULL)
        first_error = workers[w].first_error;
    }
  for (int i = 0; i < n; i++)
    {
      ServerStream *s = &streams[i];
      bytes_total += s->bytes;
      if (s->failed)
        continue;
      double audio = s->bytes / bytes_per_second;
      ttfa[done] = (s->first_audio - s->sent) / 1e3;
      rtf[done] = (s->done - s->sent) / 1e6 / audio;
      audio_min = done == 0 ? audio : MIN (audio_min, audio);
      audio_max = MAX (audio_max, audio);
      audio_total += audio;
      end = MAX (end, s->done);
      done++;
    }
  if (done == 0)
    end = g_get_monotonic_time ();
  double wall = (end - start) / 1e6;
  double t50 = percentile (ttfa, done, 0.5), t90 = percentile (ttfa, done, 0.9),
         t99 = percentile (ttfa, done, 0.99);
  double r50 = percentile (rtf, done, 0.5), r90 = percentile (rtf, done, 0.9),
         r99 = percentile (rtf, done, 0.99);
  double aggregate = wall > 0 ? audio_total / wall : 0;
  g_print ("%6d %8.1fms %8.1fms %8.1fms %8.4f %8.4f %8.4f %10.1fx %8.2fs %7d\n", n, t50, t90, t99,
           r50, r90, r99, aggregate, wall, level_errors);
  if (first_error != NULL)
    g_printerr ("gepard-bench: %d of %d streams failed at C=%d; first: %s\n", level_errors, n, n,
                first_error);

  g_string_append_printf (
      json,
      "{\"mode\": \"server\", \"concurrency\": %d, \"completed\": %d, \"errors\": %d, "
      "\"frames\": %d, \"sentences\": %d, \"encoding\": \"%s\", \"sample_rate\": %d, "
      "\"client_threads\": %d, "
      "\"ttfa_ms\": {\"p50\": %.3f, \"p90\": %.3f, \"p99\": %.3f}, "
      "\"rtf\": {\"p50\": %.5f, \"p90\": %.5f, \"p99\": %.5f}, \"aggregate\": %.3f, "
      "\"wall_s\": %.4f, \"audio_s\": {\"total\": %.5f, \"min\": %.5f, \"max\": %.5f}, "
      "\"bytes\": %" G_GUINT64_FORMAT "}\n",
      n, done, level_errors, o->frames, o->sentences, o->encoding, o->sample_rate, n_workers, t50,
      t90, t99, r50, r90, r99, aggregate, wall, audio_total, audio_min, audio_max, bytes_total);
  *errors += level_errors;

  for (int w = 0; w < n_workers; w++)
    g_free (workers[w].first_error);
  g_mutex_clear (&level_start.lock);
  g_cond_clear (&level_start.connected);
  g_free (threads);
  g_free (workers);
  g_free (streams);
}

/* One socket per client, and then some for the session. */
static void
raise_fd_limit (int clients)
{
  struct rlimit limit;
  rlim_t want = (rlim_t)clients + 256;

  if (getrlimit (RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= want)
    return;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? want : MIN (want, limit.rlim_max);
  if (setrlimit (RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur < want)
    g_printerr ("gepard-bench: only %lu file descriptors: the largest levels may fail\n",
                (unsigned long)limit.rlim_cur);
}

int
gepard_bench_server (const GepardBenchServerOptions *o)
{
  int bytes_per_sample;
  if (strcmp (o->encoding, "pcm_f32le") == 0)
    bytes_per_sample = 4;
  else if (strcmp (o->encoding, "pcm_s16le") == 0)
    bytes_per_sample = 2;
  else
    {
      g_printerr ("gepard-bench: --encoding must be pcm_f32le or pcm_s16le\n");
      return 2;
    }

  g_autoptr (GError) error = NULL;
  g_autoptr (GUri) base = g_uri_parse (o->url, G_URI_FLAGS_NONE, &error);
  const char *scheme = base != NULL ? g_uri_get_scheme (base) : NULL;
  if (base == NULL
      || (g_ascii_strcasecmp (scheme, "http") != 0 && g_ascii_strcasecmp (scheme, "https") != 0
          && g_ascii_strcasecmp (scheme, "ws") != 0 && g_ascii_strcasecmp (scheme, "wss") != 0))
    {
      g_printerr ("gepard-bench: %s is not an http://, https://, ws:// or wss:// URL\n", o->url);
      return 2;
    }
  /* the route below the URL's path, its query kept (?api_key=… works too) */
  g_autofree char *path = g_strdup (g_uri_get_path (base));
  while (g_str_has_suffix (path, "/"))
    path[strlen (path) - 1] = '\0';
  g_autofree char *route = g_strconcat (path, "/tts/websocket", NULL);
  g_autoptr (GUri) target
      = g_uri_build (G_URI_FLAGS_NONE, scheme, g_uri_get_userinfo (base), g_uri_get_host (base),
                     g_uri_get_port (base), route, g_uri_get_query (base), NULL);
  g_autofree char *ws_url = g_uri_to_string (target);
  g_autoptr (SoupMessage) probe = soup_message_new (SOUP_METHOD_GET, ws_url);
  if (probe == NULL)
    {
      g_printerr ("gepard-bench: %s is not a URL to connect to\n", ws_url);
      return 2;
    }

  g_auto (GStrv) levels = g_strsplit (o->concurrency, ",", -1);
  int max_c = 1;
  for (guint i = 0; levels[i] != NULL; i++)
    max_c = MAX (max_c, atoi (levels[i]));
  raise_fd_limit (max_c);

  g_print ("server %s, %d sentences of %d frames per stream (forced), %s at %d Hz\n", ws_url,
           o->sentences, o->frames, o->encoding, o->sample_rate);
  g_print ("%6s %10s %10s %10s %8s %8s %8s %12s %9s %7s\n", "C", "TTFA p50", "p90", "p99",
           "RTF p50", "p90", "p99", "aggregate", "wall", "errors");
  g_autoptr (GString) json = g_string_new (NULL);
  int errors = 0;
  for (guint i = 0; levels[i] != NULL; i++)
    {
      int n = atoi (levels[i]);
      if (n >= 1)
        run_level (o, ws_url, n, (double)bytes_per_sample * o->sample_rate, &errors, json);
    }
  g_print ("%s", json->str);
  return errors > 0 ? 1 : 0;
}
