// moshi-rs web page: talk to Moshi from a browser. Microphone -> Opus (WebCodecs) in Ogg pages
// -> websocket /api/chat (Kyutai's protocol) -> Ogg/Opus back -> playback, plus the words as
// they come and live figures (latency, missed and dropped audio). No third-party code.

const RATE = 24000;
const FRAME_SAMPLES = 1920; // Moshi's 80 ms frame
const PACKET_SAMPLES = 480; // 20 ms Opus packets, as Kyutai's web UI sends them
const KIND = { handshake: 0, audio: 1, text: 2, metadata: 4, error: 5 };

// ---- Ogg pages (RFC 3533) ----------------------------------------------------------------

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let r = i << 24;
    for (let j = 0; j < 8; j++) {
      r = r & 0x80000000 ? (r << 1) ^ 0x04c11db7 : r << 1;
    }
    t[i] = r >>> 0;
  }
  return t;
})();

function oggCrc(bytes) {
  let crc = 0;
  for (let i = 0; i < bytes.length; i++) {
    crc = ((crc << 8) ^ CRC_TABLE[((crc >>> 24) ^ bytes[i]) & 0xff]) >>> 0;
  }
  return crc >>> 0;
}

/// One Ogg page holding whole `packets` (each < 255 * 255 bytes).
function oggPage(packets, { serial, sequence, granule, first = false }) {
  const lacing = [];
  for (const p of packets) {
    let n = p.length;
    while (n >= 255) {
      lacing.push(255);
      n -= 255;
    }
    lacing.push(n);
  }
  const bodyLen = packets.reduce((a, p) => a + p.length, 0);
  const page = new Uint8Array(27 + lacing.length + bodyLen);
  const v = new DataView(page.buffer);
  page.set([0x4f, 0x67, 0x67, 0x53]); // "OggS"
  page[4] = 0; // version
  page[5] = first ? 0x02 : 0x00;
  v.setBigUint64(6, BigInt(granule), true);
  v.setUint32(14, serial, true);
  v.setUint32(18, sequence, true);
  v.setUint32(22, 0, true);
  page[26] = lacing.length;
  page.set(lacing, 27);
  let o = 27 + lacing.length;
  for (const p of packets) {
    page.set(p, o);
    o += p.length;
  }
  v.setUint32(22, oggCrc(page), true);
  return page;
}

/// Splits Ogg bytes into packets (a packet may continue on the next page or message).
class OggPacketReader {
  constructor() {
    this.pending = new Uint8Array(0);
    this.partial = [];
  }

  push(bytes) {
    const buf = new Uint8Array(this.pending.length + bytes.length);
    buf.set(this.pending);
    buf.set(bytes, this.pending.length);
    const packets = [];
    let o = 0;
    while (buf.length - o >= 27) {
      if (buf[o] !== 0x4f || buf[o + 1] !== 0x67 || buf[o + 2] !== 0x67 || buf[o + 3] !== 0x53) {
        throw new Error("audio from the server is not an Ogg stream");
      }
      const nseg = buf[o + 26];
      if (buf.length - o < 27 + nseg) break;
      let bodyLen = 0;
      for (let i = 0; i < nseg; i++) bodyLen += buf[o + 27 + i];
      if (buf.length - o < 27 + nseg + bodyLen) break;
      let p = o + 27 + nseg;
      for (let i = 0; i < nseg; i++) {
        const l = buf[o + 27 + i];
        this.partial.push(buf.subarray(p, p + l));
        p += l;
        if (l < 255) {
          const len = this.partial.reduce((a, x) => a + x.length, 0);
          const packet = new Uint8Array(len);
          let q = 0;
          for (const x of this.partial) {
            packet.set(x, q);
            q += x.length;
          }
          packets.push(packet);
          this.partial = [];
        }
      }
      this.partial = this.partial.map((x) => x.slice());
      o = p;
    }
    this.pending = buf.slice(o);
    return packets;
  }
}

function startsWith(bytes, ascii) {
  if (bytes.length < ascii.length) return false;
  for (let i = 0; i < ascii.length; i++) if (bytes[i] !== ascii.charCodeAt(i)) return false;
  return true;
}

function opusHead(preSkip48k) {
  const h = new Uint8Array(19);
  const v = new DataView(h.buffer);
  h.set(new TextEncoder().encode("OpusHead"));
  h[8] = 1; // version
  h[9] = 1; // mono
  v.setUint16(10, preSkip48k, true);
  v.setUint32(12, RATE, true);
  v.setInt16(16, 0, true);
  h[18] = 0;
  return h;
}

function opusTags() {
  const vendor = new TextEncoder().encode("moshi-rs web page");
  const t = new Uint8Array(8 + 4 + vendor.length + 4);
  const v = new DataView(t.buffer);
  t.set(new TextEncoder().encode("OpusTags"));
  v.setUint32(8, vendor.length, true);
  t.set(vendor, 12);
  v.setUint32(12 + vendor.length, 0, true);
  return t;
}

/// Linear-interpolation resampler for the decoder's output (browsers may decode Opus at 48 kHz
/// whatever rate was asked; the stream itself holds nothing above 12 kHz).
class Resampler {
  constructor(fromRate, toRate) {
    this.step = fromRate / toRate;
    this.pos = 0; // position of the next output sample, in input samples from `last`
    this.last = 0;
  }

  process(input) {
    const out = new Float32Array(Math.max(0, Math.ceil((input.length - this.pos) / this.step)));
    let n = 0;
    while (this.pos < input.length && n < out.length) {
      const i = Math.floor(this.pos);
      const f = this.pos - i;
      const a = i === 0 ? this.last : input[i - 1];
      const b = input[i];
      out[n++] = a + (b - a) * f;
      this.pos += this.step;
    }
    this.pos -= input.length;
    this.last = input[input.length - 1];
    return out.subarray(0, n);
  }
}

// ---- the page ----------------------------------------------------------------------------

const $ = (id) => document.getElementById(id);

class Conversation {
  constructor(ui) {
    this.ui = ui;
    this.samplesSent = 0;
    this.serverDroppedFrames = 0;
    this.serverComputeMs = 0;
    this.playback = { played: 0, missed: 0, skipped: 0, received: 0, buffered: 0 };
    this.sequence = 0;
    this.serial = (Math.random() * 0xffffffff) >>> 0;
    this.granule = 0;
    this.headerSent = false;
    this.handshake = false;
    this.closed = false;
    this.oggIn = new OggPacketReader();
    this.decoderReady = false;
  }

  async start(params) {
    const { ui } = this;
    if (typeof AudioEncoder === "undefined" || typeof AudioDecoder === "undefined") {
      throw new Error("this browser has no WebCodecs audio (use a recent Chrome, Edge, Safari or Firefox)");
    }
    const encoderConfig = {
      codec: "opus",
      sampleRate: RATE,
      numberOfChannels: 1,
      bitrate: 32000,
      opus: { frameDuration: (PACKET_SAMPLES * 1e6) / RATE },
    };
    const support = await AudioEncoder.isConfigSupported(encoderConfig);
    if (!support.supported) throw new Error("this browser cannot encode Opus at 24 kHz");

    const processing = params.get("processing") !== "off";
    this.media = await navigator.mediaDevices.getUserMedia({
      audio: {
        channelCount: 1,
        echoCancellation: processing,
        noiseSuppression: processing,
        autoGainControl: processing,
      },
    });
    this.ctx = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
    await this.ctx.audioWorklet.addModule("/moshi-rs-worklets.js");
    this.playbackNode = new AudioWorkletNode(this.ctx, "moshi-playback", {
      numberOfInputs: 0,
      outputChannelCount: [1],
      processorOptions: { targetMs: 60, maxMs: 400 },
    });
    this.playbackNode.port.onmessage = (e) => (this.playback = e.data);
    this.playbackNode.connect(this.ctx.destination);

    this.encoder = new AudioEncoder({
      output: (chunk, meta) => this.onEncoded(chunk, meta),
      error: (e) => this.fail(`Opus encoder: ${e.message}`),
    });
    this.encoder.configure(encoderConfig);
    this.decoder = new AudioDecoder({
      output: (data) => this.onDecoded(data),
      error: (e) => this.fail(`Opus decoder: ${e.message}`),
    });

    const proto = location.protocol === "https:" ? "wss" : "ws";
    const query = new URLSearchParams({ stats_s: "1" });
    for (const key of ["text_temperature", "text_topk", "audio_temperature", "audio_topk", "seed"]) {
      const v = ui.setting(key);
      if (v !== "") query.set(key, v);
    }
    this.ws = new WebSocket(`${proto}://${location.host}/api/chat?${query}`);
    this.ws.binaryType = "arraybuffer";
    this.ws.onmessage = (e) => this.onMessage(new Uint8Array(e.data));
    this.ws.onclose = (e) => this.onClose(e);
    this.ws.onerror = () => ui.status("connection error", "error");
    ui.status("connecting...");

    const source = this.ctx.createMediaStreamSource(this.media);
    this.captureNode = new AudioWorkletNode(this.ctx, "moshi-capture", { numberOfOutputs: 0 });
    this.captureNode.port.onmessage = (e) => this.onCapture(e.data);
    source.connect(this.captureNode);
    this.timer = setInterval(() => this.ui.figures(this), 200);
  }

  onCapture(block) {
    if (!this.handshake || this.closed) return;
    const data = new AudioData({
      format: "f32-planar",
      sampleRate: RATE,
      numberOfFrames: block.length,
      numberOfChannels: 1,
      timestamp: Math.round((this.samplesSent * 1e6) / RATE),
      data: block,
    });
    this.samplesSent += block.length;
    this.encoder.encode(data);
    data.close();
  }

  onEncoded(chunk, meta) {
    if (this.ws.readyState !== WebSocket.OPEN) return;
    const packet = new Uint8Array(chunk.byteLength);
    chunk.copyTo(packet);
    const pages = [];
    if (!this.headerSent) {
      let preSkip = 312;
      const desc = meta && meta.decoderConfig && meta.decoderConfig.description;
      if (desc) {
        const d = new Uint8Array(desc.buffer || desc, desc.byteOffset || 0, desc.byteLength);
        if (startsWith(d, "OpusHead") && d.length >= 12) preSkip = d[10] | (d[11] << 8);
      }
      pages.push(oggPage([opusHead(preSkip)], { serial: this.serial, sequence: this.sequence++, granule: 0, first: true }));
      pages.push(oggPage([opusTags()], { serial: this.serial, sequence: this.sequence++, granule: 0 }));
      this.headerSent = true;
    }
    this.granule += PACKET_SAMPLES * 2; // 48 kHz units
    pages.push(oggPage([packet], { serial: this.serial, sequence: this.sequence++, granule: this.granule }));
    const len = pages.reduce((a, p) => a + p.length, 0);
    const msg = new Uint8Array(1 + len);
    msg[0] = KIND.audio;
    let o = 1;
    for (const p of pages) {
      msg.set(p, o);
      o += p.length;
    }
    this.ws.send(msg);
  }

  onMessage(bytes) {
    if (bytes.length === 0) return;
    const payload = bytes.subarray(1);
    switch (bytes[0]) {
      case KIND.handshake:
        this.handshake = true;
        this.ui.status("connected: talk to Moshi", "ok");
        break;
      case KIND.audio:
        for (const packet of this.oggIn.push(payload)) this.onPacket(packet);
        break;
      case KIND.text:
        this.ui.words(new TextDecoder().decode(payload));
        break;
      case KIND.metadata:
        this.onMetadata(JSON.parse(new TextDecoder().decode(payload)));
        break;
      case KIND.error:
        this.ui.error(new TextDecoder().decode(payload));
        break;
      default:
        break; // kinds this page has no use for (protocol.md: discard)
    }
  }

  onPacket(packet) {
    if (startsWith(packet, "OpusHead")) {
      this.decoder.configure({ codec: "opus", sampleRate: RATE, numberOfChannels: 1, description: packet });
      this.decoderReady = true;
      this.decodedSamples = 0;
      return;
    }
    if (startsWith(packet, "OpusTags") || !this.decoderReady) return;
    this.decoder.decode(
      new EncodedAudioChunk({
        type: "key",
        timestamp: Math.round((this.decodedSamples * 1e6) / RATE),
        data: packet,
      }),
    );
    this.decodedSamples += 960;
  }

  onDecoded(data) {
    let pcm = new Float32Array(data.numberOfFrames);
    data.copyTo(pcm, { planeIndex: 0, format: "f32-planar" });
    if (data.sampleRate !== RATE) {
      if (!this.resampler) this.resampler = new Resampler(data.sampleRate, RATE);
      pcm = this.resampler.process(pcm).slice();
    }
    data.close();
    this.playbackNode.port.postMessage(pcm, [pcm.buffer]);
  }

  onMetadata(meta) {
    this.ui.metadata(meta);
    const stats = meta.moshi_rs_stats;
    if (stats) {
      this.serverDroppedFrames = stats.input_frames_dropped + stats.output_frames_dropped;
      this.serverComputeMs = stats.compute_ms_per_frame;
    }
  }

  /// Mouth-to-ear estimate: how far the answer being played lags behind the voice being
  /// captured (Moshi answers input frame k with output frame k), plus the device latencies.
  latencyMs() {
    const inMs = (this.samplesSent * 1000) / RATE;
    const outMs = ((this.playback.played + this.serverDroppedFrames * FRAME_SAMPLES) * 1000) / RATE;
    const device = ((this.ctx.baseLatency || 0) + (this.ctx.outputLatency || 0)) * 1000;
    return inMs - outMs + device;
  }

  fail(message) {
    this.ui.error(message);
    this.stop();
  }

  onClose(e) {
    this.closed = true;
    this.ui.status(`disconnected${e.reason ? `: ${e.reason}` : ""}`, e.code === 1000 ? "" : "error");
    this.stop();
  }

  stop() {
    this.closed = true;
    clearInterval(this.timer);
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(1000, "page closed the session");
    if (this.media) this.media.getTracks().forEach((t) => t.stop());
    if (this.ctx && this.ctx.state !== "closed") this.ctx.close();
    this.ui.figures(this);
    this.ui.connected(false);
  }
}

const ui = {
  setting: (key) => $(key).value.trim(),
  status(text, cls = "") {
    const s = $("status");
    s.textContent = text;
    s.className = cls;
  },
  words(text) {
    $("transcript").textContent += text;
    $("transcript").scrollTop = $("transcript").scrollHeight;
  },
  error(text) {
    const li = document.createElement("li");
    li.textContent = text;
    $("errors").appendChild(li);
  },
  metadata(meta) {
    const model = meta.model && meta.model.weights ? meta.model.weights : meta.lm_model_file;
    $("server").textContent = `${meta.server || "server"}: ${model || "?"}; ${meta.greedy ? "greedy" : `seed ${meta.seed}`}`;
    const ignored = Object.keys(meta.ignored_query_parameters || {});
    if (ignored.length) $("server").textContent += `; ignored: ${ignored.join(", ")}`;
  },
  figures(c) {
    const ms = (samples) => ((samples * 1000) / RATE).toFixed(0);
    const p = c.playback;
    const set = (id, v) => ($(id).textContent = v);
    set("sent", ((c.samplesSent / RATE) || 0).toFixed(1));
    set("played", (p.played / RATE).toFixed(1));
    set("missed", ms(p.missed));
    set("skipped", ms(p.skipped));
    set("buffered", ms(p.buffered));
    set("dropped", String(c.serverDroppedFrames));
    set("compute", c.serverComputeMs ? c.serverComputeMs.toFixed(1) : "-");
    set("latency", c.ctx && p.played > 0 ? c.latencyMs().toFixed(0) : "-");
  },
  connected(on) {
    $("connect").textContent = on ? "Disconnect" : "Connect";
  },
};

let conversation = null;

$("connect").addEventListener("click", async () => {
  if (conversation && !conversation.closed) {
    conversation.stop();
    return;
  }
  $("transcript").textContent = "";
  $("errors").textContent = "";
  conversation = new Conversation(ui);
  ui.connected(true);
  try {
    await conversation.start(new URLSearchParams(location.search));
  } catch (e) {
    ui.error(e.message || String(e));
    conversation.stop();
  }
});

window.addEventListener("beforeunload", () => conversation && conversation.stop());
