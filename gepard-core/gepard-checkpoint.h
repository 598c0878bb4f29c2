/* gepard-checkpoint.h: a GEPARD checkpoint directory (gepard-model.md §2.4): config.json,
 * gepard_config.json, model.safetensors (or shards listed in model.safetensors.index.json) and
 * tokenizer.json, optionally with its codec beside it (codec.nemo or codec.safetensors).
 *
 * Opening validates the whole checkpoint: every tensor the model needs is present with the shape
 * the configs imply (gepard-model.md §2.3); every problem is reported by name in one GError. */
#pragma once

#include "gepard-safetensors.h"
#include "gepard-tokenizer.h"

G_BEGIN_DECLS

#define GEPARD_MAX_AUDIO_HEADS 64

typedef struct
{
  /* backbone (gepard_config.json backbone_config, or config.json) */
  int hidden_size;
  int n_layers;
  int n_q_heads;
  int n_kv_heads;
  int head_dim;
  int intermediate_size;
  int vocab_size; /* embedding rows */
  double rms_norm_eps;
  double rope_theta;
  double partial_rotary_factor; /* the nested rope_parameters value, the one transformers 5 reads */

  /* overlay */
  int n_audio_heads;                       /* 32 */
  int head_levels[GEPARD_MAX_AUDIO_HEADS]; /* audio_heads in file order: 8,7,6,6,… */
  int audio_embed_dim;                     /* 32 */

  /* special token ids (gepard_config.json special_tokens, fallback gepard-model.md §2.4) */
  int tokenizer_length;
  int start_of_text;
  int end_of_text;
  int start_of_speech;
  int end_of_speech;
  int tts_pad;

  /* text repetition (gepard-model.md §3.1) */
  gboolean repetition_enabled;
  int repetition_target_tokens;
  int repetition_apply_below;
  int repetition_max_repeats;

  /* voice cloning compressor (gepard-model.md §3.6) */
  gboolean voice_cloning;
  int compressor_queries;
  int compressor_layers;
  int compressor_heads;
  int compressor_ffn_hidden;

  /* codec geometry */
  int codec_codebooks; /* 8 */
  int codec_fsq_levels[4];
  double frame_rate_hz; /* 21.5 nominal */

  char *model_dtype; /* "bfloat16" */
} GepardModelConfig;

typedef struct _GepardCheckpoint GepardCheckpoint;

/* `model`: a directory or a repo id in the local HF cache (gepard-hub.h). */
GepardCheckpoint *gepard_checkpoint_open (const char *model, GError **error);
void gepard_checkpoint_free (GepardCheckpoint *checkpoint);

/* the resolved directory */
const char *gepard_checkpoint_get_dir (const GepardCheckpoint *checkpoint);
const GepardModelConfig *gepard_checkpoint_get_config (const GepardCheckpoint *checkpoint);
GepardTokenizer *gepard_checkpoint_get_tokenizer (const GepardCheckpoint *checkpoint);
guint gepard_checkpoint_get_n_tensors (const GepardCheckpoint *checkpoint);
/* NULL when absent; a name may live in any shard */
const GepardTensor *gepard_checkpoint_lookup (const GepardCheckpoint *checkpoint, const char *name);
/* Total bytes of tensor data over all shards. */
guint64 gepard_checkpoint_get_n_bytes (const GepardCheckpoint *checkpoint);
/* A "__metadata__" entry of the first weight file, or NULL ("gepard.test_model" marks the
 * untrained models gepard-make-test-model writes). */
const char *gepard_checkpoint_get_metadata (const GepardCheckpoint *checkpoint, const char *key);
/* The codec carried beside the model (codec.nemo, else codec.safetensors), or NULL. */
const char *gepard_checkpoint_get_codec_path (const GepardCheckpoint *checkpoint);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardCheckpoint, gepard_checkpoint_free)

G_END_DECLS
