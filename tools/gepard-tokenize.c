/* gepard-tokenize: runs a tokenizer.json over standard input, one line at a time.
 *
 *   gepard-tokenize TOKENIZER_JSON             each line → its token ids, space-separated
 *   gepard-tokenize --decode TOKENIZER_JSON    each line of ids → its text
 *   gepard-tokenize --normalize TOKENIZER_JSON each line → the normalizer's output
 *   gepard-tokenize --replace-invalid          each line → with invalid UTF-8 replaced by U+FFFD
 *
 * Lines end at '\n' only (a '\r' before it belongs to the line); a last line without '\n' counts;
 * every input line gives exactly one output line. Errors go to stderr with exit status 1. */
#include "gepard-tokenizer.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum
{
  MODE_ENCODE,
  MODE_DECODE,
  MODE_NORMALIZE,
  MODE_REPLACE_INVALID,
} Mode;

/* Parses a line of whitespace-separated ids into `ids`. */
static gboolean
parse_ids (const char *line, gsize len, GArray *ids, guint64 line_number, GError **error)
{
  gsize i = 0;

  g_array_set_size (ids, 0);
  while (i < len)
    {
      if (g_ascii_isspace (line[i]))
        {
          i++;
          continue;
        }
      gsize start = i;
      while (i < len && !g_ascii_isspace (line[i]))
        i++;
      g_autofree char *word = g_strndup (line + start, i - start);
      gint64 id;
      if (strlen (word) != i - start
          || !g_ascii_string_to_signed (word, 10, G_MININT32, G_MAXINT32, &id, NULL))
        {
          g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                       "line %" G_GUINT64_FORMAT ": \"%s\" is not a token id", line_number, word);
          return FALSE;
        }
      gint32 id32 = (gint32)id;
      g_array_append_val (ids, id32);
    }
  return TRUE;
}

static gboolean
process_line (const GepardTokenizer *tokenizer, Mode mode, const char *line, gsize len,
              guint64 line_number, GString *out, GArray *scratch_ids, GError **error)
{
  g_autofree char *text = NULL;
  gsize text_len = 0;

  g_string_truncate (out, 0);
  switch (mode)
    {
    case MODE_ENCODE:
      {
        g_autoptr (GArray) ids = gepard_tokenizer_encode (tokenizer, line, len, error);
        if (ids == NULL)
          {
            g_prefix_error (error, "line %" G_GUINT64_FORMAT ": ", line_number);
            return FALSE;
          }
        for (guint i = 0; i < ids->len; i++)
          {
            /* ids are never negative */
            char digits[16];
            guint n = 0;
            guint32 id = g_array_index (ids, gint32, i);
            do
              digits[n++] = '0' + id % 10;
            while (id /= 10);
            if (i)
              g_string_append_c (out, ' ');
            while (n)
              g_string_append_c (out, digits[--n]);
          }
        break;
      }
    case MODE_DECODE:
      if (!parse_ids (line, len, scratch_ids, line_number, error))
        return FALSE;
      text = gepard_tokenizer_decode_len (tokenizer, (const gint32 *)scratch_ids->data,
                                          scratch_ids->len, &text_len);
      g_string_append_len (out, text, text_len);
      break;
    case MODE_NORMALIZE:
      text = gepard_tokenizer_normalize (tokenizer, line, len, &text_len);
      g_string_append_len (out, text, text_len);
      break;
    case MODE_REPLACE_INVALID:
      text = gepard_tokenizer_replace_invalid_utf8 (line, len, &text_len);
      g_string_append_len (out, text, text_len);
      break;
    }
  g_string_append_c (out, '\n');
  return TRUE;
}

int
main (int argc, char **argv)
{
  gboolean decode = FALSE, normalize = FALSE, replace_invalid = FALSE;
  GOptionEntry entries[] = {
      {"decode", 'd', 0, G_OPTION_ARG_NONE, &decode, "Read lines of token ids, print their text",
       NULL},
      {"normalize", 'n', 0, G_OPTION_ARG_NONE, &normalize,
       "Print each line as the tokenizer's normalizer leaves it", NULL},
      {"replace-invalid", 0, 0, G_OPTION_ARG_NONE, &replace_invalid,
       "Print each line with invalid UTF-8 replaced by U+FFFD (no tokenizer needed)", NULL},
      G_OPTION_ENTRY_NULL,
  };
  g_autoptr (GOptionContext) context = g_option_context_new ("[TOKENIZER_JSON]");
  g_autoptr (GError) error = NULL;

  g_option_context_set_summary (context,
                                "Tokenizes standard input line by line ('\\n' ends a line) and "
                                "prints one line of output per line of input.");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gepard-tokenize: %s\n", error->message);
      return 1;
    }
  if (decode + normalize + replace_invalid > 1)
    {
      g_printerr ("gepard-tokenize: --decode, --normalize and --replace-invalid exclude each "
                  "other\n");
      return 1;
    }
  Mode mode = decode            ? MODE_DECODE
              : normalize       ? MODE_NORMALIZE
              : replace_invalid ? MODE_REPLACE_INVALID
                                : MODE_ENCODE;
  if (argc != (mode == MODE_REPLACE_INVALID ? 1 : 2))
    {
      g_autofree char *help = g_option_context_get_help (context, TRUE, NULL);
      g_printerr ("%s", help);
      return 1;
    }

  g_autoptr (GepardTokenizer) tokenizer = NULL;
  if (mode != MODE_REPLACE_INVALID)
    {
      tokenizer = gepard_tokenizer_new_from_file (argv[1], &error);
      if (tokenizer == NULL)
        {
          g_printerr ("gepard-tokenize: %s\n", error->message);
          return 1;
        }
    }

  static char out_buffer[1 << 16];
  setvbuf (stdout, out_buffer, _IOFBF, sizeof out_buffer);

  g_autoptr (GString) out = g_string_new (NULL);
  g_autoptr (GArray) ids = g_array_new (FALSE, FALSE, sizeof (gint32));
  char *line = NULL;
  size_t capacity = 0;
  ssize_t n;
  guint64 line_number = 0;
  int status = 0;
  while ((n = getline (&line, &capacity, stdin)) >= 0)
    {
      gsize len = n;
      if (len > 0 && line[len - 1] == '\n')
        len--;
      line_number++;
      if (!process_line (tokenizer, mode, line, len, line_number, out, ids, &error))
        {
          g_printerr ("gepard-tokenize: %s\n", error->message);
          status = 1;
          break;
        }
      if (fwrite (out->str, 1, out->len, stdout) != out->len)
        break;
    }
  if (status == 0 && ferror (stdin))
    {
      g_printerr ("gepard-tokenize: reading standard input: %s\n", g_strerror (errno));
      status = 1;
    }
  free (line);
  if (fflush (stdout) != 0 || ferror (stdout))
    {
      g_printerr ("gepard-tokenize: writing standard output failed\n");
      status = 1;
    }
  return status;
}
