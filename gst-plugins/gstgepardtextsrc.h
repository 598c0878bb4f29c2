/* gstgepardtextsrc.h: gepardtextsrc, the text source: one buffer per sentence. */
#pragma once

#include <gst/base/gstpushsrc.h>

G_BEGIN_DECLS

#define GST_TYPE_GEPARD_TEXT_SRC (gst_gepard_text_src_get_type ())
G_DECLARE_FINAL_TYPE (GstGepardTextSrc, gst_gepard_text_src, GST, GEPARD_TEXT_SRC, GstPushSrc)

G_END_DECLS
