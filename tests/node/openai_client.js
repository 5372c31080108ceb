// The official OpenAI Node SDK (npm `openai`, installed by scripts/setup.sh into .onebit/node)
// against a running `onebit-tts serve` with an API key:
//
//     OPENAI_API_KEY=KEY NODE_PATH=.onebit/node/node_modules node tests/node/openai_client.js \
//         --base-url http://127.0.0.1:PORT/v1 --expect-samples 57600
//
// tests/openai_sdk.rs starts the server on the tiny package and runs this. Greedy decoding
// (`temperature: 0`, an extension field the SDK passes through) makes the length known.
// Covers `client.audio.speech.create(...)` in every format, streamed raw (`stream_format:
// "audio"`), OpenAI's model and voice names (`tts-1` with `alloy`), `models.list()` /
// `retrieve()` with NotFoundError for an unknown id, the SDK's BadRequestError for a refused
// format and AuthenticationError for a wrong key, a custom voice (consent, clone with the
// transcript field, speech by id, delete). Prints one line per check, then "N passed, M failed"; exits non-zero on any failure.
"use strict";

const OpenAI = require("openai");
const { toFile } = require("openai");

const TEXT = "Hello world, this is a test.";
const RATE = 24000;

function arg(name) {
  const i = process.argv.indexOf(name);
  if (i < 0 || i + 1 >= process.argv.length) throw new Error(`missing ${name}`);
  return process.argv[i + 1];
}

function assert(ok, msg) {
  if (!ok) throw new Error(msg);
}

// Samples of a 16-bit mono WAV at 24 kHz; a streamed one says "unknown length" (0xFFFFFFFF), so
// its samples are what follows the header.
function wavSamples(buf, streamed) {
  assert(buf.toString("ascii", 0, 4) === "RIFF" && buf.toString("ascii", 8, 12) === "WAVE", "not a WAV");
  assert(buf.readUInt16LE(22) === 1, "channels");
  assert(buf.readUInt32LE(24) === RATE, "rate");
  assert(buf.readUInt16LE(34) === 16, "bits");
  assert(buf.toString("ascii", 36, 40) === "data", "data chunk");
  const declared = buf.readUInt32LE(40);
  if (streamed) {
    assert(declared === 0xffffffff, `streamed data length ${declared}`);
  } else {
    assert(declared === buf.length - 44, `data length ${declared} of ${buf.length - 44}`);
  }
  return (buf.length - 44) / 2;
}

function check(format, buf, samples, streamed) {
  if (format === "wav") {
    const n = wavSamples(buf, streamed);
    assert(n === samples, `wav: ${n} samples, expected ${samples}`);
  } else if (format === "pcm") {
    assert(buf.length === 2 * samples, `pcm: ${buf.length / 2} samples, expected ${samples}`);
  } else if (format === "mp3") {
    assert(buf.toString("ascii", 0, 3) === "ID3" || (buf[0] === 0xff && (buf[1] & 0xe0) === 0xe0), "mp3 magic");
  } else if (format === "opus") {
    assert(buf.toString("ascii", 0, 4) === "OggS" && buf.toString("ascii", 28, 36) === "OpusHead", "opus magic");
  } else if (format === "flac") {
    assert(buf.toString("ascii", 0, 4) === "fLaC", "flac magic");
  }
  assert(buf.length >= 1000, `${format}: only ${buf.length} bytes`);
  return `${buf.length} bytes`;
}

// A 16 kHz mono 16-bit WAV of a sweeping tone, `seconds` long.
function toneWav(seconds, freq) {
  const n = Math.round(seconds * 16000);
  const buf = Buffer.alloc(44 + 2 * n);
  buf.write("RIFF", 0, "ascii");
  buf.writeUInt32LE(36 + 2 * n, 4);
  buf.write("WAVEfmt ", 8, "ascii");
  buf.writeUInt32LE(16, 16);
  buf.writeUInt16LE(1, 20);
  buf.writeUInt16LE(1, 22);
  buf.writeUInt32LE(16000, 24);
  buf.writeUInt32LE(32000, 28);
  buf.writeUInt16LE(2, 32);
  buf.writeUInt16LE(16, 34);
  buf.write("data", 36, "ascii");
  buf.writeUInt32LE(2 * n, 40);
  for (let i = 0; i < n; i++) {
    const t = i / 16000;
    buf.writeInt16LE(Math.round(12000 * Math.sin(2 * Math.PI * (freq + 100 * Math.sin(2 * t)) * t)), 44 + 2 * i);
  }
  return buf;
}

async function main() {
  const baseURL = arg("--base-url");
  const samples = Number(arg("--expect-samples"));
  const apiKey = process.env.OPENAI_API_KEY;
  assert(apiKey, "OPENAI_API_KEY is not set");
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });
  const results = [];
  async function run(name, fn) {
    try {
      const detail = await fn();
      console.log(`PASS ${name}${detail ? ": " + detail : ""}`);
      results.push(true);
    } catch (e) {
      console.log(`FAIL ${name}: ${e && e.stack ? e.stack : e}`);
      results.push(false);
    }
  }
  const speak = (extra) =>
    client.audio.speech.create({ model: "tiny", voice: "test", input: TEXT, temperature: 0, ...extra });

  for (const format of ["mp3", "opus", "flac", "wav", "pcm"]) {
    await run(`speech.create response_format=${format}`, async () => {
      const r = await speak({ response_format: format });
      return check(format, Buffer.from(await r.arrayBuffer()), samples, false);
    });
  }
  for (const format of ["wav", "pcm"]) {
    await run(`stream_format=audio response_format=${format}`, async () => {
      const r = await speak({ response_format: format, stream_format: "audio" });
      const parts = [];
      for await (const chunk of r.body) parts.push(Buffer.from(chunk));
      assert(parts.length > 1, `${parts.length} chunk(s)`);
      return check(format, Buffer.concat(parts), samples, true);
    });
  }
  await run("response_format=aac is refused", async () => {
    try {
      await speak({ response_format: "aac" });
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError, `${e}`);
      assert(e.status === 400 && e.code === "unsupported_value" && e.param === "response_format", `${e.status} ${e.code} ${e.param}`);
      return "400 unsupported_value";
    }
    throw new Error("expected a 400");
  });
  await run("model tts-1 and voice alloy speak as the mapped voice", async () => {
    const wav = async (model, voice) =>
      Buffer.from(await (await client.audio.speech.create({ model, voice, input: TEXT, temperature: 0, response_format: "wav" })).arrayBuffer());
    const alias = await wav("tts-1", "alloy");
    assert(alias.equals(await wav("tiny", "jo")), "alloy speaks as jo");
    assert(alias.length > 44 + 2 * 480, `${alias.length} bytes`);
    return `${alias.length} bytes`;
  });
  await run("models.list / models.retrieve, NotFoundError for an unknown id", async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    for (const want of ["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "tiny"]) assert(ids.includes(want), `${want} in ${ids}`);
    const m = await client.models.retrieve("gpt-4o-mini-tts");
    assert(m.id === "gpt-4o-mini-tts" && m.object === "model", JSON.stringify(m));
    try {
      await client.models.retrieve("whisper-1");
    } catch (e) {
      assert(e instanceof OpenAI.NotFoundError && e.code === "model_not_found", `${e}`);
      return ids.join(", ");
    }
    throw new Error("expected a 404");
  });
  await run("a wrong API key gets AuthenticationError", async () => {
    const bad = new OpenAI({ baseURL, apiKey: apiKey + "-wrong", maxRetries: 0 });
    try {
      await bad.audio.speech.create({ model: "tiny", voice: "test", input: TEXT });
    } catch (e) {
      assert(e instanceof OpenAI.AuthenticationError, `${e}`);
      assert(e.status === 401 && e.code === "invalid_api_key", `${e.status} ${e.code}`);
      return "401 invalid_api_key";
    }
    throw new Error("expected a 401");
  });

  await run("a custom voice: voiceConsents.create, voices.create with the transcript, speech by id, voices.delete", async () => {
    const consent = await client.audio.voiceConsents.create({
      name: "Node consent",
      language: "en-US",
      recording: await toFile(toneWav(1.5, 300), "consent.wav", { type: "audio/wav" }),
    });
    assert(consent.object === "audio.voice_consent" && consent.id.startsWith("cons_"), JSON.stringify(consent));
    // `transcript` is this server's extension to OpenAI's form; the SDK sends every body field.
    const voice = await client.audio.voices.create({
      name: "node-voice",
      consent: consent.id,
      audio_sample: await toFile(toneWav(2, 200), "sample.wav", { type: "audio/wav" }),
      transcript: "A tone from the Node test.",
    });
    assert(voice.object === "audio.voice" && voice.id.startsWith("voice_") && voice.name === "node-voice", JSON.stringify(voice));
    const r = await client.audio.speech.create({ model: "tts-1", voice: { id: voice.id }, input: TEXT, temperature: 0, response_format: "wav" });
    const n = wavSamples(Buffer.from(await r.arrayBuffer()), false);
    assert(n > 0 && n % 480 === 0, `${n} samples`);
    const d = await client.audio.voices.delete(voice.id);
    assert(d.deleted === true && d.id === voice.id, JSON.stringify(d));
    return `${voice.id}: ${n} samples, then deleted`;
  });

  const passed = results.filter(Boolean).length;
  console.log(`${passed} passed, ${results.length - passed} failed`);
  process.exitCode = passed === results.length ? 0 : 1;
}

main().catch((e) => {
  console.log(`FAIL setup: ${e && e.stack ? e.stack : e}`);
  console.log("0 passed, 1 failed");
  process.exitCode = 1;
});
