/* test-safetensors.c: the safetensors reader and writer.
 *
 * Malformed files are composed byte by byte here rather than produced by the writer, so each
 * check of the reader is exercised on exactly the defect it is meant to catch. */

#include "gepard-error.h"
#include "gepard-safetensors.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <glib/gstdio.h>

static char *scratch_dir;

#define assert_contains(text, needle)                                                              \
  G_STMT_START                                                                                     \
  {                                                                                                \
    if (strstr ((text), (needle)) == NULL)                                                         \
      g_error ("\"%s\" does not contain \"%s\"", (text), (needle));                                \
  }                                                                                                \
  G_STMT_END

static char *
scratch_path (const char *name)
{
  return g_build_filename (scratch_dir, name, NULL);
}

static char *
write_scratch (const char *name, const guint8 *bytes, gsize len)
{
  char *path = scratch_path (name);
  FILE *stream = fopen (path, "wb");

  /* Plain stdio rather than g_file_set_contents: no fsync (the mutation loop rewrites one file
   * thousands of times), and GLib 2.74 does not truncate with G_FILE_SET_CONTENTS_NONE. */
  g_assert_nonnull (stream);
  g_assert_cmpuint (fwrite (bytes, 1, len, stream), ==, len);
  g_assert_cmpint (fclose (stream), ==, 0);
  return path;
}

/* The 8-byte length as given, `header_bytes` of header, then `data_len` bytes of a known pattern.
 */
static GByteArray *
compose_file (guint64 header_len, const char *header, gsize header_bytes, gsize data_len)
{
  GByteArray *bytes = g_byte_array_new ();
  guint64 header_len_le = GUINT64_TO_LE (header_len);

  g_byte_array_append (bytes, (const guint8 *)&header_len_le, 8);
  g_byte_array_append (bytes, (const guint8 *)header, (guint)header_bytes);
  for (gsize i = 0; i < data_len; i++)
    {
      guint8 b = (guint8)(i * 7 + 1);
      g_byte_array_append (bytes, &b, 1);
    }
  return bytes;
}

static char *
write_composed (const char *name, const char *header, gsize data_len)
{
  g_autoptr (GByteArray) bytes = compose_file (strlen (header), header, strlen (header), data_len);
  return write_scratch (name, bytes->data, bytes->len);
}

static void
assert_open_fails (const char *path, GepardFormatError code, const char *needle,
                   const char *second_needle)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardSafetensors) file = gepard_safetensors_open (path, &error);

  g_assert_null (file);
  g_assert_error (error, GEPARD_FORMAT_ERROR, (gint)code);
  g_assert_true (g_str_has_prefix (error->message, path));
  assert_contains (error->message, needle);
  if (second_needle != NULL)
    assert_contains (error->message, second_needle);
}

static GepardSafetensors *
open_or_fail (const char *path)
{
  g_autoptr (GError) error = NULL;
  GepardSafetensors *file = gepard_safetensors_open (path, &error);

  g_assert_no_error (error);
  g_assert_nonnull (file);
  return file;
}

static void
fill_pattern (guint8 *dst, gsize n, guint seed)
{
  for (gsize i = 0; i < n; i++)
    dst[i] = (guint8)(seed * 31u + i * 7u + (i >> 8));
}

/* ---- dtypes, conversion, shapes ---- */

static void
test_dtypes (void)
{
  static const struct
  {
    GepardDType dtype;
    const char *name;
    gsize size;
  } expected[] = {
      {GEPARD_DTYPE_BF16, "BF16", 2}, {GEPARD_DTYPE_F16, "F16", 2}, {GEPARD_DTYPE_F32, "F32", 4},
      {GEPARD_DTYPE_I64, "I64", 8},   {GEPARD_DTYPE_I32, "I32", 4}, {GEPARD_DTYPE_U8, "U8", 1},
  };
  static const char *const unsupported[] = {"F64", "I8", "I16", "U16", "BOOL", "f32", "", "F32 "};

  for (guint i = 0; i < G_N_ELEMENTS (expected); i++)
    {
      GepardDType dtype = (GepardDType)99;
      g_assert_cmpstr (gepard_dtype_name (expected[i].dtype), ==, expected[i].name);
      g_assert_cmpuint (gepard_dtype_size (expected[i].dtype), ==, expected[i].size);
      g_assert_true (gepard_dtype_from_name (expected[i].name, &dtype));
      g_assert_cmpint (dtype, ==, expected[i].dtype);
    }
  for (guint i = 0; i < G_N_ELEMENTS (unsupported); i++)
    g_assert_false (gepard_dtype_from_name (unsupported[i], NULL));
}

static GepardTensor
make_tensor (GepardDType dtype, const void *data, guint64 n_elements)
{
  GepardTensor tensor = {.name = "t", .dtype = dtype, .n_dims = 1};

  tensor.shape[0] = (gint64)n_elements;
  tensor.n_elements = n_elements;
  tensor.n_bytes = n_elements * gepard_dtype_size (dtype);
  tensor.data = data;
  return tensor;
}

static guint32
float_bits (float value)
{
  guint32 bits;
  memcpy (&bits, &value, 4);
  return bits;
}

/* Half to float through the definition of the format, independent of the library's bit shuffling:
 * subnormal m * 2^-24, normal (1024 + m) * 2^(e - 25). */
static float
half_by_definition (guint16 half)
{
  int exponent = (half >> 10) & 0x1f;
  int mantissa = half & 0x3ff;
  float magnitude;

  if (exponent == 0x1f)
    magnitude = mantissa == 0 ? INFINITY : NAN;
  else if (exponent == 0)
    magnitude = ldexpf ((float)mantissa, -24);
  else
    magnitude = ldexpf ((float)(1024 + mantissa), exponent - 25);
  return (half & 0x8000) ? -magnitude : magnitude;
}

static void
test_f16_to_f32 (void)
{
  /* every bit pattern, stored little-endian one byte into the buffer so reads are unaligned */
  g_autofree guint8 *bytes = g_malloc (65536 * 2 + 1);
  g_autofree float *values = g_new (float, 65536);
  GepardTensor tensor;

  for (guint h = 0; h < 65536; h++)
    {
      bytes[1 + 2 * h] = (guint8)(h & 0xff);
      bytes[2 + 2 * h] = (guint8)(h >> 8);
    }
  tensor = make_tensor (GEPARD_DTYPE_F16, bytes + 1, 65536);
  gepard_tensor_to_f32 (&tensor, values);

  for (guint h = 0; h < 65536; h++)
    {
      float expected = half_by_definition ((guint16)h);
      if (isnan (expected))
        {
          /* quiet/signalling bit and payload travel into the top mantissa bits */
          g_assert_true (isnan (values[h]));
          g_assert_cmphex (float_bits (values[h]), ==,
                           ((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13));
        }
      else
        {
          g_assert_cmphex (float_bits (values[h]), ==, float_bits (expected));
        }
    }

  g_assert_cmpfloat (values[0x3c00], ==, 1.0f);
  g_assert_cmpfloat (values[0xc000], ==, -2.0f);
  g_assert_cmpfloat (values[0x7bff], ==, 65504.0f);
  g_assert_cmpfloat (values[0x0001], ==, 5.9604644775390625e-08f); /* smallest subnormal */
  g_assert_cmpfloat (values[0x03ff], ==, 6.097555160522461e-05f);  /* largest subnormal */
  g_assert_cmpfloat (values[0x0400], ==, 6.103515625e-05f);        /* smallest normal */
  g_assert_cmpfloat (values[0x3555], ==, 0.333251953125f);
  g_assert_true (isinf (values[0x7c00]) && values[0x7c00] > 0);
  g_assert_true (isinf (values[0xfc00]) && values[0xfc00] < 0);
  g_assert_true (isnan (values[0x7e00]));
  g_assert_true (values[0x8000] == 0.0f && signbit (values[0x8000]));
  /* positive finite halves are ordered like their bit patterns */
  for (guint h = 1; h <= 0x7c00; h++)
    g_assert_cmpfloat (values[h - 1], <, values[h]);
}

static void
test_bf16_to_f32 (void)
{
  static const guint16 halves[] = {0x3f80, 0xc000, 0x7f80, 0xff80, 0x7fc1, 0x0001, 0x8000, 0x4049};
  guint8 bytes[2 * G_N_ELEMENTS (halves) + 1];
  float values[G_N_ELEMENTS (halves)];
  GepardTensor tensor;

  for (guint i = 0; i < G_N_ELEMENTS (halves); i++)
    {
      bytes[1 + 2 * i] = (guint8)(halves[i] & 0xff);
      bytes[2 + 2 * i] = (guint8)(halves[i] >> 8);
    }
  tensor = make_tensor (GEPARD_DTYPE_BF16, bytes + 1, G_N_ELEMENTS (halves));
  gepard_tensor_to_f32 (&tensor, values);
  for (guint i = 0; i < G_N_ELEMENTS (halves); i++)
    g_assert_cmphex (float_bits (values[i]), ==, (guint32)halves[i] << 16);
  g_assert_cmpfloat (values[0], ==, 1.0f);
  g_assert_cmpfloat (values[1], ==, -2.0f);
  g_assert_cmpfloat (values[7], ==, 3.140625f);
}

static void
test_f32_to_f32 (void)
{
  const float source[] = {1.5f, -0.0f, 3.0e38f, 1.0e-45f};
  guint8 bytes[sizeof source + 3];
  float values[G_N_ELEMENTS (source)];
  GepardTensor tensor;

  memcpy (bytes + 3, source, sizeof source);
  tensor = make_tensor (GEPARD_DTYPE_F32, bytes + 3, G_N_ELEMENTS (source));
  gepard_tensor_to_f32 (&tensor, values);
  g_assert_cmpmem (values, sizeof values, source, sizeof source);
}

static void
test_shapes (void)
{
  GepardTensor tensor = {.name = "embed", .dtype = GEPARD_DTYPE_BF16, .n_dims = 2};
  const gint64 shape[] = {248320, 1024};
  const gint64 other[] = {248320, 1023};
  g_autofree char *text = NULL;
  g_autofree char *scalar_text = NULL;
  GepardTensor scalar = {.name = "s", .dtype = GEPARD_DTYPE_F32, .n_dims = 0};

  tensor.shape[0] = 248320;
  tensor.shape[1] = 1024;
  text = gepard_tensor_shape_to_string (&tensor);
  g_assert_cmpstr (text, ==, "[248320, 1024]");
  g_assert_true (gepard_tensor_has_shape (&tensor, 2, shape));
  g_assert_false (gepard_tensor_has_shape (&tensor, 2, other));
  g_assert_false (gepard_tensor_has_shape (&tensor, 1, shape));

  scalar_text = gepard_tensor_shape_to_string (&scalar);
  g_assert_cmpstr (scalar_text, ==, "[]");
  g_assert_true (gepard_tensor_has_shape (&scalar, 0, NULL));
  g_assert_false (gepard_tensor_has_shape (&scalar, 1, shape));
}

/* ---- round trips ---- */

typedef struct
{
  const char *name;
  GepardDType dtype;
  guint n_dims;
  gint64 shape[4];
  gsize n_bytes;
} Declaration;

/* every dtype, scalars, empty tensors, and an odd-sized U8 that leaves later tensors unaligned */
static const Declaration declarations[] = {
    {"embed.bf16", GEPARD_DTYPE_BF16, 2, {2, 3}, 12},
    {"norm.f16", GEPARD_DTYPE_F16, 1, {4}, 8},
    {"bytes.u8", GEPARD_DTYPE_U8, 1, {7}, 7},
    {"proj.f32", GEPARD_DTYPE_F32, 3, {3, 1, 2}, 24},
    {"ids.i64", GEPARD_DTYPE_I64, 1, {5}, 40},
    {"pairs.i32", GEPARD_DTYPE_I32, 2, {2, 2}, 16},
    {"scale", GEPARD_DTYPE_F32, 0, {0}, 4},
    {"step", GEPARD_DTYPE_I64, 0, {0}, 8},
    {"empty.f16", GEPARD_DTYPE_F16, 1, {0}, 0},
    {"empty.u8", GEPARD_DTYPE_U8, 3, {3, 0, 2}, 0},
    {"tail.bf16", GEPARD_DTYPE_BF16, 1, {3}, 6},
};

static const char odd_text[] = "\xc3\xbcn\xc3\xaf \"quoted\" back\\slash\n\ttab \x01\x1f\x7f end";

typedef struct
{
  guint n_calls;
  GPtrArray *names;
} FillLog;

static void
fill_declared (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  FillLog *log = user_data;
  guint index = G_MAXUINT;

  for (guint i = 0; i < G_N_ELEMENTS (declarations); i++)
    if (strcmp (declarations[i].name, name) == 0)
      index = i;
  g_assert_cmpuint (index, <, G_N_ELEMENTS (declarations));
  g_assert_cmpuint (n_bytes, ==, declarations[index].n_bytes);
  g_assert_nonnull (dst);
  /* the buffer arrives zeroed */
  for (gsize i = 0; i < n_bytes; i++)
    g_assert_cmpuint (((guint8 *)dst)[i], ==, 0);
  fill_pattern (dst, n_bytes, index);
  log->n_calls++;
  g_ptr_array_add (log->names, g_strdup (name));
}

static void
test_roundtrip_all_dtypes (void)
{
  g_autofree char *path = scratch_path ("all-dtypes.safetensors");
  g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GError) error = NULL;
  g_autoptr (GPtrArray) fill_names = g_ptr_array_new_with_free_func (g_free);
  g_autofree char *contents = NULL;
  FillLog log = {0, fill_names};
  const char *const *keys;
  gsize length, expected_data = 0;
  guint64 header_len;

  gepard_safetensors_writer_set_metadata (writer, "format", "first");
  gepard_safetensors_writer_set_metadata (writer, "odd", odd_text);
  /* a second value replaces the first and keeps the key's position */
  gepard_safetensors_writer_set_metadata (writer, "format", "pt");

  for (guint i = 0; i < G_N_ELEMENTS (declarations); i++)
    {
      const Declaration *d = &declarations[i];
      if (i % 2 == 0)
        {
          gepard_safetensors_writer_add (writer, d->name, d->dtype, d->n_dims, d->shape,
                                         fill_declared, &log);
        }
      else
        {
          g_autofree guint8 *bytes = g_malloc0 (MAX (d->n_bytes, 1));
          fill_pattern (bytes, d->n_bytes, i);
          gepard_safetensors_writer_add_data (writer, d->name, d->dtype, d->n_dims, d->shape,
                                              bytes);
        }
      expected_data += d->n_bytes;
    }
  g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
  g_assert_no_error (error);

  /* fill ran once per fill tensor, in declaration order */
  g_assert_cmpuint (log.n_calls, ==, (G_N_ELEMENTS (declarations) + 1) / 2);
  for (guint i = 0; i < fill_names->len; i++)
    g_assert_cmpstr (g_ptr_array_index (fill_names, i), ==, declarations[2 * i].name);

  /* layout: header padded with spaces to a multiple of 8, metadata first, data right after */
  g_assert_true (g_file_get_contents (path, &contents, &length, &error));
  g_assert_no_error (error);
  memcpy (&header_len, contents, 8);
  header_len = GUINT64_FROM_LE (header_len);
  g_assert_cmpuint (header_len % 8, ==, 0);
  g_assert_cmpuint (length, ==, 8 + header_len + expected_data);
  g_assert_true (g_str_has_prefix (contents + 8, "{\"__metadata__\":{\"format\":\"pt\",\"odd\":"));
  {
    /* the JSON ends in '}' and fewer than 8 spaces follow it */
    gsize json_end = header_len;
    while (json_end > 0 && contents[8 + json_end - 1] == ' ')
      json_end--;
    g_assert_cmpint (contents[8 + json_end - 1], ==, '}');
    g_assert_cmpuint (header_len - json_end, <, 8);
  }

  file = open_or_fail (path);
  g_assert_cmpstr (gepard_safetensors_get_path (file), ==, path);
  g_assert_cmpuint (gepard_safetensors_get_n_tensors (file), ==, G_N_ELEMENTS (declarations));
  for (guint i = 0; i < G_N_ELEMENTS (declarations); i++)
    {
      const Declaration *d = &declarations[i];
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
      g_autofree guint8 *expected = g_malloc0 (MAX (d->n_bytes, 1));
      guint64 n_elements = 1;

      fill_pattern (expected, d->n_bytes, i);
      for (guint k = 0; k < d->n_dims; k++)
        n_elements *= (guint64)d->shape[k];
      g_assert_cmpstr (tensor->name, ==, d->name);
      g_assert_cmpint (tensor->dtype, ==, d->dtype);
      g_assert_true (gepard_tensor_has_shape (tensor, d->n_dims, d->shape));
      g_assert_cmpuint (tensor->n_elements, ==, n_elements);
      g_assert_cmpuint (tensor->n_bytes, ==, d->n_bytes);
      g_assert_cmpmem (tensor->data, tensor->n_bytes, expected, d->n_bytes);
      g_assert_true (gepard_safetensors_lookup (file, d->name) == tensor);
      /* contiguous, in the order added */
      if (i > 0)
        {
          const GepardTensor *previous = gepard_safetensors_get_nth (file, i - 1);
          g_assert_true (previous->data + previous->n_bytes == tensor->data);
        }
    }
  g_assert_null (gepard_safetensors_lookup (file, "missing"));
  g_assert_null (gepard_safetensors_lookup (file, "__metadata__"));

  g_assert_cmpstr (gepard_safetensors_get_metadata (file, "format"), ==, "pt");
  g_assert_cmpstr (gepard_safetensors_get_metadata (file, "odd"), ==, odd_text);
  g_assert_null (gepard_safetensors_get_metadata (file, "missing"));
  keys = gepard_safetensors_get_metadata_keys (file);
  g_assert_cmpstr (keys[0], ==, "format");
  g_assert_cmpstr (keys[1], ==, "odd");
  g_assert_null (keys[2]);
}

/* The exact bytes the reference implementation produces for the same content. */
static void
test_writer_layout (void)
{
  static const char header[] = "{\"__metadata__\":{\"k\":\"v\"},\"a\":{\"dtype\":\"F32\",\"shape\":"
                               "[2],\"data_offsets\":[0,8]},"
                               "\"s\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[8,9]}}";
  const float a[] = {1.0f, 2.0f};
  const guint8 s = 0xab;
  const gint64 shape[] = {2};
  g_autofree char *path = scratch_path ("layout.safetensors");
  g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
  g_autoptr (GError) error = NULL;
  g_autoptr (GByteArray) expected = g_byte_array_new ();
  g_autofree char *contents = NULL;
  gsize padded = (sizeof header - 1 + 7) / 8 * 8;
  guint64 padded_le = GUINT64_TO_LE ((guint64)padded);
  gsize length;

  gepard_safetensors_writer_set_metadata (writer, "k", "v");
  gepard_safetensors_writer_add_data (writer, "a", GEPARD_DTYPE_F32, 1, shape, a);
  gepard_safetensors_writer_add_data (writer, "s", GEPARD_DTYPE_U8, 0, NULL, &s);
  g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
  g_assert_no_error (error);

  g_byte_array_append (expected, (const guint8 *)&padded_le, 8);
  g_byte_array_append (expected, (const guint8 *)header, sizeof header - 1);
  while (expected->len < 8 + padded)
    g_byte_array_append (expected, (const guint8 *)" ", 1);
  g_byte_array_append (expected, (const guint8 *)a, sizeof a);
  g_byte_array_append (expected, &s, 1);

  g_assert_true (g_file_get_contents (path, &contents, &length, &error));
  g_assert_cmpmem (contents, length, expected->data, expected->len);
}

static void
test_writer_empty (void)
{
  g_autofree char *path = scratch_path ("empty.safetensors");
  g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GError) error = NULL;
  g_autofree char *contents = NULL;
  gsize length;

  g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
  g_assert_no_error (error);
  g_assert_true (g_file_get_contents (path, &contents, &length, &error));
  g_assert_cmpmem (contents, length, "\x08\0\0\0\0\0\0\0{}      ", 16);

  file = open_or_fail (path);
  g_assert_cmpuint (gepard_safetensors_get_n_tensors (file), ==, 0);
  g_assert_null (gepard_safetensors_get_metadata_keys (file)[0]);
}

static guint
count_dir_entries (const char *dir_path)
{
  g_autoptr (GDir) dir = g_dir_open (dir_path, 0, NULL);
  guint n = 0;

  g_assert_nonnull (dir);
  while (g_dir_read_name (dir) != NULL)
    n++;
  return n;
}

static void
test_writer_replaces (void)
{
  g_autofree char *dir = scratch_path ("replace");
  g_autofree char *path = g_build_filename (dir, "model.safetensors", NULL);
  const guint8 first[] = {1, 2, 3};
  const guint8 second[] = {9, 8, 7, 6, 5};
  const gint64 first_shape[] = {3};
  const gint64 second_shape[] = {5};
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GError) error = NULL;
  const GepardTensor *tensor;

  g_assert_cmpint (g_mkdir (dir, 0755), ==, 0);
  {
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    gepard_safetensors_writer_add_data (writer, "w", GEPARD_DTYPE_U8, 1, first_shape, first);
    g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
    g_assert_no_error (error);
  }
  {
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    gepard_safetensors_writer_add_data (writer, "w", GEPARD_DTYPE_U8, 1, second_shape, second);
    g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
    g_assert_no_error (error);
  }
  /* no temporary file is left behind */
  g_assert_cmpuint (count_dir_entries (dir), ==, 1);

  file = open_or_fail (path);
  tensor = gepard_safetensors_lookup (file, "w");
  g_assert_nonnull (tensor);
  g_assert_cmpmem (tensor->data, tensor->n_bytes, second, sizeof second);
}

static void
test_writer_io_errors (void)
{
  g_autofree char *missing_dir = scratch_path ("no-such-dir/model.safetensors");
  g_autofree char *dir = scratch_path ("target-is-dir");
  g_autofree char *as_dir = g_build_filename (dir, "model.safetensors", NULL);
  const guint8 byte = 1;

  {
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    g_autoptr (GError) error = NULL;
    gepard_safetensors_writer_add_data (writer, "b", GEPARD_DTYPE_U8, 0, NULL, &byte);
    g_assert_false (gepard_safetensors_writer_write (writer, missing_dir, &error));
    g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO);
    g_assert_true (g_str_has_prefix (error->message, missing_dir));
  }
  {
    /* the destination is a non-empty directory: rename fails after the data was written */
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    g_autoptr (GError) error = NULL;
    g_autofree char *inner = g_build_filename (as_dir, "keep", NULL);
    g_assert_cmpint (g_mkdir_with_parents (inner, 0755), ==, 0);
    gepard_safetensors_writer_add_data (writer, "b", GEPARD_DTYPE_U8, 0, NULL, &byte);
    g_assert_false (gepard_safetensors_writer_write (writer, as_dir, &error));
    g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_IO);
    g_assert_true (g_str_has_prefix (error->message, as_dir));
    /* the temporary file was removed */
    g_assert_cmpuint (count_dir_entries (dir), ==, 1);
    g_assert_cmpint (g_rmdir (inner), ==, 0);
  }
}

static void
ignore_fill (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  g_assert_not_reached ();
}

static void
test_writer_declaration_errors (void)
{
  static const struct
  {
    const char *name;
    guint n_dims;
    gint64 shape[GEPARD_TENSOR_MAX_DIMS + 1];
    GepardFormatError code;
    const char *needle;
  } cases[] = {
      {"dup", 1, {2}, GEPARD_FORMAT_ERROR_CORRUPT, "added twice"},
      {"__metadata__", 1, {2}, GEPARD_FORMAT_ERROR_CORRUPT, "reserved"},
      {"neg", 2, {2, -1}, GEPARD_FORMAT_ERROR_SHAPE, "negative"},
      {"deep", 9, {1, 1, 1, 1, 1, 1, 1, 1, 1}, GEPARD_FORMAT_ERROR_SHAPE, "more than 8"},
      {"huge",
       3,
       {G_GINT64_CONSTANT (1) << 32, G_GINT64_CONSTANT (1) << 32, 2},
       GEPARD_FORMAT_ERROR_SHAPE,
       "overflows"},
      {"bytes", 1, {G_GINT64_CONSTANT (1) << 62}, GEPARD_FORMAT_ERROR_SHAPE, "overflows"},
      {"bad\xff utf8", 1, {2}, GEPARD_FORMAT_ERROR_CORRUPT, "UTF-8"},
  };
  g_autofree char *path = scratch_path ("never-written.safetensors");

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
      g_autoptr (GError) error = NULL;
      const gint64 two[] = {2};

      gepard_safetensors_writer_add (writer, "dup", GEPARD_DTYPE_F32, 1, two, ignore_fill, NULL);
      gepard_safetensors_writer_add (writer, cases[i].name, GEPARD_DTYPE_F32, cases[i].n_dims,
                                     cases[i].shape, ignore_fill, NULL);
      g_assert_false (gepard_safetensors_writer_write (writer, path, &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, (gint)cases[i].code);
      g_assert_true (g_str_has_prefix (error->message, path));
      assert_contains (error->message, cases[i].needle);
      g_assert_false (g_file_test (path, G_FILE_TEST_EXISTS));
    }

  {
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    g_autoptr (GError) error = NULL;
    gepard_safetensors_writer_set_metadata (writer, "key", "bad \xc3");
    g_assert_false (gepard_safetensors_writer_write (writer, path, &error));
    g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
    assert_contains (error->message, "UTF-8");
  }
}

/* ---- malformed files ---- */

typedef struct
{
  const char *header;
  gsize data_len;
  GepardFormatError code;
  const char *needle;
  const char *second_needle;
} BadHeader;

#define ENTRY(dtype, shape, offsets)                                                               \
  "{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":" offsets "}"
#define CORRUPT GEPARD_FORMAT_ERROR_CORRUPT
#define UNSUPPORTED GEPARD_FORMAT_ERROR_UNSUPPORTED

static const BadHeader bad_headers[] = {
    /* not JSON, or JSON that json-glib would take but the format does not allow */
    {"{\"t\":", 0, CORRUPT, "not valid JSON", NULL},
    {"", 0, CORRUPT, "not valid JSON", NULL},
    {"   ", 0, CORRUPT, "not valid JSON", NULL},
    {"{'t':1}", 0, CORRUPT, "not valid JSON", NULL},
    {"{\"a\":1 /* comment */}", 0, CORRUPT, "not valid JSON", NULL},
    {"{\"a\":0x10}", 0, CORRUPT, "not valid JSON", NULL},
    {"{\"a\":[1,]}", 0, CORRUPT, "not valid JSON", NULL},
    {"{\"a\":01}", 0, CORRUPT, "not valid JSON", NULL},
    {"{\"a\":tru}", 0, CORRUPT, "not valid JSON", NULL},
    {"{\"a\":\"x\x01\"}", 0, CORRUPT, "control character", NULL},
    {"{\"a\":\"\\q\"}", 0, CORRUPT, "escape", NULL},
    {"{\"a\":\"\\ud800\"}", 0, CORRUPT, "surrogate", NULL},
    {"{\"a\":\"\\udc00\"}", 0, CORRUPT, "surrogate", NULL},
    {"{\"a\":\"\\u00\"}", 0, CORRUPT, "escape", NULL},
    {"{\"t\":" ENTRY ("U8", "[1]", "[0,1]") "} x", 1, CORRUPT, "after the JSON value", NULL},
    {"{\"t\":" ENTRY ("U8", "[1]", "[0,1]") "}{}", 1, CORRUPT, "after the JSON value", NULL},
    {"{\"a\\u0000b\":" ENTRY ("U8", "[1]", "[0,1]") "}", 1, UNSUPPORTED, "NUL", NULL},
    {"{\"bad\xff\":1}", 0, CORRUPT, "UTF-8", NULL},
    /* the header is not an object */
    {"[]", 0, CORRUPT, "not a JSON object", NULL},
    {"\"text\"", 0, CORRUPT, "not a JSON object", NULL},
    {"null", 0, CORRUPT, "not a JSON object", NULL},
    /* tensor entries */
    {"{\"t\":5}", 0, CORRUPT, "tensor \"t\"", "not a JSON object"},
    {"{\"t\":[]}", 0, CORRUPT, "tensor \"t\"", "not a JSON object"},
    {"{\"t\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CORRUPT, "tensor \"t\"",
     "lacks \"dtype\""},
    {"{\"t\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1, CORRUPT, "tensor \"t\"",
     "lacks \"shape\""},
    {"{\"t\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, CORRUPT, "tensor \"t\"",
     "lacks \"data_offsets\""},
    {"{\"t\":{\"dtype\":5,\"shape\":[1],\"data_offsets\":[0,1]}}", 1, CORRUPT, "\"dtype\"",
     "not a string"},
    {"{\"t\":" ENTRY ("F64", "[1]", "[0,8]") "}", 8, UNSUPPORTED, "\"F64\"", "tensor \"t\""},
    {"{\"t\":" ENTRY ("f32", "[1]", "[0,4]") "}", 4, UNSUPPORTED, "\"f32\"", "tensor \"t\""},
    {"{\"w\":" ENTRY ("BOOL", "[1]", "[0,1]") "}", 1, UNSUPPORTED, "\"BOOL\"", "tensor \"w\""},
    /* shapes */
    {"{\"t\":{\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]}}", 1, CORRUPT, "\"shape\"",
     "not an array"},
    {"{\"t\":" ENTRY ("U8", "[-1]", "[0,0]") "}", 0, CORRUPT, "negative", NULL},
    {"{\"t\":" ENTRY ("U8", "[1.5]", "[0,1]") "}", 1, CORRUPT, "not an integer", NULL},
    {"{\"t\":" ENTRY ("U8", "[1e0]", "[0,1]") "}", 1, CORRUPT, "not an integer", NULL},
    {"{\"t\":" ENTRY ("U8", "[\"1\"]", "[0,1]") "}", 1, CORRUPT, "not an integer", NULL},
    {"{\"t\":" ENTRY ("U8", "[null]", "[0,1]") "}", 1, CORRUPT, "not an integer", NULL},
    {"{\"t\":" ENTRY ("U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]") "}", 1, CORRUPT, "9 dimensions",
     "more than 8"},
    {"{\"t\":" ENTRY ("U8", "[9223372036854775808]", "[0,1]") "}", 1, CORRUPT, "out of the 64-bit",
     NULL},
    {"{\"t\":" ENTRY ("U8", "[-9223372036854775809]", "[0,1]") "}", 1, CORRUPT, "out of the 64-bit",
     NULL},
    {"{\"t\":" ENTRY ("U8", "[4294967296,4294967296,2]", "[0,0]") "}", 0, CORRUPT, "element count",
     "overflows"},
    {"{\"t\":" ENTRY ("F32", "[4611686018427387904]", "[0,0]") "}", 0, CORRUPT, "byte size",
     "overflows"},
    /* offsets */
    {"{\"t\":" ENTRY ("U8", "[1]", "\"0,1\"") "}", 1, CORRUPT, "data_offsets", "two integers"},
    {"{\"t\":" ENTRY ("U8", "[1]", "[0]") "}", 1, CORRUPT, "data_offsets", "two integers"},
    {"{\"t\":" ENTRY ("U8", "[1]", "[0,1,2]") "}", 2, CORRUPT, "data_offsets", "two integers"},
    {"{\"t\":" ENTRY ("U8", "[1]", "[0,1.0]") "}", 1, CORRUPT, "data_offsets", "two integers"},
    {"{\"t\":" ENTRY ("U8", "[1]", "[-1,0]") "}", 1, CORRUPT, "data_offsets", "negative"},
    {"{\"t\":" ENTRY ("U8", "[0]", "[8,4]") "}", 8, CORRUPT, "begin 8 is after end 4", NULL},
    {"{\"t\":" ENTRY ("F32", "[2]", "[0,8]") "}", 4, CORRUPT, "end 8",
     "beyond the 4-byte data buffer"},
    {"{\"t\":" ENTRY ("F32", "[2]", "[0,4]") "}", 8, CORRUPT, "span 4 bytes", "F32 [2] needs 8"},
    {"{\"t\":" ENTRY ("I64", "[]", "[0,4]") "}", 8, CORRUPT, "span 4 bytes", "I64 [] needs 8"},
    {"{\"t\":" ENTRY ("U8", "[0]", "[0,1]") "}", 1, CORRUPT, "span 1 bytes", "needs 0"},
    /* the set of tensors */
    {"{\"a\":" ENTRY ("F32", "[2]", "[0,8]") ",\"b\":" ENTRY ("F32", "[2]", "[4,12]") "}", 12,
     CORRUPT, "\"a\" and \"b\" overlap", NULL},
    {"{\"b\":" ENTRY ("U8", "[4]", "[4,8]") ",\"a\":" ENTRY ("U8", "[8]", "[0,8]") "}", 8, CORRUPT,
     "\"a\" and \"b\" overlap", NULL},
    {"{\"a\":" ENTRY ("U8", "[4]", "[0,4]") ",\"b\":" ENTRY ("U8", "[4]", "[0,4]") "}", 4, CORRUPT,
     "overlap", NULL},
    {"{\"t\":" ENTRY ("U8", "[1]", "[0,1]") ",\"t\":" ENTRY ("U8", "[1]", "[1,2]") "}", 2, CORRUPT,
     "\"t\" twice", NULL},
    {"{\"t\":{\"dtype\":\"U8\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
     CORRUPT, "\"dtype\" twice", NULL},
    {"{\"t\\u0041\":" ENTRY ("U8", "[1]", "[0,1]") ",\"tA\":" ENTRY ("U8", "[1]", "[1,2]") "}", 2,
     CORRUPT, "\"tA\" twice", NULL},
    /* metadata */
    {"{\"__metadata__\":5}", 0, CORRUPT, "\"__metadata__\"", "not a JSON object"},
    {"{\"__metadata__\":[\"a\"]}", 0, CORRUPT, "\"__metadata__\"", "not a JSON object"},
    {"{\"__metadata__\":{\"k\":1}}", 0, CORRUPT, "entry \"k\"", "not a string"},
    {"{\"__metadata__\":{\"k\":null}}", 0, CORRUPT, "entry \"k\"", "not a string"},
    {"{\"__metadata__\":{\"k\":{}}}", 0, CORRUPT, "entry \"k\"", "not a string"},
    {"{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, CORRUPT, "\"k\" twice", NULL},
};

static void
test_open_bad_headers (void)
{
  for (guint i = 0; i < G_N_ELEMENTS (bad_headers); i++)
    {
      g_autofree char *name = g_strdup_printf ("bad-header-%u.safetensors", i);
      g_autofree char *path = write_composed (name, bad_headers[i].header, bad_headers[i].data_len);

      g_autofree char *escaped = g_strescape (bad_headers[i].header, NULL);

      g_test_message ("case %u: %s", i, escaped);
      assert_open_fails (path, bad_headers[i].code, bad_headers[i].needle,
                         bad_headers[i].second_needle);
    }
}

static void
test_open_bad_lengths (void)
{
  const char header[] = "{}";

  {
    g_autofree char *path = write_scratch ("zero.safetensors", (const guint8 *)"", 0);
    assert_open_fails (path, CORRUPT, "file is 0 bytes", "shorter than the 8-byte");
  }
  {
    g_autofree char *path
        = write_scratch ("seven.safetensors", (const guint8 *)"\2\0\0\0\0\0\0", 7);
    assert_open_fails (path, CORRUPT, "file is 7 bytes", "shorter than the 8-byte");
  }
  {
    /* 8 bytes of length, then nothing */
    g_autoptr (GByteArray) bytes = compose_file (0, header, 0, 0);
    g_autofree char *path = write_scratch ("only-length.safetensors", bytes->data, bytes->len);
    assert_open_fails (path, CORRUPT, "not valid JSON", NULL);
  }
  {
    g_autoptr (GByteArray) bytes = compose_file (3, header, 2, 0);
    g_autofree char *path = write_scratch ("past-end.safetensors", bytes->data, bytes->len);
    assert_open_fails (path, CORRUPT, "header length 3", "exceeds the 2 bytes");
  }
  {
    g_autoptr (GByteArray) bytes = compose_file (G_MAXUINT64, header, 2, 0);
    g_autofree char *path = write_scratch ("huge-length.safetensors", bytes->data, bytes->len);
    assert_open_fails (path, CORRUPT, "header length 18446744073709551615", "limit");
  }
  {
    g_autoptr (GByteArray) bytes = compose_file (G_GUINT64_CONSTANT (1) << 63, header, 2, 0);
    g_autofree char *path = write_scratch ("sign-length.safetensors", bytes->data, bytes->len);
    assert_open_fails (path, CORRUPT, "exceeds the limit", NULL);
  }
  {
    /* A sparse file larger than the limit: the length fits in the file but not under the limit.
     * The bytes are never read, so this costs no disk space or time. */
    g_autoptr (GByteArray) bytes = compose_file (100000001, header, 2, 0);
    g_autofree char *path = write_scratch ("over-limit.safetensors", bytes->data, bytes->len);
    g_assert_cmpint (truncate (path, 100000001 + 8), ==, 0);
    assert_open_fails (path, CORRUPT, "header length 100000001", "limit of 100000000 bytes");
  }
}

static void
test_open_not_a_file (void)
{
  g_autofree char *missing = scratch_path ("does-not-exist.safetensors");
  g_autofree char *dir = scratch_path ("a-directory.safetensors");
  g_autofree char *fifo = scratch_path ("a-fifo.safetensors");

  assert_open_fails (missing, GEPARD_FORMAT_ERROR_IO, "cannot open", NULL);
  g_assert_cmpint (g_mkdir (dir, 0755), ==, 0);
  assert_open_fails (dir, GEPARD_FORMAT_ERROR_IO, "is a directory", NULL);
  g_assert_cmpint (mkfifo (fifo, 0600), ==, 0);
  assert_open_fails (fifo, GEPARD_FORMAT_ERROR_IO, "not a regular file", NULL);
}

static char *
nested_header (guint depth)
{
  /* {"t":{dtype, shape, data_offsets, "x":[[…]]}}: the tensor entry itself is two levels deep */
  GString *header
      = g_string_new ("{\"t\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":");
  for (guint i = 2; i < depth; i++)
    g_string_append_c (header, '[');
  for (guint i = 2; i < depth; i++)
    g_string_append_c (header, ']');
  g_string_append (header, "}}");
  return g_string_free (header, FALSE);
}

static void
test_open_deep_nesting (void)
{
  g_autofree char *at_limit = nested_header (64);
  g_autofree char *over_limit = nested_header (65);
  /* deep enough to overflow the stack of a recursive parser */
  g_autofree char *hostile = nested_header (2000000);
  g_autofree char *path_at = write_composed ("nest-64.safetensors", at_limit, 1);
  g_autofree char *path_over = write_composed ("nest-65.safetensors", over_limit, 1);
  g_autofree char *path_hostile = write_composed ("nest-hostile.safetensors", hostile, 1);
  g_autoptr (GepardSafetensors) file = open_or_fail (path_at);

  g_assert_cmpuint (gepard_safetensors_get_n_tensors (file), ==, 1);
  assert_open_fails (path_over, CORRUPT, "nested more than 64 levels", NULL);
  assert_open_fails (path_hostile, CORRUPT, "nested more than 64 levels", NULL);
}

/* Valid files the reference would write differently, which are still safe to read. */
static void
test_open_accepts (void)
{
  {
    /* header order differs from offset order; gaps, trailing bytes, extra keys, padding */
    const char header[]
        = "{\"late\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[10,12],\"x\":[1]},"
          "\"__metadata__\":{},"
          "\"early\":" ENTRY ("I32", "[1]",
                              "[0,4]") ","
                                       "\"end\":" ENTRY ("F16", "[0]",
                                                         "[16,16]") ","
                                                                    "\"mid\":" ENTRY (
                                                                        "U8", "[]",
                                                                        "[6,7]") "} \t\r\n";
    g_autofree char *path = write_composed ("accept-order.safetensors", header, 16);
    g_autoptr (GepardSafetensors) file = open_or_fail (path);
    static const char *const order[] = {"early", "mid", "late", "end"};
    static const guint begins[] = {0, 6, 10, 16};

    g_assert_cmpuint (gepard_safetensors_get_n_tensors (file), ==, 4);
    for (guint i = 0; i < 4; i++)
      {
        const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
        g_assert_cmpstr (tensor->name, ==, order[i]);
        g_assert_true (gepard_safetensors_lookup (file, order[i]) == tensor);
        if (tensor->n_bytes > 0)
          /* compose_file fills the data buffer with byte i = i * 7 + 1 */
          g_assert_cmpuint (tensor->data[0], ==, (guint8)(begins[i] * 7 + 1));
      }
    g_assert_true (gepard_safetensors_get_nth (file, 1)->data
                   == gepard_safetensors_get_nth (file, 0)->data + 6);
    g_assert_null (gepard_safetensors_get_metadata_keys (file)[0]);
  }
  {
    /* empty tensors at the same offset as a full one, and at the very end of the buffer */
    const char header[] = "{\"z1\":" ENTRY (
        "F32", "[0,5]",
        "[0,0]") ","
                 "\"a\":" ENTRY ("U8", "[4]",
                                 "[0,4]") ","
                                          "\"z2\":" ENTRY ("I64", "[3,0]",
                                                           "[2,2]") ","
                                                                    "\"z3\":" ENTRY ("BF16", "[0]",
                                                                                     "[4,4]") "}";
    g_autofree char *path = write_composed ("accept-empty.safetensors", header, 4);
    g_autoptr (GepardSafetensors) file = open_or_fail (path);
    static const char *const order[] = {"z1", "a", "z2", "z3"};
    const gint64 z2_shape[] = {3, 0};

    g_assert_cmpuint (gepard_safetensors_get_n_tensors (file), ==, 4);
    for (guint i = 0; i < 4; i++)
      g_assert_cmpstr (gepard_safetensors_get_nth (file, i)->name, ==, order[i]);
    g_assert_cmpuint (gepard_safetensors_lookup (file, "z2")->n_elements, ==, 0);
    g_assert_true (gepard_tensor_has_shape (gepard_safetensors_lookup (file, "z2"), 2, z2_shape));
  }
  {
    /* escapes in names and metadata are decoded */
    const char header[] = "{\"__metadata__\":{\"k\\n\":\"caf\\u00e9 \\ud83d\\ude00 \\\"q\\\"\"},"
                          "\"na\\/me\":" ENTRY ("U8", "[1]", "[0,1]") "}";
    g_autofree char *path = write_composed ("accept-escapes.safetensors", header, 1);
    g_autoptr (GepardSafetensors) file = open_or_fail (path);

    g_assert_nonnull (gepard_safetensors_lookup (file, "na/me"));
    g_assert_cmpstr (gepard_safetensors_get_metadata (file, "k\n"), ==,
                     "caf\xc3\xa9 \xf0\x9f\x98\x80 \"q\"");
  }
}

/* ---- random mutations ---- */

static GByteArray *
fuzz_base_file (void)
{
  g_autofree char *path = scratch_path ("fuzz-base.safetensors");
  g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
  g_autoptr (GError) error = NULL;
  g_autofree char *contents = NULL;
  gsize length;
  GByteArray *bytes;

  gepard_safetensors_writer_set_metadata (writer, "format", "pt");
  for (guint i = 0; i < G_N_ELEMENTS (declarations); i++)
    {
      const Declaration *d = &declarations[i];
      g_autofree guint8 *data = g_malloc0 (MAX (d->n_bytes, 1));
      fill_pattern (data, d->n_bytes, i);
      gepard_safetensors_writer_add_data (writer, d->name, d->dtype, d->n_dims, d->shape, data);
    }
  g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
  g_assert_no_error (error);
  g_assert_true (g_file_get_contents (path, &contents, &length, &error));
  bytes = g_byte_array_new ();
  g_byte_array_append (bytes, (const guint8 *)contents, (guint)length);
  return bytes;
}

static guint64
read_header_len (const GByteArray *bytes)
{
  guint64 value;

  if (bytes->len < 8)
    return 0;
  memcpy (&value, bytes->data, 8);
  return GUINT64_FROM_LE (value);
}

/* one random edit; positions lean towards the header, where the checks are */
static void
mutate (GByteArray *bytes)
{
  static const char structural[] = "{}[]\":,-0123456789 e.\\";
  guint64 header_len = read_header_len (bytes);
  guint header_end = (guint)MIN ((guint64)bytes->len, 8 + MIN (header_len, (guint64)bytes->len));
  guint len = bytes->len;
  guint pos;

  if (len == 0)
    {
      g_byte_array_append (bytes, (const guint8 *)"{", 1);
      return;
    }
  pos = (header_end > 8 && g_test_rand_int_range (0, 4) != 0)
            ? (guint)g_test_rand_int_range (8, (gint32)header_end)
            : (guint)g_test_rand_int_range (0, (gint32)len);

  switch (g_test_rand_int_range (0, 8))
    {
    case 0: /* bit flip */
      bytes->data[pos] ^= (guint8)(1u << g_test_rand_int_range (0, 8));
      break;
    case 1: /* random byte */
      bytes->data[pos] = (guint8)g_test_rand_int_range (0, 256);
      break;
    case 2: /* a byte JSON cares about */
      bytes->data[pos] = (guint8)structural[g_test_rand_int_range (0, sizeof structural - 1)];
      break;
    case 3: /* truncation */
      g_byte_array_set_size (bytes, (guint)g_test_rand_int_range (0, (gint32)len));
      break;
    case 4: /* delete one byte */
      g_byte_array_remove_index (bytes, pos);
      break;
    case 5: /* insert one byte */
      {
        guint8 b = (guint8)structural[g_test_rand_int_range (0, sizeof structural - 1)];
        g_byte_array_set_size (bytes, len + 1);
        memmove (bytes->data + pos + 1, bytes->data + pos, len - pos);
        bytes->data[pos] = b;
      }
      break;
    case 6: /* header length edits */
      if (len >= 8)
        {
          guint64 value;
          switch (g_test_rand_int_range (0, 4))
            {
            case 0:
              value = header_len + (guint64)g_test_rand_int_range (-16, 17);
              break;
            case 1:
              value = ((guint64)g_test_rand_int () << 32) | (guint32)g_test_rand_int ();
              break;
            case 2:
              value = (guint64)g_test_rand_int_range (0, (gint32)len + 16);
              break;
            default:
              value = G_MAXUINT64 - (guint64)g_test_rand_int_range (0, 16);
              break;
            }
          value = GUINT64_TO_LE (value);
          memcpy (bytes->data, &value, 8);
        }
      break;
    default: /* append junk */
      for (gint n = g_test_rand_int_range (1, 16); n > 0; n--)
        {
          guint8 b = (guint8)g_test_rand_int_range (0, 256);
          g_byte_array_append (bytes, &b, 1);
        }
      break;
    }
}

/* What the reader promises about any file it accepts. */
static void
check_invariants (const GepardSafetensors *file, const GByteArray *bytes, guint64 *checksum)
{
  gsize file_len = bytes->len;
  guint64 buffer_len;
  guint n = gepard_safetensors_get_n_tensors (file);
  const guint8 *lowest = NULL, *covered_end = NULL;
  const char *const *keys;

  g_assert_cmpuint (file_len, >=, 8);
  g_assert_cmpuint (read_header_len (bytes), <=, file_len - 8);
  buffer_len = file_len - 8 - read_header_len (bytes);
  for (guint i = 0; i < n; i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
      guint64 n_elements = 1;
      g_autofree char *shape_text = gepard_tensor_shape_to_string (tensor);

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
      g_assert_nonnull (shape_text);

      /* ascending offsets, no overlap, everything within a span no larger than the data buffer */
      if (lowest == NULL)
        lowest = tensor->data;
      g_assert_true (tensor->data >= lowest);
      if (i > 0)
        g_assert_true (gepard_safetensors_get_nth (file, i - 1)->data <= tensor->data);
      if (tensor->n_bytes > 0)
        {
          if (covered_end != NULL)
            g_assert_true (tensor->data >= covered_end);
          covered_end = tensor->data + tensor->n_bytes;
          g_assert_cmpuint ((guint64)(covered_end - lowest), <=, file_len - 8);
        }

      /* touch every byte, so a bad pointer shows up under valgrind or ASan */
      for (gsize b = 0; b < tensor->n_bytes; b++)
        *checksum += tensor->data[b];
      if ((tensor->dtype == GEPARD_DTYPE_BF16 || tensor->dtype == GEPARD_DTYPE_F16
           || tensor->dtype == GEPARD_DTYPE_F32)
          && tensor->n_elements <= 4096)
        {
          g_autofree float *values = g_new (float, MAX (tensor->n_elements, 1));
          gepard_tensor_to_f32 (tensor, values);
        }
    }

  keys = gepard_safetensors_get_metadata_keys (file);
  for (guint i = 0; keys[i] != NULL; i++)
    {
      const char *value = gepard_safetensors_get_metadata (file, keys[i]);
      g_assert_nonnull (value);
      g_assert_true (g_utf8_validate (keys[i], -1, NULL));
      g_assert_true (g_utf8_validate (value, -1, NULL));
    }
}

static void
test_mutations (void)
{
  g_autoptr (GByteArray) base = fuzz_base_file ();
  guint n_iterations = g_test_quick () ? 3000 : 20000;
  guint n_opened = 0, n_corrupt = 0, n_unsupported = 0;
  guint64 checksum = 0;

  for (guint iteration = 0; iteration < n_iterations; iteration++)
    {
      g_autoptr (GByteArray) bytes = g_byte_array_new ();
      g_autoptr (GepardSafetensors) file = NULL;
      g_autoptr (GError) error = NULL;
      g_autofree char *path = NULL;
      gint n_edits = g_test_rand_int_range (1, 4);

      g_byte_array_append (bytes, base->data, base->len);
      for (gint e = 0; e < n_edits; e++)
        mutate (bytes);
      path = write_scratch ("mutated.safetensors", bytes->data, bytes->len);

      file = gepard_safetensors_open (path, &error);
      if (file != NULL)
        {
          g_assert_no_error (error);
          check_invariants (file, bytes, &checksum);
          n_opened++;
          continue;
        }
      g_assert_nonnull (error);
      g_assert_true (error->domain == GEPARD_FORMAT_ERROR);
      g_assert_true (g_str_has_prefix (error->message, path));
      if (error->code == GEPARD_FORMAT_ERROR_UNSUPPORTED)
        n_unsupported++;
      else
        {
          g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
          n_corrupt++;
        }
    }

  g_test_message ("%u mutations: %u opened, %u corrupt, %u unsupported (checksum %" G_GUINT64_FORMAT
                  ")",
                  n_iterations, n_opened, n_corrupt, n_unsupported, checksum);
  /* both outcomes must actually be exercised */
  g_assert_cmpuint (n_opened, >, n_iterations / 50);
  g_assert_cmpuint (n_corrupt, >, n_iterations / 2);
}

/* The fuzzer's seed files: valid-* must open and keep the invariants, bad-* must be refused. */
static void
test_fuzz_corpus (void)
{
  g_autofree char *corpus = g_test_build_filename (G_TEST_DIST, "fuzz-corpus", "safetensors", NULL);
  g_autoptr (GDir) dir = g_dir_open (corpus, 0, NULL);
  const char *name;
  guint n_valid = 0, n_bad = 0;
  guint64 checksum = 0;

  if (dir == NULL)
    {
      g_test_skip ("fuzz-corpus/safetensors not found; set G_TEST_SRCDIR to the tests directory");
      return;
    }
  while ((name = g_dir_read_name (dir)) != NULL)
    {
      g_autofree char *path = g_build_filename (corpus, name, NULL);
      g_autoptr (GepardSafetensors) file = NULL;
      g_autoptr (GError) error = NULL;
      g_autofree char *contents = NULL;
      g_autoptr (GByteArray) bytes = g_byte_array_new ();
      gsize length;

      g_assert_true (g_file_get_contents (path, &contents, &length, NULL));
      g_assert_cmpuint (length, <, 4096);
      g_byte_array_append (bytes, (const guint8 *)contents, (guint)length);
      file = gepard_safetensors_open (path, &error);
      if (g_str_has_prefix (name, "valid-"))
        {
          g_assert_no_error (error);
          check_invariants (file, bytes, &checksum);
          n_valid++;
        }
      else
        {
          g_assert_true (g_str_has_prefix (name, "bad-"));
          g_assert_null (file);
          g_assert_true (
              g_error_matches (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT)
              || g_error_matches (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED));
          n_bad++;
        }
    }
  g_assert_cmpuint (n_valid, >, 0);
  g_assert_cmpuint (n_bad, >, 0);
}

/* ---- large files (run with -m slow) ---- */

static void
fill_large (gpointer user_data, const char *name, void *dst, gsize n_bytes)
{
  guint8 *bytes = dst;
  guint8 tag = (guint8)name[strlen (name) - 1];

  bytes[0] = tag;
  bytes[n_bytes / 2] = tag ^ 0x55;
  bytes[n_bytes - 1] = tag ^ 0xaa;
}

/* Offsets past 4 GiB and single tensors past the 2 GiB a write() call takes. */
static void
test_large_file (void)
{
  g_autofree char *path = NULL;
  g_autoptr (GepardSafetensorsWriter) writer = NULL;
  g_autoptr (GepardSafetensors) file = NULL;
  g_autoptr (GError) error = NULL;
  const gint64 shape[] = {G_GINT64_CONSTANT (1) << 20, 2200};
  static const char *const names[] = {"part1", "part2", "part3"};

  if (!g_test_slow ())
    {
      g_test_skip ("writes 6.9 GB; run with -m slow");
      return;
    }
  path = scratch_path ("large.safetensors");
  writer = gepard_safetensors_writer_new ();
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    gepard_safetensors_writer_add (writer, names[i], GEPARD_DTYPE_U8, 2, shape, fill_large, NULL);
  g_assert_true (gepard_safetensors_writer_write (writer, path, &error));
  g_assert_no_error (error);

  file = open_or_fail (path);
  for (guint i = 0; i < G_N_ELEMENTS (names); i++)
    {
      const GepardTensor *tensor = gepard_safetensors_get_nth (file, i);
      guint8 tag = (guint8)names[i][4];
      g_assert_cmpstr (tensor->name, ==, names[i]);
      g_assert_cmpuint (tensor->n_bytes, ==, (gsize)shape[0] * (gsize)shape[1]);
      g_assert_cmpuint (tensor->data[0], ==, tag);
      g_assert_cmpuint (tensor->data[tensor->n_bytes / 2], ==, tag ^ 0x55);
      g_assert_cmpuint (tensor->data[tensor->n_bytes - 1], ==, tag ^ 0xaa);
      g_assert_cmpuint (tensor->data[1], ==, 0);
    }
  g_clear_pointer (&file, gepard_safetensors_free);
  g_assert_cmpint (g_unlink (path), ==, 0);
}

static void
remove_tree (const char *path)
{
  GDir *dir = g_dir_open (path, 0, NULL);

  if (dir != NULL)
    {
      const char *name;
      while ((name = g_dir_read_name (dir)) != NULL)
        {
          g_autofree char *child = g_build_filename (path, name, NULL);
          remove_tree (child);
        }
      g_dir_close (dir);
      g_rmdir (path);
    }
  else
    {
      g_unlink (path);
    }
}

int
main (int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  int result;

  g_test_init (&argc, &argv, NULL);

  scratch_dir = g_dir_make_tmp ("gepard-safetensors-XXXXXX", &error);
  g_assert_no_error (error);

  g_test_add_func ("/safetensors/dtypes", test_dtypes);
  g_test_add_func ("/safetensors/to-f32/f16", test_f16_to_f32);
  g_test_add_func ("/safetensors/to-f32/bf16", test_bf16_to_f32);
  g_test_add_func ("/safetensors/to-f32/f32", test_f32_to_f32);
  g_test_add_func ("/safetensors/shapes", test_shapes);
  g_test_add_func ("/safetensors/roundtrip/all-dtypes", test_roundtrip_all_dtypes);
  g_test_add_func ("/safetensors/write/layout", test_writer_layout);
  g_test_add_func ("/safetensors/write/empty", test_writer_empty);
  g_test_add_func ("/safetensors/write/replaces", test_writer_replaces);
  g_test_add_func ("/safetensors/write/io-errors", test_writer_io_errors);
  g_test_add_func ("/safetensors/write/declaration-errors", test_writer_declaration_errors);
  g_test_add_func ("/safetensors/open/bad-headers", test_open_bad_headers);
  g_test_add_func ("/safetensors/open/bad-lengths", test_open_bad_lengths);
  g_test_add_func ("/safetensors/open/not-a-file", test_open_not_a_file);
  g_test_add_func ("/safetensors/open/deep-nesting", test_open_deep_nesting);
  g_test_add_func ("/safetensors/open/accepts", test_open_accepts);
  g_test_add_func ("/safetensors/open/mutations", test_mutations);
  g_test_add_func ("/safetensors/open/fuzz-corpus", test_fuzz_corpus);
  g_test_add_func ("/safetensors/write/large", test_large_file);

  result = g_test_run ();
  remove_tree (scratch_dir);
  g_free (scratch_dir);
  return result;
}
