// The Gepard playground: speaks over /tts/websocket (raw pcm_f32le chunks, played through Web
// Audio as they arrive), lists and clones voices through the HTTP API, and keeps the last result
// to draw and to download as WAV. Plain JavaScript, nothing loaded from elsewhere.
//
// window.gepardPlayground is a read-only view of the page's state, for scripts and tests:
// ready, keyRequired, busy, voices, lastResult {samples, sample_rate, duration_s, ttfa_ms, rtf,
// elapsed_ms, peak, voice, wav_bytes, stopped}, lastWav (the Blob the download saves), lastClone
// (the voice object of the last clone), clip {name, bytes, duration_s}, lastError {message,
// status}.

const API_VERSION = "2026-03-01";
const KEY_STORAGE = "gepard-playground-api-key";
const VOICE_PAGE = 20;
const RECORD_SECONDS = 15;
const RECORD_RATE = 24000;

const $ = (id) => document.getElementById(id);
const ui = {
  serverStatus: $("server-status"),
  error: $("error"),
  notice: $("notice"),
  keySection: $("key-section"),
  keyForm: $("key-form"),
  keyInput: $("api-key"),
  keySubmit: $("key-submit"),
  transcript: $("transcript"),
  voice: $("voice"),
  moreVoices: $("more-voices"),
  reloadVoices: $("reload-voices"),
  rate: $("rate"),
  speak: $("speak"),
  stop: $("stop"),
  download: $("download"),
  ttfa: $("ttfa"),
  rtf: $("rtf"),
  duration: $("duration"),
  waveform: $("waveform"),
  cloneForm: $("clone-form"),
  cloneName: $("clone-name"),
  cloneLanguage: $("clone-language"),
  cloneFile: $("clone-file"),
  record: $("record"),
  clipStatus: $("clip-status"),
  clone: $("clone"),
};

// ---- the published state ----

const published = {
  ready: false,
  keyRequired: false,
  busy: false,
  voices: [],
  lastResult: null,
  lastClone: null,
  clip: null,
  lastError: null,
};
let lastWav = null;

const view = {};
for (const name of Object.keys(published)) {
  Object.defineProperty(view, name, { enumerable: true, get: () => published[name] });
}
Object.defineProperty(view, "lastWav", { enumerable: true, get: () => lastWav });
Object.freeze(view);
Object.defineProperty(window, "gepardPlayground", { value: view, enumerable: true });

function deepFreeze(value) {
  if (value !== null && typeof value === "object" && !Object.isFrozen(value)) {
    Object.freeze(value);
    Object.values(value).forEach(deepFreeze);
  }
  return value;
}

function publish(name, value) {
  published[name] = deepFreeze(value);
}

// ---- messages ----

class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

// The message of a Cartesia error body: JSON {title, message, ...} from 2026-03-01, "Title:
// message" text before, {error: "..."} on older WebSocket errors.
function describeError(body, fallback) {
  if (body && typeof body === "object") {
    if (body.message) return body.title ? `${body.title}: ${body.message}` : body.message;
    if (body.error) return String(body.error);
  }
  return fallback;
}

async function errorFromResponse(response) {
  const text = (await response.text()).trim();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // plain text: the message itself
  }
  const message = describeError(body, text || response.statusText || "request failed");
  return new ApiError(`${message} (HTTP ${response.status})`, response.status);
}

function showError(error) {
  const message = error instanceof Error ? error.message : String(error);
  ui.error.textContent = message;
  ui.error.hidden = false;
  publish("lastError", { message, status: error instanceof ApiError ? error.status : null });
}

function clearError() {
  ui.error.hidden = true;
  ui.error.textContent = "";
}

function notice(text) {
  ui.notice.textContent = text;
}

// ---- the API key and calls ----

function storedKey() {
  try {
    return sessionStorage.getItem(KEY_STORAGE) || "";
  } catch {
    return "";
  }
}

function storeKey(key) {
  try {
    if (key) sessionStorage.setItem(KEY_STORAGE, key);
    else sessionStorage.removeItem(KEY_STORAGE);
  } catch {
    // storage off: the key lasts as long as the page
  }
}

let apiKey = storedKey();

async function api(path, init = {}) {
  const headers = { "Cartesia-Version": API_VERSION, ...(init.headers || {}) };
  if (apiKey) headers["X-API-Key"] = apiKey;
  const response = await fetch(path, { ...init, headers, cache: "no-store" });
  if (!response.ok) {
    const error = await errorFromResponse(response);
    if (response.status === 401 && published.keyRequired) askForKey();
    throw error;
  }
  return response;
}

function askForKey() {
  ui.keySection.hidden = false;
  setReady(false);
  ui.keyInput.focus();
}

function setReady(ready) {
  publish("ready", ready);
  for (const control of [ui.speak, ui.reloadVoices, ui.moreVoices, ui.clone, ui.record]) {
    control.disabled = !ready;
  }
  if (ready) updateRecordButton();
}

ui.keyForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearError();
  apiKey = ui.keyInput.value.trim();
  closeSocket();
  ui.keySubmit.disabled = true;
  try {
    await loadVoices(false);
    storeKey(apiKey);
    ui.keySection.hidden = true;
    ui.keyInput.value = "";
    setReady(true);
    notice("Key accepted.");
  } catch (error) {
    apiKey = "";
    storeKey("");
    showError(error);
    ui.keyInput.select();
  } finally {
    ui.keySubmit.disabled = false;
  }
});

// ---- the server's state ----

async function loadHealth() {
  try {
    const response = await fetch("/health", { cache: "no-store" });
    const health = await response.json();
    if (health.status === "ok") {
      const test = health.engine && health.engine.test_model ? " (untrained test model: the audio is noise)" : "";
      ui.serverStatus.textContent = `${health.model} on ${health.engine.device}${test}`;
    } else {
      ui.serverStatus.textContent = `${health.status}: ${health.reason || "not ready"}`;
      setTimeout(loadHealth, 2000);
    }
  } catch (error) {
    ui.serverStatus.textContent = `The server does not answer (${error.message})`;
  }
}

// ---- voices ----

let voiceCursor = null;
let voices = [];

function addVoiceOption(voice, select) {
  let option = [...ui.voice.options].find((o) => o.value === voice.id);
  if (!option) {
    option = document.createElement("option");
    option.value = voice.id;
    ui.voice.append(option);
    voices.push({ id: voice.id, name: voice.name, language: voice.language, is_owner: voice.is_owner });
  }
  option.textContent = voice.name && voice.name !== voice.id ? `${voice.name} (${voice.id})` : voice.id;
  if (select) ui.voice.value = voice.id;
}

async function loadVoices(more) {
  const params = new URLSearchParams({ limit: String(VOICE_PAGE) });
  if (more && voiceCursor) params.set("starting_after", voiceCursor);
  const body = await (await api(`/voices?${params}`)).json();
  const page = Array.isArray(body) ? body : body.data || [];
  const selected = ui.voice.value;
  if (!more) {
    ui.voice.replaceChildren();
    voices = [];
  }
  for (const voice of page) addVoiceOption(voice, false);
  if (selected && voices.some((v) => v.id === selected)) ui.voice.value = selected;
  const last = page.length > 0 ? page[page.length - 1].id : null;
  voiceCursor = !Array.isArray(body) && body.has_more ? body.next_page || last : null;
  ui.moreVoices.hidden = voiceCursor === null;
  publish("voices", voices.map((v) => ({ ...v })));
}

ui.moreVoices.addEventListener("click", () => {
  clearError();
  loadVoices(true).catch(showError);
});
ui.reloadVoices.addEventListener("click", () => {
  clearError();
  loadVoices(false).then(() => notice("Voices reloaded."), showError);
});

// ---- playback: every chunk scheduled right after the one before ----

let audio = null; // {context, next, sources}

// Called from the click that starts a generation, so that browsers let the context run. Audio
// that cannot play (no output device, a context the browser keeps suspended) is still collected.
function preparePlayback() {
  try {
    if (!audio) {
      audio = { context: new AudioContext({ latencyHint: "interactive" }), next: 0, sources: new Set() };
    }
    if (audio.context.state === "suspended") audio.context.resume().catch(() => {});
    stopPlayback(); // a new generation replaces what is still playing
  } catch {
    audio = null;
  }
}

function play(samples, rate) {
  if (!audio || samples.length === 0) return;
  try {
    const { context } = audio;
    const buffer = context.createBuffer(1, samples.length, rate);
    buffer.copyToChannel(samples, 0);
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(context.destination);
    // the first chunk starts at once; a late chunk starts when it arrives
    const start = Math.max(audio.next, context.currentTime + 0.02);
    source.start(start);
    audio.next = start + buffer.duration;
    audio.sources.add(source);
    source.onended = () => audio && audio.sources.delete(source);
  } catch {
    // playback is a bonus: the samples are kept either way
  }
}

function stopPlayback() {
  if (!audio) return;
  for (const source of audio.sources) {
    try {
      source.stop();
    } catch {
      // not started yet
    }
  }
  audio.sources.clear();
  audio.next = 0;
}

// ---- the WebSocket ----

let socket = null;
let opening = null;

function socketUrl() {
  const url = new URL("/tts/websocket", location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  url.searchParams.set("cartesia_version", API_VERSION);
  if (apiKey) url.searchParams.set("api_key", apiKey);
  return url.href;
}

function openSocket() {
  if (socket && socket.readyState === WebSocket.OPEN) return Promise.resolve(socket);
  if (opening) return opening;
  opening = new Promise((resolve, reject) => {
    const ws = new WebSocket(socketUrl());
    ws.addEventListener("open", () => {
      socket = ws;
      opening = null;
      resolve(ws);
    });
    ws.addEventListener("message", (event) => onSocketMessage(ws, event.data));
    ws.addEventListener("close", (event) => {
      if (socket === ws) {
        socket = null;
        if (current) {
          finish(`The connection closed before the end (code ${event.code}${event.reason ? `: ${event.reason}` : ""})`);
        }
      } else if (opening) {
        opening = null;
        reject(new Error("handshake"));
      }
    });
  });
  return opening;
}

function closeSocket() {
  if (socket) socket.close(1000, "");
  socket = null;
}

// A refused upgrade shows the browser no status: an HTTP call with the same key says why.
async function explainSocketFailure() {
  try {
    await api("/voices?limit=1");
  } catch (error) {
    return error;
  }
  return new Error("The WebSocket /tts/websocket could not be opened (the server or a proxy refused it)");
}

// ---- one generation ----

let current = null; // {id, rate, voice, chunks, length, rest, sentAt, firstAt, peak}

function newContextId() {
  const random = new Uint32Array(2);
  crypto.getRandomValues(random);
  return `playground-${Date.now().toString(36)}-${random[0].toString(36)}${random[1].toString(36)}`;
}

// base64 little-endian float32 → samples; a partial sample waits for the next chunk
function decodeChunk(data, generation) {
  const binary = atob(data);
  const bytes = new Uint8Array(generation.rest.length + binary.length);
  bytes.set(generation.rest);
  for (let i = 0; i < binary.length; i++) bytes[generation.rest.length + i] = binary.charCodeAt(i);
  const count = Math.floor(bytes.length / 4);
  const view = new DataView(bytes.buffer);
  const samples = new Float32Array(count);
  for (let i = 0; i < count; i++) samples[i] = view.getFloat32(i * 4, true);
  generation.rest = bytes.slice(count * 4);
  return samples;
}

function onSocketMessage(ws, text) {
  let message;
  try {
    message = JSON.parse(text);
  } catch {
    return;
  }
  if (!current || message.context_id !== current.id) return;
  if (message.type === "chunk" && typeof message.data === "string") {
    const samples = decodeChunk(message.data, current);
    if (current.firstAt === null) {
      current.firstAt = performance.now();
      ui.ttfa.textContent = `${Math.round(current.firstAt - current.sentAt)} ms`;
    }
    for (const x of samples) current.peak = Math.max(current.peak, Math.abs(x));
    current.chunks.push(samples);
    current.length += samples.length;
    play(samples, current.rate);
    ui.duration.textContent = `${(current.length / current.rate).toFixed(2)} s`;
    drawSoon();
  } else if (message.type === "error") {
    const status = message.status_code || null;
    finish(new ApiError(`${describeError(message, "The generation failed")}${status ? ` (${status})` : ""}`, status));
  } else if (message.done === true || message.type === "done") {
    finish(null);
  }
}

async function speak() {
  clearError();
  const transcript = ui.transcript.value;
  if (!transcript.trim()) {
    showError("Type some text to speak.");
    return;
  }
  if (current) stop();
  preparePlayback();
  setBusy(true);
  notice("Connecting…");
  let ws;
  try {
    ws = await openSocket();
  } catch {
    setBusy(false);
    notice("");
    showError(await explainSocketFailure());
    return;
  }
  const rate = Number(ui.rate.value);
  const voice = ui.voice.value || "default";
  current = {
    id: newContextId(),
    rate,
    voice,
    chunks: [],
    length: 0,
    rest: new Uint8Array(0),
    sentAt: performance.now(),
    firstAt: null,
    peak: 0,
  };
  ui.ttfa.textContent = "…";
  ui.rtf.textContent = "…";
  ui.duration.textContent = "0.00 s";
  drawWaveform([], 0);
  notice("Speaking…");
  ws.send(
    JSON.stringify({
      model_id: "gepard",
      context_id: current.id,
      transcript,
      voice: { mode: "id", id: voice },
      output_format: { container: "raw", encoding: "pcm_f32le", sample_rate: rate },
      language: "en",
      continue: false,
    }),
  );
}

function stop() {
  if (!current) return;
  if (socket && socket.readyState === WebSocket.OPEN) {
    socket.send(JSON.stringify({ context_id: current.id, cancel: true }));
  }
  stopPlayback();
  finish("stopped");
}

// Ends the generation under way: `outcome` null when it is done, "stopped", or an error.
function finish(outcome) {
  const generation = current;
  if (!generation) return;
  current = null;
  setBusy(false);
  const samples = new Float32Array(generation.length);
  let offset = 0;
  for (const chunk of generation.chunks) {
    samples.set(chunk, offset);
    offset += chunk.length;
  }
  const elapsed = performance.now() - generation.sentAt;
  const duration = samples.length / generation.rate;
  const failed = outcome !== null && outcome !== "stopped";
  if (failed) showError(outcome);
  if (samples.length === 0) {
    if (outcome === "stopped") notice("Stopped before any audio arrived.");
    else {
      notice("");
      if (!failed) showError("The server sent no audio.");
    }
    ui.rtf.textContent = "–";
    ui.ttfa.textContent = "–";
    return;
  }
  const rtf = elapsed / 1000 / duration;
  lastWav = encodeWav(samples, generation.rate);
  ui.rtf.textContent = rtf.toFixed(3);
  ui.duration.textContent = `${duration.toFixed(2)} s`;
  ui.download.disabled = false;
  lastSamples = samples;
  lastVoice = generation.voice;
  drawWaveform([samples], samples.length);
  notice(
    outcome === "stopped"
      ? `Stopped after ${duration.toFixed(2)} s of audio.`
      : `Done: ${duration.toFixed(2)} s of audio in ${(elapsed / 1000).toFixed(2)} s.`,
  );
  publish("lastResult", {
    samples: samples.length,
    sample_rate: generation.rate,
    duration_s: duration,
    ttfa_ms: generation.firstAt - generation.sentAt,
    rtf,
    elapsed_ms: elapsed,
    peak: generation.peak,
    voice: generation.voice,
    wav_bytes: lastWav.size,
    stopped: outcome === "stopped",
  });
}

function setBusy(busy) {
  publish("busy", busy);
  ui.speak.disabled = busy || !published.ready;
  ui.stop.disabled = !busy;
}

ui.speak.addEventListener("click", () => speak().catch(showError));
ui.stop.addEventListener("click", stop);
ui.transcript.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && !ui.speak.disabled) {
    event.preventDefault();
    speak().catch(showError);
  }
});

// ---- WAV, download ----

let lastSamples = null;
let lastVoice = "default";

// 16-bit PCM mono
function encodeWav(samples, rate) {
  const buffer = new ArrayBuffer(44 + samples.length * 2);
  const view = new DataView(buffer);
  const ascii = (offset, text) => {
    for (let i = 0; i < text.length; i++) view.setUint8(offset + i, text.charCodeAt(i));
  };
  ascii(0, "RIFF");
  view.setUint32(4, 36 + samples.length * 2, true);
  ascii(8, "WAVE");
  ascii(12, "fmt ");
  view.setUint32(16, 16, true);
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // mono
  view.setUint32(24, rate, true);
  view.setUint32(28, rate * 2, true);
  view.setUint16(32, 2, true);
  view.setUint16(34, 16, true);
  ascii(36, "data");
  view.setUint32(40, samples.length * 2, true);
  for (let i = 0; i < samples.length; i++) {
    const x = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(44 + i * 2, x < 0 ? x * 0x8000 : x * 0x7fff, true);
  }
  return new Blob([buffer], { type: "audio/wav" });
}

ui.download.addEventListener("click", () => {
  if (!lastWav) return;
  const url = URL.createObjectURL(lastWav);
  const link = document.createElement("a");
  const stamp = new Date().toISOString().replace(/[:.]/g, "-").slice(0, 19);
  link.href = url;
  link.download = `gepard-${lastVoice.replace(/[^A-Za-z0-9_-]/g, "_")}-${stamp}.wav`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60000);
});

// ---- the waveform ----

let drawPending = false;

function drawSoon() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => {
    drawPending = false;
    if (current) drawWaveform(current.chunks, current.length);
  });
}

// min and max of each pixel column over every sample so far
function drawWaveform(chunks, length) {
  const canvas = ui.waveform;
  const ratio = window.devicePixelRatio || 1;
  const width = Math.max(1, Math.round(canvas.clientWidth * ratio));
  const height = Math.max(1, Math.round(canvas.clientHeight * ratio));
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
  }
  const g = canvas.getContext("2d");
  const style = getComputedStyle(document.documentElement);
  g.clearRect(0, 0, width, height);
  g.fillStyle = style.getPropertyValue("--border").trim() || "#ccc";
  g.fillRect(0, Math.floor(height / 2), width, Math.max(1, Math.round(ratio)));
  if (length === 0) return;
  g.fillStyle = style.getPropertyValue("--wave").trim() || "#1f6feb";
  const perColumn = length / width;
  let column = 0;
  let low = Infinity;
  let high = -Infinity;
  let index = 0;
  const flush = () => {
    if (low <= high) {
      const top = ((1 - high) / 2) * height;
      const bottom = ((1 - low) / 2) * height;
      g.fillRect(column, top, 1, Math.max(1, bottom - top));
    }
    low = Infinity;
    high = -Infinity;
  };
  for (const chunk of chunks) {
    for (let i = 0; i < chunk.length; i++, index++) {
      const target = Math.floor(index / perColumn);
      if (target !== column) {
        flush();
        column = target;
      }
      const x = Math.max(-1, Math.min(1, chunk[i]));
      if (x < low) low = x;
      if (x > high) high = x;
    }
  }
  flush();
}

window.addEventListener("resize", () => {
  if (current) drawWaveform(current.chunks, current.length);
  else if (lastSamples) drawWaveform([lastSamples], lastSamples.length);
});

// ---- the reference clip: a file, or a recording made here ----

let clip = null; // a File
let recorder = null;

function setClip(file, duration) {
  clip = file;
  const seconds = duration !== undefined ? `, ${duration.toFixed(1)} s` : "";
  ui.clipStatus.textContent = file ? `${file.name} (${Math.round(file.size / 1024)} KiB${seconds})` : "3–15 s of one person speaking";
  publish("clip", file ? { name: file.name, bytes: file.size, duration_s: duration ?? null } : null);
}

ui.cloneFile.addEventListener("change", () => {
  setClip(ui.cloneFile.files[0] || null);
});

function canRecord() {
  return Boolean(navigator.mediaDevices && navigator.mediaDevices.getUserMedia && window.MediaRecorder);
}

function updateRecordButton() {
  if (!canRecord()) {
    ui.record.disabled = true;
    ui.record.title = "Recording needs microphone access, which browsers give to pages over HTTPS or on localhost";
  }
}

async function startRecording() {
  clearError();
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
  } catch (error) {
    showError(`The microphone is not available: ${error.message}`);
    return;
  }
  const parts = [];
  const started = performance.now();
  recorder = new MediaRecorder(stream);
  recorder.addEventListener("dataavailable", (event) => {
    if (event.data.size > 0) parts.push(event.data);
  });
  recorder.addEventListener("stop", () => {
    stream.getTracks().forEach((track) => track.stop());
    const type = recorder.mimeType;
    recorder = null;
    clearInterval(timer);
    ui.record.textContent = "Record from the microphone";
    ui.clipStatus.textContent = "Encoding the recording…";
    recordingToWav(new Blob(parts, { type }))
      .then(({ file, duration }) => {
        ui.cloneFile.value = "";
        setClip(file, duration);
        if (duration < 3) showError(`The recording is ${duration.toFixed(1)} s long: the server needs at least 3 s.`);
      })
      .catch((error) => {
        setClip(null);
        showError(`The recording could not be read: ${error.message}`);
      });
  });
  const timer = setInterval(() => {
    const seconds = (performance.now() - started) / 1000;
    ui.clipStatus.textContent = `Recording… ${seconds.toFixed(1)} s`;
    if (seconds >= RECORD_SECONDS - 0.2 && recorder && recorder.state === "recording") recorder.stop();
  }, 100);
  recorder.start();
  ui.record.textContent = "Stop recording";
}

// The browser's own recording format (WebM or Ogg Opus, MP4) decoded here and sent as WAV, which
// every server build reads.
async function recordingToWav(blob) {
  const decoder = new OfflineAudioContext(1, 1, RECORD_RATE);
  const decoded = await decoder.decodeAudioData(await blob.arrayBuffer());
  const length = Math.min(decoded.length, Math.floor((RECORD_SECONDS - 0.1) * decoded.sampleRate));
  const mono = new Float32Array(length);
  for (let c = 0; c < decoded.numberOfChannels; c++) {
    const data = decoded.getChannelData(c);
    for (let i = 0; i < length; i++) mono[i] += data[i] / decoded.numberOfChannels;
  }
  const wav = encodeWav(mono, decoded.sampleRate);
  return { file: new File([wav], "recording.wav", { type: "audio/wav" }), duration: length / decoded.sampleRate };
}

ui.record.addEventListener("click", () => {
  if (recorder) {
    if (recorder.state === "recording") recorder.stop();
  } else {
    startRecording().catch(showError);
  }
});

ui.cloneForm.addEventListener("submit", async (event) => {
  event.preventDefault();
  clearError();
  if (!clip) {
    showError("Choose a clip or record one first.");
    return;
  }
  const form = new FormData();
  form.append("clip", clip, clip.name || "clip.wav");
  form.append("name", ui.cloneName.value.trim() || "Playground voice");
  form.append("language", ui.cloneLanguage.value.trim() || "en");
  form.append("description", "Cloned in the playground");
  ui.clone.disabled = true;
  notice("Cloning…");
  try {
    const voice = await (await api("/voices/clone", { method: "POST", body: form })).json();
    addVoiceOption(voice, true);
    publish("voices", voices.map((v) => ({ ...v })));
    publish("lastClone", voice);
    notice(`Cloned "${voice.name}" (${voice.id}) and selected it.`);
  } catch (error) {
    notice("");
    showError(error);
  } finally {
    ui.clone.disabled = !published.ready;
  }
});

// ---- start ----

async function start() {
  setReady(false);
  ui.download.disabled = true;
  drawWaveform([], 0);
  loadHealth();
  const settings = await (await fetch("/playground/settings.json", { cache: "no-store" })).json();
  publish("keyRequired", Boolean(settings.api_key_required));
  if (settings.api_key_required && !apiKey) {
    askForKey();
    notice("Enter the API key to start.");
    return;
  }
  try {
    await loadVoices(false);
  } catch (error) {
    showError(error);
    return;
  }
  setReady(true);
}

start().catch(showError);
