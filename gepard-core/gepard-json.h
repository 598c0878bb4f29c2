/* gepard-json.h: strict JSON, checked before json-glib parses it.
 *
 * json-glib accepts more than JSON (single quotes, comments, hex numbers), silently clamps integers
 * beyond 64 bits and recurses once per nesting level, so deeply nested input exhausts the stack.
 * Every file Gepard parses goes through gepard_json_check first: RFC 8259 syntax, nesting of at
 * most GEPARD_JSON_MAX_DEPTH, integers that fit in 64 bits, no unpaired surrogates. */
#pragma once

#include <json-glib/json-glib.h>

G_BEGIN_DECLS

#define GEPARD_JSON_MAX_DEPTH 64

typedef struct
{
  const char *problem;  /* static text describing the first problem */
  gsize offset;         /* byte offset of the problem */
  gboolean escaped_nul; /* the problem is a \u0000 escape, valid JSON that C strings cannot hold */
} GepardJsonCheck;

/* TRUE when `text` is one strict JSON value; otherwise fills `check`. */
gboolean gepard_json_check (const char *text, gsize len, GepardJsonCheck *check);

/* Reads, checks and parses a JSON file whose top level must be an object. A missing file gives
 * GEPARD_FORMAT_ERROR_MISSING, anything else wrong GEPARD_FORMAT_ERROR_CORRUPT; messages name
 * the file. */
JsonNode *gepard_json_parse_file (const char *path, GError **error);

G_END_DECLS
