/* gepard-engine-pool.c: see gepard-engine-pool.h. */
#include "gepard-engine-pool.h"

#include <string.h>

struct _GepardEnginePool
{
  gint refs;
  GPtrArray *engines; /* GepardEngine*, owned */
  GPtrArray *devices; /* their device names */
  guint next;         /* where the search for the least loaded engine starts; atomic */
};

GepardEnginePool *
gepard_engine_pool_new (GepardEngine *const *engines, guint n)
{
  g_return_val_if_fail (engines != NULL && n > 0, NULL);
  GepardEnginePool *pool = g_new0 (GepardEnginePool, 1);
  pool->refs = 1;
  pool->engines = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_engine_unref);
  pool->devices = g_ptr_array_new_with_free_func (g_free);
  for (guint i = 0; i < n; i++)
    {
      g_ptr_array_add (pool->engines, gepard_engine_ref (engines[i]));
      const GepardDeviceInfo *device = gepard_engine_get_device (engines[i]);
      g_ptr_array_add (pool->devices, device->kind == GEPARD_BACKEND_CUDA
                                          ? g_strdup_printf ("cuda:%d", device->device_index)
                                          : g_strdup ("cpu"));
    }
  return pool;
}

GepardEnginePool *
gepard_engine_pool_ref (GepardEnginePool *pool)
{
  g_atomic_int_inc (&pool->refs);
  return pool;
}

void
gepard_engine_pool_unref (GepardEnginePool *pool)
{
  if (pool == NULL || !g_atomic_int_dec_and_test (&pool->refs))
    return;
  g_ptr_array_unref (pool->engines);
  g_ptr_array_unref (pool->devices);
  g_free (pool);
}

guint
gepard_engine_pool_get_size (const GepardEnginePool *pool)
{
  return pool->engines->len;
}

GepardEngine *
gepard_engine_pool_get (const GepardEnginePool *pool, guint i)
{
  g_return_val_if_fail (i < pool->engines->len, NULL);
  return pool->engines->pdata[i];
}

const char *
gepard_engine_pool_get_device_name (const GepardEnginePool *pool, guint i)
{
  g_return_val_if_fail (i < pool->devices->len, NULL);
  return pool->devices->pdata[i];
}

GepardEngine *
gepard_engine_pool_pick (GepardEnginePool *pool, const char **device)
{
  guint n = pool->engines->len;
  guint start = (guint)g_atomic_int_add ((gint *)&pool->next, 1) % n;
  guint best = start, best_load = G_MAXUINT;
  for (guint k = 0; k < n; k++)
    {
      guint i = (start + k) % n;
      GepardEngineStats stats;
      gepard_engine_get_stats (pool->engines->pdata[i], &stats);
      guint load = stats.running + stats.waiting;
      if (load < best_load)
        best = i, best_load = load;
    }
  if (device != NULL)
    *device = pool->devices->pdata[best];
  return pool->engines->pdata[best];
}

const GepardModelConfig *
gepard_engine_pool_get_config (const GepardEnginePool *pool)
{
  return gepard_engine_get_config (pool->engines->pdata[0]);
}

void
gepard_engine_pool_add_voice (GepardEnginePool *pool, GepardVoice *voice)
{
  for (guint i = 0; i < pool->engines->len; i++)
    gepard_engine_add_voice (pool->engines->pdata[i], voice);
}

GepardVoice *
gepard_engine_pool_lookup_voice (GepardEnginePool *pool, const char *id)
{
  return gepard_engine_lookup_voice (pool->engines->pdata[0], id);
}

gboolean
gepard_engine_pool_remove_voice (GepardEnginePool *pool, const char *id)
{
  gboolean removed = FALSE;
  for (guint i = 0; i < pool->engines->len; i++)
    removed = gepard_engine_remove_voice (pool->engines->pdata[i], id) || removed;
  return removed;
}

void
gepard_engine_pool_get_stats (GepardEnginePool *pool, GepardEngineStats *stats)
{
  memset (stats, 0, sizeof *stats);
  for (guint i = 0; i < pool->engines->len; i++)
    {
      GepardEngineStats one;
      gepard_engine_get_stats (pool->engines->pdata[i], &one);
      stats->running += one.running;
      stats->waiting += one.waiting;
      stats->steps += one.steps;
      stats->frames += one.frames;
      stats->utterances += one.utterances;
      stats->decode_batches += one.decode_batches;
      stats->decode_batches_alongside += one.decode_batches_alongside;
      stats->decoded_frames += one.decoded_frames;
      stats->largest_decode_batch = MAX (stats->largest_decode_batch, one.largest_decode_batch);
    }
}
