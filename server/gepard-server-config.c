/* gepard-server-config.c: TTS_* variables and flags into one GepardServerConfig. */
#include "gepard-server-config.h"

#include "gepard-build-config.h"

#include <string.h>

#define DEFAULT_DEVICE "auto"
#define DEFAULT_HOST "127.0.0.1"
#define DEFAULT_PORT 8080
#define DEFAULT_MAX_BODY_BYTES (1024 * 1024)
#define DEFAULT_MAX_TRANSCRIPT_CHARS 20000
#define DEFAULT_MAX_CONTEXTS 64
#define DEFAULT_MAX_CONTEXTS_PER_SOCKET 16
#define DEFAULT_MAX_CLIP_BYTES (16 * 1024 * 1024)

static void
env_string (const char *name, char **value)
{
  const char *s = g_getenv (name);
  if (s != NULL && s[0] != '\0')
    {
      g_free (*value);
      *value = g_strdup (s);
    }
}

static gboolean
env_number (const char *name, gint64 min, gint64 max, gint64 *value, GError **error)
{
  const char *s = g_getenv (name);
  g_autoptr (GError) local = NULL;
  guint64 n;

  if (s == NULL || s[0] == '\0')
    return TRUE;
  if (!g_ascii_string_to_unsigned (s, 10, (guint64)min, (guint64)max, &n, &local))
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE, "%s: %s", name, local->message);
      return FALSE;
    }
  *value = (gint64)n;
  return TRUE;
}

static gboolean
env_int (const char *name, int min, int max, int *value, GError **error)
{
  gint64 v = *value;
  if (!env_number (name, min, max, &v, error))
    return FALSE;
  *value = (int)v;
  return TRUE;
}

static gboolean
check_range (const char *flag, gint64 value, gint64 min, gint64 max, GError **error)
{
  if (value < min || value > max)
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                   "%s must be between %" G_GINT64_FORMAT " and %" G_GINT64_FORMAT, flag, min, max);
      return FALSE;
    }
  return TRUE;
}

static void
take_flag (char **field, char *flag_value)
{
  if (flag_value != NULL)
    {
      g_free (*field);
      *field = flag_value;
    }
}

static char **
split_origins (const char *list)
{
  g_auto (GStrv) parts = g_strsplit (list != NULL ? list : "", ",", -1);
  GStrvBuilder *builder = g_strv_builder_new ();
  for (char **p = parts; *p != NULL; p++)
    {
      g_strstrip (*p);
      /* a wildcard would let any page use the key a browser holds: origins are listed one by
       * one */
      if ((*p)[0] != '\0' && strcmp (*p, "*") != 0)
        g_strv_builder_add (builder, *p);
    }
  char **origins = g_strv_builder_end (builder);
  g_strv_builder_unref (builder);
  return origins;
}

/* The installed descriptions, else the source tree's (running from the build directory). */
static char *
default_pipeline_dir (void)
{
  g_autofree char *installed = g_build_filename (GEPARD_DATA_DIR, "pipelines", NULL);
  g_autofree char *probe = g_build_filename (installed, "tts-stream.txt", NULL);
  if (g_file_test (probe, G_FILE_TEST_IS_REGULAR))
    return g_steal_pointer (&installed);
  return g_build_filename (GEPARD_SOURCE_DIR, "pipelines", NULL);
}

gboolean
gepard_server_config_load (GepardServerConfig *config, int *argc, char ***argv, GError **error)
{
  g_autofree char *cors = NULL;
  g_autofree char *model = NULL, *codec = NULL, *device = NULL, *host = NULL;
  g_autofree char *tls_cert = NULL, *tls_key = NULL, *pipeline_dir = NULL, *voices_dir = NULL;
  g_autofree char *data_dir = NULL;
  g_autofree char *cors_flag = NULL;

  memset (config, 0, sizeof *config);
  config->device = g_strdup (DEFAULT_DEVICE);
  config->host = g_strdup (DEFAULT_HOST);
  config->port = DEFAULT_PORT;
  config->max_body_bytes = DEFAULT_MAX_BODY_BYTES;
  config->max_transcript_chars = DEFAULT_MAX_TRANSCRIPT_CHARS;
  config->max_contexts = DEFAULT_MAX_CONTEXTS;
  config->max_contexts_per_socket = DEFAULT_MAX_CONTEXTS_PER_SOCKET;
  config->max_clip_bytes = DEFAULT_MAX_CLIP_BYTES;

  env_string ("TTS_MODEL", &config->model);
  env_string ("TTS_CODEC", &config->codec);
  env_string ("TTS_DEVICE", &config->device);
  env_string ("TTS_HOST", &config->host);
  env_string ("TTS_API_KEY", &config->api_key);
  env_string ("TTS_CORS_ORIGINS", &cors);
  env_string ("TTS_TLS_CERT", &config->tls_cert);
  env_string ("TTS_TLS_KEY", &config->tls_key);
  env_string ("TTS_PIPELINE_DIR", &config->pipeline_dir);
  env_string ("TTS_VOICES_DIR", &config->voices_dir);
  env_string ("TTS_DATA_DIR", &config->data_dir);
  if (!env_int ("TTS_PORT", 0, 65535, &config->port, error)
      || !env_number ("TTS_MAX_BODY_BYTES", 1024, G_GINT64_CONSTANT (1) << 32,
                      &config->max_body_bytes, error)
      || !env_number ("TTS_MAX_CLIP_BYTES", 1024, G_GINT64_CONSTANT (1) << 32,
                      &config->max_clip_bytes, error)
      || !env_int ("TTS_MAX_TRANSCRIPT_CHARS", 1, 10000000, &config->max_transcript_chars, error)
      || !env_int ("TTS_MAX_CONTEXTS", 1, 100000, &config->max_contexts, error)
      || !env_int ("TTS_MAX_CONTEXTS_PER_SOCKET", 1, 100000, &config->max_contexts_per_socket,
                   error)
      || !env_int ("TTS_MAX_FRAMES", 0, 1000000, &config->max_frames, error))
    return FALSE;

  GOptionEntry entries[] = {
      {"model", 'm', 0, G_OPTION_ARG_STRING, &model,
       "GEPARD model: a checkpoint directory or a cached repo id (TTS_MODEL)", "DIR|REPO_ID"},
      {"codec", 0, 0, G_OPTION_ARG_FILENAME, &codec,
       "NanoCodec checkpoint to decode with instead of the model's codec (TTS_CODEC)", "PATH"},
      {"device", 'd', 0, G_OPTION_ARG_STRING, &device, "auto, cpu, cuda or cuda:N (TTS_DEVICE)",
       "DEVICE"},
      {"host", 0, 0, G_OPTION_ARG_STRING, &host, "Address to listen on (TTS_HOST)", "HOST"},
      {"port", 'p', 0, G_OPTION_ARG_INT, &config->port, "Port to listen on; 0 picks one (TTS_PORT)",
       "N"},
      {"cors-origins", 0, 0, G_OPTION_ARG_STRING, &cors_flag,
       "Comma-separated origins allowed cross-origin access (TTS_CORS_ORIGINS)", "LIST"},
      {"max-body-bytes", 0, 0, G_OPTION_ARG_INT64, &config->max_body_bytes,
       "Largest request body or WebSocket message (TTS_MAX_BODY_BYTES)", "N"},
      {"max-transcript-chars", 0, 0, G_OPTION_ARG_INT, &config->max_transcript_chars,
       "Longest transcript of one request or context (TTS_MAX_TRANSCRIPT_CHARS)", "N"},
      {"max-contexts", 0, 0, G_OPTION_ARG_INT, &config->max_contexts,
       "Generations at once, all clients together (TTS_MAX_CONTEXTS)", "N"},
      {"max-contexts-per-socket", 0, 0, G_OPTION_ARG_INT, &config->max_contexts_per_socket,
       "Generations at once on one WebSocket (TTS_MAX_CONTEXTS_PER_SOCKET)", "N"},
      {"max-frames", 0, 0, G_OPTION_ARG_INT, &config->max_frames,
       "Frames per sentence at most, 0 for the model's limit (TTS_MAX_FRAMES)", "N"},
      {"tls-cert", 0, 0, G_OPTION_ARG_FILENAME, &tls_cert,
       "PEM certificate: serve HTTPS and WSS (TTS_TLS_CERT)", "PATH"},
      {"tls-key", 0, 0, G_OPTION_ARG_FILENAME, &tls_key,
       "PEM private key of the certificate (TTS_TLS_KEY)", "PATH"},
      {"pipeline-dir", 0, 0, G_OPTION_ARG_FILENAME, &pipeline_dir,
       "Directory of the pipeline descriptions (TTS_PIPELINE_DIR)", "DIR"},
      {"voices-dir", 0, 0, G_OPTION_ARG_FILENAME, &voices_dir,
       "Directory of speaker prefix files <id>.bin to serve as voices (TTS_VOICES_DIR)", "DIR"},
      {"data-dir", 0, 0, G_OPTION_ARG_FILENAME, &data_dir,
       "Directory of the private PostgreSQL cluster used when DATABASE_URL is not set "
       "(TTS_DATA_DIR)",
       "DIR"},
      {"max-clip-bytes", 0, 0, G_OPTION_ARG_INT64, &config->max_clip_bytes,
       "Largest reference clip POST /voices/clone accepts (TTS_MAX_CLIP_BYTES)", "N"},
      {NULL},
  };
  g_autoptr (GOptionContext) context
      = g_option_context_new ("- the Cartesia-compatible Gepard TTS server");
  g_option_context_add_main_entries (context, entries, NULL);
  if (!g_option_context_parse (context, argc, argv, error))
    return FALSE;

  take_flag (&config->model, g_steal_pointer (&model));
  take_flag (&config->codec, g_steal_pointer (&codec));
  take_flag (&config->device, g_steal_pointer (&device));
  take_flag (&config->host, g_steal_pointer (&host));
  take_flag (&config->tls_cert, g_steal_pointer (&tls_cert));
  take_flag (&config->tls_key, g_steal_pointer (&tls_key));
  take_flag (&config->pipeline_dir, g_steal_pointer (&pipeline_dir));
  take_flag (&config->voices_dir, g_steal_pointer (&voices_dir));
  take_flag (&config->data_dir, g_steal_pointer (&data_dir));
  config->cors_origins = split_origins (cors_flag != NULL ? cors_flag : cors);
  if (config->pipeline_dir == NULL)
    config->pipeline_dir = default_pipeline_dir ();

  if (config->model == NULL)
    {
      g_set_error_literal (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                           "no model: give --model DIR|REPO_ID or TTS_MODEL");
      return FALSE;
    }
  if ((config->tls_cert == NULL) != (config->tls_key == NULL))
    {
      g_set_error_literal (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                           "TLS needs both --tls-cert and --tls-key");
      return FALSE;
    }
  return check_range ("--port", config->port, 0, 65535, error)
         && check_range ("--max-body-bytes", config->max_body_bytes, 1024,
                         G_GINT64_CONSTANT (1) << 32, error)
         && check_range ("--max-clip-bytes", config->max_clip_bytes, 1024,
                         G_GINT64_CONSTANT (1) << 32, error)
         && check_range ("--max-transcript-chars", config->max_transcript_chars, 1, 10000000, error)
         && check_range ("--max-contexts", config->max_contexts, 1, 100000, error)
         && check_range ("--max-contexts-per-socket", config->max_contexts_per_socket, 1, 100000,
                         error)
         && check_range ("--max-frames", config->max_frames, 0, 1000000, error);
}

void
gepard_server_config_clear (GepardServerConfig *config)
{
  g_free (config->model);
  g_free (config->codec);
  g_free (config->device);
  g_free (config->host);
  if (config->api_key != NULL)
    memset (config->api_key, 0, strlen (config->api_key));
  g_free (config->api_key);
  g_strfreev (config->cors_origins);
  g_free (config->tls_cert);
  g_free (config->tls_key);
  g_free (config->pipeline_dir);
  g_free (config->voices_dir);
  g_free (config->data_dir);
  memset (config, 0, sizeof *config);
}

gboolean
gepard_server_config_allows_origin (const GepardServerConfig *config, const char *origin)
{
  return origin != NULL && config->cors_origins != NULL
         && g_strv_contains ((const char *const *)config->cors_origins, origin);
}
