/* gepard-protocol.h: Cartesia's TTS request and event JSON (cartesia-protocol.md §2, §3).
 *
 * One request shape serves /tts/bytes, /tts/sse and each WebSocket message: every field is
 * optional here and each route says what it needs. Unknown fields are ignored (clients send
 * extras such as max_buffer_delay_ms on /tts/bytes). The one field of Gepard's own, "gepard",
 * forces sentence lengths for benchmarks (server/README.md). The event builders always write every
 * envelope field the strictest client validates (§3.3). */
#pragma once

#include "gepard-audio-format.h"

G_BEGIN_DECLS

typedef struct
{
  char *context_id; /* NULL when absent */
  char *transcript; /* NULL when absent */
  char *voice_id;   /* NULL when absent */
  gboolean has_output_format;
  GepardOutputFormat output_format;
  gboolean continue_; /* default FALSE: one complete generation */
  gboolean flush;
  gboolean cancel;
  gboolean add_timestamps;
  gboolean add_phoneme_timestamps;
  /* Gepard's extension, not Cartesia's: "gepard": {"max_frames": N, "ignore_stop": true}, for
   * benchmarks that need every sentence to be of a known length. 0 / FALSE when absent. */
  int max_frames;
  gboolean ignore_stop;
} GepardTtsRequest;

/* Parses a JSON object. On error, `request` holds what was read before it (context_id, when it
 * came first, so that a WebSocket error can name its context). */
gboolean gepard_tts_request_parse (const char *data, gsize length, GepardTtsRequest *request,
                                   GError **error);
void gepard_tts_request_clear (GepardTtsRequest *request);
G_DEFINE_AUTO_CLEANUP_CLEAR_FUNC (GepardTtsRequest, gepard_tts_request_clear)

/* What POST /tts/bytes and /tts/sse need of a parsed request: a transcript that is not blank, at
 * most `max_transcript_chars` characters, and an output_format (raw, for `sse`). */
gboolean gepard_tts_request_check_http (const GepardTtsRequest *request, gboolean sse,
                                        int max_transcript_chars, GError **error);
/* What a WebSocket message that opens a context needs: a transcript that is not blank (unless it
 * continues or flushes) and a raw output_format. */
gboolean gepard_tts_request_check_new_context (const GepardTtsRequest *request, GError **error);
/* NULL, empty or only whitespace. */
gboolean gepard_text_is_blank (const char *text);

/* A voice id a client may name: 1 to 128 of [A-Za-z0-9._:-], not starting with a dot. Ids never
 * reach a file system path, and this keeps them from looking like one. */
gboolean gepard_voice_id_is_valid (const char *id);

/* Word timings of one sentence spread over [start, end] seconds in proportion to the words'
 * lengths (a word's share includes one character for the gap after it). The words are the
 * sentence's whitespace-separated pieces, punctuation kept, as clients align them to the text
 * they sent. */
typedef struct
{
  GPtrArray *words; /* char * */
  GArray *start;    /* double, seconds */
  GArray *end;      /* double, seconds */
} GepardWordTimes;

GepardWordTimes *gepard_word_times_new (const char *sentence, double start, double end);
void gepard_word_times_free (GepardWordTimes *times);
G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardWordTimes, gepard_word_times_free)

/* Events, as JSON text. `context_id` may be NULL (written as null); `flush_id` 0 leaves it out. */
char *gepard_event_chunk (const char *context_id, const guint8 *audio, gsize size,
                          double step_time_ms, guint flush_id);
char *gepard_event_timestamps (const char *context_id, const GepardWordTimes *times);
char *gepard_event_flush_done (const char *context_id, guint flush_id);
char *gepard_event_done (const char *context_id);
/* Both error shapes at once: the legacy "error" string and the structured fields, done: true. */
char *gepard_event_error (const char *context_id, const GError *error, const char *request_id);

G_END_DECLS
