/* gepard-bf16.h: bfloat16 rounding. The CPU backend keeps every value in fp32 but rounds it to
 * bf16 exactly where the bf16 reference rounds (gepard-model.md §1.9), so fp32 arrays hold
 * bf16-representable values between ops. */
#pragma once

#include <glib.h>
#include <string.h>

/* round to nearest even, as torch's float → bfloat16 cast; NaN stays NaN */
static inline float
gepard_bf16_round (float x)
{
  guint32 bits;
  memcpy (&bits, &x, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return x;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  memcpy (&x, &bits, 4);
  return x;
}

static inline guint16
gepard_f32_to_bf16 (float x)
{
  guint32 bits;
  x = gepard_bf16_round (x);
  memcpy (&bits, &x, 4);
  return (guint16)(bits >> 16);
}

static inline float
gepard_bf16_to_f32 (guint16 h)
{
  guint32 bits = (guint32)h << 16;
  float x;
  memcpy (&x, &bits, 4);
  return x;
}

static inline void
gepard_bf16_round_array (float *x, gsize n)
{
  for (gsize i = 0; i < n; i++)
    x[i] = gepard_bf16_round (x[i]);
}
