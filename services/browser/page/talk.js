// A call page that speaks in turns and times what it hears (docs/conversation.md, "The
// Chromium caller"). The driver (services/browser/talk.py) adds this script to the call page
// and runs window.runTalkSession(options): the call of call.js, with these differences.
//
// - The microphone is a WebAudio graph: the driver's speak(k) plays line k (mono 48 kHz PCM
//   it gave the page) into a MediaStreamAudioDestinationNode whose track the call sends.
// - What the call sends and receives is watched as encoded frames (the peer connection's
//   encoded insertable streams: a sent frame has left the Opus encoder for the packetizer; a
//   received one has arrived, before NetEq, Chrome's jitter buffer): the time and size of
//   each, nothing changed. A sent frame is voiced if it decodes (WebCodecs) to VOICED_DBFS or
//   more, the agent's rule; the line's last voiced frame out is the time its speech ended.
// - What it hears: the remote track through a MediaStreamAudioSourceNode into an AudioWorklet
//   that hands out its samples 20 ms at a time, each with the time the audio output device
//   plays its first sample (AudioContext.getOutputTimestamp: the context's clock against
//   performance.now(), which the page turns into the wall clock with performance.timeOrigin).
// - The agent's events on the data channel, with the time each arrived.
// - What NetEq did, sampled at every flush: its counters of concealed samples and of samples
//   inserted and removed to stretch time (the driver charges each reply what changed while it
//   played: a reply Chrome concealed or stretched is not the reply the agent sent).
//
// Everything is sent to the driver in batches (window.voiceedgeTalk, a Playwright binding)
// every FLUSH_MS; the driver runs the conversation (services/client/conversation.py).
"use strict";

const VOICED_DBFS = -45;       // a frame this loud is speech (services/client/conversation.py)
const FRAME = 960;             // 20 ms at 48 kHz
const FRAME_US = 20000;
// Each batch is a round trip through the browser process and Playwright's driver: five
// frames a batch halve what the page costs the machine; the conversation reacts to what it
// heard up to this much later (its figures are the page's own times, not when it learned them).
const FLUSH_MS = 100;
const SPOKEN_WAIT_MS = 120;    // after a line's last sample: its last frames have been encoded
const JUDGE_WAIT_MS = 2000;    // and then at most this long for the decoder to judge them
const LEAD_S = 0.01;           // a line starts this far ahead of the context's current time

const EAR_WORKLET = `
class Ear extends AudioWorkletProcessor {
  constructor() {
    super();
    this.frame = new Int16Array(${FRAME});
    this.n = 0;
    this.first = 0;      // context time of the frame's first sample
    this.count = 0;      // frames handed out
  }
  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    const size = input ? input.length : 128;
    for (let i = 0; i < size; i++) {
      if (this.n === 0) this.first = currentTime + i / sampleRate;
      const x = input ? Math.max(-1, Math.min(1, input[i])) : 0;
      this.frame[this.n++] = Math.round(x * 32767);
      if (this.n === ${FRAME}) {
        this.port.postMessage({t: this.first, pts: this.count * ${FRAME}, pcm: this.frame.buffer},
                              [this.frame.buffer]);
        this.frame = new Int16Array(${FRAME});
        this.n = 0;
        this.count++;
      }
    }
    return true;
  }
}
registerProcessor("voiceedge-ear", Ear);
`;

function wallNow() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function base64(buffer) {
  const bytes = new Uint8Array(buffer);
  let text = "";
  for (let i = 0; i < bytes.length; i += 0x8000)
    text += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  return btoa(text);
}

function pcmOf(text) {  // base64 of mono s16le -> Float32Array
  const raw = atob(text);
  const out = new Float32Array(raw.length >> 1);
  for (let i = 0; i < out.length; i++) {
    const v = raw.charCodeAt(2 * i) | (raw.charCodeAt(2 * i + 1) << 8);
    out[i] = (v >= 0x8000 ? v - 0x10000 : v) / 32768;
  }
  return out;
}

// Pipes one side's encoded frames through unchanged, telling `seen` of each.
function watch(streams, seen) {
  streams.readable.pipeThrough(new TransformStream({
    transform(frame, controller) {
      try {  // before the frame goes on (its data may not be readable after); never in its way
        seen(wallNow(), frame.data.byteLength, frame);
      } catch (err) { /* a frame not watched; the call goes on */ }
      controller.enqueue(frame);
    },
  })).pipeTo(streams.writable).catch(() => {});
}

class TalkSession extends CallSession {
  constructor(options) {
    super(options);
    this.lines = [];
    this.outbox = TalkSession.emptyBox();
    this.receiver = null;     // the audio's RTCRtpReceiver: NetEq's counters
    this.judge = null;        // the decoder that judges the frames sent voiced
    this.judgeCount = 0;
    this.judging = new Map(); // frame number -> [line, when sent], until the decoder has judged it
    // the line playing: {k, from and to (wall times of its first and last sample), frames
    // sent since, voicedEnd (when the last of them judged voiced was sent)}
    this.line = null;
    this.ctx = null;
    this.mouth = null;        // the microphone: a MediaStreamAudioDestinationNode
    this.flusher = null;
  }

  async microphone() {
    this.lines = (this.opts.lines || []).map(pcmOf);
    const ctx = this.ctx = new AudioContext({sampleRate: 48000, latencyHint: "interactive"});
    await ctx.resume();
    const module = URL.createObjectURL(new Blob([EAR_WORKLET], {type: "text/javascript"}));
    await ctx.audioWorklet.addModule(module);
    this.mouth = ctx.createMediaStreamDestination();
    // Without a source playing into it the destination's track carries no audio at all, so
    // no packet would go out between lines (and the agent's hangover, which counts silent
    // frames, would never run out): a source of zeros plays into it for the whole call.
    const silence = ctx.createConstantSource();
    silence.offset.value = 0;
    silence.connect(this.mouth);
    silence.start();
    this.flusher = setInterval(() => this.flush(), FLUSH_MS);
    return this.mouth.stream;
  }

  peerConfiguration(ice) {
    return {...super.peerConfiguration(ice), encodedInsertableStreams: true};
  }

  // Each frame sent while a line plays is decoded (WebCodecs) to judge it voiced as the
  // agent will: the same frame (the transceiver decodes it whole) by the same rule (its RMS
  // at VOICED_DBFS or more). Chrome's 20 ms frames do not line up with the line's own, and
  // Opus spends more than VOICED_MIN_BYTES on the quiet end of a word, so the size alone
  // would put the line's end a frame or two late.
  onSender(sender) {
    watch(sender.createEncodedStreams(), (at, size, frame) => {
      const line = this.line;
      if (line === null || at < line.from) return;
      if (line.frames++ === 0) this.outbox.started.push({line: line.k, first_out: at});
      const judge = this.judge && this.judge.state === "configured" ? this.judge : this.newJudge();
      const n = this.judgeCount++;
      this.judging.set(n, [line, at]);
      judge.decode(new EncodedAudioChunk({type: "key", timestamp: n * FRAME_US,
                                          data: frame.data}));
    });
  }

  newJudge() {  // a decoder that failed is closed: a new one, and what the old one held is lost
    this.judging.clear();
    this.judge = new AudioDecoder({output: (data) => this.judged(data), error: () => {}});
    this.judge.configure({codec: "opus", sampleRate: 48000, numberOfChannels: 1});
    return this.judge;
  }

  judged(data) {
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, {planeIndex: 0, format: "f32-planar"});
    const n = Math.round(data.timestamp / FRAME_US);  // the decoder may round it by 1 us
    data.close();
    const entry = this.judging.get(n);
    if (entry === undefined) return;
    this.judging.delete(n);
    let power = 0;
    for (const x of samples) power += x * x;
    power /= samples.length || 1;
    const [line, at] = entry;
    if (power > 0 && 10 * Math.log10(power) >= VOICED_DBFS && at > (line.voicedEnd || 0))
      line.voicedEnd = at;
  }

  onTrack(ev) {
    super.onTrack(ev);  // the <audio> element: Chrome decodes remote audio only while a sink pulls it
    if (ev.track.kind !== "audio") return;
    this.receiver = ev.receiver;
    watch(ev.receiver.createEncodedStreams(), (at, size) => this.outbox.arrived.push([at, size]));
    const ctx = this.ctx;
    const source = ctx.createMediaStreamSource(new MediaStream([ev.track]));
    const ear = new AudioWorkletNode(ctx, "voiceedge-ear", {numberOfInputs: 1, numberOfOutputs: 0});
    ear.port.onmessage = (msg) => {
      const stamp = ctx.getOutputTimestamp();
      const played = (performance.timeOrigin + stamp.performanceTime) / 1000
        + (msg.data.t - stamp.contextTime);
      this.outbox.heard.push([played, msg.data.pts, base64(msg.data.pcm)]);
    };
    source.connect(ear);
  }

  onChannelMessage(data) {
    super.onChannelMessage(data);
    this.outbox.events.push([wallNow(), String(data)]);
  }

  notify(what) {
    super.notify(what);
    if (what === "connected") this.outbox.connected = wallNow();
  }

  // Plays line k now. Its speech started when its first frame left the encoder (`started`,
  // as it happens) and ended when its last voiced frame did (`spoken`, once the line has
  // played out).
  speak(k) {
    const pcm = this.lines[k];
    if (!pcm || this.ctx === null) throw new Error(`no line ${k}`);
    const ctx = this.ctx;
    const buffer = ctx.createBuffer(1, pcm.length, 48000);
    buffer.copyToChannel(pcm, 0);
    const node = ctx.createBufferSource();
    node.buffer = buffer;
    node.connect(this.mouth);
    const from = wallNow() + LEAD_S;   // the render clock: a block is rendered as it is due
    node.start(ctx.currentTime + LEAD_S);
    this.line = {k, from, to: from + pcm.length / 48000, frames: 0, voicedEnd: null};
    const line = this.line;
    setTimeout(() => this.spoken(line), (line.to - wallNow()) * 1000 + SPOKEN_WAIT_MS);
  }

  spoken(line, waited = 0) {
    if (this.line !== line) return;   // a later line replaced it: that one reports
    const judging = [...this.judging.values()].some(([l]) => l === line);
    if (judging && waited < JUDGE_WAIT_MS) {  // the decoder is behind (a loaded page)
      setTimeout(() => this.spoken(line, waited + FRAME_US / 1000), FRAME_US / 1000);
      return;
    }
    this.outbox.spoken.push({line: line.k, voiced_end: line.voicedEnd});
    this.line = null;
  }

  static emptyBox() {
    return {heard: [], arrived: [], events: [], started: [], spoken: [], playout: [],
            connected: null};
  }

  flush() {
    this.samplePlayout();
    const box = this.outbox;
    if (!box.heard.length && !box.arrived.length && !box.events.length && !box.started.length
        && !box.spoken.length && !box.playout.length && box.connected === null) return;
    this.outbox = TalkSession.emptyBox();
    if (typeof window.voiceedgeTalk === "function") window.voiceedgeTalk(box).catch(() => {});
  }

  // NetEq's counters now, into the next batch: [wall time, concealed, inserted, removed].
  samplePlayout() {
    if (this.receiver === null) return;
    const at = wallNow();
    this.receiver.getStats().then((report) => {
      for (const stat of report.values()) {
        if (stat.type !== "inbound-rtp" || stat.kind !== "audio") continue;
        this.outbox.playout.push([at, stat.concealedSamples || 0,
                                  stat.insertedSamplesForDeceleration || 0,
                                  stat.removedSamplesForAcceleration || 0]);
      }
    }).catch(() => {});
  }

  async teardown() {
    if (this.ctx !== null) {  // what the audio output adds to every frame heard, its glitches
      this.view.audio_output_latency_ms = round3(this.ctx.outputLatency * 1000);
      const stats = this.ctx.playbackStats;
      if (stats) this.view.audio_underruns = {events: stats.underrunEvents,
                                              ms: round3(stats.underrunDuration * 1000)};
    }
    if (this.flusher !== null) clearInterval(this.flusher);
    this.flush();
    await super.teardown();
    if (this.ctx !== null) await this.ctx.close().catch(() => {});
  }
}

window.runTalkSession = (options) => {
  window.talkSession = new TalkSession(options);
  return window.talkSession.run();
};
