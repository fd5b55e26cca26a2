//! Helpers of the PTX interpreter's tests: a global memory over host vectors,
//! parameter buffers, and launching a kernel of a PTX text.
#![allow(dead_code)]

use std::cell::UnsafeCell;

use devtensor_emu::ptx::{self, Fault, FaultKind, GlobalMemory, Kernel, KernelError, Launch, LaunchStats};

/// (device address, backing words, length in bytes)
type Alloc = (u64, Box<[UnsafeCell<u64>]>, usize);

/// Allocations at fixed, widely separated device addresses, backed by vectors.
pub struct TestMem {
    allocs: Vec<Alloc>,
}

// SAFETY: the cells are only accessed through raw pointers handed out by
// `resolve` (the interpreter's relaxed atomic accesses) and by `read`/`write`,
// which tests call while no launch runs.
unsafe impl Sync for TestMem {}

pub const BASE: u64 = 0x7_0000_0000;
pub const STRIDE: u64 = 0x1_0000_0000;

impl TestMem {
    pub fn new() -> Self {
        TestMem { allocs: Vec::new() }
    }

    /// A new allocation of `len` bytes filled with `fill`; returns its address.
    pub fn alloc(&mut self, len: usize, fill: u8) -> u64 {
        let words = len.div_ceil(8).max(1);
        let cells: Box<[UnsafeCell<u64>]> = (0..words)
            .map(|_| UnsafeCell::new(u64::from_ne_bytes([fill; 8])))
            .collect();
        let va = BASE + STRIDE * self.allocs.len() as u64;
        self.allocs.push((va, cells, len));
        va
    }

    pub fn alloc_with(&mut self, data: &[u8]) -> u64 {
        let va = self.alloc(data.len(), 0);
        self.write(va, data);
        va
    }

    fn find(&self, addr: u64) -> Option<&Alloc> {
        // Each allocation owns a STRIDE-sized window: past its end is out of bounds, not unallocated.
        self.allocs.iter().find(|(b, _, _)| addr >= *b && addr < *b + STRIDE)
    }

    pub fn read(&self, va: u64, len: usize) -> Vec<u8> {
        let (b, cells, _) = self.find(va).expect("allocation");
        let p = cells.as_ptr() as *const u8;
        // SAFETY: in bounds of the allocation (checked by the slice below) and no launch runs.
        let all = unsafe { std::slice::from_raw_parts(p, cells.len() * 8) };
        all[(va - b) as usize..(va - b) as usize + len].to_vec()
    }

    pub fn write(&mut self, va: u64, data: &[u8]) {
        let (b, cells, _) = self.find(va).expect("allocation");
        let p = cells.as_ptr() as *mut u8;
        // SAFETY: `&mut self`: nothing else accesses the cells.
        let all = unsafe { std::slice::from_raw_parts_mut(p, cells.len() * 8) };
        all[(va - b) as usize..(va - b) as usize + data.len()].copy_from_slice(data);
    }
}

impl GlobalMemory for TestMem {
    fn resolve(&self, addr: u64, len: u32, _write: bool) -> Result<*mut u8, Fault> {
        match self.find(addr) {
            None => Err(Fault {
                kind: FaultKind::Unallocated,
                detail: format!("{addr:#x} is in no allocation"),
            }),
            Some((b, cells, n)) => {
                if addr + len as u64 > b + *n as u64 {
                    return Err(Fault {
                        kind: FaultKind::OutOfBounds,
                        detail: format!(
                            "{len} bytes at {addr:#x} past the end of [{b:#x}, {:#x})",
                            b + *n as u64
                        ),
                    });
                }
                // SAFETY: `addr - b < n <= cells.len() * 8`.
                Ok(unsafe { (cells.as_ptr() as *mut u8).add((addr - b) as usize) })
            }
        }
    }
}

/// A parameter buffer: each value at its parameter's offset.
pub fn params(k: &Kernel, vals: &[&[u8]]) -> Vec<u8> {
    assert_eq!(k.params.len(), vals.len(), "parameter count of {}", k.name);
    let mut buf = vec![0u8; k.param_bytes];
    for (p, v) in k.params.iter().zip(vals) {
        assert_eq!(p.size, v.len(), "size of parameter {} of {}", p.name, k.name);
        buf[p.offset..p.offset + p.size].copy_from_slice(v);
    }
    buf
}

pub fn launch(
    k: &Kernel,
    mem: &TestMem,
    grid: [u32; 3],
    block: [u32; 3],
    params: &[u8],
    threads: usize,
) -> Result<LaunchStats, KernelError> {
    ptx::run(
        k,
        &Launch {
            grid,
            block,
            params,
            memory: mem,
            threads,
        },
    )
}

/// Parses `text` and returns its only (or named) kernel.
pub fn kernel(text: &str, name: &str) -> Kernel {
    let m = ptx::parse(text).unwrap_or_else(|e| panic!("{e}"));
    m.kernel(name).unwrap_or_else(|| panic!("no kernel {name}")).clone()
}

pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ptx")
}

/// Every fixture whose file name starts with `stem`: (file name, text).
pub fn fixtures(stem: &str) -> Vec<(String, String)> {
    let mut v: Vec<_> = std::fs::read_dir(fixtures_dir())
        .expect("fixtures dir")
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "ptx") && p.file_name().unwrap().to_str().unwrap().starts_with(stem)
        })
        .map(|p| {
            (
                p.file_name().unwrap().to_str().unwrap().to_string(),
                std::fs::read_to_string(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no fixtures {stem}*");
    v
}

/// Deterministic bytes.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
