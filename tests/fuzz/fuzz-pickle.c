/* fuzz-pickle.c: the pickle machine of the .nemo reader, entered directly with arbitrary bytes
 * (inside a .nemo it sits behind a tar and a zip, which mutations mostly break). */
#include "fuzz-common.h"
#include "gepard-pickle.h"

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

static void
check_tensors (const GPtrArray *tensors)
{
  for (guint i = 0; i < tensors->len; i++)
    {
      const GepardPickleTensor *t = g_ptr_array_index (tensors, i);

      g_assert_nonnull (t->name);
      g_assert_nonnull (t->storage_key);
      g_assert_cmpuint (t->n_dims, <=, GEPARD_TENSOR_MAX_DIMS);
      g_assert_nonnull (gepard_torch_storage_name (t->storage_type));
      g_assert_cmpuint (gepard_torch_storage_element_size (t->storage_type), >, 0);
    }
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  /* every entry kept, and only the codec's: the filter decides which values must be tensors */
  static const char *const codec[]
      = {"audio_encoder.", "vector_quantizer.", "audio_decoder.", NULL};
  const char *const *const filters[] = {NULL, codec};

  for (guint i = 0; i < G_N_ELEMENTS (filters); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (GPtrArray) tensors
          = gepard_pickle_load_state_dict (data, size, filters[i], &error);

      fuzz_check_outcome (tensors != NULL, error, GEPARD_FORMAT_ERROR);
      if (tensors != NULL)
        check_tensors (tensors);
    }
  return 0;
}
