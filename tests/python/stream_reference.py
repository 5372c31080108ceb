"""numpy port of the vendor's streaming NeuCodec decode (neutts 1.4.1, neutts/neutts.py:
`_linear_overlap_add`, `NeuTTS._infer_stream_ggml`, `NeuTTS._decode`), run over a deterministic
fake decoder so the Rust port can be compared sample for sample without the real model.

Input (stdin, JSON): {"cases": [{"reference": [int...], "generated": [int...]}, ...]}
Output (stdout), per case and per mode (vendor, aligned, whole):
    case <index> <mode> <number of chunks>
    <chunk length> <sample> <sample> ...      (one line per yielded chunk, %.9g)

"vendor" is the vendor generator verbatim. "aligned" differs only in the final piece: it starts at
the decoded point instead of one frame before it (our TailMode::Aligned). "whole" is the vendor's
non-streaming `_decode` of the generated codes alone.

The fake decoder must stay identical to `fake_decode` in tests/stream_reference.rs.
"""

import json
import sys

import numpy as np

HOP = 480
SR = 24000

# Vendor constants (NeuTTS.__init__).
STREAMING_OVERLAP_FRAMES = 1
STREAMING_FRAMES_PER_CHUNK = 25
STREAMING_LOOKFORWARD = 5
STREAMING_LOOKBACK = 50
STREAMING_STRIDE_SAMPLES = STREAMING_FRAMES_PER_CHUNK * HOP


def fake_decode(codes):
    """codes -> float32[len(codes) * 480]: a phase-continuous sine per window whose per-frame
    frequency depends on the frame's neighbours and whose start phase depends on the window, so
    the same frame decodes differently in different windows (as a real codec's context does)."""
    c = np.asarray(codes, dtype=np.int64)
    n = len(c)
    prev = np.concatenate([c[:1], c[:-1]])
    nxt = np.concatenate([c[1:], c[-1:]])
    freq = 80.0 + ((prev + 2 * c + nxt) % 997).astype(np.float64) * 0.5
    inc = np.repeat(2.0 * np.pi * freq / SR, HOP)
    phase0 = 0.37 * n + 0.001 * float(c[0])
    phase = phase0 + np.cumsum(inc)
    return (0.5 * np.sin(phase)).astype(np.float32)


def _linear_overlap_add(frames, stride, power=1.0):
    # Verbatim from the vendor.
    assert len(frames)
    dtype = frames[0].dtype
    shape = frames[0].shape[:-1]

    total_size = 0
    for i, frame in enumerate(frames):
        frame_end = stride * i + frame.shape[-1]
        total_size = max(total_size, frame_end)

    sum_weight = np.zeros(total_size, dtype=dtype)

    out = np.zeros((*shape, total_size), dtype=dtype)

    offset = 0
    for frame in frames:
        frame_length = frame.shape[-1]
        t = np.linspace(0, 1, frame_length + 2, dtype=dtype)[1:-1]

        weight = (0.5 - np.abs(t - 0.5)) ** power

        out[..., offset : offset + frame_length] += weight * frame
        sum_weight[offset : offset + frame_length] += weight
        offset += stride

    assert sum_weight.min() > 0
    return out / sum_weight


def _decode(codes):
    # The vendor's `_decode` minus the string round trip: ONNX output [1, 1, F*480] -> [F*480].
    if len(codes) == 0:
        raise ValueError("No valid speech tokens found in the output.")
    return fake_decode(codes)


def infer_stream(ref_codes, generated, aligned_tail):
    """`_infer_stream_ggml` with the backbone replaced by the list of generated codes."""
    audio_cache = []
    token_cache = list(ref_codes)
    n_decoded_samples = 0
    n_decoded_tokens = len(ref_codes)

    for code in generated:
        token_cache.append(code)

        if (
            len(token_cache[n_decoded_tokens:])
            >= STREAMING_FRAMES_PER_CHUNK + STREAMING_LOOKFORWARD
        ):
            tokens_start = max(
                n_decoded_tokens - STREAMING_LOOKBACK - STREAMING_OVERLAP_FRAMES, 0
            )
            tokens_end = (
                n_decoded_tokens
                + STREAMING_FRAMES_PER_CHUNK
                + STREAMING_LOOKFORWARD
                + STREAMING_OVERLAP_FRAMES
            )
            sample_start = (n_decoded_tokens - tokens_start) * HOP
            sample_end = (
                sample_start
                + (STREAMING_FRAMES_PER_CHUNK + 2 * STREAMING_OVERLAP_FRAMES) * HOP
            )
            curr_codes = token_cache[tokens_start:tokens_end]
            recon = _decode(curr_codes)
            recon = recon[sample_start:sample_end]
            audio_cache.append(recon)

            processed_recon = _linear_overlap_add(
                audio_cache, stride=STREAMING_STRIDE_SAMPLES
            )
            new_samples_end = len(audio_cache) * STREAMING_STRIDE_SAMPLES
            processed_recon = processed_recon[n_decoded_samples:new_samples_end]
            n_decoded_samples = new_samples_end
            n_decoded_tokens += STREAMING_FRAMES_PER_CHUNK
            yield processed_recon

    remaining_tokens = len(token_cache) - n_decoded_tokens
    if len(token_cache) > n_decoded_tokens:
        tokens_start = max(
            len(token_cache)
            - (STREAMING_LOOKBACK + STREAMING_OVERLAP_FRAMES + remaining_tokens),
            0,
        )
        sample_start = (
            len(token_cache) - tokens_start - remaining_tokens - STREAMING_OVERLAP_FRAMES
        ) * HOP
        if aligned_tail:
            # Our only change: start the tail at the decoded point, like every other chunk.
            sample_start += STREAMING_OVERLAP_FRAMES * HOP
        curr_codes = token_cache[tokens_start:]
        recon = _decode(curr_codes)
        recon = recon[sample_start:]
        audio_cache.append(recon)

        processed_recon = _linear_overlap_add(audio_cache, stride=STREAMING_STRIDE_SAMPLES)
        processed_recon = processed_recon[n_decoded_samples:]
        yield processed_recon


def emit(index, mode, chunks, out):
    out.write(f"case {index} {mode} {len(chunks)}\n")
    for chunk in chunks:
        out.write(str(len(chunk)))
        for x in chunk:
            out.write(" %.9g" % float(x))
        out.write("\n")


def main():
    spec = json.load(sys.stdin)
    out = sys.stdout
    for index, case in enumerate(spec["cases"]):
        ref = [int(c) for c in case["reference"]]
        gen = [int(c) for c in case["generated"]]
        emit(index, "vendor", list(infer_stream(ref, gen, aligned_tail=False)), out)
        emit(index, "aligned", list(infer_stream(ref, gen, aligned_tail=True)), out)
        emit(index, "whole", [_decode(gen)] if gen else [], out)
    out.flush()


if __name__ == "__main__":
    main()
