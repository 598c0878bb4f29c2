/* gepard-voice-store.h: where the server's voices come from, behind one interface.
 *
 * Two implementations: the local one serves the engine's registry (the built-in "default" voice
 * plus every <id>.bin prefix file of a directory, registered at start-up) and cannot store new
 * voices; the database one adds the cloned voices of a GepardVoiceDb (gepard-voice-db.h).
 *
 * Every call that may wait runs asynchronously and completes in the caller's thread-default main
 * context. Errors are GEPARD_API_ERROR, ready to answer a client with. */
#pragma once

#include "gepard-engine-pool.h"
#include "gepard-voice-db.h"
#include "gepard-voice.h"

#include <gio/gio.h>

G_BEGIN_DECLS

/* What GET /voices shows of a voice. */
typedef struct
{
  char *id;
  char *name;
  char *description;
  char *language;
  char *created_at;  /* ISO 8601 */
  gboolean is_owner; /* cloned on this service (and so deletable) */
} GepardVoiceInfo;

GepardVoiceInfo *gepard_voice_info_new (const char *id, const char *name, const char *description,
                                        const char *language, GDateTime *created,
                                        gboolean is_owner);
void gepard_voice_info_free (GepardVoiceInfo *info);

typedef struct
{
  GPtrArray *voices; /* GepardVoiceInfo */
  gboolean has_more; /* voices beyond this page in the direction asked for */
} GepardVoiceInfoPage;

void gepard_voice_info_page_free (GepardVoiceInfoPage *page);

typedef struct _GepardVoiceStore GepardVoiceStore;

/* Each asynchronous operation returns its result through `task`. */
typedef struct
{
  /* the engine's voice, or NULL when it is not at hand without waiting */
  GepardVoice *(*lookup) (GepardVoiceStore *store, const char *id);
  void (*get) (GepardVoiceStore *store, const char *id, GTask *task);      /* GepardVoice */
  void (*get_info) (GepardVoiceStore *store, const char *id, GTask *task); /* GepardVoiceInfo */
  void (*list) (GepardVoiceStore *store, const GepardVoiceListParams *params,
                GTask *task); /* GepardVoiceInfoPage */
  void (*create) (GepardVoiceStore *store, const GepardVoiceCreateParams *params,
                  GTask *task);                                          /* GepardVoiceInfo */
  void (*delete) (GepardVoiceStore *store, const char *id, GTask *task); /* boolean */
  /* one line for /health; *ok is FALSE while the store cannot reach its voices */
  char *(*describe) (GepardVoiceStore *store, gboolean *ok);
  void (*free) (GepardVoiceStore *store);
} GepardVoiceStoreFuncs;

struct _GepardVoiceStore
{
  const GepardVoiceStoreFuncs *funcs;
};

/* The engines' registry plus the prefix files of `voices_dir` (NULL: none); every voice is
 * registered with each engine. */
GepardVoiceStore *gepard_voice_store_new_local (GepardEnginePool *engines, const char *voices_dir,
                                                GError **error);
/* The voices of `local` (taken) first, then those of `db` (taken) for the engines' model. */
GepardVoiceStore *gepard_voice_store_new_db (GepardEnginePool *engines, GepardVoiceStore *local,
                                             GepardVoiceDb *db);

/* A new reference to a voice known without waiting (the engine's registry, then a cache), or
 * NULL. */
GepardVoice *gepard_voice_store_lookup (GepardVoiceStore *store, const char *id);

/* The voice, registered with the engine once this completes. */
void gepard_voice_store_get_async (GepardVoiceStore *store, const char *id,
                                   GCancellable *cancellable, GAsyncReadyCallback callback,
                                   gpointer user_data);
GepardVoice *gepard_voice_store_get_finish (GAsyncResult *result, GError **error);

void gepard_voice_store_get_info_async (GepardVoiceStore *store, const char *id,
                                        GCancellable *cancellable, GAsyncReadyCallback callback,
                                        gpointer user_data);
GepardVoiceInfo *gepard_voice_store_get_info_finish (GAsyncResult *result, GError **error);

/* One page: the built-in voices first (on the page without a cursor), then the stored ones newest
 * first. */
void gepard_voice_store_list_async (GepardVoiceStore *store, const GepardVoiceListParams *params,
                                    GCancellable *cancellable, GAsyncReadyCallback callback,
                                    gpointer user_data);
GepardVoiceInfoPage *gepard_voice_store_list_finish (GAsyncResult *result, GError **error);

/* A new voice from a prefix (params->prefix: rows × hidden floats). */
void gepard_voice_store_create_async (GepardVoiceStore *store,
                                      const GepardVoiceCreateParams *params,
                                      GCancellable *cancellable, GAsyncReadyCallback callback,
                                      gpointer user_data);
GepardVoiceInfo *gepard_voice_store_create_finish (GAsyncResult *result, GError **error);

/* Deletes a stored voice and drops it from the engine's registry. */
void gepard_voice_store_delete_async (GepardVoiceStore *store, const char *id,
                                      GCancellable *cancellable, GAsyncReadyCallback callback,
                                      gpointer user_data);
gboolean gepard_voice_store_delete_finish (GAsyncResult *result, GError **error);

/* One line for /health. */
char *gepard_voice_store_describe (GepardVoiceStore *store, gboolean *ok);
void gepard_voice_store_free (GepardVoiceStore *store);

/* The API error for a voice database error (NOT_FOUND → 404 voice_not_found, INVALID and
 * MODEL_MISMATCH → 400, DOWN and CLOSED → 503, anything else → 500). Takes `error`. */
GError *gepard_voice_store_api_error (GError *error, const char *id);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceInfo, gepard_voice_info_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceInfoPage, gepard_voice_info_page_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceStore, gepard_voice_store_free)

G_END_DECLS
