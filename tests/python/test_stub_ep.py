#!/usr/bin/env python3
"""Checks the stub RyzenAI plugin EP (tests/stub-ep) against the real ONNX Runtime.

    cargo build -p onebit-stub-ep
    .onebit/venv/bin/python tests/python/test_stub_ep.py target/debug/libonebit_stub_ep.so

Registers the library as "RyzenAILightExecutionProvider", checks the EP device it offers (a
virtual NPU), its exported symbols, and builds sessions on a tiny handmade graph with provider
options {"hybrid_opt_token_backend": "npu"}, config entry model_root and the custom ops
registered from the same library, in decline and claim modes (ONEBIT_STUB_EP_MODE): outputs
must equal a CPU-only session's, and the record file (ONEBIT_STUB_EP_RECORD) must hold exactly
the expected events. Prints "N passed, M failed" and exits non-zero on any failure.
"""

import ctypes
import json
import os
import sys
import tempfile
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import Checks  # noqa: E402

EP = "RyzenAILightExecutionProvider"
OPTIONS = {"hybrid_opt_token_backend": "npu"}
MODEL_ROOT = "/some/dir"
CHECKS = Checks()
check = CHECKS.check


def tiny_model():
    """Seven nodes; the stub in claim mode takes the three float same-shape Add/Mul:
    s = x + y, m = s * x, q = r * r (r = Relu(m)); it leaves Relu, the broadcasting
    out = q + bias ([4] against [batch, seq, 4]), the int64 k = i + j, and w = u + v whose
    inputs have no shape (equal at run time, but not provably so)."""
    f = TensorProto.FLOAT
    shape = ["batch", "seq", 4]
    nodes = [
        helper.make_node("Add", ["x", "y"], ["s"], name="add_xy"),
        helper.make_node("Mul", ["s", "x"], ["m"], name="mul_sx"),
        helper.make_node("Relu", ["m"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "r"], ["q"], name="mul_rr"),
        helper.make_node("Add", ["q", "bias"], ["out"], name="add_bias"),
        helper.make_node("Add", ["i", "j"], ["k"], name="add_int"),
        helper.make_node("Add", ["u", "v"], ["w"], name="add_unknown_rank"),
    ]
    bias = numpy_helper.from_array(np.array([0.5, -1.0, 2.0, 0.0], np.float32), "bias")
    graph = helper.make_graph(
        nodes,
        "stub_ep_tiny",
        [
            helper.make_tensor_value_info("x", f, shape),
            helper.make_tensor_value_info("y", f, shape),
            helper.make_tensor_value_info("i", TensorProto.INT64, [3]),
            helper.make_tensor_value_info("j", TensorProto.INT64, [3]),
            helper.make_tensor_value_info("u", f, None),
            helper.make_tensor_value_info("v", f, None),
        ],
        [
            helper.make_tensor_value_info("out", f, shape),
            helper.make_tensor_value_info("s", f, shape),
            helper.make_tensor_value_info("k", TensorProto.INT64, [3]),
            helper.make_tensor_value_info("w", f, None),
        ],
        [bias],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


NODES = 7
CLAIMED = 3


def feeds():
    rng = np.random.default_rng(7)
    return {
        "x": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "y": rng.standard_normal((2, 3, 4)).astype(np.float32),
        "i": np.array([1, 2, 3], np.int64),
        "j": np.array([10, 20, 30], np.int64),
        "u": rng.standard_normal(5).astype(np.float32),
        "v": rng.standard_normal(5).astype(np.float32),
    }


def read_record(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


class Suite:
    def __init__(self, lib, tmp):
        self.lib = lib
        self.tmp = tmp
        self.model = tiny_model()
        self.feeds = feeds()
        cpu = ort.InferenceSession(self.model, providers=["CPUExecutionProvider"])
        self.expected = cpu.run(None, self.feeds)

    def record_to(self, name):
        path = os.path.join(self.tmp, name + ".jsonl")
        os.environ["ONEBIT_STUB_EP_RECORD"] = path
        return path

    def device(self):
        return [d for d in ort.get_ep_devices() if d.ep_name == EP]

    def session(self, mode):
        os.environ["ONEBIT_STUB_EP_MODE"] = mode
        opts = ort.SessionOptions()
        opts.add_provider_for_devices(self.device(), dict(OPTIONS))
        opts.add_session_config_entry("model_root", MODEL_ROOT)
        opts.register_custom_ops_library(self.lib)
        return ort.InferenceSession(self.model, opts)

    def case_symbols(self):
        so = ctypes.CDLL(self.lib)
        for name in ("CreateEpFactories", "ReleaseEpFactory", "RegisterCustomOps"):
            check("exports %s" % name, hasattr(so, name))
        check(
            "does not export RyzenAI_RegisterCustomOps",
            not hasattr(so, "RyzenAI_RegisterCustomOps"),
        )

    def case_register(self):
        path = self.record_to("register")
        ort.register_execution_provider_library(EP, self.lib)
        devs = self.device()
        check("one EP device named %s" % EP, len(devs) == 1, [d.ep_name for d in ort.get_ep_devices()])
        if not devs:
            return
        d = devs[0]
        check("device type NPU", d.device.type == ort.OrtHardwareDeviceType.NPU, d.device.type)
        check("device is virtual", d.device.metadata.get("IsVirtual") == "1", d.device.metadata)
        check("EP vendor", d.ep_vendor == "onebit-stub", d.ep_vendor)
        check("EP version from GetVersion", d.ep_metadata.get("version") == "0.1.0", d.ep_metadata)
        events = read_record(path)
        want = [{"event": "create_factories", "registered_name": EP}]
        check("record: create_factories", events == want, events)

    def run_mode(self, mode):
        path = self.record_to(mode)
        sess = self.session(mode)
        check("%s: providers" % mode, sess.get_providers()[0] == EP, sess.get_providers())
        for _ in range(2):
            got = sess.run(None, self.feeds)
            same = all(np.array_equal(a, b) for a, b in zip(got, self.expected))
            check("%s: outputs equal CPU's" % mode, same)
        del sess
        events = read_record(path)
        want = [
            {"event": "register_custom_ops"},
            {
                "event": "create_ep",
                "mode": mode,
                "options": OPTIONS,
                "config": {"model_root": MODEL_ROOT},
            },
            {"event": "get_capability", "claimed": CLAIMED if mode == "claim" else 0, "nodes": NODES},
        ]
        check("%s: record up to get_capability" % mode, events[:3] == want, events[:3])
        computes = events[3:]
        if mode == "decline":
            check("decline: no compute", computes == [], computes)
        else:
            per_run = [{"event": "compute", "op": op} for op in ("Add", "Mul", "Mul")]
            check("claim: one compute per claimed node per run", computes == per_run * 2, computes)

    def case_decline(self):
        self.run_mode("decline")

    def case_claim(self):
        self.run_mode("claim")

    def case_bad_mode(self):
        # CreateEp fails; Python's InferenceSession then falls back to CPU alone (printing the
        # EP error), where ORT's C API, as the Rust crate uses it, would fail the session.
        path = self.record_to("bad_mode")
        try:
            sess = self.session("bogus")
            providers = sess.get_providers()
            check("bad mode: the EP is not used", EP not in providers, providers)
        except Exception as e:  # noqa: BLE001  (ORT raises its own exception types)
            check("bad mode: the EP is not used", "ONEBIT_STUB_EP_MODE" in str(e), str(e))
        events = [e["event"] for e in read_record(path)]
        check("bad mode: no create_ep recorded", events == ["register_custom_ops"], events)

    def case_unregister(self):
        path = self.record_to("unregister")
        ort.unregister_execution_provider_library(EP)
        check("unregistered: no EP device", self.device() == [])
        check("unregister: nothing recorded", read_record(path) == [])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    lib = os.path.abspath(sys.argv[1])
    t = time.time()
    with tempfile.TemporaryDirectory(prefix="stub_ep_") as tmp:
        suite = Suite(lib, tmp)
        for name in ("symbols", "register", "decline", "claim", "bad_mode", "unregister"):
            CHECKS.run_case(name, getattr(suite, "case_" + name))
    print("%d passed, %d failed (%.1f s)" % (CHECKS.passed, CHECKS.failed, time.time() - t))
    sys.exit(1 if CHECKS.failed else 0)


if __name__ == "__main__":
    main()
