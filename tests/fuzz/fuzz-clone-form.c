/* fuzz-clone-form.c: the multipart/form-data body of POST /voices/clone. The input is the
 * Content-Type header's value, a newline, then the body. An accepted form has a clip and a name,
 * and its text fields are UTF-8 without NULs. */
#include "fuzz-common.h"
#include "gepard-api-error.h"
#include "gepard-clone-form.h"

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

static void
check_text (const char *text)
{
  if (text != NULL)
    g_assert_true (g_utf8_validate (text, -1, NULL));
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const uint8_t *newline = memchr (data, '\n', size);
  g_autofree char *content_type = NULL;
  g_autoptr (GBytes) body = NULL;

  if (newline == NULL)
    body = g_bytes_new (data, size);
  else
    {
      content_type = g_strndup ((const char *)data, newline - data);
      body = g_bytes_new (newline + 1, size - (newline + 1 - data));
    }

  g_auto (GepardCloneForm) form = {0};
  g_autoptr (GError) error = NULL;
  gboolean ok = gepard_clone_form_parse (content_type, body, &form, &error);
  fuzz_check_outcome (ok, error, GEPARD_API_ERROR);
  if (!ok)
    {
      g_assert_cmpuint (gepard_api_error_get_status (error), ==, 400);
      g_assert_null (form.clip);
      g_assert_null (form.name);
      return 0;
    }
  g_assert_nonnull (form.clip);
  g_assert_cmpuint (g_bytes_get_size (form.clip), >, 0);
  g_assert_true (form.name != NULL && form.name[0] != '\0');
  g_assert_true (form.language != NULL && form.language[0] != '\0');
  check_text (form.name);
  check_text (form.language);
  check_text (form.description);
  check_text (form.accent);
  check_text (form.gender);
  return 0;
}
