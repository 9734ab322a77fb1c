// The voiceedge browser client: one measured call per page (docs/browser.md).
//
// The driver (services/browser/session.py) opens /call?offer=gathered|immediate on the
// signaling front and awaits window.runSession(options). The session captures the fake
// microphone, POSTs its offer to /v1/calls (same origin), plays the agent's audio, sends one
// data-channel event, and returns its own view of the call as a plain object: timeline marks
// in ms since the peer connection was created (performance.now()), what getStats() said, and
// on failure a one-line error and the stage where it stopped. It never throws.
//
// A person uses the same session through the page's buttons (call.html): a long call with
// humanAudio, ended on demand by CallSession.hangup() (the call then ends ok, with its stats,
// and is DELETEd), with onUpdate reporting its progress. The driver uses neither.
"use strict";

const DATA_CHANNEL = "oai-events";
const MAX_EVENTS = 100;

const DEFAULTS = {
  url: "/v1/calls",            // signaling, resolved against the page
  token: null,                 // the bearer credential; null: the page URL's #token=
  index: 0,                    // the session's index (the data-channel ping names it)
  offerStyle: null,            // "gathered" | "immediate"; null: the page's ?offer=
  durationMs: 5000,            // call time after DTLS connected
  setupTimeoutMs: 10000,       // session start -> DTLS connected
  signalingTimeoutMs: 5000,    // the offer POST
  teardownTimeoutMs: 5000,     // the DELETE
  mediaTimeoutMs: 1500,        // no RTP for this long during the call: failed
  echoSkipMs: 200,             // received audio before first audio + this is not the echo
  setupPollMs: 10,             // getStats() period during setup (first ICE RTT, first audio)
  callPollMs: 500,             // getStats() period during the call (watchdog, samples)
  sampleIntervalMs: 1000,      // per-second media samples
  iceFromSignaling: false,     // GET /v1/ice-servers first, use its iceServers and policy
  humanAudio: false,           // a person's microphone: echo cancellation, noise suppression
                               // and gain control on (off: the fake microphone's tone as is)
  onUpdate: null,              // (what, session): "connected", "stats" (each call poll: session.live), "ended"
};

const HUNG_UP = "hung up";   // a hangup() before the call was connected: the setup's error

class SessionError extends Error {}

function oneLine(err) {
  const text = err instanceof SessionError ? err.message
    : `${(err && err.name) || "Error"}: ${(err && err.message) || String(err)}`;
  return text.split("\n")[0].slice(0, 300);
}

function round3(x) {
  return x == null ? null : Math.round(x * 1000) / 1000;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function hostPort(c) {
  if (!c) return null;
  const host = c.address || c.ip;
  return host.includes(":") ? `[${host}]:${c.port}` : `${host}:${c.port}`;
}

function deepEqual(a, b) {
  if (a === b) return true;
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a), kb = Object.keys(b);
  return ka.length === kb.length && ka.every((k) => deepEqual(a[k], b[k]));
}

function pingEvent(index) {  // the same event as the aiortc client's (services/client/session.py)
  return {type: "conversation.item.create",
          item: {type: "message", role: "user",
                 content: [{type: "input_text", text: `ping ${index}`}]}};
}

// The stats of one getStats() call that the session reads.
async function snapshot(pc) {
  const report = await pc.getStats();
  const s = {pairs: {}, candidates: {}, inbound: null, remoteInbound: null, transport: null};
  report.forEach((stat) => {
    if (stat.type === "candidate-pair") s.pairs[stat.id] = stat;
    else if (stat.type === "local-candidate" || stat.type === "remote-candidate")
      s.candidates[stat.id] = stat;
    else if (stat.type === "inbound-rtp" && stat.kind === "audio") s.inbound = stat;
    else if (stat.type === "remote-inbound-rtp" && stat.kind === "audio") s.remoteInbound = stat;
    else if (stat.type === "transport") s.transport = stat;
  });
  s.selected = (s.transport && s.pairs[s.transport.selectedCandidatePairId]) || null;
  return s;
}

class CallSession {
  constructor(options) {
    this.opts = {...DEFAULTS, ...(options || {})};
    this.style = this.opts.offerStyle || new URLSearchParams(location.search).get("offer")
      || "gathered";
    this.url = new URL(this.opts.url, location.href).href;
    // An API key or call token (docs/auth.md), from the fragment: a fragment is never sent to
    // a server, so the credential is in no request line and no access log.
    const token = this.opts.token || new URLSearchParams(location.hash.slice(1)).get("token");
    this.auth = token ? {Authorization: `Bearer ${token}`} : {};
    this.view = {
      ok: false, error: null, stage: "setup", offer_style: this.style, index: this.opts.index,
      started_unix: null, ended_unix: null,
      marks: {},                 // ms since the peer connection was created
      signaling_ms: null, offer_candidates: null, http_status: null, location: null,
      cluster: null, transceiver: null, ice_policy: null,
      pair: null,                // the selected candidate pair (below)
      first_rtt: null,           // {ms, responses} of the selected pair's first responses
      rtt_ms: null, jitter_ms: null, packets_received: 0, packets_lost: 0,
      echo: null,                // {energy, seconds} after first audio + echoSkipMs
      last_rx_unix: null, call_ms: null,
      playout: null,             // what NetEq did (finalStats)
      datachannel_verified: false, // the event came back inside the agent.echo envelope
      datachannel_echo: null,    // how it came back: "envelope", "raw" (as sent), or null
      events: [], samples: [],
      delete_status: null, teardown_error: null,
    };
    this.pc = null;
    this.stream = null;
    this.t0 = null;
    this.sent = null;          // the data-channel event sent
    this.firstRtt = {};        // candidate-pair id -> {ms, responses} at its first response
    this.connectedAt = null;   // performance.now() of DTLS connected
    this.answered = false;     // the POST got an SDP answer
    this.closing = false;
    this.failure = null;
    this.failed = new Promise((resolve) => { this.onFailed = resolve; });
    this.connected = new Promise((resolve) => { this.onConnected = resolve; });
    this.hungUp = false;       // hangup() was called
    this.hangupCalled = new Promise((resolve) => { this.onHangup = resolve; });
    this.live = null;          // the latest call poll: {t_ms, packets_received, packets_lost, jitter_ms, rtt_ms}
  }

  // Ends the call on demand: during the call, the call loop stops at once and the call ends
  // as one that ran its duration (ok, final stats, DELETE); before it is connected, the setup
  // stops with the error "hung up" (a POSTed offer's session is still DELETEd). After the
  // end: nothing.
  hangup() {
    if (this.hungUp || this.closing) return;
    this.hungUp = true;
    this.onHangup();
    if (this.connectedAt === null) this.fail(HUNG_UP);
  }

  notify(what) {
    if (typeof this.opts.onUpdate !== "function") return;
    try {
      this.opts.onUpdate(what, this);
    } catch (err) { /* the page's display is not the call's business */ }
  }

  ms(at) {
    return round3((at === undefined ? performance.now() : at) - this.t0);
  }

  mark(name, at) {
    if (this.view.marks[name] === undefined) this.view.marks[name] = this.ms(at);
  }

  fail(reason) {
    if (this.closing || this.failure) return;
    this.failure = reason;
    this.onFailed(reason);
  }

  async run() {
    const v = this.view;
    try {
      const ice = this.opts.iceFromSignaling ? await this.iceServers()
        : {iceServers: [], iceTransportPolicy: "all"};
      v.ice_policy = ice.iceTransportPolicy || "all";
      this.stream = await this.microphone();
      if (this.hungUp) throw new SessionError(HUNG_UP);  // while the microphone was asked for
      this.t0 = performance.now();  // the session's clock: just before the peer connection
      v.started_unix = (performance.timeOrigin + this.t0) / 1000;
      await this.withTimeout(this.connect(ice), this.opts.setupTimeoutMs, "setup timeout");
      v.stage = "call";
      this.notify("connected");
      await this.call();
      v.stage = "done";
      v.ok = true;
    } catch (err) {
      v.error = oneLine(err);
    } finally {
      if (this.t0 === null) {
        this.t0 = performance.now();
        v.started_unix = (performance.timeOrigin + this.t0) / 1000;
      }
      await this.teardown();
      v.ended_unix = (performance.timeOrigin + performance.now()) / 1000;
      this.notify("ended");
    }
    return v;
  }

  async withTimeout(promise, ms, reason) {
    let timer;
    const deadline = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new SessionError(reason)), ms);
    });
    try {
      return await Promise.race([promise, deadline]);
    } finally {
      clearTimeout(timer);
    }
  }

  // The audio the call sends. Echo cancellation, noise suppression and gain control would
  // treat the steady tone as noise or echo and change its level: off, as the aiortc client
  // sends the tone as is. A person with speakers talking to the echo agent needs them on
  // (else it feeds back). A subclass may send other audio (talk.js).
  async microphone() {
    const processing = Boolean(this.opts.humanAudio);
    return navigator.mediaDevices.getUserMedia({
      audio: {echoCancellation: processing, noiseSuppression: processing,
              autoGainControl: processing},
      video: false});
  }

  peerConfiguration(ice) {
    return {iceServers: ice.iceServers, iceTransportPolicy: ice.iceTransportPolicy || "all",
            bundlePolicy: "max-bundle"};
  }

  onSender(sender) {}  // each track's sender as it is added (talk.js watches what it sends)

  async iceServers() {
    // credentials "omit": Chrome keeps such requests in a socket group of their own, so the
    // offer's POST does not reuse this connection (it opens its own, as without TURN).
    const url = new URL("/v1/ice-servers", this.url).href;
    let resp;
    try {
      resp = await fetch(url, {credentials: "omit", cache: "no-store", headers: this.auth,
                               signal: AbortSignal.timeout(this.opts.signalingTimeoutMs)});
    } catch (err) {
      throw new SessionError(`ice servers: ${oneLine(err)}`);
    }
    if (resp.status !== 200) throw new SessionError(`ice servers: HTTP ${resp.status} from ${url}`);
    const body = await resp.json();
    if (!body || !Array.isArray(body.iceServers))
      throw new SessionError("ice servers: unusable answer: no iceServers list");
    return body;
  }

  // -- setup ---------------------------------------------------------------------------------

  async connect(ice) {
    const v = this.view;
    const pc = this.pc = new RTCPeerConnection(this.peerConfiguration(ice));
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") this.gatheredAt = performance.now();
    });
    pc.addEventListener("iceconnectionstatechange", () => {
      const state = pc.iceConnectionState;
      if (state === "checking") this.mark("ice_checking");
      else if (state === "connected" || state === "completed") this.mark("ice_connected");
      else if (state === "failed") this.fail("ICE failed");
    });
    pc.addEventListener("connectionstatechange", () => {
      const state = pc.connectionState;
      if (state === "connected" && this.connectedAt === null) {
        this.connectedAt = performance.now();
        this.mark("connected", this.connectedAt);
        this.onConnected();
      } else if (state === "failed" || state === "closed") {
        this.fail(`connection ${state}`);
      }
    });
    pc.addEventListener("track", (ev) => this.onTrack(ev));
    for (const track of this.stream.getAudioTracks()) this.onSender(pc.addTrack(track, this.stream));
    const channel = pc.createDataChannel(DATA_CHANNEL);
    channel.addEventListener("open", () => this.onChannelOpen(channel));
    channel.addEventListener("message", (ev) => this.onChannelMessage(ev.data));

    const offer = await pc.createOffer();
    await pc.setLocalDescription(offer);
    // The one (BUNDLE) DTLS transport: its own state change is the handshake's end, reported
    // ahead of connectionState, which Chrome updates in a later task.
    const dtls = pc.getSenders()[0].transport;
    dtls.addEventListener("statechange", () => {
      if (dtls.state === "connected") this.mark("dtls_connected");
      else if (dtls.state === "failed") this.fail("DTLS failed");
    });
    let sdp;
    if (this.style === "immediate") {
      // No trickle: the offer as created, before any candidate; the server learns the
      // client's address from its first check (a peer-reflexive candidate).
      sdp = offer.sdp;
    } else {
      await this.gathered();
      this.mark("gathered", this.gatheredAt);
      sdp = pc.localDescription.sdp;
    }
    v.offer_candidates = (sdp.match(/^a=candidate:/gm) || []).length;
    if (this.hungUp) throw new SessionError(HUNG_UP);  // no offer POSTed: nothing to DELETE

    const answer = await this.post(sdp);
    v.stage = "connect";
    try {
      await pc.setRemoteDescription({type: "answer", sdp: answer});
    } catch (err) {
      throw new SessionError(`unusable SDP answer: ${oneLine(err)}`);
    }
    this.setupPolling = this.pollSetup();
    const failed = this.failed.then((reason) => { throw new SessionError(reason); });
    await Promise.race([this.connected, failed]);
  }

  gathered() {
    const pc = this.pc;
    if (pc.iceGatheringState === "complete") {
      this.gatheredAt = this.gatheredAt || performance.now();
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const check = () => {
        if (pc.iceGatheringState === "complete") {
          pc.removeEventListener("icegatheringstatechange", check);
          resolve();
        }
      };
      pc.addEventListener("icegatheringstatechange", check);
    });
  }

  async post(sdp) {
    const v = this.view;
    const sent = performance.now();
    this.mark("offer", sent);
    v.stage = "signaling";
    let resp, body;
    try {
      resp = await fetch(this.url, {
        method: "POST", body: sdp, headers: {"Content-Type": "application/sdp", ...this.auth},
        cache: "no-store", signal: AbortSignal.timeout(this.opts.signalingTimeoutMs)});
      body = await resp.text();
    } catch (err) {
      if (err && err.name === "TimeoutError")
        throw new SessionError(`signaling timeout: no answer within ` +
                               `${this.opts.signalingTimeoutMs / 1000} s`);
      throw new SessionError(`signaling failed: ${oneLine(err)}`);
    }
    const got = performance.now();
    this.mark("answer", got);
    v.signaling_ms = round3(got - sent);
    v.http_status = resp.status;
    const reason = body.trim().split("\n")[0].slice(0, 200) || "(no reason given)";
    if (resp.status !== 200 && resp.status !== 201) throw new SessionError(`HTTP ${resp.status}: ${reason}`);
    if (!body.trimStart().startsWith("v=0"))
      throw new SessionError(`HTTP ${resp.status} but the body is not an SDP answer: ${reason}`);
    this.answered = true;
    const loc = resp.headers.get("Location");
    v.location = loc ? new URL(loc, this.url).href : null;
    v.cluster = resp.headers.get("X-Voiceedge-Cluster");
    v.transceiver = resp.headers.get("X-Voiceedge-Transceiver");
    return body;
  }

  // Every setupPollMs from the answer until the selected pair's first responses and the first
  // inbound packets are seen (or 3 s after connected): the first ICE RTT is the pair's
  // totalRoundTripTime / responsesReceived when it first has responses (exact for one).
  async pollSetup() {
    while (!this.closing) {
      let s;
      try {
        s = await snapshot(this.pc);
      } catch (err) {
        return;
      }
      const at = performance.now();
      for (const [id, pair] of Object.entries(s.pairs)) {
        if (!this.firstRtt[id] && pair.responsesReceived > 0 && pair.totalRoundTripTime != null) {
          this.firstRtt[id] = {ms: round3(pair.totalRoundTripTime / pair.responsesReceived * 1000),
                               responses: pair.responsesReceived};
        }
      }
      if (s.inbound && s.inbound.packetsReceived > 0) this.mark("first_audio_stats", at);
      const haveRtt = s.selected && this.firstRtt[s.selected.id];
      if (haveRtt && this.view.marks.first_audio_stats !== undefined) return;
      if (this.connectedAt !== null && at - this.connectedAt > 3000) return;
      await sleep(this.opts.setupPollMs);
    }
  }

  onTrack(ev) {
    if (ev.track.kind !== "audio") return;
    const audio = document.getElementById("remote");
    audio.srcObject = ev.streams[0] || new MediaStream([ev.track]);
    audio.play().catch(() => {});  // autoplay is allowed by the driver's flags
    // A remote track is muted until its first RTP packet arrives.
    ev.track.addEventListener("unmute", () => this.mark("first_audio"), {once: true});
  }

  onChannelOpen(channel) {
    this.mark("datachannel_open");
    this.sent = pingEvent(this.opts.index);
    channel.send(JSON.stringify(this.sent));
  }

  onChannelMessage(data) {
    let event = null;
    try {
      event = JSON.parse(data);
    } catch (err) { /* not JSON */ }
    const isObject = event !== null && typeof event === "object" && !Array.isArray(event);
    const kind = isObject ? String(event.type) : "(not a JSON object)";
    if (this.view.events.length < MAX_EVENTS) this.view.events.push(kind);
    if (this.sent === null || this.view.datachannel_echo === "envelope") return;
    if (kind === "agent.echo" && deepEqual(event.event, this.sent)) {
      this.view.datachannel_verified = true;
      this.view.datachannel_echo = "envelope";
    } else if (event !== null && deepEqual(event, this.sent)) {
      this.view.datachannel_echo = "raw";  // an edge that echoes events as they came
    }
  }

  // -- call ----------------------------------------------------------------------------------

  // The call: durationMs from DTLS connected, or until hangup(). getStats() every callPollMs:
  // the media watchdog (no new packet for mediaTimeoutMs fails the call), a sample every
  // sampleIntervalMs, and the echo's baseline once first audio + echoSkipMs has passed.
  async call() {
    const v = this.view, o = this.opts;
    const end = this.connectedAt + o.durationMs;
    let received = -1, lastNew = this.connectedAt, nextSample = this.connectedAt + o.sampleIntervalMs;
    const failed = this.failed.then((reason) => reason);
    const hungUp = this.hangupCalled.then(() => true);
    while (!this.hungUp) {
      const now = performance.now();
      if (now >= end) break;
      const wait = Math.min(o.callPollMs, end - now);
      const reason = await Promise.race([sleep(wait), failed, hungUp]);
      if (typeof reason === "string") throw new SessionError(reason);
      if (this.hungUp) break;
      const s = await snapshot(this.pc);
      const at = performance.now();
      const inbound = s.inbound;
      const got = inbound ? inbound.packetsReceived : 0;
      if (got > received) {
        received = got;
        lastNew = at;
      } else if (at - lastNew >= o.mediaTimeoutMs) {
        throw new SessionError("media timeout");
      }
      this.echoBaseline(s, at);
      if (at >= nextSample && at < end) {
        v.samples.push(this.sample(s, at));
        nextSample += o.sampleIntervalMs;
      }
      this.setLive(s, at);
    }
    const s = await snapshot(this.pc);
    this.finalStats(s);
    v.samples.push(this.sample(s, performance.now()));
  }

  setLive(s, at) {
    if (typeof this.opts.onUpdate !== "function") return;  // only a page that shows it
    const [t_ms, packets_received, packets_lost, jitter_ms, rtt_ms] = this.sample(s, at);
    this.live = {t_ms, packets_received, packets_lost, jitter_ms, rtt_ms};
    this.notify("stats");
  }

  echoBaseline(s, at) {
    const first = this.view.marks.first_audio;
    if (this.baseline || first === undefined || !s.inbound) return;
    if (this.ms(at) >= first + this.opts.echoSkipMs) {
      this.baseline = {energy: s.inbound.totalAudioEnergy || 0,
                       seconds: s.inbound.totalSamplesDuration || 0};
    }
  }

  sample(s, at) {
    const inbound = s.inbound || {};
    return [this.ms(at), inbound.packetsReceived || 0, Math.max(0, inbound.packetsLost || 0),
            inbound.jitter == null ? null : round3(inbound.jitter * 1000),
            s.remoteInbound && s.remoteInbound.roundTripTime != null
              ? round3(s.remoteInbound.roundTripTime * 1000) : null];
  }

  finalStats(s) {
    const v = this.view;
    v.call_ms = round3(performance.now() - this.connectedAt);
    const inbound = s.inbound;
    if (inbound) {
      v.packets_received = inbound.packetsReceived || 0;
      v.packets_lost = Math.max(0, inbound.packetsLost || 0);
      v.jitter_ms = inbound.jitter == null ? null : round3(inbound.jitter * 1000);
      if (inbound.lastPacketReceivedTimestamp) v.last_rx_unix = inbound.lastPacketReceivedTimestamp / 1000;
      // what Chrome's jitter buffer (NetEq) did to the audio it played
      v.playout = {
        jitter_buffer_delay_ms: inbound.jitterBufferEmittedCount
          ? round3(inbound.jitterBufferDelay / inbound.jitterBufferEmittedCount * 1000) : null,
        concealed_samples: inbound.concealedSamples || 0,
        silent_concealed_samples: inbound.silentConcealedSamples || 0,
        inserted_for_deceleration: inbound.insertedSamplesForDeceleration || 0,
        removed_for_acceleration: inbound.removedSamplesForAcceleration || 0,
        total_samples_received: inbound.totalSamplesReceived || 0,
      };
      if (this.baseline) {
        v.echo = {energy: (inbound.totalAudioEnergy || 0) - this.baseline.energy,
                  seconds: (inbound.totalSamplesDuration || 0) - this.baseline.seconds,
                  audio_level: inbound.audioLevel == null ? null : inbound.audioLevel};
      }
    }
    if (s.remoteInbound && s.remoteInbound.roundTripTime != null)
      v.rtt_ms = round3(s.remoteInbound.roundTripTime * 1000);
    const pair = s.selected;
    if (pair) {
      const local = s.candidates[pair.localCandidateId], remote = s.candidates[pair.remoteCandidateId];
      v.pair = {local: hostPort(local), local_type: local && local.candidateType,
                remote: hostPort(remote), remote_type: remote && remote.candidateType,
                current_rtt_ms: pair.currentRoundTripTime == null ? null
                  : round3(pair.currentRoundTripTime * 1000),
                requests_sent: pair.requestsSent, responses_received: pair.responsesReceived};
      v.first_rtt = this.firstRtt[pair.id] || null;
    }
  }

  // -- teardown ------------------------------------------------------------------------------

  async teardown() {
    const v = this.view;
    this.closing = true;
    if (this.pc && this.connectedAt !== null && v.pair === null) {
      try {  // a call that failed: what the stats still say
        this.finalStats(await snapshot(this.pc));
      } catch (err) { /* a closed connection */ }
    }
    if (this.setupPolling) await this.setupPolling;
    if (v.location) {
      try {
        const resp = await fetch(v.location, {
          method: "DELETE", cache: "no-store", headers: this.auth,
          signal: AbortSignal.timeout(this.opts.teardownTimeoutMs)});
        v.delete_status = resp.status;
        if (resp.status !== 200 && resp.status !== 204)
          v.teardown_error = `DELETE returned HTTP ${resp.status}`;
      } catch (err) {
        v.teardown_error = err && err.name === "TimeoutError"
          ? `DELETE timeout after ${this.opts.teardownTimeoutMs / 1000} s`
          : `DELETE failed: ${oneLine(err)}`;
      }
    } else if (this.answered) {
      v.teardown_error = "the answer had no Location header: session not deleted";
    }
    if (this.pc) this.pc.close();
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    const audio = document.getElementById("remote");
    if (audio) audio.srcObject = null;
  }
}

window.CallSession = CallSession;
window.runSession = (options) => new CallSession(options).run();
