/* gepard-nemo.c: .nemo archives: tar (or gzip-compressed tar) → torch.save zip → pickle.
 *
 * The archive is mapped once; the tar members and the zip entries inside the checkpoint member
 * are spans of that mapping, found by walking headers whose every field is checked against the
 * bytes that remain. Only the zip's stored entries are readable in place, which is what
 * torch.save writes (nanocodec.md §5). A gzip-compressed archive is first inflated into an
 * unlinked temporary file, which is then mapped the same way. */
#include "gepard-nemo.h"

#include "gepard-error.h"
#include "gepard-pickle.h"

#include <errno.h>
#include <fcntl.h>
#include <gio/gio.h>
#include <glib/gstdio.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define TAR_BLOCK 512
/* GNU long names and pax headers are a path or two; anything bigger is not a name */
#define TAR_MAX_META (1u << 20)
/* an inflated archive larger than this is refused (the published codec is about 400 MB) */
#define GZIP_MAX_SIZE (G_GUINT64_CONSTANT (16) << 30)

#define ZIP_LOCAL_SIG 0x04034b50u
#define ZIP_CENTRAL_SIG 0x02014b50u
#define ZIP_EOCD_SIG 0x06054b50u
#define ZIP64_EOCD_SIG 0x06064b50u
#define ZIP64_LOCATOR_SIG 0x07064b50u
#define ZIP_LOCAL_SIZE 30u
#define ZIP_CENTRAL_SIZE 46u
#define ZIP_EOCD_SIZE 22u
#define ZIP64_EOCD_SIZE 56u
#define ZIP64_LOCATOR_SIZE 20u

#define CONFIG_MEMBER "model_config.yaml"
#define WEIGHTS_MEMBER "model_weights.ckpt"

struct _GepardNemo
{
  char *path;
  GMappedFile *mapped;
  const char *yaml;
  gsize yaml_len;
  GArray *tensors;     /* GepardNemoTensor */
  GPtrArray *strings;  /* owns tensor names */
  GHashTable *by_name; /* name → index + 1 */
};

static gboolean corrupt (GError **error, GepardFormatError code, const char *path,
                         const char *format, ...) G_GNUC_PRINTF (4, 5);

static gboolean
corrupt (GError **error, GepardFormatError code, const char *path, const char *format, ...)
{
  va_list args;
  g_autofree char *message = NULL;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_FORMAT_ERROR, code, "%s: %s", path, message);
  return FALSE;
}

/* A name from the file, made safe to print. */
static char *
printable (const guint8 *bytes, gsize len)
{
  char *s = g_strndup ((const char *)bytes, MIN (len, 200));

  for (char *c = s; *c != '\0'; c++)
    if (!g_ascii_isprint (*c))
      *c = '?';
  return s;
}

static guint64
le (const guint8 *p, guint n)
{
  guint64 v = 0;

  for (guint i = 0; i < n; i++)
    v |= (guint64)p[i] << (8 * i);
  return v;
}

/* ---- CRC-32 (zip's reflected polynomial 0xEDB88320), eight bytes per step ---- */

static guint32 crc_table[8][256];

static gpointer
crc_table_init (gpointer unused)
{
  for (guint32 i = 0; i < 256; i++)
    {
      guint32 c = i;

      for (int k = 0; k < 8; k++)
        c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      crc_table[0][i] = c;
    }
  for (guint32 i = 0; i < 256; i++)
    for (int k = 1; k < 8; k++)
      crc_table[k][i] = (crc_table[k - 1][i] >> 8) ^ crc_table[0][crc_table[k - 1][i] & 0xff];
  return NULL;
}

static guint32
crc32_of (const guint8 *p, gsize len)
{
  static GOnce once = G_ONCE_INIT;
  guint32 c = 0xFFFFFFFFu;

  g_once (&once, crc_table_init, NULL);
  while (len >= 8)
    {
      guint32 lo = (guint32)le (p, 4) ^ c;
      guint32 hi = (guint32)le (p + 4, 4);

      c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff]
          ^ crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff]
          ^ crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
      p += 8;
      len -= 8;
    }
  while (len-- > 0)
    c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

/* ---- tar ---- */

typedef struct
{
  const guint8 *data;
  guint64 size;
  gboolean found;
  char *folder; /* the folder it sits in, "" at the top */
} Member;

/* A numeric header field: octal digits (space or NUL terminated, leading spaces allowed), or the
 * GNU base-256 form (first byte 0x80) for values beyond 11 octal digits. */
static gboolean
tar_number (const guint8 *field, gsize width, guint64 *value)
{
  guint64 v = 0;
  gsize i = 0;

  if (field[0] == 0x80)
    {
      for (i = 1; i < width; i++)
        {
          if (v >> 56)
            return FALSE;
          v = (v << 8) | field[i];
        }
      *value = v;
      return TRUE;
    }
  while (i < width && field[i] == ' ')
    i++;
  if (i == width || field[i] < '0' || field[i] > '7')
    return FALSE;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; i++)
    {
      if (v >> 60)
        return FALSE;
      v = (v << 3) | (guint64)(field[i] - '0');
    }
  for (; i < width; i++)
    if (field[i] != ' ' && field[i] != '\0')
      return FALSE;
  *value = v;
  return TRUE;
}

static gboolean
tar_checksum_ok (const guint8 *h)
{
  guint64 stored;
  guint64 unsigned_sum = 0;
  gint64 signed_sum = 0;

  if (!tar_number (h + 148, 8, &stored))
    return FALSE;
  /* the sum of the header with the checksum field read as spaces; old tars summed signed chars */
  for (int i = 0; i < TAR_BLOCK; i++)
    {
      guint8 b = (i >= 148 && i < 156) ? ' ' : h[i];

      unsigned_sum += b;
      signed_sum += (gint8)b;
    }
  return stored == unsigned_sum || (gint64)stored == signed_sum;
}

static gboolean
is_zero_block (const guint8 *h)
{
  for (int i = 0; i < TAR_BLOCK; i++)
    if (h[i] != 0)
      return FALSE;
  return TRUE;
}

/* a NUL-terminated (or full-width) header string */
static char *
tar_string (const guint8 *field, gsize width)
{
  const guint8 *nul = memchr (field, '\0', width);

  return g_strndup ((const char *)field, nul != NULL ? (gsize)(nul - field) : width);
}

/* pax extended header records: "<length> <key>=<value>\n" */
static gboolean
parse_pax (const char *path, const guint8 *data, guint64 size, char **pax_path, guint64 *pax_size,
           gboolean *has_size, GError **error)
{
  guint64 pos = 0;

  while (pos < size)
    {
      guint64 len = 0;
      guint64 i = pos;
      const guint8 *eq;

      while (i < size && data[i] >= '0' && data[i] <= '9' && len < TAR_MAX_META)
        len = len * 10 + (data[i++] - '0');
      if (i >= size || data[i] != ' ' || len <= i - pos + 1 || len > size - pos
          || data[pos + len - 1] != '\n')
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "malformed pax header record at byte %" G_GUINT64_FORMAT, pos);
      i++;
      eq = memchr (data + i, '=', pos + len - 1 - i);
      if (eq == NULL)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "malformed pax header record at byte %" G_GUINT64_FORMAT, pos);
      {
        gsize key_len = (gsize)(eq - (data + i));
        const guint8 *value = eq + 1;
        gsize value_len = (gsize)(data + pos + len - 1 - value);

        if (key_len == 4 && memcmp (data + i, "path", 4) == 0)
          {
            g_free (*pax_path);
            *pax_path = g_strndup ((const char *)value, value_len);
          }
        else if (key_len == 4 && memcmp (data + i, "size", 4) == 0)
          {
            g_autofree char *text = g_strndup ((const char *)value, value_len);

            if (!g_ascii_string_to_unsigned (text, 10, 0, G_MAXUINT64, pax_size, NULL))
              {
                g_autofree char *shown = printable (value, value_len);

                return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path, "bad pax size “%s”",
                                shown);
              }
            *has_size = TRUE;
          }
      }
      pos += len;
    }
  return TRUE;
}

/* Is `name` one of the two members, at the top or inside one folder ("./" prefixes dropped)? */
static Member *
match_member (const char *name, Member *config, Member *weights, char **folder)
{
  const char *base;
  const char *slash;

  while (g_str_has_prefix (name, "./"))
    name += 2;
  slash = strchr (name, '/');
  if (slash == NULL)
    {
      base = name;
      *folder = g_strdup ("");
    }
  else
    {
      base = slash + 1;
      if (strchr (base, '/') != NULL || slash == name)
        return NULL;
      *folder = g_strndup (name, (gsize)(slash - name));
    }
  if (strcmp (base, CONFIG_MEMBER) == 0)
    return config;
  if (strcmp (base, WEIGHTS_MEMBER) == 0)
    return weights;
  g_clear_pointer (folder, g_free);
  return NULL;
}

static gboolean
tar_find_members (const char *path, const guint8 *data, gsize size, Member *config, Member *weights,
                  GError **error)
{
  guint64 offset = 0;
  g_autofree char *long_name = NULL; /* from a GNU 'L' or pax header, for the next member */
  guint64 pax_size = 0;
  gboolean has_pax_size = FALSE;
  gboolean first = TRUE;

  while (offset < size)
    {
      const guint8 *h = data + offset;
      guint64 member_size, padded, data_start;
      char type;
      g_autofree char *name = NULL;
      g_autofree char *folder = NULL;
      Member *member;

      if (offset == 0 && size < TAR_BLOCK)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "not a .nemo archive (%" G_GSIZE_FORMAT " bytes, too short for a tar)",
                        size);
      if (size - offset < TAR_BLOCK)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "truncated tar: a partial header at byte %" G_GUINT64_FORMAT, offset);
      if (is_zero_block (h))
        break; /* end of archive */
      if (!tar_checksum_ok (h))
        {
          if (first)
            return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                            "not a .nemo archive (neither a tar nor a gzip-compressed tar)");
          return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                          "bad tar header checksum at byte %" G_GUINT64_FORMAT, offset);
        }
      first = FALSE;
      if (!tar_number (h + 124, 12, &member_size))
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "bad size field in the tar header at byte %" G_GUINT64_FORMAT, offset);
      type = (char)h[156];
      /* a pax size describes the member the pax header precedes, not another header */
      if (has_pax_size && type != 'x' && type != 'L' && type != 'K' && type != 'g')
        member_size = pax_size;
      data_start = offset + TAR_BLOCK;
      if (member_size > size - data_start)
        {
          g_autofree char *shown = tar_string (h, 100);
          g_autofree char *safe = printable ((const guint8 *)shown, strlen (shown));

          return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                          "truncated tar: member %s needs %" G_GUINT64_FORMAT
                          " bytes, %" G_GUINT64_FORMAT " remain",
                          safe, member_size, (guint64)(size - data_start));
        }
      /* the last member's padding may be cut off without losing data */
      padded = member_size + (TAR_BLOCK - member_size % TAR_BLOCK) % TAR_BLOCK;
      offset = padded > size - data_start ? size : data_start + padded;

      if (type == 'L' || type == 'x')
        {
          if (member_size > TAR_MAX_META)
            return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                            "a %" G_GUINT64_FORMAT "-byte tar name header", member_size);
          if (type == 'L')
            {
              g_free (long_name);
              long_name = tar_string (data + data_start, member_size);
            }
          else if (!parse_pax (path, data + data_start, member_size, &long_name, &pax_size,
                               &has_pax_size, error))
            return FALSE;
          continue;
        }
      if (type == 'K' || type == 'g')
        continue; /* long link names and global pax headers change no member we read */

      if (long_name != NULL)
        name = g_steal_pointer (&long_name);
      /* POSIX ustar splits long names into prefix + name; GNU tar ("ustar  ") keeps other
       * fields there */
      else if (memcmp (h + 257, "ustar\0", 6) == 0 && h[345] != '\0')
        {
          g_autofree char *prefix = tar_string (h + 345, 155);
          g_autofree char *base = tar_string (h, 100);

          name = g_strconcat (prefix, "/", base, NULL);
        }
      else
        name = tar_string (h, 100);
      has_pax_size = FALSE;

      member = match_member (name, config, weights, &folder);
      if (member == NULL)
        continue;
      if (type != '0' && type != '\0' && type != '7')
        {
          g_autofree char *safe = printable ((const guint8 *)name, strlen (name));

          return corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path,
                          "member %s is not a regular file (tar type '%c')", safe,
                          g_ascii_isprint (type) ? type : '?');
        }
      if (member->found)
        {
          g_autofree char *safe = printable ((const guint8 *)name, strlen (name));

          return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                          "the archive holds %s more than once", safe);
        }
      member->found = TRUE;
      member->data = data + data_start;
      member->size = member_size;
      member->folder = g_steal_pointer (&folder);
    }

  if (!config->found || !weights->found)
    return corrupt (error, GEPARD_FORMAT_ERROR_MISSING, path,
                    "the archive has no %s member (a .nemo holds ./" CONFIG_MEMBER
                    " and ./" WEIGHTS_MEMBER ")",
                    config->found ? WEIGHTS_MEMBER : CONFIG_MEMBER);
  if (strcmp (config->folder, weights->folder) != 0)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    CONFIG_MEMBER " and " WEIGHTS_MEMBER " are in different folders");
  return TRUE;
}

/* ---- gzip ---- */

/* Inflates `path` into an unlinked temporary file and returns its descriptor. */
static int
inflate_to_temp (const char *path, GError **error)
{
  g_autoptr (GFile) file = g_file_new_for_path (path);
  g_autoptr (GFileInputStream) raw = NULL;
  g_autoptr (GZlibDecompressor) decompressor = NULL;
  g_autoptr (GInputStream) stream = NULL;
  g_autoptr (GError) local_error = NULL;
  g_autofree char *tmp_path = NULL;
  g_autofree guint8 *buffer = NULL;
  guint64 total = 0;
  int fd;

  raw = g_file_read (file, NULL, &local_error);
  if (raw == NULL)
    {
      corrupt (error, GEPARD_FORMAT_ERROR_IO, path, "cannot read: %s", local_error->message);
      return -1;
    }
  fd = g_file_open_tmp ("gepard-nemo-XXXXXX", &tmp_path, &local_error);
  if (fd < 0)
    {
      corrupt (error, GEPARD_FORMAT_ERROR_IO, path, "cannot create a temporary file: %s",
               local_error->message);
      return -1;
    }
  /* nobody else needs the name; the file goes away with the last descriptor or mapping */
  g_unlink (tmp_path);

  decompressor = g_zlib_decompressor_new (G_ZLIB_COMPRESSOR_FORMAT_GZIP);
  stream = g_converter_input_stream_new (G_INPUT_STREAM (raw), G_CONVERTER (decompressor));
  buffer = g_malloc (1 << 20);
  while (TRUE)
    {
      gssize n = g_input_stream_read (stream, buffer, 1 << 20, NULL, &local_error);

      if (n < 0)
        {
          corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path, "bad gzip data: %s",
                   local_error->message);
          g_close (fd, NULL);
          return -1;
        }
      if (n == 0)
        break;
      total += (guint64)n;
      if (total > GZIP_MAX_SIZE)
        {
          corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path,
                   "inflates to more than %" G_GUINT64_FORMAT " bytes", GZIP_MAX_SIZE);
          g_close (fd, NULL);
          return -1;
        }
      for (gssize done = 0; done < n;)
        {
          gssize w = write (fd, buffer + done, (gsize)(n - done));

          if (w < 0 && errno == EINTR)
            continue;
          if (w <= 0)
            {
              int saved_errno = errno;

              corrupt (error, GEPARD_FORMAT_ERROR_IO, path, "cannot write the inflated archive: %s",
                       g_strerror (saved_errno));
              g_close (fd, NULL);
              return -1;
            }
          done += w;
        }
    }
  return fd;
}

/* ---- zip (the torch.save checkpoint) ---- */

typedef struct
{
  char *name;
  const guint8 *data;
  guint64 size;
  guint32 crc;
  gboolean crc_checked;
} ZipEntry;

static void
zip_entry_clear (gpointer data)
{
  ZipEntry *entry = data;

  g_free (entry->name);
}

typedef struct
{
  const char *path;
  GArray *entries;     /* ZipEntry */
  GHashTable *by_name; /* name → index + 1 */
  char *root;          /* the folder every entry lives in, with a trailing '/' */
} Zip;

static void
zip_clear (Zip *zip)
{
  g_clear_pointer (&zip->entries, g_array_unref);
  g_clear_pointer (&zip->by_name, g_hash_table_unref);
  g_clear_pointer (&zip->root, g_free);
}

/* Reads the zip64 extended information extra field for the fields that are saturated. */
static gboolean
zip64_extra (const guint8 *extra, gsize extra_len, guint64 *usize, guint64 *csize, guint64 *offset)
{
  gsize pos = 0;

  while (extra_len - pos >= 4)
    {
      guint id = (guint)le (extra + pos, 2);
      gsize len = (gsize)le (extra + pos + 2, 2);
      const guint8 *field = extra + pos + 4;
      gsize at = 0;

      if (len > extra_len - pos - 4)
        return FALSE;
      if (id == 0x0001)
        {
          guint64 *wanted[] = {usize, csize, offset};

          for (guint k = 0; k < G_N_ELEMENTS (wanted); k++)
            {
              if (*wanted[k] != 0xFFFFFFFFu)
                continue;
              if (len - at < 8)
                return FALSE;
              *wanted[k] = le (field + at, 8);
              at += 8;
            }
          return TRUE;
        }
      pos += 4 + len;
    }
  return *usize != 0xFFFFFFFFu && *csize != 0xFFFFFFFFu && *offset != 0xFFFFFFFFu;
}

static gboolean
zip_open (Zip *zip, const char *path, const guint8 *data, guint64 size, GError **error)
{
  gsize eocd = G_MAXSIZE;
  guint64 n_entries, cd_size, cd_offset, pos;

  memset (zip, 0, sizeof *zip);
  zip->path = path;
  zip->entries = g_array_new (FALSE, TRUE, sizeof (ZipEntry));
  g_array_set_clear_func (zip->entries, zip_entry_clear);
  zip->by_name = g_hash_table_new (g_str_hash, g_str_equal);

  /* the end-of-central-directory record: the last 22 bytes plus a comment of up to 64 KiB */
  if (size < ZIP_EOCD_SIZE)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    WEIGHTS_MEMBER " is %" G_GUINT64_FORMAT " bytes, too short for a zip", size);
  for (guint64 p = size - ZIP_EOCD_SIZE + 1; p-- > 0 && size - p <= ZIP_EOCD_SIZE + 0xFFFF;)
    {
      if (le (data + p, 4) == ZIP_EOCD_SIG && le (data + p + 20, 2) == size - p - ZIP_EOCD_SIZE)
        {
          eocd = (gsize)p;
          break;
        }
    }
  if (eocd == G_MAXSIZE)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    WEIGHTS_MEMBER " is not a zip (no end-of-central-directory record)");
  if (le (data + eocd + 4, 2) != 0 || le (data + eocd + 6, 2) != 0)
    return corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path,
                    WEIGHTS_MEMBER " is a multi-disk zip");
  n_entries = le (data + eocd + 10, 2);
  cd_size = le (data + eocd + 12, 4);
  cd_offset = le (data + eocd + 16, 4);

  /* torch always writes the zip64 records; their values win when present */
  if (eocd >= ZIP64_LOCATOR_SIZE && le (data + eocd - ZIP64_LOCATOR_SIZE, 4) == ZIP64_LOCATOR_SIG)
    {
      guint64 z64 = le (data + eocd - ZIP64_LOCATOR_SIZE + 8, 8);

      if (z64 > size || size - z64 < ZIP64_EOCD_SIZE || le (data + z64, 4) != ZIP64_EOCD_SIG)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "the zip64 end-of-central-directory record of " WEIGHTS_MEMBER
                        " lies outside it");
      n_entries = le (data + z64 + 32, 8);
      cd_size = le (data + z64 + 40, 8);
      cd_offset = le (data + z64 + 48, 8);
    }
  else if (n_entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_offset == 0xFFFFFFFFu)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    WEIGHTS_MEMBER " needs zip64 records but has none");
  if (cd_offset > size || cd_size > size - cd_offset || n_entries > cd_size / ZIP_CENTRAL_SIZE)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    "the central directory of " WEIGHTS_MEMBER " (%" G_GUINT64_FORMAT
                    " entries, %" G_GUINT64_FORMAT " bytes at %" G_GUINT64_FORMAT
                    ") does not fit its %" G_GUINT64_FORMAT " bytes",
                    n_entries, cd_size, cd_offset, size);

  pos = cd_offset;
  for (guint64 i = 0; i < n_entries; i++)
    {
      const guint8 *c = data + pos;
      guint64 end = cd_offset + cd_size;
      guint flags, method, name_len, extra_len, comment_len, local_name_len, local_extra_len;
      guint64 usize, csize, local, data_start;
      g_autofree char *name = NULL;
      ZipEntry entry = {0};

      if (end - pos < ZIP_CENTRAL_SIZE || le (c, 4) != ZIP_CENTRAL_SIG)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "bad central directory entry %" G_GUINT64_FORMAT " in " WEIGHTS_MEMBER, i);
      flags = (guint)le (c + 8, 2);
      method = (guint)le (c + 10, 2);
      csize = le (c + 20, 4);
      usize = le (c + 24, 4);
      name_len = (guint)le (c + 28, 2);
      extra_len = (guint)le (c + 30, 2);
      comment_len = (guint)le (c + 32, 2);
      local = le (c + 42, 4);
      if (end - pos - ZIP_CENTRAL_SIZE < (guint64)name_len + extra_len + comment_len)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "central directory entry %" G_GUINT64_FORMAT " of " WEIGHTS_MEMBER
                        " runs past the directory",
                        i);
      /* torch names its records in ASCII; anything else is refused before it reaches a message */
      for (guint k = 0; k < name_len; k++)
        if (!g_ascii_isprint (c[ZIP_CENTRAL_SIZE + k]))
          return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                          "zip entry %" G_GUINT64_FORMAT " of " WEIGHTS_MEMBER
                          " has a name that is not printable ASCII",
                          i);
      if (name_len == 0)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "zip entry %" G_GUINT64_FORMAT " of " WEIGHTS_MEMBER " has no name", i);
      name = g_strndup ((const char *)c + ZIP_CENTRAL_SIZE, name_len);
      if (!zip64_extra (c + ZIP_CENTRAL_SIZE + name_len, extra_len, &usize, &csize, &local))
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "zip entry %s has a bad zip64 extra field", name);
      if (flags & 0x0001)
        return corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path, "zip entry %s is encrypted",
                        name);
      if (method != 0)
        return corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path,
                        "zip entry %s is compressed (method %u); torch.save stores entries "
                        "uncompressed, and only those are read in place",
                        name, method);
      if (csize != usize)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "stored zip entry %s has different compressed and plain sizes", name);

      /* the local header repeats the name; the data follows it and its extra field */
      if (local > size || size - local < ZIP_LOCAL_SIZE || le (data + local, 4) != ZIP_LOCAL_SIG)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "zip entry %s: no local header at byte %" G_GUINT64_FORMAT, name, local);
      if (le (data + local + 8, 2) != 0)
        return corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path,
                        "zip entry %s is compressed in its local header", name);
      local_name_len = (guint)le (data + local + 26, 2);
      local_extra_len = (guint)le (data + local + 28, 2);
      data_start = local + ZIP_LOCAL_SIZE + local_name_len + local_extra_len;
      if (data_start > size || local_name_len != name_len
          || memcmp (data + local + ZIP_LOCAL_SIZE, c + ZIP_CENTRAL_SIZE, name_len) != 0)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "zip entry %s: the local header does not match the directory", name);
      if (usize > size - data_start)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                        "zip entry %s: %" G_GUINT64_FORMAT " bytes at %" G_GUINT64_FORMAT
                        " run past the end of " WEIGHTS_MEMBER " (%" G_GUINT64_FORMAT " bytes)",
                        name, usize, data_start, size);

      if (g_hash_table_contains (zip->by_name, name))
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path, "zip entry %s appears twice",
                        name);
      entry.name = g_steal_pointer (&name);
      entry.data = data + data_start;
      entry.size = usize;
      entry.crc = (guint32)le (c + 16, 4);
      g_array_append_val (zip->entries, entry);
      g_hash_table_insert (zip->by_name, entry.name, GUINT_TO_POINTER (zip->entries->len));
      pos += ZIP_CENTRAL_SIZE + name_len + extra_len + comment_len;
    }
  if (zip->entries->len == 0)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path, WEIGHTS_MEMBER " is an empty zip");

  /* torch.save puts every record under one folder named after the file (nanocodec.md §5) */
  {
    const ZipEntry *first = &g_array_index (zip->entries, ZipEntry, 0);
    const char *slash = strchr (first->name, '/');

    if (slash == NULL || slash == first->name)
      return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                      "zip entry %s is not inside a folder, as torch.save writes them",
                      first->name);
    zip->root = g_strndup (first->name, (gsize)(slash - first->name) + 1);
    for (guint i = 1; i < zip->entries->len; i++)
      {
        const ZipEntry *entry = &g_array_index (zip->entries, ZipEntry, i);

        if (!g_str_has_prefix (entry->name, zip->root))
          return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                          "zip entry %s is outside the checkpoint folder %s", entry->name,
                          zip->root);
      }
  }
  return TRUE;
}

/* Finds the record `<root>/<name>` and checks its CRC. FALSE only for a failed check; an absent
 * record gives TRUE and NULL. */
static gboolean
zip_record (Zip *zip, const char *name, const ZipEntry **out, GError **error)
{
  g_autofree char *full = g_strconcat (zip->root, name, NULL);
  guint index = GPOINTER_TO_UINT (g_hash_table_lookup (zip->by_name, full));
  ZipEntry *entry;

  *out = NULL;
  if (index == 0)
    return TRUE;
  entry = &g_array_index (zip->entries, ZipEntry, index - 1);
  /* torch's reader checks every record it reads; so does this one, once per record */
  if (!entry->crc_checked)
    {
      guint32 crc = crc32_of (entry->data, entry->size);

      if (crc != entry->crc)
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, zip->path,
                        "zip entry %s fails its CRC check (stored %08x, computed %08x)",
                        entry->name, entry->crc, crc);
      entry->crc_checked = TRUE;
    }
  *out = entry;
  return TRUE;
}

/* ---- the state dict ---- */

/* torch's is_contiguous(): row-major strides, where dims of size 1 may have any stride */
static gboolean
is_contiguous (const GepardPickleTensor *t)
{
  guint64 expected = 1;

  for (guint i = t->n_dims; i-- > 0;)
    {
      if (t->shape[i] == 0)
        return TRUE;
      if (t->shape[i] != 1 && (guint64)t->stride[i] != expected)
        return FALSE;
      expected *= (guint64)t->shape[i];
    }
  return TRUE;
}

static gboolean
resolve_tensor (GepardNemo *nemo, Zip *zip, GHashTable *storage_types, const GepardPickleTensor *t,
                GError **error)
{
  const char *path = nemo->path;
  gsize element_size = gepard_torch_storage_element_size (t->storage_type);
  g_autofree char *record_name = g_strconcat ("data/", t->storage_key, NULL);
  const ZipEntry *record;
  GepardNemoTensor out = {0};
  guint64 numel = 1;
  gpointer seen_type;

  for (guint i = 0; i < t->n_dims; i++)
    {
      if (t->shape[i] != 0 && numel > G_MAXUINT64 / (guint64)t->shape[i])
        return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path, "tensor %s: shape overflows",
                        t->name);
      numel *= (guint64)t->shape[i];
    }
  if (!is_contiguous (t))
    return corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, path,
                    "tensor %s is not contiguous (strides as stored by a view); only "
                    "contiguous tensors are read in place",
                    t->name);
  /* views of one storage must agree on its type */
  if (g_hash_table_lookup_extended (storage_types, t->storage_key, NULL, &seen_type)
      && GPOINTER_TO_INT (seen_type) != (int)t->storage_type)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    "storage %s is used with two element types", t->storage_key);
  g_hash_table_insert (storage_types, t->storage_key, GINT_TO_POINTER ((int)t->storage_type));

  if (!zip_record (zip, record_name, &record, error))
    return FALSE;
  if (record == NULL)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    "tensor %s: its storage record %s%s is missing", t->name, zip->root,
                    record_name);
  if (t->storage_numel > record->size / element_size)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    "tensor %s: storage %s claims %" G_GUINT64_FORMAT
                    " elements of %" G_GSIZE_FORMAT " bytes but its record holds %" G_GUINT64_FORMAT
                    " bytes",
                    t->name, t->storage_key, t->storage_numel, element_size, record->size);
  if (t->storage_offset > t->storage_numel || numel > t->storage_numel - t->storage_offset)
    return corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path,
                    "tensor %s: %" G_GUINT64_FORMAT " elements at offset %" G_GUINT64_FORMAT
                    " do not fit its storage of %" G_GUINT64_FORMAT,
                    t->name, numel, t->storage_offset, t->storage_numel);

  out.tensor.name = g_strdup (t->name);
  g_ptr_array_add (nemo->strings, (char *)out.tensor.name);
  out.has_dtype = gepard_torch_storage_to_dtype (t->storage_type, &out.tensor.dtype);
  out.storage_type = gepard_torch_storage_name (t->storage_type);
  out.tensor.n_dims = t->n_dims;
  memcpy (out.tensor.shape, t->shape, sizeof out.tensor.shape);
  out.tensor.n_elements = numel;
  out.tensor.n_bytes = (gsize)(numel * element_size);
  out.tensor.data = record->data + t->storage_offset * element_size;
  g_array_append_val (nemo->tensors, out);
  g_hash_table_insert (nemo->by_name, (char *)out.tensor.name,
                       GUINT_TO_POINTER (nemo->tensors->len));
  return TRUE;
}

static gboolean
read_checkpoint (GepardNemo *nemo, const guint8 *data, guint64 size, const char *const *prefixes,
                 GError **error)
{
  g_autoptr (GPtrArray) pickled = NULL;
  g_autoptr (GHashTable) storage_types = NULL;
  g_autoptr (GError) local_error = NULL;
  const ZipEntry *record;
  Zip zip;
  gboolean ok = FALSE;

  if (!zip_open (&zip, nemo->path, data, size, error))
    goto out;

  /* the storages are raw little-endian bytes; a big-endian writer says so here */
  if (!zip_record (&zip, "byteorder", &record, error))
    goto out;
  if (record != NULL && !(record->size == 6 && memcmp (record->data, "little", 6) == 0))
    {
      g_autofree char *shown = printable (record->data, record->size);

      corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, nemo->path,
               "the checkpoint's byte order is “%s”, not little-endian", shown);
      goto out;
    }
  if (!zip_record (&zip, "version", &record, error))
    goto out;
  if (record != NULL)
    {
      g_autofree char *raw = g_strndup ((const char *)record->data, MIN (record->size, 16));
      g_autofree char *text = NULL;
      guint64 version;

      g_strstrip (raw);
      text = printable ((const guint8 *)raw, strlen (raw));

      /* format versions 1–3 exist; the storage layout has not changed across them */
      if (!g_ascii_string_to_unsigned (text, 10, 1, 9, &version, NULL))
        {
          corrupt (error, GEPARD_FORMAT_ERROR_UNSUPPORTED, nemo->path,
                   "unknown torch.save format version “%s”", text);
          goto out;
        }
    }

  if (!zip_record (&zip, "data.pkl", &record, error))
    goto out;
  if (record == NULL)
    {
      corrupt (error, GEPARD_FORMAT_ERROR_MISSING, nemo->path, "the checkpoint has no %sdata.pkl",
               zip.root);
      goto out;
    }
  pickled
      = gepard_pickle_load_state_dict (record->data, (gsize)record->size, prefixes, &local_error);
  if (pickled == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, local_error->code, "%s: %s%s", nemo->path, zip.root,
                   local_error->message);
      goto out;
    }

  storage_types = g_hash_table_new (g_str_hash, g_str_equal);
  for (guint i = 0; i < pickled->len; i++)
    if (!resolve_tensor (nemo, &zip, storage_types, g_ptr_array_index (pickled, i), error))
      goto out;
  ok = TRUE;

out:
  /* storage_types borrows keys from `pickled`: drop it first */
  g_clear_pointer (&storage_types, g_hash_table_unref);
  zip_clear (&zip);
  return ok;
}

/* ---- the archive ---- */

void
gepard_nemo_free (GepardNemo *nemo)
{
  if (nemo == NULL)
    return;
  g_clear_pointer (&nemo->by_name, g_hash_table_unref);
  g_clear_pointer (&nemo->tensors, g_array_unref);
  g_clear_pointer (&nemo->strings, g_ptr_array_unref);
  g_clear_pointer (&nemo->mapped, g_mapped_file_unref);
  g_free (nemo->path);
  g_free (nemo);
}

GepardNemo *
gepard_nemo_open (const char *path, const char *const *prefixes, GError **error)
{
  g_autoptr (GepardNemo) nemo = NULL;
  g_autoptr (GError) map_error = NULL;
  Member config = {0}, weights = {0};
  struct stat st;
  guint8 magic[2] = {0};
  const guint8 *data;
  gsize size;
  gboolean ok;
  int fd;

  g_return_val_if_fail (path != NULL, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  /* O_NONBLOCK: a FIFO must not hang the open; it is refused below */
  fd = g_open (path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
  if (fd < 0)
    {
      int saved_errno = errno;

      corrupt (error, GEPARD_FORMAT_ERROR_IO, path, "cannot open: %s", g_strerror (saved_errno));
      return NULL;
    }
  if (fstat (fd, &st) != 0 || !S_ISREG (st.st_mode))
    {
      g_close (fd, NULL);
      corrupt (error, GEPARD_FORMAT_ERROR_IO, path, "not a regular file");
      return NULL;
    }
  if (pread (fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b)
    {
      /* tarfile's "r:gz" fallback for old archives (nanocodec.md §5) */
      g_close (fd, NULL);
      fd = inflate_to_temp (path, error);
      if (fd < 0)
        return NULL;
    }

  nemo = g_new0 (GepardNemo, 1);
  nemo->path = g_strdup (path);
  nemo->tensors = g_array_new (FALSE, TRUE, sizeof (GepardNemoTensor));
  nemo->strings = g_ptr_array_new_with_free_func (g_free);
  nemo->by_name = g_hash_table_new (g_str_hash, g_str_equal);

  /* shared and read-only: tensors are read in place; a file truncated under the mapping by
   * someone else would fault, as for any mmapped model file */
  nemo->mapped = g_mapped_file_new_from_fd (fd, FALSE, &map_error);
  g_close (fd, NULL);
  if (nemo->mapped == NULL)
    {
      corrupt (error, GEPARD_FORMAT_ERROR_IO, path, "cannot map: %s", map_error->message);
      return NULL;
    }
  data = (const guint8 *)g_mapped_file_get_contents (nemo->mapped);
  size = g_mapped_file_get_length (nemo->mapped);
  if (data == NULL || size == 0)
    {
      corrupt (error, GEPARD_FORMAT_ERROR_CORRUPT, path, "the file is empty");
      return NULL;
    }

  ok = tar_find_members (path, data, size, &config, &weights, error);
  if (ok)
    {
      nemo->yaml = (const char *)config.data;
      nemo->yaml_len = (gsize)config.size;
      ok = read_checkpoint (nemo, weights.data, weights.size, prefixes, error);
    }
  g_free (config.folder);
  g_free (weights.folder);
  if (!ok)
    return NULL;
  return g_steal_pointer (&nemo);
}

const char *
gepard_nemo_get_config_yaml (const GepardNemo *nemo, gsize *len)
{
  g_return_val_if_fail (nemo != NULL, NULL);
  g_return_val_if_fail (len != NULL, NULL);

  *len = nemo->yaml_len;
  return nemo->yaml;
}

guint
gepard_nemo_get_n_tensors (const GepardNemo *nemo)
{
  g_return_val_if_fail (nemo != NULL, 0);
  return nemo->tensors->len;
}

const GepardNemoTensor *
gepard_nemo_get_nth (const GepardNemo *nemo, guint index)
{
  g_return_val_if_fail (nemo != NULL, NULL);
  g_return_val_if_fail (index < nemo->tensors->len, NULL);
  return &g_array_index (nemo->tensors, GepardNemoTensor, index);
}

const GepardNemoTensor *
gepard_nemo_lookup (const GepardNemo *nemo, const char *name)
{
  guint index;

  g_return_val_if_fail (nemo != NULL, NULL);
  g_return_val_if_fail (name != NULL, NULL);

  index = GPOINTER_TO_UINT (g_hash_table_lookup (nemo->by_name, name));
  return index == 0 ? NULL : &g_array_index (nemo->tensors, GepardNemoTensor, index - 1);
}
