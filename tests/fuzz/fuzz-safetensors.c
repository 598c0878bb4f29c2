/* fuzz-safetensors.c: gepard_safetensors_open on arbitrary bytes. An accepted file must keep the
 * invariants the rest of gepard-core relies on: tensors in ascending, non-overlapping order inside
 * the data buffer, sizes consistent with shape and dtype, every name and metadata key found
 * again by lookup. */
#include "fuzz-common.h"
#include "gepard-codec-weights.h"
#include "gepard-safetensors.h"

#include <string.h>

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

static void
check_tensors (const GepardSafetensors *file, const uint8_t *data, size_t size)
{
  guint n = gepard_safetensors_get_n_tensors (file);
  const guint8 *first = NULL, *end = NULL;
  guint64 header_len = 0;
  gsize buffer_len;

  /* open() accepted it, so the little-endian header length and the header fit */
  g_assert_cmpuint (size, >=, 8);
  for (int i = 7; i >= 0; i--)
    header_len = (header_len << 8) | data[i];
  g_assert_cmpuint (header_len, <=, size - 8);
  buffer_len = size - 8 - header_len;

  for (guint i = 0; i < n; i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
      guint64 n_elements = 1;
      g_autofree char *shape = gepard_tensor_shape_to_string (tensor);
      g_autofree guint8 *copy = NULL;

      g_assert_nonnull (tensor->name);
      g_assert_true (gepard_safetensors_lookup (file, tensor->name) == tensor);
      g_assert_cmpuint (tensor->n_dims, <=, GEPARD_TENSOR_MAX_DIMS);
      for (guint d = 0; d < tensor->n_dims; d++)
        {
          g_assert_cmpint (tensor->shape[d], >=, 0);
          n_elements *= (guint64)tensor->shape[d];
        }
      g_assert_cmpuint (tensor->n_elements, ==, n_elements);
      g_assert_cmpuint (tensor->n_bytes, ==, n_elements * gepard_dtype_size (tensor->dtype));
      g_assert_cmpuint (tensor->n_bytes, <=, buffer_len);
      g_assert_nonnull (shape);
      g_assert_true (gepard_tensor_has_shape (tensor, tensor->n_dims, tensor->shape));

      if (first == NULL)
        first = tensor->data;
      g_assert_true (tensor->data >= first);
      if (tensor->n_bytes == 0)
        continue;
      if (end != NULL)
        g_assert_true (tensor->data >= end);
      end = tensor->data + tensor->n_bytes;
      g_assert_cmpuint ((gsize)(end - first), <=, buffer_len);

      /* every byte is readable; the floating ones convert into a buffer of exactly n_elements */
      copy = g_memdup2 (tensor->data, tensor->n_bytes);
      if (tensor->dtype == GEPARD_DTYPE_BF16 || tensor->dtype == GEPARD_DTYPE_F16
          || tensor->dtype == GEPARD_DTYPE_F32)
        {
          g_autofree float *values = g_new (float, tensor->n_elements);

          gepard_tensor_to_f32 (tensor, values);
        }
    }

  for (const char *const *key = gepard_safetensors_get_metadata_keys (file); *key != NULL; key++)
    g_assert_nonnull (gepard_safetensors_get_metadata (file, *key));
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  const char *path = fuzz_file_from_bytes (data, size);
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, &error);

  fuzz_check_outcome (file != NULL, error, GEPARD_FORMAT_ERROR);
  if (file == NULL)
    return 0;
  check_tensors (file, data, size);

  /* a NanoCodec export: the codec weights read from it as the codec element does */
  if (gepard_safetensors_get_metadata (file, "model_config.yaml") != NULL)
    {
      g_autoptr (GError) weights_error = NULL;
      g_autoptr (GepardCodecWeights) weights = gepard_codec_weights_open (path, &weights_error);

      fuzz_check_outcome (weights != NULL, weights_error, GEPARD_FORMAT_ERROR);
    }
  return 0;
}
