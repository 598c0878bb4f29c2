/* gepard-server-config.c: TTS_* variables and flags into one GepardServerConfig. */
#include "gepard-server-config.h"

#include "gepard-build-config.h"
#include "gepard-hub.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

#define DEFAULT_DEVICE "auto"
#define DEFAULT_HOST "127.0.0.1"
#define DEFAULT_PORT 8080
#define DEFAULT_MAX_BODY_BYTES (1024 * 1024)
#define DEFAULT_MAX_TRANSCRIPT_CHARS 20000
#define DEFAULT_MAX_CONTEXTS 64
#define DEFAULT_MAX_CONTEXTS_PER_SOCKET 16
#define DEFAULT_MAX_CLIP_BYTES (16 * 1024 * 1024)
#define DEFAULT_SHUTDOWN_TIMEOUT 30
#define DEFAULT_MAX_SEND_BUFFER_BYTES (4 * 1024 * 1024)
#define MIN_SEND_BUFFER_BYTES (64 * 1024)
#define DEFAULT_GPU_DEVICE_IDS "0"
/* the server shares its GPU by default; gepard-compute-cuda.c reads the same variable */
#define DEFAULT_GPU_MEMORY_UTILIZATION 0.5
#define MAX_GPU_DEVICE_ID 1023
#define DEFAULT_MPS_PIPE_DIRECTORY "/tmp/nvidia-mps"

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

/* 1, true, yes, on or 0, false, no, off (any case); unset or empty keeps `value` */
static gboolean
env_bool (const char *name, gboolean *value, GError **error)
{
  static const char *const yes[] = {"1", "true", "yes", "on"};
  static const char *const no[] = {"0", "false", "no", "off"};
  const char *s = g_getenv (name);

  if (s == NULL || s[0] == '\0')
    return TRUE;
  for (gsize i = 0; i < G_N_ELEMENTS (yes); i++)
    if (g_ascii_strcasecmp (s, yes[i]) == 0 || g_ascii_strcasecmp (s, no[i]) == 0)
      {
        *value = g_ascii_strcasecmp (s, yes[i]) == 0;
        return TRUE;
      }
  g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
               "%s=%s: give 1 or 0 (also true/false, yes/no, on/off)", name, s);
  return FALSE;
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

/* ---- GPU placement ---- */

gboolean
gepard_server_parse_device_ids (const char *name, const char *text, int **ids, guint *n_ids,
                                GError **error)
{
  g_auto (GStrv) items = g_strsplit (text != NULL ? text : "", ",", -1);
  g_autoptr (GArray) list = g_array_new (FALSE, FALSE, sizeof (int));

  if (items[0] == NULL) /* "" splits into no item at all */
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                   "%s=: empty; give comma-separated device indices such as 0 or 0,1", name);
      return FALSE;
    }
  for (char **item = items; *item != NULL; item++)
    {
      g_strstrip (*item);
      guint64 id;
      g_autoptr (GError) local = NULL;
      if ((*item)[0] == '\0')
        {
          g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                       "%s=%s: an empty GPU id; give comma-separated device indices such as 0 "
                       "or 0,1",
                       name, text);
          return FALSE;
        }
      if (!g_ascii_string_to_unsigned (*item, 10, 0, MAX_GPU_DEVICE_ID, &id, &local))
        {
          g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                       "%s=%s: %s is not a GPU index (an integer from 0 to %d); give "
                       "comma-separated device indices such as 0 or 0,1",
                       name, text, *item, MAX_GPU_DEVICE_ID);
          return FALSE;
        }
      for (guint i = 0; i < list->len; i++)
        if (g_array_index (list, int, i) == (int)id)
          {
            g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                         "%s=%s: GPU %d is listed twice", name, text, (int)id);
            return FALSE;
          }
      int value = (int)id;
      g_array_append_val (list, value);
    }
  *n_ids = list->len;
  *ids = (int *)(void *)g_array_free (g_steal_pointer (&list), FALSE);
  return TRUE;
}

gboolean
gepard_server_parse_fraction (const char *name, const char *text, double *value, GError **error)
{
  char *end = NULL;
  const char *s = text != NULL ? text : "";
  while (g_ascii_isspace (*s))
    s++;
  double x = g_ascii_strtod (s, &end);
  while (end != NULL && g_ascii_isspace (*end))
    end++;
  /* decimal only: no hex floats, no inf or nan */
  gboolean decimal = s[0] != '\0' && strspn (s, "0123456789.+-eE \t") == strlen (s);
  if (end == s || *end != '\0' || !decimal || !isfinite (x) || !(x > 0 && x <= 1))
    {
      g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                   "%s=%s: not a fraction of the GPU's memory in (0, 1], such as 0.5", name,
                   text != NULL ? text : "");
      return FALSE;
    }
  *value = x;
  return TRUE;
}

char *
gepard_server_placement_device (const char *device, const int *ids, guint n_ids, gboolean ids_given,
                                GError **error)
{
  int first = n_ids > 0 ? ids[0] : 0;
  if (g_strcmp0 (device, "cuda") == 0)
    return g_strdup_printf ("cuda:%d", first);
  if (g_strcmp0 (device, "auto") == 0)
    return first == 0 ? g_strdup ("auto") : g_strdup_printf ("cuda:%d", first);
  if (device != NULL && g_str_has_prefix (device, "cuda:") && ids_given)
    {
      guint64 index;
      if (g_ascii_string_to_unsigned (device + 5, 10, 0, G_MAXINT, &index, NULL)
          && (int)index != first)
        {
          g_set_error (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                       "the device %s and the GPU ids (TTS_GPU_DEVICE_IDS, GPU_DEVICE_IDS or "
                       "--gpu-device-ids), which start with %d, disagree: set one of them",
                       device, first);
          return NULL;
        }
    }
  return g_strdup (device);
}

gboolean
gepard_server_detect_mps (char **dir)
{
  const char *pipe_dir = g_getenv ("CUDA_MPS_PIPE_DIRECTORY");
  if (pipe_dir == NULL || pipe_dir[0] == '\0')
    pipe_dir = DEFAULT_MPS_PIPE_DIRECTORY;
  g_autofree char *control = g_build_filename (pipe_dir, "control", NULL);
  struct stat st;
  gboolean found = stat (control, &st) == 0 && S_ISFIFO (st.st_mode);
  if (dir != NULL)
    *dir = g_strdup (pipe_dir);
  return found;
}

/* The GPU ids and the memory fraction, the device they imply, and the MPS daemon. */
static gboolean
load_placement (GepardServerConfig *config, const char *ids_name, const char *ids_text,
                const char *memory_name, const char *memory_text, GError **error)
{
  gboolean ids_given = ids_text != NULL;
  if (!gepard_server_parse_device_ids (ids_name, ids_given ? ids_text : DEFAULT_GPU_DEVICE_IDS,
                                       &config->gpu_device_ids, &config->n_gpu_device_ids, error))
    return FALSE;
  config->gpu_memory_utilization = DEFAULT_GPU_MEMORY_UTILIZATION;
  if (memory_text != NULL
      && !gepard_server_parse_fraction (memory_name, memory_text, &config->gpu_memory_utilization,
                                        error))
    return FALSE;
  char *device = gepard_server_placement_device (config->device, config->gpu_device_ids,
                                                 config->n_gpu_device_ids, ids_given, error);
  if (device == NULL)
    return FALSE;
  g_free (config->device);
  config->device = device;
  /* the CUDA backend reads the fraction from this variable: the server hands it the value it
   * validated, before any thread starts */
  char text[G_ASCII_DTOSTR_BUF_SIZE];
  g_setenv ("TTS_GPU_MEMORY_UTILIZATION",
            g_ascii_dtostr (text, sizeof text, config->gpu_memory_utilization), TRUE);
  config->mps = gepard_server_detect_mps (&config->mps_pipe_dir);
  return TRUE;
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
  g_autofree char *gpu_ids = NULL, *gpu_ids_flag = NULL, *gpu_memory = NULL;
  g_autofree char *gpu_memory_flag = NULL;
  const char *gpu_ids_name = "TTS_GPU_DEVICE_IDS";
  gboolean no_playground = FALSE;

  memset (config, 0, sizeof *config);
  config->device = g_strdup (DEFAULT_DEVICE);
  config->host = g_strdup (DEFAULT_HOST);
  config->port = DEFAULT_PORT;
  config->max_body_bytes = DEFAULT_MAX_BODY_BYTES;
  config->max_transcript_chars = DEFAULT_MAX_TRANSCRIPT_CHARS;
  config->max_contexts = DEFAULT_MAX_CONTEXTS;
  config->max_contexts_per_socket = DEFAULT_MAX_CONTEXTS_PER_SOCKET;
  config->max_clip_bytes = DEFAULT_MAX_CLIP_BYTES;
  config->shutdown_timeout = DEFAULT_SHUTDOWN_TIMEOUT;
  config->max_send_buffer_bytes = DEFAULT_MAX_SEND_BUFFER_BYTES;
  config->playground = TRUE;

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
  env_string ("TTS_GPU_DEVICE_IDS", &gpu_ids);
  if (gpu_ids == NULL)
    {
      gpu_ids_name = "GPU_DEVICE_IDS";
      env_string ("GPU_DEVICE_IDS", &gpu_ids);
    }
  env_string ("TTS_GPU_MEMORY_UTILIZATION", &gpu_memory);
  if (!env_int ("TTS_PORT", 0, 65535, &config->port, error)
      || !env_number ("TTS_MAX_BODY_BYTES", 1024, G_GINT64_CONSTANT (1) << 32,
                      &config->max_body_bytes, error)
      || !env_number ("TTS_MAX_CLIP_BYTES", 1024, G_GINT64_CONSTANT (1) << 32,
                      &config->max_clip_bytes, error)
      || !env_int ("TTS_MAX_TRANSCRIPT_CHARS", 1, 10000000, &config->max_transcript_chars, error)
      || !env_int ("TTS_MAX_CONTEXTS", 1, 100000, &config->max_contexts, error)
      || !env_int ("TTS_MAX_CONTEXTS_PER_SOCKET", 1, 100000, &config->max_contexts_per_socket,
                   error)
      || !env_int ("TTS_MAX_FRAMES", 0, 1000000, &config->max_frames, error)
      || !env_int ("TTS_SHUTDOWN_TIMEOUT", 0, 86400, &config->shutdown_timeout, error)
      || !env_number ("TTS_MAX_SEND_BUFFER_BYTES", MIN_SEND_BUFFER_BYTES,
                      G_GINT64_CONSTANT (1) << 32, &config->max_send_buffer_bytes, error)
      || !env_bool ("TTS_PLAYGROUND", &config->playground, error))
    return FALSE;

  GOptionEntry entries[] = {
      {"model", 'm', 0, G_OPTION_ARG_STRING, &model,
       "GEPARD model: a checkpoint directory or a cached repo id (TTS_MODEL; default: "
       "GEPARD_MODEL, else the installed default voice)",
       "DIR|REPO_ID"},
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
      {"shutdown-timeout", 0, 0, G_OPTION_ARG_INT, &config->shutdown_timeout,
       "Seconds generations under way may take to finish after SIGTERM or SIGINT "
       "(TTS_SHUTDOWN_TIMEOUT)",
       "S"},
      {"max-send-buffer-bytes", 0, 0, G_OPTION_ARG_INT64, &config->max_send_buffer_bytes,
       "Output waiting for one client at most (TTS_MAX_SEND_BUFFER_BYTES)", "N"},
      {"gpu-device-ids", 0, 0, G_OPTION_ARG_STRING, &gpu_ids_flag,
       "Comma-separated CUDA device indices this server may use; the engine runs on the first "
       "(TTS_GPU_DEVICE_IDS, GPU_DEVICE_IDS)",
       "LIST"},
      {"gpu-memory-utilization", 0, 0, G_OPTION_ARG_STRING, &gpu_memory_flag,
       "Fraction of the GPU's memory the engine may fill, in (0, 1] (TTS_GPU_MEMORY_UTILIZATION)",
       "F"},
      {"no-playground", 0, 0, G_OPTION_ARG_NONE, &no_playground,
       "Do not serve the playground page at / (TTS_PLAYGROUND=0)", NULL},
      {"list-routes", 0, 0, G_OPTION_ARG_NONE, &config->list_routes,
       "Print the routes (method, path, whether the API key is required) and exit", NULL},
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
  if (no_playground)
    config->playground = FALSE;
  if (config->pipeline_dir == NULL)
    config->pipeline_dir = default_pipeline_dir ();

  if (config->model == NULL)
    config->model = gepard_hub_default_model ();
  if (config->model == NULL && !config->list_routes)
    {
      g_set_error_literal (error, G_OPTION_ERROR, G_OPTION_ERROR_BAD_VALUE,
                           "no model: give --model DIR|REPO_ID or TTS_MODEL (no default model is "
                           "installed)");
      return FALSE;
    }
  if (!load_placement (config, gpu_ids_flag != NULL ? "--gpu-device-ids" : gpu_ids_name,
                       gpu_ids_flag != NULL ? gpu_ids_flag : gpu_ids,
                       gpu_memory_flag != NULL ? "--gpu-memory-utilization"
                                               : "TTS_GPU_MEMORY_UTILIZATION",
                       gpu_memory_flag != NULL ? gpu_memory_flag : gpu_memory, error))
    return FALSE;
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
         && check_range ("--max-frames", config->max_frames, 0, 1000000, error)
         && check_range ("--shutdown-timeout", config->shutdown_timeout, 0, 86400, error)
         && check_range ("--max-send-buffer-bytes", config->max_send_buffer_bytes,
                         MIN_SEND_BUFFER_BYTES, G_GINT64_CONSTANT (1) << 32, error);
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
  g_free (config->gpu_device_ids);
  g_free (config->mps_pipe_dir);
  memset (config, 0, sizeof *config);
}

gboolean
gepard_server_config_allows_origin (const GepardServerConfig *config, const char *origin)
{
  return origin != NULL && config->cors_origins != NULL
         && g_strv_contains ((const char *const *)config->cors_origins, origin);
}
