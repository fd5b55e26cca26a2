//! Status codes, the thread-local last error, and the guard every entry point
//! runs its body in: no panic crosses the C boundary, every failure leaves a
//! message for `devtensor_last_error`.

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::error::{DLPackError, Error};

/// What a devtensor C function returns (`DEVTENSOR_STATUS_OK` is 0). On any
/// other value, `devtensor_last_error()` describes the failure.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DevtensorStatus {
    /// Success.
    Ok = 0,
    /// A required pointer argument was NULL.
    NullPointer = 1,
    /// An argument has a value the function does not accept (negative or too
    /// many dimensions, a stream given for host memory, ...).
    InvalidArgument = 2,
    /// A `DLDataType` devtensor cannot represent (unknown code, bits or lanes != 1).
    UnsupportedDtype = 3,
    /// A device type devtensor does not handle, a negative device id, or an
    /// operation not available on that device.
    UnsupportedDevice = 4,
    /// The backend of the device cannot run here (no driver, no such GPU,
    /// built without it, or a forked child).
    BackendUnavailable = 5,
    /// Out of device or host memory (after the pool released its cache).
    OutOfMemory = 6,
    /// Shapes that must agree do not.
    ShapeMismatch = 7,
    /// Dtypes that must agree do not.
    DtypeMismatch = 8,
    /// Devices that must agree do not.
    DeviceMismatch = 9,
    /// A write to a read-only tensor (`DLPACK_FLAG_BITMASK_READ_ONLY`).
    ReadOnly = 10,
    /// A tensor descriptor failed validation (bad version, NULL data with
    /// elements, negative sizes, strides reaching outside, ...).
    InvalidTensor = 11,
    /// A driver or runtime call failed, or a kernel did not compile.
    DriverError = 12,
    /// A bug in devtensor (a Rust panic, caught at the boundary).
    Internal = 13,
}

impl DevtensorStatus {
    /// The status for a crate error.
    pub(crate) fn of(e: &Error) -> DevtensorStatus {
        use DevtensorStatus as S;
        match e {
            Error::BackendUnavailable { .. } | Error::ForkedChild { .. } => S::BackendUnavailable,
            Error::OutOfMemory { .. } => S::OutOfMemory,
            Error::Driver { .. } | Error::KernelCompile { .. } | Error::MissingKernel(_) => S::DriverError,
            Error::Internal(_) => S::Internal,
            Error::UnsupportedDType { .. } | Error::UnknownDTypeName(_) => S::UnsupportedDtype,
            Error::UnsupportedDevice { .. } | Error::UnknownDevice(_) => S::UnsupportedDevice,
            Error::DLPack(DLPackError::UnsupportedDevice(_) | DLPackError::BadDeviceId(_)) => S::UnsupportedDevice,
            Error::DLPack(_) => S::InvalidTensor,
            Error::ShapeMismatch { .. } => S::ShapeMismatch,
            Error::DTypeMismatch { .. } => S::DtypeMismatch,
            Error::DeviceMismatch { .. } => S::DeviceMismatch,
            Error::ReadOnly => S::ReadOnly,
            // A framework's allocator failed (env alloc): its kind says why.
            Error::ForeignAlloc { kind, .. } => match kind.as_str() {
                "MemoryError" => S::OutOfMemory,
                "ValueError" | "TypeError" | "BufferError" => S::InvalidArgument,
                _ => S::DriverError,
            },
            Error::Overflow { .. }
            | Error::DimOutOfRange { .. }
            | Error::TooManyDimensions { .. }
            | Error::IndexOutOfRange { .. }
            | Error::InvalidLayout(_)
            | Error::Config { .. }
            | Error::InvalidArgument { .. }
            | Error::OverlappingDestination
            | Error::InvalidScalar { .. } => S::InvalidArgument,
        }
    }

    /// The enumerator's name as the header spells it.
    pub(crate) fn name(self) -> &'static std::ffi::CStr {
        use DevtensorStatus as S;
        match self {
            S::Ok => c"DEVTENSOR_STATUS_OK",
            S::NullPointer => c"DEVTENSOR_STATUS_NULL_POINTER",
            S::InvalidArgument => c"DEVTENSOR_STATUS_INVALID_ARGUMENT",
            S::UnsupportedDtype => c"DEVTENSOR_STATUS_UNSUPPORTED_DTYPE",
            S::UnsupportedDevice => c"DEVTENSOR_STATUS_UNSUPPORTED_DEVICE",
            S::BackendUnavailable => c"DEVTENSOR_STATUS_BACKEND_UNAVAILABLE",
            S::OutOfMemory => c"DEVTENSOR_STATUS_OUT_OF_MEMORY",
            S::ShapeMismatch => c"DEVTENSOR_STATUS_SHAPE_MISMATCH",
            S::DtypeMismatch => c"DEVTENSOR_STATUS_DTYPE_MISMATCH",
            S::DeviceMismatch => c"DEVTENSOR_STATUS_DEVICE_MISMATCH",
            S::ReadOnly => c"DEVTENSOR_STATUS_READ_ONLY",
            S::InvalidTensor => c"DEVTENSOR_STATUS_INVALID_TENSOR",
            S::DriverError => c"DEVTENSOR_STATUS_DRIVER_ERROR",
            S::Internal => c"DEVTENSOR_STATUS_INTERNAL",
        }
    }

    /// The Python exception name a DLPack `SetError(kind, ...)` reports.
    pub(crate) fn error_kind(self) -> &'static std::ffi::CStr {
        use DevtensorStatus as S;
        match self {
            S::OutOfMemory => c"MemoryError",
            S::NullPointer => c"TypeError",
            S::BackendUnavailable | S::DriverError | S::Internal | S::Ok => c"RuntimeError",
            _ => c"ValueError",
        }
    }
}

/// Why a call failed: the status and the message `devtensor_last_error` returns.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: DevtensorStatus,
    pub(crate) message: String,
}

impl Failure {
    /// A NULL pointer where `what` was required.
    pub(crate) fn null(what: &str) -> Failure {
        Failure {
            status: DevtensorStatus::NullPointer,
            message: format!("`{what}` is NULL"),
        }
    }

    /// A bad argument value.
    pub(crate) fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            status: DevtensorStatus::InvalidArgument,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure {
            status: DevtensorStatus::of(&e),
            message: e.to_string(),
        }
    }
}

impl From<DLPackError> for Failure {
    fn from(e: DLPackError) -> Failure {
        Error::from(e).into()
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `message` as this thread's last error.
pub(crate) fn set_last_error(message: &str) {
    // NULs would truncate the C string: replace them.
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // Only fails while the thread is being torn down: nothing to report to then.
    let _ = LAST_ERROR.try_with(|e| {
        if let Ok(mut e) = e.try_borrow_mut() {
            *e = c;
        }
    });
}

/// The pointer `devtensor_last_error` returns: this thread's message, valid
/// until the next failing call on the thread.
pub(crate) fn last_error_ptr() -> *const c_char {
    LAST_ERROR
        .try_with(|e| e.try_borrow().map(|s| s.as_ptr()).unwrap_or(c"".as_ptr()))
        .unwrap_or(c"".as_ptr())
}

/// Runs the body of the entry point `name`: a failure or a panic becomes a
/// status and this thread's last error (prefixed with `name`); nothing unwinds.
pub(crate) fn guard(name: &str, body: impl FnOnce() -> Result<(), Failure>) -> DevtensorStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => DevtensorStatus::Ok,
        Ok(Err(f)) => {
            set_last_error(&format!("{name}: {}", f.message));
            f.status
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_owned());
            // Dropping a panic payload can itself panic; keep it from unwinding.
            let _ = catch_unwind(AssertUnwindSafe(|| drop(payload)));
            set_last_error(&format!("{name}: internal error (a bug in devtensor): {what}"));
            DevtensorStatus::Internal
        }
    }
}

/// The message of the most recent failed devtensor call on the calling
/// thread (an empty string when none has failed). Successful calls leave it
/// unchanged. The pointer stays valid until the next failing call on this
/// thread; copy the text to keep it.
#[unsafe(no_mangle)]
pub extern "C" fn devtensor_last_error() -> *const c_char {
    last_error_ptr()
}

/// The name of a status code (`"DEVTENSOR_STATUS_OUT_OF_MEMORY"`, ...), a
/// static string; `"DEVTENSOR_STATUS_UNKNOWN"` for a value that is none of them.
#[unsafe(no_mangle)]
pub extern "C" fn devtensor_status_name(status: i32) -> *const c_char {
    use DevtensorStatus as S;
    const ALL: [DevtensorStatus; 14] = [
        S::Ok,
        S::NullPointer,
        S::InvalidArgument,
        S::UnsupportedDtype,
        S::UnsupportedDevice,
        S::BackendUnavailable,
        S::OutOfMemory,
        S::ShapeMismatch,
        S::DtypeMismatch,
        S::DeviceMismatch,
        S::ReadOnly,
        S::InvalidTensor,
        S::DriverError,
        S::Internal,
    ];
    ALL.iter()
        .find(|s| **s as i32 == status)
        .map_or(c"DEVTENSOR_STATUS_UNKNOWN", |s| s.name())
        .as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn last() -> String {
        // SAFETY: the pointer is this thread's NUL-terminated message.
        unsafe { CStr::from_ptr(last_error_ptr()) }.to_str().unwrap().to_owned()
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let s = guard("devtensor_test", || panic!("boom {}", 42));
        assert_eq!(s, DevtensorStatus::Internal);
        assert!(last().contains("devtensor_test: internal error"), "{}", last());
        assert!(last().contains("boom 42"), "{}", last());
    }

    #[test]
    fn errors_map_to_statuses_and_messages() {
        let s = guard("f", || Err(Error::ReadOnly.into()));
        assert_eq!(s, DevtensorStatus::ReadOnly);
        assert_eq!(last(), "f: tensor is read-only");
        let s = guard("g", || Err(DLPackError::UnsupportedDevice(99).into()));
        assert_eq!(s, DevtensorStatus::UnsupportedDevice);
        assert_eq!(last(), "g: invalid DLPack tensor: unsupported device type 99");
        // Success leaves the last error as it was.
        assert_eq!(guard("h", || Ok(())), DevtensorStatus::Ok);
        assert_eq!(last(), "g: invalid DLPack tensor: unsupported device type 99");
    }

    #[test]
    fn messages_with_nul_survive() {
        set_last_error("a\0b");
        assert_eq!(last(), "a b");
    }

    #[test]
    fn the_last_error_is_per_thread() {
        set_last_error("main thread");
        std::thread::spawn(|| {
            assert_eq!(last(), "");
            set_last_error("other thread");
        })
        .join()
        .unwrap();
        assert_eq!(last(), "main thread");
    }
}
