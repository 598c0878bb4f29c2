/* gstgepard.c: the gepard plugin: text source, language model, codec and speaker encoder. */
#include "gstgepardelements.h"

GST_DEBUG_CATEGORY (gst_gepard_engine_debug);

static gboolean
plugin_init (GstPlugin *plugin)
{
  gboolean ok = FALSE;
  GST_DEBUG_CATEGORY_INIT (gst_gepard_engine_debug, "gepardengine", 0,
                           "GEPARD engine sharing between elements");
  ok |= GST_ELEMENT_REGISTER (gepardtextsrc, plugin);
  ok |= GST_ELEMENT_REGISTER (gepardlm, plugin);
  ok |= GST_ELEMENT_REGISTER (gepardcodec, plugin);
  ok |= GST_ELEMENT_REGISTER (gepardvoiceenc, plugin);
  return ok;
}

GST_PLUGIN_DEFINE (GST_VERSION_MAJOR, GST_VERSION_MINOR, gepard,
                   "Gepard streaming text-to-speech: GEPARD model and NanoCodec", plugin_init,
                   VERSION, "Apache-2.0", "Gepard", "https://gepard.invalid")
