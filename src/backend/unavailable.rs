//! A backend this build lacks: every entry point says why, and how to get it.

use std::sync::{Arc, OnceLock};

use super::{BackendStatus, DeviceBackend};
use crate::alloc::NDAlloc;
use crate::device::Backend;
use crate::device::Device;
use crate::error::Result;

/// A backend not built in (its cargo feature off).
#[derive(Debug)]
pub(super) struct NotBuilt(Backend);

/// The stand-in for `backend`, which this build lacks.
#[allow(dead_code)] // with every backend built in, nothing is missing
pub(super) fn not_built(backend: Backend) -> &'static dyn DeviceBackend {
    match backend {
        Backend::Cuda => &NotBuilt(Backend::Cuda),
        _ => &NotBuilt(Backend::Rocm),
    }
}

/// The probe's answer for a backend this build lacks.
#[allow(dead_code)] // with every backend built in, nothing is missing
pub(super) fn not_built_status(backend: Backend) -> BackendStatus {
    let fix = match backend {
        Backend::Rocm => {
            "built without the `rocm` feature: install HIP (libamdhip64) and rebuild with `--features rocm`"
        }
        _ => "built without the `cuda` feature: rebuild with `--features cuda` (on by default)",
    };
    BackendStatus {
        backend,
        versions: Vec::new(),
        devices: Vec::new(),
        unavailable: Some(fix.to_owned()),
    }
}

impl DeviceBackend for NotBuilt {
    fn kind(&self) -> Backend {
        self.0
    }

    fn status(&self) -> &'static BackendStatus {
        static CUDA: OnceLock<BackendStatus> = OnceLock::new();
        static ROCM: OnceLock<BackendStatus> = OnceLock::new();
        let cell = if self.0 == Backend::Cuda { &CUDA } else { &ROCM };
        cell.get_or_init(|| not_built_status(self.0))
    }

    fn current_ordinal(&self) -> Result<u32> {
        Ok(0)
    }

    fn allocator(&self, _: Device) -> Result<Arc<dyn NDAlloc>> {
        Err(self.unavailable())
    }
}
