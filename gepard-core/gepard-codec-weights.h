/* gepard-codec-weights.h: the weights of a NanoCodec checkpoint, ready for the codec.
 *
 * Reads the published .nemo archive natively (tar → torch.save zip → pickle, nanocodec.md §5) or
 * a safetensors export of the same tensors, checks every tensor against the geometry its
 * model_config.yaml implies (gepard_codec_config_foreach_tensor) and folds weight norm once at
 * load (nanocodec.md §2.4). Everything handed out is fp32 owned by the GepardCodecWeights; the
 * file is not kept open. */
#pragma once

#include "gepard-codec-config.h"

G_BEGIN_DECLS

typedef struct _GepardCodecWeights GepardCodecWeights;

/* A NanoCodec checkpoint: `path` is a .nemo archive (model_config.yaml + model_weights.ckpt) or a
 * safetensors export (tensors under the checkpoint's names, "model_config.yaml" in __metadata__).
 */
GepardCodecWeights *gepard_codec_weights_open (const char *path, GError **error);
void gepard_codec_weights_free (GepardCodecWeights *weights);

/* the hyperparameters read from model_config.yaml, validated (gepard_codec_config_validate) */
const GepardCodecConfig *gepard_codec_weights_get_config (const GepardCodecWeights *weights);

/* fp32 data of a codec tensor by checkpoint name, NULL if absent. Convolutions are available
 * under "<conv>.weight" with weight norm folded (nanocodec.md §2.4: W = v·g/‖v‖ over all dims but
 * 0, no epsilon; fold in double, store fp32) — the original0/original1 pair is not exposed; biases,
 * Snake alphas and FSQ buffers (as float) under their own names. `shape` gets the dims
 * (GEPARD_TENSOR_MAX_DIMS room), `n_dims` their count. */
const float *gepard_codec_weights_get (const GepardCodecWeights *weights, const char *name,
                                       guint *n_dims, gint64 *shape);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardCodecWeights, gepard_codec_weights_free)

G_END_DECLS
