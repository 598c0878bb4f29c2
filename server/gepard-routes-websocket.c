/* gepard-routes-websocket.c: /tts/websocket, many contexts on one socket (cartesia-protocol.md
 * §3).
 *
 * Every context is its own generation. Its events carry its context_id; it ends with exactly one
 * done or error, after which nothing more is sent for it, and a cancel ends it silently. Ids of
 * ended contexts are remembered for a while so that late input for them (a closing message
 * racing a cancel) is dropped rather than starting a generation nobody waits for.
 *
 * Output: events wait in the socket's own queue and go to libsoup only while the socket can take
 * them, so what waits for a slow client is known. Past a quarter of --max-send-buffer-bytes the
 * socket's generations are held (their pipelines stop until the client reads); past all of it,
 * which only a client that sends and never reads can cause, the socket is closed with 1008. */
#include "gepard-server.h"

#include <string.h>

/* how many ended context ids a socket remembers */
#define MAX_REMEMBERED_IDS 1024
/* messages that may wait for a voice to be fetched, per socket */
#define MAX_WAITING_MESSAGES 1024
/* how long a close handshake may take before the connection is dropped */
#define CLOSE_TIMEOUT_SECONDS 3

typedef struct
{
  GepardServer *server;
  SoupWebsocketConnection *conn;
  GHashTable *contexts; /* id → WsContext */
  GHashTable *ended;    /* ids of ended contexts */
  GQueue ended_order;   /* the same ids, oldest first (owned by `ended`) */
  /* While the voice of a new context is fetched from the store, this socket's messages wait here
   * (GBytes, that context's first), so that they still apply in order. */
  GQueue waiting;
  gsize waiting_bytes;
  GCancellable *cancellable; /* the fetch, cancelled when the socket closes */

  /* output not yet handed to libsoup */
  GPollableOutputStream *output; /* the socket's; NULL when it cannot be polled */
  GQueue outgoing;               /* char *, JSON texts */
  gsize outgoing_bytes;
  GSource *writable; /* waits for the socket to take more */
  gboolean held;     /* the contexts' generations are held */
  gboolean closing;  /* a close follows the queued output; nothing more is queued */
  gushort close_code;
  char *close_reason;
  guint close_timeout; /* drops the connection when the close handshake does not end */
} WsConnection;

typedef struct
{
  WsConnection *conn;
  char *id;
  GepardTtsSession *session;
  gboolean add_timestamps;
  glong chars;
  gint64 last_chunk_time;
} WsContext;

/* ---- output ---- */

static gsize
hold_limit (WsConnection *c)
{
  return (gsize)c->server->config.max_send_buffer_bytes / 4;
}

static void
hold_contexts (WsConnection *c, gboolean held)
{
  GHashTableIter iter;
  gpointer value;
  c->held = held;
  g_hash_table_iter_init (&iter, c->contexts);
  while (g_hash_table_iter_next (&iter, NULL, &value))
    gepard_tts_session_set_held (((WsContext *)value)->session, held);
}

static gboolean
on_close_timeout (gpointer user_data)
{
  WsConnection *c = user_data;
  c->close_timeout = 0;
  /* the client neither reads nor answers the close: drop the connection (closed follows) */
  g_io_stream_close (soup_websocket_connection_get_io_stream (c->conn), NULL, NULL);
  return G_SOURCE_REMOVE;
}

static gboolean flush_outgoing (WsConnection *c);

static gboolean
on_writable (GObject *stream, gpointer user_data)
{
  WsConnection *c = user_data;
  g_clear_pointer (&c->writable, g_source_unref);
  flush_outgoing (c);
  return G_SOURCE_REMOVE;
}

/* Hands queued output to libsoup while the socket takes it, then closes when asked to and all
 * is out. Returns FALSE when output still waits. */
static gboolean
flush_outgoing (WsConnection *c)
{
  char *text;

  if (soup_websocket_connection_get_state (c->conn) != SOUP_WEBSOCKET_STATE_OPEN)
    {
      g_queue_clear_full (&c->outgoing, g_free);
      c->outgoing_bytes = 0;
      return TRUE;
    }
  while ((c->output == NULL || g_pollable_output_stream_is_writable (c->output))
         && (text = g_queue_pop_head (&c->outgoing)) != NULL)
    {
      c->outgoing_bytes -= strlen (text);
      soup_websocket_connection_send_text (c->conn, text);
      g_free (text);
    }
  if (c->held && c->outgoing_bytes <= hold_limit (c) / 2)
    hold_contexts (c, FALSE);
  if (!g_queue_is_empty (&c->outgoing))
    {
      if (c->writable == NULL)
        {
          c->writable = g_pollable_output_stream_create_source (c->output, NULL);
          g_source_set_callback (c->writable, G_SOURCE_FUNC (on_writable), c, NULL);
          g_source_attach (c->writable, NULL);
        }
      return FALSE;
    }
  if (c->closing && c->close_timeout == 0)
    {
      soup_websocket_connection_close (c->conn, c->close_code, c->close_reason);
      c->close_timeout = g_timeout_add_seconds (CLOSE_TIMEOUT_SECONDS, on_close_timeout, c);
    }
  return TRUE;
}

/* Closes after the output queued so far; nothing more is sent. */
static void
close_connection (WsConnection *c, gushort code, const char *reason)
{
  if (c->closing)
    return;
  c->closing = TRUE;
  c->close_code = code;
  c->close_reason = g_strdup (reason);
  flush_outgoing (c);
}

static void abort_contexts (WsConnection *c, const char *outcome);

static void
send_text (WsConnection *c, char *text)
{
  gsize size = strlen (text);

  if (c->closing || soup_websocket_connection_get_state (c->conn) != SOUP_WEBSOCKET_STATE_OPEN)
    {
      g_free (text);
      return;
    }
  g_queue_push_tail (&c->outgoing, text);
  c->outgoing_bytes += size;
  if (flush_outgoing (c))
    return;
  if (c->outgoing_bytes > (gsize)c->server->config.max_send_buffer_bytes)
    {
      /* held generations cannot get here: only a client that keeps sending and never reads */
      g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_MESSAGE, "MESSAGE",
                        "closing a WebSocket whose client does not read: %" G_GSIZE_FORMAT
                        " bytes wait to be sent",
                        c->outgoing_bytes);
      g_queue_clear_full (&c->outgoing, g_free);
      c->outgoing_bytes = 0;
      abort_contexts (c, "error");
      close_connection (c, SOUP_WEBSOCKET_CLOSE_POLICY_VIOLATION,
                        "The client does not read: too much output waits to be sent");
    }
  else if (!c->held && c->outgoing_bytes > hold_limit (c))
    hold_contexts (c, TRUE);
}

static void
send_error (WsConnection *c, const char *context_id, const GError *error)
{
  g_autofree char *request_id = gepard_http_new_request_id ();
  if (gepard_api_error_get_status (error) == 500)
    g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_WARNING, "MESSAGE", "%s: context %s: %s",
                      request_id, context_id != NULL ? context_id : "(none)", error->message);
  send_text (c, gepard_event_error (context_id, error, request_id));
}

static void
remember_ended (WsConnection *c, const char *id)
{
  if (g_hash_table_contains (c->ended, id))
    return;
  char *copy = g_strdup (id);
  g_hash_table_add (c->ended, copy);
  g_queue_push_tail (&c->ended_order, copy);
  if (g_queue_get_length (&c->ended_order) > MAX_REMEMBERED_IDS)
    g_hash_table_remove (c->ended, g_queue_pop_head (&c->ended_order));
}

static void
context_free (gpointer data)
{
  WsContext *ctx = data;
  g_free (ctx->id);
  g_free (ctx);
}

/* Stops the context's generation and forgets it; nothing is sent for it afterwards. */
static void
end_context (WsContext *ctx, const char *outcome)
{
  WsConnection *c = ctx->conn;
  double latency = gepard_tts_session_get_first_audio_latency (ctx->session);
  if (latency >= 0)
    gepard_metrics_observe_first_audio (c->server->metrics, latency);
  gepard_tts_session_close (g_steal_pointer (&ctx->session));
  gepard_metrics_context_ended (c->server->metrics, outcome);
  remember_ended (c, ctx->id);
  g_hash_table_remove (c->contexts, ctx->id); /* frees ctx */
}

/* ---- generation events ---- */

static void
on_audio (GepardTtsSession *session, GBytes *audio, gpointer user_data)
{
  WsContext *ctx = user_data;
  gint64 now = g_get_monotonic_time ();
  gsize size;
  const guint8 *data = g_bytes_get_data (audio, &size);
  send_text (ctx->conn,
             gepard_event_chunk (ctx->id, data, size, (now - ctx->last_chunk_time) / 1000.0, 0));
  ctx->last_chunk_time = now;
}

static void
on_sentence (GepardTtsSession *session, const char *text, double start, double end,
             gpointer user_data)
{
  WsContext *ctx = user_data;
  if (!ctx->add_timestamps)
    return;
  g_autoptr (GepardWordTimes) times = gepard_word_times_new (text, start, end);
  if (times->words->len > 0)
    send_text (ctx->conn, gepard_event_timestamps (ctx->id, times));
}

static void
on_flushed (GepardTtsSession *session, guint flush_id, gpointer user_data)
{
  WsContext *ctx = user_data;
  send_text (ctx->conn, gepard_event_flush_done (ctx->id, flush_id));
}

static void
on_done (GepardTtsSession *session, const GError *error, gpointer user_data)
{
  WsContext *ctx = user_data;
  if (error != NULL)
    send_error (ctx->conn, ctx->id, error);
  else
    send_text (ctx->conn, gepard_event_done (ctx->id));
  end_context (ctx, error != NULL ? "error" : "done");
}

static const GepardTtsSessionCallbacks ws_callbacks = {
    on_audio,
    on_sentence,
    on_flushed,
    on_done,
};

/* ---- client messages ---- */

static WsContext *
open_context (WsConnection *c, const char *id, GepardTtsRequest *request, GError **error)
{
  GepardServer *server = c->server;

  if (!gepard_tts_request_check_new_context (request, error))
    return NULL;
  if (server->draining)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                           GEPARD_SERVER_DRAINING_MESSAGE);
      return NULL;
    }
  if (g_hash_table_size (c->contexts) >= (guint)server->config.max_contexts_per_socket)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_TOO_MANY_CONTEXTS,
                   "Too many contexts at once on this connection: at most %d; wait for a "
                   "context's done, or cancel one",
                   server->config.max_contexts_per_socket);
      return NULL;
    }
  GepardTtsSessionSetup setup;
  if (!gepard_server_prepare_generation (server, request, &setup, error))
    return NULL;

  WsContext *ctx = g_new0 (WsContext, 1);
  ctx->conn = c;
  ctx->id = g_strdup (id);
  ctx->add_timestamps = request->add_timestamps;
  ctx->last_chunk_time = g_get_monotonic_time ();
  ctx->session = gepard_tts_session_new (&setup, &ws_callbacks, ctx, error);
  if (ctx->session == NULL || !gepard_tts_session_start (ctx->session, error))
    {
      gepard_tts_session_close (ctx->session);
      context_free (ctx);
      return NULL;
    }
  if (c->held)
    gepard_tts_session_set_held (ctx->session, TRUE);
  g_hash_table_insert (c->contexts, ctx->id, ctx);
  gepard_metrics_context_started (server->metrics);
  return ctx;
}

/* Feeds one message's text, flush and end to its context. */
static gboolean
continue_context (WsContext *ctx, GepardTtsRequest *request, GError **error)
{
  GepardServer *server = ctx->conn->server;

  if (gepard_tts_session_input_ended (ctx->session))
    {
      if (gepard_text_is_blank (request->transcript))
        return TRUE; /* a repeated closing message */
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "Context has closed: it already received its last input");
      return FALSE;
    }
  if (request->transcript != NULL)
    {
      if (!g_utf8_validate (request->transcript, -1, NULL))
        {
          g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                               "transcript is not valid UTF-8");
          return FALSE;
        }
      ctx->chars += g_utf8_strlen (request->transcript, -1);
      if (ctx->chars > server->config.max_transcript_chars)
        {
          g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_TRANSCRIPT_TOO_LONG,
                       "The context's transcripts are longer than %d characters",
                       server->config.max_transcript_chars);
          return FALSE;
        }
      if (!gepard_tts_session_push_text (ctx->session, request->transcript, error))
        return FALSE;
    }
  ctx->add_timestamps |= request->add_timestamps;
  if (request->flush)
    gepard_tts_session_flush (ctx->session);
  if (!request->continue_)
    gepard_tts_session_end_input (ctx->session);
  return TRUE;
}

static void fetch_voice (WsConnection *c, const char *data, gsize size, const char *voice_id);

/* Whether a new context can open without waiting for its voice (or fails at once anyway). */
static gboolean
voice_at_hand (GepardServer *server, const char *voice_id)
{
  if (voice_id == NULL || server->voices == NULL)
    return TRUE;
  g_autoptr (GepardVoice) voice = gepard_voice_store_lookup (server->voices, voice_id);
  return voice != NULL;
}

static void
handle_request (WsConnection *c, const char *data, gsize size)
{
  g_autoptr (GError) error = NULL;
  g_auto (GepardTtsRequest) request = {0};

  if (!gepard_tts_request_parse (data, size, &request, &error))
    {
      WsContext *ctx = request.context_id != NULL
                           ? g_hash_table_lookup (c->contexts, request.context_id)
                           : NULL;
      if (request.context_id != NULL && g_hash_table_contains (c->ended, request.context_id))
        return;
      send_error (c, request.context_id, error);
      if (ctx != NULL)
        end_context (ctx, "error");
      else if (request.context_id != NULL)
        remember_ended (c, request.context_id);
      return;
    }

  if (request.cancel)
    {
      /* cancelling a context that has ended (or never was) is a no-op: clients cancel on
       * barge-in without knowing whether the context is still speaking */
      WsContext *ctx = request.context_id != NULL
                           ? g_hash_table_lookup (c->contexts, request.context_id)
                           : NULL;
      if (ctx != NULL)
        end_context (ctx, "cancelled");
      else if (request.context_id != NULL)
        remember_ended (c, request.context_id);
      return;
    }

  g_autofree char *generated = request.context_id == NULL ? g_uuid_string_random () : NULL;
  const char *id = request.context_id != NULL ? request.context_id : generated;
  if (g_hash_table_contains (c->ended, id))
    {
      g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_DEBUG, "MESSAGE",
                        "input for the ended context %s dropped", id);
      return;
    }

  WsContext *ctx = g_hash_table_lookup (c->contexts, id);
  if (ctx == NULL && !voice_at_hand (c->server, request.voice_id))
    {
      fetch_voice (c, data, size, request.voice_id);
      return;
    }
  if (ctx == NULL)
    {
      ctx = open_context (c, id, &request, &error);
      if (ctx == NULL)
        {
          send_error (c, id, error);
          remember_ended (c, id);
          return;
        }
    }
  if (!continue_context (ctx, &request, &error))
    {
      send_error (c, id, error);
      end_context (ctx, "error");
    }
}

static void
handle_waiting (WsConnection *c)
{
  while (c->cancellable == NULL && !c->closing && !g_queue_is_empty (&c->waiting))
    {
      g_autoptr (GBytes) message = g_queue_pop_head (&c->waiting);
      gsize size;
      const char *data = g_bytes_get_data (message, &size);
      c->waiting_bytes -= size;
      handle_request (c, data != NULL ? data : "", size);
    }
}

static void
on_voice_fetched (GObject *source, GAsyncResult *result, gpointer user_data)
{
  WsConnection *c = user_data;
  /* the reference taken in fetch_voice keeps c alive until here */
  g_autoptr (SoupWebsocketConnection) conn = c->conn;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) voice = gepard_server_resolve_voice_finish (result, &error);

  if (g_cancellable_is_cancelled (c->cancellable))
    {
      g_clear_object (&c->cancellable);
      return;
    }
  g_clear_object (&c->cancellable);
  if (voice == NULL)
    {
      /* the context that asked for the voice fails; the messages after it go on */
      g_autoptr (GBytes) message = g_queue_pop_head (&c->waiting);
      gsize size;
      const char *data = g_bytes_get_data (message, &size);
      c->waiting_bytes -= size;
      g_auto (GepardTtsRequest) request = {0};
      if (gepard_tts_request_parse (data != NULL ? data : "", size, &request, NULL)
          && request.context_id != NULL)
        {
          send_error (c, request.context_id, error);
          remember_ended (c, request.context_id);
        }
      else
        send_error (c, NULL, error);
    }
  handle_waiting (c);
}

static void
fetch_voice (WsConnection *c, const char *data, gsize size, const char *voice_id)
{
  g_queue_push_head (&c->waiting, g_bytes_new (data, size));
  c->waiting_bytes += size;
  c->cancellable = g_cancellable_new ();
  g_object_ref (c->conn);
  gepard_server_resolve_voice_async (c->server, voice_id, c->cancellable, on_voice_fetched, c);
}

static void
on_message (SoupWebsocketConnection *conn, SoupWebsocketDataType type, GBytes *message,
            gpointer user_data)
{
  WsConnection *c = user_data;

  if (type != SOUP_WEBSOCKET_DATA_TEXT)
    {
      g_autoptr (GError) error = g_error_new_literal (
          GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST, "Send requests as JSON text frames");
      send_error (c, NULL, error);
      return;
    }
  gsize size;
  const char *data = g_bytes_get_data (message, &size);
  if (size > (gsize)c->server->config.max_body_bytes)
    {
      g_autoptr (GError) error
          = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_PAYLOAD_TOO_LARGE,
                         "The message is larger than %" G_GINT64_FORMAT " bytes",
                         c->server->config.max_body_bytes);
      send_error (c, NULL, error);
      return;
    }
  if (c->closing)
    return;
  if (c->cancellable != NULL)
    {
      if (g_queue_get_length (&c->waiting) >= MAX_WAITING_MESSAGES
          || c->waiting_bytes + size > 4 * (gsize)c->server->config.max_body_bytes)
        {
          g_autoptr (GError) error = g_error_new (
              GEPARD_API_ERROR, GEPARD_API_ERROR_TOO_MANY_CONTEXTS,
              "Too many messages while a voice is being loaded: at most %d; wait for the "
              "context's first audio before sending more",
              MAX_WAITING_MESSAGES);
          send_error (c, NULL, error);
          abort_contexts (c, "error");
          close_connection (c, SOUP_WEBSOCKET_CLOSE_POLICY_VIOLATION,
                            "Too many messages while a voice is being loaded");
          return;
        }
      g_queue_push_tail (&c->waiting, g_bytes_ref (message));
      c->waiting_bytes += size;
      return;
    }
  handle_request (c, data != NULL ? data : "", size);
  handle_waiting (c);
}

/* Stops every context and the voice fetch, sending nothing for them. */
static void
abort_contexts (WsConnection *c, const char *outcome)
{
  GHashTableIter iter;
  gpointer value;

  if (c->cancellable != NULL)
    g_cancellable_cancel (c->cancellable);
  g_queue_clear_full (&c->waiting, (GDestroyNotify)g_bytes_unref);
  c->waiting_bytes = 0;
  g_hash_table_iter_init (&iter, c->contexts);
  while (g_hash_table_iter_next (&iter, NULL, &value))
    {
      WsContext *ctx = value;
      double latency = gepard_tts_session_get_first_audio_latency (ctx->session);
      if (latency >= 0)
        gepard_metrics_observe_first_audio (c->server->metrics, latency);
      gepard_tts_session_close (g_steal_pointer (&ctx->session));
      gepard_metrics_context_ended (c->server->metrics, outcome);
      remember_ended (c, ctx->id);
      g_hash_table_iter_remove (&iter);
    }
}

static void
on_closed (SoupWebsocketConnection *conn, gpointer user_data)
{
  WsConnection *c = user_data;

  /* the client went away (LiveKit closes the socket on barge-in): stop everything it started */
  abort_contexts (c, "disconnected");
  g_queue_clear_full (&c->outgoing, g_free);
  c->outgoing_bytes = 0;
  if (c->writable != NULL)
    {
      g_source_destroy (c->writable);
      g_clear_pointer (&c->writable, g_source_unref);
    }
  g_clear_handle_id (&c->close_timeout, g_source_remove);
  g_hash_table_remove (c->server->websockets, c);
  gepard_metrics_websocket_closed (c->server->metrics);
}

static void
connection_free (gpointer data, GClosure *closure)
{
  WsConnection *c = data;
  g_hash_table_unref (c->contexts);
  g_queue_clear (&c->ended_order);
  g_hash_table_unref (c->ended);
  g_queue_clear_full (&c->waiting, (GDestroyNotify)g_bytes_unref);
  g_clear_object (&c->cancellable);
  g_queue_clear_full (&c->outgoing, g_free);
  if (c->writable != NULL)
    {
      g_source_destroy (c->writable);
      g_source_unref (c->writable);
    }
  g_clear_handle_id (&c->close_timeout, g_source_remove);
  g_free (c->close_reason);
  g_free (c);
}

static void
on_websocket (SoupServer *soup, SoupServerMessage *msg, const char *path,
              SoupWebsocketConnection *conn, gpointer user_data)
{
  GepardServer *server = user_data;
  WsConnection *c = g_new0 (WsConnection, 1);
  c->server = server;
  c->conn = conn; /* kept alive by libsoup while it is open; the closed handler runs last */
  c->contexts = g_hash_table_new_full (g_str_hash, g_str_equal, NULL, context_free);
  c->ended = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  g_queue_init (&c->ended_order);
  g_queue_init (&c->waiting);
  g_queue_init (&c->outgoing);
  GOutputStream *output
      = g_io_stream_get_output_stream (soup_websocket_connection_get_io_stream (conn));
  if (G_IS_POLLABLE_OUTPUT_STREAM (output)
      && g_pollable_output_stream_can_poll (G_POLLABLE_OUTPUT_STREAM (output)))
    c->output = G_POLLABLE_OUTPUT_STREAM (output);
  g_hash_table_add (server->websockets, c);
  /* events carry both error shapes, so the version needs no remembering */
  soup_websocket_connection_set_max_incoming_payload_size (conn,
                                                           (guint64)server->config.max_body_bytes);
  g_object_ref (conn);
  g_signal_connect (conn, "message", G_CALLBACK (on_message), c);
  g_signal_connect_data (conn, "closed", G_CALLBACK (on_closed), c, connection_free, 0);
  g_signal_connect (conn, "closed", G_CALLBACK (g_object_unref), NULL);
  gepard_metrics_websocket_opened (server->metrics);
}

/* Runs before the upgrade: a refused key or origin fails the handshake with its status, as
 * clients expect (cartesia-protocol.md §3.1). */
static void
check_upgrade (SoupServer *soup, SoupServerMessage *msg, const char *path, GHashTable *query,
               gpointer user_data)
{
  GepardServer *server = user_data;
  g_autoptr (GError) error = NULL;
  guint version = gepard_http_get_version (msg, query, TRUE);
  const char *origin
      = soup_message_headers_get_one (soup_server_message_get_request_headers (msg), "Origin");

  if (!gepard_http_check_api_key (server, msg, query))
    error = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_UNAUTHORIZED,
                                 "Invalid or missing API key");
  /* browsers send an Origin: only configured ones may open a socket with a key they hold */
  else if (origin != NULL && !gepard_http_origin_allowed (server, msg, origin))
    error = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_FORBIDDEN,
                                 "This origin may not connect");
  else if (server->engines == NULL)
    error = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                         "The server is not ready: %s", server->loading_reason);
  else if (server->draining)
    error = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                                 GEPARD_SERVER_DRAINING_MESSAGE);
  if (error != NULL)
    {
      g_autofree char *request_id = gepard_http_new_request_id ();
      gepard_http_send_error (msg, version, error, request_id);
    }
}

void
gepard_routes_websocket_register (GepardServer *server)
{
  soup_server_add_handler (server->soup, "/tts/websocket", check_upgrade, server, NULL);
  soup_server_add_websocket_handler (server->soup, "/tts/websocket", NULL, NULL, on_websocket,
                                     server, NULL);
  /* Without compression the payload limit is the size of the message itself; with
   * permessage-deflate it would apply to the compressed bytes, and a small frame could inflate
   * to any size. Clients work either way (cartesia-protocol.md §3.1). */
  soup_server_remove_websocket_extension (server->soup, SOUP_TYPE_WEBSOCKET_EXTENSION_DEFLATE);
}

/* ---- shutdown ---- */

guint
gepard_routes_websocket_count_busy (GepardServer *server)
{
  GHashTableIter iter;
  gpointer key;
  guint busy = 0;

  g_hash_table_iter_init (&iter, server->websockets);
  while (g_hash_table_iter_next (&iter, &key, NULL))
    {
      WsConnection *c = key;
      busy += g_hash_table_size (c->contexts) + g_queue_get_length (&c->waiting);
    }
  return busy;
}

void
gepard_routes_websocket_shutdown (GepardServer *server, gboolean force)
{
  g_autoptr (GError) error = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                                                  GEPARD_SERVER_SHUTDOWN_MESSAGE);
  GList *all = g_hash_table_get_keys (server->websockets);

  for (GList *l = all; l != NULL; l = l->next)
    {
      WsConnection *c = l->data;
      if (c->closing)
        continue;
      if (force)
        {
          /* every context still open hears why it ends, then the socket closes */
          GList *ids = g_hash_table_get_keys (c->contexts);
          for (GList *i = ids; i != NULL; i = i->next)
            send_error (c, i->data, error);
          g_list_free (ids);
          if (!g_queue_is_empty (&c->waiting))
            {
              GBytes *first = g_queue_peek_head (&c->waiting);
              gsize size;
              const char *data = g_bytes_get_data (first, &size);
              g_auto (GepardTtsRequest) request = {0};
              if (gepard_tts_request_parse (data != NULL ? data : "", size, &request, NULL)
                  && request.context_id != NULL)
                send_error (c, request.context_id, error);
            }
          abort_contexts (c, "shutdown");
        }
      if (g_hash_table_size (c->contexts) == 0 && g_queue_is_empty (&c->waiting))
        close_connection (c, SOUP_WEBSOCKET_CLOSE_GOING_AWAY, "The server is shutting down");
    }
  g_list_free (all);
}
