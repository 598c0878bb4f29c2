/* gepard-safetensors.h: the safetensors format, read through mmap and written in one pass.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of JSON mapping tensor
 * names to {dtype, shape, data_offsets: [begin, end)} (plus an optional "__metadata__" object of
 * strings), then the byte buffer the offsets point into. The reader validates everything before it
 * hands out a pointer: every tensor lies inside the buffer, its byte size equals
 * product(shape) * dtype size, and no two tensors overlap. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  GEPARD_DTYPE_BF16,
  GEPARD_DTYPE_F16,
  GEPARD_DTYPE_F32,
  GEPARD_DTYPE_I64,
  GEPARD_DTYPE_I32,
  GEPARD_DTYPE_U8,
} GepardDType;

#define GEPARD_TENSOR_MAX_DIMS 8

/* bytes per element */
gsize gepard_dtype_size (GepardDType dtype);
/* "BF16", "F32", … as safetensors spells them */
const char *gepard_dtype_name (GepardDType dtype);
gboolean gepard_dtype_from_name (const char *name, GepardDType *dtype);

/* A tensor inside an open file. `data` points into the mapping and lives as long as the file. */
typedef struct
{
  const char *name;
  GepardDType dtype;
  guint n_dims; /* 0 for a scalar */
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint64 n_elements;
  gsize n_bytes;
  const guint8 *data;
} GepardTensor;

/* Converts any floating tensor (BF16, F16, F32) to fp32 into `dst` (n_elements floats). */
void gepard_tensor_to_f32 (const GepardTensor *tensor, float *dst);
/* TRUE when the shape equals `shape[0..n_dims)`. */
gboolean gepard_tensor_has_shape (const GepardTensor *tensor, guint n_dims, const gint64 *shape);
/* "[248320, 1024]" */
char *gepard_tensor_shape_to_string (const GepardTensor *tensor);

typedef struct _GepardSafetensors GepardSafetensors;

GepardSafetensors *gepard_safetensors_open (const char *path, GError **error);
void gepard_safetensors_free (GepardSafetensors *file);
const char *gepard_safetensors_get_path (const GepardSafetensors *file);
guint gepard_safetensors_get_n_tensors (const GepardSafetensors *file);
/* tensors in file order (ascending data offset) */
const GepardTensor *gepard_safetensors_get_nth (const GepardSafetensors *file, guint index);
/* NULL when the file has no tensor of that name */
const GepardTensor *gepard_safetensors_lookup (const GepardSafetensors *file, const char *name);
/* a "__metadata__" entry, or NULL */
const char *gepard_safetensors_get_metadata (const GepardSafetensors *file, const char *key);
/* the "__metadata__" keys in file order, NULL-terminated, owned by the file */
const char *const *gepard_safetensors_get_metadata_keys (const GepardSafetensors *file);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardSafetensors, gepard_safetensors_free)

/* Writing. Tensors are declared first, each with a callback that fills its bytes; the file is then
 * written tensor by tensor, so a checkpoint far larger than memory can be written. */
typedef void (*GepardTensorFillFunc) (gpointer user_data, const char *name, void *dst,
                                      gsize n_bytes);

typedef struct _GepardSafetensorsWriter GepardSafetensorsWriter;

GepardSafetensorsWriter *gepard_safetensors_writer_new (void);
void gepard_safetensors_writer_free (GepardSafetensorsWriter *writer);
void gepard_safetensors_writer_set_metadata (GepardSafetensorsWriter *writer, const char *key,
                                             const char *value);
/* `shape` is copied; `fill` is called once during write() with a zeroed buffer of the tensor's
 * size. */
void gepard_safetensors_writer_add (GepardSafetensorsWriter *writer, const char *name,
                                    GepardDType dtype, guint n_dims, const gint64 *shape,
                                    GepardTensorFillFunc fill, gpointer user_data);
/* Adds a tensor whose bytes are copied now. */
void gepard_safetensors_writer_add_data (GepardSafetensorsWriter *writer, const char *name,
                                         GepardDType dtype, guint n_dims, const gint64 *shape,
                                         const void *data);
/* Writes to `path` through a temporary file and an atomic rename. A declaration that cannot be
 * written (a name added twice or "__metadata__", a negative or overflowing shape) is reported
 * here, as the add functions have no error to return. */
gboolean gepard_safetensors_writer_write (GepardSafetensorsWriter *writer, const char *path,
                                          GError **error);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardSafetensorsWriter, gepard_safetensors_writer_free)

G_END_DECLS
