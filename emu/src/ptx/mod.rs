//! The PTX interpreter: a strict parser, a decoded IR and warp-lockstep
//! execution. It knows nothing of the driver: global memory is reached through
//! [`GlobalMemory`], which the driver implements over its allocation table.

use std::fmt;

/// One `.param` of a kernel entry, as declared in the PTX.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    pub offset: usize,
    pub size: usize,
    pub align: usize,
}

/// A parse failure: the line (1-based), its text and why it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub text: String,
    pub reason: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PTX line {}: {}: `{}`", self.line, self.reason, self.text.trim())
    }
}

impl std::error::Error for ParseError {}

/// Why a memory access or a kernel faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// Past the end (or before the start) of a live allocation.
    OutOfBounds,
    /// Inside an allocation that was freed.
    Freed,
    /// Not inside any allocation.
    Unallocated,
    /// Pageable host memory (the model has no pageable memory access).
    PageableHost,
    /// Another device's memory without peer access enabled.
    NoPeerAccess,
    /// Address not a multiple of the access width.
    Misaligned,
    /// Outside the kernel's static shared memory.
    SharedOutOfBounds,
    /// Two threads of a block accessed the same shared bytes between barriers, one writing.
    SharedRace,
    /// `bar.sync` reached by part of a warp's live threads.
    DivergentBarrier,
    /// `ld.global.nc` of bytes the same launch writes.
    NcReadOfWritten,
    /// An instruction the interpreter cannot execute with these operands (e.g. division trap).
    IllegalInstruction,
}

/// A global/generic memory access the driver refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// What the driver knows of the address (allocation, its bounds, when freed).
    pub detail: String,
}

/// A kernel that faulted: the kind and a message naming the kernel, block,
/// thread, PTX line and address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    pub kind: FaultKind,
    pub message: String,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KernelError {}

/// Implemented by the driver over its allocation table.
pub trait GlobalMemory: Sync {
    /// Checks an access of `len` bytes at `addr` (a device address or the host
    /// pointer of pinned/managed memory) and returns a host pointer valid for
    /// `len` bytes of reading (and writing when `write`).
    fn resolve(&self, addr: u64, len: u32, write: bool) -> Result<*mut u8, Fault>;
}

/// One merged byte range a launch touched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    pub lo: u64,
    pub hi: u64,
    pub write: bool,
}

/// Per-launch counters, named as Nsight Compute names them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LaunchStats {
    pub warp_instructions: u64,
    pub lane_instructions: u64,
    pub global_load_requests: u64,
    pub global_store_requests: u64,
    /// 32-byte sectors the requests touched.
    pub global_load_sectors: u64,
    pub global_store_sectors: u64,
    /// Bytes the lanes used, each byte once per request (sector efficiency =
    /// bytes / (sectors * 32), as Nsight Compute's sector utilisation).
    pub global_load_bytes: u64,
    pub global_store_bytes: u64,
    pub shared_requests: u64,
    /// Extra shared-memory wavefronts caused by bank conflicts.
    pub shared_bank_conflicts: u64,
    /// Merged byte ranges read and written, for the driver's race detector.
    pub footprint: Vec<Access>,
}

/// A launch's shape and inputs.
pub struct Launch<'a> {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// The parameter buffer, laid out per [`Kernel::params`].
    pub params: &'a [u8],
    pub memory: &'a dyn GlobalMemory,
    /// Host threads the blocks are spread over.
    pub threads: usize,
}

mod exec;
pub mod float;
pub mod ir;
mod lex;
mod metrics;
mod ops;
mod parse;

/// A parsed PTX module: its kernels (`.entry`).
#[derive(Debug, Clone)]
pub struct Module {
    pub kernels: Vec<Kernel>,
}

impl Module {
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// One kernel: its parameters, static shared memory and decoded body.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub name: String,
    pub params: Vec<ParamInfo>,
    /// Size of the parameter buffer (end of the last parameter).
    pub param_bytes: usize,
    /// Static `.shared` bytes.
    pub shared_bytes: usize,
    /// `.maxntid` / `.reqntid` if declared (missing dimensions are 1).
    pub maxntid: Option<[u32; 3]>,
    pub reqntid: Option<[u32; 3]>,
    pub body: ir::Body,
}

/// Parses PTX text; any directive or instruction form the interpreter does not
/// support is an error naming its line.
pub fn parse(text: &str) -> Result<Module, ParseError> {
    parse::parse(text)
}

/// Runs a kernel to completion over the launch's grid.
pub fn run(kernel: &Kernel, launch: &Launch<'_>) -> Result<LaunchStats, KernelError> {
    exec::run(kernel, launch)
}
