/* gepard-server-http.c: versions, keys, CORS, body limits and error responses for every route. */
#include "gepard-server.h"

#include <string.h>

#define BODY_KEY "gepard-body"
#define OVERSIZE_KEY "gepard-body-oversize"

guint
gepard_http_get_version (SoupServerMessage *msg, GHashTable *query, gboolean query_wins)
{
  const char *header = soup_message_headers_get_one (soup_server_message_get_request_headers (msg),
                                                     "Cartesia-Version");
  const char *param = query != NULL ? g_hash_table_lookup (query, "cartesia_version") : NULL;
  if (param != NULL && (query_wins || header == NULL))
    return gepard_api_version_parse (param);
  return gepard_api_version_parse (header);
}

/* Compares digests rather than the strings so that neither the position of the first
 * difference nor the key's length shows in the time taken. */
static gboolean
key_matches (const char *candidate, const char *key)
{
  guint8 a[32], b[32];
  gsize na = sizeof a, nb = sizeof b;
  g_autoptr (GChecksum) ca = g_checksum_new (G_CHECKSUM_SHA256);
  g_autoptr (GChecksum) cb = g_checksum_new (G_CHECKSUM_SHA256);
  guint8 diff = 0;

  g_checksum_update (ca, (const guchar *)candidate, (gssize)strlen (candidate));
  g_checksum_update (cb, (const guchar *)key, (gssize)strlen (key));
  g_checksum_get_digest (ca, a, &na);
  g_checksum_get_digest (cb, b, &nb);
  for (gsize i = 0; i < sizeof a; i++)
    diff |= a[i] ^ b[i];
  return diff == 0;
}

gboolean
gepard_http_check_api_key (GepardServer *server, SoupServerMessage *msg, GHashTable *query)
{
  const char *key = server->config.api_key;
  if (key == NULL)
    return TRUE;

  SoupMessageHeaders *headers = soup_server_message_get_request_headers (msg);
  const char *candidates[4] = {
      soup_message_headers_get_one (headers, "X-API-Key"),
      NULL,
      query != NULL ? g_hash_table_lookup (query, "api_key") : NULL,
      query != NULL ? g_hash_table_lookup (query, "access_token") : NULL,
  };
  const char *authorization = soup_message_headers_get_one (headers, "Authorization");
  if (authorization != NULL && g_ascii_strncasecmp (authorization, "Bearer ", 7) == 0)
    candidates[1] = authorization + 7;

  gboolean ok = FALSE;
  for (gsize i = 0; i < G_N_ELEMENTS (candidates); i++)
    if (candidates[i] != NULL)
      ok |= key_matches (candidates[i], key);
  return ok;
}

gboolean
gepard_http_handle_cors (GepardServer *server, SoupServerMessage *msg)
{
  SoupMessageHeaders *request = soup_server_message_get_request_headers (msg);
  SoupMessageHeaders *response = soup_server_message_get_response_headers (msg);
  const char *origin = soup_message_headers_get_one (request, "Origin");
  gboolean preflight
      = g_str_equal (soup_server_message_get_method (msg), "OPTIONS")
        && soup_message_headers_get_one (request, "Access-Control-Request-Method") != NULL;

  if (origin != NULL)
    soup_message_headers_append (response, "Vary", "Origin");
  if (!gepard_server_config_allows_origin (&server->config, origin))
    {
      if (preflight)
        {
          soup_server_message_set_status (msg, SOUP_STATUS_FORBIDDEN, NULL);
          return TRUE;
        }
      return FALSE;
    }

  /* the origin itself, never "*", and no credentials: the key travels in a header */
  soup_message_headers_replace (response, "Access-Control-Allow-Origin", origin);
  if (!preflight)
    return FALSE;
  soup_message_headers_replace (response, "Access-Control-Allow-Methods",
                                "GET, POST, DELETE, OPTIONS");
  soup_message_headers_replace (response, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, Cartesia-Version, X-API-Key");
  soup_message_headers_replace (response, "Access-Control-Max-Age", "600");
  soup_server_message_set_status (msg, SOUP_STATUS_NO_CONTENT, NULL);
  return TRUE;
}

/* the port a URI names, or its scheme's */
static int
effective_port (GUri *uri)
{
  int port = g_uri_get_port (uri);
  if (port > 0)
    return port;
  return g_ascii_strcasecmp (g_uri_get_scheme (uri), "https") == 0 ? 443 : 80;
}

gboolean
gepard_http_origin_allowed (GepardServer *server, SoupServerMessage *msg, const char *origin)
{
  if (gepard_server_config_allows_origin (&server->config, origin))
    return TRUE;
  if (!server->config.playground || origin == NULL)
    return FALSE;

  /* the page the server itself served: same scheme, host and port as this request */
  GUri *own = soup_server_message_get_uri (msg);
  g_autoptr (GUri) theirs = g_uri_parse (origin, G_URI_FLAGS_NONE, NULL);
  if (own == NULL || theirs == NULL || g_uri_get_host (theirs) == NULL
      || g_uri_get_host (own) == NULL)
    return FALSE;
  return g_ascii_strcasecmp (g_uri_get_scheme (theirs), g_uri_get_scheme (own)) == 0
         && g_ascii_strcasecmp (g_uri_get_host (theirs), g_uri_get_host (own)) == 0
         && effective_port (theirs) == effective_port (own);
}

void
gepard_http_send_error (SoupServerMessage *msg, guint version, const GError *error,
                        const char *request_id)
{
  const char *content_type = NULL;
  guint status = gepard_api_error_get_status (error);
  char *body = gepard_api_error_http_body (error, version, request_id, &content_type);

  soup_server_message_set_status (msg, status, NULL);
  soup_message_headers_set_encoding (soup_server_message_get_response_headers (msg),
                                     SOUP_ENCODING_CONTENT_LENGTH);
  soup_server_message_set_response (msg, content_type, SOUP_MEMORY_TAKE, body, strlen (body));
}

void
gepard_http_send_json (SoupServerMessage *msg, guint status, JsonNode *body)
{
  gsize length = 0;
  char *text = json_to_string (body, FALSE);
  length = strlen (text);
  soup_server_message_set_status (msg, status, NULL);
  soup_server_message_set_response (msg, "application/json", SOUP_MEMORY_TAKE, text, length);
}

static void
on_got_chunk (SoupServerMessage *msg, GBytes *chunk, gpointer user_data)
{
  gsize limit = GPOINTER_TO_SIZE (user_data);
  GByteArray *body = g_object_get_data (G_OBJECT (msg), BODY_KEY);
  gsize size = g_bytes_get_size (chunk);

  if (g_object_get_data (G_OBJECT (msg), OVERSIZE_KEY) != NULL || body == NULL)
    return;
  if (body->len + size > limit)
    {
      /* keep reading (the client is still sending) but keep nothing */
      g_object_set_data (G_OBJECT (msg), OVERSIZE_KEY, GINT_TO_POINTER (1));
      g_byte_array_set_size (body, 0);
      return;
    }
  g_byte_array_append (body, g_bytes_get_data (chunk, NULL), (guint)size);
}

void
gepard_http_limit_body (SoupServer *soup, SoupServerMessage *msg, const char *path,
                        GHashTable *query, gpointer user_data)
{
  GepardServer *server = user_data;
  /* a reference clip is audio: it has a limit of its own */
  gsize limit = (gsize)(g_str_equal (path, "/voices/clone") ? server->config.max_clip_bytes
                                                            : server->config.max_body_bytes);
  SoupMessageHeaders *headers = soup_server_message_get_request_headers (msg);

  /* libsoup would keep the whole body, however large: count it here instead */
  soup_message_body_set_accumulate (soup_server_message_get_request_body (msg), FALSE);
  g_object_set_data_full (G_OBJECT (msg), BODY_KEY, g_byte_array_new (),
                          (GDestroyNotify)g_byte_array_unref);
  if (soup_message_headers_get_encoding (headers) == SOUP_ENCODING_CONTENT_LENGTH
      && soup_message_headers_get_content_length (headers) > (goffset)limit)
    g_object_set_data (G_OBJECT (msg), OVERSIZE_KEY, GINT_TO_POINTER (1));
  g_signal_connect (msg, "got-chunk", G_CALLBACK (on_got_chunk), GSIZE_TO_POINTER (limit));
}

GBytes *
gepard_http_get_body (SoupServerMessage *msg, GError **error)
{
  if (g_object_get_data (G_OBJECT (msg), OVERSIZE_KEY) != NULL)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_PAYLOAD_TOO_LARGE,
                           "The request body is larger than this server accepts");
      return NULL;
    }
  GByteArray *body = g_object_get_data (G_OBJECT (msg), BODY_KEY);
  if (body == NULL)
    return g_bytes_new (NULL, 0);
  return g_bytes_new (body->data, body->len);
}

char *
gepard_http_new_request_id (void)
{
  return g_uuid_string_random ();
}
