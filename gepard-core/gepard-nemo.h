/* gepard-nemo.h: NeMo .nemo archives, read natively.
 *
 * A .nemo (nanocodec.md §5) is a tar (gzip-compressed in old files) holding model_config.yaml and
 * model_weights.ckpt, the latter a torch.save checkpoint: a zip of stored entries under one
 * folder — data.pkl (a pickle of the state dict), data/<key> (raw little-endian storages),
 * byteorder, version. The archive is mapped and read in place: tensors point into the mapping,
 * nothing is copied. Every size and offset is checked before a byte is touched; a malformed file
 * is GEPARD_FORMAT_ERROR_CORRUPT, a valid one using something outside the subset torch.save and
 * NeMo write is GEPARD_FORMAT_ERROR_UNSUPPORTED, an absent member is GEPARD_FORMAT_ERROR_MISSING.
 */
#pragma once

#include "gepard-codec-config.h"

G_BEGIN_DECLS

/* One tensor of the state dict. `tensor.data` points into the archive's mapping (any alignment)
 * and lives as long as the GepardNemo. */
typedef struct
{
  GepardTensor tensor;
  /* the torch storage class it was pickled with ("FloatStorage", …) */
  const char *storage_type;
  /* FALSE for storages GepardDType has no name for (DoubleStorage): tensor.dtype is then
   * meaningless, though shape, n_bytes and data are right */
  gboolean has_dtype;
} GepardNemoTensor;

typedef struct _GepardNemo GepardNemo;

/* Opens `path` and resolves the tensors whose names start with one of `prefixes`
 * (NULL-terminated; NULL keeps every tensor). Other entries of the state dict are parsed but
 * neither checked against their storages nor kept. */
GepardNemo *gepard_nemo_open (const char *path, const char *const *prefixes, GError **error);
void gepard_nemo_free (GepardNemo *nemo);

/* model_config.yaml as stored (not NUL-terminated inside the mapping: use `len`) */
const char *gepard_nemo_get_config_yaml (const GepardNemo *nemo, gsize *len);
/* the kept tensors, in state-dict order */
guint gepard_nemo_get_n_tensors (const GepardNemo *nemo);
const GepardNemoTensor *gepard_nemo_get_nth (const GepardNemo *nemo, guint index);
const GepardNemoTensor *gepard_nemo_lookup (const GepardNemo *nemo, const char *name);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardNemo, gepard_nemo_free)

/* Reads the codec hyperparameters from an AudioCodecModel's model_config.yaml (nanocodec.md §1–§4):
 * sample_rate, samples_per_frame and the audio_encoder / vector_quantizer / audio_decoder
 * constructor arguments with their `_target_` classes; training sections are ignored. Arguments
 * the class would default are filled with NeMo's defaults where nanocodec.md gives them and are
 * required otherwise. A class or argument value GepardCodecConfig cannot express is
 * GEPARD_FORMAT_ERROR_UNSUPPORTED; the result is validated with gepard_codec_config_validate. */
gboolean gepard_nemo_parse_codec_config (const char *yaml, gsize len, GepardCodecConfig *config,
                                         GError **error);

G_END_DECLS
