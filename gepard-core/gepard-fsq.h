/* gepard-fsq.h: NanoCodec's GroupFSQ quantizer (GroupFiniteScalarQuantizer, nanocodec.md §4).
 *
 * The latent of one frame has latent_dim = fsq_groups × fsq_n_dims channels; group g owns channels
 * g·n_dims … g·n_dims + n_dims − 1 and dimension d of every group has fsq_levels[d] levels.
 * Gepard passes codes around *unfolded*: one code k ∈ [0, L) per latent channel, channel i being
 * codebook i / n_dims, FSQ dimension i % n_dims (gepard-model.md §3.6). NeMo's packed token of a
 * codebook is the mixed-radix number k0 + L0·k1 + L0·L1·k2 + … (dim 0 least significant). */
#pragma once

#include "gepard-codec-config.h"

G_BEGIN_DECLS

/* One FSQ dimension with L levels and its fp32 constants (nanocodec.md §4). */
typedef struct
{
  int levels;   /* L */
  int half;     /* L // 2 */
  float scale;  /* ((L − 1) / 2)(1 − eps) */
  float offset; /* 0.5 for an even L, else 0 */
  float shift;  /* tan(offset / scale) */
} GepardFsqDim;

/* For eps = 1e-3 and L ∈ {6, 7, 8} the constants are the bit patterns listed in §4; otherwise they
 * are computed with the same fp32 steps as NeMo. */
void gepard_fsq_dim_init (GepardFsqDim *dim, int levels, double eps);
/* y = scale·tanh(x + shift) − offset, each step rounded to fp32 */
float gepard_fsq_dim_compress (const GepardFsqDim *dim, float x);
/* k = round_half_even(y) + L // 2, limited to [0, L) (a NaN gives L // 2) */
gint32 gepard_fsq_dim_quantize (const GepardFsqDim *dim, float y);
/* (k − L // 2) / (L // 2) in fp32; `code` must be in [0, L) */
float gepard_fsq_dim_value (const GepardFsqDim *dim, gint32 code);

/* Latent [n_frames][latent_dim] → codes [n_frames][latent_dim]. */
void gepard_fsq_encode (const GepardCodecConfig *config, const float *latent, gsize n_frames,
                        gint32 *codes);
/* Codes [n_frames][latent_dim] → dequantized latent [n_frames][latent_dim]. Codes must be valid
 * (gepard_fsq_check_codes). */
void gepard_fsq_decode (const GepardCodecConfig *config, const gint32 *codes, gsize n_frames,
                        float *latent);
/* GEPARD_FORMAT_ERROR_SHAPE naming the first code outside [0, L) of its dimension. */
gboolean gepard_fsq_check_codes (const GepardCodecConfig *config, const gint32 *codes,
                                 gsize n_frames, GError **error);

/* NeMo's packed index of one codebook from its n_dims codes, and back; -1 / FALSE when out of
 * range. */
gint32 gepard_fsq_pack (const GepardCodecConfig *config, const gint32 *group_codes);
gboolean gepard_fsq_unpack (const GepardCodecConfig *config, gint32 index, gint32 *group_codes);

/* The shared dequantization table [codebook_size][n_dims]: row `index` holds the values of
 * gepard_fsq_unpack (index). Free with g_free(). */
float *gepard_fsq_lut_new (const GepardCodecConfig *config);

G_END_DECLS
