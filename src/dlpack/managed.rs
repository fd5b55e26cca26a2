//! [`ManagedTensor`]: an export devtensor still owns. Dropping it runs the
//! DLPack deleter once; [`ManagedTensor::into_raw`] hands the struct to a
//! consumer, which then owns the call (as dlpark's `Managed` does).

use std::ptr::NonNull;

use super::ffi::{DLManagedTensor, DLManagedTensorVersioned};

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::DLManagedTensorVersioned {}
    impl Sealed for super::DLManagedTensor {}
}

/// A DLPack managed struct: the versioned one or the legacy one.
pub trait DeleterStruct: sealed::Sealed {
    /// Runs the struct's own deleter, if it has one.
    ///
    /// # Safety
    ///
    /// `ptr` is a live managed struct whose deleter has not run yet.
    unsafe fn delete(ptr: *mut Self);
}

impl DeleterStruct for DLManagedTensorVersioned {
    unsafe fn delete(ptr: *mut Self) {
        // SAFETY: live and not yet deleted (the caller's contract).
        if let Some(deleter) = unsafe { (*ptr).deleter } {
            // SAFETY: the DLPack contract: the deleter is called once with the struct.
            unsafe { deleter(ptr) };
        }
    }
}

impl DeleterStruct for DLManagedTensor {
    unsafe fn delete(ptr: *mut Self) {
        // SAFETY: as above.
        if let Some(deleter) = unsafe { (*ptr).deleter } {
            // SAFETY: as above.
            unsafe { deleter(ptr) };
        }
    }
}

/// An exported tensor not yet handed to a consumer: `Drop` runs its deleter,
/// `into_raw` gives up ownership (the consumer calls the deleter, once).
#[derive(Debug)]
pub struct ManagedTensor<M: DeleterStruct> {
    ptr: NonNull<M>,
}

// SAFETY: the struct and the block behind it are plain data owned by this
// value alone; the DLPack spec allows the deleter to run on any thread.
unsafe impl<M: DeleterStruct> Send for ManagedTensor<M> {}

impl<M: DeleterStruct> ManagedTensor<M> {
    /// Takes ownership of an exported struct.
    ///
    /// # Safety
    ///
    /// `ptr` is a live managed struct whose deleter nobody else will call.
    pub(crate) unsafe fn from_raw(ptr: NonNull<M>) -> ManagedTensor<M> {
        ManagedTensor { ptr }
    }

    /// The struct, still owned by `self`.
    pub fn as_ptr(&self) -> *mut M {
        self.ptr.as_ptr()
    }

    /// Hands the struct over: the receiver must call its deleter exactly once.
    #[must_use = "the struct leaks unless its deleter is called"]
    pub fn into_raw(self) -> *mut M {
        let ptr = self.ptr.as_ptr();
        std::mem::forget(self);
        ptr
    }
}

impl<M: DeleterStruct> Drop for ManagedTensor<M> {
    fn drop(&mut self) {
        // SAFETY: owned by `self` and not handed over: its deleter has not run.
        unsafe { M::delete(self.ptr.as_ptr()) }
    }
}
