/* gepard-voice-store.c: the voice store interface and its local implementation. */
#include "gepard-voice-store.h"

#include "gepard-protocol.h"
#include "gepard-voice.h"

#include <gio/gio.h>
#include <string.h>

GepardVoice *
gepard_voice_store_lookup (GepardVoiceStore *store, const char *id)
{
  return gepard_voice_id_is_valid (id) ? store->funcs->lookup (store, id) : NULL;
}

const GPtrArray *
gepard_voice_store_list (GepardVoiceStore *store)
{
  return store->funcs->list (store);
}

const char *
gepard_voice_store_describe (GepardVoiceStore *store)
{
  return store->funcs->describe (store);
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
  GepardEngine *engine;
  GPtrArray *voices; /* GepardVoiceInfo, sorted by id */
  char *description;
} LocalStore;

static void
voice_info_free (gpointer data)
{
  GepardVoiceInfo *info = data;
  g_free (info->id);
  g_free (info->name);
  g_free (info->description);
  g_free (info->language);
  g_free (info->created_at);
  g_free (info);
}

static GepardVoiceInfo *
voice_info_new (const char *id, const char *description, GDateTime *created)
{
  GepardVoiceInfo *info = g_new0 (GepardVoiceInfo, 1);
  info->id = g_strdup (id);
  info->name = g_strdup (id);
  info->description = g_strdup (description);
  info->language = g_strdup ("en");
  info->created_at = g_date_time_format_iso8601 (created);
  return info;
}

static int
compare_ids (gconstpointer a, gconstpointer b)
{
  const GepardVoiceInfo *x = *(GepardVoiceInfo *const *)a;
  const GepardVoiceInfo *y = *(GepardVoiceInfo *const *)b;
  return g_strcmp0 (x->id, y->id);
}

static GepardVoice *
local_lookup (GepardVoiceStore *store, const char *id)
{
  LocalStore *self = (LocalStore *)store;
  return gepard_engine_lookup_voice (self->engine, id);
}

static const GPtrArray *
local_list (GepardVoiceStore *store)
{
  return ((LocalStore *)store)->voices;
}

static const char *
local_describe (GepardVoiceStore *store)
{
  return ((LocalStore *)store)->description;
}

static void
local_free (GepardVoiceStore *store)
{
  LocalStore *self = (LocalStore *)store;
  gepard_engine_unref (self->engine);
  g_ptr_array_unref (self->voices);
  g_free (self->description);
  g_free (self);
}

static const GepardVoiceStoreFuncs local_funcs = {
    local_lookup,
    local_list,
    local_describe,
    local_free,
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
      g_autoptr (GepardVoice) file_voice
          = gepard_voice_load_prefix_file (path, gepard_engine_get_config (self->engine), error);
      if (file_voice == NULL)
        {
          g_prefix_error (error, "%s: ", path);
          return FALSE;
        }
      /* the registry knows a voice by the id it was created with */
      int n_rows = 0;
      const float *prefix = gepard_voice_get_prefix (file_voice, &n_rows);
      g_autoptr (GepardVoice) voice = gepard_voice_new (
          id, prefix, n_rows, gepard_engine_get_config (self->engine)->hidden_size);
      gepard_engine_add_voice (self->engine, voice);

      g_autoptr (GFile) file = g_file_new_for_path (path);
      g_autoptr (GFileInfo) info
          = g_file_query_info (file, G_FILE_ATTRIBUTE_TIME_MODIFIED, 0, NULL, NULL);
      g_autoptr (GDateTime) modified
          = info != NULL ? g_file_info_get_modification_date_time (info) : NULL;
      g_autoptr (GDateTime) now = g_date_time_new_now_utc ();
      g_ptr_array_add (self->voices,
                       voice_info_new (id, "A cloned voice", modified != NULL ? modified : now));
    }
  return TRUE;
}

GepardVoiceStore *
gepard_voice_store_new_local (GepardEngine *engine, const char *voices_dir, GError **error)
{
  LocalStore *self = g_new0 (LocalStore, 1);
  self->parent.funcs = &local_funcs;
  self->engine = gepard_engine_ref (engine);
  self->voices = g_ptr_array_new_with_free_func (voice_info_free);

  g_autoptr (GDateTime) epoch = g_date_time_new_from_unix_utc (0);
  g_ptr_array_add (self->voices, voice_info_new ("default", "The model's own voice", epoch));
  if (voices_dir != NULL && !load_directory (self, voices_dir, error))
    {
      local_free (&self->parent);
      return NULL;
    }
  g_ptr_array_sort (self->voices, compare_ids);
  self->description = g_strdup_printf ("local, %u voices", self->voices->len);
  return &self->parent;
}
