/* gepard-routes-tts.c: POST /tts/bytes and POST /tts/sse (cartesia-protocol.md §2.1, §2.2).
 *
 * Each request is one generation whose audio streams out as it is produced: the response is
 * paused until the first audio, so that an error before it still gets its own status, then
 * written chunk by chunk. A client that goes away stops its generation, and one that reads slowly
 * holds it: past a quarter of --max-send-buffer-bytes written to the response and not yet to the
 * socket, the generation waits until half of that has gone out. */
#include "gepard-server.h"

#include <string.h>

typedef struct
{
  GepardServer *server;
  SoupServerMessage *msg;
  GepardTtsSession *session; /* NULL once ended */
  gboolean sse;
  gboolean add_timestamps;
  GepardOutputFormat format;
  char *context_id; /* echoed in SSE events */
  char *request_id;
  guint version;
  gboolean responding; /* status and headers are set */
  gint64 last_chunk_time;
  gsize unsent;             /* response bytes not yet written to the socket */
  gboolean held;            /* the session is held until the client has read */
  GepardTtsRequest request; /* while its voice is being fetched */
  GCancellable *cancellable;
} HttpGeneration;

static void
on_voice_resolved (GObject *source, GAsyncResult *result, gpointer user_data)
{
  GTask *task = user_data;
  GError *error = NULL;
  GepardVoice *voice = gepard_voice_store_get_finish (result, &error);
  if (voice == NULL)
    g_task_return_error (task, error);
  else
    g_task_return_pointer (task, voice, (GDestroyNotify)gepard_voice_unref);
  g_object_unref (task);
}

void
gepard_server_resolve_voice_async (GepardServer *server, const char *voice_id,
                                   GCancellable *cancellable, GAsyncReadyCallback callback,
                                   gpointer user_data)
{
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, gepard_server_resolve_voice_async);
  if (server->voices == NULL)
    {
      g_task_return_new_error (task, GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                               "The server is not ready: %s", server->loading_reason);
      g_object_unref (task);
      return;
    }
  if (voice_id == NULL)
    {
      g_task_return_new_error (task, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                               "voice is required: give a voice id such as \"default\"");
      g_object_unref (task);
      return;
    }
  /* the engine's registry or the store's cache: no waiting */
  GepardVoice *voice = gepard_voice_store_lookup (server->voices, voice_id);
  if (voice != NULL)
    {
      g_task_return_pointer (task, voice, (GDestroyNotify)gepard_voice_unref);
      g_object_unref (task);
      return;
    }
  gepard_voice_store_get_async (server->voices, voice_id, cancellable, on_voice_resolved, task);
}

GepardVoice *
gepard_server_resolve_voice_finish (GAsyncResult *result, GError **error)
{
  return g_task_propagate_pointer (G_TASK (result), error);
}

gboolean
gepard_server_prepare_generation (GepardServer *server, const GepardTtsRequest *request,
                                  GepardTtsSessionSetup *setup, GError **error)
{
  const char *voice_id = request->voice_id;
  const GepardOutputFormat *format = &request->output_format;
  if (server->engines == NULL)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                   "The server is not ready: %s", server->loading_reason);
      return FALSE;
    }
  if (voice_id == NULL)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "voice is required: give a voice id such as \"default\"");
      return FALSE;
    }
  g_autoptr (GepardVoice) voice = gepard_voice_store_lookup (server->voices, voice_id);
  if (voice == NULL)
    {
      g_autofree char *shown = g_utf8_make_valid (voice_id, MIN (strlen (voice_id), 128));
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_VOICE_NOT_FOUND,
                   "Voice \"%s\" not found", shown);
      return FALSE;
    }
  if (gepard_metrics_get_active_contexts (server->metrics) >= (guint)server->config.max_contexts)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_TOO_MANY_CONTEXTS,
                   "Too many generations at once: this server runs at most %d; retry when one "
                   "has finished",
                   server->config.max_contexts);
      return FALSE;
    }
  const char *description
      = g_hash_table_lookup (server->pipelines, gepard_output_format_pipeline_name (format));
  if (description == NULL)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                   "No pipeline description for this output format");
      return FALSE;
    }

  memset (setup, 0, sizeof *setup);
  /* the least busy engine; the elements' device= names its device, so that they take it */
  setup->engine = gepard_engine_pool_pick (server->engines, &setup->device);
  setup->description = description;
  setup->model = server->config.model;
  setup->codec_path = server->config.codec;
  setup->format = *format;
  setup->max_frames = server->config.max_frames;
  /* Gepard's benchmark extension: a fixed length per sentence, within the server's own limit */
  if (request->max_frames > 0)
    setup->max_frames = setup->max_frames > 0 ? MIN (setup->max_frames, request->max_frames)
                                              : request->max_frames;
  setup->ignore_stop = request->ignore_stop;
  /* the caller's string: it outlives the setup, which gepard_tts_session_new copies */
  setup->voice_id = voice_id;
  return TRUE;
}

static void
http_generation_free (gpointer data)
{
  HttpGeneration *g = data;
  if (g->server->generations != NULL)
    g_hash_table_remove (g->server->generations, g);
  gepard_tts_request_clear (&g->request);
  g_clear_object (&g->cancellable);
  g_free (g->context_id);
  g_free (g->request_id);
  g_free (g);
}

static gsize
hold_limit (HttpGeneration *g)
{
  return (gsize)g->server->config.max_send_buffer_bytes / 4;
}

/* Appends to the response, holding the generation while the client is behind. */
static void
append_bytes (HttpGeneration *g, GBytes *bytes)
{
  soup_message_body_append_bytes (soup_server_message_get_response_body (g->msg), bytes);
  g->unsent += g_bytes_get_size (bytes);
  if (!g->held && g->session != NULL && g->unsent > hold_limit (g))
    {
      g->held = TRUE;
      gepard_tts_session_set_held (g->session, TRUE);
    }
}

static void
on_wrote_body_data (SoupServerMessage *msg, guint size, gpointer user_data)
{
  HttpGeneration *g = user_data;
  g->unsent -= MIN (g->unsent, size);
  if (g->held && g->unsent <= hold_limit (g) / 2)
    {
      g->held = FALSE;
      if (g->session != NULL)
        gepard_tts_session_set_held (g->session, FALSE);
    }
}

static void
send_sse_event (HttpGeneration *g, const char *event_name, char *json)
{
  char *frame = event_name != NULL ? g_strdup_printf ("event: %s\ndata: %s\n\n", event_name, json)
                                   : g_strdup_printf ("data: %s\n\n", json);
  g_free (json);
  g_autoptr (GBytes) bytes = g_bytes_new_take (frame, strlen (frame));
  append_bytes (g, bytes);
}

static void
begin_response (HttpGeneration *g)
{
  SoupMessageHeaders *headers = soup_server_message_get_response_headers (g->msg);

  g->responding = TRUE;
  soup_server_message_set_status (g->msg, SOUP_STATUS_OK, NULL);
  soup_message_headers_set_encoding (headers, SOUP_ENCODING_CHUNKED);
  /* what has been written is dropped, so that only what waits for the client is kept */
  soup_message_body_set_accumulate (soup_server_message_get_response_body (g->msg), FALSE);
  g_signal_connect (g->msg, "wrote-body-data", G_CALLBACK (on_wrote_body_data), g);
  if (g->sse)
    {
      soup_message_headers_set_content_type (headers, "text/event-stream", NULL);
      soup_message_headers_replace (headers, "Cache-Control", "no-cache");
      return;
    }
  soup_message_headers_set_content_type (headers, gepard_output_format_content_type (&g->format),
                                         NULL);
  if (g->format.container == GEPARD_CONTAINER_WAV)
    {
      g_autoptr (GBytes) header = gepard_output_format_wav_header (&g->format);
      append_bytes (g, header);
    }
}

/* The generation is over, one way or another: stop it and account for it. */
static void
end_generation (HttpGeneration *g, const char *outcome)
{
  if (g->session == NULL)
    return;
  double latency = gepard_tts_session_get_first_audio_latency (g->session);
  if (latency >= 0)
    gepard_metrics_observe_first_audio (g->server->metrics, latency);
  gepard_tts_session_close (g_steal_pointer (&g->session));
  gepard_metrics_context_ended (g->server->metrics, outcome);
}

static void
on_audio (GepardTtsSession *session, GBytes *audio, gpointer user_data)
{
  HttpGeneration *g = user_data;
  gint64 now = g_get_monotonic_time ();

  if (!g->responding)
    begin_response (g);
  if (g->sse)
    {
      gsize size;
      const guint8 *data = g_bytes_get_data (audio, &size);
      send_sse_event (
          g, NULL,
          gepard_event_chunk (g->context_id, data, size, (now - g->last_chunk_time) / 1000.0, 0));
    }
  else
    append_bytes (g, audio);
  g->last_chunk_time = now;
  soup_server_message_unpause (g->msg);
}

static void
on_sentence (GepardTtsSession *session, const char *text, double start, double end,
             gpointer user_data)
{
  HttpGeneration *g = user_data;
  if (!g->sse || !g->add_timestamps)
    return;
  if (!g->responding)
    begin_response (g);
  g_autoptr (GepardWordTimes) times = gepard_word_times_new (text, start, end);
  if (times->words->len > 0)
    send_sse_event (g, NULL, gepard_event_timestamps (g->context_id, times));
  soup_server_message_unpause (g->msg);
}

/* The response's end: the error's status or event when there is one. */
static void
finish_generation (HttpGeneration *g, const GError *error, const char *outcome)
{
  if (error != NULL && !g->responding)
    gepard_http_send_error (g->msg, g->version, error, g->request_id);
  else
    {
      if (!g->responding)
        begin_response (g);
      /* after audio has gone out the status cannot change: SSE says so in an event, raw
       * audio just ends early */
      if (g->sse)
        send_sse_event (g, error != NULL ? "error" : NULL,
                        error != NULL ? gepard_event_error (g->context_id, error, g->request_id)
                                      : gepard_event_done (g->context_id));
      soup_message_body_complete (soup_server_message_get_response_body (g->msg));
    }
  end_generation (g, outcome);
  soup_server_message_unpause (g->msg);
}

static void
on_done (GepardTtsSession *session, const GError *error, gpointer user_data)
{
  finish_generation (user_data, error, error != NULL ? "error" : "done");
}

static const GepardTtsSessionCallbacks http_callbacks = {
    on_audio,
    on_sentence,
    NULL,
    on_done,
};

static void
free_closure_data (gpointer data, GClosure *closure)
{
  http_generation_free (data);
}

static void
on_message_finished (SoupServerMessage *msg, gpointer user_data)
{
  HttpGeneration *g = user_data;
  g_hash_table_remove (g->server->generations, g);
  /* still fetching its voice or generating: the client went away */
  if (g->cancellable != NULL)
    g_cancellable_cancel (g->cancellable);
  end_generation (g, "disconnected");
}

/* The request, checked, into g->request. */
static gboolean
parse_request (GepardServer *server, SoupServerMessage *msg, HttpGeneration *g, GError **error)
{
  g_autoptr (GBytes) body = gepard_http_get_body (msg, error);
  if (body == NULL)
    return FALSE;
  gsize size;
  const char *data = g_bytes_get_data (body, &size);
  return gepard_tts_request_parse (data != NULL ? data : "", size, &g->request, error)
         && gepard_tts_request_check_http (&g->request, g->sse, server->config.max_transcript_chars,
                                           error);
}

/* Once the request's voice is in the engine's registry. */
static gboolean
start_generation (GepardServer *server, HttpGeneration *g, GError **error)
{
  GepardTtsRequest *request = &g->request;
  GepardTtsSessionSetup setup;
  if (!gepard_server_prepare_generation (server, request, &setup, error))
    return FALSE;
  g->format = request->output_format;
  g->add_timestamps = request->add_timestamps;
  g->context_id = g_steal_pointer (&request->context_id);

  GepardTtsSession *session = gepard_tts_session_new (&setup, &http_callbacks, g, error);
  if (session == NULL)
    return FALSE;
  if (!gepard_tts_session_start (session, error)
      || !gepard_tts_session_push_text (session, request->transcript, error))
    {
      gepard_tts_session_close (session);
      return FALSE;
    }
  gepard_tts_session_end_input (session);
  g->session = session;
  g->last_chunk_time = g_get_monotonic_time ();
  gepard_metrics_context_started (server->metrics);
  return TRUE;
}

static void
send_failure (HttpGeneration *g, const GError *error)
{
  if (gepard_api_error_get_status (error) == 500)
    g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_WARNING, "MESSAGE", "%s: %s", g->request_id,
                      error->message);
  gepard_http_send_error (g->msg, g->version, error, g->request_id);
}

static void
on_request_voice (GObject *source, GAsyncResult *result, gpointer user_data)
{
  HttpGeneration *g = user_data;
  /* the reference taken in handle keeps g alive until here */
  g_autoptr (SoupServerMessage) msg = g->msg;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoice) voice = gepard_server_resolve_voice_finish (result, &error);

  /* the client went away meanwhile */
  if (g_cancellable_is_cancelled (g->cancellable))
    return;
  g_clear_object (&g->cancellable);
  if (voice == NULL || !start_generation (g->server, g, &error))
    {
      send_failure (g, error);
      soup_server_message_unpause (g->msg);
    }
}

static void
handle (GepardServer *server, SoupServerMessage *msg, guint version, gboolean sse)
{
  g_autoptr (GError) error = NULL;
  HttpGeneration *g = g_new0 (HttpGeneration, 1);
  g->server = server;
  g->msg = msg;
  g->sse = sse;
  g->version = version;
  g->request_id = gepard_http_new_request_id ();

  if (!g_str_equal (soup_server_message_get_method (msg), "POST"))
    g_set_error_literal (&error, GEPARD_API_ERROR, GEPARD_API_ERROR_METHOD_NOT_ALLOWED, "Use POST");
  if (error != NULL || !parse_request (server, msg, g, &error))
    {
      send_failure (g, error);
      http_generation_free (g);
      return;
    }
  /* the message lives until it is finished, normally or not; the generation with it */
  g_signal_connect_data (msg, "finished", G_CALLBACK (on_message_finished), g, free_closure_data,
                         0);
  soup_server_message_pause (msg);
  g_hash_table_add (server->generations, g);
  g->cancellable = g_cancellable_new ();
  g_object_ref (msg);
  gepard_server_resolve_voice_async (server, g->request.voice_id, g->cancellable, on_request_voice,
                                     g);
}

void
gepard_routes_tts_bytes (GepardServer *server, SoupServerMessage *msg, GHashTable *query,
                         guint version)
{
  handle (server, msg, version, FALSE);
}

void
gepard_routes_tts_sse (GepardServer *server, SoupServerMessage *msg, GHashTable *query,
                       guint version)
{
  handle (server, msg, version, TRUE);
}

void
gepard_routes_tts_shutdown (GepardServer *server)
{
  g_autoptr (GError) error = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                                                  GEPARD_SERVER_SHUTDOWN_MESSAGE);
  GList *all = g_hash_table_get_keys (server->generations);
  for (GList *l = all; l != NULL; l = l->next)
    {
      HttpGeneration *g = l->data;
      if (g->session != NULL)
        finish_generation (g, error, "shutdown");
      else if (g->cancellable != NULL && !g_cancellable_is_cancelled (g->cancellable))
        {
          /* still fetching its voice: on_request_voice will find it cancelled */
          g_cancellable_cancel (g->cancellable);
          send_failure (g, error);
          soup_server_message_unpause (g->msg);
        }
    }
  g_list_free (all);
}
