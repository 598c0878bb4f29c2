/* gepard-server-config.h: gepard-server's settings, from TTS_* environment variables and flags.
 *
 * Every setting has a flag and a variable (the table in server/README.md); a flag wins over the
 * variable, the variable over the default. The API key is read from the environment only, so
 * that it never shows in a process listing. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef struct
{
  char *model;  /* checkpoint directory or cached repo id (required) */
  char *codec;  /* NanoCodec file to decode with instead of the model's codec, or NULL */
  char *device; /* auto, cpu, cuda, cuda:N */
  char *host;
  int port;
  char *api_key;       /* NULL: no authentication */
  char **cors_origins; /* NULL-terminated; empty: no cross-origin access */
  gint64 max_body_bytes;
  int max_transcript_chars;
  int max_contexts;            /* generations at once, all connections together */
  int max_contexts_per_socket; /* generations at once on one WebSocket */
  int max_frames;              /* frames per sentence at most; 0: the model's own limit */
  char *tls_cert;
  char *tls_key;
  char *pipeline_dir; /* where the tts-stream*.txt descriptions are */
  char *voices_dir;   /* speaker prefix files <id>.bin registered at startup, or NULL */
  char *data_dir;     /* the private PostgreSQL cluster's directory without DATABASE_URL, or NULL */
  gint64 max_clip_bytes; /* largest reference clip POST /voices/clone accepts */
} GepardServerConfig;

/* Fills `config` from the environment, then from the command line (consuming the options it
 * knows). Errors name the variable or flag at fault. */
gboolean gepard_server_config_load (GepardServerConfig *config, int *argc, char ***argv,
                                    GError **error);
void gepard_server_config_clear (GepardServerConfig *config);

/* Whether `origin` is one of the configured CORS origins (exact match). */
gboolean gepard_server_config_allows_origin (const GepardServerConfig *config, const char *origin);

G_END_DECLS
