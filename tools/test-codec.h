/* test-codec.h: NanoCodec checkpoints with seeded random weights, for tests.
 *
 * The checkpoint has the geometry of a GepardCodecConfig (nanocodec.md §5, Appendix A) and the
 * file layout of the published model: a .nemo archive (model_config.yaml + torch.save zip,
 * including a few discriminator / loss tensors that readers must skip), or a safetensors export of
 * the codec tensors under the same names with weight norm kept as stored (g, v) and metadata
 * {"format": "nemo-codec", "model_config.yaml": <yaml>}.
 *
 * Weights are a pure function of (seed, tensor name): the same seed gives byte-identical files,
 * both formats hold identical codec tensors, and the decoder built on them produces bounded,
 * non-trivial audio (effective conv weights W = g·v/‖v‖ with g chosen per layer to keep the
 * signal's scale, Snake alphas near 1, small biases). */
#pragma once

#include "gepard-codec-config.h"

G_BEGIN_DECLS

typedef enum
{
  GEPARD_TEST_CODEC_FORMAT_NEMO,
  GEPARD_TEST_CODEC_FORMAT_SAFETENSORS,
} GepardTestCodecFormat;

gboolean gepard_test_codec_write (const char *path, const GepardCodecConfig *config, guint64 seed,
                                  GepardTestCodecFormat format, GError **error);

/* `preset`: "tiny" or "nanocodec-22khz"; `format`: "nemo" or "safetensors". */
gboolean gepard_test_codec_write_preset (const char *path, const char *preset, guint64 seed,
                                         const char *format, GError **error);

G_END_DECLS
