/* fuzz-nemo.c: the .nemo reader on arbitrary bytes: tar (ustar, pax, GNU, gzip-compressed), the
 * torch.save zip inside, its pickle and model_config.yaml; then the codec weights built from it,
 * as the codec element loads them. */
#include "fuzz-common.h"
#include "gepard-codec-weights.h"
#include "gepard-nemo.h"

#include <string.h>

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

static void
check_archive (const GepardNemo *nemo)
{
  gsize yaml_len;
  const char *yaml = gepard_nemo_get_config_yaml (nemo, &yaml_len);

  g_assert_true (yaml != NULL || yaml_len == 0);
  for (guint i = 0; i < gepard_nemo_get_n_tensors (nemo); i++)
    {
      const GepardNemoTensor *t = gepard_nemo_get_nth (nemo, i);
      g_autofree guint8 *copy = NULL;
      guint64 n_elements = 1;

      g_assert_nonnull (t->tensor.name);
      g_assert_nonnull (t->storage_type);
      g_assert_true (gepard_nemo_lookup (nemo, t->tensor.name) == t);
      g_assert_cmpuint (t->tensor.n_dims, <=, GEPARD_TENSOR_MAX_DIMS);
      for (guint d = 0; d < t->tensor.n_dims; d++)
        {
          g_assert_cmpint (t->tensor.shape[d], >=, 0);
          n_elements *= (guint64)t->tensor.shape[d];
        }
      g_assert_cmpuint (t->tensor.n_elements, ==, n_elements);
      if (t->has_dtype)
        g_assert_cmpuint (t->tensor.n_bytes, ==, n_elements * gepard_dtype_size (t->tensor.dtype));
      /* the bytes lie in the archive (a gzip one inflates to more than its size, hence no bound
       * here) and are all readable */
      if (t->tensor.n_bytes > 0)
        copy = g_memdup2 (t->tensor.data, t->tensor.n_bytes);
    }
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const char *path = fuzz_file_from_bytes (data, size);
  g_autoptr (GError) error = NULL;
  g_autoptr (GError) weights_error = NULL;
  g_autoptr (GepardNemo) nemo = gepard_nemo_open (path, NULL, &error);
  g_autoptr (GepardCodecWeights) weights = NULL;

  fuzz_check_outcome (nemo != NULL, error, GEPARD_FORMAT_ERROR);
  if (nemo != NULL)
    check_archive (nemo);

  weights = gepard_codec_weights_open (path, &weights_error);
  fuzz_check_outcome (weights != NULL, weights_error, GEPARD_FORMAT_ERROR);
  if (weights != NULL)
    g_assert_nonnull (gepard_codec_weights_get_config (weights));
  return 0;
}
