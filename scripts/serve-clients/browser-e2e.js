// browser-e2e.js: a web UI served by `moshi-rs serve`, in headless Chromium with a fake
// microphone fed from a WAV: opens the page, clicks Connect, lets it talk for a while, reads what
// the page shows (text, audio figures), takes a screenshot, disconnects.
//
// Usage: node browser-e2e.js --url http://127.0.0.1:PORT/ --ui kyutai|moshi-rs --wav IN.wav
//        --out DIR [--seconds 8] [--chromium PATH] [--mic-processing on|off]
// --mic-processing off (the default): the browser's own microphone processing (echo
// cancellation, noise suppression, automatic gain) is turned off whatever the page asks
// getUserMedia for, so that what the server hears can be compared with the WAV; the page itself
// is not changed. (Kyutai's page asks for all three; through them the WAV arrives at window ncc
// 0.64-0.87 instead of 0.98.)
// Prints one JSON line: {"ui", "text", "figures": {...}, "screenshot", "console_errors"}.
// Exit 0 when the page connected and showed text and played audio.

const fs = require("fs");
const path = require("path");
const puppeteer = require("puppeteer-core");

function args() {
  const a = { seconds: 8, chromium: "/usr/bin/chromium", "mic-processing": "off" };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) a[argv[i].replace(/^--/, "")] = argv[i + 1];
  for (const k of ["url", "ui", "wav", "out"]) if (!a[k]) throw new Error(`missing --${k}`);
  a.seconds = Number(a.seconds);
  return a;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// The figures each page shows, read from its text.
async function readKyutai(page) {
  const body = await page.evaluate(() => document.body.innerText);
  // "Audio played: 0:06.04", "Latency: 0.322"
  const seconds = (label) => {
    const m = body.match(new RegExp(`${label}:\\s*(?:([0-9]+):)?([0-9]+(?:\\.[0-9]+)?)`, "i"));
    return m ? Number(m[1] || 0) * 60 + Number(m[2]) : null;
  };
  return {
    body,
    text: body,
    figures: {
      audio_played_s: seconds("Audio played"),
      missed_s: seconds("Missed audio"),
      latency_s: seconds("Latency"),
    },
  };
}

async function readOwn(page) {
  return page.evaluate(() => {
    const v = (id) => document.getElementById(id).textContent.trim();
    const n = (id) => (v(id) === "-" ? null : Number(v(id)));
    return {
      body: document.body.innerText,
      text: v("transcript"),
      errors: v("errors"),
      status: v("status"),
      figures: {
        latency_ms: n("latency"),
        compute_ms: n("compute"),
        sent_s: n("sent"),
        played_s: n("played"),
        missed_ms: n("missed"),
        skipped_ms: n("skipped"),
        buffered_ms: n("buffered"),
        dropped_frames: n("dropped"),
      },
    };
  });
}

async function main() {
  const a = args();
  fs.mkdirSync(a.out, { recursive: true });
  const browser = await puppeteer.launch({
    executablePath: a.chromium,
    headless: true,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--use-fake-ui-for-media-stream",
      "--use-fake-device-for-media-stream",
      `--use-file-for-fake-audio-capture=${path.resolve(a.wav)}`,
      "--autoplay-policy=no-user-gesture-required",
    ],
  });
  const consoleLines = [];
  const errors = [];
  try {
    const page = await browser.newPage();
    await page.setViewport({ width: 1100, height: 900 });
    page.on("console", (m) => consoleLines.push(`${m.type()}: ${m.text()}`));
    page.on("pageerror", (e) => errors.push(String(e)));
    if (a["mic-processing"] === "off") {
      await page.evaluateOnNewDocument(() => {
        const md = navigator.mediaDevices;
        const original = md.getUserMedia.bind(md);
        md.getUserMedia = (constraints) => {
          if (constraints && constraints.audio) {
            const audio = typeof constraints.audio === "object" ? constraints.audio : {};
            constraints = {
              ...constraints,
              audio: { ...audio, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
            };
          }
          return original(constraints);
        };
      });
    }
    const url = a.ui === "moshi-rs" ? `${a.url}?processing=off` : a.url;
    await page.goto(url, { waitUntil: "networkidle0", timeout: 60000 });
    const connect = await page.waitForSelector("::-p-text(Connect)", { timeout: 30000 });
    await connect.click();
    await sleep(a.seconds * 1000);
    const seen = a.ui === "moshi-rs" ? await readOwn(page) : await readKyutai(page);
    const screenshot = path.join(a.out, `${a.ui}.png`);
    await page.screenshot({ path: screenshot, fullPage: true });
    fs.writeFileSync(path.join(a.out, `${a.ui}.txt`), seen.body);
    // End the session the way a person would.
    const disconnect = await page.$("::-p-text(Disconnect)");
    if (disconnect) {
      await disconnect.click();
      await sleep(500);
    }
    fs.writeFileSync(path.join(a.out, `${a.ui}-console.log`), consoleLines.join("\n"));
    const result = { ui: a.ui, ...seen, screenshot, page_errors: errors };
    delete result.body;
    console.log(JSON.stringify(result));
    const played = seen.figures.played_s ?? seen.figures.audio_played_s ?? 0;
    const text = seen.text;
    process.exitCode = played > 0 && text.length > 0 && errors.length === 0 ? 0 : 1;
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error(`browser-e2e: ${e.stack || e}`);
  process.exit(2);
});
