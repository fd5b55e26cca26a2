//! One shared value per device: the backends' default allocators, pools and
//! loaded kernel modules.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use crate::device::Device;
use crate::error::Result;

/// A map from device to a value made on first use.
pub(crate) struct PerDevice<T>(OnceLock<Mutex<HashMap<Device, T>>>);

impl<T: Clone> PerDevice<T> {
    pub(crate) const fn new() -> Self {
        PerDevice(OnceLock::new())
    }

    /// The value of `device`, made by `make` (under the lock, so once) when absent.
    pub(crate) fn get_or_try_init(&self, device: Device, make: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut map = self
            .0
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(v) = map.get(&device) {
            return Ok(v.clone());
        }
        let v = make()?;
        map.insert(device, v.clone());
        Ok(v)
    }
}
