/* gepard-engine.h: one engine per model and device, shared by every stream in the process.
 *
 * The engine owns the immutable weights, the tokenizer and the codec, and a scheduler thread that
 * runs continuous batching: each iteration it admits waiting utterances (their prefill, under a
 * token budget), runs one batched forward for every running sequence plus the admitted prefills,
 * samples each sequence's next frame and hands it to the utterance's callback. A cancelled or
 * finished utterance leaves at the next iteration and frees its cache. */
#pragma once

#include "gepard-checkpoint.h"
#include "gepard-codec.h"
#include "gepard-generate.h"
#include "gepard-model.h"

G_BEGIN_DECLS

#define GEPARD_ENGINE_ERROR (gepard_engine_error_quark ())
GQuark gepard_engine_error_quark (void);

typedef enum
{
  GEPARD_ENGINE_ERROR_INVALID_INPUT, /* ids outside the vocabulary, empty text, bad sampling */
  GEPARD_ENGINE_ERROR_UNSUPPORTED,   /* a request the engine does not serve */
  GEPARD_ENGINE_ERROR_SHUTDOWN,      /* the engine is stopping */
  GEPARD_ENGINE_ERROR_BUSY,          /* no room for another utterance */
} GepardEngineError;

typedef struct
{
  int max_batch;      /* sequences in one step; default 64 */
  int prefill_budget; /* prefill tokens admitted per iteration; default 2048 (a longer utterance is
                         admitted alone) */
  int max_waiting;    /* utterances queued before submit answers BUSY; default 4096 */
} GepardEngineOptions;

void gepard_engine_options_init (GepardEngineOptions *options);

typedef struct _GepardEngine GepardEngine;

/* Loads `model` (a directory or a cached repo id, gepard-hub.h) with its codec when one is there,
 * on `device` ("auto", "cpu", "cuda", "cuda:N"), and starts the scheduler. */
GepardEngine *gepard_engine_new (const char *model, const char *device,
                                 const GepardEngineOptions *options, GError **error);
/* The process-wide engine for (model, device): created on first use, shared while referenced. */
GepardEngine *gepard_engine_get_shared (const char *model, const char *device, GError **error);
/* How many shared engines (loaded models) the process holds now. */
guint gepard_engine_count_shared (void);
GepardEngine *gepard_engine_ref (GepardEngine *engine);
/* An engine runs while referenced; every utterance holds a reference until it is freed. The
 * last reference stops the scheduler and frees everything. */
void gepard_engine_unref (GepardEngine *engine);

const GepardModelConfig *gepard_engine_get_config (const GepardEngine *engine);
GepardTokenizer *gepard_engine_get_tokenizer (const GepardEngine *engine);
const GepardModel *gepard_engine_get_model (const GepardEngine *engine);
/* NULL when the model carries no codec and none is cached */
GepardCodec *gepard_engine_get_codec (const GepardEngine *engine);
/* "CPU (2 threads)" and the like */
const char *gepard_engine_get_device_description (const GepardEngine *engine);
/* TRUE for untrained models written by gepard-make-test-model */
gboolean gepard_engine_is_test_model (const GepardEngine *engine);

typedef struct
{
  guint running;      /* sequences in the last step */
  guint waiting;      /* utterances not yet admitted */
  guint64 steps;      /* forwards run */
  guint64 frames;     /* frames produced */
  guint64 utterances; /* utterances ended, any way */
} GepardEngineStats;

void gepard_engine_get_stats (GepardEngine *engine, GepardEngineStats *stats);

typedef enum
{
  GEPARD_UTTERANCE_STOPPED,    /* the stop head ended it (gepard-model.md §3.4) */
  GEPARD_UTTERANCE_MAX_FRAMES, /* it reached max_frames */
  GEPARD_UTTERANCE_CANCELLED,  /* gepard_utterance_cancel, or the engine stopped */
} GepardUtteranceEnd;

typedef struct _GepardUtterance GepardUtterance;

typedef struct
{
  /* each frame's 32 codes, as soon as sampled; on the scheduler thread: return quickly */
  void (*frame) (GepardUtterance *utterance, const gint32 *codes, int index, gpointer user_data);
  /* exactly once, after the last frame; on the scheduler thread (or the cancelling thread's
   * engine shutdown) */
  void (*done) (GepardUtterance *utterance, GepardUtteranceEnd end, int n_frames,
                gpointer user_data);
} GepardUtteranceCallbacks;

/* Queues an utterance of `text_ids` (tokenized text; the text-repetition layout is applied here,
 * gepard-model.md §3.1) after an optional speaker prefix [n_prefix, H]. `user_data` is released
 * with `destroy` after `done`. The returned reference is the caller's. */
GepardUtterance *gepard_engine_submit (GepardEngine *engine, const gint32 *text_ids, int n_ids,
                                       const float *prefix, int n_prefix,
                                       const GepardSampling *sampling,
                                       const GepardUtteranceCallbacks *callbacks,
                                       gpointer user_data, GDestroyNotify destroy, GError **error);
/* Ends the utterance at the next iteration: at most the frame being delivered right now follows,
 * then `done` with CANCELLED (unless it had already ended). Any thread, also from a callback. */
void gepard_utterance_cancel (GepardUtterance *utterance);
GepardUtterance *gepard_utterance_ref (GepardUtterance *utterance);
void gepard_utterance_unref (GepardUtterance *utterance);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardEngine, gepard_engine_unref)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardUtterance, gepard_utterance_unref)

G_END_DECLS
