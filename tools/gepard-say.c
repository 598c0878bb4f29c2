/* gepard-say: offline synthesis from the command line, built on Gepard's GStreamer elements.
 *
 *   gepard-say --model DIR "Some text."             # plays it on the sound card
 *   gepard-say --model DIR --file chapter.txt -o chapter.flac --rate 24000
 *   echo "Hello." | gepard-say --model DIR -o hello.wav
 *
 * The pipeline is text → gepardtextsrc ! gepardlm ! gepardcodec ! audioconvert ! audioresample !
 * capsfilter ! encoder ! filesink (or the sound card). User values are set on named elements,
 * never spliced into the description. On a terminal a progress line shows sentences done, audio
 * produced and the time left. */
#include "gepard-hub.h"
#include "gepard-sentences.h"

#include <gio/gio.h>
#include <gst/gst.h>
#include <locale.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

typedef struct
{
  GMainLoop *loop;
  int status;
  guint total_sentences;
  gint sentences_started; /* atomic: sentences that reached gepardlm */
  guint64 samples;        /* audio samples out of gepardcodec, under `lock` */
  GMutex lock;
  gint64 start_time;
  gboolean progress;
} Say;

static const char *
encoder_for (const char *path)
{
  if (path == NULL)
    return "autoaudiosink";
  if (g_str_has_suffix (path, ".wav"))
    return "wavenc ! filesink name=sink";
  if (g_str_has_suffix (path, ".flac"))
    return "flacenc ! filesink name=sink";
  if (g_str_has_suffix (path, ".ogg") || g_str_has_suffix (path, ".oga"))
    return "vorbisenc ! oggmux ! filesink name=sink";
  return NULL;
}

static GstPadProbeReturn
count_sentence (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  Say *say = user_data;
  g_atomic_int_inc (&say->sentences_started);
  return GST_PAD_PROBE_OK;
}

static GstPadProbeReturn
count_samples (GstPad *pad, GstPadProbeInfo *info, gpointer user_data)
{
  Say *say = user_data;
  GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER (info);
  g_mutex_lock (&say->lock);
  say->samples += gst_buffer_get_size (buffer) / sizeof (float);
  g_mutex_unlock (&say->lock);
  return GST_PAD_PROBE_OK;
}

static void
print_progress (Say *say, gboolean final)
{
  g_mutex_lock (&say->lock);
  double audio = say->samples / 22050.0;
  g_mutex_unlock (&say->lock);
  guint started = (guint)g_atomic_int_get (&say->sentences_started);
  /* a sentence is done once the next one has started (or at the end) */
  guint done = final ? say->total_sentences : (started > 0 ? started - 1 : 0);
  double elapsed = (g_get_monotonic_time () - say->start_time) / 1e6;
  double fraction = say->total_sentences > 0 ? (double)done / say->total_sentences : 1.0;
  int width = 24, filled = (int)(fraction * width);
  g_autofree char *eta
      = done > 0 && !final
            ? g_strdup_printf ("%.0f s left", elapsed / done * (say->total_sentences - done))
            : g_strdup (final ? "done" : "…");
  g_printerr ("\r[%.*s%*s] %u/%u sentences, %.1f s of audio in %.1f s, %s   ", filled,
              "########################", width - filled, "", done, say->total_sentences, audio,
              elapsed, eta);
  if (final)
    g_printerr ("\n");
}

static gboolean
on_tick (gpointer user_data)
{
  print_progress (user_data, FALSE);
  return G_SOURCE_CONTINUE;
}

static gboolean
on_bus (GstBus *bus, GstMessage *message, gpointer user_data)
{
  Say *say = user_data;
  switch (GST_MESSAGE_TYPE (message))
    {
    case GST_MESSAGE_EOS:
      g_main_loop_quit (say->loop);
      break;
    case GST_MESSAGE_ERROR:
      {
        g_autoptr (GError) error = NULL;
        g_autofree char *debug = NULL;
        gst_message_parse_error (message, &error, &debug);
        if (say->progress)
          g_printerr ("\n");
        g_printerr ("gepard-say: %s\n", error->message);
        say->status = 1;
        g_main_loop_quit (say->loop);
        break;
      }
    default:
      break;
    }
  return G_SOURCE_CONTINUE;
}

static char *
read_stdin (GError **error)
{
  GString *text = g_string_new (NULL);
  char chunk[65536];
  size_t n;
  while ((n = fread (chunk, 1, sizeof chunk, stdin)) > 0)
    g_string_append_len (text, chunk, n);
  if (ferror (stdin))
    {
      g_set_error (error, G_IO_ERROR, G_IO_ERROR_FAILED, "cannot read standard input");
      g_string_free (text, TRUE);
      return NULL;
    }
  return g_string_free (text, FALSE);
}

int
main (int argc, char **argv)
{
  g_autofree char *model = NULL, *voice = NULL, *device = NULL, *output = NULL, *file = NULL;
  int rate = 0, max_frames = 2000;
  gint64 seed = 0;
  gboolean quiet = FALSE;
  g_auto (GStrv) words = NULL;
  setlocale (LC_ALL, "");
  GOptionEntry entries[] = {
      {"model", 'm', 0, G_OPTION_ARG_STRING, &model,
       "Model directory or Hugging Face repo id (default: $GEPARD_MODEL, else the installed "
       "default voice)",
       "MODEL"},
      {"voice", 'v', 0, G_OPTION_ARG_STRING, &voice,
       "default, a voice id, a prefix file or a reference clip", "VOICE"},
      {"device", 'd', 0, G_OPTION_ARG_STRING, &device, "auto (default), cpu, cuda, cuda:N",
       "DEVICE"},
      {"output", 'o', 0, G_OPTION_ARG_FILENAME, &output,
       "Write a .wav, .flac or .ogg file instead of playing", "FILE"},
      {"file", 'f', 0, G_OPTION_ARG_FILENAME, &file, "Read the text from this UTF-8 file", "FILE"},
      {"rate", 'r', 0, G_OPTION_ARG_INT, &rate, "Output sample rate (default 22050)", "HZ"},
      {"max-frames", 0, 0, G_OPTION_ARG_INT, &max_frames, "At most this many frames per sentence",
       "N"},
      {"seed", 's', 0, G_OPTION_ARG_INT64, &seed, "Sampling seed", "N"},
      {"quiet", 'q', 0, G_OPTION_ARG_NONE, &quiet, "No progress line", NULL},
      {G_OPTION_REMAINING, 0, 0, G_OPTION_ARG_STRING_ARRAY, &words, NULL, "[TEXT…]"},
      {NULL},
  };
  g_autoptr (GOptionContext) context
      = g_option_context_new ("[TEXT…] — speak text with Gepard (text, --file or standard input)");
  g_option_context_add_main_entries (context, entries, NULL);
  g_option_context_add_group (context, gst_init_get_option_group ());
  g_autoptr (GError) error = NULL;
  if (!g_option_context_parse (context, &argc, &argv, &error))
    {
      g_printerr ("gepard-say: %s\n", error->message);
      return 2;
    }
  if (model == NULL)
    model = gepard_hub_default_model ();
  if (model == NULL)
    {
      g_printerr ("gepard-say: give --model DIR (or set GEPARD_MODEL); no default model is "
                  "installed\n");
      return 2;
    }
  if (rate != 0 && (rate < 8000 || rate > 192000))
    {
      g_printerr ("gepard-say: --rate must be between 8000 and 192000\n");
      return 2;
    }
  const char *sink = encoder_for (output);
  if (sink == NULL)
    {
      g_printerr ("gepard-say: %s: use a .wav, .flac or .ogg file name\n", output);
      return 2;
    }

  g_autofree char *text = NULL;
  if (words != NULL && words[0] != NULL)
    text = g_strjoinv (" ", words);
  else if (file != NULL && !g_file_get_contents (file, &text, NULL, &error))
    {
      g_printerr ("gepard-say: %s\n", error->message);
      return 1;
    }
  else if (file == NULL && (text = read_stdin (&error)) == NULL)
    {
      g_printerr ("gepard-say: %s\n", error->message);
      return 1;
    }

  g_auto (GStrv) sentences = gepard_sentences_split (text, -1, 400, &error);
  if (sentences == NULL)
    {
      g_printerr ("gepard-say: %s: %s\n", file ? file : "the text", error->message);
      return 1;
    }
  if (sentences[0] == NULL)
    {
      g_printerr ("gepard-say: there is nothing to say\n");
      return 1;
    }

  g_autofree char *description = g_strdup_printf (
      "gepardtextsrc name=text ! gepardlm name=lm ! gepardcodec name=codec ! audioconvert ! "
      "audioresample ! capsfilter name=format ! %s",
      sink);
  /* a missing element can still give a partial pipeline, with the error set */
  GstElement *pipeline = gst_parse_launch (description, &error);
  if (error != NULL)
    {
      g_printerr ("gepard-say: %s (is the gepard plugin on GST_PLUGIN_PATH?)\n", error->message);
      g_clear_object (&pipeline);
      return 1;
    }
  GstElement *src = gst_bin_get_by_name (GST_BIN (pipeline), "text");
  GstElement *lm = gst_bin_get_by_name (GST_BIN (pipeline), "lm");
  GstElement *codec = gst_bin_get_by_name (GST_BIN (pipeline), "codec");
  GstElement *format = gst_bin_get_by_name (GST_BIN (pipeline), "format");
  g_object_set (src, "text", text, NULL);
  g_object_set (lm, "model", model, "max-frames", max_frames, "seed", (guint64)seed, NULL);
  g_object_set (codec, "model", model, NULL);
  if (device != NULL)
    {
      g_object_set (lm, "device", device, NULL);
      g_object_set (codec, "device", device, NULL);
    }
  if (voice != NULL)
    g_object_set (lm, "voice", voice, NULL);
  /* 16-bit PCM for WAV files, what players expect; the encoders and the sound card negotiate */
  GstCaps *caps = gst_caps_new_empty_simple ("audio/x-raw");
  if (rate != 0)
    gst_caps_set_simple (caps, "rate", G_TYPE_INT, rate, NULL);
  if (output != NULL && g_str_has_suffix (output, ".wav"))
    gst_caps_set_simple (caps, "format", G_TYPE_STRING, "S16LE", NULL);
  g_object_set (format, "caps", caps, NULL);
  gst_caps_unref (caps);
  if (output != NULL)
    {
      GstElement *filesink = gst_bin_get_by_name (GST_BIN (pipeline), "sink");
      g_object_set (filesink, "location", output, NULL);
      gst_object_unref (filesink);
    }

  Say say = {0};
  g_mutex_init (&say.lock);
  say.loop = g_main_loop_new (NULL, FALSE);
  say.total_sentences = g_strv_length (sentences);
  say.progress = !quiet && isatty (STDERR_FILENO);
  GstPad *lm_sink = gst_element_get_static_pad (lm, "sink");
  GstPad *codec_src = gst_element_get_static_pad (codec, "src");
  gst_pad_add_probe (lm_sink, GST_PAD_PROBE_TYPE_BUFFER, count_sentence, &say, NULL);
  gst_pad_add_probe (codec_src, GST_PAD_PROBE_TYPE_BUFFER, count_samples, &say, NULL);
  gst_object_unref (lm_sink);
  gst_object_unref (codec_src);
  gst_object_unref (src);
  gst_object_unref (lm);
  gst_object_unref (codec);
  gst_object_unref (format);

  GstBus *bus = gst_element_get_bus (pipeline);
  gst_bus_add_watch (bus, on_bus, &say);
  gst_object_unref (bus);
  guint tick = say.progress ? g_timeout_add (250, on_tick, &say) : 0;
  say.start_time = g_get_monotonic_time ();
  if (gst_element_set_state (pipeline, GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE)
    {
      /* the reason is on the bus already; without one, say so rather than wait */
      GstBus *failed_bus = gst_element_get_bus (pipeline);
      GstMessage *message = gst_bus_pop_filtered (failed_bus, GST_MESSAGE_ERROR);
      if (message != NULL)
        on_bus (failed_bus, message, &say);
      else
        g_printerr ("gepard-say: the pipeline could not start\n");
      g_clear_pointer (&message, gst_message_unref);
      gst_object_unref (failed_bus);
      say.status = 1;
    }
  else
    g_main_loop_run (say.loop);
  if (tick)
    g_source_remove (tick);
  if (say.progress && say.status == 0)
    print_progress (&say, TRUE);
  gst_element_set_state (pipeline, GST_STATE_NULL);

  if (say.status == 0 && !quiet)
    {
      double audio = say.samples / 22050.0;
      double elapsed = (g_get_monotonic_time () - say.start_time) / 1e6;
      g_printerr ("%u sentence%s, %.2f s of audio in %.2f s (real-time factor %.3f)%s%s\n",
                  say.total_sentences, say.total_sentences == 1 ? "" : "s", audio, elapsed,
                  audio > 0 ? elapsed / audio : 0.0, output ? ", written to " : "",
                  output ? output : "");
    }
  gst_object_unref (pipeline);
  g_main_loop_unref (say.loop);
  g_mutex_clear (&say.lock);
  return say.status;
}
