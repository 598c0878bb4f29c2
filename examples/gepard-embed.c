/* gepard-embed.c: the Gepard elements inside an application.
 *
 * One engine for the whole process, handed to every pipeline through a GstContext before the
 * pipeline's first state change; text pushed from the application; audio taken from an appsink
 * as 16 kHz S16 samples. Each sentence's audio arrives while the later ones are still generated.
 *
 *   gepard-embed MODEL "Text to speak." [more text ...]
 *
 * prints one line per audio buffer and the total at the end. */
#include <gst/app/gstappsink.h>
#include <gst/gst.h>

#include "gstgepardcontext.h"

static const char *const description
    = "gepardtextsrc name=text ! gepardlm max-frames=200 ! gepardcodec ! audioconvert "
      "! audioresample ! audio/x-raw,format=S16LE,rate=16000,channels=1 "
      "! appsink name=audio sync=false";

int
main (int argc, char **argv)
{
  GError *error = NULL;

  gst_init (&argc, &argv);
  if (argc < 3)
    {
      g_printerr ("usage: %s MODEL TEXT...\n", argv[0]);
      return 2;
    }

  /* loaded once; every pipeline of the process can share it */
  GepardEngine *engine = gepard_engine_new (argv[1], "auto", NULL, &error);
  if (engine == NULL)
    {
      g_printerr ("cannot load %s: %s\n", argv[1], error->message);
      return 1;
    }

  GstElement *pipeline = gst_parse_launch (description, &error);
  if (pipeline == NULL)
    {
      g_printerr ("%s\n", error->message);
      return 1;
    }
  GstContext *context = gst_gepard_engine_context_new (engine);
  gst_element_set_context (pipeline, context);
  gst_context_unref (context);
  gst_element_set_state (pipeline, GST_STATE_PLAYING);

  /* the application's text, in pieces as an LLM would stream it, then the end of the turn */
  GstElement *text = gst_bin_get_by_name (GST_BIN (pipeline), "text");
  gboolean ok;
  for (int i = 2; i < argc; i++)
    g_signal_emit_by_name (text, "push-text", argv[i], &ok);
  g_signal_emit_by_name (text, "end-of-text", &ok);
  gst_object_unref (text);

  GstElement *sink = gst_bin_get_by_name (GST_BIN (pipeline), "audio");
  guint64 samples = 0;
  GstSample *sample;
  while ((sample = gst_app_sink_pull_sample (GST_APP_SINK (sink))) != NULL)
    {
      GstBuffer *buffer = gst_sample_get_buffer (sample);
      samples += gst_buffer_get_size (buffer) / 2;
      g_print ("audio %" GST_TIME_FORMAT " +%" G_GSIZE_FORMAT " samples\n",
               GST_TIME_ARGS (GST_BUFFER_PTS (buffer)), gst_buffer_get_size (buffer) / 2);
      gst_sample_unref (sample);
    }
  gst_object_unref (sink);

  /* EOS or an error ends the pull loop: say which */
  GstBus *bus = gst_element_get_bus (pipeline);
  GstMessage *message = gst_bus_pop_filtered (bus, GST_MESSAGE_ERROR);
  int status = 0;
  if (message != NULL)
    {
      gst_message_parse_error (message, &error, NULL);
      g_printerr ("error: %s\n", error->message);
      g_clear_error (&error);
      gst_message_unref (message);
      status = 1;
    }
  gst_object_unref (bus);
  g_print ("%" G_GUINT64_FORMAT " samples at 16000 Hz (%.2f s)\n", samples, samples / 16000.0);

  gst_element_set_state (pipeline, GST_STATE_NULL);
  gst_object_unref (pipeline);
  gepard_engine_unref (engine);
  return status;
}
