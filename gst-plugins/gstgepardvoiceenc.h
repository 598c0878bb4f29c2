/* gstgepardvoiceenc.h: the speaker encoder: a reference clip in, its speaker prefix out. */
#pragma once

#include <gst/gst.h>

G_BEGIN_DECLS

/* One buffer holding a speaker prefix file's bytes: little-endian fp32 [rows][hidden]
 * (gepard-voice.h; gepard-model.md §3.7). */
#define GEPARD_VOICE_CAPS "application/x-gepard-voice"

#define GST_TYPE_GEPARD_VOICE_ENC (gst_gepard_voice_enc_get_type ())
G_DECLARE_FINAL_TYPE (GstGepardVoiceEnc, gst_gepard_voice_enc, GST, GEPARD_VOICE_ENC, GstElement)

G_END_DECLS
