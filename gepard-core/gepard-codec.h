/* gepard-codec.h: NanoCodec on the CPU — the causal decoder (codes → 22050 Hz samples, one-shot or
 * streamed frame by frame with bit-identical results) and the non-causal encoder (samples → codes,
 * for voice cloning). nanocodec.md is the contract: §2 decoder, §3 encoder, §4 GroupFSQ, §6.1
 * streaming state.
 *
 * A GepardCodec holds the immutable weights, packed once at load; any number of
 * GepardCodecStreams (one per utterance) share it, each with its own causal state. Calls on one
 * stream must not overlap; different streams may decode on different threads at once.
 *
 * Codes are Gepard's unfolded channels: frame t has latent_dim (32) codes, channel i belongs to
 * codebook i / 4, FSQ dimension i % 4, and holds a code in [0, L) with L = [8, 7, 6, 6][i % 4]
 * (gepard-model.md §3.6; nanocodec.md §4). gepard-fsq.h converts to and from NeMo's packed
 * per-codebook tokens. */
#pragma once

#include "gepard-codec-config.h"

G_BEGIN_DECLS

typedef struct _GepardCodec GepardCodec;

/* `path`: a .nemo archive or its safetensors export (gepard-codec-weights.h). */
GepardCodec *gepard_codec_new (const char *path, GError **error);
void gepard_codec_free (GepardCodec *codec);
const GepardCodecConfig *gepard_codec_get_config (const GepardCodec *codec);

/* Worker threads the convolutions may use (1 = the calling thread only). Defaults to
 * $GEPARD_CODEC_THREADS, else the number of processors (at most 16). Results do not depend on it.
 * Call before the codec is used. */
void gepard_codec_set_n_threads (GepardCodec *codec, int n_threads);
int gepard_codec_get_n_threads (const GepardCodec *codec);

/* One stream's causal decoder state (nanocodec.md §6.1), zero at start. Besides the state a stream
 * keeps working buffers sized for its largest call so far (at most 32 frames' worth), so that
 * frame-by-frame decoding allocates nothing. The codec must outlive its streams. */
typedef struct _GepardCodecStream GepardCodecStream;

GepardCodecStream *gepard_codec_stream_new (GepardCodec *codec);
void gepard_codec_stream_free (GepardCodecStream *stream);
/* back to the state of a new stream */
void gepard_codec_stream_reset (GepardCodecStream *stream);
/* Decodes n_frames ≥ 0 more frames ([n_frames][latent_dim] codes) into n_frames ×
 * samples_per_frame samples in [−1, 1]. Any split of a sequence into calls gives the same bits as
 * gepard_codec_decode on the whole of it. Codes out of range fail with GEPARD_FORMAT_ERROR_SHAPE
 * and leave the stream untouched. */
gboolean gepard_codec_stream_decode (GepardCodecStream *stream, const gint32 *codes, int n_frames,
                                     float *samples, GError **error);
/* Decodes n_frames[i] ≥ 0 more frames of codes[i] into samples[i] for each of n distinct streams
 * of one codec, taking all of them through the decoder layer by layer, so that the layers where a
 * stream has few columns (a frame-by-frame stream's first ones) read their weights once for the
 * whole batch. Gives exactly the bits of n separate gepard_codec_stream_decode calls. Every
 * request is checked first: on a bad one no stream moves and the error message starts with
 * "Stream i: ". codes[i] and samples[i] may be NULL where n_frames[i] is 0. The streams' working
 * buffers are used as in gepard_codec_stream_decode; the call also allocates a workspace for the
 * batched layers (at most about 16 MiB), freed before it returns. */
gboolean gepard_codec_decode_batch (GepardCodecStream *const *streams, const gint32 *const *codes,
                                    const int *n_frames, float *const *samples, int n,
                                    GError **error);
/* Bytes of causal state the stream carries between calls (186,816 floats for the published
 * codec). */
gsize gepard_codec_stream_state_bytes (const GepardCodecStream *stream);

/* Floats of causal decoder state a stream needs for `config` (nanocodec.md §6.1 table). */
gsize gepard_codec_stream_state_floats_for_config (const GepardCodecConfig *config);

/* One-shot decode: NeMo's forward pass, zero left padding at every causal conv (§2.3). Long inputs
 * run in blocks of 32 frames to bound memory, which changes no bit. */
gboolean gepard_codec_decode (GepardCodec *codec, const gint32 *codes, int n_frames, float *samples,
                              GError **error);

/* nanocodec.md §3.2–§3.4: mono samples at the codec's rate (22050 Hz), zero-padded at the end to
 * a multiple of samples_per_frame, through the non-causal encoder. Returns the raw latent before
 * FSQ as a GArray of float, [n_frames][latent_dim] with n_frames = ceil(n_samples /
 * samples_per_frame). Non-finite samples fail with GEPARD_FORMAT_ERROR_SHAPE. */
GArray *gepard_codec_encode_latent (GepardCodec *codec, const float *samples, gsize n_samples,
                                    GError **error);
/* gepard_codec_encode_latent followed by GroupFSQ (nanocodec.md §4): a GArray of gint32 codes,
 * [n_frames][latent_dim], unfolded as above. */
GArray *gepard_codec_encode (GepardCodec *codec, const float *samples, gsize n_samples,
                             GError **error);
/* Long clips are encoded in windows of this many frames plus the encoder's receptive field on
 * each side, which gives the same bits as one pass (nanocodec.md §6.2) in bounded memory. 0
 * restores the default. Call before the codec is used. */
void gepard_codec_set_encoder_window (GepardCodec *codec, int n_frames);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardCodec, gepard_codec_free)
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardCodecStream, gepard_codec_stream_free)

G_END_DECLS
