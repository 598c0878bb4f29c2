/* test-codec-weights.c: NanoCodec checkpoints read natively (.nemo and safetensors).
 *
 * Real-sized files come from gepard-make-test-model. Malformed archives are composed here, layer
 * by layer (pickle → zip → tar), around a micro codec whose whole .nemo is a few kilobytes, so
 * each check of the reader meets exactly the defect it is meant to catch, and thousands of random
 * mutations of a valid archive run in seconds. */

#include "gepard-codec-weights.h"
#include "gepard-error.h"
#include "gepard-nemo.h"
#include "gepard-pickle.h"
#include "gepard-test-model.h"
#include "gepard-yaml.h"

#include <gio/gio.h>
#include <glib/gstdio.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static char *scratch_dir;

#define assert_contains(text, needle)                                                              \
  G_STMT_START                                                                                     \
  {                                                                                                \
    if (strstr ((text), (needle)) == NULL)                                                         \
      g_error ("\"%s\" does not contain \"%s\"", (text), (needle));                                \
  }                                                                                                \
  G_STMT_END

/* ---- files ---- */

static char *
scratch_path (const char *name)
{
  return g_build_filename (scratch_dir, name, NULL);
}

static void
write_file (const char *path, const guint8 *bytes, gsize len)
{
  FILE *stream = fopen (path, "wb");

  /* plain stdio: the mutation loop rewrites one file thousands of times, no fsync wanted */
  g_assert_nonnull (stream);
  g_assert_cmpuint (fwrite (bytes, 1, len, stream), ==, len);
  g_assert_cmpint (fclose (stream), ==, 0);
}

static char *
write_scratch (const char *name, GBytes *bytes)
{
  char *path = scratch_path (name);

  write_file (path, g_bytes_get_data (bytes, NULL), g_bytes_get_size (bytes));
  return path;
}

static const char *
build_dir (void)
{
  const char *dir = g_getenv ("GEPARD_BUILD_DIR");

  return dir != NULL ? dir : "build";
}

static void
run_generator (const char *preset, const char *format, guint seed, const char *out)
{
  g_autofree char *options
      = g_strdup_printf ("--codec-only --preset %s --seed %u --format %s", preset, seed, format);
  gepard_test_make_model (options, out);
}

/* tiny-preset files of one seed, written once per run */
static const char *
tiny_file (const char *format)
{
  static char *paths[2];
  int i = g_strcmp0 (format, "nemo") == 0 ? 0 : 1;

  if (paths[i] == NULL)
    {
      paths[i] = scratch_path (i == 0 ? "tiny.nemo" : "tiny.safetensors");
      run_generator ("tiny", format, 7, paths[i]);
    }
  return paths[i];
}

/* ---- composing archives ---- */

static guint32
crc32_of (const guint8 *p, gsize len)
{
  static guint32 table[256];
  guint32 c = 0xFFFFFFFFu;

  if (table[1] == 0)
    for (guint32 i = 0; i < 256; i++)
      {
        guint32 v = i;

        for (int k = 0; k < 8; k++)
          v = (v & 1) ? 0xEDB88320u ^ (v >> 1) : v >> 1;
        table[i] = v;
      }
  for (gsize i = 0; i < len; i++)
    c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return ~c;
}

static void
put_le (GByteArray *out, guint64 v, guint n)
{
  for (guint i = 0; i < n; i++)
    {
      guint8 b = (v >> (8 * i)) & 0xff;

      g_byte_array_append (out, &b, 1);
    }
}

static void
set_le (guint8 *p, guint64 v, guint n)
{
  for (guint i = 0; i < n; i++)
    p[i] = (v >> (8 * i)) & 0xff;
}

static void
put_bytes (GByteArray *out, const void *data, gsize len)
{
  g_byte_array_append (out, data, (guint)len);
}

static void
put_str (GByteArray *out, const char *s)
{
  put_bytes (out, s, strlen (s));
}

/* A tensor to pickle and store, with the ways a test may spoil it. */
typedef struct
{
  char *name;
  const char *storage_class; /* "FloatStorage", … */
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  GBytes *data;
  gboolean omit;           /* left out of the state dict */
  gboolean bad_stride;     /* strides of a transposed view */
  gint64 extra_numel;      /* added to the storage numel in the persistent id */
  gboolean as_parameter;   /* wrapped in torch._utils._rebuild_parameter */
  gint64 shape_delta_last; /* added to the last dim */
} Tensor;

static void
tensor_free (gpointer data)
{
  Tensor *t = data;

  g_free (t->name);
  g_bytes_unref (t->data);
  g_free (t);
}

typedef struct
{
  const char *bad_global;   /* "module\nname" emitted in place of the hooks' OrderedDict */
  gboolean bad_memo;        /* a LONG_BINGET of an index never stored */
  gsize truncate_at;        /* keep only this many bytes (0: all) */
  gboolean no_metadata;     /* leave out the BUILD of _metadata */
  gboolean protocol4_names; /* SHORT_BINUNICODE + MEMOIZE, as protocol 4 writes */
} PickleFlaws;

typedef struct
{
  GByteArray *out;
  guint n_memo;
} Pickler;

static void
pk_op (Pickler *p, guint8 op)
{
  g_byte_array_append (p->out, &op, 1);
}

static void
pk_put (Pickler *p)
{
  if (p->n_memo < 256)
    {
      pk_op (p, 'q');
      pk_op (p, (guint8)p->n_memo);
    }
  else
    {
      pk_op (p, 'r');
      put_le (p->out, p->n_memo, 4);
    }
  p->n_memo++;
}

static void
pk_get (Pickler *p, guint index)
{
  pk_op (p, 'j');
  put_le (p->out, index, 4);
}

static void
pk_str (Pickler *p, const char *s, gboolean short_form)
{
  if (short_form && strlen (s) < 256)
    {
      pk_op (p, 0x8c);
      pk_op (p, (guint8)strlen (s));
      put_str (p->out, s);
      pk_op (p, 0x94); /* MEMOIZE */
      p->n_memo++;
      return;
    }
  pk_op (p, 'X');
  put_le (p->out, strlen (s), 4);
  put_str (p->out, s);
  pk_put (p);
}

static void
pk_int (Pickler *p, gint64 v)
{
  if (v >= 0 && v < 256)
    {
      pk_op (p, 'K');
      pk_op (p, (guint8)v);
    }
  else if (v >= 0 && v < 65536)
    {
      pk_op (p, 'M');
      put_le (p->out, (guint64)v, 2);
    }
  else if (v >= G_MININT32 && v <= G_MAXINT32)
    {
      pk_op (p, 'J');
      put_le (p->out, (guint64)v, 4);
    }
  else
    {
      pk_op (p, 0x8a);
      pk_op (p, 8);
      put_le (p->out, (guint64)v, 8);
    }
}

static void
pk_int_tuple (Pickler *p, guint n, const gint64 *v)
{
  if (n == 0)
    {
      pk_op (p, ')');
      return;
    }
  if (n > 3)
    pk_op (p, '(');
  for (guint i = 0; i < n; i++)
    pk_int (p, v[i]);
  pk_op (p, n > 3 ? 't' : (guint8)(0x84 + n));
  pk_put (p);
}

static GBytes *
compose_pickle (GPtrArray *tensors, const PickleFlaws *flaws)
{
  Pickler p = {g_byte_array_new (), 0};
  guint ordered_dict, rebuild = 0, storage_str = 0, cpu_str = 0;
  gboolean have_rebuild = FALSE, have_strings = FALSE;

  pk_op (&p, 0x80);
  pk_op (&p, 2);
  ordered_dict = p.n_memo;
  put_str (p.out, "ccollections\nOrderedDict\n");
  pk_put (&p);
  pk_op (&p, ')');
  pk_op (&p, 'R');
  pk_put (&p);
  pk_op (&p, '(');
  for (guint i = 0; i < tensors->len; i++)
    {
      const Tensor *t = g_ptr_array_index (tensors, i);
      g_autofree char *key = g_strdup_printf ("%u", i);
      gint64 shape[GEPARD_TENSOR_MAX_DIMS];
      gint64 stride[GEPARD_TENSOR_MAX_DIMS];
      gint64 numel = 1;
      gint64 step = 1;

      if (t->omit)
        continue;
      memcpy (shape, t->shape, sizeof shape);
      if (t->n_dims > 0)
        shape[t->n_dims - 1] += t->shape_delta_last;
      for (guint d = 0; d < t->n_dims; d++)
        numel *= t->shape[d];
      for (guint d = t->n_dims; d-- > 0;)
        {
          stride[d] = step;
          step *= MAX (shape[d], 1);
        }
      if (t->bad_stride && t->n_dims >= 2)
        {
          /* the strides of x.t() for the first two dims */
          gint64 tmp = stride[0];

          stride[0] = stride[1];
          stride[1] = tmp;
        }

      pk_str (&p, t->name, flaws->protocol4_names);
      if (t->as_parameter)
        {
          put_str (p.out, "ctorch._utils\n_rebuild_parameter\n");
          pk_put (&p);
          pk_op (&p, '(');
        }
      if (have_rebuild)
        pk_get (&p, rebuild);
      else
        {
          rebuild = p.n_memo;
          put_str (p.out, "ctorch._utils\n_rebuild_tensor_v2\n");
          pk_put (&p);
          have_rebuild = TRUE;
        }
      pk_op (&p, '(');
      pk_op (&p, '(');
      if (have_strings)
        pk_get (&p, storage_str);
      else
        {
          storage_str = p.n_memo;
          pk_str (&p, "storage", FALSE);
        }
      put_str (p.out, "ctorch\n");
      put_str (p.out, t->storage_class);
      put_str (p.out, "\n");
      pk_put (&p);
      pk_str (&p, key, FALSE);
      if (have_strings)
        pk_get (&p, cpu_str);
      else
        {
          cpu_str = p.n_memo;
          pk_str (&p, "cpu", FALSE);
          have_strings = TRUE;
        }
      pk_int (&p, numel + t->extra_numel);
      pk_op (&p, 't');
      pk_put (&p);
      pk_op (&p, 'Q');
      pk_int (&p, 0);
      pk_int_tuple (&p, t->n_dims, shape);
      pk_int_tuple (&p, t->n_dims, stride);
      pk_op (&p, 0x89);
      if (flaws->bad_global != NULL && i == tensors->len / 2)
        {
          put_str (p.out, "c");
          put_str (p.out, flaws->bad_global);
          put_str (p.out, "\n");
          pk_put (&p);
        }
      else
        pk_get (&p, ordered_dict);
      pk_op (&p, ')');
      pk_op (&p, 'R');
      pk_put (&p);
      pk_op (&p, 't');
      pk_put (&p);
      pk_op (&p, 'R');
      pk_put (&p);
      if (t->as_parameter)
        {
          pk_op (&p, 0x89);
          pk_get (&p, ordered_dict);
          pk_op (&p, ')');
          pk_op (&p, 'R');
          pk_op (&p, 't');
          pk_op (&p, 'R');
          pk_put (&p);
        }
      if (flaws->bad_memo && i == 1)
        {
          /* fetched and dropped again: only the index is wrong */
          pk_get (&p, 100000);
          pk_op (&p, '0');
        }
    }
  pk_op (&p, 'u');

  if (!flaws->no_metadata)
    {
      /* state_dict()._metadata, which torch.save writes through BUILD */
      pk_op (&p, '}');
      pk_put (&p);
      pk_str (&p, "_metadata", FALSE);
      pk_get (&p, ordered_dict);
      pk_op (&p, ')');
      pk_op (&p, 'R');
      pk_put (&p);
      pk_op (&p, '(');
      pk_str (&p, "", FALSE);
      pk_op (&p, '}');
      pk_put (&p);
      pk_str (&p, "version", FALSE);
      pk_int (&p, 1);
      pk_op (&p, 's');
      pk_str (&p, "audio_decoder", FALSE);
      pk_op (&p, '}');
      pk_put (&p);
      pk_str (&p, "version", FALSE);
      pk_int (&p, 1);
      pk_op (&p, 's');
      pk_op (&p, 'u');
      pk_op (&p, 's');
      pk_op (&p, 'b');
    }
  pk_op (&p, '.');
  if (flaws->truncate_at > 0 && flaws->truncate_at < p.out->len)
    g_byte_array_set_size (p.out, (guint)flaws->truncate_at);
  return g_byte_array_free_to_bytes (p.out);
}

typedef struct
{
  char *name;
  GBytes *data;
} Record;

static void
record_free (gpointer data)
{
  Record *r = data;

  g_free (r->name);
  g_bytes_unref (r->data);
  g_free (r);
}

static void
add_record (GPtrArray *records, const char *name, GBytes *data)
{
  Record *r = g_new0 (Record, 1);

  r->name = g_strdup (name);
  r->data = g_bytes_ref (data);
  g_ptr_array_add (records, r);
}

static void
add_record_text (GPtrArray *records, const char *name, const char *text)
{
  g_autoptr (GBytes) bytes = g_bytes_new (text, strlen (text));

  add_record (records, name, bytes);
}

typedef struct
{
  const char *compressed; /* the entry marked deflated */
  gboolean offset_past_end;
  gboolean zip64; /* write the zip64 end records, as torch does */
  gboolean bad_crc;
  gboolean directory_past_end; /* the end record points the directory past the end */
} ZipFlaws;

static GBytes *
compose_zip (GPtrArray *records, const ZipFlaws *flaws)
{
  GByteArray *out = g_byte_array_new ();
  g_autoptr (GArray) offsets = g_array_new (FALSE, FALSE, sizeof (guint64));
  guint64 cd_offset, cd_size, z64_offset;

  for (guint i = 0; i < records->len; i++)
    {
      const Record *r = g_ptr_array_index (records, i);
      gsize len;
      const guint8 *data = g_bytes_get_data (r->data, &len);
      guint method = g_strcmp0 (r->name, flaws->compressed) == 0 ? 8 : 0;
      guint64 offset = out->len;

      g_array_append_val (offsets, offset);
      put_le (out, 0x04034b50, 4);
      put_le (out, 20, 2);
      put_le (out, 0, 2);
      put_le (out, method, 2);
      put_le (out, 0, 4);
      put_le (out, crc32_of (data, len), 4);
      put_le (out, len, 4);
      put_le (out, len, 4);
      put_le (out, strlen (r->name), 2);
      put_le (out, 0, 2);
      put_str (out, r->name);
      put_bytes (out, data, len);
    }
  cd_offset = out->len;
  for (guint i = 0; i < records->len; i++)
    {
      const Record *r = g_ptr_array_index (records, i);
      gsize len;
      const guint8 *data = g_bytes_get_data (r->data, &len);
      guint method = g_strcmp0 (r->name, flaws->compressed) == 0 ? 8 : 0;
      guint32 crc = crc32_of (data, len);
      guint64 offset = g_array_index (offsets, guint64, i);

      if (flaws->bad_crc && i == records->len - 1)
        crc ^= 1;
      if (flaws->offset_past_end && i == records->len / 2)
        offset = 0x7FFFFFF0;
      put_le (out, 0x02014b50, 4);
      put_le (out, 20, 2);
      put_le (out, 20, 2);
      put_le (out, 0, 2);
      put_le (out, method, 2);
      put_le (out, 0, 4);
      put_le (out, crc, 4);
      put_le (out, len, 4);
      put_le (out, len, 4);
      put_le (out, strlen (r->name), 2);
      put_le (out, 0, 2);
      put_le (out, 0, 2);
      put_le (out, 0, 2);
      put_le (out, 0, 2);
      put_le (out, 0, 4);
      put_le (out, offset, 4);
      put_str (out, r->name);
    }
  cd_size = out->len - cd_offset;
  z64_offset = out->len;
  if (flaws->zip64)
    {
      put_le (out, 0x06064b50, 4);
      put_le (out, 44, 8);
      put_le (out, 45, 2);
      put_le (out, 45, 2);
      put_le (out, 0, 4);
      put_le (out, 0, 4);
      put_le (out, records->len, 8);
      put_le (out, records->len, 8);
      put_le (out, cd_size, 8);
      put_le (out, cd_offset, 8);
      put_le (out, 0x07064b50, 4);
      put_le (out, 0, 4);
      put_le (out, z64_offset, 8);
      put_le (out, 1, 4);
    }
  put_le (out, 0x06054b50, 4);
  put_le (out, 0, 2);
  put_le (out, 0, 2);
  put_le (out, records->len, 2);
  put_le (out, records->len, 2);
  put_le (out, cd_size, 4);
  put_le (out, flaws->directory_past_end ? cd_offset + 4096 : cd_offset, 4);
  put_le (out, 0, 2);
  return g_byte_array_free_to_bytes (out);
}

static void
tar_header (GByteArray *out, const char *name, char type, guint64 size)
{
  guint8 h[512] = {0};
  guint sum = 0;
  g_autofree char *size_text = g_strdup_printf ("%011" G_GINT64_MODIFIER "o", size);

  g_assert_cmpuint (strlen (name), <, 100);
  memcpy (h, name, strlen (name));
  memcpy (h + 100, "0000644", 7);
  memcpy (h + 108, "0000000", 7);
  memcpy (h + 116, "0000000", 7);
  memcpy (h + 124, size_text, 11);
  memcpy (h + 136, "00000000000", 11);
  memset (h + 148, ' ', 8);
  h[156] = (guint8)type;
  memcpy (h + 257,
          "ustar\0"
          "00",
          8);
  for (int i = 0; i < 512; i++)
    sum += h[i];
  g_snprintf ((char *)h + 148, 8, "%06o", sum);
  h[155] = ' ';
  put_bytes (out, h, 512);
}

static void
tar_pad (GByteArray *out)
{
  static const guint8 zeros[512];

  put_bytes (out, zeros, (512 - out->len % 512) % 512);
}

typedef enum
{
  NAMES_DOT,    /* "./model_config.yaml", as NeMo writes */
  NAMES_PLAIN,  /* "model_config.yaml" */
  NAMES_FOLDER, /* "codec/model_config.yaml" */
  NAMES_GNU,    /* GNU 'L' long-name headers */
  NAMES_PAX,    /* pax 'x' headers with path= */
} TarNames;

static void
tar_member (GByteArray *out, TarNames names, const char *base, GBytes *data)
{
  gsize len;
  const guint8 *bytes = g_bytes_get_data (data, &len);
  g_autofree char *name = NULL;

  switch (names)
    {
    case NAMES_PLAIN:
      name = g_strdup (base);
      break;
    case NAMES_FOLDER:
      name = g_strconcat ("codec/", base, NULL);
      break;
    case NAMES_GNU:
      {
        g_autofree char *long_name = g_strconcat (
            "./a-folder-name-long-enough-that-ustar-cannot-hold-it-in-its-one-hundred-bytes-"
            "of-name/",
            base, NULL);

        tar_header (out, "././@LongLink", 'L', strlen (long_name) + 1);
        put_bytes (out, long_name, strlen (long_name) + 1);
        tar_pad (out);
        name = g_strdup ("truncated-name");
        break;
      }
    case NAMES_PAX:
      {
        g_autofree char *record = NULL;
        g_autofree char *path = g_strconcat ("./", base, NULL);
        gsize n = strlen (" path=\n") + strlen (path);

        /* the length counts its own digits */
        n += n + 2 >= 100 ? 3 : 2;
        record = g_strdup_printf ("%" G_GSIZE_FORMAT " path=%s\n", n, path);
        g_assert_cmpuint (strlen (record), ==, n);
        tar_header (out, "./PaxHeaders/x", 'x', strlen (record));
        put_str (out, record);
        tar_pad (out);
        name = g_strdup ("ignored");
        break;
      }
    case NAMES_DOT:
    default:
      name = g_strconcat ("./", base, NULL);
      break;
    }
  tar_header (out, name, '0', len);
  put_bytes (out, bytes, len);
  tar_pad (out);
}

typedef struct
{
  TarNames names;
  gboolean no_weights;
  gboolean no_end; /* leave out the zero blocks */
} TarFlaws;

static GBytes *
compose_tar (const char *yaml, GBytes *ckpt, const TarFlaws *flaws)
{
  GByteArray *out = g_byte_array_new ();
  g_autoptr (GBytes) yaml_bytes = g_bytes_new (yaml, strlen (yaml));
  static const guint8 zeros[1024];

  if (flaws->names == NAMES_DOT)
    tar_header (out, "./", '5', 0);
  tar_member (out, flaws->names, "model_config.yaml", yaml_bytes);
  if (!flaws->no_weights)
    tar_member (out, flaws->names, "model_weights.ckpt", ckpt);
  if (!flaws->no_end)
    put_bytes (out, zeros, sizeof zeros);
  return g_byte_array_free_to_bytes (out);
}

typedef struct
{
  PickleFlaws pickle;
  ZipFlaws zip;
  TarFlaws tar;
  const char *yaml;          /* instead of the config's own */
  const char *byteorder;     /* instead of "little" */
  gboolean drop_storage;     /* leave out one data/<key> record */
  gboolean short_storage;    /* one data/<key> record a few bytes short */
  const char *outside_entry; /* an extra zip entry outside the checkpoint folder */
  GBytes *pickle_bytes;      /* data.pkl as given instead of composed */
} Flaws;

static GBytes *
compose_nemo (const char *yaml, GPtrArray *tensors, const Flaws *flaws)
{
  g_autoptr (GPtrArray) records = g_ptr_array_new_with_free_func (record_free);
  g_autoptr (GBytes) pkl = flaws->pickle_bytes ? g_bytes_ref (flaws->pickle_bytes)
                                               : compose_pickle (tensors, &flaws->pickle);
  g_autoptr (GBytes) ckpt = NULL;

  add_record (records, "model_weights/data.pkl", pkl);
  add_record_text (records, "model_weights/byteorder",
                   flaws->byteorder ? flaws->byteorder : "little");
  for (guint i = 0; i < tensors->len; i++)
    {
      const Tensor *t = g_ptr_array_index (tensors, i);
      g_autofree char *name = g_strdup_printf ("model_weights/data/%u", i);

      if (flaws->drop_storage && i == tensors->len / 2)
        continue;
      if (flaws->short_storage && i == tensors->len / 2)
        {
          g_autoptr (GBytes) part
              = g_bytes_new_from_bytes (t->data, 0, g_bytes_get_size (t->data) - 2);

          add_record (records, name, part);
          continue;
        }
      add_record (records, name, t->data);
    }
  add_record_text (records, "model_weights/version", "3\n");
  if (flaws->outside_entry != NULL)
    add_record_text (records, flaws->outside_entry, "x");
  ckpt = compose_zip (records, &flaws->zip);
  return compose_tar (flaws->yaml ? flaws->yaml : yaml, ckpt, &flaws->tar);
}

/* ---- the micro codec: every code path of the real one, a few hundred weights ---- */

static void
micro_config (GepardCodecConfig *c)
{
  static const int kernels[] = {3};
  static const int dilations[] = {1};

  memset (c, 0, sizeof *c);
  c->sample_rate = 16000;
  c->samples_per_frame = 4;
  c->latent_dim = 2;
  c->fsq_groups = 1;
  c->fsq_n_dims = 2;
  c->fsq_levels[0] = 3;
  c->fsq_levels[1] = 4;
  c->fsq_eps = 1e-3;
  c->encoder.base_channels = 1;
  c->encoder.n_stages = 1;
  c->encoder.down_sample_rates[0] = 4;
  c->encoder.in_kernel_size = 3;
  c->encoder.out_kernel_size = 3;
  c->encoder.n_resblock_kernel_sizes = 1;
  memcpy (c->encoder.resblock_kernel_sizes, kernels, sizeof kernels);
  c->encoder.n_resblock_dilation_sizes = 1;
  memcpy (c->encoder.resblock_dilation_sizes, dilations, sizeof dilations);
  c->encoder.activation = GEPARD_CODEC_ACTIVATION_LRELU;
  c->encoder.pad_mode = GEPARD_CODEC_PAD_REPLICATE;
  c->decoder.base_channels = 4;
  c->decoder.n_stages = 1;
  c->decoder.up_sample_rates[0] = 4;
  c->decoder.in_kernel_size = 3;
  c->decoder.out_kernel_size = 3;
  c->decoder.n_resblock_kernel_sizes = 1;
  memcpy (c->decoder.resblock_kernel_sizes, kernels, sizeof kernels);
  c->decoder.n_resblock_dilation_sizes = 1;
  memcpy (c->decoder.resblock_dilation_sizes, dilations, sizeof dilations);
  c->decoder.activation = GEPARD_CODEC_ACTIVATION_HALF_SNAKE;
  c->decoder.output_activation = GEPARD_CODEC_OUTPUT_CLAMP;
  c->decoder.pad_mode = GEPARD_CODEC_PAD_ZEROS;
  c->decoder.n_groups_equal_to_out_channels = TRUE;
  g_assert_true (gepard_codec_config_validate (c, NULL));
}

typedef struct
{
  GPtrArray *tensors;
  GRand *rand;
  const GepardCodecConfig *config;
} MicroBuilder;

static void
micro_tensor (const GepardCodecTensorInfo *info, gpointer user_data)
{
  MicroBuilder *b = user_data;
  Tensor *t = g_new0 (Tensor, 1);
  guint8 *data = g_malloc (info->n_elements * 4);

  t->name = g_strdup (info->name);
  t->storage_class = info->dtype == GEPARD_DTYPE_I32 ? "IntStorage" : "FloatStorage";
  t->n_dims = info->n_dims;
  memcpy (t->shape, info->shape, sizeof t->shape);
  for (guint64 i = 0; i < info->n_elements; i++)
    {
      if (info->dtype == GEPARD_DTYPE_I32)
        {
          /* nanocodec.md §4: dim_base_index is the mixed-radix base, num_levels the levels */
          gint32 v = info->param == GEPARD_CODEC_PARAM_FSQ_NUM_LEVELS ? b->config->fsq_levels[i]
                                                                      : (i == 0 ? 1 : 3);

          set_le (data + i * 4, (guint32)v, 4);
        }
      else
        {
          float v = (float)g_rand_double_range (b->rand, 0.25, 1.5);
          guint32 bits;

          if (info->param != GEPARD_CODEC_PARAM_WEIGHT_G && g_rand_boolean (b->rand))
            v = -v;
          memcpy (&bits, &v, 4);
          set_le (data + i * 4, bits, 4);
        }
    }
  t->data = g_bytes_new_take (data, info->n_elements * 4);
  g_ptr_array_add (b->tensors, t);
}

static GPtrArray *
micro_tensors (void)
{
  GepardCodecConfig config;
  MicroBuilder b;

  micro_config (&config);
  b.tensors = g_ptr_array_new_with_free_func (tensor_free);
  b.rand = g_rand_new_with_seed (11);
  b.config = &config;
  gepard_codec_config_foreach_tensor (&config, micro_tensor, &b);
  g_rand_free (b.rand);
  return b.tensors;
}

static char *
micro_yaml (void)
{
  GepardCodecConfig config;

  micro_config (&config);
  return gepard_codec_config_to_yaml (&config);
}

static Tensor *
find_tensor (GPtrArray *tensors, const char *name)
{
  for (guint i = 0; i < tensors->len; i++)
    {
      Tensor *t = g_ptr_array_index (tensors, i);

      if (strcmp (t->name, name) == 0)
        return t;
    }
  g_error ("no tensor %s", name);
  return NULL;
}

static GBytes *
micro_nemo (const Flaws *flaws)
{
  g_autoptr (GPtrArray) tensors = micro_tensors ();
  g_autofree char *yaml = micro_yaml ();
  Flaws none = {0};

  return compose_nemo (yaml, tensors, flaws ? flaws : &none);
}

/* ---- checks ---- */

static void
assert_open_fails (const char *path, GepardFormatError code, const char *needle)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardCodecWeights) weights = gepard_codec_weights_open (path, &error);

  g_assert_null (weights);
  g_assert_nonnull (error);
  if (!g_error_matches (error, GEPARD_FORMAT_ERROR, (gint)code))
    g_error ("expected code %d, got %d: %s", code, error->code, error->message);
  if (needle != NULL)
    assert_contains (error->message, needle);
  g_test_message ("%s", error->message);
}

static void
assert_bytes_fail (const char *name, GBytes *bytes, GepardFormatError code, const char *needle)
{
  g_autofree char *path = write_scratch (name, bytes);

  assert_open_fails (path, code, needle);
}

static GepardCodecWeights *
open_ok (const char *path)
{
  g_autoptr (GError) error = NULL;
  GepardCodecWeights *weights = gepard_codec_weights_open (path, &error);

  g_assert_no_error (error);
  g_assert_nonnull (weights);
  return weights;
}

static void
assert_config_equal (const GepardCodecConfig *a, const GepardCodecConfig *b)
{
  const GepardCodecEncoderConfig *ea = &a->encoder, *eb = &b->encoder;
  const GepardCodecDecoderConfig *da = &a->decoder, *db = &b->decoder;

  g_assert_cmpint (a->sample_rate, ==, b->sample_rate);
  g_assert_cmpint (a->samples_per_frame, ==, b->samples_per_frame);
  g_assert_cmpint (a->latent_dim, ==, b->latent_dim);
  g_assert_cmpint (a->fsq_groups, ==, b->fsq_groups);
  g_assert_cmpint (a->fsq_n_dims, ==, b->fsq_n_dims);
  g_assert_cmpmem (a->fsq_levels, sizeof (int) * a->fsq_n_dims, b->fsq_levels,
                   sizeof (int) * b->fsq_n_dims);
  g_assert_cmpfloat (a->fsq_eps, ==, b->fsq_eps);

  g_assert_cmpint (ea->base_channels, ==, eb->base_channels);
  g_assert_cmpmem (ea->down_sample_rates, sizeof (int) * ea->n_stages, eb->down_sample_rates,
                   sizeof (int) * eb->n_stages);
  g_assert_cmpint (ea->in_kernel_size, ==, eb->in_kernel_size);
  g_assert_cmpint (ea->out_kernel_size, ==, eb->out_kernel_size);
  g_assert_cmpmem (ea->resblock_kernel_sizes, sizeof (int) * ea->n_resblock_kernel_sizes,
                   eb->resblock_kernel_sizes, sizeof (int) * eb->n_resblock_kernel_sizes);
  g_assert_cmpmem (ea->resblock_dilation_sizes, sizeof (int) * ea->n_resblock_dilation_sizes,
                   eb->resblock_dilation_sizes, sizeof (int) * eb->n_resblock_dilation_sizes);
  g_assert_cmpint (ea->activation, ==, eb->activation);
  g_assert_cmpint (ea->pad_mode, ==, eb->pad_mode);

  g_assert_cmpint (da->base_channels, ==, db->base_channels);
  g_assert_cmpmem (da->up_sample_rates, sizeof (int) * da->n_stages, db->up_sample_rates,
                   sizeof (int) * db->n_stages);
  g_assert_cmpint (da->in_kernel_size, ==, db->in_kernel_size);
  g_assert_cmpint (da->out_kernel_size, ==, db->out_kernel_size);
  g_assert_cmpmem (da->resblock_kernel_sizes, sizeof (int) * da->n_resblock_kernel_sizes,
                   db->resblock_kernel_sizes, sizeof (int) * db->n_resblock_kernel_sizes);
  g_assert_cmpmem (da->resblock_dilation_sizes, sizeof (int) * da->n_resblock_dilation_sizes,
                   db->resblock_dilation_sizes, sizeof (int) * db->n_resblock_dilation_sizes);
  g_assert_cmpint (da->activation, ==, db->activation);
  g_assert_cmpint (da->output_activation, ==, db->output_activation);
  g_assert_cmpint (da->pad_mode, ==, db->pad_mode);
  g_assert_cmpint (da->n_groups_equal_to_out_channels, ==, db->n_groups_equal_to_out_channels);
}

/* The name the weights expose for a checkpoint tensor: "<conv>.weight" for weight norm's v,
 * nothing for g, the tensor's own name otherwise. */
static char *
exposed_name (const GepardCodecTensorInfo *info)
{
  const char *suffix = ".parametrizations.weight.original1";

  switch (info->param)
    {
    case GEPARD_CODEC_PARAM_WEIGHT_G:
      return NULL;
    case GEPARD_CODEC_PARAM_WEIGHT_V:
      {
        g_autofree char *prefix = g_strndup (info->name, strlen (info->name) - strlen (suffix));

        g_assert_true (g_str_has_suffix (info->name, suffix));
        return g_strconcat (prefix, ".weight", NULL);
      }
    default:
      return g_strdup (info->name);
    }
}

typedef struct
{
  const GepardCodecWeights *a;
  const GepardCodecWeights *b; /* NULL: only check `a` has it */
  guint n_checked;
} Compare;

static void
compare_tensor (const GepardCodecTensorInfo *info, gpointer user_data)
{
  Compare *c = user_data;
  g_autofree char *name = exposed_name (info);
  guint n_dims_a = 0, n_dims_b = 0;
  gint64 shape_a[GEPARD_TENSOR_MAX_DIMS], shape_b[GEPARD_TENSOR_MAX_DIMS];
  const float *a, *b;

  if (name == NULL)
    {
      /* the pair is never exposed */
      g_assert_null (gepard_codec_weights_get (c->a, info->name, NULL, NULL));
      return;
    }
  a = gepard_codec_weights_get (c->a, name, &n_dims_a, shape_a);
  g_assert_nonnull (a);
  g_assert_cmpuint (n_dims_a, ==, info->n_dims);
  g_assert_cmpmem (shape_a, sizeof (gint64) * n_dims_a, info->shape,
                   sizeof (gint64) * info->n_dims);
  /* the arena hands out cache-line aligned tensors */
  g_assert_cmpuint ((guintptr)a % 64, ==, 0);
  if (info->param == GEPARD_CODEC_PARAM_WEIGHT_V)
    g_assert_null (gepard_codec_weights_get (c->a, info->name, NULL, NULL));
  if (c->b != NULL)
    {
      b = gepard_codec_weights_get (c->b, name, &n_dims_b, shape_b);
      g_assert_nonnull (b);
      g_assert_cmpuint (n_dims_b, ==, n_dims_a);
      g_assert_cmpmem (shape_b, sizeof (gint64) * n_dims_b, shape_a, sizeof (gint64) * n_dims_a);
      g_assert_cmpmem (a, info->n_elements * 4, b, info->n_elements * 4);
    }
  c->n_checked++;
}

/* ---- tests: files the generator writes ---- */

static void
test_safetensors_tiny (void)
{
  g_autoptr (GepardCodecWeights) weights = open_ok (tiny_file ("safetensors"));
  GepardCodecConfig tiny;
  Compare c = {weights, NULL, 0};
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  const float *levels, *bases;

  gepard_codec_config_init_tiny (&tiny);
  assert_config_equal (gepard_codec_weights_get_config (weights), &tiny);
  gepard_codec_config_foreach_tensor (&tiny, compare_tensor, &c);
  /* 97 + 97 convs, 96 alphas, 8 × 2 FSQ buffers: the folded tiny codec has 500 tensors */
  g_assert_cmpuint (c.n_checked, ==, 97 * 2 * 2 + 96 + 16);

  /* FSQ buffers as float (nanocodec.md §4) */
  levels = gepard_codec_weights_get (weights, "vector_quantizer.fsqs.3.num_levels", &n_dims, shape);
  bases = gepard_codec_weights_get (weights, "vector_quantizer.fsqs.3.dim_base_index", NULL, NULL);
  g_assert_nonnull (levels);
  g_assert_cmpuint (n_dims, ==, 3);
  g_assert_cmpint (shape[1], ==, 4);
  g_assert_cmpfloat (levels[0], ==, 8.0f);
  g_assert_cmpfloat (levels[3], ==, 6.0f);
  g_assert_cmpfloat (bases[2], ==, 56.0f);
  g_assert_cmpfloat (bases[3], ==, 336.0f);
  g_assert_null (gepard_codec_weights_get (weights, "audio_decoder.no_such_tensor", NULL, NULL));
}

static void
test_nemo_equals_safetensors (void)
{
  g_autoptr (GepardCodecWeights) nemo = open_ok (tiny_file ("nemo"));
  g_autoptr (GepardCodecWeights) st = open_ok (tiny_file ("safetensors"));
  Compare c = {nemo, st, 0};

  assert_config_equal (gepard_codec_weights_get_config (nemo),
                       gepard_codec_weights_get_config (st));
  gepard_codec_config_foreach_tensor (gepard_codec_weights_get_config (nemo), compare_tensor, &c);
  g_assert_cmpuint (c.n_checked, ==, 500);
  /* the archive's discriminator and loss tensors are skipped */
  g_assert_null (gepard_codec_weights_get (
      nemo, "discriminator.discriminators.0.discriminators.0.conv_layers.0.conv.bias", NULL, NULL));
  g_assert_null (gepard_codec_weights_get (nemo, "mel_loss_fn.mel_features.0.window", NULL, NULL));
}

typedef struct
{
  const GepardSafetensors *raw;
  const GepardCodecWeights *weights;
  guint n_folded;
  double max_rel;
} FoldCheck;

static void
check_fold (const GepardCodecTensorInfo *info, gpointer user_data)
{
  FoldCheck *f = user_data;
  g_autofree char *name = NULL;
  g_autofree char *g_name = NULL;
  g_autofree float *v = NULL;
  g_autofree float *g = NULL;
  const GepardTensor *vt, *gt;
  const float *w;
  guint64 rows, row_len;

  if (info->param != GEPARD_CODEC_PARAM_WEIGHT_V)
    return;
  name = exposed_name (info);
  {
    /* "<conv>.weight" → "<conv>.parametrizations.weight.original0" */
    g_autofree char *prefix = g_strndup (name, strlen (name) - strlen (".weight"));

    g_name = g_strconcat (prefix, ".parametrizations.weight.original0", NULL);
  }
  vt = gepard_safetensors_lookup (f->raw, info->name);
  gt = gepard_safetensors_lookup (f->raw, g_name);
  g_assert_nonnull (vt);
  g_assert_nonnull (gt);
  v = g_new (float, vt->n_elements);
  g = g_new (float, gt->n_elements);
  gepard_tensor_to_f32 (vt, v);
  gepard_tensor_to_f32 (gt, g);
  w = gepard_codec_weights_get (f->weights, name, NULL, NULL);
  g_assert_nonnull (w);

  /* nanocodec.md §2.4: W[i] = g[i]·v[i]/‖v[i]‖, the norm over every dim but 0 (for a transposed
   * conv dim 0 is in_channels) */
  rows = (guint64)vt->shape[0];
  row_len = vt->n_elements / rows;
  g_assert_cmpuint (gt->n_elements, ==, rows);
  for (guint64 i = 0; i < rows; i++)
    {
      double norm = 0.0, w_norm = 0.0;

      for (guint64 j = 0; j < row_len; j++)
        norm += (double)v[i * row_len + j] * v[i * row_len + j];
      norm = sqrt (norm);
      for (guint64 j = 0; j < row_len; j++)
        {
          double expected = (double)g[i] * v[i * row_len + j] / norm;
          double got = w[i * row_len + j];
          double rel = fabs (got - expected) / fmax (fabs (expected), 1e-30);

          /* one fp32 rounding of the double result: half an ulp, up to 2^-24 relative of the
           * rounded value; allow one ulp */
          g_assert_cmpfloat (rel, <=, 1.2e-7);
          f->max_rel = fmax (f->max_rel, rel);
          w_norm += got * got;
        }
      /* the folded row has norm g, not the stored v's */
      g_assert_cmpfloat (fabs (sqrt (w_norm) - g[i]), <=, 1e-5 * g[i]);
      g_assert_cmpfloat (fabs (norm - g[i]), >, 1e-3);
    }
  f->n_folded++;
}

static void
test_fold (void)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardSafetensors) raw = gepard_safetensors_open (tiny_file ("safetensors"), &error);
  g_autoptr (GepardCodecWeights) from_nemo = open_ok (tiny_file ("nemo"));
  FoldCheck f = {0};

  g_assert_no_error (error);
  f.raw = raw;
  f.weights = from_nemo;
  gepard_codec_config_foreach_tensor (gepard_codec_weights_get_config (from_nemo), check_fold, &f);
  g_assert_cmpuint (f.n_folded, ==, 194);
  g_test_message ("largest relative difference from g·v/‖v‖: %g", f.max_rel);
}

/* The published geometry (~250 MB): written once into the build directory and kept while the
 * generator is unchanged, so that the test stays quick. */
static void
test_published (void)
{
  g_autofree char *tool = g_build_filename (build_dir (), "tools", "gepard-make-test-model", NULL);
  g_autofree char *dir = g_build_filename (build_dir (), "tests", NULL);
  g_autofree char *path = g_build_filename (dir, "codec-weights-nanocodec-22khz.nemo", NULL);
  g_autoptr (GepardCodecWeights) weights = NULL;
  GepardCodecConfig published;
  Compare c = {0};
  GStatBuf tool_st, file_st;
  guint n_dims;
  gint64 shape[GEPARD_TENSOR_MAX_DIMS];
  gint64 up0[] = {864, 1, 16};

  g_assert_cmpint (g_stat (tool, &tool_st), ==, 0);
  if (g_stat (path, &file_st) != 0 || file_st.st_mtime < tool_st.st_mtime)
    {
      g_autofree char *tmp = g_strconcat (path, ".new", NULL);

      g_mkdir_with_parents (dir, 0755);
      run_generator ("nanocodec-22khz", "nemo", 1, tmp);
      g_assert_cmpint (g_rename (tmp, path), ==, 0);
    }

  weights = open_ok (path);
  gepard_codec_config_init_nanocodec_22khz (&published);
  assert_config_equal (gepard_codec_weights_get_config (weights), &published);
  c.a = weights;
  gepard_codec_config_foreach_tensor (&published, compare_tensor, &c);
  g_assert_cmpuint (c.n_checked, ==, 500);
  /* nanocodec.md §2.4: a transposed conv's weight is (C_in, C_out / groups, k) */
  g_assert_nonnull (gepard_codec_weights_get (
      weights, "audio_decoder.up_sample_conv_layers.0.conv.weight", &n_dims, shape));
  g_assert_cmpmem (shape, sizeof (gint64) * n_dims, up0, sizeof up0);
}

/* ---- tests: model_config.yaml ---- */

static const GepardYamlNode *
yaml_path (const GepardYamlNode *node, const char *path)
{
  g_auto (GStrv) parts = g_strsplit (path, ".", -1);

  for (guint i = 0; parts[i] != NULL && node != NULL; i++)
    {
      if (g_ascii_isdigit (parts[i][0]))
        {
          guint index = (guint)g_ascii_strtoull (parts[i], NULL, 10);

          g_assert_cmpint (node->kind, ==, GEPARD_YAML_SEQUENCE);
          node = index < node->items->len ? g_ptr_array_index (node->items, index) : NULL;
        }
      else
        node = gepard_yaml_mapping_lookup (node, parts[i]);
    }
  g_assert_nonnull (node);
  return node;
}

static void
assert_yaml_string (const GepardYamlNode *root, const char *path, const char *expected)
{
  const char *s = gepard_yaml_node_get_string (yaml_path (root, path));

  g_assert_cmpstr (s, ==, expected);
}

static void
test_yaml_fixture (void)
{
  g_autofree char *path
      = g_test_build_filename (G_TEST_DIST, "data", "nanocodec-model_config.yaml", NULL);
  g_autofree char *text = NULL;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardYamlNode) root = NULL;
  GepardCodecConfig parsed, published;
  gsize len;
  gint64 v;
  double d;
  gboolean b;

  g_assert_true (g_file_get_contents (path, &text, &len, &error));
  g_assert_no_error (error);

  /* the codec sections, among trainer, optim, datasets and logging */
  g_assert_true (gepard_nemo_parse_codec_config (text, len, &parsed, &error));
  g_assert_no_error (error);
  gepard_codec_config_init_nanocodec_22khz (&published);
  assert_config_equal (&parsed, &published);

  /* and the rest of the file as PyYAML reads it */
  root = gepard_yaml_parse (text, len, &error);
  g_assert_no_error (error);
  assert_yaml_string (root, "validation_ds.datasets.0.name", "libritts dev: clean");
  assert_yaml_string (root, "validation_ds.datasets.1.name", "expresso, \"read\" subset");
  g_assert_cmpuint (yaml_path (root, "validation_ds.datasets.1.weights")->items->len, ==, 0);
  assert_yaml_string (root, "train_ds.dataset.dataset_meta", "???");
  assert_yaml_string (root, "train_ds.dataset.shard_strategy", "scatter");
  g_assert_true (gepard_yaml_node_is_null (yaml_path (root, "train_ds.dataset.max_duration")));
  assert_yaml_string (root, "log_config.generators.1.output_key", "spec: output");
  assert_yaml_string (root,
                      "log_config.generators.0.data_loader_config.dataset.dataset_meta."
                      "libritts_dev.audio_dir",
                      "/data/LibriTTS");
  g_assert_true (gepard_yaml_node_get_double (
      yaml_path (root, "log_config.generators.1.mel_filter.log_guard"), &d));
  g_assert_cmpfloat (d, ==, 1e-5);
  g_assert_true (gepard_yaml_node_get_int (
      yaml_path (root, "discriminator.discriminators.1.resolutions.1.2"), 0, 10000, &v));
  g_assert_cmpint (v, ==, 1024);
  g_assert_true (gepard_yaml_node_get_int (
      yaml_path (root, "discriminator.discriminators.1.resolutions.2.0"), 0, 10000, &v));
  g_assert_cmpint (v, ==, 2048);
  g_assert_true (gepard_yaml_node_get_double (
      yaml_path (root, "discriminator.discriminators.1.stft_bands.4.1"), &d));
  g_assert_cmpfloat (d, ==, 1.0);
  g_assert_true (gepard_yaml_node_get_int (yaml_path (root, "trainer.devices"), -10, 10, &v));
  g_assert_cmpint (v, ==, -1);
  g_assert_true (gepard_yaml_node_get_bool (yaml_path (root, "trainer.benchmark"), &b));
  g_assert_false (b);
  assert_yaml_string (root, "optim.sched.description", "decays the learning rate once per epoch\n");
  assert_yaml_string (root, "exp_manager.notes",
                      "Trained on LibriTTS and internal data:\n  22050 Hz mono, 1024 samples per "
                      "frame.\n");
  assert_yaml_string (root, "exp_manager.checkpoint_callback_params.filename",
                      "{epoch}-{step}-{val_loss:.4f}");
  assert_yaml_string (root, "nemo_version", "2.5.0rc0");
}

static void
test_yaml_syntax (void)
{
  static const char *const good = "---\n"
                                  "# comment\n"
                                  "a: 1   # trailing comment\n"
                                  "b: 'it''s: quoted'\n"
                                  "c: \"tab\\tand \\u00e9 and \\\"q\\\"\"\n"
                                  "d:\n"
                                  "- x: 1\n"
                                  "  y: [1, 2, {k: v, 'q k': \"w\"}]\n"
                                  "-   - nested\n"
                                  "    - seq\n"
                                  "- \n"
                                  "  plain\n"
                                  "e: a long plain scalar that\n"
                                  "  continues here\n"
                                  "f: \"folded\n"
                                  "  quoted\"\n"
                                  "g: {}\n"
                                  "h: ~\n"
                                  "i: [a,\n"
                                  "    b]\n"
                                  "j: http://example.com/x#frag\n"
                                  "k:\n"
                                  "  - item\n"
                                  "...\n";
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardYamlNode) root = gepard_yaml_parse (good, strlen (good), &error);
  static const struct
  {
    const char *text;
    GepardFormatError code;
    const char *needle;
  } bad[] = {
      {"a: 1\n a: 2\n", GEPARD_FORMAT_ERROR_CORRUPT, "line 2"},
      {"a: 1\na: 2\n", GEPARD_FORMAT_ERROR_CORRUPT, "duplicate key"},
      {"a: [1, 2\n", GEPARD_FORMAT_ERROR_CORRUPT, "unterminated"},
      {"a: 'open\n", GEPARD_FORMAT_ERROR_CORRUPT, "unterminated"},
      {"a: &anchor 1\n", GEPARD_FORMAT_ERROR_UNSUPPORTED, "anchors"},
      {"a: *alias\n", GEPARD_FORMAT_ERROR_UNSUPPORTED, "aliases"},
      {"a: !!python/object x\n", GEPARD_FORMAT_ERROR_UNSUPPORTED, "tags"},
      {"? complex\n", GEPARD_FORMAT_ERROR_UNSUPPORTED, "complex"},
      {"a: b: c\n", GEPARD_FORMAT_ERROR_CORRUPT, "quote the value"},
      {"a:\n\t- 1\n", GEPARD_FORMAT_ERROR_CORRUPT, "tab"},
      {"a: \"\\q\"\n", GEPARD_FORMAT_ERROR_CORRUPT, "escape"},
      {"a: \"\\x00\"\n", GEPARD_FORMAT_ERROR_CORRUPT, "invalid character"},
      {"a: 1\nplain\n", GEPARD_FORMAT_ERROR_CORRUPT, "key: value"},
      {"a: [1, 2] x\n", GEPARD_FORMAT_ERROR_CORRUPT, "after a flow"},
      {"a: \xff\n", GEPARD_FORMAT_ERROR_CORRUPT, "UTF-8"},
  };

  g_assert_no_error (error);
  g_assert_cmpint (root->kind, ==, GEPARD_YAML_MAPPING);
  g_assert_cmpuint (root->keys->len, ==, 11);
  assert_yaml_string (root, "b", "it's: quoted");
  assert_yaml_string (root, "c", "tab\tand \xc3\xa9 and \"q\"");
  assert_yaml_string (root, "d.0.y.2.k", "v");
  assert_yaml_string (root, "d.0.y.2.q k", "w");
  assert_yaml_string (root, "d.1.1", "seq");
  assert_yaml_string (root, "d.2", "plain");
  assert_yaml_string (root, "e", "a long plain scalar that continues here");
  assert_yaml_string (root, "f", "folded quoted");
  g_assert_cmpint (yaml_path (root, "g")->kind, ==, GEPARD_YAML_MAPPING);
  g_assert_true (gepard_yaml_node_is_null (yaml_path (root, "h")));
  assert_yaml_string (root, "i.1", "b");
  assert_yaml_string (root, "j", "http://example.com/x#frag");
  assert_yaml_string (root, "k.0", "item");

  for (guint i = 0; i < G_N_ELEMENTS (bad); i++)
    {
      g_autoptr (GError) bad_error = NULL;
      g_autoptr (GepardYamlNode) node
          = gepard_yaml_parse (bad[i].text, strlen (bad[i].text), &bad_error);

      if (node != NULL)
        g_error ("accepted: %s", bad[i].text);
      g_assert_error (bad_error, GEPARD_FORMAT_ERROR, (gint)bad[i].code);
      assert_contains (bad_error->message, bad[i].needle);
    }

  /* nesting is capped, in flow and in block style */
  for (int style = 0; style < 2; style++)
    {
      g_autoptr (GString) deep = g_string_new (NULL);
      g_autoptr (GError) deep_error = NULL;
      g_autoptr (GepardYamlNode) node = NULL;

      for (int i = 0; i < 100; i++)
        {
          if (style == 0)
            g_string_append_c (deep, '[');
          else
            g_string_append_printf (deep, "%*sk:\n", i, "");
        }
      if (style == 0)
        for (int i = 0; i < 100; i++)
          g_string_append_c (deep, ']');
      node = gepard_yaml_parse (deep->str, deep->len, &deep_error);
      g_assert_null (node);
      g_assert_error (deep_error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_UNSUPPORTED);
      assert_contains (deep_error->message, "nesting");
    }
}

/* model_config.yaml variants: `find` replaced by `replace` in the micro codec's own text. */
static char *
micro_yaml_with (const char *find, const char *replace)
{
  g_autofree char *yaml = micro_yaml ();
  g_autoptr (GString) s = g_string_new (yaml);

  g_assert_nonnull (strstr (yaml, find));
  g_string_replace (s, find, replace, 1);
  return g_string_free (g_steal_pointer (&s), FALSE);
}

static void
test_config_errors (void)
{
  static const struct
  {
    const char *find;
    const char *replace;
    GepardFormatError code;
    const char *needle;
  } cases[] = {
      {"HiFiGANEncoder", "CausalHiFiGANEncoder", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "audio_encoder._target_"},
      {"CausalHiFiGANDecoder", "HiFiGANDecoder", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "audio_decoder._target_"},
      {"GroupFiniteScalarQuantizer", "ResidualVectorQuantizer", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "vector_quantizer._target_"},
      {"AudioCodecModel", "MagpieTTSModel", GEPARD_FORMAT_ERROR_UNSUPPORTED, "AudioCodecModel"},
      {"  base_channels: 4\n", "", GEPARD_FORMAT_ERROR_MISSING, "audio_decoder.base_channels"},
      {"samples_per_frame: 4\n", "", GEPARD_FORMAT_ERROR_MISSING, "samples_per_frame"},
      {"  output_activation: clamp\n", "  output_activation: sigmoid\n",
       GEPARD_FORMAT_ERROR_UNSUPPORTED, "sigmoid"},
      {"  activation: lrelu\n", "  activation: half_snake\n", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "lrelu"},
      {"  input_dim: 2\n", "  input_dim: 2\n  use_weight_norm: false\n",
       GEPARD_FORMAT_ERROR_UNSUPPORTED, "use_weight_norm"},
      {"  input_dim: 2\n", "  input_dim: 3\n", GEPARD_FORMAT_ERROR_SHAPE, "input_dim"},
      {"num_levels_per_group: [3, 4]", "num_levels_per_group: [3, '4']", GEPARD_FORMAT_ERROR_SHAPE,
       "num_levels_per_group"},
      {"up_sample_rates: [4]", "up_sample_rates: [2]", GEPARD_FORMAT_ERROR_SHAPE,
       "samples_per_frame"},
      {"audio_decoder:\n", "audio_decoder:\n  bad indentation\n", GEPARD_FORMAT_ERROR_CORRUPT,
       "line"},
      {"  input_dim: 2\n", "  input_dim: null\n", GEPARD_FORMAT_ERROR_SHAPE, "input_dim (line"},
      {"  input_dim: 2\n", "  input_dim: ${nowhere.x}\n", GEPARD_FORMAT_ERROR_MISSING,
       "names nothing"},
      {"  input_dim: 2\n", "  input_dim: ${oc.env:DIM}\n", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "absolute"},
      {"  input_dim: 2\n", "  input_dim: ${.encoded_dim}\n", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "relative"},
      {"sample_rate: 16000\n", "sample_rate: ${sample_rate}\n", GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "nest deeper"},
  };
  g_autoptr (GPtrArray) tensors = micro_tensors ();

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autofree char *yaml = micro_yaml_with (cases[i].find, cases[i].replace);
      Flaws flaws = {0};
      g_autoptr (GBytes) nemo = NULL;
      g_autoptr (GError) error = NULL;
      GepardCodecConfig config;

      g_assert_false (gepard_nemo_parse_codec_config (yaml, strlen (yaml), &config, &error));
      g_assert_error (error, GEPARD_FORMAT_ERROR, (gint)cases[i].code);
      assert_contains (error->message, cases[i].needle);

      /* and the same through a whole archive */
      flaws.yaml = yaml;
      nemo = compose_nemo (yaml, tensors, &flaws);
      assert_bytes_fail ("bad-config.nemo", nemo, cases[i].code, cases[i].needle);
    }
}

/* What GepardCodecConfig can express is recorded, not refused: a tanh output, an explicit eps. */
static void
test_config_recorded (void)
{
  g_autofree char *tanh_yaml
      = micro_yaml_with ("output_activation: clamp", "output_activation: tanh");
  g_autofree char *eps_yaml = micro_yaml_with ("num_groups: 1\n", "num_groups: 1\n  eps: 0.002\n");
  g_autofree char *default_yaml = micro_yaml_with ("  resblock_kernel_sizes: [3]\n", "");
  GepardCodecConfig config;
  g_autoptr (GError) error = NULL;

  g_assert_true (gepard_nemo_parse_codec_config (tanh_yaml, strlen (tanh_yaml), &config, &error));
  g_assert_no_error (error);
  g_assert_cmpint (config.decoder.output_activation, ==, GEPARD_CODEC_OUTPUT_TANH);

  g_assert_true (gepard_nemo_parse_codec_config (eps_yaml, strlen (eps_yaml), &config, &error));
  g_assert_cmpfloat (config.fsq_eps, ==, 0.002);

  /* OmegaConf interpolations by absolute path, as a config may keep them */
  {
    g_autofree char *a
        = micro_yaml_with ("  input_dim: 2\n", "  input_dim: ${audio_encoder.encoded_dim}\n");
    g_autofree char *b = micro_yaml_with ("up_sample_rates: [4]", "up_sample_rates: ${rates}");
    g_autofree char *c = g_strconcat (b, "rates:\n- ${hop}\nhop: ${samples_per_frame}\n", NULL);

    g_assert_true (gepard_nemo_parse_codec_config (a, strlen (a), &config, &error));
    g_assert_no_error (error);
    g_assert_cmpint (config.latent_dim, ==, 2);
    g_assert_true (gepard_nemo_parse_codec_config (c, strlen (c), &config, &error));
    g_assert_no_error (error);
    g_assert_cmpint (config.decoder.up_sample_rates[0], ==, 4);
  }

  /* an absent argument takes NeMo's default (nanocodec.md §2.1: kernels 3, 7, 11) */
  g_assert_true (
      gepard_nemo_parse_codec_config (default_yaml, strlen (default_yaml), &config, &error));
  g_assert_cmpint (config.encoder.n_resblock_kernel_sizes, ==, 3);
  g_assert_cmpint (config.encoder.resblock_kernel_sizes[2], ==, 11);
}

/* ---- tests: composed archives ---- */

static void
test_layouts (void)
{
  g_autoptr (GPtrArray) tensors = micro_tensors ();
  g_autofree char *yaml = micro_yaml ();
  g_autoptr (GepardCodecWeights) reference = NULL;
  static const TarNames names[] = {NAMES_DOT, NAMES_PLAIN, NAMES_FOLDER, NAMES_GNU, NAMES_PAX};
  GepardCodecConfig micro;

  micro_config (&micro);
  {
    Flaws flaws = {0};
    g_autoptr (GBytes) nemo = compose_nemo (yaml, tensors, &flaws);
    g_autofree char *path = write_scratch ("layout-reference.nemo", nemo);

    reference = open_ok (path);
    assert_config_equal (gepard_codec_weights_get_config (reference), &micro);
  }

  for (guint variant = 0; variant < G_N_ELEMENTS (names) + 4; variant++)
    {
      Flaws flaws = {0};
      g_autoptr (GBytes) nemo = NULL;
      g_autofree char *path = NULL;
      g_autoptr (GepardCodecWeights) weights = NULL;
      Compare c = {0};

      if (variant < G_N_ELEMENTS (names))
        flaws.tar.names = names[variant];
      else if (variant == G_N_ELEMENTS (names))
        {
          /* torch's zip64 end records, protocol-4 strings, no _metadata, no end blocks */
          flaws.zip.zip64 = TRUE;
          flaws.pickle.protocol4_names = TRUE;
          flaws.pickle.no_metadata = TRUE;
          flaws.tar.no_end = TRUE;
        }
      else if (variant == G_N_ELEMENTS (names) + 1)
        find_tensor (tensors, "audio_decoder.pre_conv.conv.bias")->as_parameter = TRUE;
      else if (variant == G_N_ELEMENTS (names) + 2)
        {
          /* a tensor outside the codec may be anything; it is not resolved */
          Tensor *t = g_new0 (Tensor, 1);

          t->name = g_strdup ("discriminator.some.weight");
          t->storage_class = "DoubleStorage";
          t->n_dims = 1;
          t->shape[0] = 3;
          t->extra_numel = 1000;
          t->bad_stride = TRUE;
          t->data = g_bytes_new ("12345678", 8);
          g_ptr_array_add (tensors, t);
        }
      nemo = compose_nemo (yaml, tensors, &flaws);
      if (variant == G_N_ELEMENTS (names) + 3)
        {
          /* an old gzip-compressed archive */
          g_autoptr (GZlibCompressor) gz = g_zlib_compressor_new (G_ZLIB_COMPRESSOR_FORMAT_GZIP, 6);
          g_autoptr (GInputStream) in = g_memory_input_stream_new_from_bytes (nemo);
          g_autoptr (GInputStream) conv = g_converter_input_stream_new (in, G_CONVERTER (gz));
          g_autoptr (GByteArray) out = g_byte_array_new ();
          guint8 buffer[4096];
          gssize n;

          while ((n = g_input_stream_read (conv, buffer, sizeof buffer, NULL, NULL)) > 0)
            g_byte_array_append (out, buffer, (guint)n);
          g_assert_cmpint (n, ==, 0);
          g_bytes_unref (nemo);
          nemo = g_byte_array_free_to_bytes (g_steal_pointer (&out));
        }
      path = write_scratch ("layout.nemo", nemo);
      weights = open_ok (path);
      c.a = weights;
      c.b = reference;
      gepard_codec_config_foreach_tensor (&micro, compare_tensor, &c);
      g_assert_cmpuint (c.n_checked, >, 10);
    }
}

typedef struct
{
  const char *name;
  Flaws flaws;
  void (*spoil) (GPtrArray *tensors);
  GepardFormatError code;
  const char *needle;
} Malformed;

static void
spoil_stride (GPtrArray *tensors)
{
  find_tensor (tensors, "audio_decoder.res_layers.0.res_blocks.0.res_blocks.0.input_conv.conv."
                        "parametrizations.weight.original1")
      ->bad_stride
      = TRUE;
}

static void
spoil_storage_numel (GPtrArray *tensors)
{
  find_tensor (tensors, "audio_decoder.post_conv.conv.bias")->extra_numel = 1;
}

static void
spoil_missing (GPtrArray *tensors)
{
  find_tensor (tensors, "audio_decoder.activations.0.activation.snake_act.alpha")->omit = TRUE;
}

static void
spoil_shape (GPtrArray *tensors)
{
  find_tensor (tensors, "audio_encoder.pre_conv.conv.parametrizations.weight.original1")
      ->shape_delta_last
      = -1;
}

static void
spoil_dtype (GPtrArray *tensors)
{
  find_tensor (tensors, "vector_quantizer.fsqs.0.num_levels")->storage_class = "FloatStorage";
}

static void
spoil_fsq_levels (GPtrArray *tensors)
{
  Tensor *t = find_tensor (tensors, "vector_quantizer.fsqs.0.num_levels");
  guint8 data[8];

  /* levels [3, 5] where the config says [3, 4] */
  memcpy (data, g_bytes_get_data (t->data, NULL), 8);
  set_le (data + 4, 5, 4);
  g_bytes_unref (t->data);
  t->data = g_bytes_new (data, 8);
}

static void
spoil_many (GPtrArray *tensors)
{
  Tensor *extra = g_new0 (Tensor, 1);

  spoil_missing (tensors);
  spoil_shape (tensors);
  extra->name = g_strdup ("audio_decoder.extra_layer.conv.bias");
  extra->storage_class = "FloatStorage";
  extra->n_dims = 1;
  extra->shape[0] = 1;
  extra->data = g_bytes_new ("\0\0\0\0", 4);
  g_ptr_array_add (tensors, extra);
}

static void
spoil_zero_norm (GPtrArray *tensors)
{
  Tensor *t
      = find_tensor (tensors, "audio_decoder.post_conv.conv.parametrizations.weight.original1");

  g_bytes_unref (t->data);
  t->data = g_bytes_new_take (g_malloc0 (2 * 3 * 4), 2 * 3 * 4);
}

static void
test_malformed (void)
{
  static const Malformed cases[] = {
      {"tar-missing-member",
       {.tar.no_weights = TRUE},
       NULL,
       GEPARD_FORMAT_ERROR_MISSING,
       "model_weights.ckpt"},
      {"zip-compressed",
       {.zip.compressed = "model_weights/data.pkl"},
       NULL,
       GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "model_weights/data.pkl is compressed"},
      {"zip-offset-past-end",
       {.zip.offset_past_end = TRUE},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "no local header"},
      {"zip-directory-past-end",
       {.zip.directory_past_end = TRUE},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "does not fit"},
      {"zip-bad-crc", {.zip.bad_crc = TRUE}, NULL, GEPARD_FORMAT_ERROR_CORRUPT, "CRC"},
      {"zip-outside-folder",
       {.outside_entry = "elsewhere/x"},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "outside the checkpoint folder"},
      {"zip-big-endian", {.byteorder = "big"}, NULL, GEPARD_FORMAT_ERROR_UNSUPPORTED, "byte order"},
      {"zip-missing-storage",
       {.drop_storage = TRUE},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "storage record"},
      {"zip-short-storage",
       {.short_storage = TRUE},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "record holds"},
      {"pickle-unknown-global",
       {.pickle.bad_global = "posix\nsystem"},
       NULL,
       GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "global posix.system is not allowed"},
      {"pickle-truncated",
       {.pickle.truncate_at = 700},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "truncated"},
      {"pickle-bad-memo",
       {.pickle.bad_memo = TRUE},
       NULL,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "memo index 100000"},
      {"storage-too-small",
       {.yaml = NULL},
       spoil_storage_numel,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "audio_decoder.post_conv.conv.bias: storage"},
      {"non-contiguous",
       {.yaml = NULL},
       spoil_stride,
       GEPARD_FORMAT_ERROR_UNSUPPORTED,
       "not contiguous"},
      {"missing-tensor",
       {.yaml = NULL},
       spoil_missing,
       GEPARD_FORMAT_ERROR_MISSING,
       "audio_decoder.activations.0.activation.snake_act.alpha is missing"},
      {"mis-shaped-tensor",
       {.yaml = NULL},
       spoil_shape,
       GEPARD_FORMAT_ERROR_SHAPE,
       "audio_encoder.pre_conv.conv.parametrizations.weight.original1 has shape [1, 1, 2], not "
       "[1, 1, 3]"},
      {"wrong-dtype",
       {.yaml = NULL},
       spoil_dtype,
       GEPARD_FORMAT_ERROR_SHAPE,
       "vector_quantizer.fsqs.0.num_levels is F32, not I32"},
      {"fsq-levels-disagree",
       {.yaml = NULL},
       spoil_fsq_levels,
       GEPARD_FORMAT_ERROR_CORRUPT,
       "vector_quantizer.fsqs.0.num_levels[1] is 5 where model_config.yaml implies 4"},
      /* the first problem in checkpoint order (the encoder's) gives the code */
      {"many-problems", {.yaml = NULL}, spoil_many, GEPARD_FORMAT_ERROR_SHAPE, "3 problems"},
      {"zero-weight-norm", {.yaml = NULL}, spoil_zero_norm, GEPARD_FORMAT_ERROR_CORRUPT, "zero"},
  };

  for (guint i = 0; i < G_N_ELEMENTS (cases); i++)
    {
      g_autoptr (GPtrArray) tensors = micro_tensors ();
      g_autofree char *yaml = micro_yaml ();
      g_autofree char *name = g_strconcat (cases[i].name, ".nemo", NULL);
      g_autoptr (GBytes) nemo = NULL;

      g_test_message ("case %s", cases[i].name);
      if (cases[i].spoil != NULL)
        cases[i].spoil (tensors);
      nemo = compose_nemo (yaml, tensors, &cases[i].flaws);
      assert_bytes_fail (name, nemo, cases[i].code, cases[i].needle);
    }

  /* all three problems of spoil_many are named in the one error */
  {
    g_autoptr (GPtrArray) tensors = micro_tensors ();
    g_autofree char *yaml = micro_yaml ();
    Flaws none = {0};
    g_autoptr (GBytes) nemo = NULL;
    g_autofree char *path = NULL;
    g_autoptr (GError) error = NULL;
    g_autoptr (GepardCodecWeights) weights = NULL;

    spoil_many (tensors);
    nemo = compose_nemo (yaml, tensors, &none);
    path = write_scratch ("many.nemo", nemo);
    weights = gepard_codec_weights_open (path, &error);
    g_assert_null (weights);
    assert_contains (error->message, "snake_act.alpha is missing");
    assert_contains (error->message, "has shape [1, 1, 2]");
    assert_contains (error->message, "audio_decoder.extra_layer.conv.bias is not a tensor");
  }
}

/* Damage to a file the generator wrote, where the real archive's layout matters. */
static void
test_damaged_generated (void)
{
  g_autofree char *contents = NULL;
  gsize len;
  g_autoptr (GBytes) cut = NULL;
  g_autoptr (GByteArray) bytes = g_byte_array_new ();
  g_autofree char *path = scratch_path ("damaged.nemo");

  g_assert_true (g_file_get_contents (tiny_file ("nemo"), &contents, &len, NULL));

  /* truncated in the middle of model_weights.ckpt */
  cut = g_bytes_new (contents, len / 2);
  assert_bytes_fail ("truncated.nemo", cut, GEPARD_FORMAT_ERROR_CORRUPT, "truncated tar");

  /* a checksum that no longer matches the second header ("./model_config.yaml") */
  g_byte_array_append (bytes, (const guint8 *)contents, (guint)len);
  bytes->data[512 + 5] ^= 0x20;
  write_file (path, bytes->data, bytes->len);
  assert_open_fails (path, GEPARD_FORMAT_ERROR_CORRUPT, "checksum at byte 512");
  bytes->data[512 + 5] ^= 0x20;

  /* the first header spoiled: not a tar at all */
  bytes->data[0] ^= 0x01;
  write_file (path, bytes->data, bytes->len);
  assert_open_fails (path, GEPARD_FORMAT_ERROR_CORRUPT, "not a .nemo archive");
  bytes->data[0] ^= 0x01;

  /* a safetensors export without its config */
  {
    g_autoptr (GepardSafetensorsWriter) writer = gepard_safetensors_writer_new ();
    g_autofree char *st = scratch_path ("no-config.safetensors");
    gint64 shape[1] = {1};
    float one = 1.0f;
    g_autoptr (GError) error = NULL;

    gepard_safetensors_writer_add_data (writer, "audio_decoder.x", GEPARD_DTYPE_F32, 1, shape,
                                        &one);
    g_assert_true (gepard_safetensors_writer_write (writer, st, &error));
    assert_open_fails (st, GEPARD_FORMAT_ERROR_MISSING, "model_config.yaml");
  }
  {
    g_autofree char *missing = scratch_path ("does-not-exist.nemo");

    assert_open_fails (missing, GEPARD_FORMAT_ERROR_IO, "cannot open");
    assert_open_fails (scratch_dir, GEPARD_FORMAT_ERROR_IO, "regular file");
  }
}

/* ---- mutations ---- */

static guint
env_count (const char *name, guint fallback)
{
  const char *value = g_getenv (name);

  return value != NULL ? (guint)g_ascii_strtoull (value, NULL, 10) : fallback;
}

static void
mutate (GRand *rand, GByteArray *bytes, gsize region_start, gsize region_len)
{
  guint n = (guint)g_rand_int_range (rand, 1, 5);

  for (guint k = 0; k < n && bytes->len > 0; k++)
    {
      gsize pos
          = region_start + (gsize)g_rand_int_range (rand, 0, (gint32)MIN (region_len, G_MAXINT32));

      if (pos >= bytes->len)
        pos = bytes->len - 1;
      switch (g_rand_int_range (rand, 0, 6))
        {
        case 0:
        case 1:
          bytes->data[pos] ^= (guint8)(1u << g_rand_int_range (rand, 0, 8));
          break;
        case 2:
          bytes->data[pos] = (guint8)g_rand_int_range (rand, 0, 256);
          break;
        case 3:
          bytes->data[pos] = g_rand_boolean (rand) ? 0xff : 0x00;
          break;
        case 4:
          g_byte_array_set_size (bytes, (guint)pos);
          break;
        case 5:
          /* a byte dropped: everything after it shifts */
          g_byte_array_remove_index (bytes, (guint)pos);
          break;
        }
    }
}

static void
open_mutant (const char *path, guint *n_ok, guint *n_failed)
{
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardCodecWeights) weights = gepard_codec_weights_open (path, &error);

  if (weights != NULL)
    {
      g_assert_no_error (error);
      g_assert_true (
          gepard_codec_config_validate (gepard_codec_weights_get_config (weights), NULL));
      (*n_ok)++;
    }
  else
    {
      g_assert_nonnull (error);
      g_assert_true (error->domain == GEPARD_FORMAT_ERROR);
      g_assert_nonnull (error->message);
      (*n_failed)++;
    }
}

static void
test_mutations (void)
{
  g_autoptr (GBytes) base = micro_nemo (NULL);
  g_autofree char *path = scratch_path ("mutant.nemo");
  GRand *rand = g_rand_new_with_seed (20240601);
  guint iterations = env_count ("GEPARD_MUTATIONS", 3000);
  guint n_ok = 0, n_failed = 0;

  for (guint i = 0; i < iterations; i++)
    {
      g_autoptr (GByteArray) bytes = g_byte_array_new ();

      g_byte_array_append (bytes, g_bytes_get_data (base, NULL), (guint)g_bytes_get_size (base));
      mutate (rand, bytes, 0, bytes->len);
      write_file (path, bytes->data, bytes->len);
      open_mutant (path, &n_ok, &n_failed);
    }
  g_rand_free (rand);
  g_test_message ("%u mutants opened, %u refused", n_ok, n_failed);
  g_assert_cmpuint (n_ok + n_failed, ==, iterations);
  /* most damage is caught (the CRCs cover the records) */
  g_assert_cmpuint (n_failed, >, iterations / 2);
}

/* Mutations inside data.pkl, stored with a matching CRC, so that they reach the pickle machine. */
static void
test_mutations_pickle (void)
{
  g_autoptr (GPtrArray) tensors = micro_tensors ();
  g_autofree char *yaml = micro_yaml ();
  PickleFlaws none = {0};
  g_autoptr (GBytes) base = compose_pickle (tensors, &none);
  g_autofree char *path = scratch_path ("mutant-pickle.nemo");
  GRand *rand = g_rand_new_with_seed (99);
  guint iterations = env_count ("GEPARD_MUTATIONS", 3000) / 3;
  guint n_ok = 0, n_failed = 0;

  for (guint i = 0; i < iterations; i++)
    {
      g_autoptr (GByteArray) bytes = g_byte_array_new ();
      g_autoptr (GBytes) nemo = NULL;
      Flaws flaws = {.yaml = NULL};

      g_byte_array_append (bytes, g_bytes_get_data (base, NULL), (guint)g_bytes_get_size (base));
      mutate (rand, bytes, 0, bytes->len);
      flaws.pickle_bytes = g_bytes_new (bytes->data, bytes->len);
      nemo = compose_nemo (yaml, tensors, &flaws);
      g_bytes_unref (flaws.pickle_bytes);
      write_file (path, g_bytes_get_data (nemo, NULL), g_bytes_get_size (nemo));
      open_mutant (path, &n_ok, &n_failed);
    }
  g_rand_free (rand);
  g_test_message ("%u mutants opened, %u refused", n_ok, n_failed);
  g_assert_cmpuint (n_failed, >, 0);
}

/* Inputs tests/fuzz/fuzz-pickle.c found (also kept in tests/fuzz-corpus/pickle), run through the
 * pickle machine directly: each is refused with a clear error. In the sanitizer build they also
 * show that the undefined behaviour they once triggered is gone. */
static void
test_pickle_fuzz_findings (void)
{
  static const struct
  {
    const char *bytes;
    gsize len;
    const char *needle;
  } findings[] = {
      /* MARK, LIST, APPENDS: LIST collected zero items from a stack that had never held a value,
       * computing their address as NULL + 0 */
      {"(le", 3, "MARK"},
  };

  for (guint i = 0; i < G_N_ELEMENTS (findings); i++)
    {
      g_autoptr (GError) error = NULL;
      g_autoptr (GPtrArray) tensors = gepard_pickle_load_state_dict (
          (const guint8 *)findings[i].bytes, findings[i].len, NULL, &error);

      g_assert_null (tensors);
      g_assert_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT);
      assert_contains (error->message, findings[i].needle);
    }
}

/* Mutations of the realistic model_config.yaml, read directly. */
static void
test_mutations_yaml (void)
{
  g_autofree char *fixture
      = g_test_build_filename (G_TEST_DIST, "data", "nanocodec-model_config.yaml", NULL);
  g_autofree char *text = NULL;
  GRand *rand = g_rand_new_with_seed (5);
  guint iterations = env_count ("GEPARD_MUTATIONS", 3000);
  guint n_ok = 0, n_failed = 0;
  gsize len;

  g_assert_true (g_file_get_contents (fixture, &text, &len, NULL));
  for (guint i = 0; i < iterations; i++)
    {
      g_autoptr (GByteArray) bytes = g_byte_array_new ();
      g_autoptr (GError) error = NULL;
      g_autoptr (GepardYamlNode) root = NULL;
      GepardCodecConfig config;

      g_byte_array_append (bytes, (const guint8 *)text, (guint)len);
      mutate (rand, bytes, 0, bytes->len);
      root = gepard_yaml_parse ((const char *)bytes->data, bytes->len, &error);
      g_assert_true ((root == NULL) == (error != NULL));
      g_clear_error (&error);
      if (gepard_nemo_parse_codec_config ((const char *)bytes->data, bytes->len, &config, &error))
        {
          g_assert_no_error (error);
          g_assert_true (gepard_codec_config_validate (&config, NULL));
          n_ok++;
        }
      else
        {
          g_assert_nonnull (error);
          g_assert_true (error->domain == GEPARD_FORMAT_ERROR);
          n_failed++;
        }
    }
  g_rand_free (rand);
  g_test_message ("%u mutants parsed, %u refused", n_ok, n_failed);
}

/* The generator's tiny archive: its headers, pickle and central directory are mutated in place
 * (the tensor bytes in between only change weights) and put back after each open. */
static void
test_mutations_generated (void)
{
  g_autofree char *contents = NULL;
  g_autofree char *path = scratch_path ("mutant-tiny.nemo");
  GRand *rand = g_rand_new_with_seed (7);
  guint iterations = env_count ("GEPARD_GENERATED_MUTATIONS", 150);
  guint n_ok = 0, n_failed = 0;
  gsize len;
  const gsize head = 96 * 1024, tail = 64 * 1024;

  g_assert_true (g_file_get_contents (tiny_file ("nemo"), &contents, &len, NULL));
  g_assert_cmpuint (len, >, head + tail);
  for (guint i = 0; i < iterations; i++)
    {
      g_autoptr (GByteArray) bytes = g_byte_array_new ();
      gboolean at_head = g_rand_boolean (rand);

      g_byte_array_append (bytes, (const guint8 *)contents, (guint)len);
      mutate (rand, bytes, at_head ? 0 : len - tail, at_head ? head : tail);
      write_file (path, bytes->data, bytes->len);
      open_mutant (path, &n_ok, &n_failed);
    }
  g_rand_free (rand);
  g_test_message ("%u mutants opened, %u refused", n_ok, n_failed);
}

/* ---- the fuzzer's seed corpus ---- */

/* GEPARD_WRITE_NEMO_CORPUS=<dir> writes the seeds (a valid micro archive and a few broken ones). */
static void
write_corpus (const char *dir)
{
  static const struct
  {
    const char *name;
    Flaws flaws;
  } seeds[] = {
      {"valid-micro.nemo", {.yaml = NULL}},
      {"valid-micro-folder-pax.nemo", {.tar.names = NAMES_PAX, .zip.zip64 = TRUE}},
      {"bad-zip-compressed.nemo", {.zip.compressed = "model_weights/data.pkl"}},
      {"bad-pickle-global.nemo", {.pickle.bad_global = "posix\nsystem"}},
      {"bad-pickle-memo.nemo", {.pickle.bad_memo = TRUE}},
      {"bad-missing-weights.nemo", {.tar.no_weights = TRUE}},
  };

  g_mkdir_with_parents (dir, 0755);
  for (guint i = 0; i < G_N_ELEMENTS (seeds); i++)
    {
      g_autoptr (GBytes) nemo = micro_nemo (&seeds[i].flaws);
      g_autofree char *path = g_build_filename (dir, seeds[i].name, NULL);

      write_file (path, g_bytes_get_data (nemo, NULL), g_bytes_get_size (nemo));
    }
}

static void
test_fuzz_corpus (void)
{
  g_autofree char *corpus = g_test_build_filename (G_TEST_DIST, "fuzz-corpus", "nemo", NULL);
  g_autoptr (GDir) dir = g_dir_open (corpus, 0, NULL);
  const char *name;
  guint n_valid = 0, n_bad = 0;

  if (dir == NULL)
    {
      g_test_skip ("fuzz-corpus/nemo not found; set G_TEST_SRCDIR to the tests directory");
      return;
    }
  while ((name = g_dir_read_name (dir)) != NULL)
    {
      g_autofree char *path = g_build_filename (corpus, name, NULL);
      g_autoptr (GError) error = NULL;
      g_autoptr (GepardCodecWeights) weights = gepard_codec_weights_open (path, &error);

      if (g_str_has_prefix (name, "valid-"))
        {
          g_assert_no_error (error);
          g_assert_nonnull (weights);
          n_valid++;
        }
      else
        {
          g_assert_null (weights);
          g_assert_nonnull (error);
          n_bad++;
        }
    }
  g_assert_cmpuint (n_valid, >, 0);
  g_assert_cmpuint (n_bad, >, 0);
}

static void
remove_tree (const char *path)
{
  g_autoptr (GDir) dir = g_dir_open (path, 0, NULL);
  const char *name;

  if (dir == NULL)
    return;
  while ((name = g_dir_read_name (dir)) != NULL)
    {
      g_autofree char *child = g_build_filename (path, name, NULL);

      g_unlink (child);
    }
  g_rmdir (path);
}

int
main (int argc, char **argv)
{
  g_autoptr (GError) error = NULL;
  int result;

  g_test_init (&argc, &argv, NULL);
  scratch_dir = g_dir_make_tmp ("gepard-codec-weights-XXXXXX", &error);
  g_assert_no_error (error);
  if (g_getenv ("GEPARD_WRITE_NEMO_CORPUS") != NULL)
    write_corpus (g_getenv ("GEPARD_WRITE_NEMO_CORPUS"));

  g_test_add_func ("/codec-weights/safetensors/tiny", test_safetensors_tiny);
  g_test_add_func ("/codec-weights/nemo/equals-safetensors", test_nemo_equals_safetensors);
  g_test_add_func ("/codec-weights/fold", test_fold);
  g_test_add_func ("/codec-weights/published", test_published);
  g_test_add_func ("/codec-weights/yaml/fixture", test_yaml_fixture);
  g_test_add_func ("/codec-weights/yaml/syntax", test_yaml_syntax);
  g_test_add_func ("/codec-weights/config/errors", test_config_errors);
  g_test_add_func ("/codec-weights/config/recorded", test_config_recorded);
  g_test_add_func ("/codec-weights/nemo/layouts", test_layouts);
  g_test_add_func ("/codec-weights/nemo/malformed", test_malformed);
  g_test_add_func ("/codec-weights/nemo/damaged", test_damaged_generated);
  g_test_add_func ("/codec-weights/nemo/mutations", test_mutations);
  g_test_add_func ("/codec-weights/nemo/mutations-pickle", test_mutations_pickle);
  g_test_add_func ("/codec-weights/nemo/mutations-generated", test_mutations_generated);
  g_test_add_func ("/codec-weights/yaml/mutations", test_mutations_yaml);
  g_test_add_func ("/codec-weights/pickle/fuzz-findings", test_pickle_fuzz_findings);
  g_test_add_func ("/codec-weights/nemo/fuzz-corpus", test_fuzz_corpus);

  result = g_test_run ();
  remove_tree (scratch_dir);
  g_free (scratch_dir);
  return result;
}
