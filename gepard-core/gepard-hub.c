/* gepard-hub.c: resolving a model name to a directory, offline, in the Hugging Face cache layout.
 */
#include "gepard-hub.h"

#include "gepard-build-config.h"
#include "gepard-error.h"

#include <string.h>

char *
gepard_hub_cache_dir (void)
{
  const char *cache = g_getenv ("HF_HUB_CACHE");
  if (cache != NULL && *cache != '\0')
    return g_strdup (cache);

  const char *home = g_getenv ("HF_HOME");
  if (home != NULL && *home != '\0')
    return g_build_filename (home, "hub", NULL);

  /* XDG_CACHE_HOME, else ~/.cache, as huggingface_hub does */
  return g_build_filename (g_get_user_cache_dir (), "huggingface", "hub", NULL);
}

static gboolean
is_repo_part (const char *s, gsize len)
{
  if (len == 0 || len > 96)
    return FALSE;
  if (s[0] == '.' || s[0] == '-' || s[len - 1] == '.')
    return FALSE;
  for (gsize i = 0; i < len; i++)
    {
      char c = s[i];
      if (!(g_ascii_isalnum (c) || c == '-' || c == '_' || c == '.'))
        return FALSE;
    }
  /* ".." would escape the cache directory */
  return g_strstr_len (s, len, "..") == NULL;
}

static gboolean
is_revision (const char *s)
{
  gsize len = strlen (s);
  if (len == 0 || len > 128 || s[0] == '.')
    return FALSE;
  for (gsize i = 0; i < len; i++)
    if (!(g_ascii_isalnum (s[i]) || s[i] == '-' || s[i] == '_' || s[i] == '.'))
      return FALSE;
  return strstr (s, "..") == NULL;
}

/* Splits "owner/name[@rev]"; rev is NULL when absent. */
static gboolean
split_repo_id (const char *name, char **owner, char **repo, char **rev)
{
  const char *slash = strchr (name, '/');
  if (slash == NULL || strchr (slash + 1, '/') != NULL)
    return FALSE;
  const char *at = strchr (slash + 1, '@');
  gsize repo_len = at != NULL ? (gsize)(at - slash - 1) : strlen (slash + 1);

  if (!is_repo_part (name, slash - name) || !is_repo_part (slash + 1, repo_len))
    return FALSE;
  if (at != NULL && !is_revision (at + 1))
    return FALSE;

  if (owner != NULL)
    *owner = g_strndup (name, slash - name);
  if (repo != NULL)
    *repo = g_strndup (slash + 1, repo_len);
  if (rev != NULL)
    *rev = at != NULL ? g_strdup (at + 1) : NULL;
  return TRUE;
}

gboolean
gepard_hub_is_repo_id (const char *name)
{
  return name != NULL && split_repo_id (name, NULL, NULL, NULL);
}

gboolean
gepard_hub_split_repo_id (const char *name, char **repo, char **revision, GError **error)
{
  g_autofree char *owner = NULL, *repo_name = NULL, *rev = NULL;
  if (name == NULL || !split_repo_id (name, &owner, &repo_name, &rev))
    {
      g_set_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_INVALID_NAME,
                   "“%s” is not a Hugging Face repo id (owner/name or owner/name@revision)",
                   name != NULL ? name : "");
      return FALSE;
    }
  if (repo != NULL)
    *repo = g_strdup_printf ("%s/%s", owner, repo_name);
  if (revision != NULL)
    *revision = g_steal_pointer (&rev);
  return TRUE;
}

char *
gepard_hub_repo_dir (const char *repo)
{
  /* "owner/name" → "models--owner--name" */
  g_auto (GStrv) parts = g_strsplit (repo, "/", -1);
  g_autofree char *joined = g_strjoinv ("--", parts);
  g_autofree char *folder = g_strconcat ("models--", joined, NULL);
  g_autofree char *cache = gepard_hub_cache_dir ();
  return g_build_filename (cache, folder, NULL);
}

gboolean
gepard_hub_is_offline (void)
{
  const char *value = g_getenv ("HF_HUB_OFFLINE");
  if (value == NULL)
    return FALSE;
  return g_ascii_strcasecmp (value, "1") == 0 || g_ascii_strcasecmp (value, "true") == 0
         || g_ascii_strcasecmp (value, "yes") == 0 || g_ascii_strcasecmp (value, "on") == 0;
}

static gboolean
is_commit_hash (const char *s)
{
  gsize len = strlen (s);
  if (len != 40 && len != 64)
    return FALSE;
  for (gsize i = 0; i < len; i++)
    if (!g_ascii_isxdigit (s[i]))
      return FALSE;
  return TRUE;
}

/* The snapshot directory for `rev` (a ref name or a commit hash) under `repo_dir`. */
static char *
find_snapshot (const char *repo_dir, const char *rev, GString *tried)
{
  g_autofree char *ref_path = g_build_filename (repo_dir, "refs", rev, NULL);
  g_autofree char *commit = NULL;

  if (g_file_get_contents (ref_path, &commit, NULL, NULL))
    {
      g_strstrip (commit);
      if (!is_commit_hash (commit))
        {
          g_string_append_printf (tried, "; %s does not hold a commit hash", ref_path);
          return NULL;
        }
    }
  else if (is_commit_hash (rev))
    commit = g_strdup (rev);
  else
    {
      g_string_append_printf (tried, "; no ref file %s", ref_path);
      return NULL;
    }

  char *snapshot = g_build_filename (repo_dir, "snapshots", commit, NULL);
  if (!g_file_test (snapshot, G_FILE_TEST_IS_DIR))
    {
      g_string_append_printf (tried, "; no snapshot directory %s", snapshot);
      g_free (snapshot);
      return NULL;
    }
  return snapshot;
}

char *
gepard_hub_resolve (const char *model, GError **error)
{
  g_return_val_if_fail (model != NULL, NULL);

  if (*model == '\0')
    {
      g_set_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_INVALID_NAME,
                   "No model given: pass a model directory or a Hugging Face repo id");
      return NULL;
    }

  if (g_file_test (model, G_FILE_TEST_IS_DIR))
    return g_strdup (model);

  g_autofree char *owner = NULL, *repo = NULL, *rev = NULL;
  if (g_path_is_absolute (model) || model[0] == '.' || !split_repo_id (model, &owner, &repo, &rev))
    {
      g_set_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND,
                   "Model “%s” is not a directory and not a Hugging Face repo id (owner/name)",
                   model);
      return NULL;
    }

  g_autofree char *cache = gepard_hub_cache_dir ();
  g_autofree char *folder = g_strdup_printf ("models--%s--%s", owner, repo);
  g_autofree char *repo_dir = g_build_filename (cache, folder, NULL);
  g_autoptr (GString) tried = g_string_new (NULL);

  if (!g_file_test (repo_dir, G_FILE_TEST_IS_DIR))
    {
      g_set_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND,
                   "Model “%s” is not in the local Hugging Face cache (%s does not exist); "
                   "download it first or set HF_HUB_CACHE / HF_HOME to the cache that holds it",
                   model, repo_dir);
      return NULL;
    }

  char *snapshot = find_snapshot (repo_dir, rev != NULL ? rev : "main", tried);
  if (snapshot != NULL)
    return snapshot;

  g_set_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND,
               "Model “%s” has no usable snapshot in the local Hugging Face cache%s", model,
               tried->str);
  return NULL;
}

char *
gepard_hub_default_model (void)
{
  const char *named = g_getenv ("GEPARD_MODEL");
  if (named != NULL && *named != '\0')
    return g_strdup (named);
  const char *places[] = {GEPARD_DATA_DIR, GEPARD_SOURCE_DIR "/models"};
  for (guint i = 0; i < G_N_ELEMENTS (places); i++)
    {
      g_autofree char *dir = g_build_filename (places[i], "voice", NULL);
      g_autofree char *config = g_build_filename (dir, "config.json", NULL);
      if (g_file_test (config, G_FILE_TEST_IS_REGULAR))
        return g_steal_pointer (&dir);
    }
  return NULL;
}
