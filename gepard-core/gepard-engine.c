/* gepard-engine.c: the shared engine and its continuous-batching scheduler. */
#include "gepard-engine.h"

#include "gepard-backend.h"
#include "gepard-compute.h"
#include "gepard-error.h"
#include "gepard-fsq.h"
#include "gepard-hub.h"
#include "gepard-voice.h"

#include <math.h>
#include <string.h>

G_DEFINE_QUARK (gepard - engine - error - quark, gepard_engine_error)

struct _GepardUtterance
{
  gatomicrefcount ref_count;
  GepardEngine *engine;
  gint cancelled; /* atomic */

  GArray *layout; /* gint32 ids after the text-repetition layout */
  float *prefix;  /* [n_prefix, H] or NULL */
  int n_prefix;
  GepardSampling sampling;
  GepardUtteranceCallbacks callbacks;
  gpointer user_data;
  GDestroyNotify destroy;

  /* scheduler thread only */
  GepardSequence *sequence;      /* from its prefill to its end */
  GepardSequence *unconditional; /* text-CFG's branch over the empty text (§3.4), likewise */
  gint32 last_codes[GEPARD_MAX_AUDIO_HEADS];
  int n_frames;
  gboolean ended;
  gboolean fault; /* its text holds the injected fault's marker: the first step fails it */
  GError *error;  /* why it FAILED */
};

struct _GepardEngine
{
  gatomicrefcount ref_count;
  char *registry_key; /* NULL unless shared */
  GepardEngineOptions options;
  GepardCheckpoint *checkpoint;
  GepardModel *model;
  GepardCodec *codec;
  GepardDeviceInfo device;
  GepardCompute *compute;

  GMutex lock;
  GCond wake;
  GCond decoded;      /* a decode job finished */
  GQueue decode_jobs; /* DecodeJob*, owned by the waiting callers */
  GQueue waiting;     /* GepardUtterance*, owned references */
  GPtrArray *running; /* GepardUtterance*, owned references; scheduler thread only */
  gboolean stopping;
  gboolean free_on_exit; /* the last reference went on the scheduler thread itself */
  GepardEngineStats stats;
  GThread *scheduler;

  /* options.decode_alongside: the thread that decodes a batch of jobs the scheduler hands it
   * (decoder_batch, NULL while it has none) while the scheduler runs a step */
  GThread *decoder;
  GMutex decoder_lock;
  GCond decoder_cond;
  GPtrArray *decoder_batch;
  gboolean decoder_quit;
  int lead; /* scheduler thread only: steps run since decoder_batch was handed */

  GMutex voices_lock;
  GHashTable *voices; /* id → GepardVoice* */

  char *fault_text; /* GEPARD_FAULT_FAIL_STREAM_TEXT, or NULL */
  float cfg_scale;  /* gepard_engine_get_cfg_scale */
};

/* ---- utterances ---- */

GepardUtterance *
gepard_utterance_ref (GepardUtterance *utterance)
{
  g_atomic_ref_count_inc (&utterance->ref_count);
  return utterance;
}

void
gepard_utterance_unref (GepardUtterance *utterance)
{
  if (utterance == NULL || !g_atomic_ref_count_dec (&utterance->ref_count))
    return;
  g_array_unref (utterance->layout);
  g_free (utterance->prefix);
  g_clear_error (&utterance->error);
  GepardCompute *compute = utterance->engine->compute;
  if (utterance->sequence != NULL)
    compute->funcs->sequence_free (compute, utterance->sequence);
  if (utterance->unconditional != NULL)
    compute->funcs->sequence_free (compute, utterance->unconditional);
  if (utterance->destroy != NULL)
    utterance->destroy (utterance->user_data);
  gepard_engine_unref (utterance->engine);
  g_free (utterance);
}

void
gepard_utterance_cancel (GepardUtterance *utterance)
{
  g_atomic_int_set (&utterance->cancelled, TRUE);
  GepardEngine *engine = utterance->engine;
  g_mutex_lock (&engine->lock);
  g_cond_signal (&engine->wake);
  g_mutex_unlock (&engine->lock);
}

const GError *
gepard_utterance_get_error (GepardUtterance *utterance)
{
  return utterance->error;
}

static void
utterance_end (GepardUtterance *utterance, GepardUtteranceEnd end)
{
  if (utterance->ended)
    return;
  utterance->ended = TRUE;
  /* the cache is the expensive part: give it back now, not when the last reference goes */
  GepardCompute *compute = utterance->engine->compute;
  if (utterance->sequence != NULL)
    compute->funcs->sequence_free (compute, g_steal_pointer (&utterance->sequence));
  if (utterance->unconditional != NULL)
    compute->funcs->sequence_free (compute, g_steal_pointer (&utterance->unconditional));
  if (utterance->callbacks.done != NULL)
    utterance->callbacks.done (utterance, end, utterance->n_frames, utterance->user_data);
}

/* Ends the utterance with FAILED and a copy of `error`. */
static void
utterance_fail (GepardUtterance *utterance, const GError *error)
{
  if (utterance->ended)
    return;
  g_clear_error (&utterance->error);
  utterance->error = g_error_copy (error);
  utterance_end (utterance, GEPARD_UTTERANCE_FAILED);
}

/* ---- the scheduler ---- */

static gboolean
uses_cfg (const GepardUtterance *utterance)
{
  return utterance->sampling.cfg_scale != 1.0f;
}

/* the sequences an utterance runs in each step: two with text-CFG */
static int
sequences_of (const GepardUtterance *utterance)
{
  return uses_cfg (utterance) ? 2 : 1;
}

static guint
sequences_in (GPtrArray *utterances)
{
  guint n = 0;
  for (guint i = 0; i < utterances->len; i++)
    n += sequences_of (g_ptr_array_index (utterances, i));
  return n;
}

/* One iteration: a forward over the admitted prefills and the running decodes, then a frame (or
 * the end) for each. */
static void
run_step (GepardEngine *engine, GPtrArray *admitted)
{
  const GepardModelConfig *c = gepard_model_get_config (engine->model);
  GepardCompute *compute = engine->compute;
  GPtrArray *running = engine->running;
  g_autoptr (GPtrArray) batch = g_ptr_array_new ();

  for (guint i = 0; i < admitted->len; i++)
    {
      GepardUtterance *u = g_ptr_array_index (admitted, i);
      g_autoptr (GError) error = NULL;
      if (u->fault)
        {
          /* the injected fault: this utterance's step fails, the others' goes on */
          error = g_error_new (GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_FAULT,
                               "Injected fault: the text contains \"%s\"", engine->fault_text);
          utterance_fail (u, error);
          continue;
        }
      u->sequence = compute->funcs->sequence_new (compute, &u->sampling, &error);
      if (u->sequence != NULL && uses_cfg (u))
        u->unconditional = compute->funcs->sequence_new (compute, &u->sampling, &error);
      if (u->sequence == NULL || (uses_cfg (u) && u->unconditional == NULL))
        {
          /* no room on the device: this one ends, the others go on */
          g_warning ("Gepard cannot start an utterance: %s", error->message);
          utterance_fail (u, error);
          continue;
        }
      g_ptr_array_add (batch, u);
    }
  int n_prefills = batch->len;
  for (guint i = 0; i < running->len; i++)
    g_ptr_array_add (batch, g_ptr_array_index (running, i));
  int n = batch->len;
  if (n == 0)
    return;

  /* each utterance's input, and with text-CFG its unconditional branch's right after it */
  int n_inputs = sequences_in (batch);
  const gint32 empty_text[3] = {c->start_of_text, c->end_of_text, c->start_of_speech};
  g_autofree GepardStepInput *inputs = g_new0 (GepardStepInput, n_inputs);
  g_autofree int *input_of = g_new (int, n);
  g_autofree gint32 *codes = g_new (gint32, (gsize)n_inputs * c->n_audio_heads);
  g_autofree float *stops = g_new (float, n_inputs);
  for (int k = 0, j = 0; k < n; k++)
    {
      GepardUtterance *u = g_ptr_array_index (batch, k);
      GepardStepInput *in = &inputs[j];
      input_of[k] = j;
      in->sequence = u->sequence;
      if (k < n_prefills)
        {
          /* prefill: [prefix | layout ids] (§3.3); ids were checked at submit */
          in->prefix = u->prefix;
          in->n_prefix = u->n_prefix;
          in->ids = (const gint32 *)u->layout->data;
          in->n_ids = u->layout->len;
        }
      else
        in->codes = u->last_codes;
      j++;
      if (uses_cfg (u))
        {
          in->guided = TRUE;
          in->cfg_scale = u->sampling.cfg_scale;
          inputs[j] = *in;
          inputs[j].sequence = u->unconditional;
          inputs[j].guided = FALSE;
          inputs[j].unconditional = TRUE;
          if (k < n_prefills)
            {
              inputs[j].ids = empty_text;
              inputs[j].n_ids = G_N_ELEMENTS (empty_text);
            }
          j++;
        }
    }

  g_autoptr (GError) error = NULL;
  if (!compute->funcs->step (compute, inputs, n_inputs, codes, stops, &error))
    {
      /* a backend failure ends what was in the step rather than the process */
      g_warning ("Gepard engine step failed: %s", error->message);
      for (int k = 0; k < n; k++)
        utterance_fail (g_ptr_array_index (batch, k), error);
      return;
    }

  guint64 frames = 0;
  for (int k = 0; k < n; k++)
    {
      GepardUtterance *u = g_ptr_array_index (batch, k);
      if (g_atomic_int_get (&u->cancelled))
        {
          utterance_end (u, GEPARD_UTTERANCE_CANCELLED);
          continue;
        }
      /* §3.4: no stop check before the first frame; with CFG, the text's branch decides */
      int j = input_of[k];
      if (u->n_frames > 0 && !u->sampling.ignore_stop && gepard_stop_decision (stops[j]))
        {
          utterance_end (u, GEPARD_UTTERANCE_STOPPED);
          continue;
        }
      memcpy (u->last_codes, codes + (gsize)j * c->n_audio_heads,
              sizeof (gint32) * c->n_audio_heads);
      if (u->callbacks.frame != NULL)
        u->callbacks.frame (u, u->last_codes, u->n_frames, u->user_data);
      u->n_frames++;
      frames++;
      if (u->n_frames >= u->sampling.max_frames)
        utterance_end (u, GEPARD_UTTERANCE_MAX_FRAMES);
    }

  g_mutex_lock (&engine->lock);
  engine->stats.steps++;
  engine->stats.frames += frames;
  engine->stats.running = n;
  g_mutex_unlock (&engine->lock);
}

/* ---- the codec service ---- */

struct _GepardAudioDecoder
{
  GepardEngine *engine;
  GepardAudioStream *stream; /* created by the scheduler on the first decode */
  gboolean reset;            /* the stream starts over at the next decode; under engine->lock */
};

/* One blocked gepard_audio_decoder_decode call, on its caller's stack. */
typedef struct
{
  GepardAudioDecoder *decoder;
  const gint32 *codes;
  int n_frames;
  float *samples;
  gboolean done;
  GError *error;
} DecodeJob;

/* Scheduler thread: every job queued by now (NULL when none), each decoder's reset applied. */
static GPtrArray *
take_decode_jobs (GepardEngine *engine)
{
  GepardCompute *compute = engine->compute;
  GPtrArray *jobs = NULL;
  DecodeJob *job;

  g_mutex_lock (&engine->lock);
  while ((job = g_queue_pop_head (&engine->decode_jobs)) != NULL)
    {
      if (job->decoder->reset && job->decoder->stream != NULL)
        compute->funcs->audio_stream_reset (compute, job->decoder->stream);
      job->decoder->reset = FALSE;
      if (jobs == NULL)
        jobs = g_ptr_array_new ();
      g_ptr_array_add (jobs, job);
    }
  g_mutex_unlock (&engine->lock);
  return jobs;
}

/* The jobs in one batched decode, then wakes their callers; `alongside`: beside a step. */
static void
decode_jobs (GepardEngine *engine, GPtrArray *jobs, gboolean alongside)
{
  GepardCompute *compute = engine->compute;
  GError *error = NULL;
  DecodeJob *job;

  int n = jobs->len;
  g_autofree GepardAudioStream **streams = g_new (GepardAudioStream *, n);
  g_autofree const gint32 **codes = g_new (const gint32 *, n);
  g_autofree int *n_frames = g_new (int, n);
  g_autofree float **samples = g_new (float *, n);
  guint64 frames = 0;
  for (int i = 0; i < n && error == NULL; i++)
    {
      job = g_ptr_array_index (jobs, i);
      if (job->decoder->stream == NULL)
        job->decoder->stream = compute->funcs->audio_stream_new (compute, &error);
      streams[i] = job->decoder->stream;
      codes[i] = job->codes;
      n_frames[i] = job->n_frames;
      samples[i] = job->samples;
      frames += job->n_frames;
    }
  if (error == NULL)
    compute->funcs->decode_audio (compute, streams, codes, n_frames, samples, n, &error);

  g_mutex_lock (&engine->lock);
  for (int i = 0; i < n; i++)
    {
      job = g_ptr_array_index (jobs, i);
      job->done = TRUE;
      if (error != NULL)
        job->error = g_error_copy (error);
    }
  engine->stats.decode_batches++;
  engine->stats.decode_batches_alongside += alongside ? 1 : 0;
  engine->stats.decoded_frames += frames;
  engine->stats.largest_decode_batch = MAX (engine->stats.largest_decode_batch, (guint)n);
  g_cond_broadcast (&engine->decoded);
  g_mutex_unlock (&engine->lock);
  g_clear_error (&error);
}

/* Scheduler thread: every queued job in one batched decode. */
static void
run_decode_jobs (GepardEngine *engine)
{
  g_autoptr (GPtrArray) jobs = take_decode_jobs (engine);
  if (jobs != NULL)
    decode_jobs (engine, jobs, FALSE);
}

/* The decode thread: each batch the scheduler hands it, until told to quit. */
static gpointer
decoder_main (gpointer data)
{
  GepardEngine *engine = data;
  g_mutex_lock (&engine->decoder_lock);
  for (;;)
    {
      while (engine->decoder_batch == NULL && !engine->decoder_quit)
        g_cond_wait (&engine->decoder_cond, &engine->decoder_lock);
      if (engine->decoder_batch == NULL)
        break;
      GPtrArray *jobs = engine->decoder_batch;
      g_mutex_unlock (&engine->decoder_lock);
      decode_jobs (engine, jobs, TRUE);
      g_mutex_lock (&engine->decoder_lock);
      g_ptr_array_unref (jobs);
      engine->decoder_batch = NULL;
      g_cond_broadcast (&engine->decoder_cond);
    }
  g_mutex_unlock (&engine->decoder_lock);
  return NULL;
}

/* Scheduler thread: the jobs queued by now to the decode thread; FALSE when there were none. */
static gboolean
hand_decode_jobs (GepardEngine *engine)
{
  GPtrArray *jobs = take_decode_jobs (engine);
  if (jobs == NULL)
    return FALSE;
  g_mutex_lock (&engine->decoder_lock);
  engine->decoder_batch = jobs;
  g_cond_broadcast (&engine->decoder_cond);
  g_mutex_unlock (&engine->decoder_lock);
  return TRUE;
}

/* Scheduler thread: whether the decode thread is still on the batch it was handed. */
static gboolean
decoder_busy (GepardEngine *engine)
{
  g_mutex_lock (&engine->decoder_lock);
  gboolean busy = engine->decoder_batch != NULL;
  g_mutex_unlock (&engine->decoder_lock);
  return busy;
}

/* Scheduler thread: until the decode thread is done with the batch it was handed. */
static void
wait_decode_jobs (GepardEngine *engine)
{
  g_mutex_lock (&engine->decoder_lock);
  while (engine->decoder_batch != NULL)
    g_cond_wait (&engine->decoder_cond, &engine->decoder_lock);
  g_mutex_unlock (&engine->decoder_lock);
}

GepardAudioDecoder *
gepard_engine_new_audio_decoder (GepardEngine *engine, GError **error)
{
  GepardAudioDecoder *decoder;

  g_return_val_if_fail (engine != NULL, NULL);

  if (engine->codec == NULL)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_MISSING,
                   "The model in %s has no codec (codec.nemo or codec.safetensors beside it)",
                   gepard_checkpoint_get_dir (engine->checkpoint));
      return NULL;
    }
  decoder = g_new0 (GepardAudioDecoder, 1);
  decoder->engine = gepard_engine_ref (engine);
  return decoder;
}

void
gepard_audio_decoder_free (GepardAudioDecoder *decoder)
{
  if (decoder == NULL)
    return;
  /* no call is in flight (calls on one decoder do not overlap), so the stream is out of use */
  if (decoder->stream != NULL)
    decoder->engine->compute->funcs->audio_stream_free (decoder->engine->compute, decoder->stream);
  gepard_engine_unref (decoder->engine);
  g_free (decoder);
}

void
gepard_audio_decoder_reset (GepardAudioDecoder *decoder)
{
  g_return_if_fail (decoder != NULL);

  g_mutex_lock (&decoder->engine->lock);
  decoder->reset = TRUE;
  g_mutex_unlock (&decoder->engine->lock);
}

GepardCodec *
gepard_audio_decoder_get_codec (GepardAudioDecoder *decoder)
{
  return decoder->engine->codec;
}

gboolean
gepard_audio_decoder_decode (GepardAudioDecoder *decoder, const gint32 *codes, int n_frames,
                             float *samples, GError **error)
{
  GepardEngine *engine;
  DecodeJob job = {decoder, codes, n_frames, samples, FALSE, NULL};

  g_return_val_if_fail (decoder != NULL, FALSE);
  g_return_val_if_fail (error == NULL || *error == NULL, FALSE);

  engine = decoder->engine;
  if (n_frames < 0 || (n_frames > 0 && (codes == NULL || samples == NULL)))
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                   "Cannot decode %d frames without codes or room for samples", n_frames);
      return FALSE;
    }
  if (n_frames == 0)
    return TRUE;
  /* checked here, so that one stream's bad frame fails its own call and never a batch */
  if (!gepard_fsq_check_codes (gepard_codec_get_config (engine->codec), codes, n_frames, error))
    return FALSE;

  g_mutex_lock (&engine->lock);
  g_queue_push_tail (&engine->decode_jobs, &job);
  g_cond_signal (&engine->wake);
  while (!job.done)
    g_cond_wait (&engine->decoded, &engine->lock);
  g_mutex_unlock (&engine->lock);

  if (job.error != NULL)
    {
      g_propagate_error (error, job.error);
      return FALSE;
    }
  return TRUE;
}

/* Drops ended utterances from `list`, counting them. */
static guint
remove_ended (GPtrArray *list)
{
  guint removed = 0;
  for (guint i = list->len; i-- > 0;)
    {
      GepardUtterance *u = g_ptr_array_index (list, i);
      if (u->ended)
        {
          g_ptr_array_remove_index (list, i);
          removed++;
        }
    }
  return removed;
}

static void engine_release (GepardEngine *engine);

static gpointer
scheduler_main (gpointer data)
{
  GepardEngine *engine = data;
  g_autoptr (GPtrArray) admitted
      = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_utterance_unref);
  if (engine->options.decode_alongside > 0)
    engine->decoder = g_thread_new ("gepard-decode", decoder_main, engine);

  for (;;)
    {
      g_mutex_lock (&engine->lock);
      while (!engine->stopping && g_queue_is_empty (&engine->waiting) && engine->running->len == 0
             && g_queue_is_empty (&engine->decode_jobs))
        g_cond_wait (&engine->wake, &engine->lock);
      gboolean stopping = engine->stopping;

      /* admit under the prefill budget and the batch's sequences; one utterance always fits */
      int budget = engine->options.prefill_budget;
      guint sequences = sequences_in (engine->running);
      while (!stopping && !g_queue_is_empty (&engine->waiting))
        {
          GepardUtterance *u = g_queue_peek_head (&engine->waiting);
          int tokens = u->n_prefix + (int)u->layout->len + (uses_cfg (u) ? u->n_prefix + 3 : 0);
          gboolean first = admitted->len == 0 && engine->running->len == 0;
          if (!first
              && (sequences + sequences_of (u) > (guint)engine->options.max_batch
                  || (admitted->len > 0 && tokens > budget)))
            break;
          g_ptr_array_add (admitted, g_queue_pop_head (&engine->waiting));
          sequences += sequences_of (u);
          budget -= tokens;
        }
      engine->stats.waiting = g_queue_get_length (&engine->waiting);
      g_mutex_unlock (&engine->lock);

      if (stopping)
        break;

      /* cancelled before their prefill: end them without computing anything */
      for (guint i = 0; i < admitted->len; i++)
        {
          GepardUtterance *u = g_ptr_array_index (admitted, i);
          if (g_atomic_int_get (&u->cancelled))
            utterance_end (u, GEPARD_UTTERANCE_CANCELLED);
        }
      for (guint i = 0; i < engine->running->len; i++)
        {
          GepardUtterance *u = g_ptr_array_index (engine->running, i);
          if (g_atomic_int_get (&u->cancelled))
            utterance_end (u, GEPARD_UTTERANCE_CANCELLED);
        }
      guint ended = remove_ended (admitted) + remove_ended (engine->running);

      /* the codec service: every stream's frames queued by now, in one batched decode — on the
       * decode thread, else after the step. The decode thread takes the queue whenever it is
       * free, and steps go on while its pass runs, up to decode_lead of them: so one stream's
       * frames come at the LM's pace and pile up for the next pass (which decodes several frames
       * of each stream at once) rather than waiting for each pass. */
      gboolean stepping = admitted->len + engine->running->len > 0;
      if (engine->decoder != NULL)
        {
          /* a step that has run its lead waits for the pass first: this iteration's admitted
           * utterances are prefilled by the step, whatever the codec is doing */
          if (stepping && engine->lead >= engine->options.decode_lead)
            wait_decode_jobs (engine);
          if (!decoder_busy (engine) && hand_decode_jobs (engine))
            engine->lead = 0;
          if (stepping)
            {
              run_step (engine, admitted);
              engine->lead++;
            }
          else
            wait_decode_jobs (engine);
        }
      else
        {
          if (stepping)
            run_step (engine, admitted);
          run_decode_jobs (engine);
        }

      while (admitted->len > 0)
        g_ptr_array_add (engine->running, g_ptr_array_steal_index (admitted, 0));
      ended += remove_ended (engine->running);

      g_mutex_lock (&engine->lock);
      engine->stats.utterances += ended;
      /* what runs now, so an idle engine reads 0 */
      engine->stats.running = engine->running->len;
      g_mutex_unlock (&engine->lock);
    }

  /* shutdown: everything left is cancelled */
  GepardUtterance *u;
  g_mutex_lock (&engine->lock);
  while ((u = g_queue_pop_head (&engine->waiting)) != NULL)
    g_ptr_array_add (admitted, u);
  g_mutex_unlock (&engine->lock);
  for (guint i = 0; i < admitted->len; i++)
    utterance_end (g_ptr_array_index (admitted, i), GEPARD_UTTERANCE_CANCELLED);
  for (guint i = 0; i < engine->running->len; i++)
    utterance_end (g_ptr_array_index (engine->running, i), GEPARD_UTTERANCE_CANCELLED);
  /* no decoder can be waiting: each holds a reference, so the engine is not stopping while one
   * is in use */
  g_assert (g_queue_is_empty (&engine->decode_jobs));
  if (engine->decoder != NULL)
    {
      g_mutex_lock (&engine->decoder_lock);
      engine->decoder_quit = TRUE;
      g_cond_broadcast (&engine->decoder_cond);
      g_mutex_unlock (&engine->decoder_lock);
      g_thread_join (g_steal_pointer (&engine->decoder));
    }
  if (engine->free_on_exit)
    engine_release (engine);
  return NULL;
}

/* ---- the engine ---- */

void
gepard_engine_options_init (GepardEngineOptions *options)
{
  options->max_batch = 0;
  options->prefill_budget = 2048;
  options->max_waiting = 4096;
  /* GEPARD_DECODE_ALONGSIDE=0 or 1 overrides the backend's preference (for measuring either) */
  const char *alongside = g_getenv ("GEPARD_DECODE_ALONGSIDE");
  options->decode_alongside = g_strcmp0 (alongside, "1") == 0   ? 1
                              : g_strcmp0 (alongside, "0") == 0 ? 0
                                                                : -1;
  const char *lead = g_getenv ("GEPARD_DECODE_LEAD");
  options->decode_lead = lead != NULL ? MAX (1, (int)g_ascii_strtoll (lead, NULL, 10)) : 8;
}

/* The model's "gepard.cfg_scale" in *scale, or 1 where it names none; FALSE where it names one
 * that is no scale. */
static gboolean
model_cfg_scale (const GepardCheckpoint *checkpoint, float *scale, GError **error)
{
  const char *text = gepard_checkpoint_get_metadata (checkpoint, "gepard.cfg_scale");
  *scale = 1.0f;
  if (text == NULL)
    return TRUE;
  char *end = NULL;
  double value = g_ascii_strtod (text, &end);
  if (end == text || *end != '\0' || !isfinite (value) || value < 0 || value > 100)
    {
      g_set_error (error, GEPARD_FORMAT_ERROR, GEPARD_FORMAT_ERROR_CORRUPT,
                   "The model in %s names a text-CFG scale of \"%s\" (metadata "
                   "gepard.cfg_scale in model.safetensors): not a number from 0 to 100",
                   gepard_checkpoint_get_dir (checkpoint), text);
      return FALSE;
    }
  *scale = (float)value;
  return TRUE;
}

/* The backend for `info`'s device. A GPU that cannot take the model falls back to the CPU when
 * the device was "auto" (saying why in `fallback`), and fails when it was asked for by name. */
static GepardCompute *
compute_new (const char *device, GepardDeviceInfo *info, const GepardCheckpoint *checkpoint,
             const GepardModel *lm, GepardCodec *codec, char **fallback, GError **error)
{
  GepardBackendKind kind;
  int index;
  gboolean is_auto = FALSE;
  g_autoptr (GError) local_error = NULL;
  GepardCompute *compute;

  if (info->kind == GEPARD_BACKEND_CPU)
    return gepard_compute_cpu_new (lm, codec);

  compute = gepard_compute_cuda_new (checkpoint, lm, codec, info->device_index, &local_error);
  if (compute != NULL)
    return compute;
  gepard_backend_parse_device (device, &kind, &index, &is_auto, NULL);
  if (!is_auto)
    {
      g_propagate_error (error, g_steal_pointer (&local_error));
      return NULL;
    }
  g_free (*fallback);
  *fallback = g_strdup (local_error->message);
  gepard_device_info_clear (info);
  if (!gepard_backend_select ("cpu", info, NULL, error))
    return NULL;
  return gepard_compute_cpu_new (lm, codec);
}

GepardEngine *
gepard_engine_new (const char *model, const char *device, const GepardEngineOptions *options,
                   GError **error)
{
  g_autofree char *fallback = NULL;
  GepardDeviceInfo info = {0};
  if (!gepard_backend_select (device, &info, &fallback, error))
    return NULL;

  g_autoptr (GepardCheckpoint) checkpoint = gepard_checkpoint_open (model, error);
  float cfg_scale;
  if (checkpoint == NULL || !model_cfg_scale (checkpoint, &cfg_scale, error))
    {
      gepard_device_info_clear (&info);
      return NULL;
    }
  GepardModel *lm = gepard_model_new (checkpoint, GEPARD_ROPE_INV_FREQ_BF16, error);
  if (lm == NULL)
    {
      gepard_device_info_clear (&info);
      return NULL;
    }
  GepardCodec *codec = NULL;
  const char *codec_path = gepard_checkpoint_get_codec_path (checkpoint);
  if (codec_path != NULL && (codec = gepard_codec_new (codec_path, error)) == NULL)
    {
      gepard_model_free (lm);
      gepard_device_info_clear (&info);
      return NULL;
    }
  GepardCompute *compute = compute_new (device, &info, checkpoint, lm, codec, &fallback, error);
  if (compute == NULL)
    {
      gepard_codec_free (codec);
      gepard_model_free (lm);
      gepard_device_info_clear (&info);
      return NULL;
    }

  GepardEngine *engine = g_new0 (GepardEngine, 1);
  g_atomic_ref_count_init (&engine->ref_count);
  if (options != NULL)
    engine->options = *options;
  else
    gepard_engine_options_init (&engine->options);
  if (engine->options.max_batch <= 0)
    engine->options.max_batch = compute->default_batch;
  engine->options.max_batch = MIN (engine->options.max_batch, compute->max_batch);
  if (engine->options.decode_alongside < 0)
    engine->options.decode_alongside = compute->decode_alongside;
  if (codec == NULL)
    engine->options.decode_alongside = 0;
  engine->options.decode_lead = MAX (1, engine->options.decode_lead);
  engine->cfg_scale = cfg_scale;
  engine->checkpoint = g_steal_pointer (&checkpoint);
  engine->model = lm;
  engine->codec = codec;
  engine->compute = compute;
  engine->device = info;
  if (fallback != NULL)
    g_info ("Gepard runs %s on the CPU: %s", model, fallback);
  g_mutex_init (&engine->lock);
  g_cond_init (&engine->wake);
  g_cond_init (&engine->decoded);
  g_queue_init (&engine->decode_jobs);
  g_mutex_init (&engine->decoder_lock);
  g_cond_init (&engine->decoder_cond);
  g_queue_init (&engine->waiting);
  engine->running = g_ptr_array_new_with_free_func ((GDestroyNotify)gepard_utterance_unref);
  g_mutex_init (&engine->voices_lock);
  engine->voices
      = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, (GDestroyNotify)gepard_voice_unref);
  const char *fault_text = g_getenv ("GEPARD_FAULT_FAIL_STREAM_TEXT");
  if (fault_text != NULL && fault_text[0] != '\0')
    {
      engine->fault_text = g_strdup (fault_text);
      g_message ("Gepard engine: utterances whose text contains \"%s\" will fail "
                 "(GEPARD_FAULT_FAIL_STREAM_TEXT)",
                 fault_text);
    }
  g_hash_table_insert (
      engine->voices, g_strdup ("default"),
      gepard_voice_new ("default", NULL, 0, gepard_model_get_config (lm)->hidden_size));
  engine->scheduler = g_thread_new ("gepard-engine", scheduler_main, engine);
  return engine;
}

static GMutex registry_lock;
static GHashTable *registry; /* "model\ndevice" → GepardEngine* (not owned) */

/* Where a model's weights are, one spelling per place: a relative path, an absolute one and a
 * repo id of the same checkpoint give the same string. */
static char *
canonical_model_dir (const char *model, GError **error)
{
  g_autofree char *dir = gepard_hub_resolve (model, error);
  return dir != NULL ? g_canonicalize_filename (dir, NULL) : NULL;
}

gboolean
gepard_engine_serves_model (const GepardEngine *engine, const char *model)
{
  g_autofree char *wanted = canonical_model_dir (model, NULL);
  g_autofree char *loaded = g_canonicalize_filename (gepard_engine_get_model_dir (engine), NULL);
  return wanted != NULL && g_strcmp0 (wanted, loaded) == 0;
}

GepardEngine *
gepard_engine_get_shared (const char *model, const char *device, GError **error)
{
  /* keyed by where the weights are, so every spelling of one checkpoint shares one engine */
  g_autofree char *canonical = canonical_model_dir (model, error);
  if (canonical == NULL)
    return NULL;
  g_autofree char *key = g_strdup_printf ("%s\n%s", canonical, device ? device : "auto");
  g_mutex_lock (&registry_lock);
  if (registry == NULL)
    registry = g_hash_table_new_full (g_str_hash, g_str_equal, g_free, NULL);
  GepardEngine *engine = g_hash_table_lookup (registry, key);
  if (engine != NULL)
    gepard_engine_ref (engine);
  else if ((engine = gepard_engine_new (model, device, NULL, error)) != NULL)
    {
      engine->registry_key = g_strdup (key);
      g_hash_table_insert (registry, g_steal_pointer (&key), engine);
    }
  g_mutex_unlock (&registry_lock);
  return engine;
}

guint
gepard_engine_count_shared (void)
{
  g_mutex_lock (&registry_lock);
  guint n = registry != NULL ? g_hash_table_size (registry) : 0;
  g_mutex_unlock (&registry_lock);
  return n;
}

G_DEFINE_BOXED_TYPE (GepardEngine, gepard_engine, gepard_engine_ref, gepard_engine_unref)

GepardEngine *
gepard_engine_ref (GepardEngine *engine)
{
  g_atomic_ref_count_inc (&engine->ref_count);
  return engine;
}

static void
engine_release (GepardEngine *engine)
{
  g_ptr_array_unref (engine->running);
  g_hash_table_unref (engine->voices);
  g_mutex_clear (&engine->voices_lock);
  g_mutex_clear (&engine->lock);
  g_cond_clear (&engine->wake);
  g_cond_clear (&engine->decoded);
  g_mutex_clear (&engine->decoder_lock);
  g_cond_clear (&engine->decoder_cond);
  gepard_compute_free (engine->compute);
  gepard_codec_free (engine->codec);
  gepard_model_free (engine->model);
  gepard_checkpoint_free (engine->checkpoint);
  gepard_device_info_clear (&engine->device);
  g_free (engine->registry_key);
  g_free (engine->fault_text);
  g_free (engine);
}

/* Every utterance holds a reference, so when the last one goes nothing is queued or running. The
 * last reference can go on the scheduler thread (it drops finished utterances): the thread then
 * frees the engine as it exits instead of joining itself. */
static void
engine_free (GepardEngine *engine)
{
  gboolean on_scheduler = g_thread_self () == engine->scheduler;
  g_mutex_lock (&engine->lock);
  engine->stopping = TRUE;
  engine->free_on_exit = on_scheduler;
  g_cond_signal (&engine->wake);
  g_mutex_unlock (&engine->lock);
  if (on_scheduler)
    {
      g_thread_unref (engine->scheduler);
      return;
    }
  g_thread_join (engine->scheduler);
  engine_release (engine);
}

void
gepard_engine_unref (GepardEngine *engine)
{
  if (engine == NULL)
    return;
  if (engine->registry_key == NULL)
    {
      if (g_atomic_ref_count_dec (&engine->ref_count))
        engine_free (engine);
      return;
    }
  /* a shared engine leaves the registry under its lock, so no one revives it while it stops */
  g_mutex_lock (&registry_lock);
  gboolean last = g_atomic_ref_count_dec (&engine->ref_count);
  if (last)
    g_hash_table_remove (registry, engine->registry_key);
  g_mutex_unlock (&registry_lock);
  if (last)
    engine_free (engine);
}

const GepardModelConfig *
gepard_engine_get_config (const GepardEngine *engine)
{
  return gepard_model_get_config (engine->model);
}

GepardTokenizer *
gepard_engine_get_tokenizer (const GepardEngine *engine)
{
  return gepard_checkpoint_get_tokenizer (engine->checkpoint);
}

const GepardModel *
gepard_engine_get_model (const GepardEngine *engine)
{
  return engine->model;
}

GepardCodec *
gepard_engine_get_codec (const GepardEngine *engine)
{
  return engine->codec;
}

const char *
gepard_engine_get_model_dir (const GepardEngine *engine)
{
  return gepard_checkpoint_get_dir (engine->checkpoint);
}

const GepardDeviceInfo *
gepard_engine_get_device (const GepardEngine *engine)
{
  return &engine->device;
}

const char *
gepard_engine_get_device_description (const GepardEngine *engine)
{
  return engine->device.description;
}

gboolean
gepard_engine_is_test_model (const GepardEngine *engine)
{
  return gepard_checkpoint_get_metadata (engine->checkpoint, "gepard.test_model") != NULL;
}

float
gepard_engine_get_cfg_scale (const GepardEngine *engine)
{
  return engine->cfg_scale;
}

void
gepard_engine_get_stats (GepardEngine *engine, GepardEngineStats *stats)
{
  g_mutex_lock (&engine->lock);
  *stats = engine->stats;
  g_mutex_unlock (&engine->lock);
}

GepardUtterance *
gepard_engine_submit (GepardEngine *engine, const gint32 *text_ids, int n_ids, const float *prefix,
                      int n_prefix, const GepardSampling *sampling,
                      const GepardUtteranceCallbacks *callbacks, gpointer user_data,
                      GDestroyNotify destroy, GError **error)
{
  const GepardModelConfig *c = gepard_model_get_config (engine->model);

  if (n_ids <= 0)
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                   "The text has no tokens");
      return NULL;
    }
  for (int i = 0; i < n_ids; i++)
    if (text_ids[i] < 0 || text_ids[i] >= c->vocab_size)
      {
        g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                     "Token id %d is outside the model's vocabulary of %d", text_ids[i],
                     c->vocab_size);
        return NULL;
      }
  if (n_prefix < 0 || (n_prefix > 0 && prefix == NULL))
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                   "A prefix of %d rows without data", n_prefix);
      return NULL;
    }
  if (sampling->max_frames <= 0 || !(sampling->temperature >= 0) || sampling->top_k < 0
      || !(sampling->repetition_penalty > 0))
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                   "Sampling needs max_frames > 0, temperature >= 0, top_k >= 0 and a "
                   "positive repetition penalty");
      return NULL;
    }
  if (!isfinite (sampling->cfg_scale))
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_INVALID_INPUT,
                   "The text CFG scale must be a finite number (1: off)");
      return NULL;
    }
  if (sampling->cfg_scale != 1.0f && !engine->compute->text_cfg)
    {
      g_set_error (error, GEPARD_ENGINE_ERROR, GEPARD_ENGINE_ERROR_UNSUPPORTED,
                   "Text CFG (cfg_scale %g) does not run on %s; use cfg_scale 1",
                   sampling->cfg_scale, engine->device.description);
      return NULL;
    }

  GepardUtterance *u = g_new0 (GepardUtterance, 1);
  g_atomic_ref_count_init (&u->ref_count);
  u->engine = gepard_engine_ref (engine);
  u->layout = gepard_text_layout (c, text_ids, n_ids);
  if (n_prefix > 0)
    u->prefix = g_memdup2 (prefix, sizeof (float) * n_prefix * c->hidden_size);
  u->n_prefix = n_prefix;
  u->sampling = *sampling;
  if (callbacks != NULL)
    u->callbacks = *callbacks;
  u->user_data = user_data;
  u->destroy = destroy;
  if (engine->fault_text != NULL)
    {
      g_autofree char *text
          = gepard_tokenizer_decode (gepard_engine_get_tokenizer (engine), text_ids, (gsize)n_ids);
      u->fault = text != NULL && strstr (text, engine->fault_text) != NULL;
    }

  g_mutex_lock (&engine->lock);
  if (engine->stopping
      || g_queue_get_length (&engine->waiting) >= (guint)engine->options.max_waiting)
    {
      gboolean stopping = engine->stopping;
      g_mutex_unlock (&engine->lock);
      g_set_error (error, GEPARD_ENGINE_ERROR,
                   stopping ? GEPARD_ENGINE_ERROR_SHUTDOWN : GEPARD_ENGINE_ERROR_BUSY,
                   stopping ? "The engine is stopping"
                            : "The engine has too many utterances waiting; try again later");
      u->destroy = NULL; /* the caller keeps its data when submit fails */
      gepard_utterance_unref (u);
      return NULL;
    }
  g_queue_push_tail (&engine->waiting, gepard_utterance_ref (u));
  g_cond_signal (&engine->wake);
  g_mutex_unlock (&engine->lock);
  return u;
}

void
gepard_engine_add_voice (GepardEngine *engine, GepardVoice *voice)
{
  g_mutex_lock (&engine->voices_lock);
  g_hash_table_replace (engine->voices, g_strdup (gepard_voice_get_id (voice)),
                        gepard_voice_ref (voice));
  g_mutex_unlock (&engine->voices_lock);
}

GepardVoice *
gepard_engine_lookup_voice (GepardEngine *engine, const char *id)
{
  g_mutex_lock (&engine->voices_lock);
  GepardVoice *voice = g_hash_table_lookup (engine->voices, id);
  if (voice != NULL)
    gepard_voice_ref (voice);
  g_mutex_unlock (&engine->voices_lock);
  return voice;
}

gboolean
gepard_engine_remove_voice (GepardEngine *engine, const char *id)
{
  if (g_strcmp0 (id, "default") == 0)
    return FALSE;
  g_mutex_lock (&engine->voices_lock);
  gboolean removed = g_hash_table_remove (engine->voices, id);
  g_mutex_unlock (&engine->voices_lock);
  return removed;
}
