/* gstgepardcodec.h: gepardcodec, GEPARD frames in, NanoCodec audio out (1024 mono F32 samples
 * at 22050 Hz per frame), decoded incrementally with the codec's causal state. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

#define GST_TYPE_GEPARD_CODEC (gst_gepard_codec_get_type ())
G_DECLARE_FINAL_TYPE (GstGepardCodec, gst_gepard_codec, GST, GEPARD_CODEC, GstElement)

G_END_DECLS
