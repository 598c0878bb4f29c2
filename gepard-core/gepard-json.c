/* gepard-json.c: a strict JSON syntax check with an explicit stack, and file parsing through it. */
#include "gepard-json.h"

#include "gepard-error.h"

typedef struct
{
  const guchar *text;
  gsize len;
  gsize pos;
  const char *problem;  /* static text, set on failure */
  gboolean escaped_nul; /* the failure is a \u0000 escape, not a syntax error */
} JsonCheck;

static gboolean
json_fail (JsonCheck *check, const char *problem)
{
  check->problem = problem;
  return FALSE;
}

static void
json_skip_space (JsonCheck *check)
{
  while (check->pos < check->len)
    {
      guchar c = check->text[check->pos];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
        break;
      check->pos++;
    }
}

static gboolean
json_read_hex4 (JsonCheck *check, guint *unit)
{
  guint value = 0;

  if (check->len - check->pos < 4)
    return json_fail (check, "unterminated \\u escape");
  for (guint i = 0; i < 4; i++)
    {
      int digit = g_ascii_xdigit_value (check->text[check->pos + i]);
      if (digit < 0)
        return json_fail (check, "invalid \\u escape");
      value = value * 16 + (guint)digit;
    }
  check->pos += 4;
  *unit = value;
  return TRUE;
}

/* at the opening quote */
static gboolean
json_check_string (JsonCheck *check)
{
  check->pos++;
  for (;;)
    {
      guchar c;

      if (check->pos >= check->len)
        return json_fail (check, "unterminated string");
      c = check->text[check->pos++];
      if (c == '"')
        return TRUE;
      if (c < 0x20)
        return json_fail (check, "unescaped control character in a string");
      if (c != '\\')
        continue;

      if (check->pos >= check->len)
        return json_fail (check, "unterminated string");
      c = check->text[check->pos++];
      switch (c)
        {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          break;
        case 'u':
          {
            guint unit;
            if (!json_read_hex4 (check, &unit))
              return FALSE;
            if (unit == 0)
              {
                /* json-glib hands strings out NUL-terminated, which would silently cut such a
                 * name or value short */
                check->escaped_nul = TRUE;
                return json_fail (check, "a string contains an escaped NUL character (\\u0000), "
                                         "which Gepard cannot represent");
              }
            if (unit >= 0xdc00 && unit <= 0xdfff)
              return json_fail (check, "unpaired low surrogate in a \\u escape");
            if (unit >= 0xd800 && unit <= 0xdbff)
              {
                guint low;
                if (check->len - check->pos < 2 || check->text[check->pos] != '\\'
                    || check->text[check->pos + 1] != 'u')
                  return json_fail (check, "unpaired high surrogate in a \\u escape");
                check->pos += 2;
                if (!json_read_hex4 (check, &low))
                  return FALSE;
                if (low < 0xdc00 || low > 0xdfff)
                  return json_fail (check, "unpaired high surrogate in a \\u escape");
              }
            break;
          }
        default:
          return json_fail (check, "invalid escape sequence in a string");
        }
    }
}

static gboolean
json_at_digit (const JsonCheck *check)
{
  return check->pos < check->len && g_ascii_isdigit (check->text[check->pos]);
}

/* An integer literal must fit in gint64: json-glib saturates larger ones, which would turn e.g.
 * -9223372036854775809 into a large positive offset. */
static gboolean
json_check_number (JsonCheck *check)
{
  gboolean negative = FALSE;
  gboolean integral = TRUE;
  gsize digits_start, digits_end;

  if (check->text[check->pos] == '-')
    {
      negative = TRUE;
      check->pos++;
    }
  if (!json_at_digit (check))
    return json_fail (check, "invalid number");
  digits_start = check->pos;
  if (check->text[check->pos] == '0')
    check->pos++;
  else
    while (json_at_digit (check))
      check->pos++;
  digits_end = check->pos;

  if (check->pos < check->len && check->text[check->pos] == '.')
    {
      check->pos++;
      integral = FALSE;
      if (!json_at_digit (check))
        return json_fail (check, "invalid number");
      while (json_at_digit (check))
        check->pos++;
    }
  if (check->pos < check->len && (check->text[check->pos] == 'e' || check->text[check->pos] == 'E'))
    {
      check->pos++;
      integral = FALSE;
      if (check->pos < check->len
          && (check->text[check->pos] == '+' || check->text[check->pos] == '-'))
        check->pos++;
      if (!json_at_digit (check))
        return json_fail (check, "invalid number");
      while (json_at_digit (check))
        check->pos++;
    }

  if (integral)
    {
      guint64 limit = negative ? G_GUINT64_CONSTANT (1) << 63 : (guint64)G_MAXINT64;
      guint64 value = 0;
      for (gsize i = digits_start; i < digits_end; i++)
        {
          guint digit = check->text[i] - '0';
          if (value > (limit - digit) / 10)
            return json_fail (check, "integer out of the 64-bit signed range");
          value = value * 10 + digit;
        }
    }

  /* a number must end at a delimiter, not run into letters: "1x" */
  if (check->pos < check->len
      && (g_ascii_isalnum (check->text[check->pos]) || check->text[check->pos] == '.'))
    return json_fail (check, "invalid number");
  return TRUE;
}

static gboolean
json_check_literal (JsonCheck *check, const char *word)
{
  gsize n = strlen (word);

  if (check->len - check->pos < n || memcmp (check->text + check->pos, word, n) != 0)
    return json_fail (check, "unexpected character");
  check->pos += n;
  if (check->pos < check->len && g_ascii_isalnum (check->text[check->pos]))
    return json_fail (check, "unexpected character");
  return TRUE;
}

/* RFC 8259 syntax, checked with an explicit stack. json-glib accepts more than JSON (single quotes,
 * comments, hex numbers) and recurses once per nesting level; rejecting both here keeps the
 * accepted language equal to the reference implementation's and the parser's stack bounded. */
static gboolean
json_check_syntax (JsonCheck *check)
{
  enum
  {
    EXPECT_VALUE,
    EXPECT_VALUE_OR_CLOSE,
    EXPECT_KEY,
    EXPECT_KEY_OR_CLOSE,
    AFTER_VALUE,
  } state
      = EXPECT_VALUE;
  guchar stack[GEPARD_JSON_MAX_DEPTH];
  guint depth = 0;

  for (;;)
    {
      guchar c;

      json_skip_space (check);
      if (check->pos >= check->len)
        {
          if (state == AFTER_VALUE && depth == 0)
            return TRUE;
          return json_fail (check, "unexpected end of the text");
        }
      c = check->text[check->pos];

      switch (state)
        {
        case EXPECT_VALUE_OR_CLOSE:
          if (c == ']')
            {
              check->pos++;
              depth--;
              state = AFTER_VALUE;
              break;
            }
          G_GNUC_FALLTHROUGH;
        case EXPECT_VALUE:
          if (c == '{' || c == '[')
            {
              if (depth == GEPARD_JSON_MAX_DEPTH)
                return json_fail (check, "JSON nested more than 64 levels deep");
              stack[depth++] = c;
              check->pos++;
              state = c == '{' ? EXPECT_KEY_OR_CLOSE : EXPECT_VALUE_OR_CLOSE;
              break;
            }
          if (c == '"')
            {
              if (!json_check_string (check))
                return FALSE;
            }
          else if (c == '-' || g_ascii_isdigit (c))
            {
              if (!json_check_number (check))
                return FALSE;
            }
          else if (c == 't' || c == 'f' || c == 'n')
            {
              if (!json_check_literal (check, c == 't' ? "true" : c == 'f' ? "false" : "null"))
                return FALSE;
            }
          else
            {
              return json_fail (check, "unexpected character where a value should start");
            }
          state = AFTER_VALUE;
          break;

        case EXPECT_KEY_OR_CLOSE:
          if (c == '}')
            {
              check->pos++;
              depth--;
              state = AFTER_VALUE;
              break;
            }
          G_GNUC_FALLTHROUGH;
        case EXPECT_KEY:
          if (c != '"')
            return json_fail (check, "expected a string as object key");
          if (!json_check_string (check))
            return FALSE;
          json_skip_space (check);
          if (check->pos >= check->len || check->text[check->pos] != ':')
            return json_fail (check, "expected ':' after an object key");
          check->pos++;
          state = EXPECT_VALUE;
          break;

        case AFTER_VALUE:
          if (depth == 0)
            return json_fail (check, "unexpected data after the JSON value");
          if (c == ',')
            {
              check->pos++;
              state = stack[depth - 1] == '{' ? EXPECT_KEY : EXPECT_VALUE;
            }
          else if ((c == '}' && stack[depth - 1] == '{') || (c == ']' && stack[depth - 1] == '['))
            {
              check->pos++;
              depth--;
            }
          else
            {
              return json_fail (check, "expected ',' or a closing bracket");
            }
          break;

        default:
          g_assert_not_reached ();
        }
    }
}

gboolean
gepard_json_check (const char *text, gsize len, GepardJsonCheck *result)
{
  JsonCheck check = {.text = (const guchar *)text, .len = len};
  if (json_check_syntax (&check))
    return TRUE;
  result->problem = check.problem;
  result->offset = check.pos;
  result->escaped_nul = check.escaped_nul;
  return FALSE;
}

JsonNode *
gepard_json_parse_file (const char *path, GError **error)
{
  g_autoptr (GError) local_error = NULL;
  g_autoptr (GMappedFile) file = g_mapped_file_new (path, FALSE, &local_error);
  if (file == NULL)
    {
      gboolean missing = g_error_matches (local_error, G_FILE_ERROR, G_FILE_ERROR_NOENT);
      g_set_error (error, GEPARD_FORMAT_ERROR,
                   missing ? GEPARD_FORMAT_ERROR_MISSING : GEPARD_FORMAT_ERROR_IO, "%s: %s", path,
                   missing ? "file is missing" : local_error->message);
      return NULL;
    }

  const char *text = g_mapped_file_get_contents (file);
  gsize len = g_mapped_file_get_length (file);
  GepardJsonCheck check;
  if (len == 0 || text == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT, "%s: file is empty",
                   path);
      return NULL;
    }
  if (!g_utf8_validate_len (text, len, NULL))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT, "%s: not valid UTF-8",
                   path);
      return NULL;
    }
  if (!gepard_json_check (text, len, &check))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                   "%s: not valid JSON: %s (byte %" G_GSIZE_FORMAT ")", path, check.problem,
                   check.offset);
      return NULL;
    }

  g_autoptr (JsonParser) parser = json_parser_new_immutable ();
  if (!json_parser_load_from_data (parser, text, (gssize)len, &local_error))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT, "%s: %s", path,
                   local_error->message);
      return NULL;
    }
  JsonNode *root = json_parser_get_root (parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                   "%s: the top level is not a JSON object", path);
      return NULL;
    }
  return json_node_ref (root);
}
