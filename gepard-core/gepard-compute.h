/* gepard-compute.h: what a backend computes for the engine, behind one small interface.
 *
 * The engine's scheduler (gepard-engine.c) decides what runs when; a backend only computes: one
 * batched LM step for every sequence that has work (prefills and single-frame decodes side by
 * side), sampling each sequence's next frame, and one batched codec decode for every audio stream
 * that has new frames. The CPU backend (gepard-compute-cpu.c) is the plain C reference; the CUDA
 * backend implements the same functions on the GPU, keeping KV caches, sampler state and codec
 * state on the device. All calls come from the engine's scheduler thread, except free functions,
 * which may come from any thread once the object is out of use.
 */
#pragma once

#include "gepard-backend.h"
#include "gepard-codec.h"
#include "gepard-generate.h"

G_BEGIN_DECLS

typedef struct _GepardCompute GepardCompute;
/* one utterance's LM state: its KV cache and its sampler (seeded RNG, repetition window) */
typedef struct _GepardSequence GepardSequence;
/* one stream's causal codec decoder state (nanocodec.md §6.1) */
typedef struct _GepardAudioStream GepardAudioStream;

/* One sequence's part of a step. Its first step is its prefill: the speaker prefix rows
 * [n_prefix, H] (may be 0) then the text layout ids (gepard-model.md §3.3), ending at SOS. Every
 * later step feeds back the frame sampled last (`codes`, 32 channel codes, §3.5). */
typedef struct
{
  GepardSequence *sequence;
  const float *prefix;
  int n_prefix;
  const gint32 *ids;
  int n_ids;
  const gint32 *codes; /* NULL on the prefill */
  /* text-CFG (§3.4): a guided input's next frame is sampled from u + cfg_scale·(c − u), c its own
   * logits and u those of inputs[k + 1], its unconditional branch (the empty text after the same
   * prefix, fed the same frames), which is marked `unconditional` and gets no frame of its own */
  gboolean guided;
  float cfg_scale;
  gboolean unconditional;
} GepardStepInput;

typedef struct
{
  GepardBackendKind kind;

  void (*free) (GepardCompute *compute);

  GepardSequence *(*sequence_new) (GepardCompute *compute, const GepardSampling *sampling,
                                   GError **error);
  void (*sequence_free) (GepardCompute *compute, GepardSequence *sequence);
  /* One forward over all inputs, then for each input i: the stop logit of its last position in
   * stop_logits[i] and the next frame sampled from its heads in codes[i·32 …] (sampled even when
   * the stop head fires; the engine decides, §3.4; none for an unconditional branch). Ids and
   * codes were checked by the caller. */
  gboolean (*step) (GepardCompute *compute, const GepardStepInput *inputs, int n, gint32 *codes,
                    float *stop_logits, GError **error);

  /* NULL with an error when the model carries no codec */
  GepardAudioStream *(*audio_stream_new) (GepardCompute *compute, GError **error);
  void (*audio_stream_free) (GepardCompute *compute, GepardAudioStream *stream);
  void (*audio_stream_reset) (GepardCompute *compute, GepardAudioStream *stream);
  /* Decodes n_frames[i] frames of codes[i] ([n][32]) for each of n streams, in batched passes
   * (the CPU's: one; the GPU's: passes of several frames of each stream), into samples[i]
   * (n_frames[i] × samples_per_frame floats, host memory). The CPU gives the same bits as decoding
   * each stream alone. A bad code fails before any stream moves. */
  gboolean (*decode_audio) (GepardCompute *compute, GepardAudioStream *const *streams,
                            const gint32 *const *codes, const int *n_frames, float *const *samples,
                            int n, GError **error);
} GepardComputeFuncs;

struct _GepardCompute
{
  const GepardComputeFuncs *funcs;
  int max_batch;     /* the most sequences one step takes */
  int default_batch; /* the engine's batch unless it is told otherwise */
  /* the engine decodes audio on a second thread while a step runs (the backend is safe for one
   * step and one decode_audio at once, and gains from it) unless told otherwise */
  gboolean decode_alongside;
  /* the step takes guided inputs (text-CFG) */
  gboolean text_cfg;
};

/* The CPU backend over a loaded model and its codec (may be NULL); both are borrowed and must
 * outlive it. */
GepardCompute *gepard_compute_cpu_new (const GepardModel *model, GepardCodec *codec);

/* The CUDA backend on GPU `device_index`, weights uploaded from `checkpoint` (`model` is the CPU
 * model of the same checkpoint, for what both share; `codec` may be NULL). Fails with
 * GEPARD_BACKEND_ERROR_UNAVAILABLE and the reason where it cannot run. */
GepardCompute *gepard_compute_cuda_new (const GepardCheckpoint *checkpoint,
                                        const GepardModel *model, GepardCodec *codec,
                                        int device_index, GError **error);

static inline void
gepard_compute_free (GepardCompute *compute)
{
  if (compute != NULL)
    compute->funcs->free (compute);
}

G_END_DECLS
