/* gstgepardengine.c: the element side of engine sharing (GstContext design: an element asks its
 * neighbours, then its bin and the application, and announces what it created itself). */
#include "gstgepardengine.h"

#include "gepard-hub.h"

GST_DEBUG_CATEGORY_EXTERN (gst_gepard_engine_debug);
#define GST_CAT_DEFAULT gst_gepard_engine_debug

void
gst_gepard_engine_set_context (GstElement *element, GstContext *context, GepardEngine **slot)
{
  GepardEngine *engine = gst_gepard_context_get_engine (context);

  if (engine == NULL)
    return;
  GST_DEBUG_OBJECT (element, "engine context for %s on %s", gepard_engine_get_model_dir (engine),
                    gepard_engine_get_device_description (engine));
  GST_OBJECT_LOCK (element);
  GepardEngine *old = *slot;
  *slot = engine;
  GST_OBJECT_UNLOCK (element);
  gepard_engine_unref (old);
}

gboolean
gst_gepard_engine_answer_query (GstQuery *query, GepardEngine *engine)
{
  const char *type;

  if (engine == NULL || !gst_query_parse_context_type (query, &type)
      || g_strcmp0 (type, GST_GEPARD_ENGINE_CONTEXT_TYPE) != 0)
    return FALSE;
  GstContext *context = gst_gepard_engine_context_new (engine);
  gst_query_set_context (query, context);
  gst_context_unref (context);
  return TRUE;
}

/* Whether `engine` serves `model` on `device` (NULL or "auto" for either: anything). */
static gboolean
engine_matches (GepardEngine *engine, const char *model, const char *device)
{
  if (engine == NULL)
    return FALSE;
  if (device != NULL)
    {
      GepardBackendKind kind;
      int index;
      gboolean is_auto;
      const GepardDeviceInfo *info = gepard_engine_get_device (engine);

      if (!gepard_backend_parse_device (device, &kind, &index, &is_auto, NULL))
        return FALSE;
      if (!is_auto && (kind != info->kind || index != info->device_index))
        return FALSE;
    }
  return model == NULL || gepard_engine_serves_model (engine, model);
}

/* The matching engine in *slot, a new reference. */
static GepardEngine *
engine_from_slot (GstElement *element, const char *model, const char *device, GepardEngine **slot)
{
  GST_OBJECT_LOCK (element);
  GepardEngine *engine = *slot != NULL ? gepard_engine_ref (*slot) : NULL;
  GST_OBJECT_UNLOCK (element);
  if (engine != NULL && !engine_matches (engine, model, device))
    {
      GST_DEBUG_OBJECT (element, "the engine context serves %s, not %s",
                        gepard_engine_get_model_dir (engine), model);
      g_clear_pointer (&engine, gepard_engine_unref);
    }
  return engine;
}

/* Asks the peers of the element's pads in `direction` for an engine context; an answer is set
 * on the element. */
static gboolean
query_peers (GstElement *element, GstPadDirection direction)
{
  GstIterator *it = direction == GST_PAD_SRC ? gst_element_iterate_src_pads (element)
                                             : gst_element_iterate_sink_pads (element);
  GValue item = G_VALUE_INIT;
  gboolean found = FALSE;

  while (!found && gst_iterator_next (it, &item) == GST_ITERATOR_OK)
    {
      GstPad *pad = g_value_get_object (&item);
      GstQuery *query = gst_query_new_context (GST_GEPARD_ENGINE_CONTEXT_TYPE);

      if (gst_pad_peer_query (pad, query))
        {
          GstContext *context = NULL;

          gst_query_parse_context (query, &context);
          if (context != NULL)
            {
              gst_element_set_context (element, context);
              found = TRUE;
            }
        }
      gst_query_unref (query);
      g_value_reset (&item);
    }
  g_value_unset (&item);
  gst_iterator_free (it);
  return found;
}

/* the process-wide engine for (model, device), set on the element and announced to its bin */
static GepardEngine *
share_new_engine (GstElement *element, const char *model, const char *device, GError **error)
{
  GepardEngine *engine = gepard_engine_get_shared (model, device, error);
  if (engine == NULL)
    return NULL;
  GstContext *context = gst_gepard_engine_context_new (engine);
  gst_element_set_context (element, context);
  gst_element_post_message (element, gst_message_new_have_context (GST_OBJECT (element), context));
  return engine;
}

GepardEngine *
gst_gepard_engine_acquire (GstElement *element, const char *model, const char *device,
                           GepardEngine **slot, GError **error)
{
  GepardEngine *engine;

  if (model != NULL && *model == '\0')
    model = NULL;
  if ((engine = engine_from_slot (element, model, device, slot)) != NULL)
    return engine;

  if ((query_peers (element, GST_PAD_SRC) || query_peers (element, GST_PAD_SINK))
      && (engine = engine_from_slot (element, model, device, slot)) != NULL)
    return engine;

  /* a parent bin answers from its cache, the application from a synchronous bus handler: both
   * call set_context before the post returns */
  gst_element_post_message (
      element, gst_message_new_need_context (GST_OBJECT (element), GST_GEPARD_ENGINE_CONTEXT_TYPE));
  if ((engine = engine_from_slot (element, model, device, slot)) != NULL)
    return engine;

  return model != NULL ? share_new_engine (element, model, device, error) : NULL;
}

GepardEngine *
gst_gepard_engine_acquire_or_default (GstElement *element, const char *model, const char *device,
                                      GepardEngine **slot, GError **error)
{
  GepardEngine *engine = gst_gepard_engine_acquire (element, model, device, slot, error);
  if (engine != NULL || (model != NULL && *model != '\0'))
    return engine;
  g_autofree char *fallback = gepard_hub_default_model ();
  return fallback != NULL ? share_new_engine (element, fallback, device, error) : NULL;
}
