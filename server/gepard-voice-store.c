/* gepard-voice-store.c: the voice store interface, its local implementation and the one over a
 * PostgreSQL voice database. */
#include "gepard-voice-store.h"

#include "gepard-api-error.h"
#include "gepard-protocol.h"
#include "gepard-voice.h"

#include <gio/gio.h>
#include <string.h>

/* ---- voices and pages ---- */

GepardVoiceInfo *
gepard_voice_info_new (const char *id, const char *name, const char *description,
                       const char *language, GDateTime *created, gboolean is_owner)
{
  GepardVoiceInfo *info = g_new0 (GepardVoiceInfo, 1);
  info->id = g_strdup (id);
  info->name = g_strdup (name);
  info->description = g_strdup (description != NULL ? description : "");
  info->language = g_strdup (language);
  info->created_at = g_date_time_format_iso8601 (created);
  info->is_owner = is_owner;
  return info;
}

static GepardVoiceInfo *
voice_info_copy (const GepardVoiceInfo *from)
{
  GepardVoiceInfo *info = g_new0 (GepardVoiceInfo, 1);
  info->id = g_strdup (from->id);
  info->name = g_strdup (from->name);
  info->description = g_strdup (from->description);
  info->language = g_strdup (from->language);
  info->created_at = g_strdup (from->created_at);
  info->is_owner = from->is_owner;
  return info;
}

void
gepard_voice_info_free (GepardVoiceInfo *info)
{
  if (info == NULL)
    return;
  g_free (info->id);
  g_free (info->name);
  g_free (info->description);
  g_free (info->language);
  g_free (info->created_at);
  g_free (info);
}

static GepardVoiceInfoPage *
page_new (void)
{
  GepardVoiceInfoPage *page = g_new0 (GepardVoiceInfoPage, 1);
  page->voices = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_voice_info_free);
  return page;
}

void
gepard_voice_info_page_free (GepardVoiceInfoPage *page)
{
  if (page == NULL)
    return;
  g_ptr_array_unref (page->voices);
  g_free (page);
}

/* ---- the interface ---- */

static GError *
voice_not_found (const char *id)
{
  g_autofree char *shown = g_utf8_make_valid (id, MIN (strlen (id), 128));
  return g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_VOICE_NOT_FOUND, "Voice \"%s\" not found",
                      shown);
}

GError *
gepard_voice_store_api_error (GError *error, const char *id)
{
  if (error->domain == GEPARD_API_ERROR)
    return error;
  GepardApiError code = GEPARD_API_ERROR_INTERNAL;
  if (error->domain == GEPARD_VOICE_DB_ERROR)
    switch ((GepardVoiceDbError)error->code)
      {
      case GEPARD_VOICE_DB_ERROR_NOT_FOUND:
        {
          GError *api = voice_not_found (id != NULL ? id : "");
          g_error_free (error);
          return api;
        }
      case GEPARD_VOICE_DB_ERROR_INVALID:
      case GEPARD_VOICE_DB_ERROR_MODEL_MISMATCH:
        code = GEPARD_API_ERROR_BAD_REQUEST;
        break;
      case GEPARD_VOICE_DB_ERROR_DOWN:
      case GEPARD_VOICE_DB_ERROR_CLOSED:
        code = GEPARD_API_ERROR_UNAVAILABLE;
        break;
      case GEPARD_VOICE_DB_ERROR_FAILED:
      case GEPARD_VOICE_DB_ERROR_CLUSTER:
      default:
        code = GEPARD_API_ERROR_INTERNAL;
        break;
      }
  if (code == GEPARD_API_ERROR_INTERNAL)
    g_warning ("voice store: %s", error->message);
  GError *api = g_error_new_literal (GEPARD_API_ERROR, code,
                                     code == GEPARD_API_ERROR_UNAVAILABLE
                                         ? "The voice store is unavailable right now; try again"
                                     : code == GEPARD_API_ERROR_INTERNAL ? "The voice store failed"
                                                                         : error->message);
  g_error_free (error);
  return api;
}

GepardVoice *
gepard_voice_store_lookup (GepardVoiceStore *store, const char *id)
{
  return gepard_voice_id_is_valid (id) ? store->funcs->lookup (store, id) : NULL;
}

static GTask *
new_task (GepardVoiceStore *store, gpointer tag, GCancellable *cancellable,
          GAsyncReadyCallback callback, gpointer user_data)
{
  GTask *task = g_task_new (NULL, cancellable, callback, user_data);
  g_task_set_source_tag (task, tag);
  return task;
}

void
gepard_voice_store_get_async (GepardVoiceStore *store, const char *id, GCancellable *cancellable,
                              GAsyncReadyCallback callback, gpointer user_data)
{
  GTask *task = new_task (store, gepard_voice_store_get_async, cancellable, callback, user_data);
  if (!gepard_voice_id_is_valid (id))
    {
      g_task_return_error (task, voice_not_found (id));
      g_object_unref (task);
    }
  else
    store->funcs->get (store, id, task);
}

GepardVoice *
gepard_voice_store_get_finish (GAsyncResult *result, GError **error)
{
  return g_task_propagate_pointer (G_TASK (result), error);
}

void
gepard_voice_store_get_info_async (GepardVoiceStore *store, const char *id,
                                   GCancellable *cancellable, GAsyncReadyCallback callback,
                                   gpointer user_data)
{
  GTask *task
      = new_task (store, gepard_voice_store_get_info_async, cancellable, callback, user_data);
  if (!gepard_voice_id_is_valid (id))
    {
      g_task_return_error (task, voice_not_found (id));
      g_object_unref (task);
    }
  else
    store->funcs->get_info (store, id, task);
}

GepardVoiceInfo *
gepard_voice_store_get_info_finish (GAsyncResult *result, GError **error)
{
  return g_task_propagate_pointer (G_TASK (result), error);
}

void
gepard_voice_store_list_async (GepardVoiceStore *store, const GepardVoiceListParams *params,
                               GCancellable *cancellable, GAsyncReadyCallback callback,
                               gpointer user_data)
{
  GTask *task = new_task (store, gepard_voice_store_list_async, cancellable, callback, user_data);
  store->funcs->list (store, params, task);
}

GepardVoiceInfoPage *
gepard_voice_store_list_finish (GAsyncResult *result, GError **error)
{
  return g_task_propagate_pointer (G_TASK (result), error);
}

void
gepard_voice_store_create_async (GepardVoiceStore *store, const GepardVoiceCreateParams *params,
                                 GCancellable *cancellable, GAsyncReadyCallback callback,
                                 gpointer user_data)
{
  GTask *task = new_task (store, gepard_voice_store_create_async, cancellable, callback, user_data);
  store->funcs->create (store, params, task);
}

GepardVoiceInfo *
gepard_voice_store_create_finish (GAsyncResult *result, GError **error)
{
  return g_task_propagate_pointer (G_TASK (result), error);
}

void
gepard_voice_store_delete_async (GepardVoiceStore *store, const char *id, GCancellable *cancellable,
                                 GAsyncReadyCallback callback, gpointer user_data)
{
  GTask *task = new_task (store, gepard_voice_store_delete_async, cancellable, callback, user_data);
  if (!gepard_voice_id_is_valid (id))
    {
      g_task_return_error (task, voice_not_found (id));
      g_object_unref (task);
    }
  else
    store->funcs->delete (store, id, task);
}

gboolean
gepard_voice_store_delete_finish (GAsyncResult *result, GError **error)
{
  return g_task_propagate_boolean (G_TASK (result), error);
}

char *
gepard_voice_store_describe (GepardVoiceStore *store, gboolean *ok)
{
  *ok = TRUE;
  return store->funcs->describe (store, ok);
}

void
gepard_voice_store_free (GepardVoiceStore *store)
{
  if (store != NULL)
    store->funcs->free (store);
}

/* ---- local: the engine's registry ---- */

typedef struct
{
  GepardVoiceStore parent;
  GepardEnginePool *engines;
  GPtrArray *voices; /* GepardVoiceInfo: "default", then the files sorted by id */
} LocalStore;

/* The index of the voice `id` in `voices`, or -1. */
static int
find_voice (const GPtrArray *voices, const char *id)
{
  for (guint i = 0; i < voices->len; i++)
    if (g_strcmp0 (((const GepardVoiceInfo *)voices->pdata[i])->id, id) == 0)
      return (int)i;
  return -1;
}

static GepardVoice *
local_lookup (GepardVoiceStore *store, const char *id)
{
  LocalStore *self = (LocalStore *)store;
  return gepard_engine_pool_lookup_voice (self->engines, id);
}

static void
local_get (GepardVoiceStore *store, const char *id, GTask *task)
{
  GepardVoice *voice = local_lookup (store, id);
  if (voice == NULL)
    g_task_return_error (task, voice_not_found (id));
  else
    g_task_return_pointer (task, voice, (GDestroyNotify)gepard_voice_unref);
  g_object_unref (task);
}

static void
local_get_info (GepardVoiceStore *store, const char *id, GTask *task)
{
  LocalStore *self = (LocalStore *)store;
  int i = find_voice (self->voices, id);
  if (i < 0)
    g_task_return_error (task, voice_not_found (id));
  else
    g_task_return_pointer (task, voice_info_copy (self->voices->pdata[i]),
                           (GDestroyNotify)gepard_voice_info_free);
  g_object_unref (task);
}

/* Cursor pagination: clients page with starting_after=<last id> until a page comes back empty
 * (cartesia-protocol.md §4), so a cursor past the end gives an empty page, not an error. */
static GepardVoiceInfoPage *
local_page (LocalStore *self, const GepardVoiceListParams *params)
{
  const GPtrArray *voices = self->voices;
  int first = 0, last = (int)voices->len; /* [first, last) */
  int limit = (int)params->limit;

  if (params->starting_after != NULL)
    {
      int i = find_voice (voices, params->starting_after);
      first = i >= 0 ? i + 1 : (int)voices->len;
    }
  if (params->ending_before != NULL)
    {
      int i = find_voice (voices, params->ending_before);
      last = i >= 0 ? i : 0;
      if (params->starting_after == NULL)
        first = MAX (0, last - limit);
    }
  GepardVoiceInfoPage *page = page_new ();
  int end = MIN (last, first + limit);
  for (int i = first; i < end; i++)
    g_ptr_array_add (page->voices, voice_info_copy (voices->pdata[i]));
  page->has_more = end < last;
  return page;
}

static void
local_list (GepardVoiceStore *store, const GepardVoiceListParams *params, GTask *task)
{
  g_task_return_pointer (task, local_page ((LocalStore *)store, params),
                         (GDestroyNotify)gepard_voice_info_page_free);
  g_object_unref (task);
}

static void
local_create (GepardVoiceStore *store, const GepardVoiceCreateParams *params, GTask *task)
{
  g_task_return_new_error (task, GEPARD_API_ERROR, GEPARD_API_ERROR_UNAVAILABLE,
                           "This server has no voice database to store cloned voices in");
  g_object_unref (task);
}

static void
local_delete (GepardVoiceStore *store, const char *id, GTask *task)
{
  LocalStore *self = (LocalStore *)store;
  if (find_voice (self->voices, id) < 0)
    g_task_return_error (task, voice_not_found (id));
  else
    g_task_return_new_error (task, GEPARD_API_ERROR, GEPARD_API_ERROR_FORBIDDEN,
                             "Voice \"%s\" is built in and cannot be deleted", id);
  g_object_unref (task);
}

static char *
local_describe (GepardVoiceStore *store, gboolean *ok)
{
  return g_strdup_printf ("local, %u voices", ((LocalStore *)store)->voices->len);
}

static void
local_free (GepardVoiceStore *store)
{
  LocalStore *self = (LocalStore *)store;
  gepard_engine_pool_unref (self->engines);
  g_ptr_array_unref (self->voices);
  g_free (self);
}

static const GepardVoiceStoreFuncs local_funcs = {
    local_lookup, local_get,    local_get_info, local_list,
    local_create, local_delete, local_describe, local_free,
};

/* Registers every <id>.bin of `dir` whose id is valid and whose contents are a prefix for this
 * model; a bad file stops the startup rather than leaving a voice silently missing. */
static gboolean
load_directory (LocalStore *self, const char *dir, GError **error)
{
  g_autoptr (GDir) d = g_dir_open (dir, 0, error);
  if (d == NULL)
    return FALSE;
  const char *name;
  while ((name = g_dir_read_name (d)) != NULL)
    {
      if (!g_str_has_suffix (name, ".bin"))
        continue;
      g_autofree char *id = g_strndup (name, strlen (name) - 4);
      g_autofree char *path = g_build_filename (dir, name, NULL);
      if (!gepard_voice_id_is_valid (id) || g_str_equal (id, "default"))
        {
          g_set_error (error, G_FILE_ERROR, G_FILE_ERROR_INVAL,
                       "%s: a voice file is named <id>.bin with an id of letters, digits and "
                       "._:- (and not \"default\")",
                       path);
          return FALSE;
        }
      g_autoptr (GepardVoice) file_voice = gepard_voice_load_prefix_file (
          path, gepard_engine_pool_get_config (self->engines), error);
      if (file_voice == NULL)
        {
          g_prefix_error (error, "%s: ", path);
          return FALSE;
        }
      /* the registry knows a voice by the id it was created with */
      int n_rows = 0;
      const float *prefix = gepard_voice_get_prefix (file_voice, &n_rows);
      g_autoptr (GepardVoice) voice = gepard_voice_new (
          id, prefix, n_rows, gepard_engine_pool_get_config (self->engines)->hidden_size);
      gepard_engine_pool_add_voice (self->engines, voice);

      g_autoptr (GFile) file = g_file_new_for_path (path);
      g_autoptr (GFileInfo) info
          = g_file_query_info (file, G_FILE_ATTRIBUTE_TIME_MODIFIED, 0, NULL, NULL);
      g_autoptr (GDateTime) modified
          = info != NULL ? g_file_info_get_modification_date_time (info) : NULL;
      g_autoptr (GDateTime) now = g_date_time_new_now_utc ();
      g_ptr_array_add (self->voices,
                       gepard_voice_info_new (id, id, "A cloned voice", "en",
                                              modified != NULL ? modified : now, FALSE));
    }
  return TRUE;
}

/* "default", then by id */
static int
default_first (gconstpointer a, gconstpointer b)
{
  const GepardVoiceInfo *x = *(GepardVoiceInfo *const *)a;
  const GepardVoiceInfo *y = *(GepardVoiceInfo *const *)b;
  gboolean xd = g_str_equal (x->id, "default"), yd = g_str_equal (y->id, "default");
  if (xd || yd)
    return yd - xd;
  return g_strcmp0 (x->id, y->id);
}

GepardVoiceStore *
gepard_voice_store_new_local (GepardEnginePool *engines, const char *voices_dir, GError **error)
{
  LocalStore *self = g_new0 (LocalStore, 1);
  self->parent.funcs = &local_funcs;
  self->engines = gepard_engine_pool_ref (engines);
  self->voices = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_voice_info_free);

  g_autoptr (GDateTime) epoch = g_date_time_new_from_unix_utc (0);
  g_ptr_array_add (
      self->voices,
      gepard_voice_info_new ("default", "default", "The model's own voice", "en", epoch, FALSE));
  if (voices_dir != NULL && !load_directory (self, voices_dir, error))
    {
      local_free (&self->parent);
      return NULL;
    }
  g_ptr_array_sort (self->voices, default_first);
  return &self->parent;
}

/* ---- database: the local voices, then the cloned voices of a GepardVoiceDb ---- */

typedef struct
{
  GepardVoiceStore parent;
  GepardEnginePool *engines;
  LocalStore *local;
  GepardVoiceDb *db;
} DbStore;

typedef struct
{
  DbStore *self;
  char *id;
  GepardVoiceInfoPage *page; /* list: the local voices before the database's */
  guint room;                /* list: how many of the database's voices fit on the page */
} DbOp;

static void
db_op_free (gpointer data)
{
  DbOp *op = data;
  g_free (op->id);
  gepard_voice_info_page_free (op->page);
  g_free (op);
}

static DbOp *
db_op_new (DbStore *self, const char *id, GTask *task)
{
  DbOp *op = g_new0 (DbOp, 1);
  op->self = self;
  op->id = g_strdup (id);
  g_task_set_task_data (task, op, db_op_free);
  return op;
}

static gboolean
is_local (DbStore *self, const char *id)
{
  return find_voice (self->local->voices, id) >= 0;
}

static GepardVoiceInfo *
info_of_record (const GepardVoiceRecord *record)
{
  return gepard_voice_info_new (record->id, record->name, record->description, record->language,
                                record->created_at, TRUE);
}

/* The record's voice, registered with the engine. */
static GepardVoice *
register_record (DbStore *self, const GepardVoiceRecord *record, GError **error)
{
  GepardVoice *voice = gepard_voice_new_from_prefix_bytes (
      record->id, record->prefix, gepard_engine_pool_get_config (self->engines), error);
  if (voice != NULL)
    gepard_engine_pool_add_voice (self->engines, voice);
  return voice;
}

static GepardVoice *
db_lookup (GepardVoiceStore *store, const char *id)
{
  DbStore *self = (DbStore *)store;
  GepardVoice *voice = gepard_engine_pool_lookup_voice (self->engines, id);
  if (voice != NULL)
    return voice;
  g_autoptr (GepardVoiceRecord) record = gepard_voice_db_lookup_cached (self->db, id);
  if (record == NULL || record->prefix == NULL)
    return NULL;
  /* a cached voice whose prefix does not fit is read again (and refused) by get */
  return register_record (self, record, NULL);
}

static void
on_db_get (GObject *source, GAsyncResult *result, gpointer user_data)
{
  GTask *task = user_data;
  DbOp *op = g_task_get_task_data (task);
  GError *error = NULL;
  g_autoptr (GepardVoiceRecord) record = gepard_voice_db_get_finish (op->self->db, result, &error);

  if (record == NULL)
    g_task_return_error (task, gepard_voice_store_api_error (error, op->id));
  else if (g_task_get_source_tag (task) == gepard_voice_store_get_info_async)
    g_task_return_pointer (task, info_of_record (record), (GDestroyNotify)gepard_voice_info_free);
  else
    {
      GepardVoice *voice = register_record (op->self, record, &error);
      if (voice == NULL)
        g_task_return_error (task, gepard_voice_store_api_error (error, op->id));
      else
        g_task_return_pointer (task, voice, (GDestroyNotify)gepard_voice_unref);
    }
  g_object_unref (task);
}

static void
db_get (GepardVoiceStore *store, const char *id, GTask *task)
{
  DbStore *self = (DbStore *)store;
  GepardVoice *voice = db_lookup (store, id);
  if (voice != NULL)
    {
      g_task_return_pointer (task, voice, (GDestroyNotify)gepard_voice_unref);
      g_object_unref (task);
      return;
    }
  if (is_local (self, id))
    {
      local_get (&self->local->parent, id, task);
      return;
    }
  db_op_new (self, id, task);
  gepard_voice_db_get_async (self->db, id, g_task_get_cancellable (task), on_db_get, task);
}

static void
db_get_info (GepardVoiceStore *store, const char *id, GTask *task)
{
  DbStore *self = (DbStore *)store;
  if (is_local (self, id))
    {
      local_get_info (&self->local->parent, id, task);
      return;
    }
  db_op_new (self, id, task);
  gepard_voice_db_get_async (self->db, id, g_task_get_cancellable (task), on_db_get, task);
}

static void
on_db_list (GObject *source, GAsyncResult *result, gpointer user_data)
{
  GTask *task = user_data;
  DbOp *op = g_task_get_task_data (task);
  GError *error = NULL;
  g_autoptr (GepardVoicePage) db_page = gepard_voice_db_list_finish (op->self->db, result, &error);

  if (db_page == NULL)
    {
      g_task_return_error (task, gepard_voice_store_api_error (error, NULL));
      g_object_unref (task);
      return;
    }
  GepardVoiceInfoPage *page = g_steal_pointer (&op->page);
  guint room = op->room;
  for (guint i = 0; i < db_page->voices->len && i < room; i++)
    g_ptr_array_add (page->voices, info_of_record (db_page->voices->pdata[i]));
  /* with no room left the page was read only to learn whether stored voices follow */
  page->has_more |= room > 0 ? db_page->has_more : db_page->voices->len > 0;
  g_task_return_pointer (task, page, (GDestroyNotify)gepard_voice_info_page_free);
  g_object_unref (task);
}

/* The built-in voices come first, then the stored ones: a page that starts among the built-in
 * voices continues with the newest stored ones. */
static void
db_list (GepardVoiceStore *store, const GepardVoiceListParams *params, GTask *task)
{
  DbStore *self = (DbStore *)store;
  const GPtrArray *local = self->local->voices;
  int after = params->starting_after != NULL ? find_voice (local, params->starting_after) : -1;
  int before = params->ending_before != NULL ? find_voice (local, params->ending_before) : -1;
  GepardVoiceListParams db_params = *params;

  if (params->ending_before != NULL && before >= 0)
    {
      /* a page that ends among the built-in voices holds built-in voices only */
      local_list (&self->local->parent, params, task);
      return;
    }
  if ((params->starting_after == NULL || after >= 0) && params->ending_before == NULL)
    {
      DbOp *op = db_op_new (self, NULL, task);
      op->page = page_new ();
      guint first = params->starting_after != NULL ? (guint)after + 1 : 0;
      for (guint i = first; i < local->len && op->page->voices->len < params->limit; i++)
        g_ptr_array_add (op->page->voices, voice_info_copy (local->pdata[i]));
      op->page->has_more = first + op->page->voices->len < local->len;
      op->room = params->limit - op->page->voices->len;
      db_params.starting_after = NULL;
      db_params.limit = MAX (op->room, 1);
      gepard_voice_db_list_async (self->db, &db_params, g_task_get_cancellable (task), on_db_list,
                                  task);
      return;
    }
  /* a cursor among the stored voices */
  DbOp *op = db_op_new (self, NULL, task);
  op->page = page_new ();
  op->room = params->limit;
  gepard_voice_db_list_async (self->db, params, g_task_get_cancellable (task), on_db_list, task);
}

static void
on_db_create (GObject *source, GAsyncResult *result, gpointer user_data)
{
  GTask *task = user_data;
  DbOp *op = g_task_get_task_data (task);
  GError *error = NULL;
  g_autoptr (GepardVoiceRecord) record
      = gepard_voice_db_create_finish (op->self->db, result, &error);

  if (record == NULL)
    g_task_return_error (task, gepard_voice_store_api_error (error, NULL));
  else
    {
      /* ready for synthesis at once, without asking the database again */
      g_autoptr (GepardVoice) voice = register_record (op->self, record, NULL);
      g_task_return_pointer (task, info_of_record (record), (GDestroyNotify)gepard_voice_info_free);
    }
  g_object_unref (task);
}

static void
db_create (GepardVoiceStore *store, const GepardVoiceCreateParams *params, GTask *task)
{
  DbStore *self = (DbStore *)store;
  db_op_new (self, NULL, task);
  gepard_voice_db_create_async (self->db, params, g_task_get_cancellable (task), on_db_create,
                                task);
}

static void
on_db_delete (GObject *source, GAsyncResult *result, gpointer user_data)
{
  GTask *task = user_data;
  DbOp *op = g_task_get_task_data (task);
  GError *error = NULL;

  if (!gepard_voice_db_delete_finish (op->self->db, result, &error))
    g_task_return_error (task, gepard_voice_store_api_error (error, op->id));
  else
    {
      gepard_engine_pool_remove_voice (op->self->engines, op->id);
      g_task_return_boolean (task, TRUE);
    }
  g_object_unref (task);
}

static void
db_delete (GepardVoiceStore *store, const char *id, GTask *task)
{
  DbStore *self = (DbStore *)store;
  if (is_local (self, id))
    {
      local_delete (&self->local->parent, id, task);
      return;
    }
  db_op_new (self, id, task);
  gepard_voice_db_delete_async (self->db, id, g_task_get_cancellable (task), on_db_delete, task);
}

static char *
db_describe (GepardVoiceStore *store, gboolean *ok)
{
  DbStore *self = (DbStore *)store;
  GepardVoiceDbHealth health;
  gepard_voice_db_get_health (self->db, &health);
  *ok = health.state != GEPARD_VOICE_DB_STATE_DOWN;
  char *text = g_strdup_printf ("postgresql (%s), %u built-in voices, %u cached",
                                health.state == GEPARD_VOICE_DB_STATE_UP     ? "up"
                                : health.state == GEPARD_VOICE_DB_STATE_DOWN ? "down, reconnecting"
                                                                             : "not contacted yet",
                                self->local->voices->len, health.cached_voices);
  gepard_voice_db_health_clear (&health);
  return text;
}

static void
db_free (GepardVoiceStore *store)
{
  DbStore *self = (DbStore *)store;
  gepard_voice_db_free (self->db);
  local_free (&self->local->parent);
  gepard_engine_pool_unref (self->engines);
  g_free (self);
}

static const GepardVoiceStoreFuncs db_funcs = {
    db_lookup, db_get, db_get_info, db_list, db_create, db_delete, db_describe, db_free,
};

GepardVoiceStore *
gepard_voice_store_new_db (GepardEnginePool *engines, GepardVoiceStore *local, GepardVoiceDb *db)
{
  g_return_val_if_fail (local->funcs == &local_funcs, NULL);
  DbStore *self = g_new0 (DbStore, 1);
  self->parent.funcs = &db_funcs;
  self->engines = gepard_engine_pool_ref (engines);
  self->local = (LocalStore *)local;
  self->db = db;
  return &self->parent;
}
