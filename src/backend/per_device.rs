//! One shared value per device: the backends' default allocators, pools and
//! loaded kernel modules.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::device::Device;
use crate::error::Result;

/// A map from device to a value made on first use.
pub(crate) struct PerDevice<T>(OnceLock<Mutex<HashMap<Device, Arc<Slot<T>>>>>);

/// One device's value, and the lock its maker holds (so it is made once).
struct Slot<T> {
    value: OnceLock<T>,
    making: Mutex<()>,
}

impl<T: Clone> PerDevice<T> {
    pub(crate) const fn new() -> Self {
        PerDevice(OnceLock::new())
    }

    /// The value of `device`, made by `make` when absent. Only callers for the
    /// same device wait while it is made (compiling a GPU's kernels takes
    /// seconds; other devices go on); a failed `make` leaves it absent.
    pub(crate) fn get_or_try_init(&self, device: Device, make: impl FnOnce() -> Result<T>) -> Result<T> {
        let slot = {
            let mut map = self
                .0
                .get_or_init(Default::default)
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let slot = map.entry(device).or_insert_with(|| {
                Arc::new(Slot {
                    value: OnceLock::new(),
                    making: Mutex::new(()),
                })
            });
            if let Some(v) = slot.value.get() {
                return Ok(v.clone());
            }
            Arc::clone(slot)
        };
        let _making = slot.making.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = slot.value.get() {
            return Ok(v.clone()); // made by the caller we waited for
        }
        let v = make()?;
        Ok(slot.value.get_or_init(|| v).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn made_once_per_device_and_retried_after_failure() {
        static MAP: PerDevice<u32> = PerDevice::new();
        let calls = AtomicUsize::new(0);
        let make = |v| {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(v)
        };
        assert_eq!(MAP.get_or_try_init(Device::Cuda(0), || make(7)).unwrap(), 7);
        assert_eq!(MAP.get_or_try_init(Device::Cuda(0), || make(8)).unwrap(), 7);
        assert_eq!(MAP.get_or_try_init(Device::Cuda(1), || make(9)).unwrap(), 9);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        let failed = MAP.get_or_try_init(Device::Rocm(0), || Err(Error::Internal("no")));
        assert!(failed.is_err());
        assert_eq!(MAP.get_or_try_init(Device::Rocm(0), || make(3)).unwrap(), 3);
    }

    #[test]
    fn a_slow_maker_blocks_only_its_own_device() {
        static MAP: PerDevice<u32> = PerDevice::new();
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            let slow = s.spawn(move || {
                MAP.get_or_try_init(Device::Cuda(0), || {
                    started_tx.send(()).unwrap();
                    release_rx.recv_timeout(Duration::from_secs(30)).unwrap();
                    Ok(1)
                })
            });
            started_rx.recv().unwrap();
            // Device 1 is made while device 0's maker is still running.
            assert_eq!(MAP.get_or_try_init(Device::Cuda(1), || Ok(2)).unwrap(), 2);
            release_tx.send(()).unwrap();
            assert_eq!(slow.join().unwrap().unwrap(), 1);
        });
        assert_eq!(MAP.get_or_try_init(Device::Cuda(0), || Ok(5)).unwrap(), 1);
    }
}
