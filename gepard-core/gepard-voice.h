/* gepard-voice.h: speaker prefixes (gepard-model.md §3.2, §3.7) and the engine's voice registry.
 *
 * A voice is an immutable speaker prefix [rows, H] in fp32 (bf16 values): the compressor's output
 * for a reference clip. The default voice has no prefix at all (K = 0, §3.2). A prefix file is the
 * raw little-endian fp32 array [rows][H], row-major, nothing else (8 × 1024 × 4 = 32,768 bytes for
 * GEPARD, §3.7). */
#pragma once

#include "gepard-engine.h"

G_BEGIN_DECLS

typedef struct _GepardVoice GepardVoice;

/* copies `prefix` [n_rows, hidden] */
GepardVoice *gepard_voice_new (const char *id, const float *prefix, int n_rows, int hidden);
GepardVoice *gepard_voice_ref (GepardVoice *voice);
void gepard_voice_unref (GepardVoice *voice);
const char *gepard_voice_get_id (const GepardVoice *voice);
/* the prefix rows; *n_rows is 0 for the default voice */
const float *gepard_voice_get_prefix (const GepardVoice *voice, int *n_rows);

/* A prefix file for `config` (rows = compressor queries, width = hidden size): the size must match
 * exactly and every value be finite. */
GepardVoice *gepard_voice_load_prefix_file (const char *path, const GepardModelConfig *config,
                                            GError **error);
gboolean gepard_voice_save_prefix_file (const GepardVoice *voice, const char *path, GError **error);

/* Bytes of a prefix file for `config`: queries × hidden × 4; 0 for a model without cloning.
 * Values are rounded to bf16 as they are read (§3.7), so a file written from a voice reads back
 * bit-exact. */
gsize gepard_voice_get_prefix_file_size (const GepardModelConfig *config);
/* The prefix file's bytes in memory (a voice store keeps them as they are). The default voice has
 * no prefix: GEPARD_FORMAT_ERROR_UNSUPPORTED. */
GBytes *gepard_voice_to_prefix_bytes (const GepardVoice *voice, GError **error);
/* A voice `id` from a prefix file's bytes, checked as gepard_voice_load_prefix_file checks. */
GepardVoice *gepard_voice_new_from_prefix_bytes (const char *id, GBytes *bytes,
                                                 const GepardModelConfig *config, GError **error);

/* Clone a voice from mono 22050 Hz samples: codec encoder + FSQ → codes → compressor. Needs the
 * engine's codec; clips shorter than one frame are refused. */
GepardVoice *gepard_voice_new_from_audio (GepardEngine *engine, const char *id,
                                          const float *samples, gsize n_samples, GError **error);

/* The engine's voices by id (read-through: the server registers what it loads from its store).
 * "default" is always there and has no prefix. */
void gepard_engine_add_voice (GepardEngine *engine, GepardVoice *voice);
/* a new reference, or NULL */
GepardVoice *gepard_engine_lookup_voice (GepardEngine *engine, const char *id);
gboolean gepard_engine_remove_voice (GepardEngine *engine, const char *id);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardVoice, gepard_voice_unref)

G_END_DECLS
