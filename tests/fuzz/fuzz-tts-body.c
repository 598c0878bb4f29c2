/* fuzz-tts-body.c: the body of POST /tts/bytes and POST /tts/sse, as the routes read it: the
 * request parser, then the checks each route makes, then the events an SSE response writes for
 * what was accepted (chunks, word timestamps, done, error). */
#include "fuzz-server-common.h"

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  g_auto (GepardTtsRequest) request = {0};
  if (!fuzz_parse_request (data, size, &request))
    return 0;

  for (int sse = 0; sse <= 1; sse++)
    {
      g_autoptr (GError) error = NULL;
      gboolean ok = gepard_tts_request_check_http (&request, sse, 20000, &error);
      fuzz_check_outcome (ok, error, GEPARD_API_ERROR);
      if (!ok)
        {
          fuzz_check_event (gepard_event_error (request.context_id, error, "fuzz"), "error",
                            request.context_id);
          continue;
        }
      g_assert_nonnull (request.transcript);
      g_assert_false (gepard_text_is_blank (request.transcript));
      g_assert_cmpint (g_utf8_strlen (request.transcript, -1), <=, 20000);
      g_assert_true (request.has_output_format);
      if (!sse)
        continue;
      g_assert_cmpint (request.output_format.container, ==, GEPARD_CONTAINER_RAW);
      /* what an SSE response of this request writes */
      fuzz_check_event (gepard_event_chunk (request.context_id, data, MIN (size, 64), 1.5, 0),
                        "chunk", request.context_id);
      g_autoptr (GepardWordTimes) times = gepard_word_times_new (request.transcript, 0.25, 3.0);
      g_assert_cmpuint (times->words->len, ==, times->start->len);
      g_assert_cmpuint (times->words->len, ==, times->end->len);
      for (guint i = 0; i < times->words->len; i++)
        {
          double start = g_array_index (times->start, double, i);
          double end = g_array_index (times->end, double, i);
          g_assert_true (start >= 0.25 && start <= end && end <= 3.0 + 1e-9);
        }
      if (times->words->len > 0)
        fuzz_check_event (gepard_event_timestamps (request.context_id, times), "timestamps",
                          request.context_id);
      fuzz_check_event (gepard_event_done (request.context_id), "done", request.context_id);
    }
  return 0;
}
