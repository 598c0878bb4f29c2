/* nemo-writer.c: .nemo archives (ustar) around torch.save zip checkpoints, written in one pass.
 *
 * The layout follows what torch.save (PyTorchStreamWriter on miniz) and NeMo's SaveRestoreConnector
 * produce, record for record, so readers written against this output read the published files:
 *
 *   zip: every entry stored, general purpose flags 0x0808 (UTF-8 names, data descriptor), zero
 *   CRC and sizes in the local header and a data descriptor after the data; an extra field "FB"
 *   padded with 'Z' so that the data starts on a 64-byte boundary; zip64 extra fields only where a
 *   size or offset needs them, but always a zip64 end-of-central-directory record and locator.
 *   Records: data.pkl, .format_version "1" (storages in numeric key order), .storage_alignment
 *   "64", byteorder "little", data/0 … data/N-1, version "3\n", .data/serialization_id.
 *
 *   tar: "./", "./model_config.yaml", "./model_weights.ckpt" (nanocodec.md §5: tarfile "w:" with
 *   arcname "."), ustar headers, two zero blocks, padded to a 10240-byte record.
 *
 * Everything but the tensor bytes is small and built in memory; sizes and offsets are planned
 * before the first byte is written because the tar header carries the checkpoint's size. */
#include "nemo-writer.h"

#include "gepard-error.h"

#include <errno.h>
#include <fcntl.h>
#include <glib/gstdio.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ZIP_ALIGNMENT 64
#define ZIP_LOCAL_HEADER_SIZE 30
#define ZIP_CENTRAL_HEADER_SIZE 46
#define ZIP64_EOCD_SIZE 56
#define ZIP64_LOCATOR_SIZE 20
#define ZIP_EOCD_SIZE 22
#define ZIP_U32_LIMIT G_GUINT64_CONSTANT (0xFFFFFFFF)
#define ZIP_FLAGS 0x0808 /* bit 3: sizes and CRC in a data descriptor; bit 11: UTF-8 names */

#define TAR_BLOCK 512
#define TAR_RECORD (20 * TAR_BLOCK)

/* torch.save's pickle batches dict items like Python's pickle (_BATCHSIZE) */
#define PICKLE_BATCH 1000

typedef struct
{
  char *name;
  GepardDType dtype;
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint64 n_elements;
  guint64 n_bytes;
  GepardTensorFillFunc fill;
  gpointer user_data;
} NemoTensor;

struct _GepardNemoWriter
{
  GPtrArray *tensors; /* NemoTensor */
  char *config_yaml;
};

static void
nemo_tensor_free (gpointer data)
{
  NemoTensor *tensor = data;

  g_free (tensor->name);
  g_free (tensor);
}

GepardNemoWriter *
gepard_nemo_writer_new (void)
{
  GepardNemoWriter *writer = g_new0 (GepardNemoWriter, 1);

  writer->tensors = g_ptr_array_new_with_free_func (nemo_tensor_free);
  writer->config_yaml = g_strdup ("");
  return writer;
}

void
gepard_nemo_writer_free (GepardNemoWriter *writer)
{
  if (writer == NULL)
    return;
  g_ptr_array_unref (writer->tensors);
  g_free (writer->config_yaml);
  g_free (writer);
}

void
gepard_nemo_writer_set_config_yaml (GepardNemoWriter *writer, const char *yaml)
{
  g_return_if_fail (writer != NULL);
  g_return_if_fail (yaml != NULL);

  g_free (writer->config_yaml);
  writer->config_yaml = g_strdup (yaml);
}

static gsize
dtype_size (GepardDType dtype)
{
  /* kept local so that the writer does not depend on the safetensors reader */
  switch (dtype)
    {
    case GEPARD_DTYPE_BF16:
    case GEPARD_DTYPE_F16:
      return 2;
    case GEPARD_DTYPE_F32:
    case GEPARD_DTYPE_I32:
      return 4;
    case GEPARD_DTYPE_I64:
      return 8;
    case GEPARD_DTYPE_U8:
      return 1;
    default:
      return 0;
    }
}

/* the torch storage class a tensor of this dtype is pickled with */
static const char *
dtype_storage_class (GepardDType dtype)
{
  switch (dtype)
    {
    case GEPARD_DTYPE_BF16:
      return "BFloat16Storage";
    case GEPARD_DTYPE_F16:
      return "HalfStorage";
    case GEPARD_DTYPE_F32:
      return "FloatStorage";
    case GEPARD_DTYPE_I64:
      return "LongStorage";
    case GEPARD_DTYPE_I32:
      return "IntStorage";
    case GEPARD_DTYPE_U8:
      return "ByteStorage";
    default:
      return NULL;
    }
}

void
gepard_nemo_writer_add (GepardNemoWriter *writer, const char *name, GepardDType dtype, guint n_dims,
                        const gint64 *shape, GepardTensorFillFunc fill, gpointer user_data)
{
  NemoTensor *tensor;

  g_return_if_fail (writer != NULL);
  g_return_if_fail (name != NULL && *name != '\0');
  g_return_if_fail (dtype_storage_class (dtype) != NULL);
  g_return_if_fail (n_dims <= GEPARD_TENSOR_MAX_DIMS);
  g_return_if_fail (n_dims == 0 || shape != NULL);
  g_return_if_fail (fill != NULL);

  for (guint i = 0; i < n_dims; i++)
    g_return_if_fail (shape[i] >= 0);

  tensor = g_new0 (NemoTensor, 1);
  tensor->name = g_strdup (name);
  tensor->dtype = dtype;
  tensor->n_dims = n_dims;
  tensor->n_elements = 1;
  for (guint i = 0; i < n_dims; i++)
    {
      tensor->shape[i] = shape[i];
      tensor->n_elements *= (guint64)shape[i];
    }
  tensor->n_bytes = tensor->n_elements * dtype_size (dtype);
  tensor->fill = fill;
  tensor->user_data = user_data;
  g_ptr_array_add (writer->tensors, tensor);
}

/* --- little-endian helpers --- */

static void
put_le16 (guint8 *p, guint v)
{
  p[0] = v & 0xff;
  p[1] = (v >> 8) & 0xff;
}

static void
put_le32 (guint8 *p, guint32 v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (v >> (8 * i)) & 0xff;
}

static void
put_le64 (guint8 *p, guint64 v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (v >> (8 * i)) & 0xff;
}

static guint32
get_le32 (const guint8 *p)
{
  return (guint32)p[0] | ((guint32)p[1] << 8) | ((guint32)p[2] << 16) | ((guint32)p[3] << 24);
}

/* --- CRC-32 (zip's reflected polynomial 0xEDB88320), eight bytes per step --- */

typedef struct
{
  guint32 table[8][256];
} Crc32;

static void
crc32_init (Crc32 *crc)
{
  for (guint32 i = 0; i < 256; i++)
    {
      guint32 c = i;

      for (int k = 0; k < 8; k++)
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      crc->table[0][i] = c;
    }
  for (guint32 i = 0; i < 256; i++)
    for (int k = 1; k < 8; k++)
      crc->table[k][i] = (crc->table[k - 1][i] >> 8) ^ crc->table[0][crc->table[k - 1][i] & 0xff];
}

static guint32
crc32_update (const Crc32 *crc, guint32 value, const guint8 *p, gsize len)
{
  const guint32 (*t)[256] = crc->table;
  guint32 c = ~value;

  while (len >= 8)
    {
      guint32 lo = get_le32 (p) ^ c;
      guint32 hi = get_le32 (p + 4);

      c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24]
          ^ t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
      p += 8;
      len -= 8;
    }
  while (len-- > 0)
    c = t[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

/* --- data.pkl: the pickle torch.save emits for an OrderedDict of tensors --- */

typedef struct
{
  GByteArray *out;
  guint n_memo;
  GHashTable *globals; /* "module\nname" → memo index */
  int storage_memo;    /* memo index of the shared 'storage' string, or -1 */
  int cpu_memo;        /* memo index of the shared 'cpu' string, or -1 */
} Pickler;

static void
pk_op (Pickler *pk, guint8 op)
{
  g_byte_array_append (pk->out, &op, 1);
}

static void
pk_le32 (Pickler *pk, guint32 v)
{
  guint8 b[4];

  put_le32 (b, v);
  g_byte_array_append (pk->out, b, 4);
}

/* Python's pickler memoizes every string, tuple, global and reduced object it writes */
static guint
pk_put (Pickler *pk)
{
  guint index = pk->n_memo++;

  if (index < 256)
    {
      pk_op (pk, 'q'); /* BINPUT */
      pk_op (pk, index);
    }
  else
    {
      pk_op (pk, 'r'); /* LONG_BINPUT */
      pk_le32 (pk, index);
    }
  return index;
}

static void
pk_get (Pickler *pk, guint index)
{
  if (index < 256)
    {
      pk_op (pk, 'h'); /* BINGET */
      pk_op (pk, index);
    }
  else
    {
      pk_op (pk, 'j'); /* LONG_BINGET */
      pk_le32 (pk, index);
    }
}

static void
pk_global (Pickler *pk, const char *module, const char *name)
{
  g_autofree char *key = g_strconcat (module, "\n", name, NULL);
  gpointer index;

  if (g_hash_table_lookup_extended (pk->globals, key, NULL, &index))
    {
      pk_get (pk, GPOINTER_TO_UINT (index));
      return;
    }
  pk_op (pk, 'c'); /* GLOBAL */
  g_byte_array_append (pk->out, (const guint8 *)key, strlen (key));
  pk_op (pk, '\n');
  g_hash_table_insert (pk->globals, g_steal_pointer (&key), GUINT_TO_POINTER (pk_put (pk)));
}

static void
pk_unicode (Pickler *pk, const char *s)
{
  gsize len = strlen (s);

  pk_op (pk, 'X'); /* BINUNICODE */
  pk_le32 (pk, len);
  g_byte_array_append (pk->out, (const guint8 *)s, len);
  pk_put (pk);
}

/* torch passes the same 'storage' and 'cpu' string objects for every tensor, so the pickler
 * writes each once and refers back to it */
static void
pk_shared_unicode (Pickler *pk, const char *s, int *memo)
{
  if (*memo >= 0)
    {
      pk_get (pk, *memo);
      return;
    }
  *memo = pk->n_memo;
  pk_unicode (pk, s);
}

static void
pk_int (Pickler *pk, guint64 v)
{
  if (v <= 0xff)
    {
      pk_op (pk, 'K'); /* BININT1 */
      pk_op (pk, v);
    }
  else if (v <= 0xffff)
    {
      guint8 b[2];

      pk_op (pk, 'M'); /* BININT2 */
      put_le16 (b, v);
      g_byte_array_append (pk->out, b, 2);
    }
  else if (v <= G_MAXINT32)
    {
      pk_op (pk, 'J'); /* BININT */
      pk_le32 (pk, v);
    }
  else
    {
      /* LONG1: little-endian two's complement, shortest form that keeps the sign positive */
      guint8 b[9];
      guint8 n = 0;

      while (v != 0)
        {
          b[n++] = v & 0xff;
          v >>= 8;
        }
      if (b[n - 1] & 0x80)
        b[n++] = 0;
      pk_op (pk, 0x8a);
      pk_op (pk, n);
      g_byte_array_append (pk->out, b, n);
    }
}

static void
pk_int_tuple (Pickler *pk, guint n, const guint64 *values)
{
  /* protocol 2: () is EMPTY_TUPLE (not memoized), up to three items TUPLE1..3, else MARK…TUPLE */
  if (n == 0)
    {
      pk_op (pk, ')');
      return;
    }
  if (n > 3)
    pk_op (pk, '(');
  for (guint i = 0; i < n; i++)
    pk_int (pk, values[i]);
  pk_op (pk, n > 3 ? 't' : 0x85 + (n - 1));
  pk_put (pk);
}

static void
pk_tensor (Pickler *pk, const NemoTensor *tensor, guint storage_key)
{
  g_autofree char *key = g_strdup_printf ("%u", storage_key);
  guint64 size[GEPARD_TENSOR_MAX_DIMS];
  guint64 stride[GEPARD_TENSOR_MAX_DIMS];
  guint64 step = 1;

  /* contiguous strides as torch computes them: a zero-sized dim counts as 1 */
  for (guint i = tensor->n_dims; i-- > 0;)
    {
      size[i] = tensor->shape[i];
      stride[i] = step;
      step *= MAX (tensor->shape[i], 1);
    }

  /* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks) */
  pk_global (pk, "torch._utils", "_rebuild_tensor_v2");
  pk_op (pk, '(');

  /* the storage: persistent id ('storage', torch.<Type>Storage, key, 'cpu', numel) */
  pk_op (pk, '(');
  pk_shared_unicode (pk, "storage", &pk->storage_memo);
  pk_global (pk, "torch", dtype_storage_class (tensor->dtype));
  pk_unicode (pk, key);
  pk_shared_unicode (pk, "cpu", &pk->cpu_memo);
  pk_int (pk, tensor->n_elements);
  pk_op (pk, 't');
  pk_put (pk);
  pk_op (pk, 'Q'); /* BINPERSID */

  pk_int (pk, 0);
  pk_int_tuple (pk, tensor->n_dims, size);
  pk_int_tuple (pk, tensor->n_dims, stride);
  pk_op (pk, 0x89); /* NEWFALSE: requires_grad */

  /* backward_hooks: an empty OrderedDict() */
  pk_global (pk, "collections", "OrderedDict");
  pk_op (pk, ')');
  pk_op (pk, 'R');
  pk_put (pk);

  pk_op (pk, 't');
  pk_put (pk);
  pk_op (pk, 'R');
  pk_put (pk);
}

static GBytes *
build_data_pkl (GepardNemoWriter *writer)
{
  Pickler pk = {0};
  guint n = writer->tensors->len;

  pk.out = g_byte_array_new ();
  pk.globals = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  pk.storage_memo = -1;
  pk.cpu_memo = -1;

  pk_op (&pk, 0x80); /* PROTO 2 */
  pk_op (&pk, 2);
  pk_global (&pk, "collections", "OrderedDict");
  pk_op (&pk, ')');
  pk_op (&pk, 'R');
  pk_put (&pk);

  for (guint start = 0; start < n; start += PICKLE_BATCH)
    {
      guint end = MIN (n, start + PICKLE_BATCH);

      if (end - start > 1)
        pk_op (&pk, '(');
      for (guint i = start; i < end; i++)
        {
          const NemoTensor *tensor = g_ptr_array_index (writer->tensors, i);

          pk_unicode (&pk, tensor->name);
          pk_tensor (&pk, tensor, i);
        }
      pk_op (&pk, end - start > 1 ? 'u' : 's'); /* SETITEMS / SETITEM */
    }
  pk_op (&pk, '.');

  g_hash_table_unref (pk.globals);
  return g_byte_array_free_to_bytes (pk.out);
}

/* --- zip plan --- */

typedef enum
{
  ZIP_ENTRY_BYTES,
  ZIP_ENTRY_TENSOR,
  ZIP_ENTRY_SERIALIZATION_ID,
} ZipEntryKind;

#define SERIALIZATION_ID_LEN 40

typedef struct
{
  ZipEntryKind kind;
  char *name;
  GBytes *bytes;
  const NemoTensor *tensor;
  guint64 size;
  guint64 header_offset;
  guint64 data_offset;
  gboolean zip64_sizes;  /* size needs 64 bits */
  gboolean zip64_offset; /* header offset needs 64 bits */
  guint extra_len;       /* local extra field: zip64 part + "FB" padding */
  guint32 crc;
} ZipEntry;

typedef struct
{
  GArray *entries; /* ZipEntry */
  guint64 central_offset;
  guint64 central_size;
  guint64 zip64_eocd_offset;
  guint64 total_size;
} ZipPlan;

static void
zip_entry_clear (gpointer data)
{
  ZipEntry *entry = data;

  g_free (entry->name);
  g_clear_pointer (&entry->bytes, g_bytes_unref);
}

static void
zip_plan_clear (ZipPlan *plan)
{
  g_clear_pointer (&plan->entries, g_array_unref);
}

static void
plan_add (ZipPlan *plan, const char *root, const char *record, ZipEntryKind kind, GBytes *bytes,
          const NemoTensor *tensor)
{
  ZipEntry entry = {0};

  entry.kind = kind;
  entry.name = g_strconcat (root, "/", record, NULL);
  entry.bytes = bytes;
  entry.tensor = tensor;
  switch (kind)
    {
    case ZIP_ENTRY_BYTES:
      entry.size = g_bytes_get_size (bytes);
      break;
    case ZIP_ENTRY_TENSOR:
      entry.size = tensor->n_bytes;
      break;
    case ZIP_ENTRY_SERIALIZATION_ID:
      entry.size = SERIALIZATION_ID_LEN;
      break;
    }
  g_array_append_val (plan->entries, entry);
}

static GBytes *
bytes_from_string (const char *s)
{
  return g_bytes_new_static (s, strlen (s));
}

static guint
zip64_local_extra_len (const ZipEntry *entry)
{
  if (!entry->zip64_sizes && !entry->zip64_offset)
    return 0;
  return 4 + (entry->zip64_sizes ? 16 : 0) + (entry->zip64_offset ? 8 : 0);
}

static guint
zip64_central_extra_len (const ZipEntry *entry)
{
  return zip64_local_extra_len (entry);
}

static guint
data_descriptor_len (const ZipEntry *entry)
{
  /* 64-bit sizes in the descriptor whenever the local header has a zip64 extra field */
  return zip64_local_extra_len (entry) > 0 ? 24 : 16;
}

static void
zip_plan_build (ZipPlan *plan, GepardNemoWriter *writer, const char *root)
{
  guint64 cursor = 0;

  plan->entries = g_array_new (FALSE, TRUE, sizeof (ZipEntry));
  g_array_set_clear_func (plan->entries, zip_entry_clear);

  /* the records and their order as torch.save writes them */
  plan_add (plan, root, "data.pkl", ZIP_ENTRY_BYTES, build_data_pkl (writer), NULL);
  plan_add (plan, root, ".format_version", ZIP_ENTRY_BYTES, bytes_from_string ("1"), NULL);
  plan_add (plan, root, ".storage_alignment", ZIP_ENTRY_BYTES, bytes_from_string ("64"), NULL);
  plan_add (plan, root, "byteorder", ZIP_ENTRY_BYTES, bytes_from_string ("little"), NULL);
  for (guint i = 0; i < writer->tensors->len; i++)
    {
      g_autofree char *record = g_strdup_printf ("data/%u", i);

      plan_add (plan, root, record, ZIP_ENTRY_TENSOR, NULL, g_ptr_array_index (writer->tensors, i));
    }
  plan_add (plan, root, "version", ZIP_ENTRY_BYTES, bytes_from_string ("3\n"), NULL);
  plan_add (plan, root, ".data/serialization_id", ZIP_ENTRY_SERIALIZATION_ID, NULL, NULL);

  for (guint i = 0; i < plan->entries->len; i++)
    {
      ZipEntry *entry = &g_array_index (plan->entries, ZipEntry, i);
      guint64 start;
      guint padding;

      entry->header_offset = cursor;
      entry->zip64_sizes = entry->size >= ZIP_U32_LIMIT;
      entry->zip64_offset = cursor >= ZIP_U32_LIMIT;
      /* the data starts after the header, the name, the zip64 extra and the 4-byte "FB" extra
       * header; the FB payload pads it to the next multiple of 64 */
      start = cursor + ZIP_LOCAL_HEADER_SIZE + strlen (entry->name) + zip64_local_extra_len (entry)
              + 4;
      padding = (ZIP_ALIGNMENT - start % ZIP_ALIGNMENT) % ZIP_ALIGNMENT;
      entry->extra_len = zip64_local_extra_len (entry) + 4 + padding;
      entry->data_offset = start + padding;
      cursor = entry->data_offset + entry->size + data_descriptor_len (entry);
    }

  plan->central_offset = cursor;
  plan->central_size = 0;
  for (guint i = 0; i < plan->entries->len; i++)
    {
      const ZipEntry *entry = &g_array_index (plan->entries, ZipEntry, i);

      plan->central_size
          += ZIP_CENTRAL_HEADER_SIZE + strlen (entry->name) + zip64_central_extra_len (entry);
    }
  plan->zip64_eocd_offset = plan->central_offset + plan->central_size;
  plan->total_size = plan->zip64_eocd_offset + ZIP64_EOCD_SIZE + ZIP64_LOCATOR_SIZE + ZIP_EOCD_SIZE;
}

/* --- output through a temporary file --- */

typedef struct
{
  FILE *file;
  char *path;
  char *tmp_path;
  guint64 offset;
  Crc32 crc;
} Output;

static gboolean
output_open (Output *out, const char *path, GError **error)
{
  int fd;

  memset (out, 0, sizeof *out);
  out->path = g_strdup (path);
  out->tmp_path = g_strconcat (path, ".XXXXXX", NULL);
  fd = g_mkstemp_full (out->tmp_path, O_WRONLY, 0666);
  if (fd < 0)
    {
      int saved_errno = errno;

      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                   "Cannot create a temporary file beside %s: %s", path, g_strerror (saved_errno));
      g_clear_pointer (&out->tmp_path, g_free);
      g_clear_pointer (&out->path, g_free);
      return FALSE;
    }
  out->file = fdopen (fd, "wb");
  if (out->file == NULL)
    {
      int saved_errno = errno;

      close (fd);
      g_unlink (out->tmp_path);
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "Cannot write %s: %s",
                   out->tmp_path, g_strerror (saved_errno));
      g_clear_pointer (&out->tmp_path, g_free);
      g_clear_pointer (&out->path, g_free);
      return FALSE;
    }
  setvbuf (out->file, NULL, _IOFBF, 1 << 20);
  crc32_init (&out->crc);
  return TRUE;
}

/* Closes the file; on success renames it over the destination, otherwise removes it. */
static gboolean
output_finish (Output *out, gboolean ok, GError **error)
{
  if (out->file != NULL)
    {
      if (fclose (out->file) != 0 && ok)
        {
          int saved_errno = errno;

          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "Cannot write %s: %s",
                       out->tmp_path, g_strerror (saved_errno));
          ok = FALSE;
        }
      out->file = NULL;
    }
  /* rename() replaces the destination atomically: a reader sees the old file or the new one */
  if (ok && g_rename (out->tmp_path, out->path) != 0)
    {
      int saved_errno = errno;

      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "Cannot rename %s to %s: %s",
                   out->tmp_path, out->path, g_strerror (saved_errno));
      ok = FALSE;
    }
  if (!ok)
    g_unlink (out->tmp_path);
  g_clear_pointer (&out->tmp_path, g_free);
  g_clear_pointer (&out->path, g_free);
  return ok;
}

static gboolean
output_write (Output *out, const void *data, gsize len, GError **error)
{
  if (len > 0 && fwrite (data, 1, len, out->file) != len)
    {
      int saved_errno = errno;

      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "Cannot write %s: %s",
                   out->tmp_path, g_strerror (saved_errno));
      return FALSE;
    }
  out->offset += len;
  return TRUE;
}

static gboolean
output_zeros (Output *out, gsize len, GError **error)
{
  static const guint8 zeros[TAR_BLOCK] = {0};

  while (len > 0)
    {
      gsize n = MIN (len, sizeof zeros);

      if (!output_write (out, zeros, n, error))
        return FALSE;
      len -= n;
    }
  return TRUE;
}

/* --- zip writing --- */

static gboolean
write_local_header (Output *out, const ZipEntry *entry, GError **error)
{
  gsize name_len = strlen (entry->name);
  g_autofree guint8 *h = g_malloc0 (ZIP_LOCAL_HEADER_SIZE + name_len + entry->extra_len);
  guint8 *extra = h + ZIP_LOCAL_HEADER_SIZE + name_len;
  guint zip64_len = zip64_local_extra_len (entry);
  guint padding = entry->extra_len - zip64_len - 4;

  /* CRC and sizes follow in the data descriptor; version, time and date are 0 like torch's */
  put_le32 (h, 0x04034b50);
  put_le16 (h + 4, zip64_len > 0 ? 45 : 0);
  put_le16 (h + 6, ZIP_FLAGS);
  put_le16 (h + 8, 0); /* stored */
  if (entry->zip64_sizes)
    {
      put_le32 (h + 18, 0xFFFFFFFF);
      put_le32 (h + 22, 0xFFFFFFFF);
    }
  put_le16 (h + 26, name_len);
  put_le16 (h + 28, entry->extra_len);
  memcpy (h + ZIP_LOCAL_HEADER_SIZE, entry->name, name_len);

  if (zip64_len > 0)
    {
      guint8 *p = extra + 4;

      put_le16 (extra, 0x0001);
      put_le16 (extra + 2, zip64_len - 4);
      if (entry->zip64_sizes)
        {
          put_le64 (p, entry->size);
          put_le64 (p + 8, entry->size);
          p += 16;
        }
      if (entry->zip64_offset)
        put_le64 (p, entry->header_offset);
      extra += zip64_len;
    }
  /* torch's alignment field: id "FB", then the padding bytes, all 'Z' */
  extra[0] = 'F';
  extra[1] = 'B';
  put_le16 (extra + 2, padding);
  memset (extra + 4, 'Z', padding);

  return output_write (out, h, ZIP_LOCAL_HEADER_SIZE + name_len + entry->extra_len, error);
}

static gboolean
write_data_descriptor (Output *out, const ZipEntry *entry, GError **error)
{
  guint8 d[24];
  guint len = data_descriptor_len (entry);

  put_le32 (d, 0x08074b50);
  put_le32 (d + 4, entry->crc);
  if (len == 24)
    {
      put_le64 (d + 8, entry->size);
      put_le64 (d + 16, entry->size);
    }
  else
    {
      put_le32 (d + 8, entry->size);
      put_le32 (d + 12, entry->size);
    }
  return output_write (out, d, len, error);
}

static gboolean
write_tensor_data (Output *out, ZipEntry *entry, GError **error)
{
  const NemoTensor *tensor = entry->tensor;
  g_autofree guint8 *data = NULL;

  if (tensor->n_bytes > G_MAXSIZE)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "Tensor %s is too large for this machine", tensor->name);
      return FALSE;
    }
  data = g_malloc0 (tensor->n_bytes);
  tensor->fill (tensor->user_data, tensor->name, data, tensor->n_bytes);
  entry->crc = crc32_update (&out->crc, 0, data, tensor->n_bytes);
  return output_write (out, data, tensor->n_bytes, error);
}

/* A deterministic id of the same form as torch's (20 digits from the record names, 20 from the
 * records' CRCs); readers ignore its value. */
static char *
serialization_id (const ZipPlan *plan, guint n_written)
{
  guint64 name_hash = G_GUINT64_CONSTANT (0xcbf29ce484222325);
  guint64 crc_hash = 0;

  for (guint i = 0; i < n_written; i++)
    {
      const ZipEntry *entry = &g_array_index (plan->entries, ZipEntry, i);

      for (const char *p = entry->name; *p != '\0'; p++)
        name_hash = (name_hash ^ (guint8)*p) * G_GUINT64_CONSTANT (0x100000001b3);
      crc_hash = crc_hash * G_GUINT64_CONSTANT (0x9e3779b97f4a7c15) + entry->crc;
    }
  return g_strdup_printf ("%020" G_GUINT64_FORMAT "%020" G_GUINT64_FORMAT, name_hash, crc_hash);
}

static gboolean
write_central_directory (Output *out, const ZipPlan *plan, GError **error)
{
  guint n = plan->entries->len;
  guint8 tail[ZIP64_EOCD_SIZE + ZIP64_LOCATOR_SIZE + ZIP_EOCD_SIZE] = {0};
  guint8 *p;

  for (guint i = 0; i < n; i++)
    {
      const ZipEntry *entry = &g_array_index (plan->entries, ZipEntry, i);
      gsize name_len = strlen (entry->name);
      guint extra_len = zip64_central_extra_len (entry);
      guint8 h[ZIP_CENTRAL_HEADER_SIZE + 28] = {0};

      put_le32 (h, 0x02014b50);
      put_le16 (h + 4, 0); /* version made by */
      put_le16 (h + 6, extra_len > 0 ? 45 : 0);
      put_le16 (h + 8, ZIP_FLAGS);
      put_le16 (h + 10, 0); /* stored */
      put_le32 (h + 16, entry->crc);
      put_le32 (h + 20, entry->zip64_sizes ? 0xFFFFFFFF : entry->size);
      put_le32 (h + 24, entry->zip64_sizes ? 0xFFFFFFFF : entry->size);
      put_le16 (h + 28, name_len);
      put_le16 (h + 30, extra_len);
      put_le32 (h + 42, entry->zip64_offset ? 0xFFFFFFFF : entry->header_offset);
      if (!output_write (out, h, ZIP_CENTRAL_HEADER_SIZE, error)
          || !output_write (out, entry->name, name_len, error))
        return FALSE;
      if (extra_len > 0)
        {
          guint8 *e = h + ZIP_CENTRAL_HEADER_SIZE;
          guint8 *q = e + 4;

          /* zip64 extended information: uncompressed size, compressed size, header offset, each
           * present only where the 32-bit field above holds 0xFFFFFFFF */
          put_le16 (e, 0x0001);
          put_le16 (e + 2, extra_len - 4);
          if (entry->zip64_sizes)
            {
              put_le64 (q, entry->size);
              put_le64 (q + 8, entry->size);
              q += 16;
            }
          if (entry->zip64_offset)
            put_le64 (q, entry->header_offset);
          if (!output_write (out, e, extra_len, error))
            return FALSE;
        }
    }

  /* torch always writes the zip64 end-of-central-directory record and its locator */
  p = tail;
  put_le32 (p, 0x06064b50);
  put_le64 (p + 4, ZIP64_EOCD_SIZE - 12);
  put_le16 (p + 12, 0x031E);
  put_le16 (p + 14, 45);
  put_le64 (p + 24, n);
  put_le64 (p + 32, n);
  put_le64 (p + 40, plan->central_size);
  put_le64 (p + 48, plan->central_offset);

  p += ZIP64_EOCD_SIZE;
  put_le32 (p, 0x07064b50);
  put_le64 (p + 8, plan->zip64_eocd_offset);
  put_le32 (p + 16, 1);

  p += ZIP64_LOCATOR_SIZE;
  put_le32 (p, 0x06054b50);
  put_le16 (p + 8, MIN (n, 0xFFFF));
  put_le16 (p + 10, MIN (n, 0xFFFF));
  put_le32 (p + 12, MIN (plan->central_size, ZIP_U32_LIMIT));
  put_le32 (p + 16, MIN (plan->central_offset, ZIP_U32_LIMIT));

  return output_write (out, tail, sizeof tail, error);
}

static gboolean
write_zip (Output *out, ZipPlan *plan, GError **error)
{
  guint64 base = out->offset;

  for (guint i = 0; i < plan->entries->len; i++)
    {
      ZipEntry *entry = &g_array_index (plan->entries, ZipEntry, i);

      if (!write_local_header (out, entry, error))
        return FALSE;
      g_assert (out->offset - base == entry->data_offset);
      switch (entry->kind)
        {
        case ZIP_ENTRY_BYTES:
          {
            gsize len;
            const guint8 *data = g_bytes_get_data (entry->bytes, &len);

            entry->crc = crc32_update (&out->crc, 0, data, len);
            if (!output_write (out, data, len, error))
              return FALSE;
            break;
          }
        case ZIP_ENTRY_TENSOR:
          if (!write_tensor_data (out, entry, error))
            return FALSE;
          break;
        case ZIP_ENTRY_SERIALIZATION_ID:
          {
            g_autofree char *id = serialization_id (plan, i);

            g_assert (strlen (id) == SERIALIZATION_ID_LEN);
            entry->crc = crc32_update (&out->crc, 0, (const guint8 *)id, SERIALIZATION_ID_LEN);
            if (!output_write (out, id, SERIALIZATION_ID_LEN, error))
              return FALSE;
            break;
          }
        }
      if (!write_data_descriptor (out, entry, error))
        return FALSE;
    }
  g_assert (out->offset - base == plan->central_offset);
  if (!write_central_directory (out, plan, error))
    return FALSE;
  if (out->offset - base != plan->total_size)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                   "Checkpoint size %" G_GUINT64_FORMAT
                   " differs from the planned %" G_GUINT64_FORMAT,
                   out->offset - base, plan->total_size);
      return FALSE;
    }
  return TRUE;
}

/* torch names the zip's root folder after the file name up to its first dot */
static char *
archive_root_for (const char *path)
{
  g_autofree char *base = g_path_get_basename (path);
  char *dot = strchr (base, '.');

  if (dot != NULL)
    *dot = '\0';
  if (*base == '\0')
    return g_strdup ("archive");
  return g_steal_pointer (&base);
}

gboolean
gepard_nemo_writer_write_ckpt (GepardNemoWriter *writer, const char *path, GError **error)
{
  g_autofree char *root = NULL;
  ZipPlan plan = {0};
  Output out;
  gboolean ok;

  g_return_val_if_fail (writer != NULL, FALSE);
  g_return_val_if_fail (path != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  root = archive_root_for (path);
  zip_plan_build (&plan, writer, root);
  if (!output_open (&out, path, error))
    {
      zip_plan_clear (&plan);
      return FALSE;
    }
  ok = write_zip (&out, &plan, error);
  zip_plan_clear (&plan);
  return output_finish (&out, ok, error);
}

/* --- tar (ustar) --- */

static void
tar_octal (guint8 *field, gsize width, guint64 value)
{
  /* width-1 octal digits and a NUL, as Python's tarfile writes numbers */
  g_autofree char *s = g_strdup_printf ("%0*" G_GINT64_MODIFIER "o", (int)(width - 1), value);

  memcpy (field, s, width - 1);
  field[width - 1] = '\0';
}

static gboolean
write_tar_header (Output *out, const char *name, char type, guint mode, guint64 size,
                  GError **error)
{
  guint8 h[TAR_BLOCK] = {0};
  guint checksum = 0;

  g_assert (strlen (name) < 100);
  memcpy (h, name, strlen (name));
  tar_octal (h + 100, 8, mode);
  tar_octal (h + 108, 8, 0); /* uid */
  tar_octal (h + 116, 8, 0); /* gid */
  if (size < G_GUINT64_CONSTANT (077777777777))
    tar_octal (h + 124, 12, size);
  else
    {
      /* base-256 (GNU/star) for sizes beyond 11 octal digits; Python's tarfile reads it */
      h[124] = 0x80;
      for (int i = 0; i < 8; i++)
        h[135 - i] = (size >> (8 * i)) & 0xff;
    }
  /* a fixed mtime keeps archives of the same tensors byte-identical */
  tar_octal (h + 136, 12, 0);
  memset (h + 148, ' ', 8);
  h[156] = type;
  memcpy (h + 257,
          "ustar\0"
          "00",
          8);

  for (int i = 0; i < TAR_BLOCK; i++)
    checksum += h[i];
  tar_octal (h + 148, 7, checksum);
  h[155] = ' ';

  return output_write (out, h, TAR_BLOCK, error);
}

static gboolean
write_tar_padding (Output *out, guint64 size, GError **error)
{
  return output_zeros (out, (TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK, error);
}

static gboolean
write_nemo (Output *out, GepardNemoWriter *writer, ZipPlan *plan, GError **error)
{
  gsize yaml_len = strlen (writer->config_yaml);

  /* tarfile.add(folder, arcname=".") stores the folder itself first, then its sorted files */
  if (!write_tar_header (out, "./", '5', 0755, 0, error)
      || !write_tar_header (out, "./model_config.yaml", '0', 0644, yaml_len, error)
      || !output_write (out, writer->config_yaml, yaml_len, error)
      || !write_tar_padding (out, yaml_len, error)
      || !write_tar_header (out, "./model_weights.ckpt", '0', 0644, plan->total_size, error)
      || !write_zip (out, plan, error) || !write_tar_padding (out, plan->total_size, error))
    return FALSE;

  /* end of archive: two zero blocks, then zeros up to a whole record */
  if (!output_zeros (out, 2 * TAR_BLOCK, error))
    return FALSE;
  return output_zeros (out, (TAR_RECORD - out->offset % TAR_RECORD) % TAR_RECORD, error);
}

gboolean
gepard_nemo_writer_write (GepardNemoWriter *writer, const char *path, GError **error)
{
  ZipPlan plan = {0};
  Output out;
  gboolean ok;

  g_return_val_if_fail (writer != NULL, FALSE);
  g_return_val_if_fail (path != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  /* nanocodec.md §5: the checkpoint inside is model_weights.ckpt, so its root is model_weights */
  zip_plan_build (&plan, writer, "model_weights");
  if (!output_open (&out, path, error))
    {
      zip_plan_clear (&plan);
      return FALSE;
    }
  ok = write_nemo (&out, writer, &plan, error);
  zip_plan_clear (&plan);
  return output_finish (&out, ok, error);
}
