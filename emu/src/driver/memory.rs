//! Device, pinned and managed memory, the allocation table, memory pools,
//! copies and memsets (group__CUDA__MEM, group__CUDA__MALLOC__ASYNC,
//! group__CUDA__UNIFIED: <https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__MEM.html>;
//! host synchronisation of copies: api-sync-behavior.html).
//!
//! Each device reserves a large address range twice over: the *visible* half
//! (the addresses `cuMemAlloc` hands out, always `PROT_NONE`, so a host
//! dereference of a device pointer faults) and an *alias* half at a fixed
//! offset where allocations are mapped read/write for the emulator's own
//! accesses. Addresses are bump-allocated with 512-byte granularity (the
//! documented guarantee is 256-byte alignment) and never reused: a freed
//! allocation stays in the table as freed, so a later access is reported as
//! "freed by <call>". Fresh memory is filled with the poison byte 0xCD.
//!
//! Pinned (`cuMemHostAlloc`) and managed (`cuMemAllocManaged`) memory is host
//! memory (mmap) registered in the same table: host- and kernel-accessible.
//! Freed host memory is remapped `PROT_NONE` (its range stays reserved).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::context::{self, Context};
use super::device::{self, MAX_PITCH, devices};
use super::race::{self, Access, Shadow};
use super::stream::{self, Stream, Work};
use super::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_NOT_SUPPORTED, CUDA_ERROR_OUT_OF_MEMORY, CUdevice,
    CUdeviceptr, CUresult, Handle, Registry, Result, api, entry, err, lock, null_arg, out,
};
use crate::ptx::{Fault, FaultKind, GlobalMemory};

/// Byte written over fresh allocations.
pub const POISON: u8 = 0xCD;
/// Byte written over the partial pages of freed device allocations.
pub const FREED_POISON: u8 = 0xDD;
/// Allocation granularity of device memory.
pub const GRANULARITY: u64 = 512;
const PAGE: u64 = 4096;

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// mmap with the given protection and flags; `None` on failure.
///
/// # Safety
///
/// With `MAP_FIXED`, `addr..addr+len` must be a range this module owns.
unsafe fn mmap(addr: u64, len: u64, prot: c_int, flags: c_int) -> Option<u64> {
    // SAFETY: forwarded; anonymous private mappings only.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len as usize,
            prot,
            flags | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// A device's address ranges and memory accounting.
pub struct DeviceVa {
    pub ordinal: u32,
    /// Start of the visible range.
    pub base: u64,
    /// Length of the visible range; the alias starts at `base + span`.
    pub span: u64,
    total: u64,
    state: Mutex<VaState>,
}

struct VaState {
    next: u64,
    mapped_until: u64,
    used: u64,
}

impl DeviceVa {
    /// Reserves the ranges of device `ordinal` (4 TiB each if the kernel
    /// allows, less otherwise).
    pub fn reserve(ordinal: u32, total: u64) -> std::result::Result<DeviceVa, String> {
        for span in [4u64 << 40, 1 << 40, 256 << 30, 64 << 30, 16 << 30] {
            // SAFETY: a fresh anonymous PROT_NONE reservation (no fixed address).
            if let Some(base) = unsafe { mmap(0, 2 * span, libc::PROT_NONE, libc::MAP_NORESERVE) } {
                // Start 2 MiB in so that no device pointer is the range's first byte.
                let first = base + (2 << 20);
                return Ok(DeviceVa {
                    ordinal,
                    base,
                    span,
                    total,
                    state: Mutex::new(VaState {
                        next: first,
                        mapped_until: first,
                        used: 0,
                    }),
                });
            }
        }
        Err(std::io::Error::last_os_error().to_string())
    }

    /// Whether `addr` is in the visible range.
    pub fn contains(&self, addr: u64) -> bool {
        addr >= self.base && addr < self.base + self.span
    }

    /// The alias (emulator-side) address of device address `va`.
    pub fn alias(&self, va: u64) -> u64 {
        va + self.span
    }

    /// Bytes in use.
    pub fn used(&self) -> u64 {
        lock(&self.state).used
    }

    /// Allocates `size` bytes (poisoned); returns the device address.
    fn alloc(&self, size: u64) -> Result<u64> {
        let rounded = round_up(size.max(1), GRANULARITY);
        let mut s = lock(&self.state);
        if s.used + rounded > self.total {
            return err(
                CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "{size} bytes requested on device {} with {} of {} bytes in use (DEVTENSOR_EMU_MEMORY)",
                    self.ordinal, s.used, self.total
                ),
            );
        }
        if s.next + rounded > self.base + self.span {
            return err(
                CUDA_ERROR_OUT_OF_MEMORY,
                format!(
                    "device {} address range exhausted (addresses are never reused)",
                    self.ordinal
                ),
            );
        }
        let va = s.next;
        let page_lo = s.mapped_until.max(va / PAGE * PAGE);
        let page_hi = round_up(va + rounded, PAGE);
        if page_hi > page_lo {
            // SAFETY: inside our alias reservation, past everything mapped so far.
            let ok = unsafe {
                mmap(
                    self.alias(page_lo),
                    page_hi - page_lo,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_NORESERVE,
                )
            };
            if ok.is_none() {
                return err(
                    CUDA_ERROR_OUT_OF_MEMORY,
                    format!("mmap of {} bytes failed", page_hi - page_lo),
                );
            }
            s.mapped_until = page_hi;
        }
        s.next = va + rounded;
        s.used += rounded;
        drop(s);
        // SAFETY: [alias(va), alias(va) + size) was just mapped read/write.
        unsafe { std::ptr::write_bytes(self.alias(va) as *mut u8, POISON, size as usize) };
        Ok(va)
    }

    /// Releases the memory of [va, va + size): whole pages get fresh zero
    /// pages (physical memory returned; a kernel still racing on them reads
    /// zeros instead of crashing the emulator), partial pages the freed poison.
    fn free(&self, va: u64, size: u64) {
        let rounded = round_up(size.max(1), GRANULARITY);
        let (lo, hi) = (round_up(va, PAGE), (va + rounded) / PAGE * PAGE);
        // SAFETY: [va, va + rounded) of the alias is mapped (allocated by `alloc`).
        unsafe { std::ptr::write_bytes(self.alias(va) as *mut u8, FREED_POISON, rounded as usize) };
        if hi > lo {
            // SAFETY: whole pages of this allocation only, inside our alias reservation.
            unsafe {
                mmap(
                    self.alias(lo),
                    hi - lo,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_NORESERVE,
                )
            };
        }
        lock(&self.state).used -= rounded;
    }
}

/// What kind of memory an allocation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Device memory of device N (cuMemAlloc, cuMemAllocAsync).
    Device(u32),
    /// Page-locked host memory (cuMemHostAlloc).
    Pinned,
    /// Managed memory (cuMemAllocManaged).
    Managed,
}

/// One allocation of the table (live or freed).
pub struct Alloc {
    pub id: u64,
    pub base: u64,
    pub size: u64,
    pub kind: Kind,
    /// The host-side address of `base` (the alias for device memory).
    pub host: u64,
    /// The device whose context allocated it.
    pub ctx_device: u32,
    /// Allocating call.
    pub site: String,
    /// The freeing call, once freed.
    freed: Mutex<Option<String>>,
    /// A stream-ordered free is enqueued (a second free is refused).
    free_pending: AtomicBool,
    /// From a memory pool (cuMemAllocAsync / cuMemAllocFromPoolAsync).
    pool: Option<Arc<Pool>>,
    /// Race-detector state of its bytes.
    pub(crate) shadow: Mutex<Shadow>,
}

impl Alloc {
    pub fn is_freed(&self) -> bool {
        lock(&self.freed).is_some()
    }

    pub fn end(&self) -> u64 {
        self.base + self.size
    }

    /// "device allocation #3 of 4096 bytes [0x…, 0x…) on device 0 (by cuMemAlloc_v2), freed by …".
    pub fn describe(&self) -> String {
        let kind = match self.kind {
            Kind::Device(d) => format!("device allocation #{} on device {d}", self.id),
            Kind::Pinned => format!("pinned host allocation #{}", self.id),
            Kind::Managed => format!("managed allocation #{}", self.id),
        };
        let mut s = format!(
            "{kind} of {} bytes [{:#x}, {:#x}) made by {}",
            self.size,
            self.base,
            self.end(),
            self.site
        );
        if let Some(f) = &*lock(&self.freed) {
            s.push_str(&format!(", freed by {f}"));
        }
        s
    }
}

static TABLE: RwLock<BTreeMap<u64, Arc<Alloc>>> = RwLock::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Bumped on every free (invalidates the kernels' lookup caches).
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn table() -> std::sync::RwLockReadGuard<'static, BTreeMap<u64, Arc<Alloc>>> {
    TABLE.read().unwrap_or_else(|p| p.into_inner())
}

fn register(
    base: u64,
    size: u64,
    kind: Kind,
    host: u64,
    ctx_device: u32,
    site: String,
    pool: Option<Arc<Pool>>,
) -> Arc<Alloc> {
    let a = Arc::new(Alloc {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        base,
        size,
        kind,
        host,
        ctx_device,
        site,
        freed: Mutex::new(None),
        free_pending: AtomicBool::new(false),
        pool,
        shadow: Mutex::new(Shadow::default()),
    });
    let mut t = TABLE.write().unwrap_or_else(|p| p.into_inner());
    // Host ranges are never reused either (freed ones stay reserved), but be safe:
    // drop stale records overlapping the new range.
    let stale: Vec<u64> = t
        .range(..base + size.max(1))
        .rev()
        .take_while(|(_, o)| o.end().max(o.base + 1) > base)
        .map(|(&k, _)| k)
        .collect();
    for k in stale {
        t.remove(&k);
    }
    t.insert(base, a.clone());
    a
}

/// The allocation with the greatest base ≤ `addr` (it may not contain `addr`).
pub fn lookup(addr: u64) -> Option<Arc<Alloc>> {
    table().range(..=addr).next_back().map(|(_, a)| a.clone())
}

/// The allocation containing `addr` (live or freed).
pub fn find(addr: u64) -> Option<Arc<Alloc>> {
    lookup(addr).filter(|a| addr < a.end().max(a.base + 1))
}

/// Allocations overlapping [lo, hi).
pub fn overlapping(lo: u64, hi: u64) -> Vec<Arc<Alloc>> {
    let t = table();
    let mut v: Vec<Arc<Alloc>> = t
        .range(..hi)
        .rev()
        .take_while(|(_, a)| a.end() > lo || a.base >= lo)
        .filter(|(_, a)| a.end() > lo)
        .map(|(_, a)| a.clone())
        .collect();
    v.reverse();
    v
}

/// The device whose visible range holds `addr`.
fn device_of_va(addr: u64) -> Option<&'static device::Device> {
    devices().iter().find(|d| d.va.contains(addr))
}

/// Marks `a` freed by `site` and releases its memory.
fn release(a: &Alloc, site: String) {
    *lock(&a.freed) = Some(site);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    match a.kind {
        Kind::Device(d) => {
            if let Some(dev) = devices().get(d as usize) {
                dev.va.free(a.base, a.size);
            }
        }
        Kind::Pinned | Kind::Managed => {
            let len = round_up(a.size.max(1), PAGE);
            // SAFETY: the range was mmapped by cuMemHostAlloc/cuMemAllocManaged and
            // is ours; it stays reserved (PROT_NONE) so it is never reused.
            unsafe { mmap(a.base, len, libc::PROT_NONE, libc::MAP_FIXED | libc::MAP_NORESERVE) };
        }
    }
    if let Some(p) = &a.pool {
        p.used.fetch_sub(round_up(a.size.max(1), GRANULARITY), Ordering::AcqRel);
    }
}

/// One side of a copy or memset, checked at call time.
#[derive(Clone)]
pub struct Side {
    /// The address as the caller gave it.
    pub addr: u64,
    /// Where the emulator reads/writes it.
    pub host: u64,
    /// The allocation (None: pageable host memory).
    pub alloc: Option<Arc<Alloc>>,
}

impl Side {
    pub fn pageable(&self) -> bool {
        self.alloc.is_none()
    }

    pub fn is_host(&self) -> bool {
        self.alloc.as_ref().is_none_or(|a| a.kind == Kind::Pinned)
    }

    /// Device memory (cuMemAlloc, a pool), not pinned, managed or pageable.
    pub fn is_device(&self) -> bool {
        self.alloc.as_ref().is_some_and(|a| matches!(a.kind, Kind::Device(_)))
    }
}

/// Checks that [addr, addr + len) is usable by `call` and translates it.
/// Device-range addresses must lie inside one live allocation
/// (`CUDA_ERROR_INVALID_VALUE` otherwise: the driver checks ranges it knows);
/// anything else is taken as pageable host memory.
pub fn check_range(call: &str, what: &str, addr: u64, len: u64) -> Result<Side> {
    if addr == 0 {
        return err(CUDA_ERROR_INVALID_VALUE, format!("{what} is NULL"));
    }
    if let Some(a) = find(addr) {
        if a.is_freed() {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!("{call}: {what} {addr:#x} is in freed memory: {}", a.describe()),
            );
        }
        let end = addr.saturating_add(len);
        if end > a.end() {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "{call}: {what} range [{addr:#x}, {end:#x}) of {len} bytes runs {} bytes past the end of {}",
                    end - a.end(),
                    a.describe()
                ),
            );
        }
        return Ok(Side {
            addr,
            host: a.host + (addr - a.base),
            alloc: Some(a),
        });
    }
    if let Some(d) = device_of_va(addr) {
        let near = lookup(addr).map_or(String::new(), |a| {
            format!(" (the nearest allocation below is {})", a.describe())
        });
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "{call}: {what} {addr:#x} is not allocated memory of device {}{near}",
                d.ordinal
            ),
        );
    }
    Ok(Side {
        addr,
        host: addr,
        alloc: None,
    })
}

// ---------------------------------------------------------------------------
// Kernel-side accesses.

/// The memory a launch on `device` sees: its own device memory, peers'
/// memory where access is enabled, pinned and managed memory.
pub struct KernelMemory {
    pub device: u32,
    pub peers: Vec<u32>,
    pub launch_id: u64,
}

#[derive(Clone, Copy)]
struct CacheEntry {
    launch: u64,
    generation: u64,
    lo: u64,
    hi: u64,
    delta: u64,
}

thread_local! {
    /// One-entry translation cache per host thread.
    static CACHE: std::cell::Cell<Option<CacheEntry>> = const { std::cell::Cell::new(None) };
}

impl KernelMemory {
    fn fault(kind: FaultKind, detail: String) -> Fault {
        Fault { kind, detail }
    }
}

impl GlobalMemory for KernelMemory {
    fn resolve(&self, addr: u64, len: u32, _write: bool) -> std::result::Result<*mut u8, Fault> {
        let end = addr.wrapping_add(u64::from(len));
        let generation = GENERATION.load(Ordering::Acquire);
        if let Some(c) = CACHE.with(|c| c.get())
            && c.launch == self.launch_id
            && c.generation == generation
            && addr >= c.lo
            && end <= c.hi
        {
            return Ok(addr.wrapping_add(c.delta) as *mut u8);
        }
        let Some(a) = lookup(addr) else {
            return Err(self.unallocated(addr, len));
        };
        if addr >= a.end() {
            // Just past an allocation (within 1 MiB): out of bounds of it.
            if addr - a.end() < (1 << 20) {
                return Err(Self::fault(
                    FaultKind::OutOfBounds,
                    format!(
                        "address {addr:#x} ({len} bytes) is {} bytes past the end of {}",
                        addr - a.end(),
                        a.describe()
                    ),
                ));
            }
            return Err(self.unallocated(addr, len));
        }
        if a.is_freed() {
            return Err(Self::fault(
                FaultKind::Freed,
                format!("address {addr:#x} ({len} bytes) is in freed memory: {}", a.describe()),
            ));
        }
        if end > a.end() {
            return Err(Self::fault(
                FaultKind::OutOfBounds,
                format!(
                    "access [{addr:#x}, {end:#x}) runs {} bytes past the end of {}",
                    end - a.end(),
                    a.describe()
                ),
            ));
        }
        // Memory from a pool: cuMemPoolCreate (group__CUDA__MALLOC__ASYNC): "By
        // default, the pool's memory will be accessible from the device it is
        // allocated on"; the CUDA Programming Guide, Stream Ordered Memory
        // Allocator, "Device Accessibility for Multi-GPU Support": "memory pool
        // allocation accessibility does not follow cudaDeviceEnablePeerAccess or
        // cuCtxEnablePeerAccess. Instead, the API cudaMemPoolSetAccess modifies
        // what devices can access allocations from a pool." cuMemPoolSetAccess is
        // not emulated, so no other device's kernel may touch it.
        if let Kind::Device(d) = a.kind
            && d != self.device
            && a.pool.is_some()
        {
            return Err(Self::fault(
                FaultKind::NoPeerAccess,
                format!(
                    "address {addr:#x} is pool memory of device {d} and the kernel runs on device {}: pool \
                     allocations are accessible from their own device only unless cuMemPoolSetAccess grants \
                     access (cuCtxEnablePeerAccess does not apply to them): {}",
                    self.device,
                    a.describe()
                ),
            ));
        }
        if let Kind::Device(d) = a.kind
            && d != self.device
            && !self.peers.contains(&d)
        {
            return Err(Self::fault(
                FaultKind::NoPeerAccess,
                format!(
                    "address {addr:#x} is memory of device {d} and the kernel runs on device {} without peer access \
                     (cuCtxEnablePeerAccess): {}",
                    self.device,
                    a.describe()
                ),
            ));
        }
        let delta = a.host.wrapping_sub(a.base);
        CACHE.with(|c| {
            c.set(Some(CacheEntry {
                launch: self.launch_id,
                generation,
                lo: a.base,
                hi: a.end(),
                delta,
            }))
        });
        Ok(addr.wrapping_add(delta) as *mut u8)
    }
}

impl KernelMemory {
    fn unallocated(&self, addr: u64, len: u32) -> Fault {
        if let Some(d) = device_of_va(addr) {
            Self::fault(
                FaultKind::Unallocated,
                format!(
                    "address {addr:#x} ({len} bytes) is in device {}'s address range but not allocated",
                    d.ordinal
                ),
            )
        } else if devices()
            .iter()
            .any(|d| addr >= d.va.base + d.va.span && addr < d.va.base + 2 * d.va.span)
        {
            Self::fault(
                FaultKind::Unallocated,
                format!("address {addr:#x} is not a device address"),
            )
        } else {
            Self::fault(
                FaultKind::PageableHost,
                format!(
                    "address {addr:#x} ({len} bytes) is neither device, pinned nor managed memory: pageable host memory \
                     (the device has no pageable memory access) or a wild pointer"
                ),
            )
        }
    }
}

// ---------------------------------------------------------------------------
// Memory pools (group__CUDA__MALLOC__ASYNC).

/// A memory pool: the device it allocates on and its attributes.
pub struct Pool {
    pub device: u32,
    pub is_default: bool,
    release_threshold: AtomicU64,
    reuse: [AtomicU64; 3],
    used: AtomicU64,
    used_high: AtomicU64,
    reserved_high: AtomicU64,
}

impl Pool {
    pub fn new(device: u32, is_default: bool) -> Pool {
        Pool {
            device,
            is_default,
            release_threshold: AtomicU64::new(0),
            reuse: [AtomicU64::new(1), AtomicU64::new(1), AtomicU64::new(1)],
            used: AtomicU64::new(0),
            used_high: AtomicU64::new(0),
            reserved_high: AtomicU64::new(0),
        }
    }

    fn on_alloc(&self, bytes: u64) {
        let now = self.used.fetch_add(bytes, Ordering::AcqRel) + bytes;
        self.used_high.fetch_max(now, Ordering::AcqRel);
        self.reserved_high.fetch_max(now, Ordering::AcqRel);
    }
}

pub(crate) static POOLS: Registry<Pool> = Registry::new(0x90);

fn pool_from(h: Handle) -> Result<Arc<Pool>> {
    POOLS.get(h).map_or_else(
        || err(CUDA_ERROR_INVALID_HANDLE, format!("{h:p} is not a memory pool")),
        Ok,
    )
}

// ---------------------------------------------------------------------------
// Allocation entry points.

/// Allocates device memory on device `ordinal`.
fn alloc_device(
    call: &'static str,
    ordinal: u32,
    size: usize,
    pool: Option<Arc<Pool>>,
    site: String,
) -> Result<Arc<Alloc>> {
    if size == 0 {
        return err(CUDA_ERROR_INVALID_VALUE, format!("{call}: bytesize is 0"));
    }
    let dev = device::device(ordinal as CUdevice)?;
    let va = dev.va.alloc(size as u64)?;
    if let Some(p) = &pool {
        p.on_alloc(round_up(size as u64, GRANULARITY));
    }
    Ok(register(
        va,
        size as u64,
        Kind::Device(dev.ordinal),
        dev.va.alias(va),
        ordinal,
        site,
        pool,
    ))
}

/// `cuMemAlloc_v2`: "Allocates bytesize bytes of linear memory on the device
/// ... The allocated memory is suitably aligned for any kind of variable. The
/// memory is not cleared. If bytesize is 0, cuMemAlloc() returns
/// CUDA_ERROR_INVALID_VALUE." (group__CUDA__MEM). The emulator fills it with 0xCD.
///
/// # Safety
///
/// `dptr` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult {
    api("cuMemAlloc_v2", || {
        if dptr.is_null() {
            return null_arg("dptr");
        }
        let ctx = context::current_ok()?;
        let a = alloc_device("cuMemAlloc_v2", ctx.device, bytesize, None, "cuMemAlloc_v2".to_owned())?;
        // A host-side write (the poison) at the caller's epoch.
        race::record(
            &[Access {
                lo: a.base,
                hi: a.end(),
                write: true,
            }],
            &race::host_epoch("cuMemAlloc_v2"),
        );
        // SAFETY: forwarded.
        unsafe { out(dptr, "dptr", a.base) }
    })
}

/// The live allocation starting at `ptr` of an acceptable kind, for a free.
fn to_free(call: &str, ptr: u64, kinds: &[fn(Kind) -> bool]) -> Result<Arc<Alloc>> {
    let Some(a) = find(ptr) else {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {ptr:#x} is not an allocation"),
        );
    };
    if a.is_freed() || a.free_pending.load(Ordering::Acquire) {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {ptr:#x} is already freed: {}", a.describe()),
        );
    }
    if a.base != ptr {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {ptr:#x} is inside, not at the start of, {}", a.describe()),
        );
    }
    if !kinds.iter().any(|k| k(a.kind)) {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: wrong kind of memory: {}", a.describe()),
        );
    }
    Ok(a)
}

/// Synchronous free: waits for the work of the allocation's device (as the
/// driver's free does in practice), then frees as a host-side write. That
/// work includes what is still queued on streams destroyed since
/// (group__CUDA__STREAM, cuStreamDestroy_v2: "the resources associated with
/// hStream will be released automatically once the device has completed all
/// work in hStream" — the work goes on on the device).
///
/// Memory from a pool is the exception: cuMemFree_v2 (group__CUDA__MEM):
/// "This API will not perform any implicit synchronization when the pointer
/// was allocated with cuMemAllocAsync or cuMemAllocFromPoolAsync. Callers
/// must ensure that all accesses to these pointer have completed before
/// invoking cuMemFree." The emulator still lets the device finish (its own
/// safety), but the host is not ordered after that work: an access the
/// caller did not synchronise with is a race with the free (use after free).
fn free_now(call: &'static str, a: &Alloc) {
    let ctx_dev = match a.kind {
        Kind::Device(d) => d,
        _ => a.ctx_device,
    };
    if let Some(d) = devices().get(ctx_dev as usize) {
        let ctx: &'static Context = &d.primary;
        if a.pool.is_some() {
            ctx.wait_idle();
        } else {
            ctx.synchronize_host();
        }
    }
    if let Some(r) = race::record(
        &[Access {
            lo: a.base,
            hi: a.end(),
            write: true,
        }],
        &race::host_epoch(call),
    ) && let Some(d) = devices().get(ctx_dev as usize)
    {
        d.primary
            .set_sticky(super::CUDA_ERROR_LAUNCH_FAILED, &format!("use after free: {r}"));
    }
    release(a, call.to_owned());
}

/// `cuMemFree_v2`: frees memory from cuMemAlloc / cuMemAllocManaged (or a
/// pool, without synchronising: see [`free_now`]); anything else, or a second
/// free: `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    api("cuMemFree_v2", || {
        let ctx = context::current_ok()?;
        let _ = ctx;
        let a = to_free(
            "cuMemFree_v2",
            dptr,
            &[|k| matches!(k, Kind::Device(_)), |k| k == Kind::Managed],
        )?;
        free_now("cuMemFree_v2", &a);
        Ok(())
    })
}

/// Maps `size` bytes of poisoned host memory and registers it.
fn alloc_host(call: &'static str, kind: Kind, size: usize) -> Result<Arc<Alloc>> {
    if size == 0 {
        return err(CUDA_ERROR_INVALID_VALUE, format!("{call}: bytesize is 0"));
    }
    let ctx = context::current_ok()?;
    let len = round_up(size as u64, PAGE);
    // SAFETY: a fresh anonymous mapping at an address the kernel picks.
    let Some(p) = (unsafe { mmap(0, len, libc::PROT_READ | libc::PROT_WRITE, 0) }) else {
        return err(CUDA_ERROR_OUT_OF_MEMORY, format!("{call}: mmap of {len} bytes failed"));
    };
    // SAFETY: just mapped, `size` ≤ `len` bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, POISON, size) };
    let a = register(p, size as u64, kind, p, ctx.device, call.to_owned(), None);
    race::record(
        &[Access {
            lo: a.base,
            hi: a.end(),
            write: true,
        }],
        &race::host_epoch(call),
    );
    Ok(a)
}

/// `cuMemHostAlloc`: page-locked host memory, accessible to the device
/// (unified addressing: the same pointer). Flags: PORTABLE 1, DEVICEMAP 2,
/// WRITECOMBINED 4; others: `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
///
/// `pp` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytesize: usize, flags: c_uint) -> CUresult {
    api("cuMemHostAlloc", || {
        if pp.is_null() {
            return null_arg("pp");
        }
        if flags & !7 != 0 {
            return err(CUDA_ERROR_INVALID_VALUE, format!("unknown flags {flags:#x}"));
        }
        let a = alloc_host("cuMemHostAlloc", Kind::Pinned, bytesize)?;
        // SAFETY: forwarded.
        unsafe { out(pp, "pp", a.base as *mut c_void) }
    })
}

/// `cuMemAllocHost_v2`: `cuMemHostAlloc` with flags 0.
///
/// # Safety
///
/// As [`cuMemHostAlloc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize) -> CUresult {
    // SAFETY: forwarded.
    unsafe { cuMemHostAlloc(pp, bytesize, 0) }
}

/// `cuMemFreeHost`: frees memory from cuMemHostAlloc.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    api("cuMemFreeHost", || {
        context::current_ok()?;
        let a = to_free("cuMemFreeHost", p as u64, &[|k| k == Kind::Pinned])?;
        free_now("cuMemFreeHost", &a);
        Ok(())
    })
}

/// `cuMemAllocManaged`: "Allocates bytesize bytes of managed memory ...
/// flags must be CU_MEM_ATTACH_GLOBAL (1) or CU_MEM_ATTACH_HOST (2)";
/// bytesize 0: `CUDA_ERROR_INVALID_VALUE` (group__CUDA__MEM).
///
/// # Safety
///
/// `dptr` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: c_uint) -> CUresult {
    api("cuMemAllocManaged", || {
        if dptr.is_null() {
            return null_arg("dptr");
        }
        if flags != 1 && flags != 2 {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!("flags must be CU_MEM_ATTACH_GLOBAL or _HOST, got {flags}"),
            );
        }
        let a = alloc_host("cuMemAllocManaged", Kind::Managed, bytesize)?;
        // SAFETY: forwarded.
        unsafe { out(dptr, "dptr", a.base) }
    })
}

/// `cuMemGetInfo_v2`: free and total memory of the current context's device.
///
/// # Safety
///
/// `free` and `total` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    api("cuMemGetInfo_v2", || {
        if free.is_null() {
            return null_arg("free");
        }
        if total.is_null() {
            return null_arg("total");
        }
        let ctx = context::current_ok()?;
        let d = device::device(ctx.device as CUdevice)?;
        // SAFETY: forwarded.
        unsafe {
            out(free, "free", (d.total_mem - d.va.used()) as usize)?;
            out(total, "total", d.total_mem as usize)
        }
    })
}

/// A stream-ordered allocation from `pool` on `stream`: the address is
/// returned now, the block becomes usable in stream order (its poisoning
/// is a write by the allocation's operation in the race detector). An
/// explicit pool may be another device's (cuMemAllocFromPoolAsync,
/// group__CUDA__MALLOC__ASYNC: "The specified memory pool may be from a
/// device different than that of the specified hStream"); the block is then
/// that device's memory.
fn alloc_async(
    call: &'static str,
    dptr: *mut CUdeviceptr,
    size: usize,
    pool: Option<Arc<Pool>>,
    h: Handle,
) -> Result<()> {
    if dptr.is_null() {
        return null_arg("dptr");
    }
    let s = stream::resolve(h)?;
    let pool = match pool {
        Some(p) => p,
        None => device::device(s.ctx.device as CUdevice)?.default_pool.clone(),
    };
    let a = alloc_device(
        call,
        pool.device,
        size,
        Some(pool),
        format!("{call} on {}", s.describe()),
    )?;
    let (lo, hi) = (a.base, a.end());
    s.enqueue(
        call,
        None,
        Vec::new(),
        Box::new(move || Ok(vec![Access { lo, hi, write: true }])),
    );
    // SAFETY: checked non-null above; valid per the caller's contract.
    unsafe { out(dptr, "dptr", a.base) }
}

/// `cuMemAllocAsync`: "Allocates memory with stream ordered semantics ...
/// The allocation comes from the memory pool current to the stream's device."
/// (group__CUDA__MALLOC__ASYNC)
///
/// # Safety
///
/// `dptr` must be NULL or valid for writes; `h` a stream handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, h: Handle) -> CUresult {
    entry("cuMemAllocAsync", true, 11020, || {
        alloc_async("cuMemAllocAsync", dptr, bytesize, None, h)
    })
}

/// `cuMemAllocFromPoolAsync`: as cuMemAllocAsync, from `pool`.
///
/// # Safety
///
/// As [`cuMemAllocAsync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocFromPoolAsync(
    dptr: *mut CUdeviceptr,
    bytesize: usize,
    pool: Handle,
    h: Handle,
) -> CUresult {
    entry("cuMemAllocFromPoolAsync", true, 11020, || {
        let p = pool_from(pool)?;
        alloc_async("cuMemAllocFromPoolAsync", dptr, bytesize, Some(p), h)
    })
}

/// `cuMemFreeAsync`: "Frees memory with stream ordered semantics ... The
/// memory is freed when the stream reaches the operation"; the free is a
/// write of the whole block for the race detector, so a use in a stream not
/// ordered with it is reported as a use after free.
///
/// # Safety
///
/// `h` must be a stream handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemFreeAsync(dptr: CUdeviceptr, h: Handle) -> CUresult {
    entry("cuMemFreeAsync", true, 11020, || {
        let s = stream::resolve(h)?;
        let a = to_free("cuMemFreeAsync", dptr, &[|k| matches!(k, Kind::Device(_))])?;
        a.free_pending.store(true, Ordering::Release);
        let site = format!("cuMemFreeAsync on {}", s.describe());
        let (lo, hi) = (a.base, a.end());
        s.enqueue(
            "cuMemFreeAsync",
            None,
            Vec::new(),
            Box::new(move || {
                release(&a, site);
                Ok(vec![Access { lo, hi, write: true }])
            }),
        );
        Ok(())
    })
}

/// `cuDeviceGetDefaultMemPool`.
///
/// # Safety
///
/// `pool` must be NULL or valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut Handle, dev: CUdevice) -> CUresult {
    entry("cuDeviceGetDefaultMemPool", true, 11020, || {
        if pool.is_null() {
            return null_arg("pool_out");
        }
        let d = device::device(dev)?;
        // SAFETY: forwarded.
        unsafe { out(pool, "pool_out", d.default_pool_handle) }
    })
}

/// `CUmemPoolProps` (cuda.h): allocType, handleTypes, location {type, id},
/// win32SecurityAttributes, maxSize, usage, gpuDirectRDMACapable, reserved[53].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CUmemPoolProps {
    pub alloc_type: u32,
    pub handle_types: u32,
    pub location_type: u32,
    pub location_id: c_int,
    pub win32_security_attributes: *mut c_void,
    pub max_size: usize,
    pub usage: u16,
    pub gpu_direct_rdma_capable: u8,
    pub reserved: [u8; 53],
}

/// `cuMemPoolCreate`: a pool of pinned device memory on `location.id`
/// (allocType must be CU_MEM_ALLOCATION_TYPE_PINNED = 1, location type
/// CU_MEM_LOCATION_TYPE_DEVICE = 1).
///
/// # Safety
///
/// `pool` must be NULL or valid for writes, `props` NULL or a valid struct.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolCreate(pool: *mut Handle, props: *const CUmemPoolProps) -> CUresult {
    entry("cuMemPoolCreate", true, 11020, || {
        if pool.is_null() {
            return null_arg("pool");
        }
        if props.is_null() {
            return null_arg("poolProps");
        }
        // SAFETY: non-null, valid per the contract.
        let p = unsafe { props.read_unaligned() };
        if p.alloc_type != 1 || p.location_type != 1 {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!(
                    "only device pools of pinned memory are modelled (allocType {}, location type {})",
                    p.alloc_type, p.location_type
                ),
            );
        }
        let d = device::device(p.location_id)?;
        let h = POOLS.insert(Arc::new(Pool::new(d.ordinal, false)));
        // SAFETY: forwarded.
        unsafe { out(pool, "pool", h) }
    })
}

/// `cuMemPoolDestroy`: the default pool cannot be destroyed (`CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolDestroy(pool: Handle) -> CUresult {
    entry("cuMemPoolDestroy", true, 11020, || {
        let p = pool_from(pool)?;
        if p.is_default {
            return err(CUDA_ERROR_INVALID_VALUE, "a device's default pool cannot be destroyed");
        }
        POOLS.remove(pool);
        Ok(())
    })
}

/// `cuMemPoolTrimTo`: nothing is cached by the emulator's pools; validates the pool.
///
/// # Safety
///
/// Always safe; `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: Handle, _min_bytes_to_keep: usize) -> CUresult {
    entry("cuMemPoolTrimTo", true, 11020, || pool_from(pool).map(|_| ()))
}

/// `cuMemPoolSetAttribute`: REUSE_* (1-3, int), RELEASE_THRESHOLD (4,
/// cuuint64_t), RESERVED_MEM_HIGH / USED_MEM_HIGH (6, 8: may only be reset to
/// 0); the current-usage attributes (5, 7) are read-only: `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
///
/// `value` must be NULL or point to the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolSetAttribute(pool: Handle, attr: c_int, value: *mut c_void) -> CUresult {
    entry("cuMemPoolSetAttribute", true, 11020, || {
        let p = pool_from(pool)?;
        if value.is_null() {
            return null_arg("value");
        }
        match attr {
            1..=3 => {
                // SAFETY: an int per the attribute's documented type.
                let v = unsafe { value.cast::<c_int>().read_unaligned() };
                p.reuse[attr as usize - 1].store(u64::from(v != 0), Ordering::Release);
            }
            4 => {
                // SAFETY: a cuuint64_t per the attribute's documented type.
                let v = unsafe { value.cast::<u64>().read_unaligned() };
                p.release_threshold.store(v, Ordering::Release);
            }
            6 | 8 => {
                // SAFETY: a cuuint64_t per the attribute's documented type.
                let v = unsafe { value.cast::<u64>().read_unaligned() };
                if v != 0 {
                    return err(CUDA_ERROR_INVALID_VALUE, "high-water marks can only be reset to 0");
                }
                let now = p.used.load(Ordering::Acquire);
                if attr == 6 { &p.reserved_high } else { &p.used_high }.store(now, Ordering::Release);
            }
            _ => return err(CUDA_ERROR_INVALID_VALUE, format!("attribute {attr} cannot be set")),
        }
        Ok(())
    })
}

/// `cuMemPoolGetAttribute` (types as for cuMemPoolSetAttribute).
///
/// # Safety
///
/// `value` must be NULL or point to the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: Handle, attr: c_int, value: *mut c_void) -> CUresult {
    entry("cuMemPoolGetAttribute", true, 11020, || {
        let p = pool_from(pool)?;
        if value.is_null() {
            return null_arg("value");
        }
        let v64 = match attr {
            1..=3 => {
                let v = p.reuse[attr as usize - 1].load(Ordering::Acquire) as c_int;
                // SAFETY: an int per the attribute's documented type.
                unsafe { value.cast::<c_int>().write_unaligned(v) };
                return Ok(());
            }
            4 => p.release_threshold.load(Ordering::Acquire),
            5 | 7 => p.used.load(Ordering::Acquire),
            6 => p.reserved_high.load(Ordering::Acquire),
            8 => p.used_high.load(Ordering::Acquire),
            _ => return err(CUDA_ERROR_INVALID_VALUE, format!("unknown pool attribute {attr}")),
        };
        // SAFETY: a cuuint64_t per the attribute's documented type.
        unsafe { value.cast::<u64>().write_unaligned(v64) };
        Ok(())
    })
}

/// `cuPointerGetAttribute` (group__CUDA__UNIFIED): CONTEXT (1), MEMORY_TYPE
/// (2), DEVICE_POINTER (3), HOST_POINTER (4), BUFFER_ID (7), IS_MANAGED (8),
/// DEVICE_ORDINAL (9), RANGE_START_ADDR (11), RANGE_SIZE (12),
/// MEMPOOL_HANDLE (17). A pointer the driver does not know:
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
///
/// `data` must be NULL or valid for writing the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attribute: c_int, ptr: CUdeviceptr) -> CUresult {
    api("cuPointerGetAttribute", || {
        if data.is_null() {
            return null_arg("data");
        }
        let Some(a) = find(ptr).filter(|a| !a.is_freed()) else {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!("{ptr:#x} is not memory the driver allocated"),
            );
        };
        let off = ptr - a.base;
        // SAFETY: (all writes below) `data` is valid for the attribute's type per the contract.
        unsafe {
            match attribute {
                1 => data
                    .cast::<Handle>()
                    .write_unaligned(devices()[a.ctx_device as usize].primary.handle()),
                2 => data
                    .cast::<u32>()
                    .write_unaligned(if a.kind == Kind::Pinned { 1 } else { 2 }),
                3 => data.cast::<u64>().write_unaligned(ptr),
                4 => {
                    if matches!(a.kind, Kind::Device(_)) {
                        return err(CUDA_ERROR_INVALID_VALUE, "device memory has no host pointer");
                    }
                    data.cast::<*mut c_void>()
                        .write_unaligned((a.host + off) as *mut c_void)
                }
                6 => data.cast::<u8>().write(1),
                7 => data.cast::<u64>().write_unaligned(a.id),
                8 => data.cast::<u8>().write(u8::from(a.kind == Kind::Managed)),
                9 => data.cast::<c_int>().write_unaligned(match a.kind {
                    Kind::Device(d) => d as c_int,
                    _ => a.ctx_device as c_int,
                }),
                11 => data.cast::<u64>().write_unaligned(a.base),
                12 => data.cast::<usize>().write_unaligned(a.size as usize),
                13 => data.cast::<u8>().write(1),
                17 => data
                    .cast::<Handle>()
                    .write_unaligned(a.pool.as_ref().map_or(std::ptr::null_mut(), |p| POOLS.handle_of(p))),
                _ => {
                    return err(
                        CUDA_ERROR_INVALID_VALUE,
                        format!("pointer attribute {attribute} is not supported"),
                    );
                }
            }
        }
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Copies and memsets.

/// Byte ranges of a (possibly pitched) region: `height` rows of `width`
/// bytes, `pitch` apart. Many rows are recorded as their hull.
fn rows(lo: u64, width: u64, pitch: u64, height: u64) -> Vec<(u64, u64)> {
    if height == 0 || width == 0 {
        return Vec::new();
    }
    if pitch == width || height == 1 || height > 4096 {
        return vec![(lo, lo + (height - 1) * pitch + width)];
    }
    (0..height).map(|r| (lo + r * pitch, lo + r * pitch + width)).collect()
}

/// The first byte two copy regions share, if any: `height` rows of `width`
/// bytes from `a` (rows `pitch_a` apart) and from `b` (`pitch_b` apart). A
/// region is its rows, not the gaps between them: pitched regions whose rows
/// interleave share nothing. One region's rows ascend without touching
/// (pitch >= width), so a merge walk over both decides, in O(height) steps
/// like the copy itself.
fn first_shared_byte(a: u64, pitch_a: u64, b: u64, pitch_b: u64, width: u64, height: u64) -> Option<u64> {
    if width == 0 || height == 0 {
        return None;
    }
    debug_assert!(height == 1 || (pitch_a >= width && pitch_b >= width));
    let row = |lo: u64, pitch: u64, r: u64| lo.saturating_add(r.saturating_mul(pitch));
    let end = |lo: u64, pitch: u64| row(lo, pitch, height - 1).saturating_add(width);
    // Disjoint hulls: the common case, decided at once.
    if end(a, pitch_a) <= b || end(b, pitch_b) <= a {
        return None;
    }
    let (mut i, mut j) = (0, 0);
    while i < height && j < height {
        let (lo_a, lo_b) = (row(a, pitch_a, i), row(b, pitch_b, j));
        if lo_a.saturating_add(width) <= lo_b {
            i += 1;
        } else if lo_b.saturating_add(width) <= lo_a {
            j += 1;
        } else {
            return Some(lo_a.max(lo_b));
        }
    }
    None
}

/// Refuses a copy whose source and destination rows share a byte. The Driver
/// API pages of the cuMemcpy* functions say nothing on overlap; the runtime
/// pages of the same operations do: cudaMemcpyAsync and cudaMemcpy2D /
/// cudaMemcpy2DAsync "The memory areas may not overlap."
/// (<https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__MEMORY.html>),
/// and cudaMemcpy in the CUDA 4 reference
/// (<https://developer.download.nvidia.com/compute/DevZone/docs/html/C/doc/html/group__CUDART__MEMORY_g48efa06b81cc031b2aa6fdc2e9930741.html>;
/// later editions drop the sentence without allowing overlap). Refused as the
/// other argument errors of a copy are: `CUDA_ERROR_INVALID_VALUE`, nothing
/// copied, the context unharmed.
fn refuse_overlap(
    call: &str,
    dst: &Side,
    dst_pitch: u64,
    src: &Side,
    src_pitch: u64,
    width: u64,
    height: u64,
) -> Result<()> {
    // Compared where the bytes are (`host`); reported in the caller's addresses.
    let Some(byte) = first_shared_byte(dst.host, dst_pitch, src.host, src_pitch, width, height) else {
        return Ok(());
    };
    let at = dst.addr.wrapping_add(byte.wrapping_sub(dst.host));
    err(
        CUDA_ERROR_INVALID_VALUE,
        format!(
            "{call}: source {:#x} and destination {:#x} overlap at {at:#x} ({height} row(s) of {width} bytes, \
             source pitch {src_pitch}, destination pitch {dst_pitch}): the memory areas may not overlap",
            src.addr, dst.addr
        ),
    )
}

fn accesses(side: &Side, ranges: &[(u64, u64)], write: bool) -> Vec<Access> {
    if side.alloc.is_none() {
        return Vec::new();
    }
    ranges.iter().map(|&(lo, hi)| Access { lo, hi, write }).collect()
}

/// When the host waits for a copy, and what it is then ordered after (API
/// synchronization behavior,
/// <https://docs.nvidia.com/cuda/cuda-driver-api/api-sync-behavior.html>).
///
/// Synchronous forms: "For transfers from pageable host memory to device
/// memory, a stream sync is performed before the copy is initiated. The
/// function will return once the pageable buffer has been copied to the
/// staging memory for DMA transfer to device memory, but the DMA to final
/// destination may not have completed. For transfers from pinned host memory
/// to device memory, the function is synchronous with respect to the host.
/// For transfers from device to either pageable or pinned host memory, the
/// function returns only once the copy has completed. For transfers from
/// device memory to device memory, no host-side synchronization is
/// performed. For transfers from any host memory to any host memory, the
/// function is fully synchronous with respect to the host."
///
/// Asynchronous forms: "For transfers between device memory and pageable host
/// memory, the function might be synchronous with respect to host. For
/// transfers from any host memory to any host memory, the function is fully
/// synchronous with respect to the host. If pageable memory must first be
/// staged to pinned memory, the driver may synchronize with the stream and
/// stage the copy into pinned memory. For all other transfers, the function
/// should be fully asynchronous."
///
/// The emulator reads and writes pageable memory from the stream's worker,
/// so it always waits for a copy with a pageable side before returning; but
/// where the page promises no completion (pageable → device memory in the
/// synchronous forms; pageable ↔ device memory in the asynchronous ones,
/// "might be synchronous") the host is not ordered after the copy for the
/// race detector: later work on a stream not ordered with the copy's, reading
/// or writing its device range, is a race.
#[derive(Clone, Copy, PartialEq, Eq)]
enum HostSync {
    /// The Async forms.
    AsyncForm,
    /// The synchronous forms.
    SyncForm,
}

/// Enqueues a 2D copy (1D: height 1) on `s`, checked now, run in stream order.
#[allow(clippy::too_many_arguments)]
fn enqueue_copy(
    call: &'static str,
    s: &Arc<Stream>,
    dst: Side,
    dst_pitch: u64,
    src: Side,
    src_pitch: u64,
    width: u64,
    height: u64,
    mode: HostSync,
) -> Result<()> {
    if width == 0 || height == 0 {
        return Ok(());
    }
    let src_rows = rows(src.addr, width, src_pitch, height);
    let dst_rows = rows(dst.addr, width, dst_pitch, height);
    let mut acc = accesses(&src, &src_rows, false);
    acc.extend(accesses(&dst, &dst_rows, true));
    // Synchronous pageable → device: "a stream sync is performed before the copy is initiated".
    let pageable_to_device = src.pageable() && dst.is_device();
    if mode == HostSync::SyncForm && pageable_to_device {
        s.synchronize_host();
        s.ctx.check()?;
    }
    let (sh, dh) = (src.host, dst.host);
    let work: Work = Box::new(move || {
        for r in 0..height {
            // SAFETY: both regions were checked against their allocations (or are
            // the caller's pageable memory, alive because the call waits).
            unsafe {
                std::ptr::copy(
                    (sh + r * src_pitch) as *const u8,
                    (dh + r * dst_pitch) as *mut u8,
                    width as usize,
                );
            }
        }
        Ok(acc)
    });
    let ticket = s.enqueue(call, None, Vec::new(), work);
    let host_to_host = src.is_host() && dst.is_host();
    // (waits before returning, the host ordered after the copy)
    let (wait, ordered) = match mode {
        HostSync::AsyncForm => (
            src.pageable() || dst.pageable() || host_to_host,
            host_to_host || !(pageable_to_device || (dst.pageable() && src.is_device())),
        ),
        HostSync::SyncForm => (src.is_host() || dst.is_host(), !pageable_to_device),
    };
    if wait {
        if ordered {
            s.wait_for(&ticket);
        } else {
            s.wait_done(ticket.seq);
        }
        s.ctx.check()?;
    }
    Ok(())
}

/// What a copy's side must be, for the copies that name it (`…HtoD`, `…DtoH`,
/// `…DtoD`, a CUDA_MEMCPY2D's `CU_MEMORYTYPE_HOST` / `_DEVICE`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Want {
    /// Host memory: pageable, pinned or managed, not device memory (the host
    /// cannot dereference it).
    Host,
    /// Device-accessible memory: device, pinned or managed, not pageable
    /// (CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS is 0).
    Device,
}

/// Refuses a side of the wrong kind for a copy that names its kind. Per
/// group__CUDA__MEM, cuMemcpyHtoD "Copies from host memory to device memory.
/// dstDevice and srcHost are the base addresses of the destination and
/// source", cuMemcpyDtoH "Copies from device to host memory", cuMemcpyDtoD
/// "Copies from device memory to device memory"; the runtime's cudaMemcpy
/// page: "Calling cudaMemcpy() with dst and src pointers that do not match the
/// direction of the copy results in an undefined behavior." Pinned and managed
/// memory are both host and device memory (group__CUDA__UNIFIED, "Automatic
/// Mapping of Host Allocated Host Memory": "The pointer value through which
/// allocated host memory may be accessed in kernels on all devices that
/// support unified addressing is the same as the pointer value through which
/// that memory is accessed on the host").
fn check_kind(call: &str, what: &str, side: &Side, want: Want) -> Result<()> {
    match want {
        Want::Device if side.pageable() => err(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "{call}: {what} {:#x} is pageable host memory, not device memory (the device has no pageable \
                 memory access; cuMemcpy / cuMemcpyAsync infer the direction from the pointers)",
                side.addr
            ),
        ),
        Want::Host if side.is_device() => err(
            CUDA_ERROR_INVALID_VALUE,
            format!(
                "{call}: {what} {:#x} is device memory, not host memory (cuMemcpy / cuMemcpyAsync infer the \
                 direction from the pointers): {}",
                side.addr,
                side.alloc.as_ref().map_or(String::new(), |a| a.describe())
            ),
        ),
        _ => Ok(()),
    }
}

/// A 1-D copy; `kinds`: what the destination and source must be (None: unified addressing).
fn copy_1d(
    call: &'static str,
    dst: u64,
    src: u64,
    n: usize,
    h: Handle,
    mode: HostSync,
    kinds: Option<[Want; 2]>,
) -> Result<()> {
    let s = match mode {
        HostSync::AsyncForm => stream::resolve(h)?,
        HostSync::SyncForm => context::current_ok()?.legacy(),
    };
    if n == 0 {
        return Ok(());
    }
    let d = check_range(call, "destination", dst, n as u64)?;
    let sr = check_range(call, "source", src, n as u64)?;
    if let Some([dk, sk]) = kinds {
        check_kind(call, "destination", &d, dk)?;
        check_kind(call, "source", &sr, sk)?;
    }
    refuse_overlap(call, &d, n as u64, &sr, n as u64, n as u64, 1)?;
    enqueue_copy(call, &s, d, n as u64, sr, n as u64, n as u64, 1, mode)
}

/// `cuMemcpyAsync`: "Copies data between two pointers. Note that this function
/// infers the type of the transfer (host to host, host to device, device to
/// device, or device to host) from the pointer values. This function is only
/// allowed in contexts which support unified addressing." A range past the end
/// of an allocation, or a source and destination sharing a byte
/// ([`refuse_overlap`], as for every 1-D and 2-D copy): `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
///
/// Pageable host ranges must be valid for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, count: usize, h: Handle) -> CUresult {
    api("cuMemcpyAsync", || {
        copy_1d("cuMemcpyAsync", dst, src, count, h, HostSync::AsyncForm, None)
    })
}

/// `cuMemcpy` (unified addressing, synchronous form, on the legacy stream).
///
/// # Safety
///
/// As [`cuMemcpyAsync`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, count: usize) -> CUresult {
    api("cuMemcpy", || {
        copy_1d(
            "cuMemcpy",
            dst,
            src,
            count,
            std::ptr::null_mut(),
            HostSync::SyncForm,
            None,
        )
    })
}

/// `cuMemcpyHtoD_v2`.
///
/// # Safety
///
/// `src` must be valid for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, count: usize) -> CUresult {
    api("cuMemcpyHtoD_v2", || {
        copy_1d(
            "cuMemcpyHtoD_v2",
            dst,
            src as u64,
            count,
            std::ptr::null_mut(),
            HostSync::SyncForm,
            Some([Want::Device, Want::Host]),
        )
    })
}

/// `cuMemcpyDtoH_v2`.
///
/// # Safety
///
/// `dst` must be valid for `count` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, count: usize) -> CUresult {
    api("cuMemcpyDtoH_v2", || {
        copy_1d(
            "cuMemcpyDtoH_v2",
            dst as u64,
            src,
            count,
            std::ptr::null_mut(),
            HostSync::SyncForm,
            Some([Want::Host, Want::Device]),
        )
    })
}

/// `cuMemcpyDtoD_v2`.
///
/// # Safety
///
/// Always safe (both ranges are checked); `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, count: usize) -> CUresult {
    api("cuMemcpyDtoD_v2", || {
        copy_1d(
            "cuMemcpyDtoD_v2",
            dst,
            src,
            count,
            std::ptr::null_mut(),
            HostSync::SyncForm,
            Some([Want::Device, Want::Device]),
        )
    })
}

/// `cuMemcpyHtoDAsync_v2`.
///
/// # Safety
///
/// `src` must be valid for `count` bytes until the copy is done.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    count: usize,
    h: Handle,
) -> CUresult {
    api("cuMemcpyHtoDAsync_v2", || {
        copy_1d(
            "cuMemcpyHtoDAsync_v2",
            dst,
            src as u64,
            count,
            h,
            HostSync::AsyncForm,
            Some([Want::Device, Want::Host]),
        )
    })
}

/// `cuMemcpyDtoHAsync_v2`.
///
/// # Safety
///
/// `dst` must be valid for `count` bytes until the copy is done.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, count: usize, h: Handle) -> CUresult {
    api("cuMemcpyDtoHAsync_v2", || {
        copy_1d(
            "cuMemcpyDtoHAsync_v2",
            dst as u64,
            src,
            count,
            h,
            HostSync::AsyncForm,
            Some([Want::Host, Want::Device]),
        )
    })
}

/// `cuMemcpyDtoDAsync_v2`.
///
/// # Safety
///
/// Always safe (both ranges are checked); `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, count: usize, h: Handle) -> CUresult {
    api("cuMemcpyDtoDAsync_v2", || {
        copy_1d(
            "cuMemcpyDtoDAsync_v2",
            dst,
            src,
            count,
            h,
            HostSync::AsyncForm,
            Some([Want::Device, Want::Device]),
        )
    })
}

/// `CUDA_MEMCPY2D` (cuda.h `CUDA_MEMCPY2D_st`, 128 bytes on LP64).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaMemcpy2D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width_in_bytes: usize,
    pub height: usize,
}

/// `CUmemorytype`.
pub const CU_MEMORYTYPE_HOST: u32 = 1;
pub const CU_MEMORYTYPE_DEVICE: u32 = 2;
pub const CU_MEMORYTYPE_ARRAY: u32 = 3;
pub const CU_MEMORYTYPE_UNIFIED: u32 = 4;

/// One side of a CUDA_MEMCPY2D: its start address, checked.
#[allow(clippy::too_many_arguments)]
fn side_2d(
    call: &str,
    what: &str,
    mtype: u32,
    host: u64,
    dev: u64,
    x: usize,
    y: usize,
    pitch: usize,
    width: usize,
    height: usize,
) -> Result<Side> {
    if pitch > MAX_PITCH {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {what}Pitch {pitch} exceeds CU_DEVICE_ATTRIBUTE_MAX_PITCH ({MAX_PITCH})"),
        );
    }
    if width + x > pitch && height > 0 && width > 0 {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: WidthInBytes {width} + {what}XInBytes {x} exceeds {what}Pitch {pitch}"),
        );
    }
    let base = match mtype {
        CU_MEMORYTYPE_HOST => host,
        CU_MEMORYTYPE_DEVICE | CU_MEMORYTYPE_UNIFIED => dev,
        CU_MEMORYTYPE_ARRAY => {
            return err(
                CUDA_ERROR_NOT_SUPPORTED,
                format!("{call}: CUDA arrays are not emulated"),
            );
        }
        t => {
            return err(
                CUDA_ERROR_INVALID_VALUE,
                format!("{call}: {what}MemoryType {t} is not a CUmemorytype"),
            );
        }
    };
    let start = base + (y * pitch + x) as u64;
    let len = if height == 0 || width == 0 {
        0
    } else {
        ((height - 1) * pitch + width) as u64
    };
    if len == 0 {
        return Ok(Side {
            addr: start,
            host: start,
            alloc: None,
        });
    }
    let s = check_range(call, what, start, len)?;
    // CUDA_MEMCPY2D: "If srcMemoryType is CU_MEMORYTYPE_HOST, srcHost and srcPitch
    // specify the (host) base address ... If srcMemoryType is CU_MEMORYTYPE_DEVICE,
    // srcDevice and srcPitch specify the (device) base address" (see [`check_kind`]).
    match mtype {
        CU_MEMORYTYPE_DEVICE => check_kind(call, &format!("{what}Device (CU_MEMORYTYPE_DEVICE)"), &s, Want::Device)?,
        CU_MEMORYTYPE_HOST => check_kind(call, &format!("{what}Host (CU_MEMORYTYPE_HOST)"), &s, Want::Host)?,
        _ => {}
    }
    Ok(s)
}

fn copy_2d(call: &'static str, p: *const CudaMemcpy2D, h: Handle, mode: HostSync) -> Result<()> {
    if p.is_null() {
        return null_arg("pCopy");
    }
    let s = match mode {
        HostSync::AsyncForm => stream::resolve(h)?,
        HostSync::SyncForm => context::current_ok()?.legacy(),
    };
    // SAFETY: non-null; the caller passes a valid CUDA_MEMCPY2D.
    let c = unsafe { p.read_unaligned() };
    let (w, ht) = (c.width_in_bytes, c.height);
    let src = side_2d(
        call,
        "src",
        c.src_memory_type,
        c.src_host as u64,
        c.src_device,
        c.src_x_in_bytes,
        c.src_y,
        c.src_pitch,
        w,
        ht,
    )?;
    let dst = side_2d(
        call,
        "dst",
        c.dst_memory_type,
        c.dst_host as u64,
        c.dst_device,
        c.dst_x_in_bytes,
        c.dst_y,
        c.dst_pitch,
        w,
        ht,
    )?;
    refuse_overlap(
        call,
        &dst,
        c.dst_pitch as u64,
        &src,
        c.src_pitch as u64,
        w as u64,
        ht as u64,
    )?;
    enqueue_copy(
        call,
        &s,
        dst,
        c.dst_pitch as u64,
        src,
        c.src_pitch as u64,
        w as u64,
        ht as u64,
        mode,
    )
}

/// `cuMemcpy2DAsync_v2`: "Perform a 2D memory copy according to the
/// parameters specified in pCopy ... cuMemcpy2DAsync() returns an error if any
/// pitch is greater than the maximum allowed (CU_DEVICE_ATTRIBUTE_MAX_PITCH)";
/// WidthInBytes + XInBytes must not exceed the pitch (`CUDA_ERROR_INVALID_VALUE`),
/// and source and destination rows must not share a byte ([`refuse_overlap`]).
/// CU_MEMORYTYPE_UNIFIED sides are resolved by unified addressing.
///
/// # Safety
///
/// `p` must be NULL or a valid CUDA_MEMCPY2D; host sides valid for the region.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const CudaMemcpy2D, h: Handle) -> CUresult {
    api("cuMemcpy2DAsync_v2", || {
        copy_2d("cuMemcpy2DAsync_v2", p, h, HostSync::AsyncForm)
    })
}

/// `cuMemcpy2D_v2` (synchronous form).
///
/// # Safety
///
/// As [`cuMemcpy2DAsync_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const CudaMemcpy2D) -> CUresult {
    api("cuMemcpy2D_v2", || {
        copy_2d("cuMemcpy2D_v2", p, std::ptr::null_mut(), HostSync::SyncForm)
    })
}

/// Device memory of `ctx`'s device for a peer copy.
fn peer_side(call: &str, what: &str, ptr: u64, n: u64, ctx: &Context) -> Result<Side> {
    let s = check_range(call, what, ptr, n)?;
    match s.alloc.as_ref().map(|a| a.kind) {
        Some(Kind::Device(d)) if d == ctx.device => Ok(s),
        _ => err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {what} {ptr:#x} is not device memory of device {}", ctx.device),
        ),
    }
}

/// `cuMemcpyPeer`: "Copies from device memory in one context to device memory
/// in another context ... Note that this function is asynchronous with
/// respect to the host, but serialized with respect to all pending and future
/// asynchronous work in to the current context, srcContext, and dstContext"
/// (group__CUDA__MEM). The emulator does it in place of the host: waits for
/// all work of the three contexts, copies, returns. Overlap is not checked:
/// neither this page nor the runtime's cudaMemcpyPeer / cudaMemcpyPeerAsync
/// says anything about it.
///
/// # Safety
///
/// Always safe (both ranges are checked); `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeer(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
) -> CUresult {
    api("cuMemcpyPeer", || {
        let cur = context::current_ok()?;
        let (dc, sc) = (context::from_handle(dst_ctx)?, context::from_handle(src_ctx)?);
        dc.check()?;
        sc.check()?;
        if n == 0 {
            return Ok(());
        }
        let d = peer_side("cuMemcpyPeer", "dstDevice", dst, n as u64, dc)?;
        let s = peer_side("cuMemcpyPeer", "srcDevice", src, n as u64, sc)?;
        // "serialized with respect to all pending ... asynchronous work":
        // streams destroyed with work still queued included (group__CUDA__STREAM).
        for c in [cur, dc, sc] {
            c.synchronize_host();
        }
        let e = race::host_epoch("cuMemcpyPeer");
        let acc = [
            Access {
                lo: src,
                hi: src + n as u64,
                write: false,
            },
            Access {
                lo: dst,
                hi: dst + n as u64,
                write: true,
            },
        ];
        if let Some(r) = race::record(&acc, &e) {
            cur.set_sticky(super::CUDA_ERROR_LAUNCH_FAILED, &r);
        }
        // SAFETY: both ranges checked against live allocations, all their work done.
        unsafe { std::ptr::copy(s.host as *const u8, d.host as *mut u8, n) };
        Ok(())
    })
}

/// `cuMemcpyPeerAsync`: the peer copy in stream order on `h` (overlap not
/// checked, as for [`cuMemcpyPeer`]).
///
/// # Safety
///
/// Always safe (both ranges are checked); `unsafe` for the C ABI.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyPeerAsync(
    dst: CUdeviceptr,
    dst_ctx: Handle,
    src: CUdeviceptr,
    src_ctx: Handle,
    n: usize,
    h: Handle,
) -> CUresult {
    api("cuMemcpyPeerAsync", || {
        let st = stream::resolve(h)?;
        let (dc, sc) = (context::from_handle(dst_ctx)?, context::from_handle(src_ctx)?);
        if n == 0 {
            return Ok(());
        }
        let d = peer_side("cuMemcpyPeerAsync", "dstDevice", dst, n as u64, dc)?;
        let s = peer_side("cuMemcpyPeerAsync", "srcDevice", src, n as u64, sc)?;
        enqueue_copy(
            "cuMemcpyPeerAsync",
            &st,
            d,
            n as u64,
            s,
            n as u64,
            n as u64,
            1,
            HostSync::AsyncForm,
        )
    })
}

/// Enqueues a memset of `n` elements of `width` bytes.
fn memset(call: &'static str, dst: u64, value: u32, width: u64, n: usize, h: Option<Handle>) -> Result<()> {
    let s = match h {
        Some(h) => stream::resolve(h)?,
        None => context::current_ok()?.legacy(),
    };
    if n == 0 {
        return Ok(());
    }
    if dst % width != 0 {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {dst:#x} is not aligned to {width} bytes"),
        );
    }
    let len = n as u64 * width;
    let side = check_range(call, "dstDevice", dst, len)?;
    if side.pageable() {
        return err(
            CUDA_ERROR_INVALID_VALUE,
            format!("{call}: {dst:#x} is not memory the driver allocated"),
        );
    }
    let host = side.host;
    let acc = vec![Access {
        lo: dst,
        hi: dst + len,
        write: true,
    }];
    let ticket = s.enqueue(
        call,
        None,
        Vec::new(),
        Box::new(move || {
            // SAFETY: [host, host + len) was checked against a live allocation.
            unsafe {
                match width {
                    1 => std::ptr::write_bytes(host as *mut u8, value as u8, n),
                    2 => std::slice::from_raw_parts_mut(host as *mut u16, n).fill(value as u16),
                    _ => std::slice::from_raw_parts_mut(host as *mut u32, n).fill(value),
                }
            }
            Ok(acc)
        }),
    );
    // api-sync-behavior, Memset: "The synchronous memset functions are
    // asynchronous with respect to the host except when the target is pinned
    // host memory or a Unified Memory region, in which case they are fully synchronous."
    if h.is_none() && side.alloc.as_ref().is_some_and(|a| !matches!(a.kind, Kind::Device(_))) {
        s.wait_for(&ticket);
        s.ctx.check()?;
    }
    Ok(())
}

macro_rules! memset_fns {
    ($( $name:ident, $sync:ident, $ty:ty, $width:expr; )*) => {$(
        /// `cuMemsetD*` (group__CUDA__MEM): sets `n` elements at `dst`; the
        /// range must lie in one allocation (`CUDA_ERROR_INVALID_VALUE`).
        ///
        /// # Safety
        ///
        /// Always safe (the range is checked); `unsafe` for the C ABI.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name(dst: CUdeviceptr, value: $ty, n: usize, h: Handle) -> CUresult {
            api(stringify!($name), || memset(stringify!($name), dst, value as u32, $width, n, Some(h)))
        }

        /// The synchronous form (legacy default stream).
        ///
        /// # Safety
        ///
        /// Always safe (the range is checked); `unsafe` for the C ABI.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $sync(dst: CUdeviceptr, value: $ty, n: usize) -> CUresult {
            api(stringify!($sync), || memset(stringify!($sync), dst, value as u32, $width, n, None))
        }
    )*};
}

memset_fns! {
    cuMemsetD8Async, cuMemsetD8_v2, u8, 1;
    cuMemsetD16Async, cuMemsetD16_v2, u16, 2;
    cuMemsetD32Async, cuMemsetD32_v2, u32, 4;
}

/// Live allocations (for tests and diagnostics): (base, size, kind).
pub fn live_allocations() -> Vec<(u64, u64, Kind)> {
    table()
        .values()
        .filter(|a| !a.is_freed())
        .map(|a| (a.base, a.size, a.kind))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::first_shared_byte;

    /// The bytes of `h` rows of `w` bytes from `lo`, `p` apart.
    fn bytes(lo: u64, p: u64, w: u64, h: u64) -> std::collections::BTreeSet<u64> {
        (0..h).flat_map(|r| lo + r * p..lo + r * p + w).collect()
    }

    #[test]
    fn first_shared_byte_is_byte_exact() {
        // Every small layout against a byte-by-byte answer: rows, not boxes.
        for w in 1..=4 {
            for h in 1..=4 {
                for pa in w..=w + 5 {
                    for pb in w..=w + 5 {
                        for b in 0..=24 {
                            let a = 8;
                            let want = bytes(a, pa, w, h).intersection(&bytes(b, pb, w, h)).next().copied();
                            let got = first_shared_byte(a, pa, b, pb, w, h);
                            assert_eq!(got, want, "a={a} pa={pa} b={b} pb={pb} w={w} h={h}");
                        }
                    }
                }
            }
        }
        assert_eq!(first_shared_byte(0, 4, 0, 4, 0, 3), None, "no bytes");
        assert_eq!(first_shared_byte(0, 4, 0, 4, 4, 0), None, "no rows");
    }
}
