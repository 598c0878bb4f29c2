/* gepard-engine.h: one engine per model and device, shared by every stream in the process.
 *
 * The engine owns the immutable weights, the tokenizer and the codec, and a scheduler thread that
 * runs continuous batching: each iteration it admits waiting utterances (their prefill, under a
 * token budget), runs one batched forward for every running sequence plus the admitted prefills,
 * samples each sequence's next frame and hands it to the utterance's callback. A cancelled or
 * finished utterance leaves at the next iteration and frees its cache. */
#pragma once

#include "gepard-backend.h"
#include "gepard-checkpoint.h"
#include "gepard-codec.h"
#include "gepard-generate.h"
#include "gepard-model.h"

#include <glib-object.h>

G_BEGIN_DECLS

#define GEPARD_ENGINE_ERROR (gepard_engine_error_quark ())
GQuark gepard_engine_error_quark (void);

typedef enum
{
  GEPARD_ENGINE_ERROR_INVALID_INPUT, /* ids outside the vocabulary, empty text, bad sampling */
  GEPARD_ENGINE_ERROR_UNSUPPORTED,   /* a request the engine does not serve */
  GEPARD_ENGINE_ERROR_SHUTDOWN,      /* the engine is stopping */
  GEPARD_ENGINE_ERROR_BUSY,          /* no room for another utterance */
  GEPARD_ENGINE_ERROR_FAULT, /* a fault injected on purpose (GEPARD_FAULT_FAIL_STREAM_TEXT) */
} GepardEngineError;

typedef struct
{
  int max_batch;      /* sequences in one step; default 0: what the backend takes (64 on the CPU,
                         GEPARD_GPU_MAX_SEQUENCES on a GPU) */
  int prefill_budget; /* prefill tokens admitted per iteration; default 2048 (a longer utterance is
                         admitted alone) */
  int max_waiting;    /* utterances queued before submit answers BUSY; default 4096 */
  int decode_alongside; /* 1: the codec pass over the frames already made runs on a second thread
                           while the next step runs; 0: after it, on the scheduler thread;
                           default -1: what the backend prefers (alongside on a GPU), or
                           GEPARD_DECODE_ALONGSIDE's 0 or 1 where it is set */
  int decode_lead;      /* alongside: the steps that may run while one codec pass is in flight
                           before the scheduler waits for it (1: each step waits for the pass
                           beside it); default GEPARD_DECODE_LEAD, else 8 */
} GepardEngineOptions;

void gepard_engine_options_init (GepardEngineOptions *options);

typedef struct _GepardEngine GepardEngine;

/* A boxed type (ref/unref), so that an engine can travel in a GValue, e.g. inside a GstContext
 * (gstgepardcontext.h). */
#define GEPARD_TYPE_ENGINE (gepard_engine_get_type ())
GType gepard_engine_get_type (void);

/* Loads `model` (a directory or a cached repo id, gepard-hub.h) with its codec when one is there,
 * on `device` ("auto", "cpu", "cuda", "cuda:N"), and starts the scheduler.
 *
 * Fault injection, for tests of what serves the engine: when the environment variable
 * GEPARD_FAULT_FAIL_STREAM_TEXT is set (read once, here), every utterance whose text (its ids
 * decoded) contains that string fails at its first step with GEPARD_ENGINE_ERROR_FAULT, exactly as
 * a failing backend step would fail it; the other utterances of the step go on. */
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
/* the checkpoint directory the engine loaded (a repo id resolved to its snapshot) */
const char *gepard_engine_get_model_dir (const GepardEngine *engine);
/* Whether `model` (a directory or a cached repo id) names the checkpoint the engine loaded. */
gboolean gepard_engine_serves_model (const GepardEngine *engine, const char *model);
/* the device it runs on (kind, index and description) */
const GepardDeviceInfo *gepard_engine_get_device (const GepardEngine *engine);
/* "CPU (2 threads)" and the like */
const char *gepard_engine_get_device_description (const GepardEngine *engine);
/* TRUE for untrained models written by gepard-make-test-model */
gboolean gepard_engine_is_test_model (const GepardEngine *engine);
/* The text-CFG scale (gepard-model.md §3.4) the model is meant to be spoken with: its
 * model.safetensors metadata "gepard.cfg_scale" (written by tools/voice/lm.py export for a model
 * trained with the empty text), else 1, off, as for the published GEPARD models; a model naming
 * one that is no number from 0 to 100 does not load (GEPARD_FORMAT_ERROR_CORRUPT). Callers use it
 * where their user asks for no scale of their own. */
float gepard_engine_get_cfg_scale (const GepardEngine *engine);

typedef struct
{
  guint running;      /* sequences generating now (0 when idle) */
  guint waiting;      /* utterances not yet admitted */
  guint64 steps;      /* forwards run */
  guint64 frames;     /* frames produced */
  guint64 utterances; /* utterances ended, any way */

  /* the codec service */
  guint64 decode_batches;           /* batched decodes run */
  guint64 decoded_frames;           /* frames decoded, all streams */
  guint largest_decode_batch;       /* most streams in one batched decode so far */
  guint64 decode_batches_alongside; /* of the batched decodes, those run beside a step */
} GepardEngineStats;

void gepard_engine_get_stats (GepardEngine *engine, GepardEngineStats *stats);

typedef enum
{
  GEPARD_UTTERANCE_STOPPED,    /* the stop head ended it (gepard-model.md §3.4) */
  GEPARD_UTTERANCE_MAX_FRAMES, /* it reached max_frames */
  GEPARD_UTTERANCE_CANCELLED,  /* gepard_utterance_cancel, or the engine stopped */
  GEPARD_UTTERANCE_FAILED, /* the engine could not go on (gepard_utterance_get_error says why) */
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
/* Why a FAILED utterance failed; NULL otherwise. Set before `done` runs, read after it. */
const GError *gepard_utterance_get_error (GepardUtterance *utterance);
GepardUtterance *gepard_utterance_ref (GepardUtterance *utterance);
void gepard_utterance_unref (GepardUtterance *utterance);

/* ---- the codec service ----
 *
 * Streams decode their frames through the engine rather than each on its own thread: a call
 * queues the frames and waits; each scheduler iteration decodes every stream's queued frames in
 * one batched pass (gepard-compute.h), so the codec's weights are read once per iteration for all
 * streams. On the CPU the audio is bit for bit what a stream decoding alone gives (nanocodec.md
 * §6.1); on the GPU it agrees with that within the tolerance gepard-cuda-check states (its
 * reductions are grouped by the batch's size). */
typedef struct _GepardAudioDecoder GepardAudioDecoder;

/* One stream's decoder (its causal state lives with the backend); holds an engine reference.
 * Fails with GEPARD_FORMAT_ERROR_MISSING when the model carries no codec. */
GepardAudioDecoder *gepard_engine_new_audio_decoder (GepardEngine *engine, GError **error);
void gepard_audio_decoder_free (GepardAudioDecoder *decoder);
/* The next frame starts a new utterance: the causal state goes back to zero. */
void gepard_audio_decoder_reset (GepardAudioDecoder *decoder);
/* the codec (its configuration: samples per frame, levels) */
GepardCodec *gepard_audio_decoder_get_codec (GepardAudioDecoder *decoder);
/* Decodes n_frames frames of 32 channel codes into n_frames × samples_per_frame samples, blocking
 * until the engine's next iteration has done it. A code outside its level fails at once and
 * leaves the stream as it was. Calls on one decoder must not overlap. */
gboolean gepard_audio_decoder_decode (GepardAudioDecoder *decoder, const gint32 *codes,
                                      int n_frames, float *samples, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardEngine, gepard_engine_unref)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardAudioDecoder, gepard_audio_decoder_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardUtterance, gepard_utterance_unref)

G_END_DECLS
