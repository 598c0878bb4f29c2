/* gepard-metrics.h: the counters behind GET /metrics, in the Prometheus text format.
 *
 * Updated and read on the main loop only; the numbers other threads own (the engine's, live
 * pipelines) are read when the page is rendered. */
#pragma once

#include "gepard-engine-pool.h"

G_BEGIN_DECLS

typedef struct _GepardMetrics GepardMetrics;

GepardMetrics *gepard_metrics_new (void);
void gepard_metrics_free (GepardMetrics *metrics);

/* One finished HTTP request (a WebSocket counts once, at its upgrade). */
void gepard_metrics_count_request (GepardMetrics *metrics, const char *route, guint status);
void gepard_metrics_context_started (GepardMetrics *metrics);
void gepard_metrics_context_ended (GepardMetrics *metrics, const char *outcome);
guint gepard_metrics_get_active_contexts (GepardMetrics *metrics);
void gepard_metrics_websocket_opened (GepardMetrics *metrics);
void gepard_metrics_websocket_closed (GepardMetrics *metrics);
/* seconds from a context's first text to its first audio */
void gepard_metrics_observe_first_audio (GepardMetrics *metrics, double seconds);

/* The page; `engines` may be NULL while they load. */
char *gepard_metrics_render (GepardMetrics *metrics, GepardEnginePool *engines, gboolean ready);

G_END_DECLS
