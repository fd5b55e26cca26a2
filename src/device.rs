//! Where memory lives, and how that maps to DLPack devices.

use std::fmt;
use std::str::FromStr;

use crate::dlpack::ffi::{self, DLDevice};
use crate::error::{DLPackError, Error, Result};

/// A family of devices with its own driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Host memory, always present.
    Cpu,
    /// NVIDIA CUDA (driver API, loaded at run time).
    Cuda,
    /// AMD ROCm / HIP.
    Rocm,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Cpu => "CPU",
            Backend::Cuda => "CUDA",
            Backend::Rocm => "ROCm",
        })
    }
}

/// A memory kind on a device: what a tensor's bytes are and who can touch them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Pageable host memory (`kDLCPU`).
    #[default]
    Cpu,
    /// CUDA device memory of GPU `ordinal` (`kDLCUDA`).
    Cuda(u32),
    /// Pinned, portable CUDA host memory (`kDLCUDAHost`).
    CudaHost,
    /// CUDA managed memory, attached to GPU `ordinal` (`kDLCUDAManaged`).
    CudaManaged(u32),
    /// ROCm device memory of GPU `ordinal` (`kDLROCM`).
    Rocm(u32),
    /// Pinned ROCm host memory (`kDLROCMHost`).
    RocmHost,
}

impl Device {
    /// The backend that owns this memory kind.
    pub const fn backend(self) -> Backend {
        match self {
            Device::Cpu => Backend::Cpu,
            Device::Cuda(_) | Device::CudaHost | Device::CudaManaged(_) => Backend::Cuda,
            Device::Rocm(_) | Device::RocmHost => Backend::Rocm,
        }
    }

    /// The GPU this memory belongs to (managed memory: the GPU it is attached
    /// to); `None` for host memory, pinned included, which belongs to none.
    pub const fn ordinal(self) -> Option<u32> {
        match self {
            Device::Cuda(i) | Device::CudaManaged(i) | Device::Rocm(i) => Some(i),
            Device::Cpu | Device::CudaHost | Device::RocmHost => None,
        }
    }

    /// True when the host may read and write the bytes directly
    /// (CPU, pinned host and managed memory).
    pub const fn is_host_accessible(self) -> bool {
        matches!(
            self,
            Device::Cpu | Device::CudaHost | Device::CudaManaged(_) | Device::RocmHost
        )
    }

    /// The DLPack device. Pinned memory reports id 0, as the header says.
    pub const fn to_dlpack(self) -> DLDevice {
        let (device_type, device_id) = match self {
            Device::Cpu => (ffi::kDLCPU, 0),
            Device::Cuda(i) => (ffi::kDLCUDA, i as i32),
            Device::CudaHost => (ffi::kDLCUDAHost, 0),
            Device::CudaManaged(i) => (ffi::kDLCUDAManaged, i as i32),
            Device::Rocm(i) => (ffi::kDLROCM, i as i32),
            Device::RocmHost => (ffi::kDLROCMHost, 0),
        };
        DLDevice { device_type, device_id }
    }

    /// Reads a DLPack device; unknown types and negative ids are errors.
    pub fn from_dlpack(d: DLDevice) -> Result<Device, DLPackError> {
        let id = u32::try_from(d.device_id).map_err(|_| DLPackError::BadDeviceId(d.device_id))?;
        Ok(match d.device_type {
            ffi::kDLCPU => Device::Cpu,
            ffi::kDLCUDA => Device::Cuda(id),
            ffi::kDLCUDAHost => Device::CudaHost,
            ffi::kDLCUDAManaged => Device::CudaManaged(id),
            ffi::kDLROCM => Device::Rocm(id),
            ffi::kDLROCMHost => Device::RocmHost,
            other => return Err(DLPackError::UnsupportedDevice(other)),
        })
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(i) => write!(f, "cuda:{i}"),
            Device::CudaHost => f.write_str("cuda_host"),
            Device::CudaManaged(i) => write!(f, "cuda_managed:{i}"),
            Device::Rocm(i) => write!(f, "rocm:{i}"),
            Device::RocmHost => f.write_str("rocm_host"),
        }
    }
}

/// A device as a user names it: `"cuda"`, `"cuda_managed"` and `"rocm"` name
/// no GPU, and mean the GPU current on the calling thread at the time of use
/// (as `torch.device("cuda")` and CuPy do), so parsing stays pure and
/// [`DeviceSpec::resolve`] asks the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// A device with its ordinal (or one that has none: `cpu`, pinned host).
    Exact(Device),
    /// The given memory kind (`Cuda`, `CudaManaged` or `Rocm`, its ordinal
    /// ignored) on the calling thread's current device.
    Current(Device),
}

impl DeviceSpec {
    /// The device: a [`DeviceSpec::Current`] kind takes the ordinal of the GPU
    /// current on the calling thread (CUDA: the current context's device;
    /// ROCm: `hipGetDevice`), 0 when none is current.
    pub fn resolve(self) -> Result<Device> {
        Ok(match self {
            DeviceSpec::Exact(d) => d,
            DeviceSpec::Current(kind) => {
                let i = crate::backend::current_ordinal(kind.backend())?;
                match kind {
                    Device::Cuda(_) => Device::Cuda(i),
                    Device::CudaManaged(_) => Device::CudaManaged(i),
                    Device::Rocm(_) => Device::Rocm(i),
                    other => other,
                }
            }
        })
    }
}

impl Default for DeviceSpec {
    /// The CPU.
    fn default() -> DeviceSpec {
        DeviceSpec::Exact(Device::Cpu)
    }
}

impl From<Device> for DeviceSpec {
    fn from(d: Device) -> DeviceSpec {
        DeviceSpec::Exact(d)
    }
}

impl FromStr for DeviceSpec {
    type Err = Error;
    /// Parses `cpu` (or `cpu:0`), `cuda[:N]`, `cuda_host`, `cuda_managed[:N]`, `rocm[:N]`,
    /// `rocm_host` (`hip` is accepted for `rocm`); no backend is asked.
    fn from_str(s: &str) -> Result<DeviceSpec> {
        let bad = || Error::UnknownDevice(s.to_owned());
        let (kind, id) = match s.split_once(':') {
            // An index DLPack's int32 device_id can carry.
            Some((k, n)) => (
                k,
                Some(
                    n.parse::<u32>()
                        .ok()
                        .filter(|&i| i <= i32::MAX as u32)
                        .ok_or_else(bad)?,
                ),
            ),
            None => (s, None),
        };
        let ordinal = id.unwrap_or(0);
        let device = match (kind, id) {
            // `cpu:0` as torch writes `torch.device("cpu", 0)`; no other index.
            ("cpu", None | Some(0)) => Device::Cpu,
            ("cuda", _) => Device::Cuda(ordinal),
            ("cuda_host", None) => Device::CudaHost,
            ("cuda_managed", _) => Device::CudaManaged(ordinal),
            ("rocm" | "hip", _) => Device::Rocm(ordinal),
            ("rocm_host", None) => Device::RocmHost,
            _ => return Err(bad()),
        };
        let indexable = matches!(device, Device::Cuda(_) | Device::CudaManaged(_) | Device::Rocm(_));
        Ok(if indexable && id.is_none() {
            DeviceSpec::Current(device)
        } else {
            DeviceSpec::Exact(device)
        })
    }
}

impl FromStr for Device {
    type Err = Error;
    /// Parses a [`DeviceSpec`] and resolves it at once: `cuda` is `cuda:N` of
    /// the GPU current on the calling thread (0 when none is), as in torch.
    fn from_str(s: &str) -> Result<Device> {
        s.parse::<DeviceSpec>()?.resolve()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_dlpack_round_trip() {
        let all = [
            Device::Cpu,
            Device::Cuda(3),
            Device::CudaHost,
            Device::CudaManaged(1),
            Device::Rocm(2),
            Device::RocmHost,
        ];
        for d in all {
            assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
            assert_eq!(Device::from_dlpack(d.to_dlpack()).unwrap(), d);
        }
        assert_eq!(
            "cuda".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Current(Device::Cuda(0))
        );
        assert_eq!(
            "rocm".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Current(Device::Rocm(0))
        );
        assert_eq!(
            "cuda:0".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Exact(Device::Cuda(0))
        );
        assert_eq!("cpu:0".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!(
            "cuda_host".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::Exact(Device::CudaHost)
        );
        assert_eq!(
            Device::CudaHost.to_dlpack(),
            DLDevice {
                device_type: 3,
                device_id: 0
            }
        );
    }

    #[test]
    fn bad_devices_are_errors() {
        for s in [
            "gpu",
            "cuda:x",
            "cpu:1",
            "cuda:-1",
            "",
            "cuda:2147483648",
            "rocm:4294967295",
        ] {
            assert!(matches!(s.parse::<Device>(), Err(Error::UnknownDevice(_))), "{s}");
        }
        let vulkan = DLDevice {
            device_type: ffi::kDLVulkan,
            device_id: 0,
        };
        assert_eq!(Device::from_dlpack(vulkan), Err(DLPackError::UnsupportedDevice(7)));
        let neg = DLDevice {
            device_type: ffi::kDLCUDA,
            device_id: -1,
        };
        assert_eq!(Device::from_dlpack(neg), Err(DLPackError::BadDeviceId(-1)));
    }
}
