/* gstgepardvoiceload.h: resolving a voice= property value to a speaker prefix.
 *
 * A value names the voice in one of three forms:
 *   - NULL, "" or "default": the model's own voice, with no prefix (gepard-model.md §3.2);
 *   - the id of a voice registered with the engine (the server registers what it loads from its
 *     voice store);
 *   - the path of a file: a speaker prefix file (raw little-endian fp32 [queries][H],
 *     gepard-voice.h) when its size is exactly a prefix's and it does not start like an audio
 *     container, otherwise a reference clip in any format GStreamer decodes, at most
 *     GST_GEPARD_VOICE_MAX_CLIP_SECONDS long, cloned through the engine's codec and compressor.
 *     The id of a file voice is its path.
 */
#pragma once

#include <gepard-voice.h>
#include <gst/gst.h>

G_BEGIN_DECLS

/* longest reference clip gst_gepard_voice_load decodes */
#define GST_GEPARD_VOICE_MAX_CLIP_SECONDS 60

/* Runs synchronously: a clip is decoded through a private pipeline on the calling thread, so call
 * it from a state change or the application, never from a streaming thread.
 *
 * Errors: GST_RESOURCE_ERROR_NOT_FOUND when the value is none of the three forms;
 * GST_RESOURCE_ERROR_OPEN_READ for an unreadable file; GStreamer's own stream or core error when
 * the file does not decode to audio; GST_STREAM_ERROR_FORMAT for a clip too long or empty;
 * GST_RESOURCE_ERROR_BUSY when decoding times out; and the errors of
 * gepard_voice_load_prefix_file and gepard_voice_new_from_audio. */
GepardVoice *gst_gepard_voice_load (GepardEngine *engine, const char *voice, GError **error);

G_END_DECLS
