/* nemo-writer.h: writes NeMo .nemo archives and the PyTorch checkpoints inside them.
 *
 * A .nemo (nanocodec.md §5) is an uncompressed tar holding ./model_config.yaml and
 * ./model_weights.ckpt; the .ckpt is what torch.save(state_dict) writes: a stored (uncompressed)
 * zip whose entries live under a folder named after the file stem — data.pkl (a protocol-2 pickle
 * of an OrderedDict of tensors rebuilt by torch._utils._rebuild_tensor_v2 from persistent storage
 * ids), byteorder, data/<key> (one raw little-endian storage per tensor, 64-byte aligned) and
 * version. torch.load(path, weights_only=True) accepts the result.
 *
 * Tensors are declared first and filled one at a time while the file is written, so a checkpoint
 * far larger than memory can be written. */
#pragma once

#include "gepard-safetensors.h"

G_BEGIN_DECLS

typedef struct _GepardNemoWriter GepardNemoWriter;

GepardNemoWriter *gepard_nemo_writer_new (void);
void gepard_nemo_writer_free (GepardNemoWriter *writer);

/* The text stored as ./model_config.yaml (copied). */
void gepard_nemo_writer_set_config_yaml (GepardNemoWriter *writer, const char *yaml);

/* Declares a tensor, in state-dict order. `shape` is copied; `fill` is called once during
 * write() with a zeroed buffer of the tensor's size, to be filled with little-endian elements.
 * Every dtype of GepardDType has a torch storage type (F32 → FloatStorage, I32 → IntStorage, …). */
void gepard_nemo_writer_add (GepardNemoWriter *writer, const char *name, GepardDType dtype,
                             guint n_dims, const gint64 *shape, GepardTensorFillFunc fill,
                             gpointer user_data);

/* Writes the .nemo archive to `path` through a temporary file beside it and an atomic rename. */
gboolean gepard_nemo_writer_write (GepardNemoWriter *writer, const char *path, GError **error);

/* Writes only the torch.save checkpoint (what the archive stores as model_weights.ckpt); its
 * entries live under the stem of `path`'s basename. Same temporary file and rename. */
gboolean gepard_nemo_writer_write_ckpt (GepardNemoWriter *writer, const char *path, GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardNemoWriter, gepard_nemo_writer_free)

G_END_DECLS
