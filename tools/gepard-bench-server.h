/* gepard-bench-server.h: gepard-bench's server mode, C WebSocket clients against a running
 * gepard-server. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct
{
  const char *url;         /* http://HOST:PORT or ws://HOST:PORT */
  const char *concurrency; /* comma-separated levels */
  int frames;              /* forced frames per sentence */
  int sentences;           /* messages per turn, one sentence each */
  const char *api_key;     /* NULL: none */
  const char *voice;
  const char *encoding; /* pcm_f32le or pcm_s16le */
  int sample_rate;
} GepardBenchServerOptions;

/* Runs every level in turn and prints the table and one JSON line per level; returns the exit
 * status: 0 when every stream completed, 1 when any failed. */
int gepard_bench_server (const GepardBenchServerOptions *options);

G_END_DECLS
