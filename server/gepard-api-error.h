/* gepard-api-error.h: the errors gepard-server answers with, Cartesia's API versions, and the
 * error bodies each version expects (cartesia-protocol.md §1.2, §2.4, §3.3).
 *
 * Every failure a client can cause is a GEPARD_API_ERROR whose code fixes the HTTP status, the
 * machine-readable error_code and the title; anything else that reaches a client is a 500. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

#define GEPARD_API_ERROR (gepard_api_error_quark ())
GQuark gepard_api_error_quark (void);

typedef enum
{
  GEPARD_API_ERROR_BAD_REQUEST,         /* 400 invalid_request */
  GEPARD_API_ERROR_UNSUPPORTED_FORMAT,  /* 400 unsupported_output_format */
  GEPARD_API_ERROR_TRANSCRIPT_TOO_LONG, /* 400 transcript_too_long */
  GEPARD_API_ERROR_UNAUTHORIZED,        /* 401 unauthorized */
  GEPARD_API_ERROR_FORBIDDEN,           /* 403 forbidden */
  GEPARD_API_ERROR_NOT_FOUND,           /* 404 not_found */
  GEPARD_API_ERROR_VOICE_NOT_FOUND,     /* 404 voice_not_found */
  GEPARD_API_ERROR_METHOD_NOT_ALLOWED,  /* 405 method_not_allowed */
  GEPARD_API_ERROR_PAYLOAD_TOO_LARGE,   /* 413 payload_too_large */
  GEPARD_API_ERROR_TOO_MANY_CONTEXTS,   /* 429 concurrency_limit_exceeded */
  GEPARD_API_ERROR_INTERNAL,            /* 500 internal_error */
  GEPARD_API_ERROR_UNAVAILABLE,         /* 503 service_unavailable */
} GepardApiError;

/* The HTTP status of `error`: 500 for errors of other domains. */
guint gepard_api_error_get_status (const GError *error);
/* Cartesia's error_code string of `error`. */
const char *gepard_api_error_get_code (const GError *error);
/* "Bad Request" and the like. */
const char *gepard_api_error_get_title (guint status);

/* TRUE when `text`, the string `name` of a request, is UTF-8; else a BAD_REQUEST error. json-glib
 * also decodes escapes that JSON does not define, a backslash and octal digits ("\\333"), into
 * any byte, and a request's strings may come back in an event, a body or a log. */
gboolean gepard_api_error_check_text (const char *text, const char *name, GError **error);

/* API versions as YYYYMMDD numbers. */
#define GEPARD_API_VERSION_2024_06_10 20240610u
#define GEPARD_API_VERSION_2026_03_01 20260301u
#define GEPARD_API_VERSION_LATEST 20260814u

/* A Cartesia-Version value ("2025-04-16"); missing or not a date: the latest, so a client that
 * sends nothing gets today's shapes. */
guint gepard_api_version_parse (const char *value);

/* The body of an HTTP error for `version`: structured JSON from 2026-03-01 on, "Title: message"
 * text before. Sets *content_type. */
char *gepard_api_error_http_body (const GError *error, guint version, const char *request_id,
                                  const char **content_type);

G_END_DECLS
