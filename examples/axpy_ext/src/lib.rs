//! `axpy_ext.axpy(a, x, y) -> a * x + y`: a kernel library on devtensor's
//! Rust/PyO3 API. Tensors come from any DLPack producer ([`TensorArg`]); on a
//! CUDA device an NVRTC-compiled kernel runs on the caller's current stream,
//! on the host a Rust loop; the result goes back as a `devtensor.Tensor`, or
//! as the caller's own tensor type (`to_caller=True`).

use std::collections::HashMap;
use std::sync::Mutex;

use devtensor::python::{TensorArg, TensorOut, order_streams, to_py_err};
use devtensor::{DType, Device, Tensor};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// `axpy(a, x, y, *, caller_alloc=False, to_caller=False)`: `a * x + y` for
/// float32 or float64 tensors of one shape on one device. `caller_alloc`: the
/// output comes from the caller's allocator (torch's for torch tensors);
/// otherwise from the one `devtensor.env_alloc(...)` selected, else
/// devtensor's. `to_caller`: return the caller's tensor type.
#[pyfunction]
#[pyo3(signature = (a, x, y, *, caller_alloc = false, to_caller = false))]
fn axpy(
    py: Python<'_>,
    a: f64,
    x: TensorArg,
    y: TensorArg,
    caller_alloc: bool,
    to_caller: bool,
) -> PyResult<TensorOut> {
    let (xt, yt) = (x.tensor(), y.tensor());
    if xt.shape() != yt.shape() {
        return Err(PyValueError::new_err(format!(
            "x and y differ in shape: {:?} and {:?}",
            xt.shape(),
            yt.shape()
        )));
    }
    if xt.dtype() != yt.dtype() || !matches!(xt.dtype(), DType::F32 | DType::F64) {
        return Err(PyTypeError::new_err(format!(
            "x and y must both be float32 or float64, got {} and {}",
            xt.dtype(),
            yt.dtype()
        )));
    }
    if xt.device() != yt.device() {
        return Err(PyValueError::new_err(format!(
            "x is on {}, y on {}",
            xt.device(),
            yt.device()
        )));
    }
    let (shape, dtype, device) = (xt.shape().to_vec(), xt.dtype(), xt.device());
    let out = if caller_alloc {
        x.empty_from_caller(&shape, dtype)?
    } else {
        x.empty(py, &shape, dtype)?
    };
    match device {
        Device::Cuda(ordinal) => {
            // The kernel runs on x's stream: y's producer work goes before it.
            let stream = x.stream().unwrap_or(devtensor::StreamHandle::CUDA_LEGACY);
            if let Some(ys) = y.stream() {
                order_streams(device, ys, stream).map_err(to_py_err)?;
            }
            let (xs, ys) = (xt.clone(), yt.clone());
            let o = out.clone();
            py.detach(move || cuda::axpy(ordinal, a, &xs, &ys, &o, stream))
                .map_err(to_py_err)?;
        }
        Device::Cpu => cpu_axpy(a, xt, yt, &out).map_err(to_py_err)?,
        other => {
            return Err(PyValueError::new_err(format!(
                "axpy runs on the CPU and CUDA devices, not {other}"
            )));
        }
    }
    Ok(if to_caller {
        x.output_to_caller(out)
    } else {
        x.output(out)
    })
}

/// The host path: any layouts, through contiguous copies where needed.
fn cpu_axpy(a: f64, x: &Tensor, y: &Tensor, out: &Tensor) -> devtensor::Result<()> {
    let (x, y) = (x.contiguous()?, y.contiguous()?);
    let n = x.numel();
    match x.dtype() {
        DType::F32 => {
            // SAFETY: x and y are contiguous host tensors of n float32 elements;
            // `out` is a fresh contiguous float32 tensor of n elements nothing
            // else references; no range overlaps `out`.
            let (xs, ys, os) = unsafe {
                (
                    std::slice::from_raw_parts(x.data_ptr().cast::<f32>(), n),
                    std::slice::from_raw_parts(y.data_ptr().cast::<f32>(), n),
                    std::slice::from_raw_parts_mut(out.data_ptr().cast::<f32>(), n),
                )
            };
            let a = a as f32;
            for ((o, &xv), &yv) in os.iter_mut().zip(xs).zip(ys) {
                *o = a * xv + yv;
            }
        }
        _ => {
            // SAFETY: as above, for float64.
            let (xs, ys, os) = unsafe {
                (
                    std::slice::from_raw_parts(x.data_ptr().cast::<f64>(), n),
                    std::slice::from_raw_parts(y.data_ptr().cast::<f64>(), n),
                    std::slice::from_raw_parts_mut(out.data_ptr().cast::<f64>(), n),
                )
            };
            for ((o, &xv), &yv) in os.iter_mut().zip(xs).zip(ys) {
                *o = a * xv + yv;
            }
        }
    }
    Ok(())
}

mod cuda {
    //! The CUDA path: the kernel compiled by NVRTC (devtensor's loader) for the
    //! GPU's arch once per process, launched with the driver API on the caller's stream.

    use super::*;
    use cudarc::driver::sys;
    use devtensor::backend::cuda::{context, nvrtc};
    use std::ffi::c_void;

    const SOURCE: &str = r#"
extern "C" __global__ void axpy_f32(float a, const float* x, const float* y, float* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
extern "C" __global__ void axpy_f64(double a, const double* x, const double* y, double* out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"#;

    /// (axpy_f32, axpy_f64) of each GPU, as addresses.
    static FUNCTIONS: Mutex<Option<HashMap<u32, (usize, usize)>>> = Mutex::new(None);

    fn check(call: &'static str, rc: sys::CUresult) -> devtensor::Result<()> {
        context::check(call, rc)
    }

    fn functions(ordinal: u32) -> devtensor::Result<(usize, usize)> {
        let mut cache = FUNCTIONS.lock().unwrap_or_else(|p| p.into_inner());
        let cache = cache.get_or_insert_with(HashMap::new);
        if let Some(&f) = cache.get(&ordinal) {
            return Ok(f);
        }
        let gpu = context::device(ordinal)?;
        let options = vec![format!("--gpu-architecture={}", gpu.arch()), "--std=c++17".to_owned()];
        let cubin = nvrtc::compile("axpy.cu", SOURCE, &options, nvrtc::Output::Cubin)?;
        let _current = gpu.bind()?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a complete cubin for this GPU's arch; the module stays loaded
        // for the life of the process.
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut module, cubin.as_ptr().cast())
        })?;
        let get = |name: &std::ffi::CStr| -> devtensor::Result<usize> {
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: `module` is loaded; `name` is a valid C string.
            check("cuModuleGetFunction", unsafe {
                sys::cuModuleGetFunction(&mut f, module, name.as_ptr())
            })?;
            Ok(f as usize)
        };
        let f = (get(c"axpy_f32")?, get(c"axpy_f64")?);
        cache.insert(ordinal, f);
        Ok(f)
    }

    pub(super) fn axpy(
        ordinal: u32,
        a: f64,
        x: &Tensor,
        y: &Tensor,
        out: &Tensor,
        stream: devtensor::StreamHandle,
    ) -> devtensor::Result<()> {
        if !(x.is_contiguous() && y.is_contiguous()) {
            return Err(devtensor::Error::InvalidLayout(
                "the CUDA axpy takes contiguous tensors: call .contiguous() first",
            ));
        }
        let n = x.numel();
        if n == 0 {
            return Ok(());
        }
        let (f32_fn, f64_fn) = functions(ordinal)?;
        let gpu = context::device(ordinal)?;
        let _current = gpu.bind()?;
        let (mut xp, mut yp, mut op) = (x.data_ptr() as u64, y.data_ptr() as u64, out.data_ptr() as u64);
        let mut len = n as i64;
        let (mut a32, mut a64) = (a as f32, a);
        let (f, a_arg): (usize, *mut c_void) = match x.dtype() {
            DType::F32 => (f32_fn, (&raw mut a32).cast()),
            _ => (f64_fn, (&raw mut a64).cast()),
        };
        let mut params: [*mut c_void; 5] = [
            a_arg,
            (&raw mut xp).cast(),
            (&raw mut yp).cast(),
            (&raw mut op).cast(),
            (&raw mut len).cast(),
        ];
        let blocks = u32::try_from(n.div_ceil(256)).map_err(|_| devtensor::Error::Overflow { what: "grid size" })?;
        // SAFETY: `f` is a kernel of the loaded module whose parameters match
        // `params` (scalar, three device pointers to n elements, n); the stream
        // is the caller's live stream of this GPU (1: the legacy stream).
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                f as sys::CUfunction,
                blocks,
                1,
                1,
                256,
                1,
                1,
                0,
                stream.as_raw() as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

/// Exported DLPack tensors of this module's copy of devtensor whose deleter
/// has not run (for leak tests).
#[pyfunction]
fn _live_exports() -> usize {
    devtensor::dlpack::live_exports()
}

/// Runs this module's copy of devtensor's waiting deleters (imported GPU
/// tensors whose device work was pending when they dropped); the number run.
#[pyfunction]
fn _drain_deleters(py: Python<'_>) -> usize {
    py.detach(devtensor::dlpack::drain_deleters)
}

#[pymodule]
fn axpy_ext(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(axpy, m)?)?;
    m.add_function(wrap_pyfunction!(_live_exports, m)?)?;
    m.add_function(wrap_pyfunction!(_drain_deleters, m)?)?;
    Ok(())
}
