/* gstgepardtextsrc.c: gepardtextsrc, the text source of a Gepard pipeline. */

/**
 * SECTION:element-gepardtextsrc
 * @title: gepardtextsrc
 *
 * Splits a turn of text into sentences (see gepard-sentences.h for the rules, which work for
 * any script) and pushes one `text/x-raw, format=utf8` buffer per sentence, then EOS at the end
 * of the turn. The sentences go to `gepardlm`, which speaks each one as it arrives.
 *
 * The text comes from one of
 * - the `text` property: a whole turn;
 * - the `location` property: a UTF-8 text file (a leading byte-order mark is skipped);
 * - the application, through action signals, from any thread: `push-text` appends text that
 *   may arrive in arbitrary pieces (word by word, mid-sentence, as an LLM streams it) and each
 *   sentence goes downstream as soon as it is complete; `flush` sends whatever is buffered as a
 *   sentence now, even unfinished (Cartesia's flush); `end-of-text` sends the rest, then EOS.
 *   Text may be pushed before the element starts: it waits. After `end-of-text`, the element
 *   takes text again once it has been set to READY (or NULL) and back.
 *
 * Buffers: one sentence each, UTF-8, trimmed, without a NUL terminator. GST_BUFFER_OFFSET
 * counts sentences from 0 and GST_BUFFER_OFFSET_END is the offset plus one. The source is not
 * live and runs in GST_FORMAT_TIME with an open segment from 0, but text has no time of its
 * own: buffers carry no PTS and no duration (GstBaseSrc stamps DTS 0 on them since the
 * position never moves). gepardlm timestamps the frames it generates from its own sample
 * counter, so it can pass this segment on unchanged. Seeking is not supported.
 *
 * ## Example launch lines
 * |[
 * gst-launch-1.0 gepardtextsrc text="Hello there. How are you?" ! fakesink dump=true
 * gst-launch-1.0 gepardtextsrc location=story.txt ! gepardlm ! gepardcodec ! audioconvert !
 * autoaudiosink
 * ]|
 *
 * ## From an application
 * |[
 * gboolean ok;
 * g_signal_emit_by_name (src, "push-text", "Hello th", &ok);
 * g_signal_emit_by_name (src, "push-text", "ere. How are", &ok);  // "Hello there." goes now
 * g_signal_emit_by_name (src, "end-of-text", &ok);                // "How are", then EOS
 * ]|
 */
#include "gstgepardtextsrc.h"

#include "gepard-sentences.h"
#include "gstgepardelements.h"

#include <string.h>

GST_DEBUG_CATEGORY_STATIC (gst_gepard_text_src_debug);
#define GST_CAT_DEFAULT gst_gepard_text_src_debug

#define DEFAULT_TEXT NULL
#define DEFAULT_LOCATION NULL
#define DEFAULT_MAX_SENTENCE_LENGTH GEPARD_SENTENCES_DEFAULT_MAX_CHARS
#define MAX_MAX_SENTENCE_LENGTH 65536

struct _GstGepardTextSrc
{
  GstPushSrc parent;

  /* properties, under the object lock */
  gchar *text;
  gchar *location;

  /* The turn, under `lock`. Action signals feed the splitter from the application's threads;
   * the sentences it completes wait in `sentences` until the streaming thread takes them in
   * create(), which sleeps on `cond` while there is none. */
  GMutex lock;
  GCond cond;
  guint max_sentence_length;
  GepardSentenceSplitter *splitter; /* NULL until text arrives or the element starts */
  GQueue sentences;                 /* gchar *, oldest first */
  gboolean ended;                   /* end-of-text came: EOS once `sentences` is empty */
  gboolean unlocked;                /* GstBaseSrc::unlock: create() must return at once */
  guint64 offset;                   /* the next buffer's offset: sentences pushed so far */
};

enum
{
  PROP_0,
  PROP_TEXT,
  PROP_LOCATION,
  PROP_MAX_SENTENCE_LENGTH,
};

enum
{
  SIGNAL_PUSH_TEXT,
  SIGNAL_FLUSH,
  SIGNAL_END_OF_TEXT,
  N_SIGNALS
};

static guint signals[N_SIGNALS];

static GstStaticPadTemplate src_template = GST_STATIC_PAD_TEMPLATE (
    "src", GST_PAD_SRC, GST_PAD_ALWAYS, GST_STATIC_CAPS (GEPARD_TEXT_CAPS));

G_DEFINE_TYPE_WITH_CODE (GstGepardTextSrc, gst_gepard_text_src, GST_TYPE_PUSH_SRC,
                         GST_DEBUG_CATEGORY_INIT (gst_gepard_text_src_debug, "gepardtextsrc", 0,
                                                  "Gepard text source"));
GST_ELEMENT_REGISTER_DEFINE (gepardtextsrc, "gepardtextsrc", GST_RANK_NONE,
                             GST_TYPE_GEPARD_TEXT_SRC);

/* Called with `lock` held. */
static void
ensure_splitter (GstGepardTextSrc *self)
{
  if (self->splitter == NULL)
    self->splitter = gepard_sentence_splitter_new (self->max_sentence_length);
}

/* Queues the sentences for the streaming thread and wakes it. Called with `lock` held; takes
 * `sentences`. */
static void
queue_sentences (GstGepardTextSrc *self, GPtrArray *sentences)
{
  for (guint i = 0; i < sentences->len; i++)
    {
      GST_LOG_OBJECT (self, "sentence: %s", (const gchar *)sentences->pdata[i]);
      g_queue_push_tail (&self->sentences, g_steal_pointer (&sentences->pdata[i]));
    }
  if (sentences->len > 0)
    g_cond_broadcast (&self->cond);
  g_ptr_array_unref (sentences);
}

/* Whether the action signals may add text: not when a property supplies the whole turn, so
 * that one turn never mixes two sources. */
static gboolean
takes_pushed_text (GstGepardTextSrc *self, const gchar *signal_name)
{
  gboolean from_property;

  GST_OBJECT_LOCK (self);
  from_property = self->text != NULL || self->location != NULL;
  GST_OBJECT_UNLOCK (self);
  if (from_property)
    GST_WARNING_OBJECT (self, "%s ignored: the text comes from the text or location property",
                        signal_name);
  return !from_property;
}

static gboolean
gst_gepard_text_src_push_text (GstGepardTextSrc *self, const gchar *text, gpointer unused)
{
  g_autoptr (GError) error = NULL;
  GPtrArray *sentences;

  if (text == NULL)
    {
      GST_WARNING_OBJECT (self, "push-text without text");
      return FALSE;
    }
  if (!takes_pushed_text (self, "push-text"))
    return FALSE;

  g_mutex_lock (&self->lock);
  if (self->ended)
    {
      g_mutex_unlock (&self->lock);
      GST_WARNING_OBJECT (self, "push-text after end-of-text ignored: set the element to READY "
                                "and back to start another turn");
      return FALSE;
    }
  ensure_splitter (self);
  sentences = gepard_sentence_splitter_push (self->splitter, text, -1, &error);
  if (sentences != NULL)
    queue_sentences (self, sentences);
  g_mutex_unlock (&self->lock);

  if (sentences == NULL)
    {
      GST_WARNING_OBJECT (self, "push-text ignored, the text is not UTF-8: %s", error->message);
      return FALSE;
    }
  return TRUE;
}

/* Sends what is buffered; with `end`, closes the turn as well. */
static gboolean
finish_text (GstGepardTextSrc *self, gboolean end, const gchar *signal_name)
{
  if (!takes_pushed_text (self, signal_name))
    return FALSE;

  g_mutex_lock (&self->lock);
  if (self->ended)
    {
      g_mutex_unlock (&self->lock);
      GST_WARNING_OBJECT (self, "%s after end-of-text ignored", signal_name);
      return FALSE;
    }
  if (self->splitter != NULL)
    queue_sentences (self, gepard_sentence_splitter_flush (self->splitter));
  if (end)
    {
      GST_DEBUG_OBJECT (self, "end of text");
      self->ended = TRUE;
      g_cond_broadcast (&self->cond);
    }
  g_mutex_unlock (&self->lock);
  return TRUE;
}

static gboolean
gst_gepard_text_src_flush (GstGepardTextSrc *self, gpointer unused)
{
  return finish_text (self, FALSE, "flush");
}

static gboolean
gst_gepard_text_src_end_of_text (GstGepardTextSrc *self, gpointer unused)
{
  return finish_text (self, TRUE, "end-of-text");
}

/* Reads the location file into `*contents`, or posts an error naming the file. */
static gboolean
read_text_file (GstGepardTextSrc *self, const gchar *location, gchar **contents, gsize *length)
{
  g_autoptr (GError) error = NULL;
  const gchar *invalid;

  if (!g_file_get_contents (location, contents, length, &error))
    {
      if (g_error_matches (error, G_FILE_ERROR, G_FILE_ERROR_NOENT))
        GST_ELEMENT_ERROR (
            self, RESOURCE, NOT_FOUND,
            ("Could not find the text file \"%s\": check the location property.", location),
            ("%s", error->message));
      else
        GST_ELEMENT_ERROR (self, RESOURCE, OPEN_READ,
                           ("Could not read the text file \"%s\".", location),
                           ("%s", error->message));
      return FALSE;
    }

  if (!g_utf8_validate (*contents, *length, &invalid))
    {
      GST_ELEMENT_ERROR (self, STREAM, DECODE,
                         ("The text file \"%s\" is not UTF-8: the bytes at offset %" G_GSIZE_FORMAT
                          " are not valid UTF-8 text. Convert the file to UTF-8 (for example with "
                          "iconv) and try again.",
                          location, (gsize)(invalid - *contents)),
                         ("invalid UTF-8 or a NUL byte in %" G_GSIZE_FORMAT " bytes", *length));
      g_clear_pointer (contents, g_free);
      return FALSE;
    }

  /* a byte-order mark is no text to speak */
  if (*length >= 3 && memcmp (*contents, "\xEF\xBB\xBF", 3) == 0)
    {
      memmove (*contents, *contents + 3, *length - 3 + 1);
      *length -= 3;
    }
  return TRUE;
}

static gboolean
gst_gepard_text_src_start (GstBaseSrc *src)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (src);
  g_autofree gchar *text = NULL;
  g_autofree gchar *location = NULL;
  g_autofree gchar *contents = NULL;
  g_autoptr (GError) error = NULL;
  GPtrArray *sentences = NULL;
  gsize length = 0;
  guint n_ready;

  GST_OBJECT_LOCK (self);
  text = g_strdup (self->text);
  location = g_strdup (self->location);
  GST_OBJECT_UNLOCK (self);

  if (text != NULL && location != NULL)
    {
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("Set either the text or the location property of %s, not both.",
                          GST_ELEMENT_NAME (self)),
                         ("text and location are both set"));
      return FALSE;
    }
  if (location != NULL && !read_text_file (self, location, &contents, &length))
    return FALSE;
  if (text != NULL)
    {
      contents = g_steal_pointer (&text);
      length = strlen (contents);
    }

  g_mutex_lock (&self->lock);
  self->unlocked = FALSE;
  self->offset = 0;
  ensure_splitter (self);
  if (contents != NULL)
    {
      if (self->ended || !g_queue_is_empty (&self->sentences)
          || !gepard_sentence_splitter_is_empty (self->splitter))
        GST_WARNING_OBJECT (self, "dropping pushed text: the text comes from the %s property",
                            location != NULL ? "location" : "text");
      g_queue_clear_full (&self->sentences, g_free);
      gepard_sentence_splitter_reset (self->splitter);
      sentences = gepard_sentence_splitter_push (self->splitter, contents, length, &error);
      if (sentences != NULL)
        {
          queue_sentences (self, sentences);
          queue_sentences (self, gepard_sentence_splitter_flush (self->splitter));
          self->ended = TRUE;
        }
    }
  n_ready = g_queue_get_length (&self->sentences);
  g_mutex_unlock (&self->lock);

  if (contents != NULL && sentences == NULL)
    {
      /* the location file was checked already: this is the text property */
      GST_ELEMENT_ERROR (self, RESOURCE, SETTINGS,
                         ("The text property of %s is not UTF-8 text.", GST_ELEMENT_NAME (self)),
                         ("%s", error->message));
      return FALSE;
    }
  GST_DEBUG_OBJECT (self, "started, %u sentences ready", n_ready);
  return TRUE;
}

static gboolean
gst_gepard_text_src_stop (GstBaseSrc *src)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (src);

  g_mutex_lock (&self->lock);
  g_clear_pointer (&self->splitter, gepard_sentence_splitter_free);
  g_queue_clear_full (&self->sentences, g_free);
  self->ended = FALSE;
  self->offset = 0;
  g_mutex_unlock (&self->lock);
  return TRUE;
}

/* Flushing seeks and PAUSED→READY call this from another thread while create() may sleep. */
static gboolean
gst_gepard_text_src_unlock (GstBaseSrc *src)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (src);

  g_mutex_lock (&self->lock);
  self->unlocked = TRUE;
  g_cond_broadcast (&self->cond);
  g_mutex_unlock (&self->lock);
  return TRUE;
}

static gboolean
gst_gepard_text_src_unlock_stop (GstBaseSrc *src)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (src);

  g_mutex_lock (&self->lock);
  self->unlocked = FALSE;
  g_mutex_unlock (&self->lock);
  return TRUE;
}

static gboolean
gst_gepard_text_src_is_seekable (GstBaseSrc *src)
{
  return FALSE;
}

static GstFlowReturn
gst_gepard_text_src_create (GstPushSrc *src, GstBuffer **buf)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (src);
  GstBuffer *buffer;
  gchar *sentence;
  guint64 offset;

  g_mutex_lock (&self->lock);
  while (!self->unlocked && !self->ended && g_queue_is_empty (&self->sentences))
    g_cond_wait (&self->cond, &self->lock);
  if (self->unlocked)
    {
      g_mutex_unlock (&self->lock);
      GST_DEBUG_OBJECT (self, "unlocked while waiting for text");
      return GST_FLOW_FLUSHING;
    }
  sentence = g_queue_pop_head (&self->sentences);
  if (sentence == NULL)
    {
      g_mutex_unlock (&self->lock);
      GST_DEBUG_OBJECT (self, "end of the turn");
      return GST_FLOW_EOS;
    }
  offset = self->offset++;
  g_mutex_unlock (&self->lock);

  GST_DEBUG_OBJECT (self, "sentence %" G_GUINT64_FORMAT ": %s", offset, sentence);
  buffer = gst_buffer_new_wrapped (sentence, strlen (sentence));
  GST_BUFFER_OFFSET (buffer) = offset;
  GST_BUFFER_OFFSET_END (buffer) = offset + 1;
  *buf = buffer;
  return GST_FLOW_OK;
}

/* text and location are read in start(): changing them later would not take effect. */
static gboolean
check_mutable (GstGepardTextSrc *self, GParamSpec *pspec)
{
  gboolean started;

  GST_OBJECT_LOCK (self);
  started = GST_STATE (self) > GST_STATE_READY;
  GST_OBJECT_UNLOCK (self);
  if (started)
    GST_WARNING_OBJECT (self, "%s can only be changed in the NULL or READY state",
                        g_param_spec_get_name (pspec));
  return !started;
}

static void
gst_gepard_text_src_set_property (GObject *object, guint prop_id, const GValue *value,
                                  GParamSpec *pspec)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (object);

  switch (prop_id)
    {
    case PROP_TEXT:
      if (!check_mutable (self, pspec))
        return;
      GST_OBJECT_LOCK (self);
      g_free (self->text);
      self->text = g_value_dup_string (value);
      GST_OBJECT_UNLOCK (self);
      break;
    case PROP_LOCATION:
      if (!check_mutable (self, pspec))
        return;
      GST_OBJECT_LOCK (self);
      g_free (self->location);
      self->location = g_value_dup_string (value);
      GST_OBJECT_UNLOCK (self);
      break;
    case PROP_MAX_SENTENCE_LENGTH:
      g_mutex_lock (&self->lock);
      self->max_sentence_length = g_value_get_uint (value);
      if (self->splitter != NULL)
        gepard_sentence_splitter_set_max_chars (self->splitter, self->max_sentence_length);
      g_mutex_unlock (&self->lock);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
}

static void
gst_gepard_text_src_get_property (GObject *object, guint prop_id, GValue *value, GParamSpec *pspec)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (object);

  switch (prop_id)
    {
    case PROP_TEXT:
      GST_OBJECT_LOCK (self);
      g_value_set_string (value, self->text);
      GST_OBJECT_UNLOCK (self);
      break;
    case PROP_LOCATION:
      GST_OBJECT_LOCK (self);
      g_value_set_string (value, self->location);
      GST_OBJECT_UNLOCK (self);
      break;
    case PROP_MAX_SENTENCE_LENGTH:
      g_mutex_lock (&self->lock);
      g_value_set_uint (value, self->max_sentence_length);
      g_mutex_unlock (&self->lock);
      break;
    default:
      G_OBJECT_WARN_INVALID_PROPERTY_ID (object, prop_id, pspec);
      break;
    }
}

static void
gst_gepard_text_src_finalize (GObject *object)
{
  GstGepardTextSrc *self = GST_GEPARD_TEXT_SRC (object);

  g_free (self->text);
  g_free (self->location);
  /* text pushed while the element never started */
  gepard_sentence_splitter_free (self->splitter);
  g_queue_clear_full (&self->sentences, g_free);
  g_mutex_clear (&self->lock);
  g_cond_clear (&self->cond);

  G_OBJECT_CLASS (gst_gepard_text_src_parent_class)->finalize (object);
}

static void
gst_gepard_text_src_class_init (GstGepardTextSrcClass *klass)
{
  GObjectClass *gobject_class = G_OBJECT_CLASS (klass);
  GstElementClass *element_class = GST_ELEMENT_CLASS (klass);
  GstBaseSrcClass *basesrc_class = GST_BASE_SRC_CLASS (klass);
  GstPushSrcClass *pushsrc_class = GST_PUSH_SRC_CLASS (klass);

  gobject_class->set_property = gst_gepard_text_src_set_property;
  gobject_class->get_property = gst_gepard_text_src_get_property;
  gobject_class->finalize = gst_gepard_text_src_finalize;

  g_object_class_install_property (
      gobject_class, PROP_TEXT,
      g_param_spec_string ("text", "Text",
                           "A whole turn of text to speak, split into sentences; EOS follows the "
                           "last one. Leave unset to use location or the push-text signal",
                           DEFAULT_TEXT,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_LOCATION,
      g_param_spec_string ("location", "File location",
                           "A UTF-8 text file to speak as one turn, split into sentences; EOS "
                           "follows the last one. Cannot be combined with text",
                           DEFAULT_LOCATION,
                           G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_READY));
  g_object_class_install_property (
      gobject_class, PROP_MAX_SENTENCE_LENGTH,
      g_param_spec_uint ("max-sentence-length", "Maximum sentence length",
                         "Longest sentence in characters: text that runs on without a sentence "
                         "end is cut at its last comma or space before this length, so that a "
                         "runaway input cannot stall the pipeline",
                         GEPARD_SENTENCES_MIN_MAX_CHARS, MAX_MAX_SENTENCE_LENGTH,
                         DEFAULT_MAX_SENTENCE_LENGTH,
                         G_PARAM_READWRITE | G_PARAM_STATIC_STRINGS | GST_PARAM_MUTABLE_PLAYING));

  /**
   * GstGepardTextSrc::push-text:
   * @src: the element
   * @text: UTF-8 text to append to the turn, any piece of it
   *
   * Appends @text to the current turn; every sentence it completes goes downstream at once.
   * Thread-safe.
   *
   * Returns: %TRUE, or %FALSE when @text is not UTF-8, the turn has ended, or a property
   * supplies the text.
   */
  signals[SIGNAL_PUSH_TEXT] = g_signal_new_class_handler (
      "push-text", G_TYPE_FROM_CLASS (klass), G_SIGNAL_RUN_LAST | G_SIGNAL_ACTION,
      G_CALLBACK (gst_gepard_text_src_push_text), NULL, NULL, NULL, G_TYPE_BOOLEAN, 1,
      G_TYPE_STRING);
  /**
   * GstGepardTextSrc::flush:
   * @src: the element
   *
   * Sends whatever text is buffered as a sentence now, even if it is unfinished. Thread-safe.
   *
   * Returns: %TRUE, or %FALSE when the turn has ended or a property supplies the text.
   */
  signals[SIGNAL_FLUSH] = g_signal_new_class_handler (
      "flush", G_TYPE_FROM_CLASS (klass), G_SIGNAL_RUN_LAST | G_SIGNAL_ACTION,
      G_CALLBACK (gst_gepard_text_src_flush), NULL, NULL, NULL, G_TYPE_BOOLEAN, 0);
  /**
   * GstGepardTextSrc::end-of-text:
   * @src: the element
   *
   * Ends the turn: sends the buffered text as a last sentence, then EOS. Thread-safe.
   *
   * Returns: %TRUE, or %FALSE when the turn has ended already or a property supplies the text.
   */
  signals[SIGNAL_END_OF_TEXT] = g_signal_new_class_handler (
      "end-of-text", G_TYPE_FROM_CLASS (klass), G_SIGNAL_RUN_LAST | G_SIGNAL_ACTION,
      G_CALLBACK (gst_gepard_text_src_end_of_text), NULL, NULL, NULL, G_TYPE_BOOLEAN, 0);

  gst_element_class_add_static_pad_template (element_class, &src_template);
  gst_element_class_set_static_metadata (
      element_class, "Gepard text source", "Source/Text",
      "Splits text into sentences, one UTF-8 buffer each, for gepardlm: from the text or "
      "location property, or streamed in by the application with the push-text, flush and "
      "end-of-text action signals",
      "Gepard");

  basesrc_class->start = GST_DEBUG_FUNCPTR (gst_gepard_text_src_start);
  basesrc_class->stop = GST_DEBUG_FUNCPTR (gst_gepard_text_src_stop);
  basesrc_class->unlock = GST_DEBUG_FUNCPTR (gst_gepard_text_src_unlock);
  basesrc_class->unlock_stop = GST_DEBUG_FUNCPTR (gst_gepard_text_src_unlock_stop);
  basesrc_class->is_seekable = GST_DEBUG_FUNCPTR (gst_gepard_text_src_is_seekable);
  pushsrc_class->create = GST_DEBUG_FUNCPTR (gst_gepard_text_src_create);
}

static void
gst_gepard_text_src_init (GstGepardTextSrc *self)
{
  g_mutex_init (&self->lock);
  g_cond_init (&self->cond);
  g_queue_init (&self->sentences);
  self->max_sentence_length = DEFAULT_MAX_SENTENCE_LENGTH;

  gst_base_src_set_live (GST_BASE_SRC (self), FALSE);
  gst_base_src_set_format (GST_BASE_SRC (self), GST_FORMAT_TIME);
}
