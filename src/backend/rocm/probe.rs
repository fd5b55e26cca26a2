//! Finds the HIP runtime's devices without panicking or hanging: on a machine
//! without an AMD GPU `hipGetDeviceCount` answers `hipErrorNoDevice` at once.

use std::ffi::{c_char, c_int};

use super::context::error_name;
use super::ffi;
use crate::backend::{BackendStatus, DeviceInfo};
use crate::device::Backend;

/// Probes the runtime, hiprtc and every device.
pub(crate) fn probe() -> BackendStatus {
    let mut status = BackendStatus {
        backend: Backend::Rocm,
        versions: Vec::new(),
        devices: Vec::new(),
        unavailable: None,
    };
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer; the call needs no device.
    if unsafe { ffi::hipRuntimeGetVersion(&mut v) } == ffi::SUCCESS {
        status.versions.push(("HIP runtime", hip_version(v)));
    }
    // SAFETY: as above.
    if unsafe { ffi::hipDriverGetVersion(&mut v) } == ffi::SUCCESS {
        status.versions.push(("HIP driver", hip_version(v)));
    }
    match super::hiprtc::version() {
        Ok(((major, minor), path)) => status.versions.push(("hiprtc", format!("{major}.{minor} ({path})"))),
        Err(e) => status.versions.push(("hiprtc", format!("not found: {e}"))),
    }
    if let Err(reason) = probe_devices(&mut status) {
        status.unavailable = Some(reason);
    }
    status
}

/// `50221153` → `5.2.21153` (HIP encodes major * 10^7 + minor * 10^5 + patch).
fn hip_version(v: c_int) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

fn probe_devices(status: &mut BackendStatus) -> Result<(), String> {
    let mut count: c_int = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { ffi::hipGetDeviceCount(&mut count) };
    match rc {
        ffi::SUCCESS if count > 0 => {}
        ffi::SUCCESS | ffi::ERROR_NO_DEVICE => {
            return Err(
                "the HIP runtime reports no AMD GPU: no /dev/kfd, or HIP_VISIBLE_DEVICES hides them".to_owned(),
            );
        }
        ffi::ERROR_INSUFFICIENT_DRIVER => {
            return Err("the amdgpu kernel driver is missing or too old for this HIP runtime".to_owned());
        }
        rc => return Err(format!("hipGetDeviceCount failed: {}", error_name(rc))),
    }
    for ordinal in 0..count {
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds 256 bytes, as passed.
        unsafe { ffi::hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, ordinal) };
        let mut total_memory = 0usize;
        // SAFETY: valid out-pointer and ordinal.
        unsafe { ffi::hipDeviceTotalMem(&mut total_memory, ordinal) };
        status.devices.push(DeviceInfo {
            ordinal: ordinal as u32,
            name: c_string(&name),
            arch: gcn_arch(ordinal).unwrap_or_else(|| "gfx-unknown".to_owned()),
            total_memory,
        });
    }
    Ok(())
}

/// The device's full target id (`gfx90a:sramecc+:xnack-`), read from the
/// HIP 5 properties layout. The buffer is over-allocated so that a runtime
/// whose structure grew cannot write past it.
fn gcn_arch(ordinal: c_int) -> Option<String> {
    #[repr(C)]
    struct Padded {
        prop: ffi::DeviceProp,
        _slack: [u8; 4096],
    }
    let mut p = Box::new(std::mem::MaybeUninit::<Padded>::zeroed());
    // SAFETY: the buffer is larger than any hipDeviceProp_t layout and zeroed.
    let rc = unsafe { ffi::hipGetDeviceProperties(p.as_mut_ptr().cast(), ordinal) };
    if rc != ffi::SUCCESS {
        return None;
    }
    // SAFETY: zero-initialised plain data, filled by the runtime.
    let p = unsafe { p.assume_init() };
    let arch = c_string(&p.prop.gcnArchName);
    arch.starts_with("gfx").then_some(arch)
}

fn c_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hip_versions_decode() {
        assert_eq!(hip_version(50_221_153), "5.2.21153");
        assert_eq!(hip_version(60_342_134), "6.3.42134");
    }
}
