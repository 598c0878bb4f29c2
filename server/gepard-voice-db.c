/* gepard-voice-db.c: cloned voices in PostgreSQL (see gepard-voice-db.h).
 *
 * Threads: callers queue jobs on a GThreadPool of n_workers threads; a job takes one of n_workers
 * connection slots for its whole run, so each running worker has a connection of its own and
 * libpq's blocking calls never run on a caller's thread. A reconnector thread owns recovery while
 * the database is down, so workers fail fast instead of each waiting on a connect timeout. */
#include "gepard-voice-db.h"

#include "gepard-sql-resources.h"

#include <errno.h>
#include <grp.h>
#include <libpq-fe.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

GQuark
gepard_voice_db_error_quark (void)
{
  return g_quark_from_static_string ("gepard-voice-db-error-quark");
}

/* Session-level advisory lock taken around migrations: replicas starting together apply each file
 * once; PostgreSQL releases it by itself if the holder's connection dies. ("gepard" in ASCII.) */
#define MIGRATION_LOCK_KEY "113685374792292"

#define SQL_RESOURCE_DIR "/org/gepard/sql"
#define MAX_NAME_CHARS 200
#define MAX_LANGUAGE_CHARS 35
#define MAX_DESCRIPTION_CHARS 2000
#define MAX_ACCENT_CHARS 100
#define MAX_GENDER_CHARS 50
#define MAX_PAGE 100
/* a prefix is a few tens of KB; this only bounds what a misconfigured shape could allocate */
#define MAX_PREFIX_VALUES (16 * 1024 * 1024)

/* ---- records ---- */

static void
record_clear (gpointer data)
{
  GepardVoiceRecord *record = data;
  g_free (record->id);
  g_free (record->name);
  g_free (record->description);
  g_free (record->language);
  g_free (record->accent);
  g_free (record->gender);
  g_clear_pointer (&record->created_at, g_date_time_unref);
  g_free (record->model);
  g_clear_pointer (&record->prefix, g_bytes_unref);
}

GepardVoiceRecord *
gepard_voice_record_ref (GepardVoiceRecord *record)
{
  return g_atomic_rc_box_acquire (record);
}

void
gepard_voice_record_unref (GepardVoiceRecord *record)
{
  if (record != NULL)
    g_atomic_rc_box_release_full (record, record_clear);
}

void
gepard_voice_page_free (GepardVoicePage *page)
{
  if (page == NULL)
    return;
  g_ptr_array_unref (page->voices);
  g_free (page);
}

/* ---- the store ---- */

typedef struct
{
  PGconn *conn; /* NULL until first used, and after a failure */
} Slot;

struct _GepardVoiceDb
{
  char *conninfo;
  gboolean has_connect_timeout;
  char *model;
  int rows, hidden;
  guint n_workers;
  guint cache_size;
  guint backoff_initial_ms, backoff_max_ms;

  GThreadPool *pool;
  GAsyncQueue *slots; /* Slot, n_workers of them */
  GThread *reconnector;

  GMutex lock; /* guards everything below */
  GCond wake;  /* the reconnector waits on it */
  gboolean closing;
  GepardVoiceDbState state;
  char *last_error;
  gint64 last_error_time;
  guint failures;
  guint backoff_ms;
  gint64 next_attempt; /* monotonic time of the reconnector's next attempt */
  /* the schema was brought up to date since the last (re)connection: a database that comes back
   * may be a restored or new one, so it is checked again after every outage */
  gboolean schema_ready;
  guint64 statements, voice_reads, cache_hits, cache_misses, reconnects;
  /* bumped by every delete, so that a read that raced one does not cache what was deleted */
  guint64 deletes;
  GHashTable *cache;   /* id → GList link in lru (data: GepardVoiceRecord) */
  GQueue lru;          /* most recently used first */
  GHashTable *pending; /* id → GPtrArray of GTask waiting for that voice's read */
};

typedef enum
{
  JOB_MIGRATE,
  JOB_CREATE,
  JOB_GET,
  JOB_LIST,
  JOB_DELETE,
} JobKind;

typedef struct
{
  JobKind kind;
  GTask *task; /* NULL for JOB_GET, whose waiters are in pending */
  char *id;    /* get, delete, create */
  /* create */
  char *name, *description, *language, *accent, *gender;
  GBytes *prefix;
  /* list */
  guint limit;
  char *after, *before, *pattern;
  /* get */
  guint64 deletes_at_start;
} Job;

static void
job_free (Job *job)
{
  g_clear_object (&job->task);
  g_free (job->id);
  g_free (job->name);
  g_free (job->description);
  g_free (job->language);
  g_free (job->accent);
  g_free (job->gender);
  g_clear_pointer (&job->prefix, g_bytes_unref);
  g_free (job->after);
  g_free (job->before);
  g_free (job->pattern);
  g_free (job);
}

/* libpq messages end in a newline and may span lines; one line reads better in logs and JSON */
static char *
tidy_message (const char *message)
{
  char *tidy = g_strstrip (g_strdup (message != NULL && *message ? message : "unknown error"));
  for (char *p = tidy; *p; p++)
    if (*p == '\n' || *p == '\t')
      *p = ' ';
  return tidy;
}

/* ---- health bookkeeping ---- */

static void
note_error_locked (GepardVoiceDb *db, const char *message)
{
  g_free (db->last_error);
  db->last_error = g_strdup (message);
  db->last_error_time = g_get_real_time ();
}

static void
mark_down (GepardVoiceDb *db, const char *message)
{
  g_mutex_lock (&db->lock);
  note_error_locked (db, message);
  db->failures++;
  if (db->state != GEPARD_VOICE_DB_STATE_DOWN)
    {
      db->state = GEPARD_VOICE_DB_STATE_DOWN;
      db->schema_ready = FALSE;
      db->backoff_ms = db->backoff_initial_ms;
      db->next_attempt = g_get_monotonic_time () + (gint64)db->backoff_ms * 1000;
      g_message ("voice store: the database is unreachable (%s); voices not in the cache are "
                 "unavailable until it is back",
                 message);
      g_cond_broadcast (&db->wake);
    }
  g_mutex_unlock (&db->lock);
}

static void
mark_up_locked (GepardVoiceDb *db)
{
  if (db->state == GEPARD_VOICE_DB_STATE_DOWN)
    {
      db->reconnects++;
      g_message ("voice store: the database is reachable again");
    }
  db->state = GEPARD_VOICE_DB_STATE_UP;
  db->failures = 0;
}

/* ---- libpq helpers ---- */

/* Connection failures (class 08), shutdowns and "starting up" (57P01–57P03) mean the database went
 * away, not that the statement was wrong. */
static gboolean
is_connection_failure (PGconn *conn, const char *sqlstate)
{
  if (PQstatus (conn) == CONNECTION_BAD)
    return TRUE;
  return sqlstate != NULL
         && (g_str_has_prefix (sqlstate, "08") || g_str_has_prefix (sqlstate, "57P"));
}

static void
set_statement_error (GError **error, PGconn *conn, const PGresult *res, const char *what)
{
  const char *sqlstate = res != NULL ? PQresultErrorField (res, PG_DIAG_SQLSTATE) : NULL;
  g_autofree char *message
      = tidy_message (res != NULL ? PQresultErrorMessage (res) : PQerrorMessage (conn));
  int code = GEPARD_VOICE_DB_ERROR_FAILED;
  if (is_connection_failure (conn, sqlstate))
    code = GEPARD_VOICE_DB_ERROR_DOWN;
  /* data exceptions and constraint violations: the input, not the database */
  else if (sqlstate != NULL
           && (g_str_has_prefix (sqlstate, "22") || g_str_has_prefix (sqlstate, "23")))
    code = GEPARD_VOICE_DB_ERROR_INVALID;
  g_set_error (error, GEPARD_VOICE_DB_ERROR, code, "%s: %s", what, message);
}

static void
count_statement (GepardVoiceDb *db)
{
  g_mutex_lock (&db->lock);
  db->statements++;
  g_mutex_unlock (&db->lock);
}

/* Every statement that carries a value goes through here, bound as a parameter (text format, or
 * binary where `formats` says so); results come back in binary, so a prefix is read as the bytes
 * it is, without hex decoding. */
static PGresult *
exec_params (GepardVoiceDb *db, PGconn *conn, const char *what, const char *sql, int n_params,
             const char *const *values, const int *lengths, const int *formats,
             ExecStatusType expected, GError **error)
{
  count_statement (db);
  PGresult *res = PQexecParams (conn, sql, n_params, NULL, values, lengths, formats, 1);
  if (res != NULL && PQresultStatus (res) == expected)
    return res;
  set_statement_error (error, conn, res, what);
  PQclear (res);
  return NULL;
}

/* Constant statements and the migration files (several statements each, no values) */
static gboolean
exec_plain (GepardVoiceDb *db, PGconn *conn, const char *what, const char *sql, GError **error)
{
  count_statement (db);
  PGresult *res = PQexec (conn, sql);
  ExecStatusType status = res != NULL ? PQresultStatus (res) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK)
    {
      PQclear (res);
      return TRUE;
    }
  set_statement_error (error, conn, res, what);
  PQclear (res);
  return FALSE;
}

/* libpq prints notices ("relation … already exists, skipping") on stderr by default */
static void
log_notice (void *arg, const char *message)
{
  g_debug ("voice store: %s", message);
}

static PGconn *
connect_db (GepardVoiceDb *db, GError **error)
{
  /* the conninfo is expanded first; later keywords override it, so connect_timeout is only added
   * when the operator did not choose one, and the fallback name only applies when none is set */
  const char *keys[5] = {"dbname", "client_encoding", "fallback_application_name", NULL, NULL};
  const char *values[5] = {db->conninfo, "UTF8", "gepard-server", NULL, NULL};
  if (!db->has_connect_timeout && g_getenv ("PGCONNECT_TIMEOUT") == NULL)
    {
      keys[3] = "connect_timeout";
      values[3] = "5";
    }
  PGconn *conn = PQconnectdbParams (keys, values, 1);
  if (conn != NULL && PQstatus (conn) == CONNECTION_OK)
    {
      PQsetNoticeProcessor (conn, log_notice, NULL);
      return conn;
    }
  g_autofree char *message = tidy_message (conn != NULL ? PQerrorMessage (conn) : "out of memory");
  g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN,
               "cannot connect to the database: %s", message);
  PQfinish (conn);
  return NULL;
}

/* ---- binary result decoding ---- */

static char *
get_text (const PGresult *res, int row, int col)
{
  if (PQgetisnull (res, row, col))
    return NULL;
  return g_strndup (PQgetvalue (res, row, col), (gsize)PQgetlength (res, row, col));
}

static gboolean
get_fixed (const PGresult *res, int row, int col, guint8 *out, int size)
{
  if (PQgetisnull (res, row, col) || PQgetlength (res, row, col) != size)
    return FALSE;
  memcpy (out, PQgetvalue (res, row, col), (gsize)size);
  return TRUE;
}

static gboolean
get_int32 (const PGresult *res, int row, int col, int *out)
{
  guint32 be;
  if (!get_fixed (res, row, col, (guint8 *)&be, 4))
    return FALSE;
  *out = (int)GUINT32_FROM_BE (be);
  return TRUE;
}

static char *
get_uuid (const PGresult *res, int row, int col)
{
  guint8 b[16];
  if (!get_fixed (res, row, col, b, 16))
    return NULL;
  return g_strdup_printf ("%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                          b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                          b[12], b[13], b[14], b[15]);
}

/* timestamptz in binary: microseconds since 2000-01-01 00:00 UTC */
static GDateTime *
get_timestamp (const PGresult *res, int row, int col)
{
  guint64 be;
  if (!get_fixed (res, row, col, (guint8 *)&be, 8))
    return NULL;
  gint64 usec = (gint64)GUINT64_FROM_BE (be);
  g_autoptr (GDateTime) epoch = g_date_time_new_from_unix_utc (946684800);
  return g_date_time_add (epoch, usec);
}

/* The columns every voice query selects, in this order; `with_prefix` adds the prefix last. */
#define VOICE_COLUMNS                                                                              \
  "id, name, description, language, accent, gender, created_at, model, prefix_rows, "              \
  "prefix_hidden"
enum
{
  COL_ID,
  COL_NAME,
  COL_DESCRIPTION,
  COL_LANGUAGE,
  COL_ACCENT,
  COL_GENDER,
  COL_CREATED_AT,
  COL_MODEL,
  COL_ROWS,
  COL_HIDDEN,
  COL_PREFIX,
};

static GepardVoiceRecord *
parse_record (const PGresult *res, int row, gboolean with_prefix, GError **error)
{
  g_autoptr (GepardVoiceRecord) record = g_atomic_rc_box_new0 (GepardVoiceRecord);
  record->id = get_uuid (res, row, COL_ID);
  record->name = get_text (res, row, COL_NAME);
  record->description = get_text (res, row, COL_DESCRIPTION);
  record->language = get_text (res, row, COL_LANGUAGE);
  record->accent = get_text (res, row, COL_ACCENT);
  record->gender = get_text (res, row, COL_GENDER);
  record->created_at = get_timestamp (res, row, COL_CREATED_AT);
  record->model = get_text (res, row, COL_MODEL);
  gboolean ok = record->id != NULL && record->name != NULL && record->description != NULL
                && record->language != NULL && record->created_at != NULL && record->model != NULL
                && get_int32 (res, row, COL_ROWS, &record->rows)
                && get_int32 (res, row, COL_HIDDEN, &record->hidden) && record->rows > 0
                && record->hidden > 0;
  if (ok && with_prefix)
    {
      gsize expected = (gsize)record->rows * (gsize)record->hidden * 4;
      ok = !PQgetisnull (res, row, COL_PREFIX)
           && (gsize)PQgetlength (res, row, COL_PREFIX) == expected;
      if (ok)
        record->prefix = g_bytes_new (PQgetvalue (res, row, COL_PREFIX), expected);
    }
  if (!ok)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_FAILED,
                   "the voices table does not hold what this server expects (row %d); is the "
                   "schema from a newer version?",
                   row);
      return NULL;
    }
  return g_steal_pointer (&record);
}

/* ---- migrations ---- */

static int
compare_names (gconstpointer a, gconstpointer b)
{
  return strcmp (*(char *const *)a, *(char *const *)b);
}

/* The files of sql/, compiled in, in the order their numbers give. */
static GPtrArray *
list_migrations (GError **error)
{
  g_auto (GStrv) names
      = g_resource_enumerate_children (gepard_sql_get_resource (), SQL_RESOURCE_DIR, 0, error);
  if (names == NULL)
    return NULL;
  GPtrArray *files = g_ptr_array_new_with_free_func (g_free);
  for (char **n = names; *n; n++)
    if (g_str_has_suffix (*n, ".sql"))
      g_ptr_array_add (files, g_strdup (*n));
  g_ptr_array_sort (files, compare_names);
  return files;
}

static gboolean
apply_migration (GepardVoiceDb *db, PGconn *conn, const char *name, GBytes *sql,
                 const char *checksum, GError **error)
{
  /* the file's statements and its schema_migrations row commit together or not at all */
  if (!exec_plain (db, conn, "BEGIN", "BEGIN", error))
    return FALSE;
  g_autofree char *text = g_strndup (g_bytes_get_data (sql, NULL), g_bytes_get_size (sql));
  g_autofree char *what = g_strdup_printf ("migration %s", name);
  gboolean ok = exec_plain (db, conn, what, text, error);
  if (ok)
    {
      const char *values[2] = {name, checksum};
      PGresult *res = exec_params (db, conn, what,
                                   "INSERT INTO schema_migrations (version, checksum) "
                                   "VALUES ($1, $2)",
                                   2, values, NULL, NULL, PGRES_COMMAND_OK, error);
      ok = res != NULL;
      PQclear (res);
    }
  if (ok)
    ok = exec_plain (db, conn, what, "COMMIT", error);
  if (!ok && PQstatus (conn) == CONNECTION_OK)
    PQclear (PQexec (conn, "ROLLBACK"));
  if (ok)
    g_message ("voice store: applied migration %s", name);
  return ok;
}

static gboolean
migrate_locked (GepardVoiceDb *db, PGconn *conn, GError **error)
{
  /* created under the lock: CREATE TABLE IF NOT EXISTS alone can still race another session */
  if (!exec_plain (db, conn, "schema_migrations",
                   "CREATE TABLE IF NOT EXISTS schema_migrations ("
                   " version text PRIMARY KEY,"
                   " checksum text NOT NULL,"
                   " applied_at timestamptz NOT NULL DEFAULT now ())",
                   error))
    return FALSE;
  PGresult *res = exec_params (db, conn, "schema_migrations",
                               "SELECT version, checksum FROM schema_migrations", 0, NULL, NULL,
                               NULL, PGRES_TUPLES_OK, error);
  if (res == NULL)
    return FALSE;
  g_autoptr (GHashTable) applied = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  for (int i = 0; i < PQntuples (res); i++)
    g_hash_table_insert (applied, get_text (res, i, 0), get_text (res, i, 1));
  PQclear (res);

  g_autoptr (GPtrArray) files = list_migrations (error);
  if (files == NULL)
    return FALSE;
  for (guint i = 0; i < files->len; i++)
    {
      const char *name = files->pdata[i];
      g_autofree char *path = g_strconcat (SQL_RESOURCE_DIR "/", name, NULL);
      g_autoptr (GBytes) sql = g_resource_lookup_data (gepard_sql_get_resource (), path, 0, error);
      if (sql == NULL)
        return FALSE;
      g_autofree char *checksum = g_compute_checksum_for_bytes (G_CHECKSUM_SHA256, sql);
      const char *done = g_hash_table_lookup (applied, name);
      if (done != NULL)
        {
          /* an applied migration is history: editing it changes nothing in existing databases */
          if (!g_str_equal (done, checksum))
            g_message ("voice store: migration %s differs from the one applied to this database; "
                       "a change to the schema needs a new numbered file",
                       name);
          continue;
        }
      if (!apply_migration (db, conn, name, sql, checksum, error))
        return FALSE;
    }
  return TRUE;
}

static gboolean
migrate (GepardVoiceDb *db, PGconn *conn, GError **error)
{
  const char *key[1] = {MIGRATION_LOCK_KEY};
  PGresult *res = exec_params (db, conn, "migration lock", "SELECT pg_advisory_lock ($1::bigint)",
                               1, key, NULL, NULL, PGRES_TUPLES_OK, error);
  if (res == NULL)
    return FALSE;
  PQclear (res);
  gboolean ok = migrate_locked (db, conn, error);
  if (PQstatus (conn) == CONNECTION_OK)
    {
      /* not counted as a failure of its own: without the session the lock is gone anyway */
      count_statement (db);
      PQclear (PQexecParams (conn, "SELECT pg_advisory_unlock ($1::bigint)", 1, NULL, key, NULL,
                             NULL, 0));
    }
  if (ok)
    {
      g_mutex_lock (&db->lock);
      db->schema_ready = TRUE;
      g_mutex_unlock (&db->lock);
    }
  return ok;
}

/* ---- operations, run on a worker with its connection ---- */

static GepardVoiceRecord *
fetch_voice (GepardVoiceDb *db, PGconn *conn, const char *id, GError **error)
{
  const char *values[1] = {id};
  g_mutex_lock (&db->lock);
  db->voice_reads++;
  g_mutex_unlock (&db->lock);
  PGresult *res = exec_params (db, conn, "reading a voice",
                               "SELECT " VOICE_COLUMNS ", prefix FROM voices WHERE id = $1::uuid",
                               1, values, NULL, NULL, PGRES_TUPLES_OK, error);
  if (res == NULL)
    return NULL;
  GepardVoiceRecord *record = NULL;
  if (PQntuples (res) == 0)
    g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND, "no voice %s", id);
  else
    record = parse_record (res, 0, TRUE, error);
  PQclear (res);
  return record;
}

static GepardVoiceRecord *
op_create (GepardVoiceDb *db, PGconn *conn, Job *job, GError **error)
{
  g_autofree char *rows = g_strdup_printf ("%d", db->rows);
  g_autofree char *hidden = g_strdup_printf ("%d", db->hidden);
  gsize prefix_size = 0;
  const char *prefix = g_bytes_get_data (job->prefix, &prefix_size);
  const char *values[10]
      = {job->id,   job->name, job->description, job->language, job->accent, job->gender,
         db->model, rows,      hidden,           prefix};
  int lengths[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, (int)prefix_size};
  int formats[10] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  /* The id is chosen here rather than by the column default so that re-running this statement
   * after a connection died mid-way cannot store the voice twice. */
  PGresult *res = exec_params (
      db, conn, "storing a voice",
      "INSERT INTO voices (id, name, description, language, accent, gender, model, prefix_rows, "
      "prefix_hidden, prefix) "
      "VALUES ($1::uuid, $2, $3, $4, $5, $6, $7, $8::integer, $9::integer, $10::bytea) "
      "ON CONFLICT (id) DO NOTHING RETURNING " VOICE_COLUMNS,
      10, values, lengths, formats, PGRES_TUPLES_OK, error);
  if (res == NULL)
    return NULL;
  if (PQntuples (res) == 0)
    {
      /* the first attempt did commit before its connection died */
      PQclear (res);
      return fetch_voice (db, conn, job->id, error);
    }
  GepardVoiceRecord *record = parse_record (res, 0, FALSE, error);
  PQclear (res);
  if (record != NULL)
    record->prefix = g_bytes_ref (job->prefix);
  return record;
}

static GepardVoiceRecord *
op_get (GepardVoiceDb *db, PGconn *conn, Job *job, GError **error)
{
  g_autoptr (GepardVoiceRecord) record = fetch_voice (db, conn, job->id, error);
  if (record == NULL)
    return NULL;
  if (!g_str_equal (record->model, db->model) || record->rows != db->rows
      || record->hidden != db->hidden)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_MODEL_MISMATCH,
                   "voice %s was cloned for model %s (%d × %d prefix); this server runs %s "
                   "(%d × %d): clone it again for this model",
                   record->id, record->model, record->rows, record->hidden, db->model, db->rows,
                   db->hidden);
      return NULL;
    }
  return g_steal_pointer (&record);
}

static GepardVoicePage *
op_list (GepardVoiceDb *db, PGconn *conn, Job *job, GError **error)
{
  const char *cursor = job->after != NULL ? job->after : job->before;
  if (cursor != NULL)
    {
      const char *values[1] = {cursor};
      PGresult *res
          = exec_params (db, conn, "listing voices", "SELECT 1 FROM voices WHERE id = $1::uuid", 1,
                         values, NULL, NULL, PGRES_TUPLES_OK, error);
      if (res == NULL)
        return NULL;
      int found = PQntuples (res);
      PQclear (res);
      if (found == 0)
        {
          g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                       "%s: there is no voice %s",
                       job->after != NULL ? "starting_after" : "ending_before", cursor);
          return NULL;
        }
    }

  /* Newest first, keyed on (created_at, id). ending_before walks the other way from its cursor and
   * the page is turned around below. One row more than asked says whether there are more. */
  const char *sql;
  if (job->after != NULL)
    sql = "SELECT " VOICE_COLUMNS " FROM voices WHERE model = $1"
          " AND ($2::text IS NULL OR name ILIKE $2)"
          " AND (created_at, id) < (SELECT created_at, id FROM voices WHERE id = $3::uuid)"
          " ORDER BY created_at DESC, id DESC LIMIT $4::integer";
  else if (job->before != NULL)
    sql = "SELECT " VOICE_COLUMNS " FROM voices WHERE model = $1"
          " AND ($2::text IS NULL OR name ILIKE $2)"
          " AND (created_at, id) > (SELECT created_at, id FROM voices WHERE id = $3::uuid)"
          " ORDER BY created_at ASC, id ASC LIMIT $4::integer";
  else
    sql = "SELECT " VOICE_COLUMNS " FROM voices WHERE model = $1"
          " AND ($2::text IS NULL OR name ILIKE $2)"
          " AND $3::uuid IS NULL"
          " ORDER BY created_at DESC, id DESC LIMIT $4::integer";
  g_autofree char *limit = g_strdup_printf ("%u", job->limit + 1);
  const char *values[4] = {db->model, job->pattern, cursor, limit};
  PGresult *res = exec_params (db, conn, "listing voices", sql, 4, values, NULL, NULL,
                               PGRES_TUPLES_OK, error);
  if (res == NULL)
    return NULL;
  g_autoptr (GepardVoicePage) page = g_new0 (GepardVoicePage, 1);
  page->voices = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_voice_record_unref);
  int n = PQntuples (res);
  page->has_more = n > (int)job->limit;
  for (int i = 0; i < MIN (n, (int)job->limit); i++)
    {
      GepardVoiceRecord *record = parse_record (res, i, FALSE, error);
      if (record == NULL)
        {
          PQclear (res);
          return NULL;
        }
      g_ptr_array_add (page->voices, record);
    }
  PQclear (res);
  if (job->before != NULL)
    for (guint i = 0, j = page->voices->len; i + 1 < j; i++, j--)
      {
        gpointer t = page->voices->pdata[i];
        page->voices->pdata[i] = page->voices->pdata[j - 1];
        page->voices->pdata[j - 1] = t;
      }
  return g_steal_pointer (&page);
}

static gboolean
op_delete (GepardVoiceDb *db, PGconn *conn, Job *job, GError **error)
{
  const char *values[1] = {job->id};
  PGresult *res
      = exec_params (db, conn, "deleting a voice", "DELETE FROM voices WHERE id = $1::uuid", 1,
                     values, NULL, NULL, PGRES_COMMAND_OK, error);
  if (res == NULL)
    return FALSE;
  gboolean deleted = g_strcmp0 (PQcmdTuples (res), "0") != 0;
  PQclear (res);
  if (!deleted)
    g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND, "no voice %s",
                 job->id);
  return deleted;
}

static gpointer
run_op (GepardVoiceDb *db, PGconn *conn, Job *job, GError **error)
{
  switch (job->kind)
    {
    case JOB_MIGRATE:
      return migrate (db, conn, error) ? GINT_TO_POINTER (TRUE) : NULL;
    case JOB_CREATE:
      return op_create (db, conn, job, error);
    case JOB_GET:
      return op_get (db, conn, job, error);
    case JOB_LIST:
      return op_list (db, conn, job, error);
    case JOB_DELETE:
      return op_delete (db, conn, job, error) ? GINT_TO_POINTER (TRUE) : NULL;
    }
  g_assert_not_reached ();
}

/* A connection for `slot`, or a DOWN error. While the database is known to be down nothing is
 * tried here (the reconnector is on it), so a request fails at once rather than after a timeout.
 * Sets *fresh when the connection was made just now. */
static gboolean
ensure_connection (GepardVoiceDb *db, Slot *slot, gboolean *fresh, GError **error)
{
  *fresh = FALSE;
  g_mutex_lock (&db->lock);
  if (db->state == GEPARD_VOICE_DB_STATE_DOWN)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN,
                   "the voice database is unreachable (%s); retrying in the background",
                   db->last_error != NULL ? db->last_error : "no connection");
      g_mutex_unlock (&db->lock);
      g_clear_pointer (&slot->conn, PQfinish);
      return FALSE;
    }
  g_mutex_unlock (&db->lock);

  if (slot->conn != NULL && PQstatus (slot->conn) == CONNECTION_OK)
    return TRUE;
  g_clear_pointer (&slot->conn, PQfinish);
  GError *local = NULL;
  slot->conn = connect_db (db, &local);
  if (slot->conn == NULL)
    {
      mark_down (db, local->message);
      g_propagate_error (error, local);
      return FALSE;
    }
  g_mutex_lock (&db->lock);
  mark_up_locked (db);
  g_mutex_unlock (&db->lock);
  *fresh = TRUE;
  return TRUE;
}

static gpointer
execute (GepardVoiceDb *db, Slot *slot, Job *job, GError **error)
{
  for (int attempt = 0;; attempt++)
    {
      gboolean fresh;
      if (!ensure_connection (db, slot, &fresh, error))
        return NULL;
      GError *local = NULL;
      gpointer result = NULL;
      g_mutex_lock (&db->lock);
      gboolean schema_ready = db->schema_ready;
      g_mutex_unlock (&db->lock);
      if (job->kind == JOB_MIGRATE || schema_ready || migrate (db, slot->conn, &local))
        result = run_op (db, slot->conn, job, &local);
      if (local == NULL)
        return result;
      if (!g_error_matches (local, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN))
        {
          g_mutex_lock (&db->lock);
          if (local->code == GEPARD_VOICE_DB_ERROR_FAILED)
            note_error_locked (db, local->message);
          g_mutex_unlock (&db->lock);
          g_propagate_error (error, local);
          return NULL;
        }
      g_clear_pointer (&slot->conn, PQfinish);
      /* A connection that had been idle may have died unnoticed (the server restarted, a proxy
       * dropped it): one new connection tells an old broken socket from a database that is gone.
       * Running a statement again is safe: a create finds the row its first attempt may have
       * committed (see op_create); a delete whose first attempt committed answers NOT_FOUND. */
      if (fresh || attempt > 0)
        {
          mark_down (db, local->message);
          g_propagate_error (error, local);
          return NULL;
        }
      g_clear_error (&local);
    }
}

/* ---- the cache ---- */

static GepardVoiceRecord *
cache_lookup_locked (GepardVoiceDb *db, const char *id)
{
  GList *link = g_hash_table_lookup (db->cache, id);
  if (link == NULL)
    return NULL;
  g_queue_unlink (&db->lru, link);
  g_queue_push_head_link (&db->lru, link);
  return gepard_voice_record_ref (link->data);
}

static void
cache_remove_locked (GepardVoiceDb *db, const char *id)
{
  GList *link = g_hash_table_lookup (db->cache, id);
  if (link == NULL)
    return;
  g_hash_table_remove (db->cache, id);
  g_queue_unlink (&db->lru, link);
  gepard_voice_record_unref (link->data);
  g_list_free_1 (link);
}

static void
cache_insert_locked (GepardVoiceDb *db, GepardVoiceRecord *record)
{
  cache_remove_locked (db, record->id);
  g_queue_push_head (&db->lru, gepard_voice_record_ref (record));
  g_hash_table_insert (db->cache, g_strdup (record->id), db->lru.head);
  while (db->lru.length > db->cache_size)
    {
      GepardVoiceRecord *oldest = g_queue_peek_tail (&db->lru);
      cache_remove_locked (db, oldest->id);
    }
}

static void
complete_get (GepardVoiceDb *db, Job *job, GepardVoiceRecord *record, GError *error)
{
  g_mutex_lock (&db->lock);
  GPtrArray *waiters = NULL;
  g_autofree char *key = NULL;
  g_hash_table_steal_extended (db->pending, job->id, (gpointer *)&key, (gpointer *)&waiters);
  /* a delete that finished while this read was under way may have removed what it read */
  if (record != NULL && db->deletes == job->deletes_at_start)
    cache_insert_locked (db, record);
  g_mutex_unlock (&db->lock);

  for (guint i = 0; waiters != NULL && i < waiters->len; i++)
    {
      GTask *task = waiters->pdata[i];
      if (record != NULL)
        g_task_return_pointer (task, gepard_voice_record_ref (record),
                               (GDestroyNotify)gepard_voice_record_unref);
      else
        g_task_return_error (task, g_error_copy (error));
    }
  g_clear_pointer (&waiters, g_ptr_array_unref);
  gepard_voice_record_unref (record);
  g_clear_error (&error);
}

static void
run_job (gpointer data, gpointer user_data)
{
  Job *job = data;
  GepardVoiceDb *db = user_data;
  GError *error = NULL;
  gpointer result = NULL;

  g_mutex_lock (&db->lock);
  gboolean closing = db->closing;
  g_mutex_unlock (&db->lock);
  if (closing)
    g_set_error (&error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLOSED,
                 "the voice store is shutting down");
  else if (job->task != NULL && g_task_return_error_if_cancelled (job->task))
    {
      job_free (job);
      return;
    }
  else
    {
      Slot *slot = g_async_queue_pop (db->slots);
      result = execute (db, slot, job, &error);
      g_async_queue_push (db->slots, slot);
    }

  switch (job->kind)
    {
    case JOB_GET:
      complete_get (db, job, result, error);
      break;
    case JOB_CREATE:
      if (result != NULL)
        {
          g_mutex_lock (&db->lock);
          cache_insert_locked (db, result);
          g_mutex_unlock (&db->lock);
          g_task_return_pointer (job->task, result, (GDestroyNotify)gepard_voice_record_unref);
        }
      else
        g_task_return_error (job->task, error);
      break;
    case JOB_LIST:
      if (result != NULL)
        g_task_return_pointer (job->task, result, (GDestroyNotify)gepard_voice_page_free);
      else
        g_task_return_error (job->task, error);
      break;
    case JOB_DELETE:
      if (result != NULL)
        {
          g_mutex_lock (&db->lock);
          cache_remove_locked (db, job->id);
          db->deletes++;
          g_mutex_unlock (&db->lock);
          g_task_return_boolean (job->task, TRUE);
        }
      else
        g_task_return_error (job->task, error);
      break;
    case JOB_MIGRATE:
      if (result != NULL)
        g_task_return_boolean (job->task, TRUE);
      else
        g_task_return_error (job->task, error);
      break;
    }
  job_free (job);
}

/* ---- the reconnector ---- */

static gpointer
reconnect_thread (gpointer data)
{
  GepardVoiceDb *db = data;
  g_mutex_lock (&db->lock);
  while (!db->closing)
    {
      if (db->state != GEPARD_VOICE_DB_STATE_DOWN)
        {
          g_cond_wait (&db->wake, &db->lock);
          continue;
        }
      if (g_get_monotonic_time () < db->next_attempt)
        {
          g_cond_wait_until (&db->wake, &db->lock, db->next_attempt);
          continue;
        }
      g_mutex_unlock (&db->lock);
      g_autoptr (GError) error = NULL;
      PGconn *conn = connect_db (db, &error);
      PQfinish (conn);
      g_mutex_lock (&db->lock);
      if (conn != NULL)
        mark_up_locked (db);
      else
        {
          note_error_locked (db, error->message);
          db->failures++;
          db->backoff_ms = MIN (db->backoff_ms * 2, db->backoff_max_ms);
          db->next_attempt = g_get_monotonic_time () + (gint64)db->backoff_ms * 1000;
        }
    }
  g_mutex_unlock (&db->lock);
  return NULL;
}

/* ---- public API ---- */

static gboolean
check_text (const char *what, const char *value, gboolean required, glong max_chars, GError **error)
{
  if (value == NULL || *value == '\0')
    {
      if (!required)
        return TRUE;
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID, "%s is required",
                   what);
      return FALSE;
    }
  if (!g_utf8_validate (value, -1, NULL))
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                   "%s is not valid UTF-8", what);
      return FALSE;
    }
  if (g_utf8_strlen (value, -1) > max_chars)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                   "%s is longer than %ld characters", what, max_chars);
      return FALSE;
    }
  return TRUE;
}

GepardVoiceDb *
gepard_voice_db_new (const GepardVoiceDbOptions *options, GError **error)
{
  g_return_val_if_fail (options != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  if (options->conninfo == NULL)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                   "no database connection string");
      return NULL;
    }
  char *parse_error = NULL;
  PQconninfoOption *parsed = PQconninfoParse (options->conninfo, &parse_error);
  if (parsed == NULL)
    {
      g_autofree char *message = tidy_message (parse_error);
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                   "the database connection string is not valid: %s", message);
      PQfreemem (parse_error);
      return NULL;
    }
  gboolean has_connect_timeout = FALSE;
  for (PQconninfoOption *o = parsed; o->keyword != NULL; o++)
    if (g_str_equal (o->keyword, "connect_timeout") && o->val != NULL)
      has_connect_timeout = TRUE;
  PQconninfoFree (parsed);

  if (!check_text ("the model identity", options->model, TRUE, MAX_NAME_CHARS, error))
    return NULL;
  if (options->rows <= 0 || options->hidden <= 0
      || (gint64)options->rows * options->hidden > MAX_PREFIX_VALUES)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                   "a %d × %d voice prefix is not a shape a model has", options->rows,
                   options->hidden);
      return NULL;
    }

  GepardVoiceDb *db = g_new0 (GepardVoiceDb, 1);
  db->conninfo = g_strdup (options->conninfo);
  db->has_connect_timeout = has_connect_timeout;
  db->model = g_strdup (options->model);
  db->rows = options->rows;
  db->hidden = options->hidden;
  db->n_workers = CLAMP (options->n_workers != 0 ? options->n_workers : 2, 1, 64);
  db->cache_size = options->cache_size != 0 ? options->cache_size : 256;
  db->backoff_initial_ms = options->backoff_initial_ms != 0 ? options->backoff_initial_ms : 200;
  db->backoff_max_ms = MAX (options->backoff_max_ms != 0 ? options->backoff_max_ms : 10000,
                            db->backoff_initial_ms);
  g_mutex_init (&db->lock);
  g_cond_init (&db->wake);
  db->state = GEPARD_VOICE_DB_STATE_UNKNOWN;
  db->cache = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  g_queue_init (&db->lru);
  db->pending = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  db->slots = g_async_queue_new ();
  for (guint i = 0; i < db->n_workers; i++)
    g_async_queue_push (db->slots, g_new0 (Slot, 1));
  /* at most one job per slot runs, so taking a slot never waits */
  db->pool = g_thread_pool_new (run_job, db, (int)db->n_workers, FALSE, NULL);
  db->reconnector = g_thread_new ("voice-db-reconnect", reconnect_thread, db);
  return db;
}

void
gepard_voice_db_free (GepardVoiceDb *db)
{
  if (db == NULL)
    return;
  g_mutex_lock (&db->lock);
  db->closing = TRUE;
  g_cond_broadcast (&db->wake);
  g_mutex_unlock (&db->lock);
  g_thread_join (db->reconnector);
  /* runs what is queued: closing makes each of those fail at once */
  g_thread_pool_free (db->pool, FALSE, TRUE);
  for (guint i = 0; i < db->n_workers; i++)
    {
      Slot *slot = g_async_queue_pop (db->slots);
      g_clear_pointer (&slot->conn, PQfinish);
      g_free (slot);
    }
  g_async_queue_unref (db->slots);
  while (db->lru.length > 0)
    gepard_voice_record_unref (g_queue_pop_head (&db->lru));
  g_hash_table_unref (db->cache);
  g_hash_table_unref (db->pending);
  g_cond_clear (&db->wake);
  g_mutex_clear (&db->lock);
  g_free (db->last_error);
  g_free (db->conninfo);
  g_free (db->model);
  g_free (db);
}

static Job *
job_new (JobKind kind, GTask *task)
{
  Job *job = g_new0 (Job, 1);
  job->kind = kind;
  job->task = task;
  return job;
}

static void
push_job (GepardVoiceDb *db, Job *job)
{
  g_thread_pool_push (db->pool, job, NULL);
}

void
gepard_voice_db_migrate_async (GepardVoiceDb *db, GCancellable *cancellable,
                               GAsyncReadyCallback callback, gpointer user_data)
{
  g_return_if_fail (db != NULL);
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, gepard_voice_db_migrate_async);
  push_job (db, job_new (JOB_MIGRATE, task));
}

gboolean
gepard_voice_db_migrate_finish (GepardVoiceDb *db, GAsyncResult *result, GError **error)
{
  g_return_val_if_fail (g_task_is_valid (result, NULL), FALSE);
  return g_task_propagate_boolean (G_TASK (result), error);
}

/* A voice id in the form PostgreSQL prints it, or NULL: ids are compared and cached as strings. */
static char *
canonical_id (const char *id)
{
  if (id == NULL || !g_uuid_string_is_valid (id))
    return NULL;
  return g_ascii_strdown (id, -1);
}

static void
return_not_a_voice_id (GTask *task, const char *id)
{
  g_autofree char *shown = id != NULL ? g_utf8_make_valid (id, MIN (strlen (id), 64)) : NULL;
  g_task_return_new_error (task, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND,
                           "no voice “%s”: a voice id is a UUID", shown != NULL ? shown : "");
  g_object_unref (task);
}

void
gepard_voice_db_create_async (GepardVoiceDb *db, const GepardVoiceCreateParams *params,
                              GCancellable *cancellable, GAsyncReadyCallback callback,
                              gpointer user_data)
{
  g_return_if_fail (db != NULL && params != NULL);
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, gepard_voice_db_create_async);

  GError *error = NULL;
  if (!check_text ("name", params->name, TRUE, MAX_NAME_CHARS, &error)
      || !check_text ("language", params->language, TRUE, MAX_LANGUAGE_CHARS, &error)
      || !check_text ("description", params->description, FALSE, MAX_DESCRIPTION_CHARS, &error)
      || !check_text ("accent", params->accent, FALSE, MAX_ACCENT_CHARS, &error)
      || !check_text ("gender", params->gender, FALSE, MAX_GENDER_CHARS, &error))
    goto fail;
  if (params->prefix == NULL || params->rows != db->rows || params->hidden != db->hidden)
    {
      g_set_error (&error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                   "the voice prefix is %d × %d; this model's prefixes are %d × %d",
                   params->prefix != NULL ? params->rows : 0,
                   params->prefix != NULL ? params->hidden : 0, db->rows, db->hidden);
      goto fail;
    }

  /* stored as a prefix file's bytes: little-endian fp32, row-major */
  gsize n = (gsize)db->rows * (gsize)db->hidden;
  guint32 *le = g_new (guint32, n);
  for (gsize i = 0; i < n; i++)
    {
      if (!isfinite (params->prefix[i]))
        {
          g_free (le);
          g_set_error (&error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                       "the voice prefix holds a value that is not finite (row %zu, column %zu)",
                       i / (gsize)db->hidden, i % (gsize)db->hidden);
          goto fail;
        }
      guint32 bits;
      memcpy (&bits, &params->prefix[i], 4);
      le[i] = GUINT32_TO_LE (bits);
    }

  Job *job = job_new (JOB_CREATE, task);
  job->id = g_uuid_string_random ();
  job->name = g_strdup (params->name);
  job->language = g_strdup (params->language);
  job->description = g_strdup (params->description != NULL ? params->description : "");
  job->accent = params->accent != NULL && *params->accent ? g_strdup (params->accent) : NULL;
  job->gender = params->gender != NULL && *params->gender ? g_strdup (params->gender) : NULL;
  job->prefix = g_bytes_new_take (le, n * 4);
  push_job (db, job);
  return;

fail:
  g_task_return_error (task, error);
  g_object_unref (task);
}

GepardVoiceRecord *
gepard_voice_db_create_finish (GepardVoiceDb *db, GAsyncResult *result, GError **error)
{
  g_return_val_if_fail (g_task_is_valid (result, NULL), NULL);
  return g_task_propagate_pointer (G_TASK (result), error);
}

GepardVoiceRecord *
gepard_voice_db_lookup_cached (GepardVoiceDb *db, const char *id)
{
  g_return_val_if_fail (db != NULL, NULL);
  g_autofree char *key = canonical_id (id);
  if (key == NULL)
    return NULL;
  g_mutex_lock (&db->lock);
  GepardVoiceRecord *record = cache_lookup_locked (db, key);
  if (record != NULL)
    db->cache_hits++;
  g_mutex_unlock (&db->lock);
  return record;
}

void
gepard_voice_db_get_async (GepardVoiceDb *db, const char *id, GCancellable *cancellable,
                           GAsyncReadyCallback callback, gpointer user_data)
{
  g_return_if_fail (db != NULL);
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, gepard_voice_db_get_async);
  g_autofree char *key = canonical_id (id);
  if (key == NULL)
    {
      return_not_a_voice_id (task, id);
      return;
    }

  g_mutex_lock (&db->lock);
  GepardVoiceRecord *record = cache_lookup_locked (db, key);
  if (record != NULL)
    {
      db->cache_hits++;
      g_mutex_unlock (&db->lock);
      g_task_return_pointer (task, record, (GDestroyNotify)gepard_voice_record_unref);
      g_object_unref (task);
      return;
    }
  db->cache_misses++;
  GPtrArray *waiters = g_hash_table_lookup (db->pending, key);
  if (waiters != NULL)
    {
      /* a read of this voice is under way: share it */
      g_ptr_array_add (waiters, task);
      g_mutex_unlock (&db->lock);
      return;
    }
  waiters = g_ptr_array_new_with_free_func (g_object_unref);
  g_ptr_array_add (waiters, task);
  g_hash_table_insert (db->pending, g_strdup (key), waiters);
  Job *job = job_new (JOB_GET, NULL);
  job->id = g_steal_pointer (&key);
  job->deletes_at_start = db->deletes;
  g_mutex_unlock (&db->lock);
  push_job (db, job);
}

GepardVoiceRecord *
gepard_voice_db_get_finish (GepardVoiceDb *db, GAsyncResult *result, GError **error)
{
  g_return_val_if_fail (g_task_is_valid (result, NULL), NULL);
  return g_task_propagate_pointer (G_TASK (result), error);
}

/* "%query%" for ILIKE, the query's own % _ and \ taken literally (backslash is LIKE's escape) */
static char *
like_pattern (const char *query)
{
  GString *s = g_string_new ("%");
  for (const char *p = query; *p; p++)
    {
      if (*p == '%' || *p == '_' || *p == '\\')
        g_string_append_c (s, '\\');
      g_string_append_c (s, *p);
    }
  g_string_append_c (s, '%');
  return g_string_free (s, FALSE);
}

void
gepard_voice_db_list_async (GepardVoiceDb *db, const GepardVoiceListParams *params,
                            GCancellable *cancellable, GAsyncReadyCallback callback,
                            gpointer user_data)
{
  g_return_if_fail (db != NULL && params != NULL);
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, gepard_voice_db_list_async);
  GError *error = NULL;

  if (params->limit < 1 || params->limit > MAX_PAGE)
    g_set_error (&error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                 "limit must be from 1 to %d", MAX_PAGE);
  else if (params->starting_after != NULL && params->ending_before != NULL)
    g_set_error (&error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                 "give starting_after or ending_before, not both");
  else if ((params->starting_after != NULL && !g_uuid_string_is_valid (params->starting_after))
           || (params->ending_before != NULL && !g_uuid_string_is_valid (params->ending_before)))
    g_set_error (&error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID,
                 "%s must be a voice id (a UUID)",
                 params->starting_after != NULL ? "starting_after" : "ending_before");
  else
    check_text ("query", params->query, FALSE, MAX_NAME_CHARS, &error);
  if (error != NULL)
    {
      g_task_return_error (task, error);
      g_object_unref (task);
      return;
    }

  Job *job = job_new (JOB_LIST, task);
  job->limit = params->limit;
  job->after = canonical_id (params->starting_after);
  job->before = canonical_id (params->ending_before);
  job->pattern = params->query != NULL && *params->query ? like_pattern (params->query) : NULL;
  push_job (db, job);
}

GepardVoicePage *
gepard_voice_db_list_finish (GepardVoiceDb *db, GAsyncResult *result, GError **error)
{
  g_return_val_if_fail (g_task_is_valid (result, NULL), NULL);
  return g_task_propagate_pointer (G_TASK (result), error);
}

void
gepard_voice_db_delete_async (GepardVoiceDb *db, const char *id, GCancellable *cancellable,
                              GAsyncReadyCallback callback, gpointer user_data)
{
  g_return_if_fail (db != NULL);
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, gepard_voice_db_delete_async);
  g_autofree char *key = canonical_id (id);
  if (key == NULL)
    {
      return_not_a_voice_id (task, id);
      return;
    }
  Job *job = job_new (JOB_DELETE, task);
  job->id = g_steal_pointer (&key);
  push_job (db, job);
}

gboolean
gepard_voice_db_delete_finish (GepardVoiceDb *db, GAsyncResult *result, GError **error)
{
  g_return_val_if_fail (g_task_is_valid (result, NULL), FALSE);
  return g_task_propagate_boolean (G_TASK (result), error);
}

void
gepard_voice_db_get_health (GepardVoiceDb *db, GepardVoiceDbHealth *health)
{
  g_return_if_fail (db != NULL && health != NULL);
  g_mutex_lock (&db->lock);
  health->state = db->state;
  health->last_error = g_strdup (db->last_error);
  health->last_error_time = db->last_error_time;
  health->consecutive_failures = db->failures;
  health->cached_voices = db->lru.length;
  health->statements = db->statements;
  health->voice_reads = db->voice_reads;
  health->cache_hits = db->cache_hits;
  health->cache_misses = db->cache_misses;
  health->reconnects = db->reconnects;
  g_mutex_unlock (&db->lock);
}

void
gepard_voice_db_health_clear (GepardVoiceDbHealth *health)
{
  g_clear_pointer (&health->last_error, g_free);
}

/* ---- the private development cluster ---- */

struct _GepardVoiceDbCluster
{
  char *dir;
  char *data_dir;
  char *bindir;
  char *log_file;
  char *conninfo;
  gboolean running;
  gboolean ours; /* started by this process, so stopped when freed */
  /* PostgreSQL refuses to run as root: as root, its tools run as this user */
  gboolean as_other_user;
  uid_t uid;
  gid_t gid;
};

/* the newest of /usr/lib/postgresql/<version>/bin (Debian's layout) */
static char *
find_debian_bindir (void)
{
  g_autoptr (GDir) dir = g_dir_open ("/usr/lib/postgresql", 0, NULL);
  if (dir == NULL)
    return NULL;
  char *best = NULL;
  guint64 best_version = 0;
  const char *name;
  while ((name = g_dir_read_name (dir)) != NULL)
    {
      guint64 version = g_ascii_strtoull (name, NULL, 10);
      g_autofree char *bin = g_build_filename ("/usr/lib/postgresql", name, "bin", NULL);
      g_autofree char *initdb = g_build_filename (bin, "initdb", NULL);
      g_autofree char *pg_ctl = g_build_filename (bin, "pg_ctl", NULL);
      if (version >= best_version && g_file_test (initdb, G_FILE_TEST_IS_EXECUTABLE)
          && g_file_test (pg_ctl, G_FILE_TEST_IS_EXECUTABLE))
        {
          g_free (best);
          best = g_steal_pointer (&bin);
          best_version = version;
        }
    }
  return best;
}

static gboolean
has_tools (const char *bindir)
{
  g_autofree char *initdb = g_build_filename (bindir, "initdb", NULL);
  g_autofree char *pg_ctl = g_build_filename (bindir, "pg_ctl", NULL);
  return g_file_test (initdb, G_FILE_TEST_IS_EXECUTABLE)
         && g_file_test (pg_ctl, G_FILE_TEST_IS_EXECUTABLE);
}

char *
gepard_voice_db_find_pg_bindir (void)
{
  const char *env = g_getenv ("GEPARD_PG_BINDIR");
  if (env != NULL && *env)
    return has_tools (env) ? g_strdup (env) : NULL;
  char *bindir = find_debian_bindir ();
  if (bindir != NULL)
    return bindir;
  g_autofree char *pg_ctl = g_find_program_in_path ("pg_ctl");
  if (pg_ctl == NULL)
    return NULL;
  bindir = g_path_get_dirname (pg_ctl);
  if (has_tools (bindir))
    return bindir;
  g_free (bindir);
  return NULL;
}

char *
gepard_voice_db_default_cluster_dir (void)
{
  if (geteuid () == 0)
    return g_strdup ("/var/lib/gepard/postgres");
  return g_build_filename (g_get_user_data_dir (), "gepard", "postgres", NULL);
}

typedef struct
{
  uid_t uid;
  gid_t gid;
} Identity;

/* In the child between fork and exec: only async-signal-safe calls, the user looked up before */
static void
become_user (gpointer data)
{
  const Identity *who = data;
  if (setgroups (1, &who->gid) != 0 || setgid (who->gid) != 0 || setuid (who->uid) != 0)
    _exit (126);
}

/* Runs a PostgreSQL tool; *status gets its exit status. FALSE only when it could not be run. */
static gboolean
run_tool (GepardVoiceDbCluster *cluster, const char *const *argv, int *status, char **output,
          GError **error)
{
  g_autoptr (GSubprocessLauncher) launcher = g_subprocess_launcher_new (
      G_SUBPROCESS_FLAGS_STDOUT_PIPE | G_SUBPROCESS_FLAGS_STDERR_MERGE);
  /* the tools must be able to stand in their working directory as the other user too */
  g_subprocess_launcher_set_cwd (launcher, cluster->dir);
  g_subprocess_launcher_setenv (launcher, "LC_ALL", "C", TRUE);
  /* The cluster is a program of its own: debugging aids meant for this process must not reach it
   * (an uninstrumented postgres with a sanitizer runtime preloaded hangs before it starts, and
   * malloc perturbation only slows it down). */
  const char *const not_inherited[] = {"LD_PRELOAD",    "ASAN_OPTIONS",    "LSAN_OPTIONS",
                                       "UBSAN_OPTIONS", "MALLOC_PERTURB_", "MALLOC_CHECK_"};
  for (guint i = 0; i < G_N_ELEMENTS (not_inherited); i++)
    g_subprocess_launcher_unsetenv (launcher, not_inherited[i]);
  Identity who = {cluster->uid, cluster->gid};
  if (cluster->as_other_user)
    g_subprocess_launcher_set_child_setup (launcher, become_user, &who, NULL);
  g_autoptr (GSubprocess) process = g_subprocess_launcher_spawnv (launcher, argv, error);
  if (process == NULL)
    return FALSE;
  g_autoptr (GBytes) out = NULL;
  if (!g_subprocess_communicate (process, NULL, NULL, &out, NULL, error))
    return FALSE;
  *status = g_subprocess_get_if_exited (process) ? g_subprocess_get_exit_status (process) : -1;
  if (output != NULL)
    {
      gsize size = 0;
      const char *data = out != NULL ? g_bytes_get_data (out, &size) : NULL;
      g_autofree char *text = g_utf8_make_valid (data != NULL ? data : "", (gssize)size);
      *output = tidy_message (text);
    }
  return TRUE;
}

static gboolean
run_tool_check (GepardVoiceDbCluster *cluster, const char *const *argv, GError **error)
{
  int status = 0;
  g_autofree char *output = NULL;
  g_autoptr (GError) local = NULL;
  if (!run_tool (cluster, argv, &status, &output, &local))
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER, "%s: %s", argv[0],
                   local->message);
      return FALSE;
    }
  if (status == 0)
    return TRUE;
  g_autofree char *log_tail = NULL;
  g_autofree char *log = NULL;
  if (g_file_get_contents (cluster->log_file, &log, NULL, NULL))
    {
      gsize len = strlen (log);
      log_tail = tidy_message (log + (len > 600 ? len - 600 : 0));
    }
  g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
               "%s failed (exit status %d): %s%s%s", argv[0], status, output,
               log_tail != NULL ? " — server log: " : "", log_tail != NULL ? log_tail : "");
  return FALSE;
}

static char *
tool_path (GepardVoiceDbCluster *cluster, const char *tool)
{
  return g_build_filename (cluster->bindir, tool, NULL);
}

/* a value for a configuration file: '…' with quotes doubled */
static char *
conf_quote (const char *value)
{
  g_auto (GStrv) parts = g_strsplit (value, "'", -1);
  g_autofree char *joined = g_strjoinv ("''", parts);
  return g_strdup_printf ("'%s'", joined);
}

/* a value for a conninfo string: '…' with quotes and backslashes escaped */
static char *
conninfo_quote (const char *value)
{
  GString *s = g_string_new ("'");
  for (const char *p = value; *p; p++)
    {
      if (*p == '\'' || *p == '\\')
        g_string_append_c (s, '\\');
      g_string_append_c (s, *p);
    }
  g_string_append_c (s, '\'');
  return g_string_free (s, FALSE);
}

/* The other user must be able to walk down to `dir`: initdb's own message for a parent it cannot
 * enter does not say which one. */
static gboolean
check_reachable (GepardVoiceDbCluster *cluster, GError **error)
{
  g_autofree char *path = g_path_get_dirname (cluster->dir);
  while (TRUE)
    {
      struct stat st;
      if (stat (path, &st) == 0)
        {
          gboolean enter = (st.st_mode & S_IXOTH)
                           || (st.st_uid == cluster->uid && (st.st_mode & S_IXUSR))
                           || (st.st_gid == cluster->gid && (st.st_mode & S_IXGRP));
          if (!enter)
            {
              g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
                           "PostgreSQL runs as the postgres user here (it refuses root), and that "
                           "user cannot enter %s (mode %03o): choose a directory it can reach",
                           path, (unsigned)(st.st_mode & 0777));
              return FALSE;
            }
        }
      if (g_str_equal (path, "/"))
        return TRUE;
      char *parent = g_path_get_dirname (path);
      g_free (path);
      path = parent;
    }
}

static gboolean
give_to_user (GepardVoiceDbCluster *cluster, const char *path, GError **error)
{
  if (!cluster->as_other_user || chown (path, cluster->uid, cluster->gid) == 0)
    return TRUE;
  int saved = errno;
  g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
               "cannot give %s to the postgres user: %s", path, g_strerror (saved));
  return FALSE;
}

/* Settings rewritten at every start, so a moved directory still gets its own socket path: no TCP
 * at all, the socket inside the data directory (no one else's cluster can collide with it). */
static gboolean
write_settings (GepardVoiceDbCluster *cluster, GError **error)
{
  g_autofree char *socket_dir = conf_quote (cluster->data_dir);
  g_autofree char *text = g_strdup_printf (
      "# Written by gepard-server at every start: a private cluster for development, reachable\n"
      "# only through the unix socket in this directory.\n"
      "listen_addresses = ''\n"
      "unix_socket_directories = %s\n"
      "unix_socket_permissions = 0700\n",
      socket_dir);
  g_autofree char *path = g_build_filename (cluster->data_dir, "gepard.conf", NULL);
  if (!g_file_set_contents (path, text, -1, error))
    return FALSE;
  return give_to_user (cluster, path, error);
}

static gboolean
cluster_is_running (GepardVoiceDbCluster *cluster, GError **error)
{
  g_autofree char *pg_ctl = tool_path (cluster, "pg_ctl");
  const char *argv[] = {pg_ctl, "status", "-D", cluster->data_dir, NULL};
  int status = 0;
  if (!run_tool (cluster, argv, &status, NULL, error))
    return FALSE;
  return status == 0;
}

gboolean
gepard_voice_db_cluster_start (GepardVoiceDbCluster *cluster, GError **error)
{
  g_return_val_if_fail (cluster != NULL, FALSE);
  if (cluster->running)
    return TRUE;
  if (!write_settings (cluster, error))
    return FALSE;
  g_autofree char *pg_ctl = tool_path (cluster, "pg_ctl");
  const char *argv[]
      = {pg_ctl, "start", "-w", "-s", "-D", cluster->data_dir, "-l", cluster->log_file, NULL};
  if (!run_tool_check (cluster, argv, error))
    return FALSE;
  cluster->running = TRUE;
  cluster->ours = TRUE;
  return TRUE;
}

gboolean
gepard_voice_db_cluster_stop (GepardVoiceDbCluster *cluster, GError **error)
{
  g_return_val_if_fail (cluster != NULL, FALSE);
  if (!cluster->running)
    return TRUE;
  g_autofree char *pg_ctl = tool_path (cluster, "pg_ctl");
  const char *argv[] = {pg_ctl, "stop", "-w", "-s", "-m", "fast", "-D", cluster->data_dir, NULL};
  if (!run_tool_check (cluster, argv, error))
    return FALSE;
  cluster->running = FALSE;
  return TRUE;
}

void
gepard_voice_db_cluster_free (GepardVoiceDbCluster *cluster)
{
  if (cluster == NULL)
    return;
  if (cluster->ours && cluster->running)
    {
      g_autoptr (GError) error = NULL;
      if (gepard_voice_db_cluster_stop (cluster, &error))
        g_message ("voice store: stopped the private PostgreSQL cluster in %s", cluster->data_dir);
      else
        g_message ("voice store: could not stop the private PostgreSQL cluster: %s",
                   error->message);
    }
  g_free (cluster->dir);
  g_free (cluster->data_dir);
  g_free (cluster->bindir);
  g_free (cluster->log_file);
  g_free (cluster->conninfo);
  g_free (cluster);
}

const char *
gepard_voice_db_cluster_get_conninfo (GepardVoiceDbCluster *cluster)
{
  return cluster->conninfo;
}

const char *
gepard_voice_db_cluster_get_data_dir (GepardVoiceDbCluster *cluster)
{
  return cluster->data_dir;
}

/* initdb, the first time: trust authentication is safe because nothing but this directory's
 * socket (mode 0700) reaches the cluster. */
static gboolean
init_cluster (GepardVoiceDbCluster *cluster, GError **error)
{
  g_autofree char *initdb = tool_path (cluster, "initdb");
  const char *argv[] = {initdb, "-D",   cluster->data_dir, "-U", "gepard", "-A", "trust",
                        "-E",   "UTF8", "--no-locale",     NULL};
  if (!run_tool_check (cluster, argv, error))
    return FALSE;
  g_autofree char *conf = g_build_filename (cluster->data_dir, "postgresql.conf", NULL);
  FILE *f = fopen (conf, "a");
  if (f == NULL || fputs ("\ninclude_if_exists = 'gepard.conf'\n", f) < 0 || fclose (f) != 0)
    {
      int saved = errno;
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
                   "cannot extend %s: %s", conf, g_strerror (saved));
      return FALSE;
    }
  return TRUE;
}

GepardVoiceDbCluster *
gepard_voice_db_start_private_cluster (const char *dir, GError **error)
{
  g_return_val_if_fail (dir != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  g_autofree char *bindir = gepard_voice_db_find_pg_bindir ();
  if (bindir == NULL)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
                   "no PostgreSQL server programs (initdb, pg_ctl) found: install postgresql, "
                   "set GEPARD_PG_BINDIR, or give a DATABASE_URL");
      return NULL;
    }

  g_autoptr (GepardVoiceDbCluster) cluster = g_new0 (GepardVoiceDbCluster, 1);
  cluster->bindir = g_steal_pointer (&bindir);
  g_autofree char *cwd = g_get_current_dir ();
  cluster->dir = g_canonicalize_filename (dir, cwd);
  cluster->data_dir = g_build_filename (cluster->dir, "data", NULL);
  cluster->log_file = g_build_filename (cluster->dir, "postgresql.log", NULL);

  /* a unix socket path has room for about 107 bytes */
  if (strlen (cluster->data_dir) + strlen ("/.s.PGSQL.5432") >= 107)
    {
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
                   "%s is too long a path for the cluster's unix socket; choose a shorter "
                   "directory",
                   cluster->data_dir);
      return NULL;
    }

  if (geteuid () == 0)
    {
      struct passwd *pw = getpwnam ("postgres");
      if (pw == NULL)
        {
          g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
                       "PostgreSQL refuses to run as root and there is no postgres user to run "
                       "it as");
          return NULL;
        }
      cluster->as_other_user = TRUE;
      cluster->uid = pw->pw_uid;
      cluster->gid = pw->pw_gid;
    }

  /* the directories above stay open to enter, for the user the cluster runs as */
  g_autofree char *parent = g_path_get_dirname (cluster->dir);
  if (g_mkdir_with_parents (parent, 0755) != 0 || g_mkdir_with_parents (cluster->dir, 0700) != 0)
    {
      int saved = errno;
      g_set_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLUSTER,
                   "cannot create %s: %s", cluster->dir, g_strerror (saved));
      return NULL;
    }
  if (cluster->as_other_user && !check_reachable (cluster, error))
    return NULL;
  if (!give_to_user (cluster, cluster->dir, error))
    return NULL;

  g_autofree char *version_file = g_build_filename (cluster->data_dir, "PG_VERSION", NULL);
  gboolean fresh = !g_file_test (version_file, G_FILE_TEST_EXISTS);
  if (fresh && !init_cluster (cluster, error))
    return NULL;

  if (!fresh && cluster_is_running (cluster, NULL))
    {
      /* left running by an earlier process, or shared with another one: use it, leave it */
      cluster->running = TRUE;
      cluster->ours = FALSE;
    }
  else if (!gepard_voice_db_cluster_start (cluster, error))
    return NULL;

  g_autofree char *host = conninfo_quote (cluster->data_dir);
  cluster->conninfo = g_strdup_printf ("host=%s dbname=postgres user=gepard", host);
  g_message ("voice store: DATABASE_URL is not set; %s a private PostgreSQL cluster in %s "
             "(unix socket only, no TCP)",
             cluster->ours ? "running" : "using the already running", cluster->data_dir);
  return g_steal_pointer (&cluster);
}
