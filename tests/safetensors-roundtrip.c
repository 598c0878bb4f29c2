/* safetensors-roundtrip: drives the safetensors reader and writer from outside C, so files can be
 * compared with those of the reference implementation.
 *
 *   safetensors-roundtrip dump FILE
 *       one line per tensor in file order:  tensor<TAB>NAME<TAB>DTYPE<TAB>SHAPE<TAB>SHA256
 *       then one line per metadata entry:   metadata<TAB>KEY<TAB>VALUE
 *       NAME, KEY and VALUE are C-escaped (g_strescape, UTF-8 kept as is), so tabs and newlines
 *       inside them cannot break the line structure. SHAPE reads like "[2, 3]", SHA256 is the hex
 *       digest of the tensor's bytes.
 *   safetensors-roundtrip copy IN OUT
 *       rewrites IN through the writer: same tensors in the same order, same metadata.
 *   safetensors-roundtrip to-f32 FILE TENSOR OUT
 *       writes the tensor converted by gepard_tensor_to_f32 as raw little-endian float32. */

#include "gepard-safetensors.h"

#include <stdio.h>
#include <string.h>

static char *
escape_field (const char *text)
{
  char exceptions[129];

  /* bytes of multi-byte UTF-8 sequences pass unescaped */
  for (int i = 0; i < 128; i++)
    exceptions[i] = (char)(0x80 + i);
  exceptions[128] = '\0';
  return g_strescape (text, exceptions);
}

static char *
tensor_sha256 (const GepardTensor *tensor)
{
  g_autoptr (GChecksum) checksum = g_checksum_new (G_CHECKSUM_SHA256);
  const guint8 *data = tensor->data;
  gsize left = tensor->n_bytes;

  /* g_checksum_update takes a signed length */
  while (left > 0)
    {
      gsize chunk = MIN (left, (gsize)1 << 30);
      g_checksum_update (checksum, data, (gssize)chunk);
      data += chunk;
      left -= chunk;
    }
  return g_strdup (g_checksum_get_string (checksum));
}

static int
dump (const char *path, GError **error)
{
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, error);
  const char *const *keys;

  if (file == NULL)
    return 1;
  for (guint i = 0; i < gepard_safetensors_get_n_tensors (file); i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
      g_autofree char *name = escape_field (tensor->name);
      g_autofree char *shape = gepard_tensor_shape_to_string (tensor);
      g_autofree char *digest = tensor_sha256 (tensor);

      printf ("tensor\t%s\t%s\t%s\t%s\n", name, gepard_dtype_name (tensor->dtype), shape, digest);
    }
  keys = gepard_safetensors_get_metadata_keys (file);
  for (guint i = 0; keys[i] != NULL; i++)
    {
      g_autofree char *key = escape_field (keys[i]);
      g_autofree char *value = escape_field (gepard_safetensors_get_metadata (file, keys[i]));

      printf ("metadata\t%s\t%s\n", key, value);
    }
  return fflush (stdout) == 0 ? 0 : 1;
}

static void
copy_tensor_bytes (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  const GepardTensor *tensor = user_data;

  g_assert (tensor->n_bytes == n_bytes);
  if (n_bytes > 0)
    memcpy (dst, tensor->data, n_bytes);
}

static int
copy (const char *in_path, const char *out_path, GError **error)
{
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (in_path, error);
  g_autoptr (GepardSafetensorsWriter) writer = NULL;
  const char *const *keys;

  if (file == NULL)
    return 1;
  writer = gepard_safetensors_writer_new ();
  keys = gepard_safetensors_get_metadata_keys (file);
  for (guint i = 0; keys[i] != NULL; i++)
    gepard_safetensors_writer_set_metadata (writer, keys[i],
                                            gepard_safetensors_get_metadata (file, keys[i]));
  /* through fill, so the bytes are copied one tensor at a time, as a converter would */
  for (guint i = 0; i < gepard_safetensors_get_n_tensors (file); i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
      gepard_safetensors_writer_add (writer, tensor->name, tensor->dtype, tensor->n_dims,
                                     tensor->shape, copy_tensor_bytes, (gpointer)tensor);
    }
  return gepard_safetensors_writer_write (writer, out_path, error) ? 0 : 1;
}

static int
to_f32 (const char *path, const char *name, const char *out_path, GError **error)
{
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, error);
  g_autofree float *values = NULL;
  const GepardTensor *tensor;

  if (file == NULL)
    return 1;
  tensor = gepard_safetensors_lookup (file, name);
  if (tensor == NULL)
    {
      g_printerr ("safetensors-roundtrip: %s has no tensor \"%s\"\n", path, name);
      return 1;
    }
  if (tensor->dtype != GEPARD_DTYPE_BF16 && tensor->dtype != GEPARD_DTYPE_F16
      && tensor->dtype != GEPARD_DTYPE_F32)
    {
      g_printerr ("safetensors-roundtrip: tensor \"%s\" is %s, not a floating type\n", name,
                  gepard_dtype_name (tensor->dtype));
      return 1;
    }
  values = g_new (float, MAX (tensor->n_elements, 1));
  gepard_tensor_to_f32 (tensor, values);
#if G_BYTE_ORDER != G_LITTLE_ENDIAN
  for (guint64 i = 0; i < tensor->n_elements; i++)
    {
      guint32 bits;
      memcpy (&bits, &values[i], 4);
      bits = GUINT32_TO_LE (bits);
      memcpy (&values[i], &bits, 4);
    }
#endif
  return g_file_set_contents (out_path, (const char *)values, (gssize)(tensor->n_elements * 4),
                              error)
             ? 0
             : 1;
}

int
main (int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  int status;

  if (argc == 3 && strcmp (argv[1], "dump") == 0)
    status = dump (argv[2], &error);
  else if (argc == 4 && strcmp (argv[1], "copy") == 0)
    status = copy (argv[2], argv[3], &error);
  else if (argc == 5 && strcmp (argv[1], "to-f32") == 0)
    status = to_f32 (argv[2], argv[3], argv[4], &error);
  else
    {
      g_printerr ("usage: safetensors-roundtrip dump FILE\n"
                  "       safetensors-roundtrip copy IN OUT\n"
                  "       safetensors-roundtrip to-f32 FILE TENSOR OUT\n");
      return 2;
    }

  if (error != NULL)
    g_printerr ("safetensors-roundtrip: %s\n", error->message);
  return status;
}
