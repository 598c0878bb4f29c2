/* gepard-engine-pool.h: the server's engines, one per GPU it was given (or one on the CPU), as
 * one: every voice is registered with each of them, and each new stream goes to the engine with
 * the fewest utterances running and waiting (ties in turn, so that a burst of streams arriving
 * together is spread evenly). */
#pragma once

#include "gepard-engine.h"
#include "gepard-voice.h"

G_BEGIN_DECLS

typedef struct _GepardEnginePool GepardEnginePool;

/* The pool of `engines` (each referenced; n ≥ 1, all of one model). */
GepardEnginePool *gepard_engine_pool_new (GepardEngine *const *engines, guint n);
GepardEnginePool *gepard_engine_pool_ref (GepardEnginePool *pool);
void gepard_engine_pool_unref (GepardEnginePool *pool);

guint gepard_engine_pool_get_size (const GepardEnginePool *pool);
/* The i-th engine (borrowed; the pool keeps it while it lives). */
GepardEngine *gepard_engine_pool_get (const GepardEnginePool *pool, guint i);
/* The engine a new stream goes to (borrowed), and in `device` (when not NULL) the name of its
 * device ("cpu", "cuda:1") for the elements' device= property. Any thread. */
GepardEngine *gepard_engine_pool_pick (GepardEnginePool *pool, const char **device);
/* "cpu" or "cuda:N": the device of the pool's i-th engine. */
const char *gepard_engine_pool_get_device_name (const GepardEnginePool *pool, guint i);
/* The model's configuration (the same in every engine). */
const GepardModelConfig *gepard_engine_pool_get_config (const GepardEnginePool *pool);

/* Voices, in every engine's registry. */
void gepard_engine_pool_add_voice (GepardEnginePool *pool, GepardVoice *voice);
/* A new reference to the registered voice `id`, or NULL. */
GepardVoice *gepard_engine_pool_lookup_voice (GepardEnginePool *pool, const char *id);
gboolean gepard_engine_pool_remove_voice (GepardEnginePool *pool, const char *id);

/* The stats of all engines added up (`largest_decode_batch`: the largest of any). */
void gepard_engine_pool_get_stats (GepardEnginePool *pool, GepardEngineStats *stats);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardEnginePool, gepard_engine_pool_unref)

G_END_DECLS
