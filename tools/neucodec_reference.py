#!/usr/bin/env python3
"""The real NeuCodec decoder architecture, with random weights, exported to ONNX, and what the
vendor's own code makes of it: the reference tests/neucodec_reference.rs compares our codec with.

    python tools/neucodec_reference.py --out DIR      write the reference into DIR
    python tools/neucodec_reference.py --check DIR    regenerate in a temporary directory and
                                                      compare with DIR file by file (exit 1 on
                                                      any difference)

scripts/neucodec-reference.sh makes the venv this needs (torch, torchaudio, the `neucodec` and
`neutts` packages at the versions below) and runs it; CI does not: it tests our side against the
committed files (tests/data/neucodec-decoder/, a few MB).

What is real here:
- The decoder is `neucodec`'s own classes: `CodecDecoderVocos` (ResidualFSQ with levels [4]*8 and
  dim 2048, the Vocos backbone with its rotary transformer blocks, the ISTFT head with n_fft 1920
  and hop 480, "same" padding) and `NeuCodec.decode_code` with its `fc_post_a`, as
  `NeuCodec(24_000, 480)` builds them, sized down (width 128, 2 transformer blocks of 2 heads of
  64: the real head width, which the rotary embedding needs) so the file stays small.
- The ONNX graph is torch's exporter's (torch.onnx.export, dynamo) with the I/O of
  `neuphonic/neucodec-onnx-decoder`: `codes` int32 [B, 1, F] -> float32 [B, 1, F*480].
- The streamed audio is the vendor's `NeuTTS._infer_stream_ggml` verbatim (neutts 1.4.1), decoding
  through the vendor's `NeuCodecOnnxDecoder` on the exported file; only the llama.cpp backbone is
  replaced, by a stand-in that yields the given codes as the tokens it would have generated.

One substitution, checked exactly: vector-quantize-pytorch's `get_output_from_indices` computes
shapes with einx, which the exporter can only trace for one fixed size, so the exported graph
looks the code up in the quantizer's own implicit codebook (`codebooks`, `scales`, `project_out`:
the same arithmetic without einx). This script asserts the two agree bit for bit on all 65,536
codes before exporting.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile

SEED = 20261204
HIDDEN, DEPTH, HEADS = 128, 2, 2
HOP = 480
# (reference codes, generated codes): streamed windows with long and short left context, and a
# generation shorter than one window with no reference at all.
CASES = [("long", 60, 137), ("short", 12, 55), ("bare", 0, 31)]
VERSIONS = ("torch", "torchaudio", "neucodec", "neutts", "vector-quantize-pytorch", "onnxruntime", "onnx")


def codes(n, seed):
    """Deterministic codes spread over the codebook (an LCG, so the Rust side could recompute)."""
    state = (seed * 6364136223846793005 + 1442695040888963407) % 2**64
    out = []
    for _ in range(n):
        state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
        out.append((state >> 33) % 65536)
    return out


def build_decoder():
    import torch
    from neucodec import NeuCodec
    from neucodec.codec_decoder_vocos import CodecDecoderVocos

    class Decoder(torch.nn.Module):
        """NeuCodec's decode path: `generator` and `fc_post_a` are the attributes
        `NeuCodec.decode_code` uses, built as `NeuCodec.__init__` builds them (sized down)."""

        def __init__(self):
            super().__init__()
            self.generator = CodecDecoderVocos(
                hidden_dim=HIDDEN, depth=DEPTH, heads=HEADS, pos_meb_dim=64, hop_length=HOP
            )
            self.fc_post_a = torch.nn.Linear(2048, HIDDEN)

        def forward(self, codes):
            return NeuCodec.decode_code(self, codes.long())

    torch.manual_seed(SEED)
    return Decoder().eval()


def lookup(quantizer):
    """`quantizer.get_output_from_indices` without einx, for one quantizer and valid codes."""

    def get_output_from_indices(indices):  # [B, F, 1]
        found = quantizer.codebooks[0][indices[..., 0]] * quantizer.scales[0]
        return quantizer.project_out(found)

    return get_output_from_indices


def write(out):
    import numpy as np
    import onnx
    import onnxruntime
    import torch
    from importlib.metadata import version

    os.makedirs(out, exist_ok=True)
    model = build_decoder()
    q = model.generator.quantizer
    assert q.num_quantizers == 1 and list(q.layers[0]._levels.tolist()) == [4] * 8
    assert model.generator.head.istft.n_fft == 1920 and model.generator.head.istft.hop_length == HOP
    with torch.no_grad():
        every = torch.arange(65536).reshape(1, -1, 1)
        theirs, ours = q.get_output_from_indices(every), lookup(q)(every)
        assert torch.equal(theirs, ours), "the export's codebook lookup differs from neucodec's"

    # The torch model's own output, before any export: what the ONNX file must reproduce.
    all_codes = {name: (codes(r, 1000 + i), codes(g, 2000 + i)) for i, (name, r, g) in enumerate(CASES)}
    torch_whole = {}
    with torch.no_grad():
        for name, (_, gen) in all_codes.items():
            x = torch.tensor(gen, dtype=torch.int32)[None, None, :]
            torch_whole[name] = model(x)[0, 0].numpy().astype(np.float32)

    onnx_path = os.path.join(out, "model.onnx")
    q.get_output_from_indices = lookup(q)
    example = torch.tensor([codes(40, 7), codes(40, 8)], dtype=torch.int32)[:, None, :]
    torch.onnx.export(
        model,
        (example,),
        onnx_path,
        input_names=["codes"],
        output_names=["audio"],
        dynamic_shapes={"codes": {0: torch.export.Dim("batch"), 2: torch.export.Dim("frames")}},
        dynamo=True,
        external_data=False,
        opset_version=20,
    )
    del q.get_output_from_indices
    # The exporter records each node's Python stack, file paths of this machine's venv included;
    # without them the file does not depend on where the venv is.
    graph = onnx.load(onnx_path)
    for node in graph.graph.node:
        keep = [p for p in node.metadata_props if p.key != "pkg.torch.onnx.stack_trace"]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
    onnx.save(graph, onnx_path)

    # The vendor's streaming decode, verbatim, through the vendor's ONNX decoder class.
    import neutts.neutts as vendor

    class Backbone:
        """Stands in for llama_cpp.Llama: yields the given codes as generated tokens."""

        def __init__(self, generated):
            self.generated = generated

        def reset(self):
            pass

        def __call__(self, prompt, **kwargs):
            for c in self.generated:
                yield {"choices": [{"text": f"<|speech_{c}|>"}]}

    def load_backbone(self, backbone_repo, backbone_device):
        self.backbone = Backbone([])
        self._is_quantized_model = True
        self.input_format = "BPE"
        self._supported_emotions = None

    vendor.NeuTTS._load_backbone = load_backbone
    tts = vendor.NeuTTS(backbone_repo="stand-in-gguf", codec_repo=onnx_path, seed=0)
    tts.watermarker = None  # resemble-perth's watermark is the vendor's option; we never add one

    session = onnxruntime.InferenceSession(onnx_path)
    cases = []
    for name, (ref, gen) in all_codes.items():
        tts.backbone = Backbone(gen)
        chunks = [np.asarray(c, dtype=np.float32) for c in tts.infer_stream("Hello.", ref, "Hi.")]
        stream = np.concatenate(chunks)
        onnx_whole = session.run(None, {"codes": np.array(gen, dtype=np.int32)[None, None, :]})[0][0, 0]
        diff = float(np.abs(onnx_whole - torch_whole[name]).max())
        scale = float(np.abs(torch_whole[name]).max())
        # FFT and matmul summation orders differ (torch vs ONNX Runtime): 1.4e-4 of the scale seen.
        assert diff <= 1e-3 * scale, f"{name}: ONNX decode differs from torch by {diff} (scale {scale})"
        files = {"torch_whole": f"{name}-torch-whole.f32", "vendor_stream": f"{name}-vendor-stream.f32"}
        torch_whole[name].astype("<f4").tofile(os.path.join(out, files["torch_whole"]))
        stream.astype("<f4").tofile(os.path.join(out, files["vendor_stream"]))
        cases.append(
            {
                "name": name,
                "reference": ref,
                "generated": gen,
                "vendor_chunks": [len(c) for c in chunks],
                "onnx_vs_torch_max_diff": diff,
                "scale": scale,
                **files,
            }
        )

    manifest = {
        "what": "NeuCodec decoder architecture (neucodec's classes), random weights, exported to "
        "ONNX; torch's own decode and the vendor's streaming decode of it. Made by "
        "tools/neucodec_reference.py (scripts/neucodec-reference.sh).",
        "seed": SEED,
        "decoder": {"hidden": HIDDEN, "depth": DEPTH, "heads": HEADS, "hop": HOP, "n_fft": 4 * HOP,
                    "fsq_levels": [4] * 8, "fsq_dim": 2048},
        "versions": {p: version(p) for p in VERSIONS},
        "cases": cases,
    }
    manifest["sha256"] = {
        f: hashlib.sha256(open(os.path.join(out, f), "rb").read()).hexdigest()
        for f in sorted(os.listdir(out))
        if f != "reference.json"
    }
    text = json.dumps(manifest, indent=1)
    # One line per list of numbers: the code lists stay readable in a diff.
    text = re.sub(r"\[\s+([-\d.e,\s]+?)\s+\]", lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)
    with open(os.path.join(out, "reference.json"), "w") as f:
        f.write(text + "\n")


def check(committed):
    import numpy as np

    tmp = tempfile.mkdtemp(prefix="neucodec-reference-")
    try:
        write(tmp)
        bad = []
        names = sorted(set(os.listdir(tmp)) | set(os.listdir(committed)))
        for n in names:
            a, b = os.path.join(tmp, n), os.path.join(committed, n)
            if not (os.path.exists(a) and os.path.exists(b)) or open(a, "rb").read() != open(b, "rb").read():
                bad.append(n)
        for n in bad:
            a, b = os.path.join(tmp, n), os.path.join(committed, n)
            if n.endswith(".f32") and os.path.exists(a) and os.path.exists(b):
                x, y = np.fromfile(a, "<f4"), np.fromfile(b, "<f4")
                if x.shape == y.shape:
                    print(f"differs: {n} (largest sample difference {np.abs(x - y).max():.3g})")
                    continue
            print(f"differs: {n}")
        print("same" if not bad else f"{len(bad)} file(s) differ (regenerated in {tmp})")
        if not bad:
            shutil.rmtree(tmp)
        return 0 if not bad else 1
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--out")
    g.add_argument("--check")
    args = ap.parse_args()
    if args.out:
        # Made beside the target and swapped in whole, so no stale file survives a regeneration.
        out = os.path.abspath(args.out)
        tmp = tempfile.mkdtemp(prefix=".neucodec-reference-", dir=os.path.dirname(out))
        try:
            write(tmp)
            os.chmod(tmp, 0o755)
            shutil.rmtree(out, ignore_errors=True)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        print(f"wrote {out}")
        return 0
    return check(args.check)


if __name__ == "__main__":
    sys.exit(main())
