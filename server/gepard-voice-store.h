/* gepard-voice-store.h: where the server's voices come from, behind one interface.
 *
 * The local implementation serves the engine's registry: the built-in "default" voice plus every
 * <id>.bin prefix file of a directory, registered at start-up. */
#pragma once

#include "gepard-voice.h"

#include <glib.h>

G_BEGIN_DECLS

/* What GET /voices shows of a voice. */
typedef struct
{
  char *id;
  char *name;
  char *description;
  char *language;
  char *created_at; /* ISO 8601 */
} GepardVoiceInfo;

typedef struct _GepardVoiceStore GepardVoiceStore;

typedef struct
{
  GepardVoice *(*lookup) (GepardVoiceStore *store, const char *id);
  const GPtrArray *(*list) (GepardVoiceStore *store);
  const char *(*describe) (GepardVoiceStore *store);
  void (*free) (GepardVoiceStore *store);
} GepardVoiceStoreFuncs;

struct _GepardVoiceStore
{
  const GepardVoiceStoreFuncs *funcs;
};

/* The engine's registry plus the prefix files of `voices_dir` (NULL: none). */
GepardVoiceStore *gepard_voice_store_new_local (GepardEngine *engine, const char *voices_dir,
                                                GError **error);
/* a new reference, or NULL for an unknown or malformed id */
GepardVoice *gepard_voice_store_lookup (GepardVoiceStore *store, const char *id);
/* GepardVoiceInfo, sorted by id */
const GPtrArray *gepard_voice_store_list (GepardVoiceStore *store);
/* one line for /health */
const char *gepard_voice_store_describe (GepardVoiceStore *store);
void gepard_voice_store_free (GepardVoiceStore *store);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoiceStore, gepard_voice_store_free)

G_END_DECLS
