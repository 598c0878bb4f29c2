/* gepard-pickle.h: the pickle subset torch.save writes for a state dict.
 *
 * data.pkl of a torch.save checkpoint (nanocodec.md §5) is a protocol-2 pickle of an OrderedDict
 * whose values are tensors rebuilt by torch._utils._rebuild_tensor_v2 from persistent storage ids
 * ('storage', torch.<Type>Storage, key, location, numel). This runs such a pickle on a small value
 * stack with a memo and nothing else: no import, no call but the handful of globals a state dict
 * needs, caps on stack and nesting. Anything outside the subset is an error naming what it met. */
#pragma once

#include "gepard-safetensors.h"

G_BEGIN_DECLS

typedef enum
{
  GEPARD_TORCH_STORAGE_FLOAT,
  GEPARD_TORCH_STORAGE_DOUBLE,
  GEPARD_TORCH_STORAGE_HALF,
  GEPARD_TORCH_STORAGE_BFLOAT16,
  GEPARD_TORCH_STORAGE_INT,
  GEPARD_TORCH_STORAGE_LONG,
} GepardTorchStorage;

/* "FloatStorage", … */
const char *gepard_torch_storage_name (GepardTorchStorage storage);
/* bytes per element */
gsize gepard_torch_storage_element_size (GepardTorchStorage storage);
/* the GepardDType of the elements; FALSE for DOUBLE, which has none */
gboolean gepard_torch_storage_to_dtype (GepardTorchStorage storage, GepardDType *dtype);

/* One state-dict entry: a tensor view of a storage record "data/<storage_key>". Nothing here is
 * checked against the storage: the caller holds the records. */
typedef struct
{
  char *name;
  GepardTorchStorage storage_type;
  char *storage_key;
  guint64 storage_numel; /* elements, from the persistent id */
  guint64 storage_offset;
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  gint64 stride[GEPARD_TENSOR_MAX_DIMS];
} GepardPickleTensor;

/* Runs `data` and returns the state dict's entries whose keys start with one of `prefixes`
 * (NULL-terminated; NULL keeps all), in dict order, as GepardPickleTensor* owned by the array.
 * Every kept entry must be a tensor; the others may be anything the subset can build. */
GPtrArray *gepard_pickle_load_state_dict (const guint8 *data, gsize len,
                                          const char *const *prefixes, GError **error);

G_END_DECLS
