/* The server's engine pool (server/gepard-engine-pool.h) over two CPU engines of one tiny model:
 * new streams go to the less loaded engine, a burst is spread evenly, voices are in every
 * engine's registry, and the stats add up. */
#include "gepard-engine-pool.h"
#include "gepard-test-model.h"

#include <stdlib.h>

static char *work_dir;
static char *model_dir;

/* Blocks an utterance in its second frame's callback (after its first step the engine counts it
 * as running) until opened. */
typedef struct
{
  GMutex lock;
  GCond changed;
  gboolean blocked, open, done;
} Gate;

static void
gate_frame (GepardUtterance *u, const gint32 *codes, int index, gpointer user_data)
{
  Gate *g = user_data;
  if (index != 1)
    return;
  g_mutex_lock (&g->lock);
  g->blocked = TRUE;
  g_cond_broadcast (&g->changed);
  while (!g->open)
    g_cond_wait (&g->changed, &g->lock);
  g_mutex_unlock (&g->lock);
}

static void
gate_done (GepardUtterance *u, GepardUtteranceEnd end, int n_frames, gpointer user_data)
{
  Gate *g = user_data;
  g_mutex_lock (&g->lock);
  g->done = TRUE;
  g_cond_broadcast (&g->changed);
  g_mutex_unlock (&g->lock);
}

static const GepardUtteranceCallbacks gate_callbacks = {gate_frame, gate_done};

static void
gate_wait (Gate *g, gboolean *flag)
{
  g_mutex_lock (&g->lock);
  while (!*flag)
    g_cond_wait (&g->changed, &g->lock);
  g_mutex_unlock (&g->lock);
}

static GepardEnginePool *
two_engines (GepardEngine **a, GepardEngine **b)
{
  g_autoptr (GError) error = NULL;
  *a = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  *b = gepard_engine_new (model_dir, "cpu", NULL, &error);
  g_assert_no_error (error);
  GepardEngine *engines[] = {*a, *b};
  return gepard_engine_pool_new (engines, 2);
}

static void
test_burst_is_spread (void)
{
  GepardEngine *a, *b;
  g_autoptr (GepardEnginePool) pool = two_engines (&a, &b);
  g_assert_cmpuint (gepard_engine_pool_get_size (pool), ==, 2);
  g_assert_true (gepard_engine_pool_get (pool, 0) == a && gepard_engine_pool_get (pool, 1) == b);
  int on_a = 0;
  for (int i = 0; i < 10; i++) /* idle engines: nothing to tell them apart but the turn */
    on_a += gepard_engine_pool_pick (pool, NULL) == a;
  g_assert_cmpint (on_a, ==, 5);
  gepard_engine_unref (a);
  gepard_engine_unref (b);
}

static void
test_less_loaded_engine_is_picked (void)
{
  GepardEngine *a, *b;
  g_autoptr (GepardEnginePool) pool = two_engines (&a, &b);
  GepardSampling sampling;
  gepard_sampling_init_default (&sampling);
  sampling.ignore_stop = TRUE;
  sampling.max_frames = 4;
  gint32 text[] = {30, 41, 52};
  Gate gate = {0};
  g_mutex_init (&gate.lock);
  g_cond_init (&gate.changed);
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardUtterance) u
      = gepard_engine_submit (a, text, 3, NULL, 0, &sampling, &gate_callbacks, &gate, NULL, &error);
  g_assert_no_error (error);
  gate_wait (&gate, &gate.blocked);

  GepardEngineStats stats;
  gepard_engine_pool_get_stats (pool, &stats);
  g_assert_cmpuint (stats.running, ==, 1);
  for (int i = 0; i < 6; i++)
    {
      const char *device = NULL;
      g_assert_true (gepard_engine_pool_pick (pool, &device) == b);
      g_assert_cmpstr (device, ==, "cpu");
    }

  g_mutex_lock (&gate.lock);
  gate.open = TRUE;
  g_cond_broadcast (&gate.changed);
  g_mutex_unlock (&gate.lock);
  gate_wait (&gate, &gate.done);
  /* the engine counts the frames and the utterance just after `done` */
  for (int i = 0; i < 500; i++)
    {
      gepard_engine_pool_get_stats (pool, &stats);
      if (stats.utterances == 1)
        break;
      g_usleep (10000);
    }
  g_assert_cmpuint (stats.utterances, ==, 1);
  g_assert_cmpuint (stats.frames, ==, 4);
  g_assert_cmpuint (stats.running, ==, 0);

  g_mutex_clear (&gate.lock);
  g_cond_clear (&gate.changed);
  gepard_engine_unref (a);
  gepard_engine_unref (b);
}

static void
test_voices_are_in_every_engine (void)
{
  GepardEngine *a, *b;
  g_autoptr (GepardEnginePool) pool = two_engines (&a, &b);
  int hidden = gepard_engine_pool_get_config (pool)->hidden_size;
  g_autofree float *prefix = g_new0 (float, 8 * hidden);
  g_autoptr (GepardVoice) voice = gepard_voice_new ("anna", prefix, 8, hidden);

  gepard_engine_pool_add_voice (pool, voice);
  for (guint i = 0; i < 2; i++)
    {
      g_autoptr (GepardVoice) found
          = gepard_engine_lookup_voice (gepard_engine_pool_get (pool, i), "anna");
      g_assert_true (found == voice);
    }
  g_autoptr (GepardVoice) found = gepard_engine_pool_lookup_voice (pool, "anna");
  g_assert_true (found == voice);

  g_assert_true (gepard_engine_pool_remove_voice (pool, "anna"));
  g_assert_false (gepard_engine_pool_remove_voice (pool, "anna"));
  g_assert_false (gepard_engine_pool_remove_voice (pool, "default"));
  for (guint i = 0; i < 2; i++)
    {
      GepardEngine *engine = gepard_engine_pool_get (pool, i);
      g_assert_null (gepard_engine_lookup_voice (engine, "anna"));
      g_autoptr (GepardVoice) builtin = gepard_engine_lookup_voice (engine, "default");
      g_assert_nonnull (builtin);
    }
  gepard_engine_unref (a);
  gepard_engine_unref (b);
}

int
main (int argc, char **argv)
{
  g_test_init (&argc, &argv, NULL);
  work_dir = g_dir_make_tmp ("gepard-engine-pool-XXXXXX", NULL);
  model_dir = g_build_filename (work_dir, "tiny", NULL);
  gepard_test_make_model ("--preset tiny --seed 5", model_dir);

  g_test_add_func ("/engine-pool/burst-is-spread", test_burst_is_spread);
  g_test_add_func ("/engine-pool/less-loaded-engine-is-picked", test_less_loaded_engine_is_picked);
  g_test_add_func ("/engine-pool/voices-are-in-every-engine", test_voices_are_in_every_engine);
  int result = g_test_run ();

  g_autofree char *rm = g_strdup_printf ("rm -rf '%s'", work_dir);
  (void)!system (rm);
  g_free (model_dir);
  g_free (work_dir);
  return result;
}
