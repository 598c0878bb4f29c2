/* gstgepardelements.h: the elements of the gepard plugin and what they share. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

/* One buffer per frame: the frame's 32 channel codes as native-endian gint32, channel i =
 * codebook i / 4, FSQ dimension i % 4 (gepard-model.md §3.6). Frames run at 22050/1024 per
 * second; buffer offsets count frames. */
#define GEPARD_CODES_CAPS                                                                          \
  "audio/x-gepard-codes, channels = (int) 32, framerate = (fraction) 22050/1024"
#define GEPARD_CODES_CHANNELS 32

/* Text on the way to gepardlm: one buffer per sentence, UTF-8. */
#define GEPARD_TEXT_CAPS "text/x-raw, format = (string) utf8"

GST_ELEMENT_REGISTER_DECLARE (gepardtextsrc);
GST_ELEMENT_REGISTER_DECLARE (gepardlm);
GST_ELEMENT_REGISTER_DECLARE (gepardcodec);
GST_ELEMENT_REGISTER_DECLARE (gepardvoiceenc);

G_END_DECLS
