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
  gint64 max_clip_bytes;        /* largest reference clip POST /voices/clone accepts */
  int shutdown_timeout;         /* seconds work under way may take to finish after SIGTERM/SIGINT */
  gint64 max_send_buffer_bytes; /* output waiting for one slow client at most (see README) */
  gboolean list_routes;         /* print the route table and exit */
  gboolean playground;          /* serve the playground page at / (on unless turned off) */

  /* GPU placement: TTS_GPU_DEVICE_IDS, else GPU_DEVICE_IDS ("0" by default): the CUDA device
   * indices this server may use. One engine runs on the first; `device` is set from it. */
  int *gpu_device_ids;
  guint n_gpu_device_ids;
  double gpu_memory_utilization; /* fraction of each GPU's memory the engine may fill, (0, 1] */
  char *mps_pipe_dir;            /* where an NVIDIA MPS daemon's control pipe was looked for */
  gboolean mps; /* whether that pipe exists: CUDA work goes through the MPS daemon */
} GepardServerConfig;

/* Fills `config` from the environment, then from the command line (consuming the options it
 * knows). Errors name the variable or flag at fault. */
gboolean gepard_server_config_load (GepardServerConfig *config, int *argc, char ***argv,
                                    GError **error);
void gepard_server_config_clear (GepardServerConfig *config);

/* A comma-separated list of CUDA device indices ("0", "0,1", "2, 3"): every item a decimal
 * integer in 0…1023, no empty item, no duplicate. `name` (the variable or flag) heads errors. */
gboolean gepard_server_parse_device_ids (const char *name, const char *text, int **ids,
                                         guint *n_ids, GError **error);

/* A fraction in (0, 1] written as a decimal number ("0.5", "1"). */
gboolean gepard_server_parse_fraction (const char *name, const char *text, double *value,
                                       GError **error);

/* The engine's device for the configured `device` and the first GPU id: "cuda" becomes
 * "cuda:ID"; "auto" stays "auto" for GPU 0 (falling back to the CPU without a GPU) and becomes
 * "cuda:ID" for another GPU; "cuda:N" must agree with the list when the list was given. */
char *gepard_server_placement_device (const char *device, const int *ids, guint n_ids,
                                      gboolean ids_given, GError **error);

/* Whether an NVIDIA MPS daemon serves this machine: its control pipe `control` in
 * CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps. Sets `dir` to the directory looked in. */
gboolean gepard_server_detect_mps (char **dir);

/* Whether `origin` is one of the configured CORS origins (exact match). */
gboolean gepard_server_config_allows_origin (const GepardServerConfig *config, const char *origin);

G_END_DECLS
