/* gepard-server.h: the state every route shares, owned by the main loop's thread. */
#pragma once

#include "gepard-api-error.h"
#include "gepard-engine-pool.h"
#include "gepard-metrics.h"
#include "gepard-protocol.h"
#include "gepard-server-config.h"
#include "gepard-tts-session.h"
#include "gepard-voice-store.h"

#include <libsoup/soup.h>

G_BEGIN_DECLS

typedef struct
{
  GepardServerConfig config;
  SoupServer *soup;
  GepardMetrics *metrics;
  GHashTable *pipelines; /* file name in pipelines/ → description */

  /* NULL until the model has loaded on its worker thread: one engine per GPU, or one on the CPU */
  GepardEnginePool *engines;
  GepardVoiceStore *voices;
  GepardVoiceDbCluster *cluster; /* the private PostgreSQL cluster, when this server runs one */
  char *loading_reason;          /* why the server is not ready, while engines is NULL */
  gboolean downloading;          /* the model is being fetched from the hub (/health says so) */

  /* Shutdown (gepard-server.c): after SIGTERM or SIGINT the server drains: new requests and
   * contexts get 503, those under way finish until the deadline, then what is left is ended. */
  gboolean draining;
  guint requests_in_flight; /* HTTP requests not yet finished (WebSocket upgrades aside) */
  GHashTable *websockets;   /* the open WebSocket connections (gepard-routes-websocket.c) */
  GHashTable *generations;  /* the HTTP generations under way (gepard-routes-tts.c) */
} GepardServer;

/* What a request or context refused while the server drains is told (503). */
#define GEPARD_SERVER_DRAINING_MESSAGE                                                             \
  "The server is shutting down and takes no new work: retry on another instance"
/* What a generation still running at the shutdown deadline is told (503). */
#define GEPARD_SERVER_SHUTDOWN_MESSAGE                                                             \
  "The server is shutting down: this generation was stopped before its end; retry on another "     \
  "instance"

/* ---- gepard-server-http.c: what every route does the same way ---- */

/* Cartesia-Version from the header or the cartesia_version query parameter; with `query_wins`
 * (WebSockets) the parameter is preferred. */
guint gepard_http_get_version (SoupServerMessage *msg, GHashTable *query, gboolean query_wins);
/* TRUE when no key is configured or the request carries it (api_key or access_token parameter,
 * X-API-Key, Authorization: Bearer). */
gboolean gepard_http_check_api_key (GepardServer *server, SoupServerMessage *msg,
                                    GHashTable *query);
/* Adds the CORS headers when the request's Origin is configured; answers a preflight (returns
 * TRUE: nothing more to do). */
gboolean gepard_http_handle_cors (GepardServer *server, SoupServerMessage *msg);
/* Whether a browser page of `origin` may use the server: a configured CORS origin, or, while the
 * playground is served, the server's own origin (the one `msg` was sent to). */
gboolean gepard_http_origin_allowed (GepardServer *server, SoupServerMessage *msg,
                                     const char *origin);
/* A complete error response in the shape of `version`. */
void gepard_http_send_error (SoupServerMessage *msg, guint version, const GError *error,
                             const char *request_id);
void gepard_http_send_json (SoupServerMessage *msg, guint status, JsonNode *body);
/* The request body, or NULL with GEPARD_API_ERROR_PAYLOAD_TOO_LARGE when it was over the limit
 * (see gepard_http_limit_body). */
GBytes *gepard_http_get_body (SoupServerMessage *msg, GError **error);
/* Early handler: keeps at most max_body_bytes of any request body in memory. */
void gepard_http_limit_body (SoupServer *soup, SoupServerMessage *msg, const char *path,
                             GHashTable *query, gpointer user_data);
/* A new request id for error bodies and logs. */
char *gepard_http_new_request_id (void);

/* ---- routes ---- */

/* gepard-routes-tts.c: POST /tts/bytes and POST /tts/sse */
void gepard_routes_tts_bytes (GepardServer *server, SoupServerMessage *msg, GHashTable *query,
                              guint version);
void gepard_routes_tts_sse (GepardServer *server, SoupServerMessage *msg, GHashTable *query,
                            guint version);
/* Ends every HTTP generation under way with an error (GEPARD_SERVER_SHUTDOWN_MESSAGE). */
void gepard_routes_tts_shutdown (GepardServer *server);
/* gepard-routes-websocket.c: /tts/websocket */
void gepard_routes_websocket_register (GepardServer *server);
/* Contexts under way and messages waiting for a voice, all sockets together. */
guint gepard_routes_websocket_count_busy (GepardServer *server);
/* Closes every socket with nothing under way with 1001 (going away); with `force`, first ends
 * every context with an error (GEPARD_SERVER_SHUTDOWN_MESSAGE). */
void gepard_routes_websocket_shutdown (GepardServer *server, gboolean force);
/* gepard-routes-info.c: /, /health, /metrics */
void gepard_routes_root (GepardServer *server, SoupServerMessage *msg, guint version);
void gepard_routes_health (GepardServer *server, SoupServerMessage *msg);
void gepard_routes_metrics (GepardServer *server, SoupServerMessage *msg);
/* gepard-routes-playground.c: the playground page (GET / asked for as HTML) and its files under
 * /playground/, compiled in; they need no key */
/* Whether `msg` is a browser asking for a page: a GET or HEAD of / that accepts text/html. */
gboolean gepard_routes_playground_wants_page (SoupServerMessage *msg, const char *path);
void gepard_routes_playground (GepardServer *server, SoupServerMessage *msg, const char *path,
                               GHashTable *query, guint version);
/* gepard-routes-voices.c: GET /voices, GET and DELETE /voices/{id}, POST /voices/clone */
void gepard_routes_voices (GepardServer *server, SoupServerMessage *msg, const char *path,
                           GHashTable *query, guint version);

/* gepard-routes-tts.c: the checks and setup every generation shares */
/* The voice `voice_id` ready in the engine's registry: at once when it is already known, else
 * from the voice store (without blocking). Completes in the caller's main context with a
 * GepardVoice or an API error. */
void gepard_server_resolve_voice_async (GepardServer *server, const char *voice_id,
                                        GCancellable *cancellable, GAsyncReadyCallback callback,
                                        gpointer user_data);
GepardVoice *gepard_server_resolve_voice_finish (GAsyncResult *result, GError **error);
/* The session setup for a request's output format and voice — with Gepard's benchmark extension
 * (a fixed length per sentence within the server's own limit) — or an API error (unknown voice,
 * no model yet, too many generations). */
gboolean gepard_server_prepare_generation (GepardServer *server, const GepardTtsRequest *request,
                                           GepardTtsSessionSetup *setup, GError **error);

G_END_DECLS
