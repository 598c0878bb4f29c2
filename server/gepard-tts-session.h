/* gepard-tts-session.h: one generation (an HTTP request or a WebSocket context) as a GStreamer
 * pipeline built from a description in pipelines/.
 *
 * The pipeline is gepardtextsrc ! gepardlm ! gepardcodec ! … ! appsink. Text goes in through
 * gepardtextsrc's action signals and is spoken sentence by sentence as it arrives. Everything
 * the pipeline produces (audio, the end of each sentence with its time span, the end of the
 * turn, an error) travels to the main context the session was created on, in the order it
 * happened, and reaches the callbacks there; libsoup objects are only ever touched on that
 * thread. Closing a session stops its callbacks at once and tears the pipeline down on a
 * GStreamer worker thread: setting it to NULL cancels the engine utterance in gepardlm. */
#pragma once

#include "gepard-audio-format.h"
#include "gepard-engine.h"

G_BEGIN_DECLS

typedef struct _GepardTtsSession GepardTtsSession;

typedef struct
{
  GepardEngine *engine;    /* set on the pipeline as its GstContext */
  const char *description; /* a gst_parse_launch description with elements text, lm, codec,
                              format and sink */
  const char *model;       /* also set as model= on lm and codec */
  const char *device;
  const char *codec_path; /* NULL: the model's codec */
  const char *voice_id;   /* registered with the engine */
  GepardOutputFormat format;
  int max_frames;       /* 0: the element's default */
  gboolean ignore_stop; /* every sentence runs to max_frames (benchmarks) */
} GepardTtsSessionSetup;

typedef struct
{
  /* samples in the requested encoding and rate, whole samples */
  void (*audio) (GepardTtsSession *session, GBytes *audio, gpointer user_data);
  /* a sentence has been spoken: its text and its span on the turn's audio timeline, seconds */
  void (*sentence) (GepardTtsSession *session, const char *text, double start, double end,
                    gpointer user_data);
  /* everything before flush number `flush_id` has been spoken */
  void (*flushed) (GepardTtsSession *session, guint flush_id, gpointer user_data);
  /* exactly once, last: error is NULL at the normal end of the turn */
  void (*done) (GepardTtsSession *session, const GError *error, gpointer user_data);
} GepardTtsSessionCallbacks;

/* Builds and configures the pipeline; nothing runs yet. */
GepardTtsSession *gepard_tts_session_new (const GepardTtsSessionSetup *setup,
                                          const GepardTtsSessionCallbacks *callbacks,
                                          gpointer user_data, GError **error);
/* Sets the pipeline playing; it then waits for text. */
gboolean gepard_tts_session_start (GepardTtsSession *session, GError **error);
/* Appends text to the turn (transcripts are concatenated verbatim). Fails on invalid UTF-8 or
 * after the end of input. */
gboolean gepard_tts_session_push_text (GepardTtsSession *session, const char *text, GError **error);
/* Speaks what is buffered now even if the sentence is unfinished; returns the flush's number
 * (1, 2, …) that the flushed callback reports. */
guint gepard_tts_session_flush (GepardTtsSession *session);
/* No more text: the rest is spoken, then done. */
void gepard_tts_session_end_input (GepardTtsSession *session);
gboolean gepard_tts_session_input_ended (GepardTtsSession *session);
/* Holds the generation while the owner cannot pass its output on (a client that does not read),
 * so that the server does not buffer without end: the next audio buffer waits in the pipeline's
 * streaming thread, so gepardlm stops taking frames and submits no further sentence until the
 * hold is released. Closing releases it too. */
void gepard_tts_session_set_held (GepardTtsSession *session, gboolean held);
/* Seconds since the first text to the first audio, or -1 while there is none. */
double gepard_tts_session_get_first_audio_latency (GepardTtsSession *session);
/* No callback runs after this; the pipeline stops off the main loop; frees the session. */
void gepard_tts_session_close (GepardTtsSession *session);

/* Pipelines not yet finalized, all sessions together (for /metrics and the tests that check
 * teardown). Any thread. */
guint gepard_tts_session_count_pipelines (void);

G_END_DECLS
