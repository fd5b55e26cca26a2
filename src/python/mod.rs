//! The `devtensor._devtensor` extension module (PyO3, abi3), and the API
//! Rust extension modules build on ([`TensorArg`], [`TensorOut`],
//! [`Framework`]; see the README's "Use from a kernel library").
//!
//! Producer: `Tensor.__dlpack__` (a raw C method, see `dlpack_method`) /
//! `__dlpack_device__` / `__dlpack_c_exchange_api__`.
//! Consumer: `from_dlpack`, which tries the producer type's exchange API, then
//! `__dlpack__(max_version=(1, 3), ...)`, then the legacy call.

mod array_interface;
mod buffer;
mod capsule;
mod consumer;
mod convert;
mod dlpack_method;
mod errors;
mod exchange;
mod fastcall;
mod kernel_api;
#[cfg(feature = "cuda")]
mod streams;
mod tensor;
mod values;

use pyo3::prelude::*;

use crate::dtype::DType;
use crate::tensor::Tensor;
use convert::{DTypeArg, DeviceArg, ShapeArg, scalar_bytes};
use errors::to_py;
use fastcall::{MethodDef, Signature, extract, extract_optional, fast_function, required};
pub use kernel_api::{Framework, TensorArg, TensorOut, default_framework, empty_on, order_streams, to_py_err};
pub(crate) use tensor::PyTensor;

/// `empty(shape, dtype="float32", device="cpu")`.
fn empty(py: Python<'_>, shape: ShapeArg, dtype: Option<DTypeArg>, device: Option<DeviceArg>) -> PyResult<PyTensor> {
    let dtype = dtype.map_or(DType::F32, |d| d.0);
    let device = device.unwrap_or_default();
    let t = if device.is_cpu() {
        // A CPU allocation is quick: releasing the GIL would cost more than it saves.
        Tensor::empty(&shape.0, dtype, crate::Device::Cpu)
    } else {
        // A GPU one may create the context, wait in the driver, or free the
        // cache and retry on OOM (which synchronises).
        py.detach(|| Tensor::empty(&shape.0, dtype, device.resolve()?))
    };
    Ok(PyTensor::from(t.map_err(to_py)?))
}

/// Runs `f` without the GIL unless it is small work on pageable host memory
/// only: anything on a GPU (a copy, fill or clone that synchronises, a first
/// kernel use that compiles, an allocation) can block for long.
pub(crate) fn detach_unless_small_cpu<T: Send>(
    py: Python<'_>,
    devices: &[crate::Device],
    bytes: usize,
    f: impl FnOnce() -> T + Send,
) -> T {
    if bytes >= 1 << 16 || devices.iter().any(|&d| d != crate::Device::Cpu) {
        py.detach(f)
    } else {
        f()
    }
}

fn filled(
    py: Python<'_>,
    shape: ShapeArg,
    value: &Bound<'_, PyAny>,
    dtype: DType,
    device: DeviceArg,
) -> PyResult<PyTensor> {
    filled_bytes(py, shape, &scalar_bytes(value, dtype)?, dtype, device)
}

/// [`filled`] with the element's bytes.
fn filled_bytes(py: Python<'_>, shape: ShapeArg, bytes: &[u8], dtype: DType, device: DeviceArg) -> PyResult<PyTensor> {
    let total = shape.0.iter().product::<usize>().saturating_mul(dtype.size());
    let make = || Tensor::full_bytes(&shape.0, dtype, device.resolve()?, bytes);
    let t = if device.is_cpu() && total < 1 << 16 {
        make()
    } else {
        py.detach(make) // a GPU fill compiles its kernel on first use, pinned ones synchronise
    }
    .map_err(to_py)?;
    Ok(PyTensor::from(t))
}

/// `zeros(shape, dtype="float32", device="cpu")`.
fn zeros(py: Python<'_>, shape: ShapeArg, dtype: Option<DTypeArg>, device: Option<DeviceArg>) -> PyResult<PyTensor> {
    let dtype = dtype.map_or(DType::F32, |d| d.0);
    // Zero bytes, converting no Python object: every dtype's zero, and for
    // float8_e8m0fnu (no zero) its smallest value 2^-127, as numpy.zeros and
    // torch.zeros give (`full(0)` rounds 0 as ml_dtypes does instead: NaN).
    const ZERO: [u8; 16] = [0; 16];
    filled_bytes(py, shape, &ZERO[..dtype.size()], dtype, device.unwrap_or_default())
}

/// `ones(shape, dtype="float32", device="cpu")`.
fn ones(py: Python<'_>, shape: ShapeArg, dtype: Option<DTypeArg>, device: Option<DeviceArg>) -> PyResult<PyTensor> {
    let one = 1i64.into_pyobject(py)?.into_any();
    filled(
        py,
        shape,
        &one,
        dtype.map_or(DType::F32, |d| d.0),
        device.unwrap_or_default(),
    )
}

/// `full(shape, fill_value, dtype=None, device="cpu")`: the dtype defaults to
/// bool, int64, float32 or complex64 after the value, as in torch.
fn full(
    py: Python<'_>,
    shape: ShapeArg,
    fill_value: &Bound<'_, PyAny>,
    dtype: Option<DTypeArg>,
    device: Option<DeviceArg>,
) -> PyResult<PyTensor> {
    let dtype = match dtype {
        Some(d) => d.0,
        None => convert::infer_dtype(fill_value)?,
    };
    filled(py, shape, fill_value, dtype, device.unwrap_or_default())
}

// The constructors as fast C functions (see `fastcall`): `empty((1024,),
// dtype=np.float64)` 224 → 194 ns, as fast as with the dtype by position.
const CREATION: [&str; 3] = ["shape", "dtype", "device"];
static EMPTY: Signature<3> = Signature::new("empty", CREATION, 3, 1);
static ZEROS: Signature<3> = Signature::new("zeros", CREATION, 3, 1);
static ONES: Signature<3> = Signature::new("ones", CREATION, 3, 1);
static FULL: Signature<4> = Signature::new("full", ["shape", "fill_value", "dtype", "device"], 4, 2);

/// A constructor's result as a Python object.
fn created(py: Python<'_>, t: PyResult<PyTensor>) -> PyResult<Bound<'_, PyAny>> {
    Ok(Bound::new(py, t?)?.into_any())
}

/// Runs `make` (`empty`, `zeros`, `ones`) on its parsed `(shape, dtype, device)`.
/// Inlined into each caller, so that `make` is a direct call and the
/// arguments stay in registers (a helper returning them as a tuple cost 30
/// ns a call in store-forwarding stalls).
#[inline(always)]
fn create<'py>(
    py: Python<'py>,
    [shape, dtype, device]: &fastcall::Args<'_, 'py, 3>,
    make: fn(Python<'py>, ShapeArg, Option<DTypeArg>, Option<DeviceArg>) -> PyResult<PyTensor>,
) -> PyResult<Bound<'py, PyAny>> {
    let shape = extract(required(shape)?)?;
    created(py, make(py, shape, extract_optional(dtype)?, extract_optional(device)?))
}

fast_function!(empty_fastcall, EMPTY, |py, args| create(py, &args, empty));
fast_function!(zeros_fastcall, ZEROS, |py, args| create(py, &args, zeros));
fast_function!(ones_fastcall, ONES, |py, args| create(py, &args, ones));
fast_function!(full_fastcall, FULL, |py, [shape, fill_value, dtype, device]| {
    let shape = extract(required(&shape)?)?;
    let (dtype, device) = (extract_optional(&dtype)?, extract_optional(&device)?);
    created(py, full(py, shape, required(&fill_value)?, dtype, device))
});

static CONSTRUCTORS: [MethodDef; 4] = [
    MethodDef::fast(
        c"empty",
        empty_fastcall,
        c"empty(shape, dtype=None, device=None)
--

A new tensor of `shape`, uninitialised; dtype float32 and device \"cpu\" by default.",
    ),
    MethodDef::fast(
        c"zeros",
        zeros_fastcall,
        c"zeros(shape, dtype=None, device=None)
--

A new tensor of `shape` filled with zeros; dtype float32 and device \"cpu\" by default.",
    ),
    MethodDef::fast(
        c"ones",
        ones_fastcall,
        c"ones(shape, dtype=None, device=None)
--

A new tensor of `shape` filled with ones; dtype float32 and device \"cpu\" by default.",
    ),
    MethodDef::fast(
        c"full",
        full_fastcall,
        c"full(shape, fill_value, dtype=None, device=None)
--

A new tensor of `shape` filled with `fill_value`; the dtype defaults to bool,
int64, float32 or complex64 after the value, as in torch; device \"cpu\".",
    ),
];

/// `from_dlpack(x, *, device=None, copy=None)`.
#[pyfunction]
#[pyo3(signature = (x, *, device = None, copy = None))]
fn from_dlpack(x: &Bound<'_, PyAny>, device: Option<DeviceArg>, copy: Option<bool>) -> PyResult<PyTensor> {
    let device = device.map(|d| d.resolve_py(x.py())).transpose()?;
    consumer::from_dlpack(x, device, copy).map(PyTensor::from)
}

/// Exported DLPack tensors whose deleter has not run yet (for leak tests).
#[pyfunction]
fn _live_exports() -> usize {
    crate::dlpack::live_exports()
}

/// Runs the deleters of imported tensors that wait for device work (after
/// waiting for it); the number run. Registered with `atexit`, so none is left
/// uncalled at exit; also for tests.
#[pyfunction]
fn _drain_deleters(py: Python<'_>) -> usize {
    // Without the GIL: it may wait for the device, and a Python producer's
    // deleter takes the GIL itself.
    py.detach(crate::dlpack::drain_deleters)
}

/// Live CPU allocations made by devtensor (for leak tests).
#[pyfunction]
fn _live_cpu_allocations() -> usize {
    use crate::alloc::NDAlloc;
    crate::alloc::CpuAlloc.stats().live_allocations
}

/// The CPU copy pool's counts since the process started, as a dict
/// (`devtensor::copy::pool_stats`; for benchmarks).
#[pyfunction]
fn _pool_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let d = pyo3::types::PyDict::new(py);
    for (k, v) in crate::copy::pool_stats() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// `memory_stats(device="cpu")`: the pool's figures as a dict.
#[pyfunction]
#[pyo3(signature = (device = None))]
fn memory_stats<'py>(py: Python<'py>, device: Option<DeviceArg>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
    let device = device.unwrap_or_default().resolve_py(py)?;
    let s = crate::backend::memory_stats(device).map_err(to_py)?;
    let d = pyo3::types::PyDict::new(py);
    for (k, v) in [
        ("allocated_bytes", s.allocated),
        ("reserved_bytes", s.reserved),
        ("peak_allocated_bytes", s.peak_allocated),
        ("peak_reserved_bytes", s.peak_reserved),
        ("active_blocks", s.active_blocks),
        ("segments", s.segments),
        ("alloc_count", s.alloc_count),
        ("segment_allocs", s.segment_allocs),
        ("oom_count", s.oom_count),
    ] {
        d.set_item(k, v)?;
    }
    Ok(d)
}

/// `empty_cache(device="cpu")`: returns cached free memory to the device; the bytes released
/// (on the CPU, the freed blocks of 8 MiB and more kept for reuse).
#[pyfunction]
#[pyo3(signature = (device = None))]
fn empty_cache(py: Python<'_>, device: Option<DeviceArg>) -> PyResult<usize> {
    let device = device.unwrap_or_default();
    if device.is_cpu() {
        return crate::backend::empty_cache(crate::Device::Cpu).map_err(to_py);
    }
    // Frees device memory: the driver synchronises, the pool waits for events.
    py.detach(|| crate::backend::empty_cache(device.resolve()?))
        .map_err(to_py)
}

/// `_rebuild(data, shape, dtype, device)`: a tensor from its pickle (see
/// `Tensor.__reduce__`): the bytes in C order, on the device it was on.
#[pyfunction]
fn _rebuild(py: Python<'_>, data: &[u8], shape: ShapeArg, dtype: DTypeArg, device: DeviceArg) -> PyResult<PyTensor> {
    let t = Tensor::from_bytes(data, &shape.0, dtype.0).map_err(to_py)?;
    let device = device.resolve_py(py)?;
    if device == crate::Device::Cpu {
        return Ok(PyTensor::from(t));
    }
    py.detach(|| t.to(device)).map(PyTensor::from).map_err(to_py)
}

#[pymodule]
fn _devtensor(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add(
        "DLPACK_VERSION",
        (
            crate::dlpack::ffi::DLPACK_MAJOR_VERSION,
            crate::dlpack::ffi::DLPACK_MINOR_VERSION,
        ),
    )?;
    m.add("AxisError", errors::axis_error(m.py())?)?;
    m.add_class::<PyTensor>()?;
    dlpack_method::install(&m.py().get_type::<PyTensor>())?;
    for def in &CONSTRUCTORS {
        def.add_to(m)?;
    }
    m.add_function(wrap_pyfunction!(from_dlpack, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(empty_cache, m)?)?;
    m.add_function(wrap_pyfunction!(_live_exports, m)?)?;
    m.add_function(wrap_pyfunction!(_live_cpu_allocations, m)?)?;
    m.add_function(wrap_pyfunction!(_pool_stats, m)?)?;
    m.add_function(wrap_pyfunction!(_drain_deleters, m)?)?;
    m.add_function(wrap_pyfunction!(_rebuild, m)?)?;
    kernel_api::register(m)?;
    #[cfg(feature = "cuda")]
    streams::register(m)?;
    let atexit = m.py().import("atexit")?;
    atexit.call_method1("register", (m.getattr("_drain_deleters")?,))?;
    Ok(())
}
