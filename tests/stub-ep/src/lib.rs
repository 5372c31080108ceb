//! onebit-stub-ep: a stub of AMD's RyzenAI plugin execution provider, for tests without an NPU.
//!
//! What it models. The RyzenAI provider ships as an ONNX Runtime *plugin EP* library: ORT loads it
//! with `RegisterExecutionProviderLibrary`, calls its `CreateEpFactories`, lists the devices its
//! factory offers (`GetEpDevices`), and creates the EP for a session appended with
//! `SessionOptionsAppendExecutionProvider_V2`. The same library also exports `RegisterCustomOps`
//! (what `RegisterCustomOpsLibrary[_V2]` looks up), and current builds do NOT export the old
//! `RyzenAI_RegisterCustomOps`; neither does this stub. The stub offers one EP named
//! `RyzenAILightExecutionProvider` (vendor "onebit-stub") on one *virtual* NPU hardware device,
//! either declines every node (as the real provider does when it declines a graph) or claims the
//! float32 same-shape `Add`/`Mul` nodes and computes them itself, and can log every call it gets.
//!
//! Where each contract comes from (ONNX Runtime headers, include/onnxruntime/core/session/):
//! - onnxruntime_ep_c_api.h: `CreateEpApiFactoriesFn`/`ReleaseEpApiFactoryFn` (the two entry
//!   points), `struct OrtEpFactory`, `struct OrtEp`, `struct OrtNodeComputeInfo`,
//!   `struct OrtNodeFusionOptions`, and the first 18 entries of `struct OrtEpApi` (CreateEpDevice
//!   .. ReleaseHardwareDevice; `CreateHardwareDevice` is "\since Version 1.24"). OrtEpFactory and
//!   OrtEp are declared with the 1.23 layout and `ort_version_supported = 23`, so ORT reads no
//!   field past the ones declared here (the 1.24+ tails changed between ORT snapshots; the 1.23
//!   prefix did not). OrtEpApi is ORT's table, read only up to index 17, same in every snapshot.
//! - onnxruntime_c_api.h: `OrtApi` (taken from the ort-sys crate, table of API version 24, which
//!   is what the stub asks `OrtApiBase::GetApi` for), `RegisterCustomOpsLibrary` -> the
//!   `RegisterCustomOps(OrtSessionOptions*, const OrtApiBase*)` entry point.
//! - onnxruntime_ep_device_ep_metadata_keys.h: hardware-device metadata keys `IsVirtual`,
//!   `DiscoveredBy` (ORT itself adds the EP-device key `version`, from GetVersion).
//! - The compile route (GetCapability -> EpGraphSupportInfo_AddNodesToFuse -> Compile ->
//!   OrtNodeComputeInfo) follows ORT's example plugin EP (onnxruntime/test/autoep/library/).
//!
//! Provider options: `OrtEpFactory::CreateEp` gets them inside the session options, as session
//! config entries named `ep.<ep name, lowercased>.<key>` (here
//! `ep.ryzenailightexecutionprovider.<key>`); the stub reads every config entry with
//! `OrtApi::GetSessionOptionsConfigEntries` and splits them on that prefix.
//!
//! Environment variables:
//! - `ONEBIT_STUB_EP_MODE` (read by each CreateEp): `decline` (default) claims no node, so the
//!   whole graph falls to the CPU EP; `claim` claims every `Add`/`Mul` (ONNX domain) whose two
//!   inputs are float32 tensors of identical known shapes (known rank; a symbolic dim must carry
//!   the same name on both sides) and computes them (one fused node per claimed node). Any
//!   other value fails CreateEp.
//! - `ONEBIT_STUB_EP_RECORD=<file>` (read at each event): append one JSON object per line:
//!   `{"event":"create_factories","registered_name":S}`,
//!   `{"event":"create_ep","mode":S,"options":{K:V..},"config":{K:V..}}` (options: the EP's
//!   provider options with the prefix stripped; config: every other session config entry,
//!   full key), `{"event":"register_custom_ops"}`,
//!   `{"event":"get_capability","claimed":N,"nodes":M}` (one per GetCapability call), and
//!   `{"event":"compute","op":"Add"|"Mul"}` (one per kernel run).
//!
//! No panic crosses the FFI boundary (every callback runs under `catch_unwind`), and everything
//! the stub allocates is freed in the matching Release* callback (ReleaseEp, ReleaseEpFactory,
//! ReleaseNodeComputeInfos, OrtNodeComputeInfo::ReleaseState).

#![allow(non_snake_case)]

use std::ffi::{CStr, CString, c_char, c_void};
use std::fs::OpenOptions;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr;
use std::sync::Mutex;

use ort_sys::{
    ONNXTensorElementDataType, ONNXType, OrtAllocator, OrtApi, OrtApiBase, OrtEpDevice,
    OrtErrorCode, OrtGraph, OrtHardwareDevice, OrtHardwareDeviceType, OrtKernelContext,
    OrtKeyValuePairs, OrtLogger, OrtMemoryInfo, OrtNode, OrtSessionOptions, OrtStatus,
    OrtStatusPtr, OrtTensorTypeAndShapeInfo, OrtTypeInfo, OrtValue, OrtValueInfo,
};

/// The EP name the factory and the EP report; the real provider's name.
const EP_NAME: &CStr = c"RyzenAILightExecutionProvider";
const EP_VENDOR: &CStr = c"onebit-stub";
const EP_VERSION: &CStr = c"0.1.0";
/// AMD's PCI vendor id, and the device id of the Strix/Krackan NPU, for the virtual device.
const AMD_VENDOR_ID: u32 = 0x1022;
const NPU_DEVICE_ID: u32 = 0x17f0;
/// The OrtApi table version the stub asks for (ort-sys is built with `api-24`).
const ORT_API_VERSION_USED: u32 = 24;
/// The layout version of the EP-side structs declared below (OrtEpFactory, OrtEp,
/// OrtNodeComputeInfo, OrtNodeFusionOptions: all fields "\since Version 1.23" or older).
const EP_STRUCT_VERSION: u32 = 23;

type Status = *mut OrtStatus;

// ---- C structs of onnxruntime_ep_c_api.h ----------------------------------------------------

macro_rules! opaque {
    ($($name:ident),*) => {$(
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
        }
    )*};
}
opaque!(
    OrtEpGraphSupportInfo,
    OrtNodeComputeContext,
    OrtMemoryDevice
);

/// `struct OrtEpApi`, entries 0..=17 (CreateEpDevice .. ReleaseHardwareDevice). ORT owns the
/// table; the stub only reads this prefix of it. Unused entries are typed as bare pointers.
#[repr(C)]
struct OrtEpApi {
    CreateEpDevice: unsafe extern "C" fn(
        ep_factory: *mut OrtEpFactory,
        hardware_device: *const OrtHardwareDevice,
        ep_metadata: *const OrtKeyValuePairs,
        ep_options: *const OrtKeyValuePairs,
        ep_device: *mut *mut OrtEpDevice,
    ) -> Status,
    ReleaseEpDevice: unsafe extern "C" fn(device: *mut OrtEpDevice),
    EpGraphSupportInfo_AddNodesToFuse: unsafe extern "C" fn(
        graph_support_info: *mut OrtEpGraphSupportInfo,
        nodes: *const *const OrtNode,
        num_nodes: usize,
        node_fusion_options: *const OrtNodeFusionOptions,
    ) -> Status,
    EpGraphSupportInfo_AddSingleNode: *const c_void,
    NodeComputeContext_NodeName: *const c_void,
    EpDevice_AddAllocatorInfo: *const c_void,
    MemoryInfo_GetMemoryDevice: *const c_void,
    Value_GetMemoryDevice: *const c_void,
    MemoryDevice_AreEqual: *const c_void,
    MemoryDevice_GetDeviceType: *const c_void,
    MemoryDevice_GetMemoryType: *const c_void,
    MemoryDevice_GetVendorId: *const c_void,
    MemoryDevice_GetDeviceId: *const c_void,
    SyncStream_GetImpl: *const c_void,
    SyncStream_GetSyncId: *const c_void,
    GetSyncIdForLastWaitOnSyncStream: *const c_void,
    CreateHardwareDevice: unsafe extern "C" fn(
        type_: OrtHardwareDeviceType,
        vendor_id: u32,
        device_id: u32,
        vendor_name: *const c_char,
        metadata: *const OrtKeyValuePairs,
        hardware_device: *mut *mut OrtHardwareDevice,
    ) -> Status,
    ReleaseHardwareDevice: unsafe extern "C" fn(device: *mut OrtHardwareDevice),
}

/// `struct OrtNodeFusionOptions` (1.23).
#[repr(C)]
struct OrtNodeFusionOptions {
    ort_version_supported: u32,
    drop_constant_initializers: bool,
}

/// `struct OrtNodeComputeInfo` (1.23).
#[repr(C)]
struct OrtNodeComputeInfo {
    ort_version_supported: u32,
    CreateState: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtNodeComputeInfo,
            compute_context: *mut OrtNodeComputeContext,
            compute_state: *mut *mut c_void,
        ) -> Status,
    >,
    Compute: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtNodeComputeInfo,
            compute_state: *mut c_void,
            kernel_context: *mut OrtKernelContext,
        ) -> Status,
    >,
    ReleaseState:
        Option<unsafe extern "C" fn(this_ptr: *mut OrtNodeComputeInfo, compute_state: *mut c_void)>,
}

/// `struct OrtEp`, fields up to and including the 1.23 ones.
#[repr(C)]
pub struct OrtEp {
    ort_version_supported: u32,
    GetName: Option<unsafe extern "C" fn(this_ptr: *const OrtEp) -> *const c_char>,
    GetCapability: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEp,
            graph: *const OrtGraph,
            graph_support_info: *mut OrtEpGraphSupportInfo,
        ) -> Status,
    >,
    Compile: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEp,
            graphs: *const *const OrtGraph,
            fused_nodes: *const *const OrtNode,
            count: usize,
            node_compute_infos: *mut *mut OrtNodeComputeInfo,
            ep_context_nodes: *mut *mut OrtNode,
        ) -> Status,
    >,
    ReleaseNodeComputeInfos: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEp,
            node_compute_infos: *mut *mut OrtNodeComputeInfo,
            num_node_compute_infos: usize,
        ),
    >,
    GetPreferredDataLayout: *const c_void,
    ShouldConvertDataLayoutForOp: *const c_void,
    SetDynamicOptions: *const c_void,
    OnRunStart: *const c_void,
    OnRunEnd: *const c_void,
    CreateAllocator: *const c_void,
    CreateSyncStreamForDevice: *const c_void,
    GetCompiledModelCompatibilityInfo: *const c_void,
}

/// `struct OrtEpFactory`, fields up to and including the 1.23 ones.
#[repr(C)]
pub struct OrtEpFactory {
    ort_version_supported: u32,
    GetName: Option<unsafe extern "C" fn(this_ptr: *const OrtEpFactory) -> *const c_char>,
    GetVendor: Option<unsafe extern "C" fn(this_ptr: *const OrtEpFactory) -> *const c_char>,
    GetSupportedDevices: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            num_devices: usize,
            ep_devices: *mut *mut OrtEpDevice,
            max_ep_devices: usize,
            num_ep_devices: *mut usize,
        ) -> Status,
    >,
    CreateEp: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEpFactory,
            devices: *const *const OrtHardwareDevice,
            ep_metadata_pairs: *const *const OrtKeyValuePairs,
            num_devices: usize,
            session_options: *const OrtSessionOptions,
            logger: *const OrtLogger,
            ep: *mut *mut OrtEp,
        ) -> Status,
    >,
    ReleaseEp: Option<unsafe extern "C" fn(this_ptr: *mut OrtEpFactory, ep: *mut OrtEp)>,
    GetVendorId: Option<unsafe extern "C" fn(this_ptr: *const OrtEpFactory) -> u32>,
    GetVersion: Option<unsafe extern "C" fn(this_ptr: *const OrtEpFactory) -> *const c_char>,
    /// Optional (NULL): the stub produces no compiled models.
    ValidateCompiledModelCompatibilityInfo: *const c_void,
    CreateAllocator: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEpFactory,
            memory_info: *const OrtMemoryInfo,
            allocator_options: *const OrtKeyValuePairs,
            allocator: *mut *mut OrtAllocator,
        ) -> Status,
    >,
    ReleaseAllocator:
        Option<unsafe extern "C" fn(this_ptr: *mut OrtEpFactory, allocator: *mut OrtAllocator)>,
    CreateDataTransfer: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEpFactory,
            data_transfer: *mut *mut c_void,
        ) -> Status,
    >,
    IsStreamAware: Option<unsafe extern "C" fn(this_ptr: *const OrtEpFactory) -> bool>,
    CreateSyncStreamForDevice: Option<
        unsafe extern "C" fn(
            this_ptr: *mut OrtEpFactory,
            memory_device: *const OrtMemoryDevice,
            stream_options: *const OrtKeyValuePairs,
            stream: *mut *mut c_void,
        ) -> Status,
    >,
}

// ---- errors, statuses, panics ----------------------------------------------------------------

enum Fail {
    /// A status ORT returned; handed back to ORT as is.
    Ort(Status),
    Msg(String),
}
type R<T> = Result<T, Fail>;

fn check(s: OrtStatusPtr) -> R<()> {
    if s.0.is_null() {
        Ok(())
    } else {
        Err(Fail::Ort(s.0))
    }
}

fn fail<T>(msg: impl Into<String>) -> R<T> {
    Err(Fail::Msg(msg.into()))
}

fn create_status(api: &OrtApi, msg: &str) -> Status {
    let msg =
        CString::new(format!("onebit-stub-ep: {}", msg.replace('\0', " "))).unwrap_or_default();
    // SAFETY: CreateStatus copies the message.
    unsafe { (api.CreateStatus)(OrtErrorCode::ORT_EP_FAIL, msg.as_ptr()).0 }
}

/// Runs a status-returning callback body: errors become an OrtStatus, a panic becomes one too.
fn guard(api: &OrtApi, f: impl FnOnce() -> R<()>) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => ptr::null_mut(),
        Ok(Err(Fail::Ort(s))) => s,
        Ok(Err(Fail::Msg(m))) => create_status(api, &m),
        Err(_) => create_status(api, "panic in the stub EP"),
    }
}

/// Runs a callback that cannot report an error; a panic yields `default`.
fn quiet<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(default)
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn string_at(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: per the contract above.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

// ---- the record file -------------------------------------------------------------------------

static RECORD_LOCK: Mutex<()> = Mutex::new(());

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn json_map(pairs: &[(String, String)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{}:{}", json_string(k), json_string(v)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// Appends `{"event":<event>,<fields>}` to $ONEBIT_STUB_EP_RECORD, if set. `fields` are already
/// JSON (`"key":value` items). Write errors are ignored: recording must not change behaviour.
fn record(event: &str, fields: &[(&str, String)]) {
    let Some(path) = std::env::var_os("ONEBIT_STUB_EP_RECORD") else {
        return;
    };
    let mut line = format!("{{\"event\":{}", json_string(event));
    for (k, v) in fields {
        line.push_str(&format!(",{}:{}", json_string(k), v));
    }
    line.push_str("}\n");
    let _held = RECORD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(path) {
        let _ = f.write_all(line.as_bytes());
    }
}

// ---- OrtApi helpers --------------------------------------------------------------------------

/// An owned OrtKeyValuePairs, released on drop.
struct Kvp<'a> {
    api: &'a OrtApi,
    ptr: *mut OrtKeyValuePairs,
}

impl<'a> Kvp<'a> {
    fn new(api: &'a OrtApi, pairs: &[(&CStr, &CStr)]) -> Self {
        let mut ptr = ptr::null_mut();
        // SAFETY: plain OrtApi calls; AddKeyValuePair copies key and value.
        unsafe {
            (api.CreateKeyValuePairs)(&mut ptr);
            for (k, v) in pairs {
                (api.AddKeyValuePair)(ptr, k.as_ptr(), v.as_ptr());
            }
        }
        Kvp { api, ptr }
    }
}

impl Drop for Kvp<'_> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: created by CreateKeyValuePairs (or handed to us to release).
            unsafe { (self.api.ReleaseKeyValuePairs)(self.ptr) }
        }
    }
}

/// # Safety
/// `kvp` is a valid OrtKeyValuePairs.
unsafe fn kvp_entries(api: &OrtApi, kvp: *const OrtKeyValuePairs) -> Vec<(String, String)> {
    let mut keys: *const *const c_char = ptr::null();
    let mut values: *const *const c_char = ptr::null();
    let mut n = 0usize;
    // SAFETY: ORT fills two arrays of n strings it owns.
    unsafe {
        (api.GetKeyValuePairs)(kvp, &mut keys, &mut values, &mut n);
        (0..n)
            .map(|i| (string_at(*keys.add(i)), string_at(*values.add(i))))
            .collect()
    }
}

/// Element type, dims and symbolic dim names of a graph value, if it is a tensor of known rank.
struct TensorInfo {
    elem: ONNXTensorElementDataType,
    dims: Vec<i64>,
    symbolic: Vec<String>,
}

/// # Safety
/// `vi` is a valid OrtValueInfo.
unsafe fn tensor_info(api: &OrtApi, vi: *const OrtValueInfo) -> R<Option<TensorInfo>> {
    // SAFETY: the type info and tensor info belong to the value info; nothing to release.
    unsafe {
        let mut type_info: *const OrtTypeInfo = ptr::null();
        check((api.GetValueInfoTypeInfo)(vi, &mut type_info))?;
        let mut onnx_type = ONNXType::ONNX_TYPE_UNKNOWN;
        check((api.GetOnnxTypeFromTypeInfo)(type_info, &mut onnx_type))?;
        if onnx_type != ONNXType::ONNX_TYPE_TENSOR {
            return Ok(None);
        }
        let mut tsi: *const OrtTensorTypeAndShapeInfo = ptr::null();
        check((api.CastTypeInfoToTensorInfo)(type_info, &mut tsi))?;
        if tsi.is_null() {
            return Ok(None);
        }
        if !(api.TensorTypeAndShape_HasShape)(tsi) {
            return Ok(None); // unknown rank: nothing to compare
        }
        let mut elem = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        check((api.GetTensorElementType)(tsi, &mut elem))?;
        let mut rank = 0usize;
        check((api.GetDimensionsCount)(tsi, &mut rank))?;
        let mut dims = vec![0i64; rank];
        check((api.GetDimensions)(tsi, dims.as_mut_ptr(), rank))?;
        let mut names: Vec<*const c_char> = vec![ptr::null(); rank];
        check((api.GetSymbolicDimensions)(tsi, names.as_mut_ptr(), rank))?;
        let symbolic = names.iter().map(|&p| string_at(p)).collect();
        Ok(Some(TensorInfo {
            elem,
            dims,
            symbolic,
        }))
    }
}

/// # Safety
/// `node` is a valid OrtNode.
unsafe fn node_values(
    api: &OrtApi,
    node: *const OrtNode,
    outputs: bool,
) -> R<Vec<*const OrtValueInfo>> {
    // SAFETY: sized by the matching count call.
    unsafe {
        let mut n = 0usize;
        if outputs {
            check((api.Node_GetNumOutputs)(node, &mut n))?;
        } else {
            check((api.Node_GetNumInputs)(node, &mut n))?;
        }
        let mut v = vec![ptr::null(); n];
        if outputs {
            check((api.Node_GetOutputs)(node, v.as_mut_ptr(), n))?;
        } else {
            check((api.Node_GetInputs)(node, v.as_mut_ptr(), n))?;
        }
        Ok(v)
    }
}

/// # Safety
/// `vi` is null (a missing optional value) or a valid OrtValueInfo.
unsafe fn value_name(api: &OrtApi, vi: *const OrtValueInfo) -> R<String> {
    if vi.is_null() {
        return Ok(String::new());
    }
    let mut p: *const c_char = ptr::null();
    // SAFETY: the name belongs to the value info.
    unsafe {
        check((api.GetValueInfoName)(vi, &mut p))?;
        Ok(string_at(p))
    }
}

/// # Safety
/// `node` is a valid OrtNode.
unsafe fn node_str(
    node: *const OrtNode,
    get: unsafe extern "system" fn(*const OrtNode, *mut *const c_char) -> OrtStatusPtr,
) -> R<String> {
    let mut p: *const c_char = ptr::null();
    // SAFETY: the string belongs to the node.
    unsafe {
        check(get(node, &mut p))?;
        Ok(string_at(p))
    }
}

/// # Safety
/// `graph` is a valid OrtGraph.
unsafe fn graph_nodes(api: &OrtApi, graph: *const OrtGraph) -> R<Vec<*const OrtNode>> {
    // SAFETY: sized by Graph_GetNumNodes.
    unsafe {
        let mut n = 0usize;
        check((api.Graph_GetNumNodes)(graph, &mut n))?;
        let mut nodes = vec![ptr::null(); n];
        if n > 0 {
            check((api.Graph_GetNodes)(graph, nodes.as_mut_ptr(), n))?;
        }
        Ok(nodes)
    }
}

// ---- the factory -----------------------------------------------------------------------------

#[repr(C)]
struct StubFactory {
    base: OrtEpFactory, // first: ORT's OrtEpFactory* is a StubFactory*
    api: &'static OrtApi,
    ep_api: &'static OrtEpApi,
    /// The virtual NPU, created on the first GetSupportedDevices, released with the factory.
    virtual_npu: *mut OrtHardwareDevice,
}

/// # Safety
/// `ort_api_base` is ORT's OrtApiBase; `factories` has room for `max_factories` pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn CreateEpFactories(
    registered_name: *const c_char,
    ort_api_base: *const OrtApiBase,
    _default_logger: *const OrtLogger,
    factories: *mut *mut OrtEpFactory,
    max_factories: usize,
    num_factories: *mut usize,
) -> Status {
    // SAFETY: ORT passes its OrtApiBase; the OrtApi table it returns lives as long as the process.
    let api: &'static OrtApi = unsafe {
        let api = ((*ort_api_base).GetApi)(ORT_API_VERSION_USED);
        if api.is_null() {
            // An ORT older than API 24: answer with the oldest table's CreateStatus.
            let v1 = ((*ort_api_base).GetApi)(1);
            if v1.is_null() {
                return ptr::null_mut();
            }
            let msg = c"onebit-stub-ep: needs ONNX Runtime API version 24 or newer";
            return ((*v1).CreateStatus)(OrtErrorCode::ORT_FAIL, msg.as_ptr()).0;
        }
        &*api
    };
    guard(api, || {
        // SAFETY: GetEpApi returns ORT's static OrtEpApi table (at least 18 entries for API 24).
        let ep_api = unsafe { &*((api.GetEpApi)() as *const OrtEpApi) };
        // SAFETY: a C string from ORT.
        let registered = unsafe { string_at(registered_name) };
        if max_factories < 1 {
            return fail("no room for the EP factory");
        }
        let factory = Box::new(StubFactory {
            base: OrtEpFactory {
                ort_version_supported: EP_STRUCT_VERSION,
                GetName: Some(factory_get_name),
                GetVendor: Some(factory_get_vendor),
                GetSupportedDevices: Some(factory_get_supported_devices),
                CreateEp: Some(factory_create_ep),
                ReleaseEp: Some(factory_release_ep),
                GetVendorId: Some(factory_get_vendor_id),
                GetVersion: Some(factory_get_version),
                ValidateCompiledModelCompatibilityInfo: ptr::null(),
                CreateAllocator: Some(factory_create_allocator),
                ReleaseAllocator: Some(factory_release_allocator),
                CreateDataTransfer: Some(factory_create_data_transfer),
                IsStreamAware: Some(factory_is_stream_aware),
                CreateSyncStreamForDevice: Some(factory_create_sync_stream),
            },
            api,
            ep_api,
            virtual_npu: ptr::null_mut(),
        });
        record(
            "create_factories",
            &[("registered_name", json_string(&registered))],
        );
        // SAFETY: ORT's out-parameters.
        unsafe {
            *factories = Box::into_raw(factory) as *mut OrtEpFactory;
            *num_factories = 1;
        }
        Ok(())
    })
}

/// # Safety
/// `factory` came from CreateEpFactories and is released once.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ReleaseEpFactory(factory: *mut OrtEpFactory) -> Status {
    if factory.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: every OrtEpFactory this library hands out is a boxed StubFactory.
    let factory = unsafe { Box::from_raw(factory as *mut StubFactory) };
    quiet((), || {
        if !factory.virtual_npu.is_null() {
            // SAFETY: created by CreateHardwareDevice, owned by the factory.
            unsafe { (factory.ep_api.ReleaseHardwareDevice)(factory.virtual_npu) }
        }
    });
    ptr::null_mut()
}

unsafe extern "C" fn factory_get_name(_this: *const OrtEpFactory) -> *const c_char {
    EP_NAME.as_ptr()
}

unsafe extern "C" fn factory_get_vendor(_this: *const OrtEpFactory) -> *const c_char {
    EP_VENDOR.as_ptr()
}

unsafe extern "C" fn factory_get_vendor_id(_this: *const OrtEpFactory) -> u32 {
    AMD_VENDOR_ID
}

unsafe extern "C" fn factory_get_version(_this: *const OrtEpFactory) -> *const c_char {
    EP_VERSION.as_ptr()
}

/// Offers one OrtEpDevice on a virtual NPU the factory creates itself (OrtEpApi::
/// CreateHardwareDevice), whatever hardware ORT discovered: there is no NPU to discover.
unsafe extern "C" fn factory_get_supported_devices(
    this: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _num_devices: usize,
    ep_devices: *mut *mut OrtEpDevice,
    max_ep_devices: usize,
    num_ep_devices: *mut usize,
) -> Status {
    // SAFETY: `this` is a StubFactory (see CreateEpFactories).
    let factory = unsafe { &mut *(this as *mut StubFactory) };
    let api = factory.api;
    guard(api, || {
        // SAFETY: ORT's out-parameter.
        unsafe { *num_ep_devices = 0 };
        if max_ep_devices < 1 {
            return Ok(());
        }
        if factory.virtual_npu.is_null() {
            let hw_meta = Kvp::new(api, &[(c"IsVirtual", c"1"), (c"DiscoveredBy", EP_NAME)]);
            let mut hw = ptr::null_mut();
            // SAFETY: ORT copies the vendor name and the metadata.
            check(OrtStatusPtr(unsafe {
                (factory.ep_api.CreateHardwareDevice)(
                    OrtHardwareDeviceType::OrtHardwareDeviceType_NPU,
                    AMD_VENDOR_ID,
                    NPU_DEVICE_ID,
                    c"AMD".as_ptr(),
                    hw_meta.ptr,
                    &mut hw,
                )
            }))?;
            factory.virtual_npu = hw;
        }
        let ep_meta = Kvp::new(
            api,
            // No "version" key: ORT adds it from GetVersion and rejects an EP that sets it.
            &[(c"onebit_stub", c"1"), (c"virtual_npu", c"1")],
        );
        let mut dev = ptr::null_mut();
        // SAFETY: CreateEpDevice copies the metadata; ORT takes ownership of the OrtEpDevice.
        check(OrtStatusPtr(unsafe {
            (factory.ep_api.CreateEpDevice)(
                this,
                factory.virtual_npu,
                ep_meta.ptr,
                ptr::null(),
                &mut dev,
            )
        }))?;
        // SAFETY: ORT's out-parameters, room for max_ep_devices >= 1.
        unsafe {
            *ep_devices = dev;
            *num_ep_devices = 1;
        }
        Ok(())
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Decline,
    Claim,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Decline => "decline",
            Mode::Claim => "claim",
        }
    }
}

fn mode_from_env() -> R<Mode> {
    match std::env::var("ONEBIT_STUB_EP_MODE") {
        Err(_) => Ok(Mode::Decline),
        Ok(v) if v.is_empty() || v == "decline" => Ok(Mode::Decline),
        Ok(v) if v == "claim" => Ok(Mode::Claim),
        Ok(v) => fail(format!(
            "ONEBIT_STUB_EP_MODE={v:?}: expected \"decline\" or \"claim\""
        )),
    }
}

unsafe extern "C" fn factory_create_ep(
    this: *mut OrtEpFactory,
    _devices: *const *const OrtHardwareDevice,
    _ep_metadata_pairs: *const *const OrtKeyValuePairs,
    _num_devices: usize,
    session_options: *const OrtSessionOptions,
    _logger: *const OrtLogger,
    ep: *mut *mut OrtEp,
) -> Status {
    // SAFETY: `this` is a StubFactory.
    let factory = unsafe { &*(this as *const StubFactory) };
    let api = factory.api;
    guard(api, || {
        // SAFETY: ORT's out-parameter.
        unsafe { *ep = ptr::null_mut() };
        let mode = mode_from_env()?;
        let mut entries = Vec::new();
        if !session_options.is_null() {
            let mut kvp = ptr::null_mut();
            // SAFETY: the returned pairs are ours to release (Kvp does).
            check(unsafe { (api.GetSessionOptionsConfigEntries)(session_options, &mut kvp) })?;
            let kvp = Kvp { api, ptr: kvp };
            // SAFETY: a valid OrtKeyValuePairs.
            entries = unsafe { kvp_entries(api, kvp.ptr) };
        }
        entries.sort();
        let prefix = format!("ep.{}.", EP_NAME.to_string_lossy().to_lowercase());
        let (options, config): (Vec<_>, Vec<_>) = entries
            .into_iter()
            .partition(|(k, _)| k.starts_with(&prefix));
        let options: Vec<(String, String)> = options
            .into_iter()
            .map(|(k, v)| (k[prefix.len()..].to_string(), v))
            .collect();
        record(
            "create_ep",
            &[
                ("mode", json_string(mode.name())),
                ("options", json_map(&options)),
                ("config", json_map(&config)),
            ],
        );
        let stub = Box::new(StubEp {
            base: OrtEp {
                ort_version_supported: EP_STRUCT_VERSION,
                GetName: Some(ep_get_name),
                GetCapability: Some(ep_get_capability),
                Compile: Some(ep_compile),
                ReleaseNodeComputeInfos: Some(ep_release_node_compute_infos),
                GetPreferredDataLayout: ptr::null(),
                ShouldConvertDataLayoutForOp: ptr::null(),
                SetDynamicOptions: ptr::null(),
                OnRunStart: ptr::null(),
                OnRunEnd: ptr::null(),
                CreateAllocator: ptr::null(),
                CreateSyncStreamForDevice: ptr::null(),
                GetCompiledModelCompatibilityInfo: ptr::null(),
            },
            api,
            ep_api: factory.ep_api,
            mode,
        });
        // SAFETY: ORT's out-parameter.
        unsafe { *ep = Box::into_raw(stub) as *mut OrtEp };
        Ok(())
    })
}

unsafe extern "C" fn factory_release_ep(_this: *mut OrtEpFactory, ep: *mut OrtEp) {
    if !ep.is_null() {
        // SAFETY: every OrtEp this library hands out is a boxed StubEp.
        drop(unsafe { Box::from_raw(ep as *mut StubEp) });
    }
}

/// No allocator of its own: ORT's default CPU allocator serves the EP (the device is virtual).
unsafe extern "C" fn factory_create_allocator(
    _this: *mut OrtEpFactory,
    _memory_info: *const OrtMemoryInfo,
    _allocator_options: *const OrtKeyValuePairs,
    allocator: *mut *mut OrtAllocator,
) -> Status {
    // SAFETY: ORT's out-parameter.
    unsafe { *allocator = ptr::null_mut() };
    ptr::null_mut()
}

unsafe extern "C" fn factory_release_allocator(_this: *mut OrtEpFactory, _a: *mut OrtAllocator) {}

unsafe extern "C" fn factory_create_data_transfer(
    _this: *mut OrtEpFactory,
    data_transfer: *mut *mut c_void,
) -> Status {
    // SAFETY: ORT's out-parameter.
    unsafe { *data_transfer = ptr::null_mut() };
    ptr::null_mut()
}

unsafe extern "C" fn factory_is_stream_aware(_this: *const OrtEpFactory) -> bool {
    false
}

unsafe extern "C" fn factory_create_sync_stream(
    _this: *mut OrtEpFactory,
    _memory_device: *const OrtMemoryDevice,
    _stream_options: *const OrtKeyValuePairs,
    stream: *mut *mut c_void,
) -> Status {
    // SAFETY: ORT's out-parameter.
    unsafe { *stream = ptr::null_mut() };
    ptr::null_mut()
}

// ---- the EP ----------------------------------------------------------------------------------

#[repr(C)]
struct StubEp {
    base: OrtEp, // first: ORT's OrtEp* is a StubEp*
    api: &'static OrtApi,
    ep_api: &'static OrtEpApi,
    mode: Mode,
}

unsafe extern "C" fn ep_get_name(_this: *const OrtEp) -> *const c_char {
    EP_NAME.as_ptr()
}

/// Whether the stub in claim mode takes `node`: an ONNX-domain Add or Mul with two float32
/// tensor inputs of the same known shape and a float32 output.
///
/// # Safety
/// `node` is a valid OrtNode.
unsafe fn claimable(api: &OrtApi, node: *const OrtNode) -> R<Option<BinOp>> {
    // SAFETY: node queries on a valid node.
    unsafe {
        let op = match node_str(node, api.Node_GetOperatorType)?.as_str() {
            "Add" => BinOp::Add,
            "Mul" => BinOp::Mul,
            _ => return Ok(None),
        };
        if !node_str(node, api.Node_GetDomain)?.is_empty() {
            return Ok(None);
        }
        let inputs = node_values(api, node, false)?;
        let outputs = node_values(api, node, true)?;
        if inputs.len() != 2
            || outputs.len() != 1
            || inputs.iter().chain(&outputs).any(|v| v.is_null())
        {
            return Ok(None);
        }
        let (Some(a), Some(b), Some(y)) = (
            tensor_info(api, inputs[0])?,
            tensor_info(api, inputs[1])?,
            tensor_info(api, outputs[0])?,
        ) else {
            return Ok(None);
        };
        let float = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
        if a.elem != float || b.elem != float || y.elem != float || a.dims != b.dims {
            return Ok(None);
        }
        // A dynamic dim is only known equal when both sides name the same symbol.
        let same =
            a.dims.iter().enumerate().all(|(i, &d)| {
                d >= 0 || (!a.symbolic[i].is_empty() && a.symbolic[i] == b.symbolic[i])
            });
        Ok(same.then_some(op))
    }
}

unsafe extern "C" fn ep_get_capability(
    this: *mut OrtEp,
    graph: *const OrtGraph,
    graph_support_info: *mut OrtEpGraphSupportInfo,
) -> Status {
    // SAFETY: `this` is a StubEp.
    let ep = unsafe { &*(this as *const StubEp) };
    let api = ep.api;
    guard(api, || {
        // SAFETY: ORT's graph, valid for this call.
        let nodes = unsafe { graph_nodes(api, graph)? };
        let mut claimed = 0usize;
        if ep.mode == Mode::Claim {
            let options = OrtNodeFusionOptions {
                ort_version_supported: EP_STRUCT_VERSION,
                drop_constant_initializers: false,
            };
            for &node in &nodes {
                // SAFETY: a node of the graph.
                if unsafe { claimable(api, node)? }.is_some() {
                    // One fused node per claimed node: no unsupported node can sit between.
                    // SAFETY: ORT copies what it needs from the one-element array.
                    check(OrtStatusPtr(unsafe {
                        (ep.ep_api.EpGraphSupportInfo_AddNodesToFuse)(
                            graph_support_info,
                            &node,
                            1,
                            &options,
                        )
                    }))?;
                    claimed += 1;
                }
            }
        }
        record(
            "get_capability",
            &[
                ("claimed", claimed.to_string()),
                ("nodes", nodes.len().to_string()),
            ],
        );
        Ok(())
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum BinOp {
    Add,
    Mul,
}

impl BinOp {
    fn name(self) -> &'static str {
        match self {
            BinOp::Add => "Add",
            BinOp::Mul => "Mul",
        }
    }
}

/// What one fused node computes: `op` on fused-node inputs `a` and `b` (indices into the fused
/// node's inputs; equal for `x op x`).
#[derive(Clone, Copy)]
struct Kernel {
    op: BinOp,
    a: usize,
    b: usize,
}

#[repr(C)]
struct StubComputeInfo {
    base: OrtNodeComputeInfo, // first: ORT's OrtNodeComputeInfo* is a StubComputeInfo*
    api: &'static OrtApi,
    kernel: Kernel,
}

/// # Safety
/// `graph` and `fused` are valid for this call.
unsafe fn compile_one(api: &OrtApi, graph: *const OrtGraph, fused: *const OrtNode) -> R<Kernel> {
    // SAFETY: graph and node queries on valid objects.
    unsafe {
        let nodes = graph_nodes(api, graph)?;
        let [node] = nodes[..] else {
            return fail(format!(
                "expected one node per fused graph, got {}",
                nodes.len()
            ));
        };
        let Some(op) = claimable(api, node)? else {
            return fail("asked to compile a node the stub does not claim");
        };
        let inputs = node_values(api, node, false)?;
        let fused_inputs = node_values(api, fused, false)?;
        let fused_names: Vec<String> = fused_inputs
            .iter()
            .map(|&v| value_name(api, v))
            .collect::<R<_>>()?;
        let index_of = |vi: *const OrtValueInfo| -> R<usize> {
            let name = value_name(api, vi)?;
            match fused_names.iter().position(|n| *n == name) {
                Some(i) => Ok(i),
                None => fail(format!("input {name:?} is not an input of the fused node")),
            }
        };
        Ok(Kernel {
            op,
            a: index_of(inputs[0])?,
            b: index_of(inputs[1])?,
        })
    }
}

unsafe extern "C" fn ep_compile(
    this: *mut OrtEp,
    graphs: *const *const OrtGraph,
    fused_nodes: *const *const OrtNode,
    count: usize,
    node_compute_infos: *mut *mut OrtNodeComputeInfo,
    _ep_context_nodes: *mut *mut OrtNode,
) -> Status {
    // SAFETY: `this` is a StubEp.
    let ep = unsafe { &*(this as *const StubEp) };
    let api = ep.api;
    guard(api, || {
        // Build every kernel first, so a failure leaves nothing half handed out.
        let mut kernels = Vec::with_capacity(count);
        for i in 0..count {
            // SAFETY: ORT passes `count` graphs and fused nodes.
            kernels.push(unsafe { compile_one(api, *graphs.add(i), *fused_nodes.add(i))? });
        }
        for (i, kernel) in kernels.into_iter().enumerate() {
            let info = Box::new(StubComputeInfo {
                base: OrtNodeComputeInfo {
                    ort_version_supported: EP_STRUCT_VERSION,
                    CreateState: Some(compute_create_state),
                    Compute: Some(compute_run),
                    ReleaseState: Some(compute_release_state),
                },
                api,
                kernel,
            });
            // SAFETY: ORT's out-array of `count`; ORT gives them back to ReleaseNodeComputeInfos.
            unsafe { *node_compute_infos.add(i) = Box::into_raw(info) as *mut OrtNodeComputeInfo };
        }
        Ok(())
    })
}

unsafe extern "C" fn ep_release_node_compute_infos(
    _this: *mut OrtEp,
    node_compute_infos: *mut *mut OrtNodeComputeInfo,
    num_node_compute_infos: usize,
) {
    for i in 0..num_node_compute_infos {
        // SAFETY: each one is a boxed StubComputeInfo from ep_compile, released once.
        unsafe {
            let info = *node_compute_infos.add(i);
            if !info.is_null() {
                drop(Box::from_raw(info as *mut StubComputeInfo));
            }
        }
    }
}

unsafe extern "C" fn compute_create_state(
    this: *mut OrtNodeComputeInfo,
    _compute_context: *mut OrtNodeComputeContext,
    compute_state: *mut *mut c_void,
) -> Status {
    // SAFETY: `this` is a StubComputeInfo.
    let info = unsafe { &*(this as *const StubComputeInfo) };
    guard(info.api, || {
        // SAFETY: ORT's out-parameter; freed by compute_release_state.
        unsafe { *compute_state = Box::into_raw(Box::new(info.kernel)) as *mut c_void };
        Ok(())
    })
}

unsafe extern "C" fn compute_release_state(_this: *mut OrtNodeComputeInfo, state: *mut c_void) {
    if !state.is_null() {
        // SAFETY: a boxed Kernel from compute_create_state.
        drop(unsafe { Box::from_raw(state as *mut Kernel) });
    }
}

/// An input tensor's shape and data.
///
/// # Safety
/// `ctx` is the kernel context of the running call.
unsafe fn float_input(
    api: &OrtApi,
    ctx: *mut OrtKernelContext,
    index: usize,
) -> R<(Vec<i64>, *const f32)> {
    // SAFETY: kernel-context queries during Compute.
    unsafe {
        let mut value: *const OrtValue = ptr::null();
        check((api.KernelContext_GetInput)(ctx, index, &mut value))?;
        if value.is_null() {
            return fail(format!("input {index} is missing"));
        }
        let mut tsi: *mut OrtTensorTypeAndShapeInfo = ptr::null_mut();
        check((api.GetTensorTypeAndShape)(value, &mut tsi))?;
        let shape = (|| -> R<(ONNXTensorElementDataType, Vec<i64>)> {
            let mut elem = ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
            check((api.GetTensorElementType)(tsi, &mut elem))?;
            let mut rank = 0usize;
            check((api.GetDimensionsCount)(tsi, &mut rank))?;
            let mut dims = vec![0i64; rank];
            check((api.GetDimensions)(tsi, dims.as_mut_ptr(), rank))?;
            Ok((elem, dims))
        })();
        (api.ReleaseTensorTypeAndShapeInfo)(tsi);
        let (elem, dims) = shape?;
        if elem != ONNXTensorElementDataType::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT {
            return fail(format!("input {index} is not float32"));
        }
        let mut data: *mut c_void = ptr::null_mut();
        check((api.GetTensorMutableData)(
            value as *mut OrtValue,
            &mut data,
        ))?;
        Ok((dims, data as *const f32))
    }
}

unsafe extern "C" fn compute_run(
    this: *mut OrtNodeComputeInfo,
    state: *mut c_void,
    ctx: *mut OrtKernelContext,
) -> Status {
    // SAFETY: `this` is a StubComputeInfo.
    let info = unsafe { &*(this as *const StubComputeInfo) };
    let api = info.api;
    guard(api, || {
        let kernel = if state.is_null() {
            info.kernel
        } else {
            // SAFETY: a Kernel from compute_create_state.
            unsafe { *(state as *const Kernel) }
        };
        // SAFETY: ORT runs this with a live kernel context; the output is allocated with the
        // inputs' shape, so all three buffers hold `n` floats.
        unsafe {
            let (dims_a, a) = float_input(api, ctx, kernel.a)?;
            let (dims_b, b) = float_input(api, ctx, kernel.b)?;
            if dims_a != dims_b {
                return fail(format!(
                    "{}: input shapes differ at run time: {dims_a:?} vs {dims_b:?}",
                    kernel.op.name()
                ));
            }
            let n: usize = dims_a.iter().map(|&d| d.max(0) as usize).product();
            let mut out: *mut OrtValue = ptr::null_mut();
            check((api.KernelContext_GetOutput)(
                ctx,
                0,
                dims_a.as_ptr(),
                dims_a.len(),
                &mut out,
            ))?;
            let mut y: *mut c_void = ptr::null_mut();
            check((api.GetTensorMutableData)(out, &mut y))?;
            let y = y as *mut f32;
            if n > 0 {
                for i in 0..n {
                    let (x0, x1) = (*a.add(i), *b.add(i));
                    *y.add(i) = match kernel.op {
                        BinOp::Add => x0 + x1,
                        BinOp::Mul => x0 * x1,
                    };
                }
            }
        }
        record("compute", &[("op", json_string(kernel.op.name()))]);
        Ok(())
    })
}

// ---- custom ops ------------------------------------------------------------------------------

/// What `OrtApi::RegisterCustomOpsLibrary[_V2]` calls. The stub registers no op domain (the
/// models it serves have no RyzenAI custom ops); it records the call and succeeds.
///
/// # Safety
/// `api_base` is ORT's OrtApiBase.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RegisterCustomOps(
    _options: *mut OrtSessionOptions,
    _api_base: *const OrtApiBase,
) -> Status {
    quiet((), || record("register_custom_ops", &[]));
    ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(
            json_string("a\"b\\c\nd\u{1}é"),
            "\"a\\\"b\\\\c\\nd\\u0001é\""
        );
        assert_eq!(
            json_map(&[("k".into(), "v".into()), ("x".into(), "".into())]),
            "{\"k\":\"v\",\"x\":\"\"}"
        );
    }
}
