// moshi-rs web page: audio worklets (run on the browser's audio thread).
//
// "moshi-capture": cuts the microphone (at the context's 24 kHz) into 20 ms blocks of 480
// samples and posts each to the page, which encodes it to Opus.
// "moshi-playback": a ring buffer of Moshi's decoded audio. Playback starts once `targetMs` is
// buffered; an empty buffer plays silence (counted as missed) and waits for `targetMs` again;
// more than `maxMs` buffered is cut back to `targetMs` (counted as skipped) so latency stays
// bounded. Reports its counters to the page every 100 ms; allocates nothing per render quantum.

class MoshiCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(480);
    this.filled = 0;
  }

  process(inputs) {
    const input = inputs[0];
    if (input && input.length > 0) {
      const ch = input[0];
      let i = 0;
      while (i < ch.length) {
        const n = Math.min(ch.length - i, this.block.length - this.filled);
        this.block.set(ch.subarray(i, i + n), this.filled);
        this.filled += n;
        i += n;
        if (this.filled === this.block.length) {
          this.port.postMessage(this.block, [this.block.buffer]);
          this.block = new Float32Array(480);
          this.filled = 0;
        }
      }
    }
    return true;
  }
}

class MoshiPlayback extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = (options && options.processorOptions) || {};
    this.targetSamples = Math.round(((o.targetMs || 60) * sampleRate) / 1000);
    this.maxSamples = Math.round(((o.maxMs || 400) * sampleRate) / 1000);
    this.ring = new Float32Array(sampleRate * 20);
    this.read = 0;
    this.write = 0;
    this.playing = false;
    this.playedSamples = 0;
    this.missedSamples = 0;
    this.skippedSamples = 0;
    this.receivedSamples = 0;
    this.lastReport = 0;
    this.port.onmessage = (e) => {
      if (e.data === "reset") {
        this.read = this.write = 0;
        this.playing = false;
        this.playedSamples = this.missedSamples = this.skippedSamples = this.receivedSamples = 0;
        return;
      }
      this.push(e.data);
    };
  }

  buffered() {
    return this.write - this.read;
  }

  push(samples) {
    const cap = this.ring.length;
    for (let i = 0; i < samples.length; i++) {
      this.ring[(this.write + i) % cap] = samples[i];
    }
    this.write += samples.length;
    this.receivedSamples += samples.length;
    if (this.buffered() > cap) {
      const over = this.buffered() - cap;
      this.read += over;
      this.skippedSamples += over;
    }
    if (this.buffered() > this.maxSamples) {
      const cut = this.buffered() - this.targetSamples;
      this.read += cut;
      this.skippedSamples += cut;
    }
  }

  process(_inputs, outputs) {
    const out = outputs[0][0];
    if (!this.playing && this.buffered() >= this.targetSamples) {
      this.playing = true;
    }
    const cap = this.ring.length;
    let i = 0;
    if (this.playing) {
      const n = Math.min(out.length, this.buffered());
      for (; i < n; i++) {
        out[i] = this.ring[(this.read + i) % cap];
      }
      this.read += n;
      this.playedSamples += n;
      if (n < out.length) {
        this.playing = false;
      }
    }
    if (i < out.length) {
      out.fill(0, i);
      if (this.receivedSamples > 0) {
        this.missedSamples += out.length - i;
      }
    }
    for (let c = 1; c < outputs[0].length; c++) {
      outputs[0][c].set(out);
    }
    if (currentTime - this.lastReport >= 0.1) {
      this.lastReport = currentTime;
      this.port.postMessage({
        played: this.playedSamples,
        missed: this.missedSamples,
        skipped: this.skippedSamples,
        received: this.receivedSamples,
        buffered: this.buffered(),
      });
    }
    return true;
  }
}

registerProcessor("moshi-capture", MoshiCapture);
registerProcessor("moshi-playback", MoshiPlayback);
