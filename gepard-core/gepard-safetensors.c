/* gepard-safetensors.c: reading safetensors files through mmap and writing them in one pass.
 *
 * Reading trusts nothing in the file. The header is checked in three steps before any tensor
 * pointer is handed out:
 *   1. the 8-byte length and the header bytes themselves (bounds, UTF-8, strict JSON syntax with a
 *      nesting limit, checked without recursion so a hostile header cannot exhaust the stack);
 *   2. parsing with json-glib, counting object members to catch duplicated keys, which json-glib
 *      would otherwise merge silently;
 *   3. every tensor entry (dtype, shape, offsets, size), then the set of tensors (no overlap).
 *
 * Unlike the reference implementation, gaps between tensors and bytes after the last tensor are
 * accepted: they cannot make a read go out of bounds, and aligned writers produce them. */

#include "gepard-safetensors.h"

#include "gepard-error.h"
#include "gepard-json.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>
#include <json-glib/json-glib.h>

/* The reference implementation refuses headers above 100 MB; so do we, on both sides. */
#define HEADER_LENGTH_LIMIT G_GUINT64_CONSTANT (100000000)
/* A valid header nests three levels deep (header, entry, shape). The limit only has to keep
 * json-glib's recursive parser far from the end of the stack. */
#define METADATA_KEY "__metadata__"

/* ---- dtypes ---- */

typedef struct
{
  const char *name;
  gsize size;
} DTypeInfo;

static const DTypeInfo dtype_info[] = {
    [GEPARD_DTYPE_BF16] = {"BF16", 2}, [GEPARD_DTYPE_F16] = {"F16", 2},
    [GEPARD_DTYPE_F32] = {"F32", 4},   [GEPARD_DTYPE_I64] = {"I64", 8},
    [GEPARD_DTYPE_I32] = {"I32", 4},   [GEPARD_DTYPE_U8] = {"U8", 1},
};

static gboolean
dtype_is_valid (GepardDType dtype)
{
  return (guint)dtype < G_N_ELEMENTS (dtype_info);
}

gsize
gepard_dtype_size (GepardDType dtype)
{
  g_return_val_if_fail (dtype_is_valid (dtype), 0);
  return dtype_info[dtype].size;
}

const char *
gepard_dtype_name (GepardDType dtype)
{
  g_return_val_if_fail (dtype_is_valid (dtype), NULL);
  return dtype_info[dtype].name;
}

gboolean
gepard_dtype_from_name (const char *name, GepardDType *dtype)
{
  g_return_val_if_fail (name != NULL, FALSE);

  for (guint i = 0; i < G_N_ELEMENTS (dtype_info); i++)
    {
      if (strcmp (name, dtype_info[i].name) == 0)
        {
          if (dtype != NULL)
            *dtype = (GepardDType)i;
          return TRUE;
        }
    }
  return FALSE;
}

/* ---- tensors ---- */

/* IEEE 754 binary16 to binary32. Every half value, subnormals included, is exactly representable
 * as a float, so this is a pure re-encoding of sign, exponent and mantissa. */
static float
half_to_float (guint16 half)
{
  guint32 sign = (guint32)(half & 0x8000u) << 16;
  guint32 exponent = (half >> 10) & 0x1fu;
  guint32 mantissa = half & 0x3ffu;
  guint32 bits;
  float value;

  if (exponent == 0x1fu)
    {
      /* inf, or nan with its payload kept in the top mantissa bits */
      bits = sign | 0x7f800000u | (mantissa << 13);
    }
  else if (exponent != 0)
    {
      /* normal: rebias the exponent from 15 to 127 */
      bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
  else if (mantissa == 0)
    {
      bits = sign; /* signed zero */
    }
  else
    {
      /* subnormal half, mantissa * 2^-24: shift the leading one into the implicit bit position;
       * the result is a normal float. 113 is the float biased exponent of 2^-14. */
      guint32 float_exponent = 113u;
      while ((mantissa & 0x400u) == 0)
        {
          mantissa <<= 1;
          float_exponent--;
        }
      bits = sign | (float_exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }

  memcpy (&value, &bits, sizeof value);
  return value;
}

/* Tensor bytes sit at arbitrary offsets inside the mapping, so every element is read with memcpy
 * rather than through a cast pointer. */
void
gepard_tensor_to_f32 (const GepardTensor *tensor, float *dst)
{
  const guint8 *src;

  g_return_if_fail (tensor != NULL);
  g_return_if_fail (dst != NULL || tensor->n_elements == 0);
  g_return_if_fail (tensor->dtype == GEPARD_DTYPE_BF16 || tensor->dtype == GEPARD_DTYPE_F16
                    || tensor->dtype == GEPARD_DTYPE_F32);

  src = tensor->data;
  switch (tensor->dtype)
    {
    case GEPARD_DTYPE_BF16:
      /* bfloat16 is the top half of a float32 */
      for (guint64 i = 0; i < tensor->n_elements; i++)
        {
          guint16 half_le;
          guint32 bits;
          memcpy (&half_le, src + i * 2, 2);
          bits = (guint32)GUINT16_FROM_LE (half_le) << 16;
          memcpy (&dst[i], &bits, 4);
        }
      break;
    case GEPARD_DTYPE_F16:
      for (guint64 i = 0; i < tensor->n_elements; i++)
        {
          guint16 half_le;
          memcpy (&half_le, src + i * 2, 2);
          dst[i] = half_to_float (GUINT16_FROM_LE (half_le));
        }
      break;
    case GEPARD_DTYPE_F32:
#if G_BYTE_ORDER == G_LITTLE_ENDIAN
      if (tensor->n_elements > 0)
        memcpy (dst, src, tensor->n_elements * 4);
#else
      for (guint64 i = 0; i < tensor->n_elements; i++)
        {
          guint32 bits;
          memcpy (&bits, src + i * 4, 4);
          bits = GUINT32_FROM_LE (bits);
          memcpy (&dst[i], &bits, 4);
        }
#endif
      break;
    case GEPARD_DTYPE_I64:
    case GEPARD_DTYPE_I32:
    case GEPARD_DTYPE_U8:
    default:
      g_assert_not_reached ();
    }
}

gboolean
gepard_tensor_has_shape (const GepardTensor *tensor, guint n_dims, const gint64 *shape)
{
  g_return_val_if_fail (tensor != NULL, FALSE);
  g_return_val_if_fail (shape != NULL || n_dims == 0, FALSE);

  if (tensor->n_dims != n_dims)
    return FALSE;
  for (guint i = 0; i < n_dims; i++)
    if (tensor->shape[i] != shape[i])
      return FALSE;
  return TRUE;
}

static char *
shape_to_string (guint n_dims, const gint64 *shape)
{
  GString *out = g_string_new ("[");

  for (guint i = 0; i < n_dims; i++)
    g_string_append_printf (out, "%s%" G_GINT64_FORMAT, i > 0 ? ", " : "", shape[i]);
  g_string_append_c (out, ']');
  return g_string_free (out, FALSE);
}

char *
gepard_tensor_shape_to_string (const GepardTensor *tensor)
{
  g_return_val_if_fail (tensor != NULL, NULL);
  return shape_to_string (MIN (tensor->n_dims, GEPARD_TENSOR_MAX_DIMS), tensor->shape);
}

/* ---- duplicate keys ---- */

/* json-glib keeps only one of two members with the same name. The parser reports every member it
 * reads, so a name seen twice in one object is a duplicate, whatever json-glib kept. */
typedef struct
{
  GHashTable *names_by_object; /* JsonObject* → set of member names */
  char *duplicate;             /* first duplicated name */
} DuplicateScan;

static void
on_object_member (JsonParser *parser, JsonObject *object, const char *name, gpointer user_data)
{
  DuplicateScan *scan = user_data;
  GHashTable *names;

  if (scan->duplicate != NULL)
    return;
  names = g_hash_table_lookup (scan->names_by_object, object);
  if (names == NULL)
    {
      names = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
      g_hash_table_insert (scan->names_by_object, object, names);
    }
  if (!g_hash_table_add (names, g_strdup (name)))
    scan->duplicate = g_strdup (name);
}

/* ---- the open file ---- */

struct _GepardSafetensors
{
  char *path;
  GMappedFile *mapped;
  GepardTensor *tensors; /* ascending data offset */
  guint n_tensors;
  GPtrArray *strings;       /* owns tensor names */
  GHashTable *by_name;      /* name → GepardTensor* */
  GHashTable *metadata;     /* key → value, both owned */
  GPtrArray *metadata_keys; /* file order, NULL-terminated, borrowed from `metadata` */
};

void
gepard_safetensors_free (GepardSafetensors *file)
{
  if (file == NULL)
    return;
  g_clear_pointer (&file->by_name, g_hash_table_unref);
  g_clear_pointer (&file->metadata_keys, g_ptr_array_unref);
  g_clear_pointer (&file->metadata, g_hash_table_unref);
  g_clear_pointer (&file->strings, g_ptr_array_unref);
  g_free (file->tensors);
  g_clear_pointer (&file->mapped, g_mapped_file_unref);
  g_free (file->path);
  g_free (file);
}

const char *
gepard_safetensors_get_path (const GepardSafetensors *file)
{
  g_return_val_if_fail (file != NULL, NULL);
  return file->path;
}

guint
gepard_safetensors_get_n_tensors (const GepardSafetensors *file)
{
  g_return_val_if_fail (file != NULL, 0);
  return file->n_tensors;
}

const GepardTensor *
gepard_safetensors_get_nth (const GepardSafetensors *file, guint index)
{
  g_return_val_if_fail (file != NULL, NULL);
  g_return_val_if_fail (index < file->n_tensors, NULL);
  return &file->tensors[index];
}

const GepardTensor *
gepard_safetensors_lookup (const GepardSafetensors *file, const char *name)
{
  g_return_val_if_fail (file != NULL, NULL);
  g_return_val_if_fail (name != NULL, NULL);
  return g_hash_table_lookup (file->by_name, name);
}

const char *
gepard_safetensors_get_metadata (const GepardSafetensors *file, const char *key)
{
  g_return_val_if_fail (file != NULL, NULL);
  g_return_val_if_fail (key != NULL, NULL);
  return g_hash_table_lookup (file->metadata, key);
}

const char *const *
gepard_safetensors_get_metadata_keys (const GepardSafetensors *file)
{
  g_return_val_if_fail (file != NULL, NULL);
  return (const char *const *)file->metadata_keys->pdata;
}

/* A tensor entry while the header is checked: the offsets are kept for sorting and the overlap
 * check, `index` (header order) breaks ties so equal offsets keep their written order. */
typedef struct
{
  GepardTensor tensor;
  guint64 begin;
  guint64 end;
  guint index;
} TensorEntry;

static gboolean corrupt (GError **error, const char *path, const char *format, ...)
    G_GNUC_PRINTF (3, 4);

static gboolean
corrupt (GError **error, const char *path, const char *format, ...)
{
  va_list args;
  g_autofree char *message = NULL;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT, "%s: %s", path, message);
  return FALSE;
}

static gboolean
node_is_int (JsonNode *node)
{
  return node != NULL && JSON_NODE_HOLDS_VALUE (node)
         && json_node_get_value_type (node) == G_TYPE_INT64;
}

static gboolean
node_is_string (JsonNode *node)
{
  return node != NULL && JSON_NODE_HOLDS_VALUE (node)
         && json_node_get_value_type (node) == G_TYPE_STRING;
}

static gboolean
parse_tensor_entry (const char *path, const char *name, JsonNode *node, guint64 buffer_len,
                    TensorEntry *entry, GError **error)
{
  static const char *const required[] = {"dtype", "shape", "data_offsets"};
  JsonObject *object;
  JsonNode *dtype_node;
  JsonArray *shape, *offsets;
  const char *dtype_name;
  guint64 n_elements = 1, n_bytes;
  gint64 begin, end;

  if (!JSON_NODE_HOLDS_OBJECT (node))
    return corrupt (error, path, "tensor \"%s\": entry is not a JSON object", name);
  object = json_node_get_object (node);
  for (guint i = 0; i < G_N_ELEMENTS (required); i++)
    if (!json_object_has_member (object, required[i]))
      return corrupt (error, path, "tensor \"%s\": entry lacks \"%s\"", name, required[i]);

  dtype_node = json_object_get_member (object, "dtype");
  if (!node_is_string (dtype_node))
    return corrupt (error, path, "tensor \"%s\": \"dtype\" is not a string", name);
  dtype_name = json_node_get_string (dtype_node);
  if (!gepard_dtype_from_name (dtype_name, &entry->tensor.dtype))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: tensor \"%s\": dtype \"%s\" is not supported "
                   "(Gepard reads BF16, F16, F32, I64, I32 and U8)",
                   path, name, dtype_name);
      return FALSE;
    }

  node = json_object_get_member (object, "shape");
  if (!JSON_NODE_HOLDS_ARRAY (node))
    return corrupt (error, path, "tensor \"%s\": \"shape\" is not an array", name);
  shape = json_node_get_array (node);
  if (json_array_get_length (shape) > GEPARD_TENSOR_MAX_DIMS)
    return corrupt (error, path, "tensor \"%s\": shape has %u dimensions, more than %d", name,
                    json_array_get_length (shape), GEPARD_TENSOR_MAX_DIMS);
  entry->tensor.n_dims = json_array_get_length (shape);
  for (guint i = 0; i < entry->tensor.n_dims; i++)
    {
      JsonNode *dim_node = json_array_get_element (shape, i);
      gint64 dim;

      if (!node_is_int (dim_node))
        return corrupt (error, path, "tensor \"%s\": shape entry %u is not an integer", name, i);
      dim = json_node_get_int (dim_node);
      if (dim < 0)
        return corrupt (error, path,
                        "tensor \"%s\": shape entry %u is negative (%" G_GINT64_FORMAT ")", name, i,
                        dim);
      entry->tensor.shape[i] = dim;
      if (!g_uint64_checked_mul (&n_elements, n_elements, (guint64)dim))
        return corrupt (error, path, "tensor \"%s\": element count of the shape overflows 64 bits",
                        name);
    }
  if (!g_uint64_checked_mul (&n_bytes, n_elements, gepard_dtype_size (entry->tensor.dtype))
      || n_bytes > G_MAXSIZE)
    return corrupt (error, path, "tensor \"%s\": byte size of the shape overflows", name);

  node = json_object_get_member (object, "data_offsets");
  if (!JSON_NODE_HOLDS_ARRAY (node) || json_array_get_length (json_node_get_array (node)) != 2
      || !node_is_int (json_array_get_element (json_node_get_array (node), 0))
      || !node_is_int (json_array_get_element (json_node_get_array (node), 1)))
    return corrupt (error, path, "tensor \"%s\": \"data_offsets\" is not an array of two integers",
                    name);
  offsets = json_node_get_array (node);
  begin = json_array_get_int_element (offsets, 0);
  end = json_array_get_int_element (offsets, 1);
  if (begin < 0 || end < 0)
    return corrupt (error, path, "tensor \"%s\": \"data_offsets\" are negative", name);
  if (begin > end)
    return corrupt (error, path,
                    "tensor \"%s\": data_offsets begin %" G_GINT64_FORMAT
                    " is after end %" G_GINT64_FORMAT,
                    name, begin, end);
  if ((guint64)end > buffer_len)
    return corrupt (error, path,
                    "tensor \"%s\": data_offsets end %" G_GINT64_FORMAT
                    " lies beyond the %" G_GUINT64_FORMAT "-byte data buffer",
                    name, end, buffer_len);
  if ((guint64)(end - begin) != n_bytes)
    {
      g_autofree char *shape_text = shape_to_string (entry->tensor.n_dims, entry->tensor.shape);
      return corrupt (error, path,
                      "tensor \"%s\": data_offsets span %" G_GUINT64_FORMAT
                      " bytes but %s %s needs %" G_GUINT64_FORMAT,
                      name, (guint64)(end - begin), dtype_name, shape_text, n_bytes);
    }

  entry->tensor.n_elements = n_elements;
  entry->tensor.n_bytes = (gsize)n_bytes;
  entry->begin = (guint64)begin;
  entry->end = (guint64)end;
  return TRUE;
}

static int
compare_entries (gconstpointer a, gconstpointer b, gpointer user_data)
{
  const TensorEntry *x = a, *y = b;

  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

static gboolean
parse_metadata (GepardSafetensors *file, JsonNode *node, GError **error)
{
  JsonObject *object;
  g_autoptr (GList) members = NULL;

  if (!JSON_NODE_HOLDS_OBJECT (node))
    return corrupt (error, file->path, "\"" METADATA_KEY "\" is not a JSON object");
  object = json_node_get_object (node);
  members = json_object_get_members (object);
  for (GList *l = members; l != NULL; l = l->next)
    {
      const char *key = l->data;
      JsonNode *value = json_object_get_member (object, key);
      char *owned_key;

      if (!node_is_string (value))
        return corrupt (error, file->path, "\"" METADATA_KEY "\" entry \"%s\" is not a string",
                        key);
      owned_key = g_strdup (key);
      g_hash_table_insert (file->metadata, owned_key, g_strdup (json_node_get_string (value)));
      g_ptr_array_insert (file->metadata_keys, file->metadata_keys->len - 1, owned_key);
    }
  return TRUE;
}

static gboolean
parse_header (GepardSafetensors *file, const guint8 *header, gsize header_len, guint64 buffer_len,
              const guint8 *buffer, GError **error)
{
  GepardJsonCheck check;
  g_autoptr (JsonParser) parser = NULL;
  g_autoptr (GHashTable) names_by_object = NULL;
  g_autoptr (GError) json_error = NULL;
  g_autoptr (GList) members = NULL;
  g_autofree TensorEntry *entries = NULL;
  DuplicateScan scan;
  JsonNode *root;
  JsonObject *object;
  const char *invalid_utf8;
  guint n_entries = 0;
  gboolean parsed;

  if (!g_utf8_validate_len ((const char *)header, header_len, &invalid_utf8))
    return corrupt (error, file->path, "header is not valid UTF-8 (byte %" G_GSIZE_FORMAT ")",
                    (gsize)((const guint8 *)invalid_utf8 - header));
  if (!gepard_json_check ((const char *)header, header_len, &check))
    {
      g_set_error (error, GEPARD_FORMAT_ERROR,
                   check.escaped_nul ? GEPARD_FORMAT_ERROR_UNSUPPORTED
                                     : GEPARD_FORMAT_ERROR_CORRUPT,
                   "%s: header is not valid JSON: %s (byte %" G_GSIZE_FORMAT ")", file->path,
                   check.problem, check.offset);
      return FALSE;
    }

  names_by_object = g_hash_table_new_full (g_direct_hash, g_direct_equal, NULL,
                                           (GDestroyNotify)g_hash_table_unref);
  scan.names_by_object = names_by_object;
  scan.duplicate = NULL;
  parser = json_parser_new_immutable ();
  g_signal_connect (parser, "object-member", G_CALLBACK (on_object_member), &scan);
  parsed
      = json_parser_load_from_data (parser, (const char *)header, (gssize)header_len, &json_error);
  g_signal_handlers_disconnect_by_data (parser, &scan);
  if (!parsed)
    {
      g_free (scan.duplicate);
      return corrupt (error, file->path, "header is not valid JSON: %s", json_error->message);
    }
  if (scan.duplicate != NULL)
    {
      g_autofree char *duplicate = scan.duplicate;
      return corrupt (error, file->path, "header has the key \"%s\" twice in one object",
                      duplicate);
    }

  root = json_parser_get_root (parser);
  if (root == NULL || !JSON_NODE_HOLDS_OBJECT (root))
    return corrupt (error, file->path, "header is not a JSON object");
  object = json_node_get_object (root);

  members = json_object_get_members (object);
  entries = g_new0 (TensorEntry, json_object_get_size (object));
  for (GList *l = members; l != NULL; l = l->next)
    {
      const char *name = l->data;
      JsonNode *node = json_object_get_member (object, name);
      TensorEntry *entry;

      if (strcmp (name, METADATA_KEY) == 0)
        {
          if (!parse_metadata (file, node, error))
            return FALSE;
          continue;
        }
      entry = &entries[n_entries];
      if (!parse_tensor_entry (file->path, name, node, buffer_len, entry, error))
        return FALSE;
      entry->index = n_entries++;
      entry->tensor.name = name; /* replaced by an owned copy below */
    }

  g_qsort_with_data (entries, n_entries, sizeof (TensorEntry), compare_entries, NULL);
  /* Sorted by begin, tensors overlap exactly when one starts before the furthest end so far.
   * Empty tensors cover no byte and overlap nothing. */
  {
    guint64 covered_end = 0;
    const char *covering = NULL;
    for (guint i = 0; i < n_entries; i++)
      {
        if (entries[i].begin == entries[i].end)
          continue;
        if (covering != NULL && entries[i].begin < covered_end)
          return corrupt (error, file->path, "tensors \"%s\" and \"%s\" overlap", covering,
                          entries[i].tensor.name);
        covered_end = entries[i].end;
        covering = entries[i].tensor.name;
      }
  }

  file->n_tensors = n_entries;
  file->tensors = g_new0 (GepardTensor, MAX (n_entries, 1));
  for (guint i = 0; i < n_entries; i++)
    {
      GepardTensor *tensor = &file->tensors[i];
      char *name = g_strdup (entries[i].tensor.name);

      *tensor = entries[i].tensor;
      tensor->name = name;
      tensor->data = buffer + entries[i].begin;
      g_ptr_array_add (file->strings, name);
      g_hash_table_insert (file->by_name, name, tensor);
    }
  return TRUE;
}

GepardSafetensors *
gepard_safetensors_open (const char *path, GError **error)
{
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GError) map_error = NULL;
  const guint8 *contents;
  guint64 header_len_le, header_len;
  gsize size;
  struct stat st;
  int fd;

  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* O_NONBLOCK: opening a FIFO must not hang; it is refused below as not a regular file */
  fd = g_open (path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
  if (fd < 0)
    {
      int saved_errno = errno;
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "%s: cannot open: %s", path,
                   g_strerror (saved_errno));
      return NULL;
    }
  if (fstat (fd, &st) != 0)
    {
      int saved_errno = errno;
      g_close (fd, NULL);
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "%s: cannot stat: %s", path,
                   g_strerror (saved_errno));
      return NULL;
    }
  if (!S_ISREG (st.st_mode))
    {
      g_close (fd, NULL);
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "%s: %s", path,
                   S_ISDIR (st.st_mode) ? "is a directory, not a safetensors file"
                                        : "is not a regular file");
      return NULL;
    }
  if (st.st_size < 8)
    {
      g_close (fd, NULL);
      corrupt (error, path,
               "file is %" G_GINT64_FORMAT " bytes, shorter than the 8-byte header length",
               (gint64)st.st_size);
      return NULL;
    }

  file = g_new0 (GepardSafetensors, 1);
  file->path = g_strdup (path);
  file->strings = g_ptr_array_new_with_free_func (g_free);
  file->by_name = g_hash_table_new (g_str_hash, g_str_equal);
  file->metadata = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  file->metadata_keys = g_ptr_array_new ();
  g_ptr_array_add (file->metadata_keys, NULL);

  /* Read-only and shared: tensors are used in place. A file truncated by someone else while
   * mapped makes later reads fault (SIGBUS); model files are not rewritten in place, the writer
   * below replaces them by rename. */
  file->mapped = g_mapped_file_new_from_fd (fd, FALSE, &map_error);
  g_close (fd, NULL); /* the mapping keeps its own reference to the file */
  if (file->mapped == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "%s: cannot map: %s", path,
                   map_error->message);
      return NULL;
    }

  /* the file may have shrunk since fstat(); only the mapping's own length counts */
  contents = (const guint8 *)g_mapped_file_get_contents (file->mapped);
  size = g_mapped_file_get_length (file->mapped);
  if (contents == NULL || size < 8)
    {
      corrupt (error, path,
               "file is %" G_GSIZE_FORMAT " bytes, shorter than the 8-byte header length",
               contents == NULL ? 0 : size);
      return NULL;
    }

  memcpy (&header_len_le, contents, 8);
  header_len = GUINT64_FROM_LE (header_len_le);
  if (header_len > HEADER_LENGTH_LIMIT)
    {
      corrupt (error, path,
               "header length %" G_GUINT64_FORMAT " exceeds the limit of %" G_GUINT64_FORMAT
               " bytes",
               header_len, HEADER_LENGTH_LIMIT);
      return NULL;
    }
  if (header_len > size - 8)
    {
      corrupt (error, path,
               "header length %" G_GUINT64_FORMAT " exceeds the %" G_GSIZE_FORMAT
               " bytes that follow it",
               header_len, size - 8);
      return NULL;
    }

  if (!parse_header (file, contents + 8, (gsize)header_len, size - 8 - header_len,
                     contents + 8 + header_len, error))
    return NULL;
  return g_steal_pointer (&file);
}

/* ---- writer ---- */

/* A declared tensor: either `fill` produces its bytes during write(), or `copy` holds them. */
typedef struct
{
  char *name;
  GepardDType dtype;
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  guint64 n_bytes;
  GepardTensorFillFunc fill;
  gpointer user_data;
  guint8 *copy;
} WriterTensor;

struct _GepardSafetensorsWriter
{
  GPtrArray *tensors;       /* WriterTensor*, in the order added */
  GHashTable *names;        /* set of tensor names, borrowed from `tensors` */
  GHashTable *metadata;     /* key → value, both owned */
  GPtrArray *metadata_keys; /* in the order first set, borrowed from `metadata` */
  /* The add functions return nothing, so a declaration that cannot be written is remembered and
   * reported by write(). */
  GError *declaration_error;
};

static void
writer_tensor_free (WriterTensor *tensor)
{
  g_free (tensor->name);
  g_free (tensor->copy);
  g_free (tensor);
}

GepardSafetensorsWriter *
gepard_safetensors_writer_new (void)
{
  GepardSafetensorsWriter *writer = g_new0 (GepardSafetensorsWriter, 1);

  writer->tensors = g_ptr_array_new_with_free_func ((GDestroyNotify)writer_tensor_free);
  writer->names = g_hash_table_new (g_str_hash, g_str_equal);
  writer->metadata = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, g_free);
  writer->metadata_keys = g_ptr_array_new ();
  return writer;
}

void
gepard_safetensors_writer_free (GepardSafetensorsWriter *writer)
{
  if (writer == NULL)
    return;
  g_hash_table_unref (writer->names);
  g_ptr_array_unref (writer->tensors);
  g_ptr_array_unref (writer->metadata_keys);
  g_hash_table_unref (writer->metadata);
  g_clear_error (&writer->declaration_error);
  g_free (writer);
}

static void writer_reject (GepardSafetensorsWriter *writer, GepardFormatError code,
                           const char *format, ...) G_GNUC_PRINTF (3, 4);

static void
writer_reject (GepardSafetensorsWriter *writer, GepardFormatError code, const char *format, ...)
{
  va_list args;

  if (writer->declaration_error != NULL)
    return; /* the first problem is the one worth reporting */
  va_start (args, format);
  writer->declaration_error = g_error_new_valist (GEPARD_FORMAT_ERROR, code, format, args);
  va_end (args);
}

void
gepard_safetensors_writer_set_metadata (GepardSafetensorsWriter *writer, const char *key,
                                        const char *value)
{
  g_return_if_fail (writer != NULL);
  g_return_if_fail (key != NULL);
  g_return_if_fail (value != NULL);

  if (!g_utf8_validate (key, -1, NULL) || !g_utf8_validate (value, -1, NULL))
    {
      writer_reject (writer, GEPARD_FORMAT_ERROR_CORRUPT,
                     "metadata key or value is not valid UTF-8");
      return;
    }
  if (g_hash_table_contains (writer->metadata, key))
    {
      /* keeps the key's first position */
      g_hash_table_insert (writer->metadata, g_strdup (key), g_strdup (value));
    }
  else
    {
      char *owned_key = g_strdup (key);
      g_hash_table_insert (writer->metadata, owned_key, g_strdup (value));
      g_ptr_array_add (writer->metadata_keys, owned_key);
    }
}

/* Validates a declaration and returns it with its byte size, or NULL after recording why. */
static WriterTensor *
writer_declare (GepardSafetensorsWriter *writer, const char *name, GepardDType dtype, guint n_dims,
                const gint64 *shape)
{
  WriterTensor *tensor;
  guint64 n_elements = 1;

  if (!g_utf8_validate (name, -1, NULL))
    {
      writer_reject (writer, GEPARD_FORMAT_ERROR_CORRUPT, "a tensor name is not valid UTF-8");
      return NULL;
    }
  if (strcmp (name, METADATA_KEY) == 0)
    {
      writer_reject (writer, GEPARD_FORMAT_ERROR_CORRUPT,
                     "tensor \"%s\": the name is reserved for metadata", name);
      return NULL;
    }
  if (g_hash_table_contains (writer->names, name))
    {
      writer_reject (writer, GEPARD_FORMAT_ERROR_CORRUPT, "tensor \"%s\" is added twice", name);
      return NULL;
    }
  if (n_dims > GEPARD_TENSOR_MAX_DIMS)
    {
      writer_reject (writer, GEPARD_FORMAT_ERROR_SHAPE,
                     "tensor \"%s\": %u dimensions, more than %d", name, n_dims,
                     GEPARD_TENSOR_MAX_DIMS);
      return NULL;
    }
  for (guint i = 0; i < n_dims; i++)
    {
      if (shape[i] < 0)
        {
          writer_reject (writer, GEPARD_FORMAT_ERROR_SHAPE,
                         "tensor \"%s\": shape entry %u is negative (%" G_GINT64_FORMAT ")", name,
                         i, shape[i]);
          return NULL;
        }
      if (!g_uint64_checked_mul (&n_elements, n_elements, (guint64)shape[i]))
        {
          writer_reject (writer, GEPARD_FORMAT_ERROR_SHAPE,
                         "tensor \"%s\": element count overflows 64 bits", name);
          return NULL;
        }
    }

  tensor = g_new0 (WriterTensor, 1);
  /* the data_offsets must stay representable as JSON integers that readers accept (gint64) */
  if (!g_uint64_checked_mul (&tensor->n_bytes, n_elements, gepard_dtype_size (dtype))
      || tensor->n_bytes > (guint64)G_MAXINT64 || tensor->n_bytes > G_MAXSIZE)
    {
      g_free (tensor);
      writer_reject (writer, GEPARD_FORMAT_ERROR_SHAPE, "tensor \"%s\": byte size overflows", name);
      return NULL;
    }
  tensor->name = g_strdup (name);
  tensor->dtype = dtype;
  tensor->n_dims = n_dims;
  for (guint i = 0; i < n_dims; i++)
    tensor->shape[i] = shape[i];
  return tensor;
}

static void
writer_append (GepardSafetensorsWriter *writer, WriterTensor *tensor)
{
  g_ptr_array_add (writer->tensors, tensor);
  g_hash_table_add (writer->names, tensor->name);
}

void
gepard_safetensors_writer_add (GepardSafetensorsWriter *writer, const char *name, GepardDType dtype,
                               guint n_dims, const gint64 *shape, GepardTensorFillFunc fill,
                               gpointer user_data)
{
  WriterTensor *tensor;

  g_return_if_fail (writer != NULL);
  g_return_if_fail (name != NULL);
  g_return_if_fail (dtype_is_valid (dtype));
  g_return_if_fail (shape != NULL || n_dims == 0);
  g_return_if_fail (fill != NULL);

  tensor = writer_declare (writer, name, dtype, n_dims, shape);
  if (tensor == NULL)
    return;
  tensor->fill = fill;
  tensor->user_data = user_data;
  writer_append (writer, tensor);
}

void
gepard_safetensors_writer_add_data (GepardSafetensorsWriter *writer, const char *name,
                                    GepardDType dtype, guint n_dims, const gint64 *shape,
                                    const void *data)
{
  WriterTensor *tensor;

  g_return_if_fail (writer != NULL);
  g_return_if_fail (name != NULL);
  g_return_if_fail (dtype_is_valid (dtype));
  g_return_if_fail (shape != NULL || n_dims == 0);

  tensor = writer_declare (writer, name, dtype, n_dims, shape);
  if (tensor == NULL)
    return;
  if (tensor->n_bytes > 0 && data == NULL)
    {
      g_critical ("%s: tensor \"%s\" has %" G_GUINT64_FORMAT " bytes but no data", G_STRFUNC, name,
                  tensor->n_bytes);
      writer_tensor_free (tensor);
      return;
    }
  if (tensor->n_bytes > 0)
    tensor->copy = g_memdup2 (data, tensor->n_bytes);
  writer_append (writer, tensor);
}

/* JSON string escaping as the reference implementation does it (short escapes where JSON has them,
 * \u00XX for other control characters, everything else verbatim). json-glib 1.6's generator
 * leaves 0x1f unescaped, which produces a header other readers reject, so the header is composed
 * here; it is re-parsed by the reader in the tests. */
static void
append_json_string (GString *out, const char *text)
{
  g_string_append_c (out, '"');
  for (const guchar *p = (const guchar *)text; *p != '\0'; p++)
    {
      switch (*p)
        {
        case '"':
          g_string_append (out, "\\\"");
          break;
        case '\\':
          g_string_append (out, "\\\\");
          break;
        case '\b':
          g_string_append (out, "\\b");
          break;
        case '\f':
          g_string_append (out, "\\f");
          break;
        case '\n':
          g_string_append (out, "\\n");
          break;
        case '\r':
          g_string_append (out, "\\r");
          break;
        case '\t':
          g_string_append (out, "\\t");
          break;
        default:
          if (*p < 0x20)
            g_string_append_printf (out, "\\u%04x", *p);
          else
            g_string_append_c (out, (char)*p);
        }
    }
  g_string_append_c (out, '"');
}

/* {"__metadata__":{…},"name":{"dtype":…,"shape":[…],"data_offsets":[b,e]},…} in the reference's
 * compact layout, padded with spaces to a multiple of 8 bytes so the data buffer starts aligned. */
static GString *
writer_compose_header (GepardSafetensorsWriter *writer)
{
  GString *header = g_string_new ("{");
  guint64 offset = 0;
  gboolean first = TRUE;

  if (writer->metadata_keys->len > 0)
    {
      append_json_string (header, METADATA_KEY);
      g_string_append (header, ":{");
      for (guint i = 0; i < writer->metadata_keys->len; i++)
        {
          const char *key = g_ptr_array_index (writer->metadata_keys, i);
          if (i > 0)
            g_string_append_c (header, ',');
          append_json_string (header, key);
          g_string_append_c (header, ':');
          append_json_string (header, g_hash_table_lookup (writer->metadata, key));
        }
      g_string_append_c (header, '}');
      first = FALSE;
    }

  for (guint i = 0; i < writer->tensors->len; i++)
    {
      WriterTensor *tensor = g_ptr_array_index (writer->tensors, i);

      if (!first)
        g_string_append_c (header, ',');
      first = FALSE;
      append_json_string (header, tensor->name);
      g_string_append_printf (header, ":{\"dtype\":\"%s\",\"shape\":[",
                              gepard_dtype_name (tensor->dtype));
      for (guint d = 0; d < tensor->n_dims; d++)
        g_string_append_printf (header, "%s%" G_GINT64_FORMAT, d > 0 ? "," : "", tensor->shape[d]);
      /* the total was checked to fit in gint64 before composing */
      g_string_append_printf (header,
                              "],\"data_offsets\":[%" G_GUINT64_FORMAT ",%" G_GUINT64_FORMAT "]}",
                              offset, offset + tensor->n_bytes);
      offset += tensor->n_bytes;
    }
  g_string_append_c (header, '}');

  while (header->len % 8 != 0)
    g_string_append_c (header, ' ');
  return header;
}

/* Output through a buffer: small tensors are gathered into large writes, large ones go straight
 * to the file. */
#define OUTPUT_BUFFER_SIZE (4u << 20)

typedef struct
{
  int fd;
  const char *path;     /* the destination, for messages */
  const char *tmp_path; /* the file actually written */
  guint8 *buffer;
  gsize used;
} Output;

static gboolean
output_write_all (Output *out, const guint8 *data, gsize n, GError **error)
{
  while (n > 0)
    {
      /* Linux writes at most about 2 GiB per call; larger requests return short counts anyway */
      gsize chunk = MIN (n, (gsize)1 << 30);
      gssize written = write (out->fd, data, chunk);

      if (written < 0)
        {
          int saved_errno = errno;
          if (saved_errno == EINTR)
            continue;
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                       "%s: cannot write %s: %s", out->path, out->tmp_path,
                       g_strerror (saved_errno));
          return FALSE;
        }
      data += written;
      n -= (gsize)written;
    }
  return TRUE;
}

static gboolean
output_flush (Output *out, GError **error)
{
  gsize used = out->used;

  out->used = 0;
  return output_write_all (out, out->buffer, used, error);
}

static gboolean
output_append (Output *out, const void *data, gsize n, GError **error)
{
  if (n > OUTPUT_BUFFER_SIZE - out->used)
    {
      if (!output_flush (out, error))
        return FALSE;
      if (n >= OUTPUT_BUFFER_SIZE)
        return output_write_all (out, data, n, error);
    }
  if (n > 0)
    memcpy (out->buffer + out->used, data, n);
  out->used += n;
  return TRUE;
}

static gboolean
writer_write_contents (GepardSafetensorsWriter *writer, Output *out, const GString *header,
                       GError **error)
{
  guint64 header_len_le = GUINT64_TO_LE ((guint64)header->len);

  if (!output_append (out, &header_len_le, 8, error)
      || !output_append (out, header->str, header->len, error))
    return FALSE;

  for (guint i = 0; i < writer->tensors->len; i++)
    {
      WriterTensor *tensor = g_ptr_array_index (writer->tensors, i);
      g_autofree guint8 *bytes = NULL;

      if (tensor->fill == NULL)
        {
          if (!output_append (out, tensor->copy, tensor->n_bytes, error))
            return FALSE;
          continue;
        }
      /* one byte at least, so even an empty tensor's fill gets a valid pointer */
      bytes = g_try_malloc0 (MAX (tensor->n_bytes, 1));
      if (bytes == NULL)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                       "%s: cannot allocate %" G_GUINT64_FORMAT " bytes for tensor \"%s\"",
                       out->path, tensor->n_bytes, tensor->name);
          return FALSE;
        }
      tensor->fill (tensor->user_data, tensor->name, bytes, tensor->n_bytes);
      if (!output_append (out, bytes, tensor->n_bytes, error))
        return FALSE;
    }
  return output_flush (out, error);
}

/* Makes the rename itself durable. A failure here leaves a complete file at `path` whose directory
 * entry may not survive a crash; that is no reason to report the write as failed. */
static void
sync_parent_directory (const char *path)
{
  g_autofree char *dir = g_path_get_dirname (path);
  int fd = g_open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);

  if (fd < 0)
    return;
  (void)fsync (fd);
  g_close (fd, NULL);
}

gboolean
gepard_safetensors_writer_write (GepardSafetensorsWriter *writer, const char *path, GError **error)
{
  g_autoptr (GString) header = NULL;
  g_autofree char *tmp_path = NULL;
  g_autofree guint8 *buffer = NULL;
  guint64 total = 0;
  Output out;
  int saved_errno;

  g_return_val_if_fail (writer != NULL, FALSE);
  g_return_val_if_fail (path != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  if (writer->declaration_error != NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, writer->declaration_error->code, "%s: %s", path,
                   writer->declaration_error->message);
      return FALSE;
    }
  for (guint i = 0; i < writer->tensors->len; i++)
    {
      WriterTensor *tensor = g_ptr_array_index (writer->tensors, i);
      if (!g_uint64_checked_add (&total, total, tensor->n_bytes) || total > (guint64)G_MAXINT64)
        {
          g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_SHAPE,
                       "%s: the tensors add up to more than %" G_GINT64_FORMAT " bytes", path,
                       G_MAXINT64);
          return FALSE;
        }
    }
  header = writer_compose_header (writer);
  if (header->len > HEADER_LENGTH_LIMIT)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                   "%s: the header would be %" G_GSIZE_FORMAT
                   " bytes, more than the %" G_GUINT64_FORMAT " bytes readers accept",
                   path, header->len, HEADER_LENGTH_LIMIT);
      return FALSE;
    }

  /* same directory, so the final rename() cannot cross file systems */
  tmp_path = g_strdup_printf ("%s.XXXXXX", path);
  out.fd = g_mkstemp_full (tmp_path, O_WRONLY | O_CLOEXEC, 0666);
  if (out.fd < 0)
    {
      saved_errno = errno;
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                   "%s: cannot create a temporary file next to it: %s", path,
                   g_strerror (saved_errno));
      return FALSE;
    }
  buffer = g_malloc (OUTPUT_BUFFER_SIZE);
  out.path = path;
  out.tmp_path = tmp_path;
  out.buffer = buffer;
  out.used = 0;

  if (!writer_write_contents (writer, &out, header, error))
    goto fail;
  if (fsync (out.fd) != 0)
    {
      saved_errno = errno;
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "%s: cannot sync %s: %s",
                   path, tmp_path, g_strerror (saved_errno));
      goto fail;
    }
  {
    /* close() reports deferred write errors on some file systems (NFS) */
    int fd = out.fd;
    out.fd = -1;
    if (close (fd) != 0)
      {
        saved_errno = errno;
        g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO, "%s: cannot close %s: %s",
                     path, tmp_path, g_strerror (saved_errno));
        goto fail;
      }
  }
  if (g_rename (tmp_path, path) != 0)
    {
      saved_errno = errno;
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO,
                   "%s: cannot rename %s to it: %s", path, tmp_path, g_strerror (saved_errno));
      goto fail;
    }
  sync_parent_directory (path);
  return TRUE;

fail:
  if (out.fd >= 0)
    g_close (out.fd, NULL);
  g_unlink (tmp_path);
  return FALSE;
}
