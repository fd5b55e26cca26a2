//! Modules and functions (group__CUDA__MODULE:
//! <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MODULE.html>).
//!
//! `cuModuleLoadData` takes a cubin (an ELF image; its length comes from the
//! ELF header, [`crate::cubin::image_len`]) or PTX text (JIT-compiled by the
//! driver; here: parsed). A cubin carries no PTX: the PTX is the one the
//! NVRTC shim recorded under the cubin's hash ([`crate::nvrtc::ptx_for_cubin`]);
//! the register count, parameter layout and static shared size come from the
//! cubin itself ([`crate::cubin::parse`]).

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

use super::context;
use super::device::ARCH;
use super::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_PTX, CUDA_ERROR_NO_BINARY_FOR_GPU,
    CUDA_ERROR_NOT_FOUND, CUresult, Handle, Registry, Result, api, err, null_arg, out,
};
use crate::ptx;

/// A loaded module.
pub struct Module {
    pub device: u32,
    pub ptx: Arc<ptx::Module>,
    /// Where it came from ("cubin sm_90 (hash …)" / "PTX text").
    pub origin: String,
    /// What the cubin says of the kernels (None for PTX text).
    pub cubin: Option<crate::cubin::CubinInfo>,
    /// Function handles already handed out, by name.
    functions: std::sync::Mutex<HashMap<String, Handle>>,
    unloaded: AtomicBool,
}

// SAFETY: the handles in `functions` are opaque integers.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

/// A kernel of a module.
pub struct Function {
    pub module: Arc<Module>,
    /// Index of the kernel in `module.ptx.kernels`.
    pub index: usize,
    pub name: String,
    /// Registers per thread (cubin `EIATTR_REGCOUNT`; PTX text: unknown → 0).
    pub regs: u32,
    /// Static shared memory per block (cubin section size less the reserved part, or the PTX's).
    pub shared_bytes: u32,
    /// `__launch_bounds__` limit, if any.
    pub max_threads: Option<u32>,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
    pub max_dynamic_shared: AtomicI32,
    /// `CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`.
    pub carveout: AtomicI32,
}

impl Function {
    pub fn kernel(&self) -> &ptx::Kernel {
        &self.module.ptx.kernels[self.index]
    }
}

pub(crate) static MODULES: Registry<Module> = Registry::new(0x3D);
pub(crate) static FUNCTIONS: Registry<Function> = Registry::new(0xF0);

/// The function behind a handle (`CUDA_ERROR_INVALID_HANDLE` for unknown ones
/// and those of unloaded modules).
pub fn function(h: Handle) -> Result<Arc<Function>> {
    match FUNCTIONS.get(h) {
        Some(f) if !f.module.unloaded.load(Ordering::Acquire) => Ok(f),
        Some(f) => err(
            CUDA_ERROR_INVALID_HANDLE,
            format!("function `{}` belongs to an unloaded module", f.name),
        ),
        None => err(CUDA_ERROR_INVALID_HANDLE, format!("{h:p} is not a function handle")),
    }
}

/// Whether an image is PTX text (what `cuModuleLoadData` JIT-compiles).
fn is_ptx_text(head: &[u8]) -> bool {
    let t = head
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .map_or(&[][..], |i| &head[i..]);
    t.starts_with(b"//") || t.starts_with(b".version") || t.starts_with(b".target")
}

struct Facts {
    ptx: String,
    origin: String,
    cubin: Option<crate::cubin::CubinInfo>,
}

/// Reads the image at `image`: a cubin (ELF) or PTX text.
///
/// # Safety
///
/// `image` must point to a complete cubin or a NUL-terminated PTX string.
unsafe fn read_image(image: *const c_void) -> Result<Facts> {
    let p = image.cast::<u8>();
    // SAFETY: every image has at least 4 readable bytes (ELF magic, or text + NUL;
    // shorter text is NUL-terminated before them, and we stop at the NUL below).
    let magic = unsafe { std::slice::from_raw_parts(p, 4) };
    if magic == b"\x7fELF" {
        // SAFETY: an ELF image starts with its full header.
        let Some(len) = (unsafe { crate::cubin::image_len(p) }) else {
            return err(CUDA_ERROR_INVALID_IMAGE, "the ELF header is not that of a 64-bit cubin");
        };
        // SAFETY: the header says the image is `len` bytes long.
        let bytes = unsafe { std::slice::from_raw_parts(p, len) };
        let info = match crate::cubin::parse(bytes) {
            Ok(i) => i,
            Err(e) => {
                return err(
                    CUDA_ERROR_INVALID_IMAGE,
                    format!("not a cubin this driver can read: {e}"),
                );
            }
        };
        if info.arch != ARCH {
            return err(
                CUDA_ERROR_NO_BINARY_FOR_GPU,
                format!("the cubin is for sm_{} and the device is sm_{ARCH}", info.arch),
            );
        }
        let hash = crate::nvrtc::cubin_hash(bytes);
        let Some(ptx) = crate::nvrtc::ptx_for_cubin(bytes) else {
            return err(
                CUDA_ERROR_INVALID_IMAGE,
                format!(
                    "no PTX recorded for this sm_{} cubin (hash {hash}, {len} bytes): the emulator runs the PTX that its NVRTC \
                     shim records when it compiles a cubin; compile through the shim (libnvrtc from devtensor-emu) or \
                     point DEVTENSOR_EMU_PTX_CACHE at the directory holding {hash}.ptx",
                    info.arch
                ),
            );
        };
        return Ok(Facts {
            ptx,
            origin: format!("cubin sm_{} (hash {hash})", info.arch),
            cubin: Some(info),
        });
    }
    // SAFETY: not ELF: a NUL-terminated string per the contract.
    let text = unsafe { CStr::from_ptr(p.cast::<c_char>()) };
    if !is_ptx_text(text.to_bytes()) {
        return err(
            CUDA_ERROR_INVALID_IMAGE,
            "the image is neither a cubin (ELF) nor PTX text (starting with `//`, `.version` or `.target`); fatbins are not emulated",
        );
    }
    let ptx = match text.to_str() {
        Ok(s) => s.to_owned(),
        Err(e) => return err(CUDA_ERROR_INVALID_PTX, format!("PTX text is not UTF-8: {e}")),
    };
    Ok(Facts {
        ptx,
        origin: "PTX text".to_owned(),
        cubin: None,
    })
}

fn load(call: &'static str, pmod: *mut Handle, image: *const c_void) -> Result<()> {
    if pmod.is_null() {
        return null_arg("module");
    }
    if image.is_null() {
        return null_arg("image");
    }
    let ctx = context::current_ok()?;
    // SAFETY: the caller passes a valid image.
    let facts = unsafe { read_image(image) }?;
    let parsed = match ptx::parse(&facts.ptx) {
        Ok(m) => m,
        Err(e) => {
            return err(
                CUDA_ERROR_INVALID_PTX,
                format!("{call}: {} does not parse: {e}", facts.origin),
            );
        }
    };
    let module = Arc::new(Module {
        device: ctx.device,
        ptx: Arc::new(parsed),
        origin: facts.origin,
        cubin: facts.cubin,
        functions: std::sync::Mutex::new(HashMap::new()),
        unloaded: AtomicBool::new(false),
    });
    if let Some(info) = &module.cubin {
        // The cubin and the PTX must describe the same kernels.
        for k in &info.kernels {
            let Some(pk) = module.ptx.kernels.iter().find(|p| p.name == k.name) else {
                return err(
                    CUDA_ERROR_INVALID_IMAGE,
                    format!(
                        "{call}: kernel `{}` of the cubin is missing from its recorded PTX",
                        k.name
                    ),
                );
            };
            let layout = |o: usize, z: usize| format!("offset {o}, {z} bytes");
            for (i, cp) in k.params.iter().enumerate() {
                let ok = pk
                    .params
                    .get(i)
                    .is_some_and(|pp| pp.offset == cp.offset as usize && pp.size == cp.size as usize);
                if !ok {
                    return err(
                        CUDA_ERROR_INVALID_IMAGE,
                        format!(
                            "{call}: kernel `{}` parameter {i}: the cubin says {}, its recorded PTX {}",
                            k.name,
                            layout(cp.offset as usize, cp.size as usize),
                            pk.params
                                .get(i)
                                .map_or("nothing".to_owned(), |pp| layout(pp.offset, pp.size))
                        ),
                    );
                }
            }
        }
    }
    let h = MODULES.insert(module);
    // SAFETY: checked non-null; valid per the caller's contract.
    unsafe { out(pmod, "module", h) }
}

/// `cuModuleLoadData`: "Takes a pointer image and loads the corresponding
/// module module into the current context. The image may be a cubin or
/// fatbin as output by nvcc, or a NULL-terminated PTX, either as output by
/// nvcc or hand-written." A cubin for another architecture:
/// `CUDA_ERROR_NO_BINARY_FOR_GPU`; PTX that does not parse: `CUDA_ERROR_INVALID_PTX`.
///
/// # Safety
///
/// `pmod` must be NULL or valid for writes; `image` NULL or a valid image.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(pmod: *mut Handle, image: *const c_void) -> CUresult {
    api("cuModuleLoadData", || load("cuModuleLoadData", pmod, image))
}

/// `cuModuleLoadDataEx`: as cuModuleLoadData; JIT options are accepted and ignored.
///
/// # Safety
///
/// As [`cuModuleLoadData`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pmod: *mut Handle,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_void,
    _option_values: *mut *mut c_void,
) -> CUresult {
    api("cuModuleLoadDataEx", || load("cuModuleLoadDataEx", pmod, image))
}

/// `cuModuleGetFunction`: "Returns in *hfunc the handle of the function of
/// name name located in module hmod. If no function of that name exists,
/// cuModuleGetFunction() returns CUDA_ERROR_NOT_FOUND."
///
/// # Safety
///
/// `hfunc` must be NULL or valid for writes; `name` NULL or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(hfunc: *mut Handle, hmod: Handle, name: *const c_char) -> CUresult {
    api("cuModuleGetFunction", || {
        if hfunc.is_null() {
            return null_arg("hfunc");
        }
        if name.is_null() {
            return null_arg("name");
        }
        let Some(m) = MODULES.get(hmod) else {
            return err(CUDA_ERROR_INVALID_HANDLE, format!("{hmod:p} is not a loaded module"));
        };
        // SAFETY: non-null, NUL-terminated per the contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        if let Some(&h) = m.functions.lock().unwrap_or_else(|p| p.into_inner()).get(&name) {
            // SAFETY: checked non-null above.
            return unsafe { out(hfunc, "hfunc", h) };
        }
        let Some(index) = m.ptx.kernels.iter().position(|k| k.name == name) else {
            return err(
                CUDA_ERROR_NOT_FOUND,
                format!("no kernel `{name}` in the module ({})", m.origin),
            );
        };
        let k = &m.ptx.kernels[index];
        let ck = m.cubin.as_ref().and_then(|c| c.kernel(&name)).cloned();
        let f = Arc::new(Function {
            module: m.clone(),
            index,
            name: name.clone(),
            regs: ck.as_ref().and_then(|c| c.regcount).unwrap_or(0),
            shared_bytes: ck.as_ref().map_or(k.shared_bytes as u32, |c| c.shared_bytes),
            max_threads: ck.as_ref().and_then(|c| c.max_threads_per_block()),
            max_dynamic_shared: AtomicI32::new(super::device::SHARED_PER_BLOCK as i32 - k.shared_bytes as i32),
            carveout: AtomicI32::new(-1),
        });
        let h = FUNCTIONS.insert(f);
        m.functions.lock().unwrap_or_else(|p| p.into_inner()).insert(name, h);
        // SAFETY: checked non-null above.
        unsafe { out(hfunc, "hfunc", h) }
    })
}

/// `cuModuleUnload`: later use of its functions: `CUDA_ERROR_INVALID_HANDLE`.
/// Launches already enqueued keep the module alive until they ran.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(hmod: Handle) -> CUresult {
    api("cuModuleUnload", || {
        let Some(m) = MODULES.remove(hmod) else {
            return err(CUDA_ERROR_INVALID_HANDLE, format!("{hmod:p} is not a loaded module"));
        };
        m.unloaded.store(true, Ordering::Release);
        for (_, h) in m.functions.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            FUNCTIONS.remove(h);
        }
        Ok(())
    })
}
