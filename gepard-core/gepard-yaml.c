/* gepard-yaml.c: a YAML subset reader for model_config.yaml.
 *
 * Block structure is read line by line: every line knows its indentation and the column its
 * content starts at. A sequence entry "- key: value" moves that column past the dash, so the
 * mapping inside the entry is read like any other mapping whose lines start at that column.
 * Flow collections and quoted scalars may span lines; they are gathered into one buffer with the
 * line breaks folded (YAML 1.2 §6.5) and parsed from there. */
#include "gepard-yaml.h"

#include "gepard-error.h"

#include <stdarg.h>
#include <string.h>

/* model_config.yaml is a few kilobytes; the caps only stop hostile input from costing much */
#define YAML_MAX_SIZE (16u << 20)
#define YAML_MAX_DEPTH 64

typedef struct
{
  const char *text; /* start of the line */
  gsize len;        /* without the line break */
  gsize indent;     /* leading spaces */
  gsize col;        /* where the content starts: the indentation, or past a "- " */
  int number;       /* 1-based */
} Line;

typedef struct
{
  Line *lines;
  guint n_lines;
  guint cursor;
} Parser;

static gboolean fail (GError **error, GepardFormatError code, int line, const char *format, ...)
    G_GNUC_PRINTF (4, 5);

static gboolean
fail (GError **error, GepardFormatError code, int line, const char *format, ...)
{
  va_list args;
  g_autofree char *message = NULL;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_FORMAT_ERROR, code, "line %d: %s", line, message);
  return FALSE;
}

/* ---- nodes ---- */

static GepardYamlNode *
node_new (GepardYamlKind kind, int line)
{
  GepardYamlNode *node = g_new0 (GepardYamlNode, 1);

  node->kind = kind;
  node->line = line;
  if (kind == GEPARD_YAML_MAPPING)
    node->keys = g_ptr_array_new_with_free_func (g_free);
  if (kind != GEPARD_YAML_SCALAR)
    node->items = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_yaml_node_free);
  return node;
}

static GepardYamlNode *
scalar_new (int line, char *text, gboolean quoted)
{
  GepardYamlNode *node = node_new (GEPARD_YAML_SCALAR, line);

  node->scalar = text;
  node->quoted = quoted;
  return node;
}

void
gepard_yaml_node_free (GepardYamlNode *node)
{
  if (node == NULL)
    return;
  g_free (node->scalar);
  if (node->keys != NULL)
    g_ptr_array_unref (node->keys);
  if (node->items != NULL)
    g_ptr_array_unref (node->items);
  g_free (node);
}

/* Takes `key` and `value`. OmegaConf refuses duplicate keys, and so does this reader. */
static gboolean
mapping_add (GepardYamlNode *mapping, char *key, GepardYamlNode *value, int line, GError **error)
{
  for (guint i = 0; i < mapping->keys->len; i++)
    {
      if (strcmp (g_ptr_array_index (mapping->keys, i), key) == 0)
        {
          fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "duplicate key “%s”", key);
          g_free (key);
          gepard_yaml_node_free (value);
          return FALSE;
        }
    }
  g_ptr_array_add (mapping->keys, key);
  g_ptr_array_add (mapping->items, value);
  return TRUE;
}

/* ---- lines ---- */

static char
line_at (const Line *line, gsize i)
{
  return i < line->len ? line->text[i] : '\0';
}

/* a comment starts at the beginning of the content or after whitespace */
static gboolean
is_comment_start (const Line *line, gsize i)
{
  return line_at (line, i) == '#'
         && (i == 0 || line->text[i - 1] == ' ' || line->text[i - 1] == '\t');
}

static gsize
skip_spaces (const Line *line, gsize i)
{
  while (i < line->len && (line->text[i] == ' ' || line->text[i] == '\t'))
    i++;
  return i;
}

/* nothing but spaces and perhaps a comment from `i` on */
static gboolean
rest_is_blank (const Line *line, gsize i)
{
  i = skip_spaces (line, i);
  return i >= line->len || is_comment_start (line, i);
}

/* document markers are accepted where they only frame the one document */
static gboolean
is_document_marker (const Line *line)
{
  if (line->col != 0 || line->len < 3)
    return FALSE;
  if (strncmp (line->text, "---", 3) != 0 && strncmp (line->text, "...", 3) != 0)
    return FALSE;
  return line->len == 3 || line->text[3] == ' ' || line->text[3] == '\t';
}

static gboolean
line_is_blank (const Line *line)
{
  if (is_document_marker (line))
    return rest_is_blank (line, 3);
  return rest_is_blank (line, line->col);
}

static void
skip_blank_lines (Parser *p)
{
  while (p->cursor < p->n_lines && line_is_blank (&p->lines[p->cursor]))
    p->cursor++;
}

static gboolean
is_dash (const Line *line)
{
  return line_at (line, line->col) == '-'
         && (line->col + 1 >= line->len || line->text[line->col + 1] == ' ');
}

static Line *
current (Parser *p)
{
  return p->cursor < p->n_lines ? &p->lines[p->cursor] : NULL;
}

/* ---- scalars ---- */

static int
hex_value (char c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* One escape of a double-quoted scalar (YAML 1.2 §5.7); `*pos` is just past the backslash. */
static gboolean
unescape (const char *s, gsize len, gsize *pos, GString *out, int line, GError **error)
{
  char c;
  int digits = 0;
  gunichar value = 0;

  if (*pos >= len)
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "unterminated escape");
  c = s[(*pos)++];
  switch (c)
    {
    case 'a':
      g_string_append_c (out, '\a');
      return TRUE;
    case 'b':
      g_string_append_c (out, '\b');
      return TRUE;
    case 't':
    case '\t':
      g_string_append_c (out, '\t');
      return TRUE;
    case 'n':
      g_string_append_c (out, '\n');
      return TRUE;
    case 'v':
      g_string_append_c (out, '\v');
      return TRUE;
    case 'f':
      g_string_append_c (out, '\f');
      return TRUE;
    case 'r':
      g_string_append_c (out, '\r');
      return TRUE;
    case 'e':
      g_string_append_c (out, '\x1b');
      return TRUE;
    case ' ':
    case '"':
    case '/':
    case '\\':
      g_string_append_c (out, c);
      return TRUE;
    case 'N':
      g_string_append_unichar (out, 0x85);
      return TRUE;
    case '_':
      g_string_append_unichar (out, 0xa0);
      return TRUE;
    case 'L':
      g_string_append_unichar (out, 0x2028);
      return TRUE;
    case 'P':
      g_string_append_unichar (out, 0x2029);
      return TRUE;
    case 'x':
      digits = 2;
      break;
    case 'u':
      digits = 4;
      break;
    case 'U':
      digits = 8;
      break;
    case '0':
    default:
      /* \0 would end the C string early; nothing in a model config needs it */
      return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "unsupported escape “\\%c”", c);
    }
  for (int i = 0; i < digits; i++)
    {
      int h = *pos < len ? hex_value (s[*pos]) : -1;

      if (h < 0)
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "bad “\\%c” escape", c);
      value = value * 16 + (gunichar)h;
      (*pos)++;
    }
  if (value == 0 || !g_unichar_validate (value))
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "escape gives an invalid character");
  g_string_append_unichar (out, value);
  return TRUE;
}

/* A quoted scalar on one (possibly folded) line: s[*pos] is the opening quote. On return *pos is
 * past the closing quote. */
static gboolean
scan_quoted (const char *s, gsize len, gsize *pos, int line, char **out, GError **error)
{
  char quote = s[*pos];
  g_autoptr (GString) text = g_string_new (NULL);
  gsize i = *pos + 1;

  while (TRUE)
    {
      char c;

      if (i >= len)
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "unterminated quoted scalar");
      c = s[i++];
      if (quote == '\'')
        {
          if (c == '\'')
            {
              if (i < len && s[i] == '\'')
                {
                  g_string_append_c (text, '\'');
                  i++;
                  continue;
                }
              break;
            }
          g_string_append_c (text, c);
        }
      else
        {
          if (c == '"')
            break;
          if (c == '\\')
            {
              if (!unescape (s, len, &i, text, line, error))
                return FALSE;
              continue;
            }
          g_string_append_c (text, c);
        }
    }
  *pos = i;
  *out = g_string_free (g_steal_pointer (&text), FALSE);
  return TRUE;
}

/* A block scalar's content may be anything; a plain scalar may not start with an indicator. */
static gboolean
check_plain_start (const char *s, gsize len, int line, GError **error)
{
  char c = s[0];
  char next = len > 1 ? s[1] : '\0';

  if (c == '&' || c == '*' || c == '!')
    return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, line,
                 "anchors, aliases and tags are not supported");
  if (c == '%' || c == '@' || c == '`' || c == '|' || c == '>')
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "a plain scalar cannot start with “%c”",
                 c);
  if ((c == '-' || c == '?' || c == ':') && (next == '\0' || next == ' ' || next == '\t'))
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line, "unexpected “%c” indicator", c);
  return TRUE;
}

/* ---- flow collections ---- */

typedef struct
{
  const char *s;
  gsize len;
  gsize pos;
  int line;
} Flow;

static void
flow_skip_spaces (Flow *f)
{
  while (f->pos < f->len && (f->s[f->pos] == ' ' || f->s[f->pos] == '\t'))
    f->pos++;
}

static gboolean
is_flow_indicator (char c)
{
  return c == ',' || c == '[' || c == ']' || c == '{' || c == '}';
}

static gboolean
flow_scalar (Flow *f, GepardYamlNode **out, GError **error)
{
  gsize start = f->pos;
  gsize end;
  char c = f->s[f->pos];

  if (c == '"' || c == '\'')
    {
      char *text = NULL;

      if (!scan_quoted (f->s, f->len, &f->pos, f->line, &text, error))
        return FALSE;
      *out = scalar_new (f->line, text, TRUE);
      return TRUE;
    }
  if (!check_plain_start (f->s + f->pos, f->len - f->pos, f->line, error))
    return FALSE;
  while (f->pos < f->len)
    {
      c = f->s[f->pos];
      if (is_flow_indicator (c))
        break;
      /* ": " (or ':' before an indicator) separates a key from its value */
      if (c == ':'
          && (f->pos + 1 >= f->len || f->s[f->pos + 1] == ' '
              || is_flow_indicator (f->s[f->pos + 1])))
        break;
      if (c == '#' && f->pos > start && f->s[f->pos - 1] == ' ')
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, f->line,
                     "comment inside a flow collection");
      f->pos++;
    }
  end = f->pos;
  while (end > start && (f->s[end - 1] == ' ' || f->s[end - 1] == '\t'))
    end--;
  *out = scalar_new (f->line, g_strndup (f->s + start, end - start), FALSE);
  return TRUE;
}

static gboolean flow_node (Flow *f, int depth, GepardYamlNode **out, GError **error);

static gboolean
flow_sequence (Flow *f, int depth, GepardYamlNode **out, GError **error)
{
  g_autoptr (GepardYamlNode) node = node_new (GEPARD_YAML_SEQUENCE, f->line);

  f->pos++; /* '[' */
  while (TRUE)
    {
      GepardYamlNode *item = NULL;

      flow_skip_spaces (f);
      if (f->pos < f->len && f->s[f->pos] == ']')
        {
          f->pos++;
          break;
        }
      if (!flow_node (f, depth + 1, &item, error))
        return FALSE;
      g_ptr_array_add (node->items, item);
      flow_skip_spaces (f);
      if (f->pos < f->len && f->s[f->pos] == ':')
        return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, f->line,
                     "key: value pairs inside a flow sequence are not supported");
      if (f->pos < f->len && f->s[f->pos] == ',')
        {
          f->pos++;
          continue;
        }
      if (f->pos < f->len && f->s[f->pos] == ']')
        {
          f->pos++;
          break;
        }
      return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, f->line, "expected “,” or “]”");
    }
  *out = g_steal_pointer (&node);
  return TRUE;
}

static gboolean
flow_mapping (Flow *f, int depth, GepardYamlNode **out, GError **error)
{
  g_autoptr (GepardYamlNode) node = node_new (GEPARD_YAML_MAPPING, f->line);

  f->pos++; /* '{' */
  while (TRUE)
    {
      g_autoptr (GepardYamlNode) key = NULL;
      GepardYamlNode *value = NULL;

      flow_skip_spaces (f);
      if (f->pos < f->len && f->s[f->pos] == '}')
        {
          f->pos++;
          break;
        }
      if (f->pos >= f->len || is_flow_indicator (f->s[f->pos]))
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, f->line, "expected a key");
      if (!flow_scalar (f, &key, error))
        return FALSE;
      flow_skip_spaces (f);
      if (f->pos < f->len && f->s[f->pos] == ':')
        {
          f->pos++;
          flow_skip_spaces (f);
          if (f->pos < f->len && (f->s[f->pos] == ',' || f->s[f->pos] == '}'))
            value = scalar_new (f->line, g_strdup (""), FALSE);
          else if (!flow_node (f, depth + 1, &value, error))
            return FALSE;
        }
      else
        value = scalar_new (f->line, g_strdup (""), FALSE);
      if (!mapping_add (node, g_steal_pointer (&key->scalar), value, f->line, error))
        return FALSE;
      flow_skip_spaces (f);
      if (f->pos < f->len && f->s[f->pos] == ',')
        {
          f->pos++;
          continue;
        }
      if (f->pos < f->len && f->s[f->pos] == '}')
        {
          f->pos++;
          break;
        }
      return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, f->line, "expected “,” or “}”");
    }
  *out = g_steal_pointer (&node);
  return TRUE;
}

static gboolean
flow_node (Flow *f, int depth, GepardYamlNode **out, GError **error)
{
  if (depth > YAML_MAX_DEPTH)
    return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, f->line, "nesting deeper than %d levels",
                 YAML_MAX_DEPTH);
  flow_skip_spaces (f);
  if (f->pos >= f->len)
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, f->line, "unterminated flow collection");
  switch (f->s[f->pos])
    {
    case '[':
      return flow_sequence (f, depth, out, error);
    case '{':
      return flow_mapping (f, depth, out, error);
    case ']':
    case '}':
    case ',':
      return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, f->line, "unexpected “%c”", f->s[f->pos]);
    default:
      return flow_scalar (f, out, error);
    }
}

/* ---- multi-line gathering ---- */

/* Collects a flow collection starting at the cursor line's content column into one line,
 * following brackets and quotes across line breaks (each folded to a space) and dropping
 * comments. Leaves the cursor on the line after the collection. */
static gboolean
gather_flow (Parser *p, GString *out, GError **error)
{
  Line *line = current (p);
  int first = line->number;
  gsize i = line->col;
  int depth = 0;
  char quote = 0;

  while (TRUE)
    {
      if (i >= line->len || (quote == 0 && is_comment_start (line, i)))
        {
          if (++p->cursor >= p->n_lines)
            return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, first,
                         quote ? "unterminated quoted scalar" : "unterminated flow collection");
          line = current (p);
          i = 0;
          g_string_append_c (out, ' ');
          continue;
        }
      char c = line->text[i++];

      g_string_append_c (out, c);
      if (quote == '"')
        {
          if (c == '\\' && i < line->len)
            g_string_append_c (out, line->text[i++]);
          else if (c == '"')
            quote = 0;
        }
      else if (quote == '\'')
        {
          if (c == '\'' && i < line->len && line->text[i] == '\'')
            g_string_append_c (out, line->text[i++]);
          else if (c == '\'')
            quote = 0;
        }
      else if (c == '"' || c == '\'')
        quote = c;
      else if (c == '[' || c == '{')
        {
          if (++depth > YAML_MAX_DEPTH)
            return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, first,
                         "nesting deeper than %d levels", YAML_MAX_DEPTH);
        }
      else if (c == ']' || c == '}')
        {
          if (--depth == 0)
            break;
        }
    }
  if (!rest_is_blank (line, i))
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line->number,
                 "unexpected text after a flow collection");
  p->cursor++;
  return TRUE;
}

/* Collects a quoted scalar starting at the cursor line's content column, folding line breaks as
 * YAML does (one break → a space, n empty lines → n newlines, surrounding blanks dropped), into a
 * one-line quoted scalar for scan_quoted(). */
static gboolean
gather_quoted (Parser *p, GString *out, GError **error)
{
  Line *line = current (p);
  int first = line->number;
  char quote = line->text[line->col];
  gsize i = line->col + 1;

  g_string_append_c (out, quote);
  while (TRUE)
    {
      if (i >= line->len)
        {
          gboolean escaped_break = FALSE;
          guint empty = 0;

          /* trailing blanks before a break are not content */
          while (out->len > 1 && (out->str[out->len - 1] == ' ' || out->str[out->len - 1] == '\t'))
            g_string_truncate (out, out->len - 1);
          if (quote == '"' && out->len > 1 && out->str[out->len - 1] == '\\')
            {
              /* an escaped line break joins the lines without a space */
              g_string_truncate (out, out->len - 1);
              escaped_break = TRUE;
            }
          do
            {
              if (++p->cursor >= p->n_lines)
                return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, first,
                             "unterminated quoted scalar");
              line = current (p);
              i = skip_spaces (line, 0);
              if (i >= line->len)
                empty++;
            }
          while (i >= line->len);
          if (empty > 0)
            {
              for (guint k = 0; k < empty; k++)
                g_string_append (out, quote == '"' ? "\\n" : "\n");
            }
          else if (!escaped_break)
            g_string_append_c (out, ' ');
          continue;
        }
      char c = line->text[i++];

      g_string_append_c (out, c);
      if (quote == '"' && c == '\\' && i < line->len)
        g_string_append_c (out, line->text[i++]);
      else if (c == quote)
        {
          if (quote == '\'' && i < line->len && line->text[i] == '\'')
            g_string_append_c (out, line->text[i++]);
          else
            break;
        }
    }
  if (!rest_is_blank (line, i))
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line->number,
                 "unexpected text after a quoted scalar");
  p->cursor++;
  return TRUE;
}

/* "|" or ">" with optional chomping and indentation indicators; the content is every following
 * line indented deeper than the parent (YAML 1.2 §8.1). */
static gboolean
block_scalar (Parser *p, gssize parent_indent, GepardYamlNode **out, GError **error)
{
  Line *line = current (p);
  int first = line->number;
  gboolean folded = line->text[line->col] == '>';
  char chomp = 0;
  gsize explicit_indent = 0;
  gsize i = line->col + 1;
  gsize content_indent = 0;
  g_autoptr (GString) text = g_string_new (NULL);
  guint pending_breaks = 0;
  gboolean any = FALSE;

  for (int k = 0; k < 2 && i < line->len; k++)
    {
      char c = line->text[i];

      if ((c == '+' || c == '-') && chomp == 0)
        chomp = c, i++;
      else if (c >= '1' && c <= '9' && explicit_indent == 0)
        explicit_indent = (gsize)(c - '0'), i++;
    }
  if (!rest_is_blank (line, i))
    return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, first, "bad block scalar header");
  p->cursor++;

  if (explicit_indent > 0)
    content_indent = (parent_indent < 0 ? 0 : (gsize)parent_indent) + explicit_indent;
  while (p->cursor < p->n_lines)
    {
      Line *l = current (p);
      gsize first_char = skip_spaces (l, 0);

      if (first_char >= l->len)
        {
          pending_breaks++;
          p->cursor++;
          continue;
        }
      if (content_indent == 0)
        {
          if ((gssize)l->indent <= parent_indent)
            break;
          content_indent = l->indent;
        }
      if (l->indent < content_indent)
        break;
      if (any)
        {
          if (folded && pending_breaks == 0)
            g_string_append_c (text, ' ');
          else
            for (guint k = 0; k < (folded ? pending_breaks : pending_breaks + 1); k++)
              g_string_append_c (text, '\n');
        }
      else
        for (guint k = 0; k < pending_breaks; k++)
          g_string_append_c (text, '\n');
      pending_breaks = 0;
      g_string_append_len (text, l->text + content_indent, l->len - content_indent);
      any = TRUE;
      p->cursor++;
    }
  if (any && chomp != '-')
    g_string_append_c (text, '\n');
  if (chomp == '+')
    for (guint k = 0; k < pending_breaks; k++)
      g_string_append_c (text, '\n');
  *out = scalar_new (first, g_string_free (g_steal_pointer (&text), FALSE), TRUE);
  return TRUE;
}

/* The text of a plain scalar from `start` to a comment or the end of the line, trimmed. */
static gboolean
plain_line_text (const Line *line, gsize start, GString *out, GError **error)
{
  gsize end = start;

  while (end < line->len && !is_comment_start (line, end))
    {
      char c = line->text[end];

      /* YAML: "mapping values are not allowed here" */
      if (c == ':' && (end + 1 >= line->len || line->text[end + 1] == ' '))
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line->number,
                     "unexpected “:” in a plain scalar (quote the value)");
      end++;
    }
  while (end > start && (line->text[end - 1] == ' ' || line->text[end - 1] == '\t'))
    end--;
  g_string_append_len (out, line->text + start, end - start);
  return TRUE;
}

/* A plain scalar, continued on following lines indented deeper than the parent (each break
 * folded to a space, empty lines kept as newlines). */
static gboolean
plain_scalar (Parser *p, gssize parent_indent, GepardYamlNode **out, GError **error)
{
  Line *line = current (p);
  int first = line->number;
  g_autoptr (GString) text = g_string_new (NULL);
  guint next;
  guint pending_breaks = 0;

  if (!check_plain_start (line->text + line->col, line->len - line->col, first, error))
    return FALSE;
  if (!plain_line_text (line, line->col, text, error))
    return FALSE;
  p->cursor++;

  for (next = p->cursor; next < p->n_lines; next++)
    {
      Line *l = &p->lines[next];
      gsize start = skip_spaces (l, 0);

      if (start >= l->len)
        {
          pending_breaks++;
          continue;
        }
      if (is_comment_start (l, start) || (gssize)l->indent <= parent_indent
          || is_document_marker (l))
        break;
      if (pending_breaks == 0)
        g_string_append_c (text, ' ');
      for (guint k = 0; k < pending_breaks; k++)
        g_string_append_c (text, '\n');
      pending_breaks = 0;
      if (!plain_line_text (l, start, text, error))
        return FALSE;
      p->cursor = next + 1;
    }
  *out = scalar_new (first, g_string_free (g_steal_pointer (&text), FALSE), FALSE);
  return TRUE;
}

/* A value that starts on the cursor line at its content column. */
static gboolean
inline_value (Parser *p, gssize parent_indent, GepardYamlNode **out, GError **error)
{
  Line *line = current (p);
  char c = line->text[line->col];

  if (c == '[' || c == '{')
    {
      g_autoptr (GString) buffer = g_string_new (NULL);
      Flow f;

      if (!gather_flow (p, buffer, error))
        return FALSE;
      f.s = buffer->str;
      f.len = buffer->len;
      f.pos = 0;
      f.line = line->number;
      if (!flow_node (&f, 0, out, error))
        return FALSE;
      flow_skip_spaces (&f);
      if (f.pos != f.len)
        {
          g_clear_pointer (out, gepard_yaml_node_free);
          return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line->number,
                       "unexpected text after a flow collection");
        }
      return TRUE;
    }
  if (c == '"' || c == '\'')
    {
      g_autoptr (GString) buffer = g_string_new (NULL);
      char *text = NULL;
      gsize pos = 0;
      int number = line->number;

      if (!gather_quoted (p, buffer, error)
          || !scan_quoted (buffer->str, buffer->len, &pos, number, &text, error))
        return FALSE;
      *out = scalar_new (number, text, TRUE);
      return TRUE;
    }
  if (c == '|' || c == '>')
    return block_scalar (p, parent_indent, out, error);
  return plain_scalar (p, parent_indent, out, error);
}

typedef enum
{
  LINE_NOT_KEY,
  LINE_KEY,
  LINE_KEY_ERROR,
} LineKey;

/* If the line at its content column is "key:" followed by a blank or the end, gives the key and
 * where the value starts. */
static LineKey
line_key (const Line *line, char **key, gsize *value_start, GError **error)
{
  gsize i = line->col;
  char c = line_at (line, i);

  *key = NULL;
  if (c == '"' || c == '\'')
    {
      /* a quoted key: it must close on this line */
      gsize pos = i;
      char *text = NULL;
      g_autoptr (GError) local = NULL;

      if (!scan_quoted (line->text, line->len, &pos, line->number, &text, &local))
        return LINE_NOT_KEY;
      pos = skip_spaces (line, pos);
      if (line_at (line, pos) != ':' || (pos + 1 < line->len && line->text[pos + 1] != ' '))
        {
          g_free (text);
          return LINE_NOT_KEY;
        }
      *key = text;
      *value_start = pos + 1;
      return LINE_KEY;
    }
  if (c == '[' || c == '{' || c == '\0' || c == '#')
    return LINE_NOT_KEY;
  for (; i < line->len; i++)
    {
      if (is_comment_start (line, i))
        return LINE_NOT_KEY;
      if (line->text[i] == ':' && (i + 1 >= line->len || line->text[i + 1] == ' '))
        {
          gsize end = i;

          while (end > line->col && (line->text[end - 1] == ' ' || line->text[end - 1] == '\t'))
            end--;
          if (end == line->col)
            {
              fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line->number, "empty key");
              return LINE_KEY_ERROR;
            }
          if (!check_plain_start (line->text + line->col, end - line->col, line->number, error))
            return LINE_KEY_ERROR;
          *key = g_strndup (line->text + line->col, end - line->col);
          *value_start = i + 1;
          return LINE_KEY;
        }
    }
  return LINE_NOT_KEY;
}

static gboolean block_node (Parser *p, gssize parent_indent, int depth, GepardYamlNode **out,
                            GError **error);

static gboolean
block_sequence (Parser *p, gsize indent, int depth, GepardYamlNode **out, GError **error)
{
  g_autoptr (GepardYamlNode) node = node_new (GEPARD_YAML_SEQUENCE, current (p)->number);

  while (TRUE)
    {
      Line *line;
      GepardYamlNode *item = NULL;
      gsize start;

      skip_blank_lines (p);
      line = current (p);
      if (line == NULL || line->col < indent || !is_dash (line))
        break;
      if (line->col > indent)
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line->number, "unexpected indentation");
      start = skip_spaces (line, line->col + 1);
      if (rest_is_blank (line, start))
        {
          int number = line->number;

          p->cursor++;
          skip_blank_lines (p);
          line = current (p);
          if (line != NULL && line->col > indent)
            {
              if (!block_node (p, (gssize)indent, depth + 1, &item, error))
                return FALSE;
            }
          else
            item = scalar_new (number, g_strdup (""), FALSE);
        }
      else
        {
          /* the entry's content becomes a line of its own starting at its column */
          line->col = start;
          if (!block_node (p, (gssize)indent, depth + 1, &item, error))
            return FALSE;
        }
      g_ptr_array_add (node->items, item);
    }
  *out = g_steal_pointer (&node);
  return TRUE;
}

static gboolean
block_mapping (Parser *p, gsize indent, int depth, GepardYamlNode **out, GError **error)
{
  g_autoptr (GepardYamlNode) node = node_new (GEPARD_YAML_MAPPING, current (p)->number);

  while (TRUE)
    {
      Line *line;
      char *key = NULL;
      gsize value_start;
      GepardYamlNode *value = NULL;
      int number;

      skip_blank_lines (p);
      line = current (p);
      if (line == NULL || line->col < indent)
        break;
      number = line->number;
      if (line->col > indent)
        return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, number, "unexpected indentation");
      if (line_at (line, line->col) == '?'
          && (line->col + 1 >= line->len || line->text[line->col + 1] == ' '))
        return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, number,
                     "complex keys are not supported");
      switch (line_key (line, &key, &value_start, error))
        {
        case LINE_KEY:
          break;
        case LINE_KEY_ERROR:
          return FALSE;
        case LINE_NOT_KEY:
        default:
          return fail (error, GEPARD_FORMAT_ERROR_CORRUPT, number, "expected “key: value”");
        }
      value_start = skip_spaces (line, value_start);
      if (rest_is_blank (line, value_start))
        {
          p->cursor++;
          skip_blank_lines (p);
          line = current (p);
          if (line != NULL && line->col > indent)
            {
              if (!block_node (p, (gssize)indent, depth + 1, &value, error))
                {
                  g_free (key);
                  return FALSE;
                }
            }
          else if (line != NULL && line->col == indent && is_dash (line))
            {
              /* PyYAML writes a mapping's sequences at the key's own indentation */
              if (!block_sequence (p, indent, depth + 1, &value, error))
                {
                  g_free (key);
                  return FALSE;
                }
            }
          else
            value = scalar_new (number, g_strdup (""), FALSE);
        }
      else
        {
          line->col = value_start;
          if (!inline_value (p, (gssize)indent, &value, error))
            {
              g_free (key);
              return FALSE;
            }
        }
      if (!mapping_add (node, key, value, number, error))
        return FALSE;
    }
  *out = g_steal_pointer (&node);
  return TRUE;
}

/* A node whose first line is the cursor line, indented deeper than `parent_indent`. */
static gboolean
block_node (Parser *p, gssize parent_indent, int depth, GepardYamlNode **out, GError **error)
{
  Line *line;
  char *key = NULL;
  gsize value_start;

  skip_blank_lines (p);
  line = current (p);
  if (depth > YAML_MAX_DEPTH)
    return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, line ? line->number : 0,
                 "nesting deeper than %d levels", YAML_MAX_DEPTH);
  if (line == NULL || (gssize)line->col <= parent_indent)
    {
      *out = scalar_new (line ? line->number : 0, g_strdup (""), FALSE);
      return TRUE;
    }
  if (is_dash (line))
    return block_sequence (p, line->col, depth, out, error);
  if (line_at (line, line->col) == '?'
      && (line->col + 1 >= line->len || line->text[line->col + 1] == ' '))
    return fail (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, line->number,
                 "complex keys are not supported");
  switch (line_key (line, &key, &value_start, error))
    {
    case LINE_KEY:
      g_free (key);
      return block_mapping (p, line->col, depth, out, error);
    case LINE_KEY_ERROR:
      return FALSE;
    case LINE_NOT_KEY:
    default:
      return inline_value (p, parent_indent, out, error);
    }
}

GepardYamlNode *
gepard_yaml_parse (const char *text, gsize len, GError **error)
{
  g_autoptr (GArray) lines = NULL;
  g_autoptr (GepardYamlNode) root = NULL;
  Parser p = {0};
  gsize pos = 0;
  int number = 1;

  g_return_val_if_fail (text != NULL || len == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (len > YAML_MAX_SIZE)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%" G_GSIZE_FORMAT " bytes of YAML, more than the limit of %u", len,
                   YAML_MAX_SIZE);
      return NULL;
    }
  if (memchr (text, '\0', len) != NULL || !g_utf8_validate_len (text, len, NULL))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                   "not UTF-8 text (or it contains NUL bytes)");
      return NULL;
    }
  if (len >= 3 && memcmp (text, "\xef\xbb\xbf", 3) == 0)
    pos = 3; /* a byte order mark */

  lines = g_array_new (FALSE, TRUE, sizeof (Line));
  while (pos < len)
    {
      const char *nl = memchr (text + pos, '\n', len - pos);
      gsize end = nl != NULL ? (gsize)(nl - text) : len;
      Line line = {0};

      line.text = text + pos;
      line.len = end - pos;
      if (line.len > 0 && line.text[line.len - 1] == '\r')
        line.len--;
      line.number = number++;
      while (line.indent < line.len && line.text[line.indent] == ' ')
        line.indent++;
      line.col = line.indent;
      /* YAML forbids tabs in indentation; a tab before the content makes it ambiguous */
      if (line.indent < line.len && line.text[line.indent] == '\t' && !rest_is_blank (&line, 0))
        {
          fail (error, GEPARD_FORMAT_ERROR_CORRUPT, line.number, "tab in indentation");
          return NULL;
        }
      g_array_append_val (lines, line);
      pos = end + 1;
      if (number == G_MAXINT)
        break;
    }

  p.lines = (Line *)(void *)lines->data;
  p.n_lines = lines->len;
  skip_blank_lines (&p);
  if (p.cursor >= p.n_lines)
    return node_new (GEPARD_YAML_MAPPING, 1);
  if (!block_node (&p, -1, 0, &root, error))
    return NULL;
  skip_blank_lines (&p);
  if (p.cursor < p.n_lines)
    {
      fail (error, GEPARD_FORMAT_ERROR_CORRUPT, p.lines[p.cursor].number,
            "unexpected content (check the indentation)");
      return NULL;
    }
  return g_steal_pointer (&root);
}

/* ---- access ---- */

const GepardYamlNode *
gepard_yaml_mapping_lookup (const GepardYamlNode *node, const char *key)
{
  g_return_val_if_fail (key != NULL, NULL);

  if (node == NULL || node->kind != GEPARD_YAML_MAPPING)
    return NULL;
  for (guint i = 0; i < node->keys->len; i++)
    if (strcmp (g_ptr_array_index (node->keys, i), key) == 0)
      return g_ptr_array_index (node->items, i);
  return NULL;
}

gboolean
gepard_yaml_node_is_null (const GepardYamlNode *node)
{
  if (node == NULL || node->kind != GEPARD_YAML_SCALAR || node->quoted)
    return FALSE;
  return node->scalar[0] == '\0' || strcmp (node->scalar, "~") == 0
         || strcmp (node->scalar, "null") == 0 || strcmp (node->scalar, "Null") == 0
         || strcmp (node->scalar, "NULL") == 0;
}

gboolean
gepard_yaml_node_get_int (const GepardYamlNode *node, gint64 min, gint64 max, gint64 *value)
{
  const char *s;
  const char *digits;
  guint64 v = 0;

  if (node == NULL || node->kind != GEPARD_YAML_SCALAR || node->quoted)
    return FALSE;
  s = node->scalar;
  if (*s == '+')
    s++;
  /* YAML 1.1 (PyYAML) reads a leading 0 as octal; no config writes one, so refuse the ambiguity */
  digits = *s == '-' ? s + 1 : s;
  if (digits[0] == '0' && digits[1] != '\0')
    return FALSE;
  if (*s == '-')
    {
      gint64 negative;

      if (!g_ascii_string_to_signed (s, 10, min, max, &negative, NULL))
        return FALSE;
      *value = negative;
      return TRUE;
    }
  /* g_ascii_string_to_unsigned would take a second sign; digits only from here on */
  if (!g_ascii_isdigit (*s) || !g_ascii_string_to_unsigned (s, 10, 0, G_MAXINT64, &v, NULL)
      || (gint64)v < min || (gint64)v > max)
    return FALSE;
  *value = (gint64)v;
  return TRUE;
}

gboolean
gepard_yaml_node_get_double (const GepardYamlNode *node, double *value)
{
  const char *s;
  char *end = NULL;
  double v;

  if (node == NULL || node->kind != GEPARD_YAML_SCALAR || node->quoted || node->scalar[0] == '\0')
    return FALSE;
  s = node->scalar;
  /* only decimal forms: strtod would also take inf, nan and hex floats */
  for (const char *c = s; *c != '\0'; c++)
    if (!g_ascii_isdigit (*c) && *c != '.' && *c != 'e' && *c != 'E' && *c != '+' && *c != '-')
      return FALSE;
  v = g_ascii_strtod (s, &end);
  if (end == s || *end != '\0')
    return FALSE;
  *value = v;
  return TRUE;
}

gboolean
gepard_yaml_node_get_bool (const GepardYamlNode *node, gboolean *value)
{
  const char *s;

  if (node == NULL || node->kind != GEPARD_YAML_SCALAR || node->quoted)
    return FALSE;
  s = node->scalar;
  if (strcmp (s, "true") == 0 || strcmp (s, "True") == 0 || strcmp (s, "TRUE") == 0)
    *value = TRUE;
  else if (strcmp (s, "false") == 0 || strcmp (s, "False") == 0 || strcmp (s, "FALSE") == 0)
    *value = FALSE;
  else
    return FALSE;
  return TRUE;
}

const char *
gepard_yaml_node_get_string (const GepardYamlNode *node)
{
  if (node == NULL || node->kind != GEPARD_YAML_SCALAR || gepard_yaml_node_is_null (node))
    return NULL;
  return node->scalar;
}
