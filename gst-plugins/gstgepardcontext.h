/* gstgepardcontext.h: sharing a GepardEngine between elements and pipelines through GstContext.
 *
 * gepardlm, gepardcodec and gepardvoiceenc find their engine the way GStreamer elements find any
 * shared device (the GstContext design): an engine set on them (or on a bin above them) with
 * gst_element_set_context, else one a neighbour answers for in a context query, else one a parent
 * bin or the application's synchronous bus handler answers NEED_CONTEXT with, else the process-wide
 * engine for their model and device, which they then announce with HAVE_CONTEXT.
 *
 * An application that wants every pipeline on one engine it configured itself (batch size,
 * device) creates it with gepard_engine_new and sets the context on each pipeline before its
 * first state change:
 *
 *   GstContext *context = gst_gepard_engine_context_new (engine);
 *   gst_element_set_context (pipeline, context);
 *   gst_context_unref (context);
 *
 * Elements with no model= then use that engine; an element whose model= names another model
 * loads its own. Header only, so applications need not link the plugin.
 */
#pragma once

#include <gst/gst.h>

#include "gepard-engine.h"

G_BEGIN_DECLS

/* The GstContext type; its structure carries the engine under the field "engine"
 * (GEPARD_TYPE_ENGINE). */
#define GST_GEPARD_ENGINE_CONTEXT_TYPE "gepard.engine"

/* A persistent context carrying `engine` (a reference is taken). */
static inline GstContext *
gst_gepard_engine_context_new (GepardEngine *engine)
{
  GstContext *context = gst_context_new (GST_GEPARD_ENGINE_CONTEXT_TYPE, TRUE);
  GstStructure *s = gst_context_writable_structure (context);

  gst_structure_set (s, "engine", GEPARD_TYPE_ENGINE, engine, NULL);
  return context;
}

/* The engine `context` carries (a new reference), or NULL when it is not a Gepard engine context.
 */
static inline GepardEngine *
gst_gepard_context_get_engine (GstContext *context)
{
  const GstStructure *s;
  GepardEngine *engine = NULL;

  if (context == NULL
      || g_strcmp0 (gst_context_get_context_type (context), GST_GEPARD_ENGINE_CONTEXT_TYPE) != 0)
    return NULL;
  s = gst_context_get_structure (context);
  if (!gst_structure_get (s, "engine", GEPARD_TYPE_ENGINE, &engine, NULL))
    return NULL;
  return engine;
}

G_END_DECLS
