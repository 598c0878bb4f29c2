/* gepard-cuda.h: the entry points of the CUDA backend module (libgepard-cuda.so), looked up by
 * name with GModule. Plain C types only: the module has no GLib dependency.
 *
 * Numbers are 0 for success and -1 for failure, with the reason written to `message` (at most
 * `message_len` bytes, NUL-terminated). */
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C"
{
#endif

#define GEPARD_CUDA_ABI_VERSION 4

  typedef int (*GepardCudaAbiVersionFunc) (void);
  /* Number of usable GPUs in *n_devices and 0, or -1 with the reason in `message`. */
  typedef int (*GepardCudaProbeFunc) (int *n_devices, char *message, size_t message_len);
  /* "NVIDIA H200, 139.8 GiB, sm_90" into `description`; 0, or -1 with the reason. */
  typedef int (*GepardCudaDescribeFunc) (int device, char *description, size_t description_len);

  /* ---- the LM on the GPU ---- */

  typedef enum
  {
    GEPARD_CUDA_DTYPE_F32,
    GEPARD_CUDA_DTYPE_BF16,
    GEPARD_CUDA_DTYPE_F16,
  } GepardCudaDType;

  /* A checkpoint tensor in host memory, row-major. */
  typedef struct
  {
    GepardCudaDType dtype;
    int n_dims;
    int64_t shape[4];
    const void *data;
  } GepardCudaTensor;

  /* Looks up a checkpoint tensor by its state-dict name (gepard-model.md §2.3). Returns 0 and
   * fills `tensor`, whose data must stay valid until the next call; -1 when absent. */
  typedef int (*GepardCudaTensorLookup) (void *user_data, const char *name,
                                         GepardCudaTensor *tensor);

  typedef struct
  {
    /* backbone (gepard-model.md §1.1) */
    int hidden_size;
    int n_layers;
    int n_q_heads;
    int n_kv_heads;
    int head_dim;
    int intermediate_size;
    int vocab_size;
    float rms_norm_eps;
    /* §1.5: the rotated dims and the bf16-rounded cos and sin the CPU reference uses, computed
     * on the host so both backends share them bit for bit: rope_table[p][0][j] = cos,
     * rope_table[p][1][j] = sin for positions p < max_context, j < rotary_dim / 2 */
    int rotary_dim;
    const float *rope_table;

    /* overlay (§3.4, §3.5) */
    int n_audio_heads;
    const int *head_levels; /* [n_audio_heads] */
    int audio_embed_dim;

    /* capacity */
    int max_context;   /* positions per sequence */
    int max_sequences; /* sequences alive at once */
    /* bytes for the paged KV cache; 0 takes memory_fraction of the device's memory, less what
     * is in use once the weights are loaded */
    size_t kv_cache_bytes;
    double memory_fraction;
  } GepardCudaModelConfig;

  typedef struct
  {
    size_t weight_bytes;
    size_t kv_cache_bytes;
    int kv_block_tokens; /* positions per KV block */
    int kv_blocks;
    int max_context;
    int max_sequences;
    char device[256];
  } GepardCudaModelInfo;

  typedef struct
  {
    float temperature; /* 0 or less: greedy argmax */
    int top_k;
    float repetition_penalty;
    uint64_t seed;
  } GepardCudaSampling;

  /* One sequence's part of a step: a prefill (prefix rows [n_prefix, H] fp32, then text ids) or
   * one fed-back frame (`codes`, n_audio_heads channel codes). */
  typedef struct
  {
    int sequence;
    const float *prefix;
    int n_prefix;
    const int32_t *ids;
    int n_ids;
    const int32_t *codes; /* NULL on a prefill */
    /* text-CFG (gepard-model.md §3.4): the next frame is sampled from u + cfg_scale·(c − u), u
     * the logits of the next input (this sequence's unconditional branch) */
    int guided;
    float cfg_scale;
  } GepardCudaStepInput;

  typedef struct _GepardCudaModel GepardCudaModel;

  /* Uploads the weights (as bf16) to GPU `device` and allocates the KV cache and work buffers. */
  typedef int (*GepardCudaModelNewFunc) (int device, const GepardCudaModelConfig *config,
                                         GepardCudaTensorLookup lookup, void *user_data,
                                         GepardCudaModel **model, char *message,
                                         size_t message_len);
  typedef void (*GepardCudaModelFreeFunc) (GepardCudaModel *model);
  typedef void (*GepardCudaModelInfoFunc) (GepardCudaModel *model, GepardCudaModelInfo *info);

  /* A sequence slot with an empty cache and a seeded sampler; its number in *sequence. Sequence
   * calls may come from any thread; steps from one thread at a time. */
  typedef int (*GepardCudaSequenceNewFunc) (GepardCudaModel *model,
                                            const GepardCudaSampling *sampling, int *sequence,
                                            char *message, size_t message_len);
  /* Frees the slot and its KV blocks; the sequence must not be in a step. */
  typedef void (*GepardCudaSequenceFreeFunc) (GepardCudaModel *model, int sequence);

  /* One forward over all inputs (each sequence at most once), then for input i: the stop logit
   * of its last position in stop_logits[i] and the next frame sampled on the device in
   * codes[i · n_audio_heads …]. `logits` (may be NULL) receives the heads' logits [n][n_logits]
   * before sampling. On failure no sequence has moved. */
  typedef int (*GepardCudaStepFunc) (GepardCudaModel *model, const GepardCudaStepInput *inputs,
                                     int n, int32_t *codes, float *stop_logits, float *logits,
                                     char *message, size_t message_len);

  /* ---- the codec's decoder on the GPU (nanocodec.md §2, §6.1) ---- */

  typedef struct
  {
    int latent_dim;
    int samples_per_frame;
    int base_channels;
    int n_stages;
    int up_sample_rates[8];
    int in_kernel_size;
    int out_kernel_size;
    int n_kernels;
    int kernels[4];
    int n_dilations;
    int dilations[4];
    int half_snake;  /* 1: HalfSnake activations, 0: LeakyReLU (0.01) everywhere */
    int output_tanh; /* 1: tanh at the output, 0: clamp(−1, 1) */
    int max_streams; /* streams alive at once */
  } GepardCudaCodecConfig;

  typedef struct
  {
    size_t weight_bytes;
    size_t state_bytes; /* causal state of one stream */
    size_t work_bytes;  /* state of every stream and the batch buffers */
    int max_streams;
    int tensor_cores; /* 1 own TF32 kernel, 2 cuBLAS (TF32), 3 own fp16 kernel, 0 when
                         GEPARD_CUDA_CODEC_PEDANTIC=1 sums in plain fp32 */
    int graphs;       /* 1 while passes run as captured CUDA graphs; 0 with GEPARD_CUDA_GRAPHS=0 or
                         once a capture has failed */
  } GepardCudaCodecInfo;

  typedef struct _GepardCudaCodec GepardCudaCodec;

  /* Uploads the decoder's weights (fp32 with weight norm folded, as the lookup gives them under
   * "<conv>.weight") and allocates the state of max_streams streams and the batch buffers. */
  typedef int (*GepardCudaCodecNewFunc) (int device, const GepardCudaCodecConfig *config,
                                         GepardCudaTensorLookup lookup, void *user_data,
                                         GepardCudaCodec **codec, char *message,
                                         size_t message_len);
  typedef void (*GepardCudaCodecFreeFunc) (GepardCudaCodec *codec);
  typedef void (*GepardCudaCodecInfoFunc) (GepardCudaCodec *codec, GepardCudaCodecInfo *info);
  /* a stream slot whose state is zero; any thread */
  typedef int (*GepardCudaCodecStreamNewFunc) (GepardCudaCodec *codec, int *stream, char *message,
                                               size_t message_len);
  typedef void (*GepardCudaCodecStreamFreeFunc) (GepardCudaCodec *codec, int stream);
  /* back to a zero state before the stream's next frame */
  typedef void (*GepardCudaCodecStreamResetFunc) (GepardCudaCodec *codec, int stream);
  /* `frames` frames for each of n distinct streams, in batched passes of up to 8 frames of every
   * stream: latent [n][frames][latent_dim] (the dequantized codes) → samples[i] (frames ×
   * samples_per_frame floats each, host memory). */
  typedef int (*GepardCudaCodecDecodeFunc) (GepardCudaCodec *codec, const int *streams,
                                            const float *latent, int n, int frames,
                                            float *const *samples, char *message,
                                            size_t message_len);

#ifdef __cplusplus
}
#endif
