/* gepard-clone-form.h: the multipart/form-data body of POST /voices/clone (cartesia-protocol.md
 * §4), read from its Content-Type and bytes alone so that it can be tested and fuzzed without a
 * server. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct
{
  GBytes *clip;      /* the reference recording, as sent: not empty */
  char *name;        /* not empty */
  char *language;    /* "en" when not given */
  char *description; /* the text fields are UTF-8 without NULs, stripped; NULL when absent */
  char *accent;
  char *gender;
} GepardCloneForm;

/* Fills `form` from a request body and its Content-Type header (NULL when there was none). Parts
 * other than clip, name, language, description, accent and gender are ignored; a field given
 * twice takes its last value. Errors are GEPARD_API_ERROR_BAD_REQUEST, saying what is wrong. */
gboolean gepard_clone_form_parse (const char *content_type, GBytes *body, GepardCloneForm *form,
                                  GError **error);
void gepard_clone_form_clear (GepardCloneForm *form);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (GepardCloneForm, gepard_clone_form_clear)

G_END_DECLS
