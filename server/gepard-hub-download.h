/* gepard-hub-download.h: models fetched from the Hugging Face hub into the local cache.
 *
 * gepard-core resolves a repo id ("owner/name[@revision]") in the local cache only
 * (gepard-hub.h). This client fills that cache the way huggingface_hub does, so both share it:
 *
 *   <cache>/models--owner--name/blobs/<etag>                 the files' content, by ETag (the
 * sha256 for LFS files, the git blob sha1 else) <cache>/models--owner--name/blobs/<etag>.incomplete
 * a download in progress (resumed with a Range request)
 *   <cache>/models--owner--name/snapshots/<commit>/<file>    relative symlinks to the blobs
 *   <cache>/models--owner--name/refs/<revision>              the commit the revision points at
 *   <cache>/.locks/models--owner--name/<etag>.lock           flock(2) held while a blob downloads
 *
 * Requests follow the hub's URL layout: GET {endpoint}/api/models/{repo}/revision/{revision} for
 * the commit and the file list (when the endpoint has no such API, the known files are asked for
 * one by one), HEAD {endpoint}/{repo}/resolve/{commit}/{file} for X-Repo-Commit, ETag,
 * X-Linked-Etag and X-Linked-Size, then GET of the same URL (or the CDN it redirects to, without
 * the token). HF_ENDPOINT replaces https://huggingface.co, HF_TOKEN is sent as a bearer token to
 * the endpoint only, and HF_HUB_OFFLINE=1 keeps every request off the network.
 *
 * Every file is checked before it takes its name: the sha256 of an LFS file against its ETag, the
 * git blob sha1 of any other, the size against the announced size. The snapshot's links and the
 * ref are written once every file is in place, so a snapshot that resolves is always complete. */
#pragma once

#include <gio/gio.h>

G_BEGIN_DECLS

#define GEPARD_HUB_DOWNLOAD_ERROR (gepard_hub_download_error_quark ())
GQuark gepard_hub_download_error_quark (void);

typedef enum
{
  GEPARD_HUB_DOWNLOAD_ERROR_UNAUTHORIZED, /* 401 or 403: a private or gated repo */
  GEPARD_HUB_DOWNLOAD_ERROR_NOT_FOUND,    /* no such repo, revision or file */
  GEPARD_HUB_DOWNLOAD_ERROR_CHECKSUM,     /* the content does not match its ETag or size */
  GEPARD_HUB_DOWNLOAD_ERROR_PROTOCOL,     /* an answer the hub would not give */
  GEPARD_HUB_DOWNLOAD_ERROR_HTTP,         /* another HTTP status, or the network, after retries */
  GEPARD_HUB_DOWNLOAD_ERROR_OFFLINE,      /* HF_HUB_OFFLINE is set and the cache lacks the files */
  GEPARD_HUB_DOWNLOAD_ERROR_CACHE,        /* the cache directory cannot be written */
} GepardHubDownloadError;

typedef enum
{
  GEPARD_HUB_REPO_MODEL, /* config.json, gepard_config.json, tokenizer.json, the weights, codec.* */
  GEPARD_HUB_REPO_CODEC, /* a NanoCodec repo: its .nemo file (else its .safetensors) */
} GepardHubRepoKind;

typedef struct
{
  const char *repo;    /* owner/name */
  const char *file;    /* the file being downloaded; NULL with a note about the whole repo */
  guint64 file_done;   /* bytes of `file` on disk */
  gint64 file_total;   /* its size; -1 when unknown */
  guint64 bytes_done;  /* bytes of every file this fetch downloads */
  guint64 bytes_total; /* what it downloads in all (files already cached are not counted) */
  const char *note;    /* a line for the log (cache used, resumed, retrying), or NULL */
} GepardHubProgress;

/* Called on the fetching thread, often: the callee throttles what it shows. */
typedef void (*GepardHubProgressFunc) (const GepardHubProgress *progress, gpointer user_data);

/* The snapshot directory of `name` ("owner/name" or "owner/name@revision") in the local cache.
 * When the cache already holds a complete snapshot of the revision, nothing touches the network;
 * otherwise what is missing is downloaded. Blocking: call it from a worker thread.
 * `cancellable` stops a download between two reads, leaving the partial file to resume. */
char *gepard_hub_fetch (const char *name, GepardHubRepoKind kind, GepardHubProgressFunc progress,
                        gpointer user_data, GCancellable *cancellable, GError **error);

/* TRUE when `dir` holds a codec beside the model (codec.nemo or codec.safetensors). */
gboolean gepard_hub_model_has_codec (const char *dir);

/* The codec file of a codec snapshot: its first .nemo file by name, else its first .safetensors. */
char *gepard_hub_find_codec_file (const char *dir, GError **error);

/* An ETag header as a cache file name: W/ and quotes removed (huggingface_hub's
 * _normalize_etag); NULL when what remains is not a safe file name. */
char *gepard_hub_normalize_etag (const char *etag);

G_END_DECLS
