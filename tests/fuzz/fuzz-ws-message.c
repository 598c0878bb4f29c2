/* fuzz-ws-message.c: one text message on /tts/websocket, as the socket reads it: the request
 * parser, the checks of a message that opens a context, what the server then does with the ids a
 * client chose (voice ids reach the voice store only when valid), and the events it answers
 * with. */
#include "fuzz-server-common.h"

int
LLVMFuzzerInitialize (int *argc, char ***argv)
{
  fuzz_init_logging ();
  return 0;
}

/* gepard_voice_id_is_valid: nothing that could name a file (no '/', no leading dot, short). */
static void
check_voice_id (const char *id)
{
  if (id == NULL || !gepard_voice_id_is_valid (id))
    return;
  gsize n = strlen (id);
  g_assert_true (n >= 1 && n <= 128 && id[0] != '.');
  g_assert_null (strchr (id, '/'));
  g_assert_null (strchr (id, '\\'));
}

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  g_auto (GepardTtsRequest) request = {0};
  if (!fuzz_parse_request (data, size, &request))
    return 0;

  check_voice_id (request.voice_id);
  check_voice_id (request.context_id);
  if (request.cancel)
    return 0; /* a cancel needs nothing else */

  g_autoptr (GError) error = NULL;
  gboolean ok = gepard_tts_request_check_new_context (&request, &error);
  fuzz_check_outcome (ok, error, GEPARD_API_ERROR);
  if (!ok)
    {
      fuzz_check_event (gepard_event_error (request.context_id, error, "fuzz"), "error",
                        request.context_id);
      return 0;
    }
  g_assert_true (request.has_output_format);
  g_assert_cmpint (request.output_format.container, ==, GEPARD_CONTAINER_RAW);
  g_assert_true (request.continue_ || request.flush || !gepard_text_is_blank (request.transcript));

  if (request.flush)
    fuzz_check_event (gepard_event_flush_done (request.context_id, 1), "flush_done",
                      request.context_id);
  if (request.transcript != NULL)
    {
      g_autoptr (GepardWordTimes) times = gepard_word_times_new (request.transcript, 0, 1);
      if (times->words->len > 0)
        fuzz_check_event (gepard_event_timestamps (request.context_id, times), "timestamps",
                          request.context_id);
    }
  fuzz_check_event (gepard_event_chunk (request.context_id, data, size, 0, 2), "chunk",
                    request.context_id);
  fuzz_check_event (gepard_event_done (request.context_id), "done", request.context_id);
  return 0;
}
