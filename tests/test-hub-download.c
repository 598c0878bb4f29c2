/* The hub client's pure parts: ETags as cache file names, and the codec file of a snapshot. The
 * protocol itself is tested against a hub over HTTP (tests/python/test_hub_download.py). */
#include "gepard-error.h"
#include "gepard-hub-download.h"
#include "gepard-hub.h"

#include <glib/gstdio.h>
#include <string.h>

static void
check_etag (const char *header, const char *expected)
{
  g_autofree char *etag = gepard_hub_normalize_etag (header);
  g_assert_cmpstr (etag, ==, expected);
}

static void
test_normalize_etag (void)
{
  const char *sha256 = "16136ce5a29aa10327bc0680635534f37cc513565290ae93298376d0b4731e7a";
  g_autofree char *quoted = g_strdup_printf ("\"%s\"", sha256);
  g_autofree char *weak = g_strdup_printf ("W/\"%s\"", sha256);
  check_etag (quoted, sha256);
  check_etag (weak, sha256);
  check_etag (sha256, sha256);
  check_etag ("\"a8b1c2d3-1\"", "a8b1c2d3-1");
  check_etag (NULL, NULL);
  check_etag ("", NULL);
  check_etag ("\"\"", NULL);
  /* never a path out of blobs/ */
  check_etag ("\"../../x\"", NULL);
  check_etag ("\"a/b\"", NULL);
  check_etag ("\".hidden\"", NULL);
  check_etag ("\"a b\"", NULL);
}

static void
touch (const char *dir, const char *name)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);
  g_assert_true (g_file_set_contents (path, "x", 1, NULL));
}

static void
test_codec_file (void)
{
  g_autofree char *dir = g_dir_make_tmp ("gepard-hub-download-XXXXXX", NULL);
  g_autoptr (GError) error = NULL;

  g_assert_false (gepard_hub_model_has_codec (dir));
  g_autofree char *none = gepard_hub_find_codec_file (dir, &error);
  g_assert_null (none);
  g_assert_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND);
  g_clear_error (&error);

  touch (dir, "codec.safetensors");
  g_assert_true (gepard_hub_model_has_codec (dir));
  g_autofree char *safetensors = gepard_hub_find_codec_file (dir, &error);
  g_assert_true (g_str_has_suffix (safetensors, "/codec.safetensors"));

  /* a .nemo file comes first, the first by name */
  touch (dir, "b.nemo");
  touch (dir, "a.nemo");
  g_autofree char *nemo = gepard_hub_find_codec_file (dir, &error);
  g_assert_no_error (error);
  g_assert_true (g_str_has_suffix (nemo, "/a.nemo"));

  const char *names[] = {"codec.safetensors", "a.nemo", "b.nemo"};
  for (gsize i = 0; i < G_N_ELEMENTS (names); i++)
    {
      g_autofree char *path = g_build_filename (dir, names[i], NULL);
      g_unlink (path);
    }
  g_rmdir (dir);
}

static void
test_repo_names (void)
{
  g_autofree char *repo = NULL, *revision = NULL;
  g_autoptr (GError) error = NULL;
  g_assert_true (gepard_hub_split_repo_id ("owner/name@v1.0", &repo, &revision, &error));
  g_assert_cmpstr (repo, ==, "owner/name");
  g_assert_cmpstr (revision, ==, "v1.0");
  g_clear_pointer (&repo, g_free);
  g_clear_pointer (&revision, g_free);
  g_assert_true (gepard_hub_split_repo_id ("owner/name", &repo, &revision, &error));
  g_assert_null (revision);
  g_assert_false (gepard_hub_split_repo_id ("owner/../x", NULL, NULL, &error));
  g_assert_error (error, GEPARD_HUB_ERROR, GEPARD_HUB_ERROR_INVALID_NAME);

  g_setenv ("HF_HUB_CACHE", "/cache", TRUE);
  g_autofree char *dir = gepard_hub_repo_dir ("owner/name");
  g_assert_cmpstr (dir, ==, "/cache/models--owner--name");

  const char *on[] = {"1", "true", "TRUE", "yes", "on"}, *off[] = {"0", "", "false", "no"};
  for (gsize i = 0; i < G_N_ELEMENTS (on); i++)
    {
      g_setenv ("HF_HUB_OFFLINE", on[i], TRUE);
      g_assert_true (gepard_hub_is_offline ());
    }
  for (gsize i = 0; i < G_N_ELEMENTS (off); i++)
    {
      g_setenv ("HF_HUB_OFFLINE", off[i], TRUE);
      g_assert_false (gepard_hub_is_offline ());
    }
  g_unsetenv ("HF_HUB_OFFLINE");
  g_assert_false (gepard_hub_is_offline ());
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  g_test_add_func ("/hub-download/normalize-etag", test_normalize_etag);
  g_test_add_func ("/hub-download/codec-file", test_codec_file);
  g_test_add_func ("/hub-download/repo-names", test_repo_names);
  return g_test_run ();
}
