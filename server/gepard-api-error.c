/* gepard-api-error.c: statuses, codes and bodies of the errors gepard-server answers with. */
#include "gepard-api-error.h"

#include <json-glib/json-glib.h>
#include <stdio.h>

G_DEFINE_QUARK (gepard - api - error - quark, gepard_api_error)

typedef struct
{
  guint status;
  const char *code;
} ErrorInfo;

/* indexed by GepardApiError */
static const ErrorInfo error_info[] = {
    {400, "invalid_request"},     {400, "unsupported_output_format"},
    {400, "transcript_too_long"}, {401, "unauthorized"},
    {403, "forbidden"},           {404, "not_found"},
    {404, "voice_not_found"},     {405, "method_not_allowed"},
    {413, "payload_too_large"},   {429, "concurrency_limit_exceeded"},
    {500, "internal_error"},      {503, "service_unavailable"},
};

static const ErrorInfo *
info_of (const GError *error)
{
  if (error != NULL && error->domain == GEPARD_API_ERROR && error->code >= 0
      && (gsize)error->code < G_N_ELEMENTS (error_info))
    return &error_info[error->code];
  return &error_info[GEPARD_API_ERROR_INTERNAL];
}

guint
gepard_api_error_get_status (const GError *error)
{
  return info_of (error)->status;
}

const char *
gepard_api_error_get_code (const GError *error)
{
  return info_of (error)->code;
}

const char *
gepard_api_error_get_title (guint status)
{
  switch (status)
    {
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    case 429:
      return "Too Many Requests";
    case 503:
      return "Service Unavailable";
    default:
      return "Internal Server Error";
    }
}

guint
gepard_api_version_parse (const char *value)
{
  unsigned y, m, d;
  char end;

  if (value == NULL || sscanf (value, "%4u-%2u-%2u%c", &y, &m, &d, &end) != 3 || y < 2000 || m < 1
      || m > 12 || d < 1 || d > 31)
    return GEPARD_API_VERSION_LATEST;
  return y * 10000u + m * 100u + d;
}

gboolean
gepard_api_error_check_text (const char *text, const char *name, GError **error)
{
  if (g_utf8_validate (text, -1, NULL))
    return TRUE;
  g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
               "%s is not UTF-8 text: escape characters as JSON does (\\uXXXX)", name);
  return FALSE;
}

char *
gepard_api_error_http_body (const GError *error, guint version, const char *request_id,
                            const char **content_type)
{
  guint status = gepard_api_error_get_status (error);
  const char *title = gepard_api_error_get_title (status);
  /* an error of another domain is our bug: its text is for the log, not the client */
  /* what a request held may be quoted in the message: the body is UTF-8 whatever it held */
  g_autofree char *message = g_utf8_make_valid (error != NULL && error->domain == GEPARD_API_ERROR
                                                    ? error->message
                                                    : "The server could not complete the request.",
                                                -1);

  if (version < GEPARD_API_VERSION_2026_03_01)
    {
      *content_type = "text/plain; charset=utf-8";
      return g_strdup_printf ("%s: %s", title, message);
    }

  g_autoptr (JsonBuilder) b = json_builder_new ();
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "error_code");
  json_builder_add_string_value (b, gepard_api_error_get_code (error));
  json_builder_set_member_name (b, "title");
  json_builder_add_string_value (b, title);
  json_builder_set_member_name (b, "message");
  json_builder_add_string_value (b, message);
  json_builder_set_member_name (b, "request_id");
  json_builder_add_string_value (b, request_id);
  json_builder_end_object (b);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  *content_type = "application/json";
  return json_to_string (root, FALSE);
}
