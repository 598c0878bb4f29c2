/* Resolving models given as paths or as repo ids in a local Hugging Face cache. */
#include "gepard-build-config.h"
#include "gepard-error.h"
#include "gepard-hub.h"

#include <stdlib.h>
#include <string.h>

static char *cache_root;

static void
make_snapshot (const char *repo_folder, const char *ref, const char *commit)
{
  g_autofree char *snapshot = g_build_filename (cache_root, repo_folder, "snapshots", commit, NULL);
  g_autofree char *refs = g_build_filename (cache_root, repo_folder, "refs", NULL);
  g_autofree char *ref_file = g_build_filename (refs, ref, NULL);
  g_assert_cmpint (g_mkdir_with_parents (snapshot, 0755), ==, 0);
  g_assert_cmpint (g_mkdir_with_parents (refs, 0755), ==, 0);
  g_autofree char *contents = g_strconcat (commit, "\n", NULL);
  g_assert_true (g_file_set_contents (ref_file, contents, -1, NULL));
}

static void
test_cache_dir_precedence (void)
{
  g_setenv ("HF_HUB_CACHE", "/x/hub-cache", TRUE);
  g_setenv ("HF_HOME", "/x/hf-home", TRUE);
  g_autofree char *a = gepard_hub_cache_dir ();
  g_assert_cmpstr (a, ==, "/x/hub-cache");

  g_unsetenv ("HF_HUB_CACHE");
  g_autofree char *b = gepard_hub_cache_dir ();
  g_assert_cmpstr (b, ==, "/x/hf-home/hub");

  g_unsetenv ("HF_HOME");
  g_autofree char *c = gepard_hub_cache_dir ();
  g_autofree char *expected
      = g_build_filename (g_get_user_cache_dir (), "huggingface", "hub", NULL);
  g_assert_cmpstr (c, ==, expected);

  g_setenv ("HF_HUB_CACHE", cache_root, TRUE);
}

static void
test_repo_id_shape (void)
{
  g_assert_true (gepard_hub_is_repo_id ("nineninesix/gepard-1.0"));
  g_assert_true (gepard_hub_is_repo_id ("nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps"));
  g_assert_true (gepard_hub_is_repo_id ("owner/name@v1.0"));
  g_assert_false (gepard_hub_is_repo_id ("name"));
  g_assert_false (gepard_hub_is_repo_id ("a/b/c"));
  g_assert_false (gepard_hub_is_repo_id ("../etc"));
  g_assert_false (gepard_hub_is_repo_id ("owner/.."));
  g_assert_false (gepard_hub_is_repo_id ("owner/na me"));
  g_assert_false (gepard_hub_is_repo_id ("owner/name@"));
  g_assert_false (gepard_hub_is_repo_id ("owner/name@../../x"));
  g_assert_false (gepard_hub_is_repo_id ("/owner"));
  g_assert_false (gepard_hub_is_repo_id (""));
}

static void
test_resolve_directory (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = gepard_hub_resolve (cache_root, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (dir, ==, cache_root);
}

static void
test_resolve_repo (void)
{
  const char *commit = "0123456789abcdef0123456789abcdef01234567";
  const char *other = "fedcba9876543210fedcba9876543210fedcba98";
  make_snapshot ("models--owner--model", "main", commit);
  make_snapshot ("models--owner--model", "v2", other);

  g_autoptr (GError) error = NULL;
  g_autofree char *main_dir = gepard_hub_resolve ("owner/model", &error);
  g_assert_no_error (error);
  g_autofree char *expected
      = g_build_filename (cache_root, "models--owner--model", "snapshots", commit, NULL);
  g_assert_cmpstr (main_dir, ==, expected);

  g_autofree char *v2 = gepard_hub_resolve ("owner/model@v2", &error);
  g_assert_no_error (error);
  g_assert_true (g_str_has_suffix (v2, other));

  /* a commit hash given directly, without a ref file */
  g_autofree char *by_hash = g_strdup_printf ("owner/model@%s", commit);
  g_autofree char *hashed = gepard_hub_resolve (by_hash, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (hashed, ==, expected);
}

static void
test_resolve_missing (void)
{
  g_autoptr (GError) error = NULL;
  g_autofree char *dir = gepard_hub_resolve ("owner/absent", &error);
  g_assert_null (dir);
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND);
  g_assert_nonnull (strstr (error->message, "models--owner--absent"));
  g_assert_nonnull (strstr (error->message, "HF_HUB_CACHE"));
  g_clear_error (&error);

  /* ref names a snapshot that is not there */
  g_autofree char *refs = g_build_filename (cache_root, "models--owner--broken", "refs", NULL);
  g_autofree char *ref = g_build_filename (refs, "main", NULL);
  g_assert_cmpint (g_mkdir_with_parents (refs, 0755), ==, 0);
  g_assert_true (g_file_set_contents (ref, "1111111111111111111111111111111111111111", -1, NULL));
  dir = gepard_hub_resolve ("owner/broken", &error);
  g_assert_null (dir);
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND);
  g_assert_nonnull (strstr (error->message, "no snapshot directory"));
  g_clear_error (&error);

  /* a ref file with garbage */
  g_assert_true (g_file_set_contents (ref, "../../../etc", -1, NULL));
  dir = gepard_hub_resolve ("owner/broken", &error);
  g_assert_null (dir);
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND);
  g_clear_error (&error);

  /* neither a directory nor a repo id */
  dir = gepard_hub_resolve ("/no/such/model/dir", &error);
  g_assert_null (dir);
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_NOT_FOUND);
  g_assert_nonnull (strstr (error->message, "not a directory"));
  g_clear_error (&error);

  dir = gepard_hub_resolve ("", &error);
  g_assert_null (dir);
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_INVALID_NAME);
}

/* GEPARD_MODEL, else the installed default voice, else the source tree's, else none */
static void
test_default_model (void)
{
  g_setenv ("GEPARD_MODEL", "/x/some-model", TRUE);
  g_autofree char *named = gepard_hub_default_model ();
  g_assert_cmpstr (named, ==, "/x/some-model");

  g_setenv ("GEPARD_MODEL", "", TRUE);
  g_autofree char *shipped = gepard_hub_default_model ();
  g_unsetenv ("GEPARD_MODEL");
  g_autofree char *installed = g_build_filename (GEPARD_DATA_DIR, "voice", NULL);
  g_autofree char *source = g_build_filename (GEPARD_SOURCE_DIR, "models", "voice", NULL);
  g_autofree char *installed_config = g_build_filename (installed, "config.json", NULL);
  g_autofree char *source_config = g_build_filename (source, "config.json", NULL);
  if (g_file_test (installed_config, G_FILE_TEST_IS_REGULAR))
    g_assert_cmpstr (shipped, ==, installed);
  else if (g_file_test (source_config, G_FILE_TEST_IS_REGULAR))
    g_assert_cmpstr (shipped, ==, source);
  else
    g_assert_null (shipped);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  cache_root = g_dir_make_tmp ("gepard-hub-XXXXXX", NULL);
  g_assert_nonnull (cache_root);
  g_setenv ("HF_HUB_CACHE", cache_root, TRUE);

  g_test_add_func ("/hub/cache-dir-precedence", test_cache_dir_precedence);
  g_test_add_func ("/hub/repo-id-shape", test_repo_id_shape);
  g_test_add_func ("/hub/resolve-directory", test_resolve_directory);
  g_test_add_func ("/hub/resolve-repo", test_resolve_repo);
  g_test_add_func ("/hub/resolve-missing", test_resolve_missing);
  g_test_add_func ("/hub/default-model", test_default_model);
  int status = g_test_run ();

  g_autofree char *command = g_strdup_printf ("rm -rf '%s'", cache_root);
  (void)!system (command);
  g_free (cache_root);
  return status;
}
