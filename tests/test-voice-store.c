/* The voice store against a real PostgreSQL: a private cluster started in a temporary directory,
 * one database per test. Migrations apply once however many stores start together, voices
 * round-trip bit-exact and page the way Cartesia's SDKs page, stores share one database, the LRU
 * keeps the database out of repeated reads, an outage leaves cached voices working and heals by
 * itself, and bad input is refused with clear errors. The outage test stops the cluster, so it runs
 * last. */
#include "gepard-voice-db.h"

#include <glib/gstdio.h>
#include <libpq-fe.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROWS 8
#define HIDDEN 1024
#define MODEL "gepard-test-model"

static char *work_dir;
static GepardVoiceDbCluster *cluster;
static GError *cluster_error;
static PGconn *admin;

/* ---- set-up ---- */

static gboolean
require_cluster (void)
{
  if (cluster == NULL && cluster_error == NULL)
    {
      g_test_skip ("no PostgreSQL server programs (initdb, pg_ctl) are installed: apt-get install "
                   "postgresql, or set GEPARD_PG_BINDIR");
      return FALSE;
    }
  g_assert_no_error (cluster_error);
  return TRUE;
}

static PGconn *
admin_conn (void)
{
  if (admin == NULL || PQstatus (admin) != CONNECTION_OK)
    {
      g_clear_pointer (&admin, PQfinish);
      admin = PQconnectdb (gepard_voice_db_cluster_get_conninfo (cluster));
      g_assert_cmpint (PQstatus (admin), ==, CONNECTION_OK);
    }
  return admin;
}

static PGresult *
admin_exec (const char *sql, int n, const char *const *values)
{
  PGresult *res = PQexecParams (admin_conn (), sql, n, NULL, values, NULL, NULL, 0);
  ExecStatusType status = PQresultStatus (res);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)
    g_error ("%s: %s", sql, PQresultErrorMessage (res));
  return res;
}

/* A fresh database of the cluster; its conninfo (a repeated keyword: the last one counts). */
static char *
new_database (const char *name)
{
  g_autofree char *sql = g_strdup_printf ("CREATE DATABASE %s", name);
  PQclear (admin_exec (sql, 0, NULL));
  return g_strdup_printf ("%s dbname=%s", gepard_voice_db_cluster_get_conninfo (cluster), name);
}

static int
count_rows (const char *conninfo, const char *sql)
{
  PGconn *conn = PQconnectdb (conninfo);
  g_assert_cmpint (PQstatus (conn), ==, CONNECTION_OK);
  PGresult *res = PQexec (conn, sql);
  g_assert_cmpint (PQresultStatus (res), ==, PGRES_TUPLES_OK);
  int n = atoi (PQgetvalue (res, 0, 0));
  PQclear (res);
  PQfinish (conn);
  return n;
}

static GepardVoiceDb *
new_store (const char *conninfo, const char *model, int rows, int hidden, guint cache_size)
{
  GepardVoiceDbOptions options = {
      .conninfo = conninfo,
      .model = model,
      .rows = rows,
      .hidden = hidden,
      .cache_size = cache_size,
  };
  g_autoptr (GError) error = NULL;
  GepardVoiceDb *db = gepard_voice_db_new (&options, &error);
  g_assert_no_error (error);
  return db;
}

static GepardVoiceDbHealth
health (GepardVoiceDb *db)
{
  GepardVoiceDbHealth h;
  gepard_voice_db_get_health (db, &h);
  return h;
}

/* ---- the asynchronous calls, waited for on the default main context ---- */

static void
got_result (GObject *source, GAsyncResult *result, gpointer user_data)
{
  *(GAsyncResult **)user_data = g_object_ref (result);
}

static GAsyncResult *
wait_for (GAsyncResult **slot)
{
  while (*slot == NULL)
    g_main_context_iteration (NULL, TRUE);
  GAsyncResult *result = *slot;
  *slot = NULL;
  return result;
}

static gboolean
db_migrate (GepardVoiceDb *db, GError **error)
{
  GAsyncResult *slot = NULL;
  gepard_voice_db_migrate_async (db, NULL, got_result, &slot);
  g_autoptr (GAsyncResult) result = wait_for (&slot);
  return gepard_voice_db_migrate_finish (db, result, error);
}

static float *
make_prefix (guint32 seed, int rows, int hidden)
{
  float *prefix = g_new (float, rows *hidden);
  g_autoptr (GRand) rand = g_rand_new_with_seed (seed);
  for (int i = 0; i < rows * hidden; i++)
    prefix[i] = (float)g_rand_double_range (rand, -4, 4);
  return prefix;
}

static GepardVoiceRecord *
db_create_full (GepardVoiceDb *db, const GepardVoiceCreateParams *params, GError **error)
{
  GAsyncResult *slot = NULL;
  gepard_voice_db_create_async (db, params, NULL, got_result, &slot);
  g_autoptr (GAsyncResult) result = wait_for (&slot);
  return gepard_voice_db_create_finish (db, result, error);
}

static GepardVoiceRecord *
db_create (GepardVoiceDb *db, const char *name, guint32 seed, GError **error)
{
  g_autofree float *prefix = make_prefix (seed, ROWS, HIDDEN);
  GepardVoiceCreateParams params = {
      .name = name,
      .language = "en",
      .description = "a test voice",
      .prefix = prefix,
      .rows = ROWS,
      .hidden = HIDDEN,
  };
  return db_create_full (db, &params, error);
}

static GepardVoiceRecord *
db_get (GepardVoiceDb *db, const char *id, GError **error)
{
  GAsyncResult *slot = NULL;
  gepard_voice_db_get_async (db, id, NULL, got_result, &slot);
  g_autoptr (GAsyncResult) result = wait_for (&slot);
  return gepard_voice_db_get_finish (db, result, error);
}

static GepardVoicePage *
db_list (GepardVoiceDb *db, guint limit, const char *after, const char *before, const char *query,
         GError **error)
{
  GepardVoiceListParams params = {
      .limit = limit,
      .starting_after = after,
      .ending_before = before,
      .query = query,
  };
  GAsyncResult *slot = NULL;
  gepard_voice_db_list_async (db, &params, NULL, got_result, &slot);
  g_autoptr (GAsyncResult) result = wait_for (&slot);
  return gepard_voice_db_list_finish (db, result, error);
}

static gboolean
db_delete (GepardVoiceDb *db, const char *id, GError **error)
{
  GAsyncResult *slot = NULL;
  gepard_voice_db_delete_async (db, id, NULL, got_result, &slot);
  g_autoptr (GAsyncResult) result = wait_for (&slot);
  return gepard_voice_db_delete_finish (db, result, error);
}

static void
assert_prefix_equals (GBytes *stored, guint32 seed)
{
  g_autofree float *prefix = make_prefix (seed, ROWS, HIDDEN);
  g_assert_nonnull (stored);
  g_assert_cmpuint (g_bytes_get_size (stored), ==, ROWS * HIDDEN * 4);
  const guint8 *bytes = g_bytes_get_data (stored, NULL);
  for (int i = 0; i < ROWS * HIDDEN; i++)
    {
      guint32 bits;
      memcpy (&bits, &prefix[i], 4);
      guint32 le = GUINT32_TO_LE (bits);
      if (memcmp (bytes + 4 * i, &le, 4) != 0)
        g_error ("prefix value %d differs", i);
    }
}

/* the sql/NNN_*.sql files: one schema_migrations row each */
static int
count_migration_files (void)
{
  g_autofree char *dir = g_build_filename (g_getenv ("GEPARD_SOURCE_DIR"), "sql", NULL);
  g_autoptr (GDir) d = g_dir_open (dir, 0, NULL);
  g_assert_nonnull (d);
  int n = 0;
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    n += g_str_has_suffix (name, ".sql") && g_ascii_isdigit (name[0]);
  g_assert_cmpint (n, >, 0);
  return n;
}

/* ---- tests ---- */

static void
test_migrate_twice (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("migrate_twice");
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceDb) db = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  GepardVoiceDbHealth h = health (db);
  g_assert_cmpint (h.state, ==, GEPARD_VOICE_DB_STATE_UNKNOWN);
  gepard_voice_db_health_clear (&h);

  g_assert_true (db_migrate (db, &error));
  g_assert_no_error (error);
  int files = count_migration_files ();
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM schema_migrations"), ==, files);
  g_assert_true (db_migrate (db, &error));
  g_assert_no_error (error);
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM schema_migrations"), ==, files);

  /* a second process on the same database: nothing left to apply */
  g_autoptr (GepardVoiceDb) other = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  g_assert_true (db_migrate (other, &error));
  g_assert_no_error (error);
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM schema_migrations"), ==, files);
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM voices"), ==, 0);

  h = health (db);
  g_assert_cmpint (h.state, ==, GEPARD_VOICE_DB_STATE_UP);
  g_assert_null (h.last_error);
  gepard_voice_db_health_clear (&h);
}

static void
test_migrate_concurrently (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("migrate_concurrently");
  enum
  {
    N = 4
  };
  GepardVoiceDb *stores[N];
  GAsyncResult *slots[N] = {NULL};
  for (int i = 0; i < N; i++)
    stores[i] = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  /* all queued before any runs: the workers race for the advisory lock */
  for (int i = 0; i < N; i++)
    gepard_voice_db_migrate_async (stores[i], NULL, got_result, &slots[i]);
  for (int i = 0; i < N; i++)
    {
      g_autoptr (GAsyncResult) result = wait_for (&slots[i]);
      g_autoptr (GError) error = NULL;
      g_assert_true (gepard_voice_db_migrate_finish (stores[i], result, &error));
      g_assert_no_error (error);
    }
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM schema_migrations"), ==,
                   count_migration_files ());
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM pg_tables WHERE tablename = "
                                         "'voices'"),
                   ==, 1);
  for (int i = 0; i < N; i++)
    gepard_voice_db_free (stores[i]);
}

static void
test_create_get_delete (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("create_get_delete");
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceDb) db = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  g_autoptr (GDateTime) before = g_date_time_new_now_utc ();

  /* no explicit migrate: the first call brings the schema up */
  g_autofree float *prefix = make_prefix (1, ROWS, HIDDEN);
  GepardVoiceCreateParams params = {
      .name = "Ada",
      .language = "en",
      .description = "Calm, low voice — «quoted» 'text'",
      .accent = "british",
      .prefix = prefix,
      .rows = ROWS,
      .hidden = HIDDEN,
  };
  g_autoptr (GepardVoiceRecord) created = db_create_full (db, &params, &error);
  g_assert_no_error (error);
  g_assert_true (g_uuid_string_is_valid (created->id));
  g_assert_cmpstr (created->name, ==, "Ada");
  g_assert_cmpstr (created->language, ==, "en");
  g_assert_cmpstr (created->description, ==, params.description);
  g_assert_cmpstr (created->accent, ==, "british");
  g_assert_null (created->gender);
  g_assert_cmpstr (created->model, ==, MODEL);
  g_assert_cmpint (created->rows, ==, ROWS);
  g_assert_cmpint (created->hidden, ==, HIDDEN);
  g_assert_nonnull (created->created_at);
  g_assert_cmpint (g_date_time_difference (created->created_at, before), >,
                   -5 * G_TIME_SPAN_SECOND);
  g_assert_cmpint (g_date_time_difference (created->created_at, before), <,
                   60 * G_TIME_SPAN_SECOND);
  assert_prefix_equals (created->prefix, 1);

  /* read back through a store that never saw it: from the database, bit-exact */
  g_autoptr (GepardVoiceDb) reader = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  g_autoptr (GepardVoiceRecord) got = db_get (reader, created->id, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (got->id, ==, created->id);
  g_assert_cmpstr (got->name, ==, "Ada");
  g_assert_cmpstr (got->description, ==, params.description);
  g_assert_cmpstr (got->accent, ==, "british");
  g_assert_true (g_date_time_equal (got->created_at, created->created_at));
  assert_prefix_equals (got->prefix, 1);
  GepardVoiceDbHealth h = health (reader);
  g_assert_cmpuint (h.voice_reads, ==, 1);
  gepard_voice_db_health_clear (&h);

  /* ids in capitals name the same voice */
  g_autofree char *upper = g_ascii_strup (created->id, -1);
  g_autoptr (GepardVoiceRecord) again = db_get (reader, upper, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (again->id, ==, created->id);

  g_autoptr (GepardVoicePage) page = db_list (db, 10, NULL, NULL, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (page->voices->len, ==, 1);
  g_assert_false (page->has_more);
  GepardVoiceRecord *listed = page->voices->pdata[0];
  g_assert_cmpstr (listed->id, ==, created->id);
  g_assert_cmpstr (listed->name, ==, "Ada");
  g_assert_null (listed->prefix);

  g_assert_true (db_delete (db, created->id, &error));
  g_assert_no_error (error);
  g_assert_null (gepard_voice_db_lookup_cached (db, created->id));
  g_autoptr (GepardVoiceRecord) gone = db_get (db, created->id, &error);
  g_assert_null (gone);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
  g_clear_error (&error);
  g_assert_false (db_delete (db, created->id, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
  g_clear_error (&error);
  g_assert_cmpint (count_rows (conninfo, "SELECT count(*) FROM voices"), ==, 0);
}

static void
test_paging (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("paging");
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceDb) db = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  enum
  {
    N = 7
  };
  char *ids[N];
  for (int i = 0; i < N; i++)
    {
      g_autofree char *name = g_strdup_printf ("voice_%d", i);
      g_autoptr (GepardVoiceRecord) record = db_create (db, name, 10 + i, &error);
      g_assert_no_error (error);
      ids[i] = g_strdup (record->id);
    }

  /* as the SDKs do: starting_after=<last id> until a page comes back empty */
  g_autoptr (GPtrArray) seen = g_ptr_array_new_with_free_func (g_free);
  g_autofree char *cursor = NULL;
  guint pages = 0;
  for (;;)
    {
      g_autoptr (GepardVoicePage) page = db_list (db, 3, cursor, NULL, NULL, &error);
      g_assert_no_error (error);
      pages++;
      g_assert_cmpuint (pages, <=, 4);
      if (page->voices->len == 0)
        {
          g_assert_false (page->has_more);
          break;
        }
      for (guint i = 0; i < page->voices->len; i++)
        g_ptr_array_add (seen, g_strdup (((GepardVoiceRecord *)page->voices->pdata[i])->id));
      /* has_more is right on every page: 3, 3 and 1 voices */
      g_assert_cmpint (page->has_more, ==, seen->len < N);
      g_free (cursor);
      cursor = g_strdup (((GepardVoiceRecord *)page->voices->pdata[page->voices->len - 1])->id);
    }
  g_assert_cmpuint (pages, ==, 4);
  /* every voice once, newest first */
  g_assert_cmpuint (seen->len, ==, N);
  for (int i = 0; i < N; i++)
    g_assert_cmpstr (seen->pdata[i], ==, ids[N - 1 - i]);

  /* and back: the page before the last one is the middle page, in the same order */
  g_autoptr (GepardVoicePage) back = db_list (db, 3, NULL, seen->pdata[6], NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (back->voices->len, ==, 3);
  g_assert_true (back->has_more);
  for (guint i = 0; i < 3; i++)
    g_assert_cmpstr (((GepardVoiceRecord *)back->voices->pdata[i])->id, ==, seen->pdata[3 + i]);
  g_autoptr (GepardVoicePage) first = db_list (db, 3, NULL, seen->pdata[2], NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (first->voices->len, ==, 2);
  g_assert_false (first->has_more);
  g_autoptr (GepardVoicePage) none = db_list (db, 3, NULL, seen->pdata[0], NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (none->voices->len, ==, 0);
  g_assert_false (none->has_more);

  /* the name filter takes the query literally */
  g_autoptr (GepardVoicePage) one = db_list (db, 100, NULL, NULL, "VOICE_3", &error);
  g_assert_no_error (error);
  g_assert_cmpuint (one->voices->len, ==, 1);
  g_assert_cmpstr (((GepardVoiceRecord *)one->voices->pdata[0])->id, ==, ids[3]);
  g_autoptr (GepardVoicePage) wildcard = db_list (db, 100, NULL, NULL, "%", &error);
  g_assert_no_error (error);
  g_assert_cmpuint (wildcard->voices->len, ==, 0);
  g_autoptr (GepardVoicePage) underscore = db_list (db, 100, NULL, NULL, "_", &error);
  g_assert_no_error (error);
  g_assert_cmpuint (underscore->voices->len, ==, N);

  /* another model's server lists none of them */
  g_autoptr (GepardVoiceDb) other = new_store (conninfo, "another-model", ROWS, HIDDEN, 0);
  g_autoptr (GepardVoicePage) other_page = db_list (other, 100, NULL, NULL, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (other_page->voices->len, ==, 0);

  for (int i = 0; i < N; i++)
    g_free (ids[i]);
}

static void
test_two_stores (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("two_stores");
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceDb) a = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  g_autoptr (GepardVoiceDb) b = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);

  g_autoptr (GepardVoiceRecord) from_a = db_create (a, "from a", 21, &error);
  g_assert_no_error (error);
  g_autoptr (GepardVoiceRecord) from_b = db_create (b, "from b", 22, &error);
  g_assert_no_error (error);

  g_autoptr (GepardVoiceRecord) b_reads_a = db_get (b, from_a->id, &error);
  g_assert_no_error (error);
  assert_prefix_equals (b_reads_a->prefix, 21);
  g_autoptr (GepardVoiceRecord) a_reads_b = db_get (a, from_b->id, &error);
  g_assert_no_error (error);
  assert_prefix_equals (a_reads_b->prefix, 22);

  g_autoptr (GepardVoicePage) page_a = db_list (a, 10, NULL, NULL, NULL, &error);
  g_assert_no_error (error);
  g_autoptr (GepardVoicePage) page_b = db_list (b, 10, NULL, NULL, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (page_a->voices->len, ==, 2);
  g_assert_cmpuint (page_b->voices->len, ==, 2);
  for (guint i = 0; i < 2; i++)
    g_assert_cmpstr (((GepardVoiceRecord *)page_a->voices->pdata[i])->id, ==,
                     ((GepardVoiceRecord *)page_b->voices->pdata[i])->id);

  /* one deletes what the other created; the list of both shows it gone */
  g_assert_true (db_delete (b, from_a->id, &error));
  g_assert_no_error (error);
  g_autoptr (GepardVoicePage) after_delete = db_list (a, 10, NULL, NULL, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (after_delete->voices->len, ==, 1);
  g_assert_cmpstr (((GepardVoiceRecord *)after_delete->voices->pdata[0])->id, ==, from_b->id);
}

static void
test_cache (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("cache");
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceDb) writer = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  char *ids[3];
  for (int i = 0; i < 3; i++)
    {
      g_autoptr (GepardVoiceRecord) record = db_create (writer, "cached", 30 + i, &error);
      g_assert_no_error (error);
      ids[i] = g_strdup (record->id);
    }

  g_autoptr (GepardVoiceDb) reader = new_store (conninfo, MODEL, ROWS, HIDDEN, 2);
  g_assert_null (gepard_voice_db_lookup_cached (reader, ids[0]));
  g_autoptr (GepardVoiceRecord) first = db_get (reader, ids[0], &error);
  g_assert_no_error (error);
  GepardVoiceDbHealth h = health (reader);
  g_assert_cmpuint (h.voice_reads, ==, 1);
  g_assert_cmpuint (h.cache_misses, ==, 1);
  guint64 statements = h.statements;
  gepard_voice_db_health_clear (&h);

  /* served from the cache: no statement at all */
  for (int i = 0; i < 5; i++)
    {
      g_autoptr (GepardVoiceRecord) again = db_get (reader, ids[0], &error);
      g_assert_no_error (error);
      g_assert_true (again == first);
    }
  h = health (reader);
  g_assert_cmpuint (h.voice_reads, ==, 1);
  g_assert_cmpuint (h.cache_hits, ==, 5);
  g_assert_cmpuint (h.statements, ==, statements);
  g_assert_cmpuint (h.cached_voices, ==, 1);
  gepard_voice_db_health_clear (&h);

  /* the proof from the database's side: deleted there behind the reader's back, the reader still
   * serves it, so it did not ask */
  const char *values[1] = {ids[0]};
  g_autofree char *admin_conninfo = g_strdup (conninfo);
  PGconn *conn = PQconnectdb (admin_conninfo);
  PGresult *res = PQexecParams (conn, "DELETE FROM voices WHERE id = $1::uuid", 1, NULL, values,
                                NULL, NULL, 0);
  g_assert_cmpint (PQresultStatus (res), ==, PGRES_COMMAND_OK);
  g_assert_cmpstr (PQcmdTuples (res), ==, "1");
  PQclear (res);
  PQfinish (conn);
  g_autoptr (GepardVoiceRecord) stale = db_get (reader, ids[0], &error);
  g_assert_no_error (error);
  assert_prefix_equals (stale->prefix, 30);

  /* least recently used goes first: two more voices push the first one out */
  g_autoptr (GepardVoiceRecord) second = db_get (reader, ids[1], &error);
  g_assert_no_error (error);
  g_autoptr (GepardVoiceRecord) third = db_get (reader, ids[2], &error);
  g_assert_no_error (error);
  g_assert_null (gepard_voice_db_lookup_cached (reader, ids[0]));
  g_autoptr (GepardVoiceRecord) cached = gepard_voice_db_lookup_cached (reader, ids[1]);
  g_assert_nonnull (cached);
  g_autoptr (GepardVoiceRecord) evicted = db_get (reader, ids[0], &error);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
  g_clear_error (&error);
  h = health (reader);
  g_assert_cmpuint (h.voice_reads, ==, 4);
  g_assert_cmpuint (h.cached_voices, ==, 2);
  gepard_voice_db_health_clear (&h);

  /* many requests for one voice at once: one read */
  g_autoptr (GepardVoiceDb) burst = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  enum
  {
    N = 8
  };
  GAsyncResult *slots[N] = {NULL};
  for (int i = 0; i < N; i++)
    gepard_voice_db_get_async (burst, ids[2], NULL, got_result, &slots[i]);
  for (int i = 0; i < N; i++)
    {
      g_autoptr (GAsyncResult) result = wait_for (&slots[i]);
      g_autoptr (GepardVoiceRecord) record = gepard_voice_db_get_finish (burst, result, &error);
      g_assert_no_error (error);
      assert_prefix_equals (record->prefix, 32);
    }
  h = health (burst);
  g_assert_cmpuint (h.voice_reads, ==, 1);
  gepard_voice_db_health_clear (&h);

  for (int i = 0; i < 3; i++)
    g_free (ids[i]);
}

static void
assert_create_refused (GepardVoiceDb *db, const GepardVoiceCreateParams *params,
                       const char *message_part)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceRecord) record = db_create_full (db, params, &error);
  g_assert_null (record);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID);
  if (strstr (error->message, message_part) == NULL)
    g_error ("“%s” does not mention “%s”", error->message, message_part);
}

static void
assert_list_refused (GepardVoiceDb *db, guint limit, const char *after, const char *before)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoicePage) page = db_list (db, limit, after, before, NULL, &error);
  g_assert_null (page);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID);
}

static void
test_bad_input (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("bad_input");
  g_autoptr (GError) error = NULL;

  /* options */
  GepardVoiceDbOptions bad_conninfo
      = {.conninfo = "no equals sign", .model = MODEL, .rows = 1, .hidden = 1};
  g_assert_null (gepard_voice_db_new (&bad_conninfo, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID);
  g_clear_error (&error);
  GepardVoiceDbOptions bad_keyword
      = {.conninfo = "colour=blue", .model = MODEL, .rows = 1, .hidden = 1};
  g_assert_null (gepard_voice_db_new (&bad_keyword, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID);
  g_clear_error (&error);
  GepardVoiceDbOptions no_shape = {.conninfo = conninfo, .model = MODEL};
  g_assert_null (gepard_voice_db_new (&no_shape, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID);
  g_clear_error (&error);
  GepardVoiceDbOptions no_model = {.conninfo = conninfo, .rows = 1, .hidden = 1};
  g_assert_null (gepard_voice_db_new (&no_model, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_INVALID);
  g_clear_error (&error);

  g_autoptr (GepardVoiceDb) db = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  g_assert_true (db_migrate (db, &error));
  g_assert_no_error (error);
  GepardVoiceDbHealth h = health (db);
  guint64 statements = h.statements;
  gepard_voice_db_health_clear (&h);

  /* create */
  g_autofree float *prefix = make_prefix (40, ROWS, HIDDEN);
  GepardVoiceCreateParams good
      = {.name = "good", .language = "en", .prefix = prefix, .rows = ROWS, .hidden = HIDDEN};
  GepardVoiceCreateParams p = good;
  p.rows = ROWS - 1;
  assert_create_refused (db, &p, "this model's prefixes are 8 × 1024");
  p = good;
  p.hidden = HIDDEN * 2;
  assert_create_refused (db, &p, "8 × 2048");
  p = good;
  p.prefix = NULL;
  assert_create_refused (db, &p, "prefix");
  p = good;
  p.name = "";
  assert_create_refused (db, &p, "name is required");
  p = good;
  p.name = NULL;
  assert_create_refused (db, &p, "name is required");
  p = good;
  p.language = NULL;
  assert_create_refused (db, &p, "language is required");
  g_autofree char *long_name = g_strnfill (201, 'x');
  p = good;
  p.name = long_name;
  assert_create_refused (db, &p, "longer than 200");
  p = good;
  p.name = "bad \xff utf-8";
  assert_create_refused (db, &p, "UTF-8");
  g_autofree float *nan_prefix = make_prefix (41, ROWS, HIDDEN);
  nan_prefix[3 * HIDDEN + 5] = NAN;
  p = good;
  p.prefix = nan_prefix;
  assert_create_refused (db, &p, "row 3, column 5");
  nan_prefix[3 * HIDDEN + 5] = INFINITY;
  assert_create_refused (db, &p, "not finite");
  /* a name with quotes and SQL in it is only a name */
  p = good;
  p.name = "Robert'); DROP TABLE voices; --";
  g_autoptr (GepardVoiceRecord) bobby = db_create_full (db, &p, &error);
  g_assert_no_error (error);
  g_assert_cmpstr (bobby->name, ==, p.name);

  /* get and delete: malformed ids never reach the database */
  h = health (db);
  statements = h.statements;
  gepard_voice_db_health_clear (&h);
  const char *malformed[] = {"",
                             "default",
                             "not-a-uuid",
                             "6f1c2c1e-0000-4000-8000-00000000000",
                             "6f1c2c1e-0000-4000-8000-0000000000000",
                             "'; DROP TABLE voices; --",
                             "6f1c2c1e-0000-4000-8000-00000000000\xff",
                             NULL};
  for (int i = 0; i < (int)G_N_ELEMENTS (malformed); i++)
    {
      g_autoptr (GepardVoiceRecord) record = db_get (db, malformed[i], &error);
      g_assert_null (record);
      g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
      g_assert_nonnull (strstr (error->message, "a voice id is a UUID"));
      g_clear_error (&error);
      g_assert_false (db_delete (db, malformed[i], &error));
      g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
      g_clear_error (&error);
      g_assert_null (gepard_voice_db_lookup_cached (db, malformed[i]));
    }
  h = health (db);
  g_assert_cmpuint (h.statements, ==, statements);
  gepard_voice_db_health_clear (&h);

  const char *unknown = "6f1c2c1e-0000-4000-8000-000000000000";
  g_autoptr (GepardVoiceRecord) nobody = db_get (db, unknown, &error);
  g_assert_null (nobody);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
  g_clear_error (&error);
  g_assert_false (db_delete (db, unknown, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND);
  g_clear_error (&error);

  /* list */
  assert_list_refused (db, 0, NULL, NULL);
  assert_list_refused (db, 101, NULL, NULL);
  assert_list_refused (db, 10, bobby->id, bobby->id);
  assert_list_refused (db, 10, "not-a-uuid", NULL);
  assert_list_refused (db, 10, NULL, "x");
  assert_list_refused (db, 10, unknown, NULL);
  assert_list_refused (db, 10, NULL, unknown);

  /* a voice of another model, or of another prefix shape, is refused by name */
  g_autoptr (GepardVoiceDb) other = new_store (conninfo, "another-model", ROWS, HIDDEN, 0);
  g_autoptr (GepardVoiceRecord) mismatch = db_get (other, bobby->id, &error);
  g_assert_null (mismatch);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_MODEL_MISMATCH);
  g_assert_nonnull (strstr (error->message, MODEL));
  g_clear_error (&error);
  g_autoptr (GepardVoiceDb) narrow = new_store (conninfo, MODEL, ROWS, HIDDEN / 2, 0);
  g_autoptr (GepardVoiceRecord) narrow_voice = db_get (narrow, bobby->id, &error);
  g_assert_null (narrow_voice);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_MODEL_MISMATCH);
  g_clear_error (&error);

  /* nothing listens there: DOWN, with the reason, and no hang freeing the store */
  g_autofree char *nowhere = g_strdup_printf ("host=%s/nowhere dbname=postgres", work_dir);
  g_autoptr (GepardVoiceDb) absent = new_store (nowhere, MODEL, ROWS, HIDDEN, 0);
  g_assert_false (db_migrate (absent, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  g_autoptr (GepardVoiceRecord) absent_voice = db_get (absent, unknown, &error);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  h = health (absent);
  g_assert_cmpint (h.state, ==, GEPARD_VOICE_DB_STATE_DOWN);
  g_assert_nonnull (h.last_error);
  g_assert_cmpuint (h.consecutive_failures, >=, 1);
  gepard_voice_db_health_clear (&h);
}

static void
test_free_with_calls_queued (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("free_queued");
  GepardVoiceDb *db = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  enum
  {
    N = 6
  };
  GAsyncResult *slots[N] = {NULL};
  for (int i = 0; i < N; i++)
    {
      g_autofree char *id = g_uuid_string_random ();
      gepard_voice_db_get_async (db, id, NULL, got_result, &slots[i]);
    }
  gepard_voice_db_free (db);
  /* every call still completes, after the store is gone */
  for (int i = 0; i < N; i++)
    {
      g_autoptr (GAsyncResult) result = wait_for (&slots[i]);
      g_autoptr (GError) error = NULL;
      g_assert_null (g_task_propagate_pointer (G_TASK (result), &error));
      g_assert_true (
          g_error_matches (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_NOT_FOUND)
          || g_error_matches (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_CLOSED));
    }
}

static void
test_outage (void)
{
  if (!require_cluster ())
    return;
  g_autofree char *conninfo = new_database ("outage");
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceDb) db = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
  g_autoptr (GepardVoiceRecord) cached = db_create (db, "cached", 50, &error);
  g_assert_no_error (error);
  g_autofree char *uncached = NULL;
  {
    g_autoptr (GepardVoiceDb) other = new_store (conninfo, MODEL, ROWS, HIDDEN, 0);
    g_autoptr (GepardVoiceRecord) record = db_create (other, "uncached", 51, &error);
    g_assert_no_error (error);
    uncached = g_strdup (record->id);
  }

  g_assert_true (gepard_voice_db_cluster_stop (cluster, &error));
  g_assert_no_error (error);

  /* cached voices keep working */
  g_autoptr (GepardVoiceRecord) still = db_get (db, cached->id, &error);
  g_assert_no_error (error);
  assert_prefix_equals (still->prefix, 50);

  /* the rest fails with DOWN: the first call finds the connection dead, tries a new one, gives
   * up; the next ones fail at once */
  g_autoptr (GepardVoiceRecord) missing = db_get (db, uncached, &error);
  g_assert_null (missing);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  gint64 start = g_get_monotonic_time ();
  g_autoptr (GepardVoiceRecord) missing_again = db_get (db, uncached, &error);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  g_assert_cmpint (g_get_monotonic_time () - start, <, G_TIME_SPAN_SECOND);
  g_autoptr (GepardVoiceRecord) created = db_create (db, "while down", 52, &error);
  g_assert_null (created);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  g_autoptr (GepardVoicePage) page = db_list (db, 10, NULL, NULL, NULL, &error);
  g_assert_null (page);
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  g_assert_false (db_delete (db, cached->id, &error));
  g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
  g_clear_error (&error);
  /* a failed delete leaves the voice usable */
  g_autoptr (GepardVoiceRecord) kept = gepard_voice_db_lookup_cached (db, cached->id);
  g_assert_nonnull (kept);

  GepardVoiceDbHealth h = health (db);
  g_assert_cmpint (h.state, ==, GEPARD_VOICE_DB_STATE_DOWN);
  g_assert_nonnull (h.last_error);
  g_test_message ("while down: %s", h.last_error);
  gepard_voice_db_health_clear (&h);

  /* back: the same store recovers by itself */
  g_assert_true (gepard_voice_db_cluster_start (cluster, &error));
  g_assert_no_error (error);
  g_autoptr (GepardVoiceRecord) recovered = NULL;
  gint64 deadline = g_get_monotonic_time () + 30 * G_TIME_SPAN_SECOND;
  while (recovered == NULL)
    {
      recovered = db_get (db, uncached, &error);
      if (recovered != NULL)
        break;
      g_assert_error (error, GEPARD_VOICE_DB_ERROR, GEPARD_VOICE_DB_ERROR_DOWN);
      g_clear_error (&error);
      g_assert_cmpint (g_get_monotonic_time (), <, deadline);
      g_usleep (100 * 1000);
    }
  g_test_message ("recovered after %.1f s",
                  (double)(g_get_monotonic_time () - start) / G_TIME_SPAN_SECOND);
  assert_prefix_equals (recovered->prefix, 51);
  h = health (db);
  g_assert_cmpint (h.state, ==, GEPARD_VOICE_DB_STATE_UP);
  g_assert_cmpuint (h.reconnects, >=, 1);
  g_assert_cmpuint (h.consecutive_failures, ==, 0);
  gepard_voice_db_health_clear (&h);

  g_autoptr (GepardVoiceRecord) after = db_create (db, "after the outage", 53, &error);
  g_assert_no_error (error);
  g_autoptr (GepardVoicePage) all = db_list (db, 10, NULL, NULL, NULL, &error);
  g_assert_no_error (error);
  g_assert_cmpuint (all->voices->len, ==, 3);
  /* its connection died with the cluster */
  g_clear_pointer (&admin, PQfinish);
}

static void
remove_tree (const char *path)
{
  GDir *dir = g_dir_open (path, 0, NULL);
  if (dir != NULL)
    {
      const char *name;
      while ((name = g_dir_read_name (dir)) != NULL)
        {
          g_autofree char *child = g_build_filename (path, name, NULL);
          if (g_file_test (child, G_FILE_TEST_IS_DIR)
              && !g_file_test (child, G_FILE_TEST_IS_SYMLINK))
            remove_tree (child);
          else
            g_remove (child);
        }
      g_dir_close (dir);
    }
  g_remove (path);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);

  g_autofree char *bindir = gepard_voice_db_find_pg_bindir ();
  if (bindir != NULL)
    {
      /* short: the socket path must fit in a sockaddr_un */
      work_dir = g_dir_make_tmp ("gvs-XXXXXX", &cluster_error);
      /* as root the cluster runs as postgres, which must be able to enter this directory */
      if (work_dir != NULL && geteuid () == 0)
        g_chmod (work_dir, 0711);
      if (work_dir != NULL)
        {
          g_autofree char *dir = g_build_filename (work_dir, "pg", NULL);
          cluster = gepard_voice_db_start_private_cluster (dir, &cluster_error);
        }
    }

  g_test_add_func ("/voice-store/migrate-twice", test_migrate_twice);
  g_test_add_func ("/voice-store/migrate-concurrently", test_migrate_concurrently);
  g_test_add_func ("/voice-store/create-get-delete", test_create_get_delete);
  g_test_add_func ("/voice-store/paging", test_paging);
  g_test_add_func ("/voice-store/two-stores", test_two_stores);
  g_test_add_func ("/voice-store/cache", test_cache);
  g_test_add_func ("/voice-store/bad-input", test_bad_input);
  g_test_add_func ("/voice-store/free-with-calls-queued", test_free_with_calls_queued);
  /* stops and restarts the cluster: last */
  g_test_add_func ("/voice-store/outage", test_outage);
  int status = g_test_run ();

  g_clear_pointer (&admin, PQfinish);
  g_clear_pointer (&cluster, gepard_voice_db_cluster_free);
  if (work_dir != NULL)
    remove_tree (work_dir);
  g_free (work_dir);
  g_clear_error (&cluster_error);
  return status;
}
