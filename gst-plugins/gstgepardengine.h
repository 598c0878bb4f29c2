/* gstgepardengine.h: how an element finds its GepardEngine (the GstContext protocol of
 * gstgepardcontext.h), for gepardlm, gepardcodec and gepardvoiceenc. */
#pragma once

#include "gstgepardcontext.h"

G_BEGIN_DECLS

/* For a set_context vfunc: keeps the engine a "gepard.engine" context carries in *slot (under the
 * element's object lock), replacing the one there. Other contexts are ignored. */
void gst_gepard_engine_set_context (GstElement *element, GstContext *context, GepardEngine **slot);

/* For a pad query function: answers a "gepard.engine" context query with `engine`. FALSE when the
 * query is of another type or there is no engine. */
gboolean gst_gepard_engine_answer_query (GstQuery *query, GepardEngine *engine);

/* The engine for `model` (NULL: any model) on `device` (NULL or "auto": any device): the one in
 * *slot, else one a neighbour answers a context query with, else one the bin or the application
 * answers NEED_CONTEXT with, else — when `model` is given — the process-wide engine for it, which
 * is then set on the element and announced with HAVE_CONTEXT. NULL with `error` set when none can
 * be had; with no model and nothing found, `error` stays NULL. */
GepardEngine *gst_gepard_engine_acquire (GstElement *element, const char *model, const char *device,
                                         GepardEngine **slot, GError **error);

/* gst_gepard_engine_acquire; where it finds nothing and no model is named, the engine of the
 * default model (gepard_hub_default_model: GEPARD_MODEL, else the shipped default voice)
 * where there is one. For elements that need a model of their own, not for one that can wait for
 * its upstream's. */
GepardEngine *gst_gepard_engine_acquire_or_default (GstElement *element, const char *model,
                                                    const char *device, GepardEngine **slot,
                                                    GError **error);

G_END_DECLS
