/* gepard-routes-voices.c: GET /voices, GET and DELETE /voices/{id}, POST /voices/clone
 * (cartesia-protocol.md §4).
 *
 * Everything that waits (the voice store, the clone pipeline) runs off the main loop: the message
 * is paused, and answered from the completion in the main context. */
#include "gepard-server.h"

#include "gepard-clone-form.h"
#include "gstgepardcontext.h"

#include <gst/app/gstappsink.h>
#include <gst/app/gstappsrc.h>
#include <math.h>
#include <string.h>

#define DEFAULT_VOICE_PAGE 10
#define MAX_VOICE_PAGE 100
#define FIRST_PAGINATED_VERSION 20241113u

/* reference clips accepted, in seconds */
#define CLIP_MIN_SECONDS 3.0
#define CLIP_MAX_SECONDS 15.0
/* a clip whose loudest sample is below this (about -80 dBFS) holds no voice */
#define SILENCE_PEAK 1e-4f
/* the clone pipeline's run at most, model included */
#define CLONE_TIMEOUT (120 * GST_SECOND)

/* One paused request waiting for the store or the clone pipeline. */
typedef struct
{
  GepardServer *server;
  SoupServerMessage *msg; /* a reference: the message outlives a client that went away */
  guint version;
  char *id;
  gboolean bare_list; /* GET /voices before pagination: every voice in a bare array */
  /* POST /voices/clone */
  GBytes *clip;
  char *name, *language, *description, *accent, *gender;
  GepardEngine *engine;
  char *pipeline;
} VoiceRequest;

static VoiceRequest *
voice_request_new (GepardServer *server, SoupServerMessage *msg, guint version, const char *id)
{
  VoiceRequest *r = g_new0 (VoiceRequest, 1);
  r->server = server;
  r->msg = g_object_ref (msg);
  r->version = version;
  r->id = g_strdup (id);
  soup_server_message_pause (msg);
  return r;
}

static void
voice_request_free (VoiceRequest *r)
{
  soup_server_message_unpause (r->msg);
  g_object_unref (r->msg);
  g_free (r->id);
  g_clear_pointer (&r->clip, g_bytes_unref);
  g_free (r->name);
  g_free (r->language);
  g_free (r->description);
  g_free (r->accent);
  g_free (r->gender);
  if (r->engine != NULL)
    gepard_engine_unref (r->engine);
  g_free (r->pipeline);
  g_free (r);
}

G_DEFINE_AUTOPTR_CLEANUP_FUNC (VoiceRequest, voice_request_free)

static void
send_error (SoupServerMessage *msg, guint version, const GError *error)
{
  g_autofree char *request_id = gepard_http_new_request_id ();
  if (gepard_api_error_get_status (error) == 500)
    g_log_structured (G_LOG_DOMAIN, G_LOG_LEVEL_WARNING, "MESSAGE", "%s: %s", request_id,
                      error->message);
  gepard_http_send_error (msg, version, error, request_id);
}

static void
send_new_error (SoupServerMessage *msg, guint version, GepardApiError code, const char *message)
{
  g_autoptr (GError) error = g_error_new_literal (GEPARD_API_ERROR, code, message);
  send_error (msg, version, error);
}

/* Cartesia's voice object: every field of the newest shape, plus the older is_public. */
static void
add_voice (JsonBuilder *b, const GepardVoiceInfo *v)
{
  json_builder_begin_object (b);
  json_builder_set_member_name (b, "id");
  json_builder_add_string_value (b, v->id);
  json_builder_set_member_name (b, "name");
  json_builder_add_string_value (b, v->name);
  json_builder_set_member_name (b, "description");
  json_builder_add_string_value (b, v->description);
  json_builder_set_member_name (b, "language");
  json_builder_add_string_value (b, v->language);
  json_builder_set_member_name (b, "created_at");
  json_builder_add_string_value (b, v->created_at);
  json_builder_set_member_name (b, "is_owner");
  json_builder_add_boolean_value (b, v->is_owner);
  json_builder_set_member_name (b, "is_public");
  json_builder_add_boolean_value (b, !v->is_owner);
  json_builder_set_member_name (b, "access");
  json_builder_add_string_value (b, v->is_owner ? "private" : "public");
  json_builder_set_member_name (b, "visibility");
  json_builder_add_string_value (b, v->is_owner ? "owner" : "all");
  json_builder_set_member_name (b, "user_id");
  json_builder_add_string_value (b, "");
  json_builder_set_member_name (b, "tagline");
  json_builder_add_string_value (b, "");
  json_builder_set_member_name (b, "locales");
  json_builder_begin_array (b);
  json_builder_end_array (b);
  json_builder_end_object (b);
}

static void
send_voice (SoupServerMessage *msg, const GepardVoiceInfo *info)
{
  g_autoptr (JsonBuilder) b = json_builder_new ();
  add_voice (b, info);
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (msg, SOUP_STATUS_OK, root);
}

/* ---- GET /voices ---- */

static void
on_listed (GObject *source, GAsyncResult *result, gpointer user_data)
{
  g_autoptr (VoiceRequest) r = user_data;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceInfoPage) page = gepard_voice_store_list_finish (result, &error);
  if (page == NULL)
    {
      send_error (r->msg, r->version, error);
      return;
    }

  g_autoptr (JsonBuilder) b = json_builder_new ();
  if (r->bare_list)
    {
      json_builder_begin_array (b);
      for (guint i = 0; i < page->voices->len; i++)
        add_voice (b, page->voices->pdata[i]);
      json_builder_end_array (b);
    }
  else
    {
      json_builder_begin_object (b);
      json_builder_set_member_name (b, "data");
      json_builder_begin_array (b);
      for (guint i = 0; i < page->voices->len; i++)
        add_voice (b, page->voices->pdata[i]);
      json_builder_end_array (b);
      json_builder_set_member_name (b, "has_more");
      json_builder_add_boolean_value (b, page->has_more);
      json_builder_set_member_name (b, "next_page");
      if (page->has_more && page->voices->len > 0)
        json_builder_add_string_value (
            b, ((const GepardVoiceInfo *)page->voices->pdata[page->voices->len - 1])->id);
      else
        json_builder_add_null_value (b);
      json_builder_end_object (b);
    }
  g_autoptr (JsonNode) root = json_builder_get_root (b);
  gepard_http_send_json (r->msg, SOUP_STATUS_OK, root);
}

static void
list_voices (GepardServer *server, SoupServerMessage *msg, GHashTable *query, guint version)
{
  const char *limit_text = query != NULL ? g_hash_table_lookup (query, "limit") : NULL;
  guint64 limit = DEFAULT_VOICE_PAGE;
  GepardVoiceListParams params = {0};

  if (limit_text != NULL
      && !g_ascii_string_to_unsigned (limit_text, 10, 1, MAX_VOICE_PAGE, &limit, NULL))
    {
      g_autofree char *message
          = g_strdup_printf ("limit must be a number from 1 to %d", MAX_VOICE_PAGE);
      send_new_error (msg, version, GEPARD_API_ERROR_BAD_REQUEST, message);
      return;
    }
  VoiceRequest *r = voice_request_new (server, msg, version, NULL);
  params.limit = (guint)limit;
  if (version < FIRST_PAGINATED_VERSION)
    {
      /* the oldest API version answered with every voice at once */
      r->bare_list = TRUE;
      params.limit = MAX_VOICE_PAGE;
    }
  else if (query != NULL)
    {
      params.starting_after = g_hash_table_lookup (query, "starting_after");
      params.ending_before = g_hash_table_lookup (query, "ending_before");
      params.query = g_hash_table_lookup (query, "q");
    }
  gepard_voice_store_list_async (server->voices, &params, NULL, on_listed, r);
}

/* ---- GET and DELETE /voices/{id} ---- */

static void
on_got_info (GObject *source, GAsyncResult *result, gpointer user_data)
{
  g_autoptr (VoiceRequest) r = user_data;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceInfo) info = gepard_voice_store_get_info_finish (result, &error);
  if (info == NULL)
    send_error (r->msg, r->version, error);
  else
    send_voice (r->msg, info);
}

static void
on_deleted (GObject *source, GAsyncResult *result, gpointer user_data)
{
  g_autoptr (VoiceRequest) r = user_data;
  g_autoptr (GError) error = NULL;
  if (!gepard_voice_store_delete_finish (result, &error))
    send_error (r->msg, r->version, error);
  else
    soup_server_message_set_status (r->msg, SOUP_STATUS_NO_CONTENT, NULL);
}

/* ---- POST /voices/clone ---- */

typedef struct
{
  GMutex lock;
  float peak; /* the loudest sample reaching the encoder */
} ClipLevel;

static GstPadProbeReturn
measure_peak (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  ClipLevel *level = user_data;
  GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER (info);
  GstMapInfo map;
  if (buffer == NULL || !gst_buffer_map (buffer, &map, GST_MAP_READ))
    return GST_PAD_PROBE_OK;
  /* the encoder takes native-endian mono F32 (its sink template) */
  const float *samples = (const float *)map.data;
  float peak = 0.0f;
  for (gsize i = 0; i < map.size / sizeof (float); i++)
    peak = MAX (peak, fabsf (samples[i]));
  gst_buffer_unmap (buffer, &map);
  g_mutex_lock (&level->lock);
  level->peak = MAX (level->peak, peak);
  g_mutex_unlock (&level->lock);
  return GST_PAD_PROBE_OK;
}

/* An error of the clip (400) or of the server (500), from the pipeline's error message. */
static GError *
clone_error (GError *error)
{
  gboolean clip_fault = error->domain == GST_STREAM_ERROR
                        || g_error_matches (error, GST_CORE_ERROR, GST_CORE_ERROR_MISSING_PLUGIN);
  GError *api;
  if (g_error_matches (error, GST_STREAM_ERROR, GST_STREAM_ERROR_TYPE_NOT_FOUND)
      || g_error_matches (error, GST_CORE_ERROR, GST_CORE_ERROR_MISSING_PLUGIN)
      || g_error_matches (error, GST_STREAM_ERROR, GST_STREAM_ERROR_WRONG_TYPE))
    api = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                       "clip is not audio this server can decode (WAV, FLAC, MP3, Ogg): %s",
                       error->message);
  else if (clip_fault)
    api = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST, "clip: %s", error->message);
  else
    api = g_error_new (GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL, "The clone pipeline failed: %s",
                       error->message);
  g_error_free (error);
  return api;
}

/* The prefix file's bytes of the clip; runs on a worker thread. */
static GBytes *
run_clone_pipeline (VoiceRequest *r, GError **error)
{
  g_autoptr (GError) parse_error = NULL;
  g_autoptr (GstElement) pipeline
      = gst_parse_launch_full (r->pipeline, NULL, GST_PARSE_FLAG_FATAL_ERRORS, &parse_error);
  if (pipeline == NULL)
    {
      g_set_error (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                   "The clone pipeline does not parse: %s", parse_error->message);
      return NULL;
    }
  gst_object_ref_sink (pipeline);
  g_autoptr (GstElement) src = gst_bin_get_by_name (GST_BIN (pipeline), "clip");
  g_autoptr (GstElement) encoder = gst_bin_get_by_name (GST_BIN (pipeline), "encoder");
  g_autoptr (GstElement) sink = gst_bin_get_by_name (GST_BIN (pipeline), "prefix");
  if (!GST_IS_APP_SRC (src) || encoder == NULL || !GST_IS_APP_SINK (sink))
    {
      g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                           "The clone pipeline's \"clip\" must be an appsrc, \"encoder\" a "
                           "gepardvoiceenc and \"prefix\" an appsink");
      return NULL;
    }
  GstContext *context = gst_gepard_engine_context_new (r->engine);
  gst_element_set_context (pipeline, context);
  gst_context_unref (context);
  g_object_set (encoder, "min-duration", CLIP_MIN_SECONDS, "max-duration", CLIP_MAX_SECONDS, NULL);
  /* the prefix is pulled after the end of stream reaches the bus */
  g_object_set (sink, "wait-on-eos", FALSE, NULL);

  ClipLevel level = {0};
  g_mutex_init (&level.lock);
  g_autoptr (GstPad) encoder_sink = gst_element_get_static_pad (encoder, "sink");
  gulong probe
      = gst_pad_add_probe (encoder_sink, GST_PAD_PROBE_TYPE_BUFFER, measure_peak, &level, NULL);

  g_autoptr (GstBus) bus = gst_element_get_bus (pipeline);
  GBytes *prefix = NULL;
  if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE)
    {
      /* the reason is on the bus */
    }
  else
    {
      gst_app_src_push_buffer (GST_APP_SRC (src), gst_buffer_new_wrapped_bytes (r->clip));
      gst_app_src_end_of_stream (GST_APP_SRC (src));
    }
  g_autoptr (GstMessage) message
      = gst_bus_timed_pop_filtered (bus, CLONE_TIMEOUT, GST_MESSAGE_ERROR | GST_MESSAGE_EOS);
  if (message == NULL)
    g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                         "The clone pipeline did not finish in time");
  else if (GST_MESSAGE_TYPE (message) == GST_MESSAGE_ERROR)
    {
      GError *gst_error = NULL;
      gst_message_parse_error (message, &gst_error, NULL);
      g_propagate_error (error, clone_error (gst_error));
    }
  else
    {
      g_autoptr (GstSample) sample = gst_app_sink_try_pull_sample (GST_APP_SINK (sink), 0);
      GstBuffer *buffer = sample != NULL ? gst_sample_get_buffer (sample) : NULL;
      g_mutex_lock (&level.lock);
      float peak = level.peak;
      g_mutex_unlock (&level.lock);
      if (buffer == NULL)
        g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                             "clip holds no audio");
      else if (peak < SILENCE_PEAK)
        g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_BAD_REQUEST,
                             "clip is silent: send a few seconds of clear speech");
      else
        {
          GstMapInfo map;
          if (gst_buffer_map (buffer, &map, GST_MAP_READ))
            {
              prefix = g_bytes_new (map.data, map.size);
              gst_buffer_unmap (buffer, &map);
            }
          else
            g_set_error_literal (error, GEPARD_API_ERROR, GEPARD_API_ERROR_INTERNAL,
                                 "Cannot read the speaker prefix");
        }
    }
  gst_element_set_state (pipeline, GST_STATE_NULL);
  gst_pad_remove_probe (encoder_sink, probe);
  g_mutex_clear (&level.lock);
  return prefix;
}

static void
clone_in_thread (GTask *task, gpointer source, gpointer task_data, GCancellable *cancellable)
{
  GError *error = NULL;
  GBytes *prefix = run_clone_pipeline (task_data, &error);
  if (prefix == NULL)
    g_task_return_error (task, error);
  else
    g_task_return_pointer (task, prefix, (GDestroyNotify)g_bytes_unref);
}

static void
on_clone_stored (GObject *source, GAsyncResult *result, gpointer user_data)
{
  g_autoptr (VoiceRequest) r = user_data;
  g_autoptr (GError) error = NULL;
  g_autoptr (GepardVoiceInfo) info = gepard_voice_store_create_finish (result, &error);
  if (info == NULL)
    send_error (r->msg, r->version, error);
  else
    send_voice (r->msg, info);
}

static void
on_clone_encoded (GObject *source, GAsyncResult *result, gpointer user_data)
{
  VoiceRequest *r = g_task_get_task_data (G_TASK (result));
  g_autoptr (GError) error = NULL;
  g_autoptr (GBytes) prefix = g_task_propagate_pointer (G_TASK (result), &error);
  g_autoptr (GepardVoice) voice = prefix != NULL ? gepard_voice_new_from_prefix_bytes (
                                      "clip", prefix, gepard_engine_get_config (r->engine), &error)
                                                 : NULL;
  if (voice == NULL)
    {
      send_error (r->msg, r->version, error);
      voice_request_free (r);
      return;
    }
  const GepardModelConfig *config = gepard_engine_get_config (r->engine);
  int rows = 0;
  GepardVoiceCreateParams params = {
      .name = r->name,
      .language = r->language,
      .description = r->description,
      .accent = r->accent,
      .gender = r->gender,
      .prefix = gepard_voice_get_prefix (voice, &rows),
      .hidden = config->hidden_size,
  };
  params.rows = rows;
  gepard_voice_store_create_async (r->server->voices, &params, NULL, on_clone_stored, r);
}

/* Fills r from the multipart form (gepard-clone-form.h). */
static gboolean
read_clone_form (SoupServerMessage *msg, VoiceRequest *r, GError **error)
{
  g_autoptr (GBytes) body = gepard_http_get_body (msg, error);
  if (body == NULL)
    return FALSE;
  g_auto (GepardCloneForm) form = {0};
  const char *content_type = soup_message_headers_get_one (
      soup_server_message_get_request_headers (msg), "Content-Type");
  if (!gepard_clone_form_parse (content_type, body, &form, error))
    return FALSE;
  r->clip = g_steal_pointer (&form.clip);
  r->name = g_steal_pointer (&form.name);
  r->language = g_steal_pointer (&form.language);
  r->description = g_steal_pointer (&form.description);
  r->accent = g_steal_pointer (&form.accent);
  r->gender = g_steal_pointer (&form.gender);
  return TRUE;
}

static void
clone_voice (GepardServer *server, SoupServerMessage *msg, guint version)
{
  g_autoptr (GError) error = NULL;
  const char *pipeline = g_hash_table_lookup (server->pipelines, "clone.txt");
  VoiceRequest *r = voice_request_new (server, msg, version, NULL);
  if (!read_clone_form (msg, r, &error))
    {
      send_error (msg, version, error);
      voice_request_free (r);
      return;
    }
  r->engine = gepard_engine_ref (gepard_engine_pool_pick (server->engines, NULL));
  r->pipeline = g_strdup (pipeline);

  GTask *task = g_task_new (NULL, NULL, on_clone_encoded, NULL);
  g_task_set_task_data (task, r, NULL);
  g_task_run_in_thread (task, clone_in_thread);
  g_object_unref (task);
}

/* ---- routing ---- */

void
gepard_routes_voices (GepardServer *server, SoupServerMessage *msg, const char *path,
                      GHashTable *query, guint version)
{
  const char *method = soup_server_message_get_method (msg);
  gboolean get = g_str_equal (method, "GET") || g_str_equal (method, "HEAD");

  if (server->voices == NULL)
    {
      g_autofree char *message
          = g_strdup_printf ("The server is not ready: %s", server->loading_reason);
      send_new_error (msg, version, GEPARD_API_ERROR_UNAVAILABLE, message);
      return;
    }
  if (g_str_equal (path, "/voices") || g_str_equal (path, "/voices/"))
    {
      if (get)
        list_voices (server, msg, query, version);
      else
        send_new_error (msg, version, GEPARD_API_ERROR_METHOD_NOT_ALLOWED, "Use GET");
      return;
    }
  if (g_str_equal (path, "/voices/clone"))
    {
      if (g_str_equal (method, "POST"))
        clone_voice (server, msg, version);
      else
        send_new_error (msg, version, GEPARD_API_ERROR_METHOD_NOT_ALLOWED, "Use POST");
      return;
    }

  const char *id = path + strlen ("/voices/");
  if (get)
    gepard_voice_store_get_info_async (server->voices, id, NULL, on_got_info,
                                       voice_request_new (server, msg, version, id));
  else if (g_str_equal (method, "DELETE"))
    gepard_voice_store_delete_async (server->voices, id, NULL, on_deleted,
                                     voice_request_new (server, msg, version, id));
  else
    send_new_error (msg, version, GEPARD_API_ERROR_METHOD_NOT_ALLOWED, "Use GET or DELETE");
}
