/* gepard-clone-form.c: POST /voices/clone's form, through libsoup's multipart parser. */
#include "gepard-clone-form.h"

#include "gepard-api-error.h"

#include <libsoup/soup.h>
#include <string.h>

/* A text field's value: UTF-8 without NULs, stripped; NULL otherwise. */
static char *
part_text (GBytes *body)
{
  gsize size;
  const char *data = g_bytes_get_data (body, &size);
  if (data == NULL)
    return g_strdup ("");
  if (!g_utf8_validate_len (data, size, NULL) || memchr (data, 0, size) != NULL)
    return NULL;
  return g_strstrip (g_strndup (data, size));
}

gboolean
gepard_clone_form_parse (const char *content_type, GBytes *body, GepardCloneForm *form,
                         GError **error)
{
  memset (form, 0, sizeof *form);

  g_autoptr (SoupMessageHeaders) headers = soup_message_headers_new (SOUP_MESSAGE_HEADERS_REQUEST);
  /* a header value never holds a line break (libsoup's parser splits there) */
  if (content_type != NULL && strpbrk (content_type, "\r\n") == NULL)
    soup_message_headers_replace (headers, "Content-Type", content_type);
  /* libsoup 3.2's multipart parser looks for the boundary with strstr (), so it reads past a
   * body that does not end in a NUL: it gets a copy that does */
  gsize size;
  const char *data = g_bytes_get_data (body, &size);
  char *terminated = g_malloc (size + 1);
  if (size > 0)
    memcpy (terminated, data, size);
  terminated[size] = '\0';
  g_autoptr (GBytes) safe_body = g_bytes_new_with_free_func (terminated, size, g_free, terminated);
  SoupMultipart *multipart = soup_multipart_new_from_message (headers, safe_body);
  if (multipart == NULL)
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                           "POST /voices/clone takes multipart/form-data with clip, name, "
                           "language and description");
      return FALSE;
    }
  for (int i = 0; i < soup_multipart_get_length (multipart); i++)
    {
      SoupMessageHeaders *part_headers;
      GBytes *part;
      g_autoptr (GHashTable) params = NULL;
      if (!soup_multipart_get_part (multipart, i, &part_headers, &part))
        continue;
      /* libsoup 3.2 cuts a part that is empty and ends the body to a length below zero (a huge
       * unsigned one): no part can be longer than the body it came from */
      if (part == NULL || g_bytes_get_size (part) > size)
        {
          soup_multipart_free (multipart);
          g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                               "The multipart/form-data body is malformed");
          gepard_clone_form_clear (form);
          return FALSE;
        }
      if (!soup_message_headers_get_content_disposition (part_headers, NULL, &params))
        continue;
      const char *name = g_hash_table_lookup (params, "name");
      char **field = NULL;
      if (g_strcmp0 (name, "clip") == 0)
        {
          g_clear_pointer (&form->clip, g_bytes_unref);
          form->clip = g_bytes_ref (part);
          continue;
        }
      else if (g_strcmp0 (name, "name") == 0)
        field = &form->name;
      else if (g_strcmp0 (name, "language") == 0)
        field = &form->language;
      else if (g_strcmp0 (name, "description") == 0)
        field = &form->description;
      else if (g_strcmp0 (name, "accent") == 0)
        field = &form->accent;
      else if (g_strcmp0 (name, "gender") == 0)
        field = &form->gender;
      if (field == NULL)
        continue; /* mode, enhance, transcript, base_voice_id: nothing to do with them */
      g_free (*field);
      *field = part_text (part);
      if (*field == NULL)
        {
          soup_multipart_free (multipart);
          g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                       "%s must be UTF-8 text", name);
          gepard_clone_form_clear (form);
          return FALSE;
        }
    }
  soup_multipart_free (multipart);

  if (form->clip == NULL || g_bytes_get_size (form->clip) == 0)
    g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                         "clip is required: a reference recording of 3 to 15 seconds");
  else if (form->name == NULL || form->name[0] == '\0')
    g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST, "name is required");
  else
    {
      if (form->language == NULL || form->language[0] == '\0')
        {
          g_free (form->language);
          form->language = g_strdup ("en");
        }
      return TRUE;
    }
  gepard_clone_form_clear (form);
  return FALSE;
}

void
gepard_clone_form_clear (GepardCloneForm *form)
{
  g_clear_pointer (&form->clip, g_bytes_unref);
  g_free (form->name);
  g_free (form->language);
  g_free (form->description);
  g_free (form->accent);
  g_free (form->gender);
  memset (form, 0, sizeof *form);
}
