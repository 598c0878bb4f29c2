/* gepard-voice-db.h: cloned voices in PostgreSQL, shared by every replica of the server.
 *
 * A voice is a speaker prefix (gepard-voice.h: rows × hidden little-endian fp32) with the metadata
 * of a Cartesia voice object. The store talks to PostgreSQL through libpq on a small pool of worker
 * threads, one connection each, so a caller's main loop never waits on the network: every call
 * that may touch the database is asynchronous and completes in the thread-default main context of
 * the caller. Reads go through an LRU cache, so a voice is read from the database at most once per
 * process while it stays cached; voices never change after they are created.
 *
 * When the database cannot be reached, calls that need it fail at once with
 * GEPARD_VOICE_DB_ERROR_DOWN (a 503) while cached voices keep being served; a background thread
 * reconnects with exponential backoff and the store recovers by itself.
 *
 * The schema is sql/NNN_*.sql, compiled in; it is applied on the first connection (and after every
 * outage) under a PostgreSQL advisory lock, so replicas starting together apply it once. */
#pragma once

#include <gio/gio.h>

G_BEGIN_DECLS

#define GEPARD_VOICE_DB_ERROR (gepard_voice_db_error_quark ())
GQuark gepard_voice_db_error_quark (void);

typedef enum
{
  GEPARD_VOICE_DB_ERROR_NOT_FOUND,      /* no voice with that id (or not a voice id at all) */
  GEPARD_VOICE_DB_ERROR_INVALID,        /* bad input: sizes, names, cursors, limits */
  GEPARD_VOICE_DB_ERROR_MODEL_MISMATCH, /* the voice was cloned for another model */
  GEPARD_VOICE_DB_ERROR_DOWN,           /* the database cannot be reached right now */
  GEPARD_VOICE_DB_ERROR_CLOSED,         /* the store was freed while the call was queued */
  GEPARD_VOICE_DB_ERROR_FAILED,         /* the database refused a statement */
  GEPARD_VOICE_DB_ERROR_CLUSTER,        /* the private cluster could not be set up */
} GepardVoiceDbError;

/* One voice. Immutable and reference counted (gepard_voice_record_ref/unref); may be shared
 * between threads. */
typedef struct
{
  char *id;              /* canonical lower-case UUID */
  char *name;            /* never NULL */
  char *description;     /* "" when none was given */
  char *language;        /* as given at creation ("en") */
  char *accent;          /* NULL when not given */
  char *gender;          /* NULL when not given */
  GDateTime *created_at; /* UTC */
  char *model;           /* the model the prefix belongs to */
  int rows, hidden;      /* the prefix's shape */
  GBytes *prefix; /* rows × hidden little-endian fp32 (a prefix file's bytes); NULL in listings */
} GepardVoiceRecord;

GepardVoiceRecord *gepard_voice_record_ref (GepardVoiceRecord *record);
void gepard_voice_record_unref (GepardVoiceRecord *record);

typedef struct
{
  /* libpq connection string or URI (DATABASE_URL, sslmode and all); never logged */
  const char *conninfo;
  /* Identity of the model this server runs, and its prefix shape (compressor queries × hidden
   * size). Voices are created for it, listed for it, and a voice of another model is refused. */
  const char *model;
  int rows, hidden;
  guint n_workers;          /* worker threads = connections; 0: 2 */
  guint cache_size;         /* voices kept in the LRU; 0: 256 (about 8 MB for 8 × 1024 prefixes) */
  guint backoff_initial_ms; /* first reconnection delay; 0: 200 */
  guint backoff_max_ms;     /* the delay doubles up to this; 0: 10000 */
} GepardVoiceDbOptions;

typedef struct _GepardVoiceDb GepardVoiceDb;

/* Checks the options and the connection string; no I/O: the first call connects (call
 * gepard_voice_db_migrate_async at start-up to connect and apply the schema). */
GepardVoiceDb *gepard_voice_db_new (const GepardVoiceDbOptions *options, GError **error);
/* Finishes the statement each worker is running, fails the calls still queued with CLOSED, and
 * closes the connections. Callbacks of calls made before may still run afterwards (in their main
 * contexts), so they must not use the store once it is freed. */
void gepard_voice_db_free (GepardVoiceDb *store);

/* Connect and bring the schema up to date (idempotent; safe from several processes at once). */
void gepard_voice_db_migrate_async (GepardVoiceDb *store, GCancellable *cancellable,
                                    GAsyncReadyCallback callback, gpointer user_data);
gboolean gepard_voice_db_migrate_finish (GepardVoiceDb *store, GAsyncResult *result,
                                         GError **error);

typedef struct
{
  const char *name;        /* required: 1–200 characters */
  const char *language;    /* required: 1–35 characters */
  const char *description; /* optional: up to 2000 characters */
  const char *accent;      /* optional */
  const char *gender;      /* optional */
  const float *prefix;     /* rows × hidden finite values, row-major */
  int rows, hidden;        /* must be the store's shape */
} GepardVoiceCreateParams;

/* Store a new voice (strings and the prefix are copied before this returns). The result is cached
 * and carries its prefix. */
void gepard_voice_db_create_async (GepardVoiceDb *store, const GepardVoiceCreateParams *params,
                                   GCancellable *cancellable, GAsyncReadyCallback callback,
                                   gpointer user_data);
GepardVoiceRecord *gepard_voice_db_create_finish (GepardVoiceDb *store, GAsyncResult *result,
                                                  GError **error);

/* A voice with its prefix: from the cache when there (no database access at all, so it works
 * while the database is down), otherwise read once (concurrent gets of one id share one read) and
 * cached. An id that is not a UUID is NOT_FOUND without asking the database; a voice of another
 * model is MODEL_MISMATCH. */
void gepard_voice_db_get_async (GepardVoiceDb *store, const char *id, GCancellable *cancellable,
                                GAsyncReadyCallback callback, gpointer user_data);
GepardVoiceRecord *gepard_voice_db_get_finish (GepardVoiceDb *store, GAsyncResult *result,
                                               GError **error);
/* The cached voice or NULL, at once and from any thread: for a request path that can use a voice
 * synchronously when it is already known. */
GepardVoiceRecord *gepard_voice_db_lookup_cached (GepardVoiceDb *store, const char *id);

typedef struct
{
  guint limit;                /* 1–100 */
  const char *starting_after; /* the page after this voice id (next page), or NULL */
  const char *ending_before;  /* the page before this voice id (previous page), or NULL */
  const char *query;          /* only names containing this, case-insensitively; NULL: all */
} GepardVoiceListParams;

typedef struct
{
  GPtrArray *voices; /* GepardVoiceRecord, newest first, prefix NULL */
  /* more voices beyond this page in the direction asked for (older ones for starting_after or no
   * cursor, newer ones for ending_before) */
  gboolean has_more;
} GepardVoicePage;

void gepard_voice_page_free (GepardVoicePage *page);

/* One page of this model's voices, newest first. A cursor that is not a UUID or names no voice is
 * INVALID; giving both cursors is INVALID. Cartesia's SDKs follow starting_after=<last id> until
 * they receive an empty page. */
void gepard_voice_db_list_async (GepardVoiceDb *store, const GepardVoiceListParams *params,
                                 GCancellable *cancellable, GAsyncReadyCallback callback,
                                 gpointer user_data);
GepardVoicePage *gepard_voice_db_list_finish (GepardVoiceDb *store, GAsyncResult *result,
                                              GError **error);

/* Delete a voice (of any model) and drop it from this process's cache; NOT_FOUND when there is
 * none. Other processes keep serving their cached copy until they evict it. */
void gepard_voice_db_delete_async (GepardVoiceDb *store, const char *id, GCancellable *cancellable,
                                   GAsyncReadyCallback callback, gpointer user_data);
gboolean gepard_voice_db_delete_finish (GepardVoiceDb *store, GAsyncResult *result, GError **error);

typedef enum
{
  GEPARD_VOICE_DB_STATE_UNKNOWN, /* nothing tried yet */
  GEPARD_VOICE_DB_STATE_UP,      /* the last contact with the database succeeded */
  GEPARD_VOICE_DB_STATE_DOWN,    /* unreachable; reconnecting in the background */
} GepardVoiceDbState;

typedef struct
{
  GepardVoiceDbState state;
  char *last_error;           /* the last connection or statement failure, NULL if none yet */
  gint64 last_error_time;     /* its g_get_real_time (), 0 if none */
  guint consecutive_failures; /* failed connection attempts since the last success */
  guint cached_voices;

  /* counters since the store was created */
  guint64 statements;   /* statements sent to the database, migrations included */
  guint64 voice_reads;  /* voices read by id from the database */
  guint64 cache_hits;   /* gets answered from the cache */
  guint64 cache_misses; /* gets that needed the database */
  guint64 reconnects;   /* times the database came back after being down */
} GepardVoiceDbHealth;

/* A snapshot, at once and without touching the database (for /health and /metrics). */
void gepard_voice_db_get_health (GepardVoiceDb *store, GepardVoiceDbHealth *health);
void gepard_voice_db_health_clear (GepardVoiceDbHealth *health);

/* ---- private development cluster ---- */

typedef struct _GepardVoiceDbCluster GepardVoiceDbCluster;

/* A directory for the private cluster: $XDG_DATA_HOME/gepard/postgres, or
 * /var/lib/gepard/postgres as root (the postgres user the cluster then runs as cannot enter
 * /root). */
char *gepard_voice_db_default_cluster_dir (void);

/* Start (initdb on first use, then pg_ctl start) a PostgreSQL cluster of this process's own in
 * `dir`/data, listening only on a unix socket inside its data directory, and log that it does so.
 * Uses initdb and pg_ctl from $GEPARD_PG_BINDIR, /usr/lib/postgresql/<newest>/bin, or PATH. As
 * root it runs them as the "postgres" user and gives `dir` to that user, because PostgreSQL
 * refuses to run as root. Blocks for initdb and start-up (seconds): call it before serving.
 * A cluster already running in `dir` is used and left running on free. */
GepardVoiceDbCluster *gepard_voice_db_start_private_cluster (const char *dir, GError **error);
/* A conninfo for gepard_voice_db_new */
const char *gepard_voice_db_cluster_get_conninfo (GepardVoiceDbCluster *cluster);
const char *gepard_voice_db_cluster_get_data_dir (GepardVoiceDbCluster *cluster);
/* Stop (fast shutdown: connections are cut) and start it again, e.g. to rehearse an outage. */
gboolean gepard_voice_db_cluster_stop (GepardVoiceDbCluster *cluster, GError **error);
gboolean gepard_voice_db_cluster_start (GepardVoiceDbCluster *cluster, GError **error);
/* Stops the cluster if this process started it. */
void gepard_voice_db_cluster_free (GepardVoiceDbCluster *cluster);

/* The PostgreSQL bin directory holding initdb and pg_ctl, or NULL when none is installed. */
char *gepard_voice_db_find_pg_bindir (void);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceRecord, gepard_voice_record_unref)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoicePage, gepard_voice_page_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceDb, gepard_voice_db_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceDbCluster, gepard_voice_db_cluster_free)

G_END_DECLS
