/* gepard-routes-playground.c: the playground, a page for trying the server from a browser: GET /
 * (asked for as HTML) and its files under /playground/.
 *
 * The files are compiled in (server/playground/, a GResource), so the binary serves the page of
 * its own version. They hold no secret and answer without the API key; the page asks for the key
 * and sends it with each API call. Every answer carries a Content-Security-Policy that lets the
 * page load nothing but its own files and talk to nothing but this server. */
#include "gepard-server.h"

#include "gepard-playground-resources.h"

#include <string.h>

#define PLAYGROUND_RESOURCE_DIR "/org/gepard/playground"
#define PLAYGROUND_PREFIX "/playground/"

typedef struct
{
  const char *name; /* in the resource, and after /playground/ in the URL */
  const char *content_type;
} PlaygroundFile;

/* every file served: nothing else in the resource answers */
static const PlaygroundFile files[] = {
    {"index.html", "text/html; charset=utf-8"},
    {"playground.js", "text/javascript; charset=utf-8"},
    {"playground.css", "text/css; charset=utf-8"},
    {"icon.svg", "image/svg+xml"},
};

gboolean
gepard_routes_playground_wants_page (SoupServerMessage *msg, const char *path)
{
  const char *method = soup_server_message_get_method (msg);
  const char *accept
      = soup_message_headers_get_list (soup_server_message_get_request_headers (msg), "Accept");

  if (!g_str_equal (path, "/") || accept == NULL
      || !(g_str_equal (method, "GET") || g_str_equal (method, "HEAD")))
    return FALSE;
  g_autofree char *lower = g_ascii_strdown (accept, -1);
  return strstr (lower, "text/html") != NULL;
}

/* A host name or address as it may stand in a CSP source: nothing that could end the source or
 * the directive. */
static gboolean
is_plain_host (const char *host)
{
  if (host == NULL || host[0] == '\0')
    return FALSE;
  for (const char *p = host; *p != '\0'; p++)
    if (!g_ascii_isalnum (*p) && strchr (".-:", *p) == NULL)
      return FALSE;
  return TRUE;
}

/* Self only. Browsers older than CSP level 3 do not count ws: and wss: of the page's own host as
 * 'self', so the socket's origin is named as well, from the Host the request was sent to. */
static char *
content_security_policy (SoupServerMessage *msg)
{
  GUri *uri = soup_server_message_get_uri (msg);
  const char *host = uri != NULL ? g_uri_get_host (uri) : NULL;
  g_autoptr (GString) connect = g_string_new ("'self'");

  if (is_plain_host (host))
    {
      gboolean tls = g_strcmp0 (g_uri_get_scheme (uri), "https") == 0;
      gboolean v6 = strchr (host, ':') != NULL;
      int port = g_uri_get_port (uri);
      g_string_append_printf (connect, " %s://%s%s%s", tls ? "wss" : "ws", v6 ? "[" : "", host,
                              v6 ? "]" : "");
      if (port > 0)
        g_string_append_printf (connect, ":%d", port);
    }
  return g_strdup_printf ("default-src 'none'; script-src 'self'; style-src 'self'; "
                          "img-src 'self'; media-src 'self' blob:; connect-src %s; "
                          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                          connect->str);
}

static void
add_headers (SoupServerMessage *msg)
{
  SoupMessageHeaders *headers = soup_server_message_get_response_headers (msg);
  g_autofree char *csp = content_security_policy (msg);
  soup_message_headers_replace (headers, "Content-Security-Policy", csp);
  soup_message_headers_replace (headers, "X-Content-Type-Options", "nosniff");
  soup_message_headers_replace (headers, "Referrer-Policy", "no-referrer");
  soup_message_headers_replace (headers, "Cross-Origin-Opener-Policy", "same-origin");
  soup_message_headers_replace (headers, "Permissions-Policy", "microphone=(self)");
  /* a server upgraded in place serves its new page at once */
  soup_message_headers_replace (headers, "Cache-Control", "no-cache");
}

static void
send_file (SoupServerMessage *msg, const PlaygroundFile *file, GError **error)
{
  g_autofree char *resource = g_strconcat (PLAYGROUND_RESOURCE_DIR "/", file->name, NULL);
  g_autoptr (GBytes) data = g_resource_lookup_data (gepard_playground_get_resource (), resource,
                                                    G_RESOURCE_LOOKUP_FLAGS_NONE, error);
  if (data == NULL)
    return;
  add_headers (msg);
  soup_server_message_set_status (msg, SOUP_STATUS_OK, NULL);
  soup_server_message_set_response (msg, file->content_type, SOUP_MEMORY_COPY,
                                    g_bytes_get_data (data, NULL), g_bytes_get_size (data));
}

/* What the page needs to know before its first call: whether to ask for a key. Anyone can learn
 * that from a refused call anyway. */
static void
send_settings (GepardServer *server, SoupServerMessage *msg)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "api_key_required");
  json_builder_add_boolean_value (b, server->config.api_key != NULL);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  add_headers (msg);
  gepard_http_send_json (msg, SOUP_STATUS_OK, root);
}

void
gepard_routes_playground (GepardServer *server, SoupServerMessage *msg, const char *path,
                          GHashTable *query, guint version)
{
  g_autoptr (GError) error = NULL;
  const char *name = g_str_equal (path, "/") ? "index.html"
                     : g_str_has_prefix (path, PLAYGROUND_PREFIX)
                         ? path + strlen (PLAYGROUND_PREFIX)
                         : "";

  if (g_str_equal (name, "settings.json"))
    {
      send_settings (server, msg);
      return;
    }
  for (gsize i = 0; i < G_N_ELEMENTS (files); i++)
    if (g_str_equal (name, files[i].name))
      {
        send_file (msg, &files[i], &error);
        if (error == NULL)
          return;
        /* the resource is compiled in: only a broken build lacks a file */
        g_prefix_error (&error, "the playground's %s: ", name);
        g_autoptr (GError) internal
            = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL, error->message);
        g_autofree char *request_id = gepard_http_new_request_id ();
        g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_WARNING, "MESSAGE", "%s: %s", request_id,
                          error->message);
        gepard_http_send_error (msg, version, internal, request_id);
        return;
      }
  g_autoptr (GError) missing
      = g_error_new_literal (GEPARD_API_ERROR, GEPARD_API_ERROR_NOT_FOUND, "No such route");
  g_autofree char *request_id = gepard_http_new_request_id ();
  gepard_http_send_error (msg, version, missing, request_id);
}
