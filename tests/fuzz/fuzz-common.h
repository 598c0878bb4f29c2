/* fuzz-common.h: what the libFuzzer targets share (built with _GNU_SOURCE, for memfd_create). */
#pragma once

#include "gepard-error.h"

#include <glib.h>
#include <glib/gstdio.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);
int LLVMFuzzerInitialize (int *argc, char ***argv);

/* The parsers log nothing on bad input: a warning or a critical (a failed precondition inside
 * gepard-core) is a bug, so it aborts and libFuzzer keeps the input. */
static inline void
fuzz_init_logging (void)
{
  g_log_set_always_fatal (G_LOG_FATAL_MASK | G_LOG_LEVEL_CRITICAL | G_LOG_LEVEL_WARNING);
}

/* A refusal must say why, in the module's error domain; an acceptance must leave no error. */
static inline void
fuzz_check_outcome (gboolean ok, const GError *error, GQuark domain)
{
  if (ok && error != NULL)
    {
      fprintf (stderr, "accepted, yet an error is set: %s\n", error->message);
      abort ();
    }
  if (!ok && (error == NULL || error->domain != domain || error->message == NULL))
    {
      fprintf (stderr, "refused without an error of domain %s\n", g_quark_to_string (domain));
      abort ();
    }
}

/* g_utf8_validate_len() stops at NUL; the tokenizer keeps NUL bytes, which are valid UTF-8. */
static inline gboolean
fuzz_utf8_valid (const char *text, gsize len)
{
  while (len > 0)
    {
      const char *nul = memchr (text, '\0', len);
      gsize chunk = nul != NULL ? (gsize)(nul - text) : len;

      if (!g_utf8_validate_len (text, chunk, NULL))
        return FALSE;
      if (nul == NULL)
        break;
      text += chunk + 1;
      len -= chunk + 1;
    }
  return TRUE;
}

/* The file readers take a path and map it, so the input goes into an anonymous in-memory file
 * that they open through /proc: no disk, no leftovers, and the mapping sees exactly the input. */
static inline const char *
fuzz_file_from_bytes (const uint8_t *data, size_t size)
{
  static int fd = -1;
  static char path[64];
  size_t done = 0;

  if (fd < 0)
    {
      fd = memfd_create ("gepard-fuzz", MFD_CLOEXEC);
      if (fd < 0)
        {
          perror ("memfd_create");
          abort ();
        }
      g_snprintf (path, sizeof path, "/proc/self/fd/%d", fd);
    }
  if (ftruncate (fd, 0) != 0)
    abort ();
  while (done < size)
    {
      ssize_t n = pwrite (fd, data + done, size - done, (off_t)done);

      if (n <= 0)
        abort ();
      done += (size_t)n;
    }
  return path;
}
