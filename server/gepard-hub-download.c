/* gepard-hub-download.c: a Hugging Face hub client (libsoup 3, synchronous, on the caller's
 * worker thread) filling the local cache in huggingface_hub's layout. */
#include "gepard-hub-download.h"

#include "gepard-build-config.h"
#include "gepard-hub.h"

#include <errno.h>
#include <glib/gstdio.h>
#include <fcntl.h>
#include <json-glib/json-glib.h>
#include <libsoup/soup.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_ENDPOINT "https://huggingface.co"
#define IO_TIMEOUT_S 60
#define MAX_REDIRECTS 10
/* attempts in a row that bring no new byte before a file is given up */
#define MAX_IDLE_ATTEMPTS 5
#define READ_SIZE (256 * 1024)

G_DEFINE_QUARK (gepard - hub - download - error - quark, gepard_hub_download_error)

typedef struct
{
  char *name;      /* path in the repo */
  char *etag;      /* normalized: the blob's file name */
  gint64 size;     /* -1 when unknown */
  char *location;  /* where GET finds the content (the resolve URL or the CDN's) */
  gboolean cached; /* the blob is already in the cache */
} RemoteFile;

typedef struct
{
  SoupSession *session;
  GUri *endpoint_uri;
  char *endpoint;
  char *token;
  GCancellable *cancellable;
  GepardHubProgressFunc progress;
  gpointer user_data;

  char *repo;     /* owner/name */
  char *revision; /* as asked for: a branch, a tag or a commit */
  char *commit;   /* once known */
  char *repo_dir;
  char *locks_dir;
  guint64 bytes_done;
  guint64 bytes_total;
} Fetch;

static void
remote_file_free (RemoteFile *file)
{
  g_free (file->name);
  g_free (file->etag);
  g_free (file->location);
  g_free (file);
}

static void
fetch_clear (Fetch *f)
{
  g_clear_object (&f->session);
  g_clear_pointer (&f->endpoint_uri, g_uri_unref);
  g_free (f->endpoint);
  if (f->token != NULL)
    memset (f->token, 0, strlen (f->token));
  g_free (f->token);
  g_free (f->repo);
  g_free (f->revision);
  g_free (f->commit);
  g_free (f->repo_dir);
  g_free (f->locks_dir);
}

/* ---- progress ---- */

static void report (Fetch *f, const RemoteFile *file, guint64 file_done, const char *format, ...)
    G_GNUC_PRINTF (4, 5);

static void
report (Fetch *f, const RemoteFile *file, guint64 file_done, const char *format, ...)
{
  if (f->progress == NULL)
    return;
  g_autofree char *note = NULL;
  if (format != NULL)
    {
      va_list args;
      va_start (args, format);
      note = g_strdup_vprintf (format, args);
      va_end (args);
    }
  GepardHubProgress p = {
      .repo = f->repo,
      .file = file != NULL ? file->name : NULL,
      .file_done = file_done,
      .file_total = file != NULL ? file->size : -1,
      .bytes_done = f->bytes_done,
      .bytes_total = f->bytes_total,
      .note = note,
  };
  f->progress (&p, f->user_data);
}

/* ---- names ---- */

char *
gepard_hub_normalize_etag (const char *etag)
{
  if (etag == NULL)
    return NULL;
  const char *s = etag;
  if (g_str_has_prefix (s, "W/"))
    s += 2;
  gsize len = strlen (s);
  while (len > 0 && *s == '"')
    s++, len--;
  while (len > 0 && s[len - 1] == '"')
    len--;
  if (len == 0 || len > 128 || s[0] == '.')
    return NULL;
  for (gsize i = 0; i < len; i++)
    if (!(g_ascii_isalnum (s[i]) || s[i] == '-' || s[i] == '_' || s[i] == '.'))
      return NULL;
  return g_strndup (s, len);
}

/* A path inside the repo that cannot leave the snapshot directory. */
static gboolean
is_safe_repo_path (const char *name)
{
  if (name == NULL || name[0] == '\0' || name[0] == '/' || strchr (name, '\\') != NULL)
    return FALSE;
  g_auto (GStrv) parts = g_strsplit (name, "/", -1);
  for (char **p = parts; *p != NULL; p++)
    if ((*p)[0] == '\0' || strcmp (*p, ".") == 0 || strcmp (*p, "..") == 0)
      return FALSE;
  return TRUE;
}

static gboolean
is_hex (const char *s, gsize len)
{
  if (strlen (s) != len)
    return FALSE;
  for (gsize i = 0; i < len; i++)
    if (!g_ascii_isxdigit (s[i]))
      return FALSE;
  return TRUE;
}

static char *
resolve_url (Fetch *f, const char *revision, const char *name)
{
  g_autofree char *rev = g_uri_escape_string (revision, NULL, FALSE);
  g_autofree char *path = g_uri_escape_string (name, "/", FALSE);
  return g_strdup_printf ("%s/%s/resolve/%s/%s", f->endpoint, f->repo, rev, path);
}

static gboolean
same_origin (GUri *a, GUri *b)
{
  return g_ascii_strcasecmp (g_uri_get_scheme (a), g_uri_get_scheme (b)) == 0
         && g_ascii_strcasecmp (g_uri_get_host (a) ? g_uri_get_host (a) : "",
                                g_uri_get_host (b) ? g_uri_get_host (b) : "")
                == 0
         && g_uri_get_port (a) == g_uri_get_port (b);
}

/* ---- HTTP ---- */

static SoupMessage *
new_message (Fetch *f, const char *method, const char *url, GError **error)
{
  g_autoptr (GUri) uri = g_uri_parse (url, SOUP_HTTP_URI_FLAGS, NULL);
  if (uri == NULL)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                   "“%s” is not a URL", url);
      return NULL;
    }
  SoupMessage *msg = soup_message_new_from_uri (method, uri);
  SoupMessageHeaders *headers = soup_message_get_request_headers (msg);
  soup_message_add_flags (msg, SOUP_MESSAGE_NO_REDIRECT);
  /* the real size: no compression in between */
  soup_message_headers_replace (headers, "Accept-Encoding", "identity");
  /* the token goes to the hub only, never to the CDN a file is redirected to */
  if (f->token != NULL && same_origin (uri, f->endpoint_uri))
    {
      g_autofree char *bearer = g_strdup_printf ("Bearer %s", f->token);
      soup_message_headers_replace (headers, "Authorization", bearer);
    }
  return msg;
}

static gboolean
is_redirect (guint status)
{
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

static gboolean
is_transient_status (guint status)
{
  return status == 408 || status == 429 || status >= 500;
}

static gboolean
is_transient_error (const GError *error)
{
  if (g_error_matches (error, G_IO_ERROR, G_IO_ERROR_CANCELLED))
    return FALSE;
  return error->domain == G_IO_ERROR || error->domain == G_RESOLVER_ERROR
         || error->domain == G_TLS_ERROR || error->domain == SOUP_SESSION_ERROR;
}

/* The error for an HTTP status the hub answered with, in words that say what to do. */
static void
set_status_error (Fetch *f, SoupMessage *msg, const char *what, GError **error)
{
  guint status = soup_message_get_status (msg);
  SoupMessageHeaders *headers = soup_message_get_response_headers (msg);
  const char *code = soup_message_headers_get_one (headers, "X-Error-Code");
  const char *message = soup_message_headers_get_one (headers, "X-Error-Message");
  g_autofree char *detail
      = message != NULL ? g_strdup_printf (" (the hub says: %s)", message) : g_strdup ("");

  if ((status == SOUP_STATUS_UNAUTHORIZED || status == SOUP_STATUS_FORBIDDEN)
      && g_strcmp0 (code, "RepoNotFound") == 0)
    {
      /* the hub answers so for a repo that does not exist and for a private one alike */
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_UNAUTHORIZED,
                   "%s was not found on %s (HTTP %u)%s: check the repo id; if the repo is "
                   "private, set HF_TOKEN to an access token of an account that can read it",
                   f->repo, f->endpoint, status, detail);
      return;
    }
  if (status == SOUP_STATUS_UNAUTHORIZED || status == SOUP_STATUS_FORBIDDEN)
    {
      if (f->token == NULL)
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_UNAUTHORIZED,
                     "%s refused access to %s (HTTP %u)%s: the model is private or gated. Set "
                     "HF_TOKEN to an access token of an account that can read it, and accept the "
                     "model's license at %s/%s if it is gated",
                     f->endpoint, f->repo, status, detail, f->endpoint, f->repo);
      else
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_UNAUTHORIZED,
                     "%s refused access to %s with the token in HF_TOKEN (HTTP %u)%s: check that "
                     "the token is valid and can read the repo, and accept the model's license at "
                     "%s/%s if it is gated",
                     f->endpoint, f->repo, status, detail, f->endpoint, f->repo);
      return;
    }
  if (status == SOUP_STATUS_NOT_FOUND)
    {
      if (g_strcmp0 (code, "RevisionNotFound") == 0)
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
                     "%s has no revision “%s” on %s%s", f->repo, f->revision, f->endpoint, detail);
      else if (g_strcmp0 (code, "EntryNotFound") == 0)
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
                     "%s has no %s%s", f->repo, what, detail);
      else
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
                     "%s: %s is not on %s (HTTP 404)%s; a private repo answers so too "
                     "without HF_TOKEN",
                     f->repo, what, f->endpoint, detail);
      return;
    }
  g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_HTTP,
               "%s answered HTTP %u %s for %s of %s%s", f->endpoint, status,
               soup_message_get_reason_phrase (msg) ? soup_message_get_reason_phrase (msg) : "",
               what, f->repo, detail);
}

static void
backoff (Fetch *f, guint attempt)
{
  /* 0.5 s, 1 s, 2 s, 4 s, 8 s at most, in steps that notice a cancellation */
  guint ms = MIN (500u << MIN (attempt, 4u), 8000u);
  for (guint slept = 0; slept < ms && !g_cancellable_is_cancelled (f->cancellable); slept += 100)
    g_usleep (100 * 1000);
}

/* A small request (API call, HEAD), retried on network errors and on 408, 429 and 5xx. Returns
 * the message with its status and headers, and the body in `body` when asked for. Following
 * redirects is the caller's choice (`follow`: same-origin relative ones, as for a renamed repo). */
static SoupMessage *
request (Fetch *f, const char *method, const char *url, gboolean follow, GBytes **body,
         GError **error)
{
  g_autofree char *current = g_strdup (url);
  guint attempt = 0, hops = 0;

  for (;;)
    {
      g_autoptr (GError) local = NULL;
      SoupMessage *msg = new_message (f, method, current, error);
      if (msg == NULL)
        return NULL;
      GBytes *bytes = soup_session_send_and_read (f->session, msg, f->cancellable, &local);
      guint status = soup_message_get_status (msg);

      if (bytes != NULL && is_redirect (status) && follow && hops < MAX_REDIRECTS)
        {
          const char *location
              = soup_message_headers_get_one (soup_message_get_response_headers (msg), "Location");
          if (location != NULL && location[0] == '/')
            {
              g_autofree char *next
                  = g_uri_resolve_relative (current, location, SOUP_HTTP_URI_FLAGS, NULL);
              g_bytes_unref (bytes);
              g_object_unref (msg);
              if (next == NULL)
                break;
              g_free (current);
              current = g_steal_pointer (&next);
              hops++;
              continue;
            }
        }
      gboolean transient
          = bytes == NULL ? is_transient_error (local) : is_transient_status (status);
      if (transient && attempt + 1 < MAX_IDLE_ATTEMPTS)
        {
          g_autofree char *why
              = bytes == NULL ? g_strdup (local->message) : g_strdup_printf ("HTTP %u", status);
          report (f, NULL, 0, "%s %s: %s; retrying", method, current, why);
          g_clear_pointer (&bytes, g_bytes_unref);
          g_object_unref (msg);
          backoff (f, attempt++);
          continue;
        }
      if (bytes == NULL)
        {
          g_object_unref (msg);
          if (g_error_matches (local, G_IO_ERROR, G_IO_ERROR_CANCELLED))
            g_propagate_error (error, g_steal_pointer (&local));
          else
            g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_HTTP,
                         "could not reach %s for %s: %s", f->endpoint, f->repo, local->message);
          return NULL;
        }
      if (body != NULL)
        *body = bytes;
      else
        g_bytes_unref (bytes);
      return msg;
    }
  g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
               "%s: too many redirects from %s", f->repo, url);
  return NULL;
}

/* ---- what a repo holds ---- */

/* The commit and the file names from {endpoint}/api/models/{repo}/revision/{revision}. FALSE
 * with no error when the endpoint has no such API (a plain mirror): the caller asks for the known
 * files instead. */
static gboolean
list_repo (Fetch *f, GPtrArray *names, GError **error)
{
  g_autofree char *rev = g_uri_escape_string (f->revision, NULL, FALSE);
  g_autofree char *url
      = g_strdup_printf ("%s/api/models/%s/revision/%s", f->endpoint, f->repo, rev);
  g_autoptr (GBytes) body = NULL;
  g_autoptr (SoupMessage) msg = request (f, "GET", url, TRUE, &body, error);
  if (msg == NULL)
    return FALSE;

  guint status = soup_message_get_status (msg);
  const char *code
      = soup_message_headers_get_one (soup_message_get_response_headers (msg), "X-Error-Code");
  if (status == SOUP_STATUS_NOT_FOUND && code == NULL)
    return FALSE; /* no API here */
  if (status != SOUP_STATUS_OK)
    {
      set_status_error (f, msg, "the repo", error);
      return FALSE;
    }

  g_autoptr (JsonParser) parser = json_parser_new ();
  gsize size = 0;
  const char *data = g_bytes_get_data (body, &size);
  JsonObject *root = NULL;
  if (json_parser_load_from_data (parser, data, (gssize)size, NULL))
    {
      JsonNode *node = json_parser_get_root (parser);
      if (node != NULL && JSON_NODE_HOLDS_OBJECT (node))
        root = json_node_get_object (node);
    }
  const char *sha
      = root != NULL ? json_object_get_string_member_with_default (root, "sha", NULL) : NULL;
  JsonArray *siblings = root != NULL && json_object_has_member (root, "siblings")
                                && JSON_NODE_HOLDS_ARRAY (json_object_get_member (root, "siblings"))
                            ? json_object_get_array_member (root, "siblings")
                            : NULL;
  if (sha == NULL || !is_hex (sha, 40) || siblings == NULL)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                   "%s: the hub's description of revision %s has no commit sha or no file list",
                   f->repo, f->revision);
      return FALSE;
    }
  f->commit = g_ascii_strdown (sha, -1);
  for (guint i = 0; i < json_array_get_length (siblings); i++)
    {
      JsonNode *node = json_array_get_element (siblings, i);
      if (!JSON_NODE_HOLDS_OBJECT (node))
        continue;
      const char *name = json_object_get_string_member_with_default (json_node_get_object (node),
                                                                     "rfilename", NULL);
      if (name != NULL && is_safe_repo_path (name))
        g_ptr_array_add (names, g_strdup (name));
    }
  return TRUE;
}

static gboolean
names_contain (GPtrArray *names, const char *name)
{
  for (guint i = 0; i < names->len; i++)
    if (strcmp (g_ptr_array_index (names, i), name) == 0)
      return TRUE;
  return FALSE;
}

/* HEAD of the resolve URL: ETag, size, commit and where to GET the file. Returns NULL with no
 * error for an optional file the repo does not have. */
static RemoteFile *
stat_file (Fetch *f, const char *name, gboolean optional, GError **error)
{
  g_autofree char *url = resolve_url (f, f->commit != NULL ? f->commit : f->revision, name);
  g_autoptr (SoupMessage) msg = request (f, "HEAD", url, TRUE, NULL, error);
  if (msg == NULL)
    return NULL;

  guint status = soup_message_get_status (msg);
  SoupMessageHeaders *headers = soup_message_get_response_headers (msg);
  if (status == SOUP_STATUS_NOT_FOUND && optional)
    return NULL;
  if (status != SOUP_STATUS_OK && !is_redirect (status))
    {
      g_autofree char *what = g_strdup_printf ("file %s", name);
      set_status_error (f, msg, what, error);
      return NULL;
    }

  const char *commit = soup_message_headers_get_one (headers, "X-Repo-Commit");
  const char *linked_etag = soup_message_headers_get_one (headers, "X-Linked-Etag");
  const char *etag_header
      = linked_etag != NULL ? linked_etag : soup_message_headers_get_one (headers, "ETag");
  const char *linked_size = soup_message_headers_get_one (headers, "X-Linked-Size");
  const char *location = soup_message_headers_get_one (headers, "Location");

  if (f->commit == NULL)
    {
      if (commit == NULL || !is_hex (commit, 40))
        {
          g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                       "%s: %s answered for %s without an X-Repo-Commit header: it is not a "
                       "Hugging Face hub (check HF_ENDPOINT)",
                       f->repo, f->endpoint, name);
          return NULL;
        }
      f->commit = g_ascii_strdown (commit, -1);
    }

  g_autofree char *etag = gepard_hub_normalize_etag (etag_header);
  if (etag == NULL)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                   "%s: the hub gave %s no usable ETag (%s)", f->repo, name,
                   etag_header != NULL ? etag_header : "none");
      return NULL;
    }

  RemoteFile *file = g_new0 (RemoteFile, 1);
  file->name = g_strdup (name);
  file->etag = g_steal_pointer (&etag);
  file->size = -1;
  /* the size of the linked file, else the length of the answer when it is the file itself */
  const char *length = linked_size != NULL ? linked_size
                       : status == SOUP_STATUS_OK
                           ? soup_message_headers_get_one (headers, "Content-Length")
                           : NULL;
  guint64 size;
  if (length != NULL && g_ascii_string_to_unsigned (length, 10, 0, G_MAXINT64, &size, NULL))
    file->size = (gint64)size;
  /* an LFS file is redirected to its storage; anything else is served by the resolve URL */
  if (is_redirect (status) && location != NULL)
    file->location = g_uri_resolve_relative (url, location, SOUP_HTTP_URI_FLAGS, NULL);
  if (file->location == NULL)
    file->location = g_strdup (url);
  return file;
}

/* ---- blobs ---- */

static char *
blob_path (Fetch *f, const RemoteFile *file)
{
  return g_build_filename (f->repo_dir, "blobs", file->etag, NULL);
}

static gboolean
blob_is_cached (Fetch *f, const RemoteFile *file)
{
  g_autofree char *path = blob_path (f, file);
  struct stat st;
  if (stat (path, &st) != 0 || !S_ISREG (st.st_mode))
    return FALSE;
  return file->size < 0 || st.st_size == file->size;
}

/* The content checked against what the hub announced: sha256 for an LFS ETag (64 hex digits),
 * the git blob sha1 for a git ETag (40), the size always when known. */
static gboolean
verify_file (Fetch *f, const RemoteFile *file, const char *path, GError **error)
{
  gboolean lfs = is_hex (file->etag, 64), git = is_hex (file->etag, 40);
  struct stat st;
  if (stat (path, &st) != 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   path, g_strerror (errno));
      return FALSE;
    }
  if (file->size >= 0 && st.st_size != file->size)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CHECKSUM,
                   "%s of %s: downloaded %" G_GINT64_FORMAT
                   " bytes, the hub announced %" G_GINT64_FORMAT,
                   file->name, f->repo, (gint64)st.st_size, file->size);
      return FALSE;
    }
  if (!lfs && !git)
    return TRUE;

  g_autoptr (GChecksum) checksum = g_checksum_new (lfs ? G_CHECKSUM_SHA256 : G_CHECKSUM_SHA1);
  if (git)
    {
      /* git hashes "blob <size>\0" followed by the content */
      g_autofree char *header = g_strdup_printf ("blob %" G_GINT64_FORMAT, (gint64)st.st_size);
      g_checksum_update (checksum, (const guchar *)header, (gssize)strlen (header) + 1);
    }
  FILE *in = fopen (path, "rb");
  if (in == NULL)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   path, g_strerror (errno));
      return FALSE;
    }
  g_autofree guchar *buffer = g_malloc (READ_SIZE);
  size_t n;
  while ((n = fread (buffer, 1, READ_SIZE, in)) > 0)
    g_checksum_update (checksum, buffer, (gssize)n);
  gboolean read_error = ferror (in);
  fclose (in);
  if (read_error)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE,
                   "%s: read error", path);
      return FALSE;
    }
  const char *digest = g_checksum_get_string (checksum);
  if (g_ascii_strcasecmp (digest, file->etag) != 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CHECKSUM,
                   "%s of %s is corrupt: its %s is %s but the hub lists %s; the download was "
                   "removed, start again to fetch it anew",
                   file->name, f->repo, lfs ? "sha256" : "git blob sha1", digest, file->etag);
      return FALSE;
    }
  return TRUE;
}

/* "bytes START-END/TOTAL" → START */
static gboolean
content_range_start (const char *value, guint64 *start)
{
  if (value == NULL || !g_str_has_prefix (value, "bytes "))
    return FALSE;
  const char *s = value + 6;
  char *end = NULL;
  guint64 n = g_ascii_strtoull (s, &end, 10);
  if (end == s || *end != '-')
    return FALSE;
  *start = n;
  return TRUE;
}

/* One GET of the file into `partial`, from where it stops. `*retry` says whether the error is
 * worth another attempt; `*progressed` whether any byte arrived. */
static gboolean
download_attempt (Fetch *f, RemoteFile *file, const char *partial, gboolean *retry,
                  gboolean *progressed, GError **error)
{
  *retry = FALSE;
  int fd = open (partial, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   partial, g_strerror (errno));
      return FALSE;
    }
  struct stat st;
  guint64 offset = fstat (fd, &st) == 0 ? (guint64)st.st_size : 0;
  if (file->size >= 0 && offset > (guint64)file->size)
    offset = 0;
  if (file->size >= 0 && offset == (guint64)file->size && offset > 0)
    {
      close (fd);
      return TRUE;
    }
  if (ftruncate (fd, (off_t)offset) != 0 || lseek (fd, (off_t)offset, SEEK_SET) < 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   partial, g_strerror (errno));
      close (fd);
      return FALSE;
    }

  g_autofree char *url = g_strdup (file->location);
  g_autoptr (SoupMessage) msg = NULL;
  g_autoptr (GInputStream) in = NULL;
  g_autoptr (GError) local = NULL;
  for (guint hops = 0;; hops++)
    {
      g_clear_object (&msg);
      msg = new_message (f, "GET", url, error);
      if (msg == NULL)
        {
          close (fd);
          return FALSE;
        }
      if (offset > 0)
        {
          g_autofree char *range = g_strdup_printf ("bytes=%" G_GUINT64_FORMAT "-", offset);
          soup_message_headers_replace (soup_message_get_request_headers (msg), "Range", range);
        }
      in = soup_session_send (f->session, msg, f->cancellable, &local);
      if (in == NULL)
        break;
      guint status = soup_message_get_status (msg);
      const char *location
          = soup_message_headers_get_one (soup_message_get_response_headers (msg), "Location");
      if (!is_redirect (status) || location == NULL || hops >= MAX_REDIRECTS)
        break;
      g_autofree char *next = g_uri_resolve_relative (url, location, SOUP_HTTP_URI_FLAGS, NULL);
      g_input_stream_close (in, NULL, NULL);
      g_clear_object (&in);
      if (next == NULL)
        break;
      g_free (url);
      url = g_steal_pointer (&next);
    }
  if (in == NULL)
    {
      close (fd);
      *retry = local != NULL && is_transient_error (local);
      if (local != NULL && g_error_matches (local, G_IO_ERROR, G_IO_ERROR_CANCELLED))
        g_propagate_error (error, g_steal_pointer (&local));
      else
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_HTTP,
                     "%s of %s: %s", file->name, f->repo,
                     local != NULL ? local->message : "no answer");
      return FALSE;
    }

  guint status = soup_message_get_status (msg);
  SoupMessageHeaders *headers = soup_message_get_response_headers (msg);
  if (status == SOUP_STATUS_PARTIAL_CONTENT)
    {
      guint64 start = 0;
      if (!content_range_start (soup_message_headers_get_one (headers, "Content-Range"), &start)
          || start != offset)
        {
          /* not the range asked for: start over */
          close (fd);
          (void)!truncate (partial, 0);
          *retry = TRUE;
          g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                       "%s of %s: the server sent another range than the one asked for", file->name,
                       f->repo);
          return FALSE;
        }
    }
  else if (status == SOUP_STATUS_OK)
    {
      if (offset > 0)
        {
          report (f, file, 0, "%s: the server does not resume downloads: starting over",
                  file->name);
          offset = 0;
          if (ftruncate (fd, 0) != 0 || lseek (fd, 0, SEEK_SET) < 0)
            {
              g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE,
                           "%s: %s", partial, g_strerror (errno));
              close (fd);
              return FALSE;
            }
        }
    }
  else
    {
      close (fd);
      if (status == SOUP_STATUS_REQUESTED_RANGE_NOT_SATISFIABLE)
        {
          /* what is on disk does not fit the file: start over */
          (void)!truncate (partial, 0);
          *retry = TRUE;
        }
      else
        *retry = is_transient_status (status);
      g_autofree char *what = g_strdup_printf ("file %s", file->name);
      set_status_error (f, msg, what, error);
      return FALSE;
    }

  if (offset > 0)
    report (f, file, offset, "%s: resuming at %" G_GUINT64_FORMAT " bytes", file->name, offset);
  guint64 done = offset;
  f->bytes_done += offset;
  g_autofree guchar *buffer = g_malloc (READ_SIZE);
  gboolean ok = TRUE;
  for (;;)
    {
      gssize n = g_input_stream_read (in, buffer, READ_SIZE, f->cancellable, &local);
      if (n < 0)
        {
          ok = FALSE;
          break;
        }
      if (n == 0)
        break;
      for (gssize written = 0; written < n;)
        {
          ssize_t w = write (fd, buffer + written, (size_t)(n - written));
          if (w < 0 && errno == EINTR)
            continue;
          if (w < 0)
            {
              g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE,
                           "%s: %s", partial, g_strerror (errno));
              close (fd);
              f->bytes_done -= done;
              return FALSE;
            }
          written += w;
        }
      done += (guint64)n;
      f->bytes_done += (guint64)n;
      *progressed = TRUE;
      report (f, file, done, NULL);
    }
  g_input_stream_close (in, NULL, NULL);
  gboolean synced = fsync (fd) == 0;
  close (fd);
  /* what this attempt counted is counted again by the next one, from the file's size */
  f->bytes_done -= done;

  if (!ok)
    {
      *retry = is_transient_error (local);
      if (g_error_matches (local, G_IO_ERROR, G_IO_ERROR_CANCELLED))
        g_propagate_error (error, g_steal_pointer (&local));
      else
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_HTTP,
                     "%s of %s: the connection failed after %" G_GUINT64_FORMAT " bytes: %s",
                     file->name, f->repo, done, local->message);
      return FALSE;
    }
  if (file->size >= 0 && done < (guint64)file->size)
    {
      *retry = TRUE;
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_HTTP,
                   "%s of %s: the connection closed after %" G_GUINT64_FORMAT
                   " of %" G_GINT64_FORMAT " bytes",
                   file->name, f->repo, done, file->size);
      return FALSE;
    }
  if (!synced)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   partial, g_strerror (errno));
      return FALSE;
    }
  return TRUE;
}

/* Holds <cache>/.locks/models--owner--name/<etag>.lock, as huggingface_hub does, so that two
 * processes sharing a cache never write one blob at once. Returns the descriptor, or -1. */
static int
lock_blob (Fetch *f, const RemoteFile *file, GError **error)
{
  if (g_mkdir_with_parents (f->locks_dir, 0755) != 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   f->locks_dir, g_strerror (errno));
      return -1;
    }
  g_autofree char *name = g_strconcat (file->etag, ".lock", NULL);
  g_autofree char *path = g_build_filename (f->locks_dir, name, NULL);
  int fd = open (path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   path, g_strerror (errno));
      return -1;
    }
  if (flock (fd, LOCK_EX | LOCK_NB) == 0)
    return fd;
  report (f, file, 0, "%s: another process is downloading it into this cache; waiting", file->name);
  while (flock (fd, LOCK_EX | LOCK_NB) != 0)
    {
      if (g_cancellable_set_error_if_cancelled (f->cancellable, error))
        {
          close (fd);
          return -1;
        }
      g_usleep (200 * 1000);
    }
  return fd;
}

static gboolean
download_blob (Fetch *f, RemoteFile *file, GError **error)
{
  g_autofree char *blobs = g_build_filename (f->repo_dir, "blobs", NULL);
  if (g_mkdir_with_parents (blobs, 0755) != 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   blobs, g_strerror (errno));
      return FALSE;
    }
  int lock = lock_blob (f, file, error);
  if (lock < 0)
    return FALSE;

  g_autofree char *path = blob_path (f, file);
  g_autofree char *partial = g_strconcat (path, ".incomplete", NULL);
  gboolean ok = TRUE;
  if (!blob_is_cached (f, file)) /* another process may have finished it meanwhile */
    {
      guint idle = 0;
      for (;;)
        {
          g_autoptr (GError) local = NULL;
          gboolean retry = FALSE, progressed = FALSE;
          if (download_attempt (f, file, partial, &retry, &progressed, &local))
            break;
          if (progressed)
            idle = 0;
          if (!retry || ++idle >= MAX_IDLE_ATTEMPTS)
            {
              g_propagate_error (error, g_steal_pointer (&local));
              ok = FALSE;
              break;
            }
          report (f, file, 0, "%s; retrying", local->message);
          backoff (f, idle);
        }
      if (ok && !verify_file (f, file, partial, error))
        {
          g_unlink (partial);
          ok = FALSE;
        }
      if (ok && g_rename (partial, path) != 0)
        {
          g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                       path, g_strerror (errno));
          ok = FALSE;
        }
    }
  if (ok && file->size >= 0)
    f->bytes_done += (guint64)file->size;
  close (lock);
  return ok;
}

/* ---- the snapshot ---- */

/* snapshots/<commit>/<name> → ../../blobs/<etag> (one more ../ per directory in `name`), put in
 * place by a rename so that it is never missing once it was there. */
static gboolean
link_file (Fetch *f, const RemoteFile *file, GError **error)
{
  g_autofree char *link = g_build_filename (f->repo_dir, "snapshots", f->commit, file->name, NULL);
  g_autofree char *parent = g_path_get_dirname (link);
  if (g_mkdir_with_parents (parent, 0755) != 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   parent, g_strerror (errno));
      return FALSE;
    }
  g_autoptr (GString) target = g_string_new ("../../");
  for (const char *c = file->name; *c != '\0'; c++)
    if (*c == '/')
      g_string_append (target, "../");
  g_string_append_printf (target, "blobs/%s", file->etag);

  g_autofree char *temporary = g_strconcat (link, ".link-XXXXXX", NULL);
  int fd = g_mkstemp (temporary);
  if (fd >= 0)
    {
      close (fd);
      g_unlink (temporary);
    }
  if (fd < 0 || symlink (target->str, temporary) != 0 || g_rename (temporary, link) != 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE,
                   "%s: cannot link it to %s: %s", link, target->str, g_strerror (errno));
      g_unlink (temporary);
      return FALSE;
    }
  return TRUE;
}

static gboolean
write_ref (Fetch *f, GError **error)
{
  if (g_ascii_strcasecmp (f->revision, f->commit) == 0)
    return TRUE;
  g_autofree char *refs = g_build_filename (f->repo_dir, "refs", NULL);
  g_autofree char *path = g_build_filename (refs, f->revision, NULL);
  g_autoptr (GError) local = NULL;
  if (g_mkdir_with_parents (refs, 0755) != 0 || !g_file_set_contents (path, f->commit, -1, &local))
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_CACHE, "%s: %s",
                   path, local != NULL ? local->message : g_strerror (errno));
      return FALSE;
    }
  return TRUE;
}

/* ---- which files ---- */

static const char *const model_files[] = {"config.json", "gepard_config.json", "tokenizer.json"};
static const char *const codec_files[] = {"codec.nemo", "codec.safetensors"};

static int
compare_names (gconstpointer a, gconstpointer b)
{
  return strcmp (*(char *const *)a, *(char *const *)b);
}

/* The shard names of a safetensors index, sorted and unique. */
static GPtrArray *
read_index (const char *repo, const char *path, GError **error)
{
  g_autoptr (JsonParser) parser = json_parser_new ();
  if (!json_parser_load_from_mapped_file (parser, path, error))
    return NULL;
  JsonNode *root = json_parser_get_root (parser);
  JsonObject *map = NULL;
  if (root != NULL && JSON_NODE_HOLDS_OBJECT (root))
    {
      JsonNode *node = json_object_get_member (json_node_get_object (root), "weight_map");
      if (node != NULL && JSON_NODE_HOLDS_OBJECT (node))
        map = json_node_get_object (node);
    }
  if (map == NULL)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                   "%s: model.safetensors.index.json has no weight_map", repo);
      return NULL;
    }
  g_autoptr (GHashTable) seen = g_hash_table_new (g_str_hash, g_str_equal);
  GPtrArray *shards = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GList) members = json_object_get_members (map);
  for (GList *l = members; l != NULL; l = l->next)
    {
      JsonNode *node = json_object_get_member (map, l->data);
      const char *shard = JSON_NODE_HOLDS_VALUE (node) ? json_node_get_string (node) : NULL;
      if (shard == NULL || !is_safe_repo_path (shard))
        {
          g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                       "%s: model.safetensors.index.json names a shard that is not a file of "
                       "the repo",
                       repo);
          g_ptr_array_unref (shards);
          return NULL;
        }
      if (g_hash_table_add (seen, (gpointer)shard))
        g_ptr_array_add (shards, g_strdup (shard));
    }
  g_ptr_array_sort (shards, compare_names);
  return shards;
}

static gboolean
add_file (Fetch *f, GPtrArray *files, const char *name, gboolean optional, GError **error)
{
  g_autoptr (GError) local = NULL;
  RemoteFile *file = stat_file (f, name, optional, &local);
  if (file == NULL && local != NULL)
    {
      g_propagate_error (error, g_steal_pointer (&local));
      return FALSE;
    }
  if (file != NULL)
    {
      file->cached = blob_is_cached (f, file);
      g_ptr_array_add (files, file);
    }
  return TRUE;
}

/* The files a model needs, with their metadata. `listed` is the repo's file list, or NULL when
 * the endpoint gave none. */
static gboolean
model_remote_files (Fetch *f, GPtrArray *listed, GPtrArray *files, GError **error)
{
  for (gsize i = 0; i < G_N_ELEMENTS (model_files); i++)
    {
      if (listed != NULL && !names_contain (listed, model_files[i]))
        {
          g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
                       "%s has no %s at revision %s: it is not a GEPARD model", f->repo,
                       model_files[i], f->revision);
          return FALSE;
        }
      if (!add_file (f, files, model_files[i], FALSE, error))
        return FALSE;
    }

  gboolean single = listed == NULL || names_contain (listed, "model.safetensors");
  guint before = files->len;
  if (single && !add_file (f, files, "model.safetensors", listed == NULL, error))
    return FALSE;
  if (files->len == before)
    {
      /* sharded: the index first, then the shards it names */
      const char *index = "model.safetensors.index.json";
      if (listed != NULL && !names_contain (listed, index))
        {
          g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
                       "%s has neither model.safetensors nor %s at revision %s", f->repo, index,
                       f->revision);
          return FALSE;
        }
      if (!add_file (f, files, index, FALSE, error))
        return FALSE;
      RemoteFile *file = g_ptr_array_index (files, files->len - 1);
      if (!file->cached && !download_blob (f, file, error))
        return FALSE;
      file->cached = TRUE;
      g_autofree char *path = blob_path (f, file);
      g_autoptr (GPtrArray) shards = read_index (f->repo, path, error);
      if (shards == NULL)
        return FALSE;
      for (guint i = 0; i < shards->len; i++)
        if (!add_file (f, files, g_ptr_array_index (shards, i), FALSE, error))
          return FALSE;
    }

  for (gsize i = 0; i < G_N_ELEMENTS (codec_files); i++)
    if ((listed == NULL || names_contain (listed, codec_files[i]))
        && !add_file (f, files, codec_files[i], listed == NULL, error))
      return FALSE;
  return TRUE;
}

static gboolean
codec_remote_files (Fetch *f, GPtrArray *listed, GPtrArray *files, GError **error)
{
  if (listed != NULL)
    {
      const char *const suffixes[] = {".nemo", ".safetensors"};
      for (gsize s = 0; s < G_N_ELEMENTS (suffixes) && files->len == 0; s++)
        for (guint i = 0; i < listed->len; i++)
          {
            const char *name = g_ptr_array_index (listed, i);
            if (strchr (name, '/') == NULL && g_str_has_suffix (name, suffixes[s])
                && !add_file (f, files, name, FALSE, error))
              return FALSE;
          }
    }
  else
    {
      /* NVIDIA names a NeMo checkpoint after its repo */
      const char *base = strchr (f->repo, '/') + 1;
      g_autofree char *named = g_strconcat (base, ".nemo", NULL);
      const char *const guesses[] = {named, "codec.nemo", "codec.safetensors"};
      for (gsize i = 0; i < G_N_ELEMENTS (guesses) && files->len == 0; i++)
        if (!add_file (f, files, guesses[i], TRUE, error))
          return FALSE;
    }
  if (files->len == 0)
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
                   "%s has no .nemo or .safetensors codec file at revision %s", f->repo,
                   f->revision);
      return FALSE;
    }
  return TRUE;
}

/* ---- the local cache ---- */

static gboolean
file_exists (const char *dir, const char *name)
{
  g_autofree char *path = g_build_filename (dir, name, NULL);
  return g_file_test (path, G_FILE_TEST_IS_REGULAR); /* follows the link to the blob */
}

/* Whether a cached snapshot holds everything `kind` needs; the first missing path otherwise. */
static gboolean
snapshot_is_complete (const char *dir, GepardHubRepoKind kind, char **missing)
{
  if (kind == GEPARD_HUB_REPO_CODEC)
    {
      g_autofree char *codec = gepard_hub_find_codec_file (dir, NULL);
      if (codec == NULL)
        *missing = g_build_filename (dir, "*.nemo", NULL);
      return codec != NULL;
    }
  for (gsize i = 0; i < G_N_ELEMENTS (model_files); i++)
    if (!file_exists (dir, model_files[i]))
      {
        *missing = g_build_filename (dir, model_files[i], NULL);
        return FALSE;
      }
  if (file_exists (dir, "model.safetensors"))
    return TRUE;
  g_autofree char *index = g_build_filename (dir, "model.safetensors.index.json", NULL);
  g_autoptr (GPtrArray) shards
      = g_file_test (index, G_FILE_TEST_IS_REGULAR) ? read_index (dir, index, NULL) : NULL;
  if (shards == NULL)
    {
      *missing = g_build_filename (dir, "model.safetensors", NULL);
      return FALSE;
    }
  for (guint i = 0; i < shards->len; i++)
    if (!file_exists (dir, g_ptr_array_index (shards, i)))
      {
        *missing = g_build_filename (dir, g_ptr_array_index (shards, i), NULL);
        return FALSE;
      }
  return TRUE;
}

gboolean
gepard_hub_model_has_codec (const char *dir)
{
  for (gsize i = 0; i < G_N_ELEMENTS (codec_files); i++)
    if (file_exists (dir, codec_files[i]))
      return TRUE;
  return FALSE;
}

char *
gepard_hub_find_codec_file (const char *dir, GError **error)
{
  g_autoptr (GDir) listing = g_dir_open (dir, 0, error);
  if (listing == NULL)
    return NULL;
  g_autoptr (GPtrArray) names = g_ptr_array_new_with_free_func (g_free);
  const char *name;
  while ((name = g_dir_read_name (listing)) != NULL)
    if (file_exists (dir, name))
      g_ptr_array_add (names, g_strdup (name));
  g_ptr_array_sort (names, compare_names);
  const char *const suffixes[] = {".nemo", ".safetensors"};
  for (gsize s = 0; s < G_N_ELEMENTS (suffixes); s++)
    for (guint i = 0; i < names->len; i++)
      if (g_str_has_suffix (g_ptr_array_index (names, i), suffixes[s]))
        return g_build_filename (dir, g_ptr_array_index (names, i), NULL);
  g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,
               "%s holds no .nemo or .safetensors codec file", dir);
  return NULL;
}

/* ---- public ---- */

G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (Fetch, fetch_clear)

static gboolean
fetch_init (Fetch *f, const char *name, GError **error)
{
  if (!gepard_hub_split_repo_id (name, &f->repo, &f->revision, error))
    return FALSE;
  if (f->revision == NULL)
    f->revision = g_strdup ("main");
  f->repo_dir = gepard_hub_repo_dir (f->repo);
  g_autofree char *cache = gepard_hub_cache_dir ();
  g_autofree char *folder = g_path_get_basename (f->repo_dir);
  f->locks_dir = g_build_filename (cache, ".locks", folder, NULL);

  const char *endpoint = g_getenv ("HF_ENDPOINT");
  if (endpoint == NULL || endpoint[0] == '\0')
    endpoint = DEFAULT_ENDPOINT;
  f->endpoint = g_strdup (endpoint);
  while (g_str_has_suffix (f->endpoint, "/"))
    f->endpoint[strlen (f->endpoint) - 1] = '\0';
  f->endpoint_uri = g_uri_parse (f->endpoint, SOUP_HTTP_URI_FLAGS, NULL);
  if (f->endpoint_uri == NULL
      || (g_strcmp0 (g_uri_get_scheme (f->endpoint_uri), "https") != 0
          && g_strcmp0 (g_uri_get_scheme (f->endpoint_uri), "http") != 0))
    {
      g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,
                   "HF_ENDPOINT=%s is not an http(s) URL", f->endpoint);
      return FALSE;
    }
  const char *token = g_getenv ("HF_TOKEN");
  if (token != NULL && token[0] != '\0')
    f->token = g_strstrip (g_strdup (token));
  return TRUE;
}

/* The files of the revision downloaded, then linked into its snapshot, then the ref written. */
static char *
fetch_remote (Fetch *f, GepardHubRepoKind kind, GError **error)
{
  g_autoptr (GPtrArray) listed = g_ptr_array_new_with_free_func (g_free);
  g_autoptr (GPtrArray) files = g_ptr_array_new_with_free_func ((GDestroyNotify)remote_file_free);
  g_autoptr (GError) list_error = NULL;
  gboolean have_list = list_repo (f, listed, &list_error);
  if (list_error != NULL)
    {
      g_propagate_error (error, g_steal_pointer (&list_error));
      return NULL;
    }
  report (f, NULL, 0, "%s: fetching revision %s%s%s%s", f->repo, f->revision,
          f->commit != NULL ? " (commit " : "", f->commit != NULL ? f->commit : "",
          f->commit != NULL ? ")" : "");
  report (f, NULL, 0, "%s: downloading from %s into %s", f->repo, f->endpoint, f->repo_dir);
  gboolean ok = kind == GEPARD_HUB_REPO_MODEL
                    ? model_remote_files (f, have_list ? listed : NULL, files, error)
                    : codec_remote_files (f, have_list ? listed : NULL, files, error);
  if (!ok)
    return NULL;

  for (guint i = 0; i < files->len; i++)
    {
      RemoteFile *file = g_ptr_array_index (files, i);
      if (!file->cached && file->size > 0)
        f->bytes_total += (guint64)file->size;
    }
  for (guint i = 0; i < files->len; i++)
    {
      RemoteFile *file = g_ptr_array_index (files, i);
      if (file->cached)
        continue;
      report (f, file, 0, NULL);
      if (!download_blob (f, file, error))
        return NULL;
    }
  /* every file is in place: only now does the snapshot appear, then the ref */
  for (guint i = 0; i < files->len; i++)
    if (!link_file (f, g_ptr_array_index (files, i), error))
      return NULL;
  if (!write_ref (f, error))
    return NULL;
  char *snapshot = g_build_filename (f->repo_dir, "snapshots", f->commit, NULL);
  report (f, NULL, 0, "%s: %u files in %s", f->repo, files->len, snapshot);
  return snapshot;
}

char *
gepard_hub_fetch (const char *name, GepardHubRepoKind kind, GepardHubProgressFunc progress,
                  gpointer user_data, GCancellable *cancellable, GError **error)
{
  g_return_val_if_fail (name != NULL, NULL);

  g_auto (Fetch) f = {.progress = progress, .user_data = user_data, .cancellable = cancellable};
  if (!fetch_init (&f, name, error))
    return NULL;

  /* a complete snapshot of the revision in the cache: no network */
  g_autoptr (GError) resolve_error = NULL;
  g_autofree char *cached = gepard_hub_resolve (name, &resolve_error);
  g_autofree char *missing = NULL;
  if (cached != NULL && snapshot_is_complete (cached, kind, &missing))
    {
      report (&f, NULL, 0, "%s: using the cached snapshot %s", name, cached);
      return g_steal_pointer (&cached);
    }
  if (gepard_hub_is_offline ())
    {
      if (cached == NULL)
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_OFFLINE,
                     "%s; HF_HUB_OFFLINE is set, so nothing is downloaded", resolve_error->message);
      else
        g_set_error (error, GEPARD_HUB_DOWNLOAD_ERROR, GEPARD_HUB_DOWNLOAD_ERROR_OFFLINE,
                     "%s is cached incompletely (%s is missing); HF_HUB_OFFLINE is set, so "
                     "nothing is downloaded",
                     name, missing);
      return NULL;
    }

  /* synchronous requests on this thread, in a context of their own */
  g_autoptr (GMainContext) context = g_main_context_new ();
  g_main_context_push_thread_default (context);
  f.session = soup_session_new_with_options ("user-agent", "gepard/" GEPARD_VERSION, "timeout",
                                             IO_TIMEOUT_S, NULL);
  soup_session_remove_feature_by_type (f.session, SOUP_TYPE_CONTENT_DECODER);
  char *snapshot = fetch_remote (&f, kind, error);
  g_clear_object (&f.session);
  g_main_context_pop_thread_default (context);
  return snapshot;
}
