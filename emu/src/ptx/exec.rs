//! Warp-lockstep execution. A warp's 32 lanes run together; each live lane has
//! a PC and, at every step, the lanes at the minimum PC execute (a divergent
//! branch splits the warp, the lanes meet again when their PCs do). Warps of a
//! block run one after the other up to `bar.sync`, where the block waits until
//! every warp with live threads has arrived. Blocks are spread over host threads.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU16, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::ir::{Init, Inst, Mem, NO_GUARD, Op, SHARED_WINDOW, Space, Special};
use super::metrics::{RangeSet, bank_conflicts, first_overlap, sectors, used_bytes};
use super::{Access, FaultKind, Kernel, KernelError, Launch, LaunchStats};

const NONE: u32 = u32::MAX;
const MANY: u32 = u32::MAX - 1;

/// Shadow state of one shared-memory byte for the race check: the accesses since
/// the last barrier (`epoch`).
#[derive(Clone, Copy)]
struct Shadow {
    epoch: u32,
    writer: u32,
    reader: u32,
}

#[derive(Clone, Copy)]
struct Warp {
    /// The PC the lanes in `mask` are at (the minimum of the live lanes' PCs).
    pc: u32,
    mask: u32,
    live: u32,
    /// PCs of live lanes not in `mask`.
    lane_pc: [u32; 32],
    at_bar: bool,
}

/// What one host thread needs to run blocks.
struct Worker<'k, 'l> {
    k: &'k Kernel,
    launch: &'l Launch<'l>,
    nwarps: usize,
    nthreads: u32,
    regs: Vec<[u64; 32]>,
    warps: Vec<Warp>,
    shared: Vec<u8>,
    shadow: Vec<Shadow>,
    epoch: u32,
    ctaid: [u32; 3],
    stats: LaunchStats,
    reads: RangeSet,
    nc_reads: RangeSet,
    writes: RangeSet,
}

pub fn run(k: &Kernel, launch: &Launch<'_>) -> Result<LaunchStats, KernelError> {
    let [gx, gy, gz] = launch.grid;
    let nblocks = gx as u64 * gy as u64 * gz as u64;
    let nthreads = launch.block[0] as u64 * launch.block[1] as u64 * launch.block[2] as u64;
    if nblocks == 0 || nthreads == 0 {
        return Ok(LaunchStats::default());
    }
    if nthreads > 1024 {
        return Err(KernelError {
            kind: FaultKind::IllegalInstruction,
            message: format!("kernel `{}`: block of {nthreads} threads (more than 1024)", k.name),
        });
    }
    let nworkers = launch.threads.max(1).min(nblocks.min(usize::MAX as u64) as usize);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    // The fault of the lowest-numbered faulting block, whichever worker met it
    // first: blocks are handed out in order and each runs to its end, so every
    // block below a faulting one runs, and the report is the same on every run.
    let first_err: Mutex<Option<(u64, KernelError)>> = Mutex::new(None);
    let total: Mutex<(LaunchStats, RangeSet, RangeSet, RangeSet)> = Mutex::default();
    let work = || {
        let mut w = Worker::new(k, launch, nthreads as u32);
        loop {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let b = next.fetch_add(1, Ordering::Relaxed) as u64;
            if b >= nblocks {
                break;
            }
            let ctaid = [
                (b % gx as u64) as u32,
                ((b / gx as u64) % gy as u64) as u32,
                (b / (gx as u64 * gy as u64)) as u32,
            ];
            if let Err(e) = w.run_block(ctaid) {
                stop.store(true, Ordering::Relaxed);
                let mut fe = first_err.lock().unwrap_or_else(|p| p.into_inner());
                if fe.as_ref().is_none_or(|(first, _)| b < *first) {
                    *fe = Some((b, e));
                }
                break;
            }
        }
        w.reads.compact();
        w.nc_reads.compact();
        w.writes.compact();
        let mut t = total.lock().unwrap_or_else(|p| p.into_inner());
        add_stats(&mut t.0, &w.stats);
        t.1.extend(&w.reads);
        t.2.extend(&w.nc_reads);
        t.3.extend(&w.writes);
    };
    if nworkers == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..nworkers {
                s.spawn(work);
            }
        });
    }
    if let Some((_, e)) = first_err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    let (mut stats, mut reads, mut nc, mut writes) = total.into_inner().unwrap_or_else(|p| p.into_inner());
    let nc_r = nc.ranges().to_vec();
    let wr = writes.ranges().to_vec();
    if let Some((lo, hi)) = first_overlap(&nc_r, &wr) {
        return Err(KernelError {
            kind: FaultKind::NcReadOfWritten,
            message: format!(
                "kernel `{}`: NcReadOfWritten: bytes [{lo:#x}, {hi:#x}) are read with ld.global.nc (read-only, \
                 non-coherent cache) and written by the same launch",
                k.name
            ),
        });
    }
    for &(lo, hi) in &nc_r {
        reads.push(lo, hi);
    }
    stats.footprint = reads
        .ranges()
        .iter()
        .map(|&(lo, hi)| Access { lo, hi, write: false })
        .collect();
    stats
        .footprint
        .extend(wr.iter().map(|&(lo, hi)| Access { lo, hi, write: true }));
    Ok(stats)
}

fn add_stats(t: &mut LaunchStats, s: &LaunchStats) {
    t.warp_instructions += s.warp_instructions;
    t.lane_instructions += s.lane_instructions;
    t.global_load_requests += s.global_load_requests;
    t.global_store_requests += s.global_store_requests;
    t.global_load_sectors += s.global_load_sectors;
    t.global_store_sectors += s.global_store_sectors;
    t.global_load_bytes += s.global_load_bytes;
    t.global_store_bytes += s.global_store_bytes;
    t.shared_requests += s.shared_requests;
    t.shared_bank_conflicts += s.shared_bank_conflicts;
}

#[inline(always)]
fn pred_mask(r: &[u64; 32]) -> u32 {
    let mut m = 0u32;
    for (l, v) in r.iter().enumerate() {
        m |= ((*v & 1) as u32) << l;
    }
    m
}

/// The minimum PC among `live` lanes and the lanes at it.
fn regroup(lane_pc: &[u32; 32], live: u32) -> (u32, u32) {
    let mut best = u32::MAX;
    let mut m = 0;
    for (l, &p) in lane_pc.iter().enumerate() {
        if (live >> l) & 1 != 0 {
            if p < best {
                best = p;
                m = 1 << l;
            } else if p == best {
                m |= 1 << l;
            }
        }
    }
    (best, m)
}

/// Reads `w` bytes (1, 2, 4, 8) at `p`, little-endian.
///
/// # Safety
/// `p` must be valid for reading `w` bytes.
#[inline(always)]
unsafe fn read_raw(p: *mut u8, w: u8) -> u64 {
    // Aligned accesses use relaxed atomics (plain moves on x86-64 and AArch64) so
    // that blocks running on other host threads may touch the same memory
    // without a Rust data race; a kernel's own races stay its business.
    // SAFETY: the caller guarantees `p` is valid for `w` bytes; the atomic views
    // are only taken when `p` is aligned to `w`.
    unsafe {
        match w {
            1 => AtomicU8::from_ptr(p).load(Ordering::Relaxed) as u64,
            2 if (p as usize) % 2 == 0 => AtomicU16::from_ptr(p.cast()).load(Ordering::Relaxed) as u64,
            4 if (p as usize) % 4 == 0 => AtomicU32::from_ptr(p.cast()).load(Ordering::Relaxed) as u64,
            8 if (p as usize) % 8 == 0 => AtomicU64::from_ptr(p.cast()).load(Ordering::Relaxed),
            _ => {
                let mut b = [0u8; 8];
                std::ptr::copy_nonoverlapping(p, b.as_mut_ptr(), w as usize);
                u64::from_le_bytes(b)
            }
        }
    }
}

/// Writes the low `w` bytes of `v` at `p`.
///
/// # Safety
/// `p` must be valid for writing `w` bytes.
#[inline(always)]
unsafe fn write_raw(p: *mut u8, w: u8, v: u64) {
    // SAFETY: as in `read_raw`.
    unsafe {
        match w {
            1 => AtomicU8::from_ptr(p).store(v as u8, Ordering::Relaxed),
            2 if (p as usize) % 2 == 0 => AtomicU16::from_ptr(p.cast()).store(v as u16, Ordering::Relaxed),
            4 if (p as usize) % 4 == 0 => AtomicU32::from_ptr(p.cast()).store(v as u32, Ordering::Relaxed),
            8 if (p as usize) % 8 == 0 => AtomicU64::from_ptr(p.cast()).store(v, Ordering::Relaxed),
            _ => {
                let b = v.to_le_bytes();
                std::ptr::copy_nonoverlapping(b.as_ptr(), p, w as usize);
            }
        }
    }
}

/// A loaded element, sign- or zero-extended and truncated to the destination register.
#[inline(always)]
fn extend(v: u64, m: &Mem) -> u64 {
    let bits = m.w as u32 * 8;
    let v = if m.signed && bits < 64 {
        (((v << (64 - bits)) as i64) >> (64 - bits)) as u64
    } else {
        v
    };
    if m.dbits >= 64 { v } else { v & ((1u64 << m.dbits) - 1) }
}

struct Fault {
    lane: usize,
    kind: FaultKind,
    addr: Option<u64>,
    detail: String,
}

impl<'k, 'l> Worker<'k, 'l> {
    fn new(k: &'k Kernel, launch: &'l Launch<'l>, nthreads: u32) -> Self {
        let nwarps = nthreads.div_ceil(32) as usize;
        let nregs = k.body.nregs;
        let mut regs = vec![[0u64; 32]; nregs * nwarps];
        for w in 0..nwarps {
            for &(r, init) in &k.body.init {
                if let Init::Const(v) = init {
                    regs[w * nregs + r as usize] = [v; 32];
                }
            }
        }
        let shared_bytes = k.shared_bytes;
        Worker {
            k,
            launch,
            nwarps,
            nthreads,
            regs,
            warps: vec![
                Warp {
                    pc: 0,
                    mask: 0,
                    live: 0,
                    lane_pc: [0; 32],
                    at_bar: false
                };
                nwarps
            ],
            shared: vec![0xA5; shared_bytes],
            shadow: vec![
                Shadow {
                    epoch: 0,
                    writer: NONE,
                    reader: NONE
                };
                shared_bytes
            ],
            epoch: 0,
            ctaid: [0; 3],
            stats: LaunchStats::default(),
            reads: RangeSet::default(),
            nc_reads: RangeSet::default(),
            writes: RangeSet::default(),
        }
    }

    fn tid(&self, t: u32) -> [u32; 3] {
        let [bx, by, _] = self.launch.block;
        [t % bx, (t / bx) % by, t / (bx * by)]
    }

    fn run_block(&mut self, ctaid: [u32; 3]) -> Result<(), KernelError> {
        self.ctaid = ctaid;
        // Shared memory is not initialised on a GPU: a poison pattern makes reads
        // of unwritten bytes visible.
        self.shared.fill(0xA5);
        self.epoch = self.epoch.wrapping_add(1);
        let nregs = self.k.body.nregs;
        for w in 0..self.nwarps {
            let first = w as u32 * 32;
            let n = (self.nthreads - first).min(32);
            let live = if n == 32 { u32::MAX } else { (1u32 << n) - 1 };
            self.warps[w] = Warp {
                pc: 0,
                mask: live,
                live,
                lane_pc: [0; 32],
                at_bar: false,
            };
            for &(r, init) in &self.k.body.init {
                let Init::Special(sp) = init else { continue };
                let v: [u64; 32] = std::array::from_fn(|l| {
                    let t = first + l as u32;
                    (match sp {
                        Special::Tid(d) => self.tid(t)[d as usize],
                        Special::Ntid(d) => self.launch.block[d as usize],
                        Special::Ctaid(d) => ctaid[d as usize],
                        Special::Nctaid(d) => self.launch.grid[d as usize],
                        Special::LaneId => l as u32,
                        Special::WarpId => w as u32,
                        Special::NWarpId => self.nwarps as u32,
                    }) as u64
                });
                self.regs[w * nregs + r as usize] = v;
            }
        }
        loop {
            for w in 0..self.nwarps {
                if self.warps[w].live != 0 && !self.warps[w].at_bar {
                    self.run_warp(w)?;
                }
            }
            let mut waiting = false;
            for wp in self.warps.iter_mut() {
                if wp.at_bar {
                    wp.at_bar = false;
                    waiting |= wp.live != 0;
                }
            }
            if !waiting {
                return Ok(());
            }
            // A new barrier interval for the shared-memory race check.
            self.epoch = self.epoch.wrapping_add(1);
        }
    }

    fn error(&self, w: usize, inst: &Inst, f: Fault) -> KernelError {
        let t = w as u32 * 32 + f.lane as u32;
        let [tx, ty, tz] = self.tid(t);
        let [bx, by, bz] = self.ctaid;
        let (line, text) = &self.k.body.lines[inst.src as usize];
        let addr = f.addr.map(|a| format!(" address {a:#x}:")).unwrap_or_default();
        KernelError {
            kind: f.kind,
            message: format!(
                "kernel `{}`: {:?} in block ({bx},{by},{bz}) thread ({tx},{ty},{tz}) at PTX line {line} `{text}`:{addr} {}",
                self.k.name, f.kind, f.detail
            ),
        }
    }

    fn run_warp(&mut self, w: usize) -> Result<(), KernelError> {
        let nregs = self.k.body.nregs;
        let code = &self.k.body.code;
        let mut st = self.warps[w];
        let mut warp_inst = 0u64;
        let mut lane_inst = 0u64;
        let result = loop {
            let inst = &code[st.pc as usize];
            let regs = &mut self.regs[w * nregs..(w + 1) * nregs];
            let em = if inst.guard == NO_GUARD {
                st.mask
            } else {
                let pm = pred_mask(&regs[inst.guard as usize]);
                if inst.gneg { st.mask & !pm } else { st.mask & pm }
            };
            warp_inst += 1;
            lane_inst += em.count_ones() as u64;
            let next = st.pc + 1;
            match inst.op {
                Op::Alu { f, o } => {
                    if em != 0 {
                        f(regs, em, &o);
                    }
                }
                Op::Ld(m) => {
                    if em != 0 {
                        if let Err(f) = self.mem(w, &m, em, true) {
                            break Err(self.error(w, inst, f));
                        }
                    }
                }
                Op::St(m) => {
                    if em != 0 {
                        if let Err(f) = self.mem(w, &m, em, false) {
                            break Err(self.error(w, inst, f));
                        }
                    }
                }
                Op::Bra(t) => {
                    if em == st.mask {
                        st.pc = t;
                        if st.mask != st.live {
                            for l in 0..32 {
                                if (st.mask >> l) & 1 != 0 {
                                    st.lane_pc[l] = t;
                                }
                            }
                            (st.pc, st.mask) = regroup(&st.lane_pc, st.live);
                        }
                        continue;
                    } else if em != 0 {
                        // Divergence: the taken lanes go to `t`, the others fall through.
                        for l in 0..32 {
                            if (st.mask >> l) & 1 != 0 {
                                st.lane_pc[l] = if (em >> l) & 1 != 0 { t } else { next };
                            }
                        }
                        (st.pc, st.mask) = regroup(&st.lane_pc, st.live);
                        continue;
                    }
                }
                Op::Bar => {
                    if st.mask != st.live || em != st.mask {
                        let waiting = em;
                        let lane = (st.live & !waiting).trailing_zeros() as usize;
                        let other = if (st.mask >> lane) & 1 != 0 {
                            "is predicated off at it".to_string()
                        } else {
                            format!(
                                "is at PTX line {}",
                                self.k.body.lines[code[st.lane_pc[lane] as usize].src as usize].0
                            )
                        };
                        break Err(self.error(
                            w,
                            inst,
                            Fault {
                                lane,
                                kind: FaultKind::DivergentBarrier,
                                addr: None,
                                detail: format!(
                                    "bar.sync reached by lanes {waiting:#010x} of the warp's live lanes {:#010x}; this \
                                     thread {other}",
                                    st.live
                                ),
                            },
                        ));
                    }
                    st.pc = next;
                    st.at_bar = true;
                    break Ok(());
                }
                Op::Exit => {
                    st.live &= !em;
                    st.mask &= !em;
                    if st.live == 0 {
                        break Ok(());
                    }
                    if st.mask == 0 {
                        (st.pc, st.mask) = regroup(&st.lane_pc, st.live);
                        continue;
                    }
                }
            }
            // Fall through to the next instruction.
            st.pc = next;
            if st.mask != st.live {
                for l in 0..32 {
                    if (st.mask >> l) & 1 != 0 {
                        st.lane_pc[l] = next;
                    }
                }
                (st.pc, st.mask) = regroup(&st.lane_pc, st.live);
            }
        };
        self.warps[w] = st;
        self.stats.warp_instructions += warp_inst;
        self.stats.lane_instructions += lane_inst;
        result
    }

    fn mem(&mut self, w: usize, m: &Mem, em: u32, load: bool) -> Result<(), Fault> {
        let nregs = self.k.body.nregs;
        let base = self.regs[w * nregs + m.base as usize];
        let size = m.w as u64 * m.n as u64;
        let mut addr = [0u64; 32];
        for l in 0..32 {
            addr[l] = base[l].wrapping_add(m.off as u64);
        }
        // Every access must be aligned to its full (vector) size (PTX ISA §5.4.5
        // "Vectors" and §9.7.9.8 ld: "the address must be naturally aligned").
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            if addr[l] % size != 0 {
                return Err(Fault {
                    lane: l,
                    kind: FaultKind::Misaligned,
                    addr: Some(addr[l]),
                    detail: format!("{size}-byte access not aligned to {size} bytes"),
                });
            }
        }
        match m.space {
            Space::Param => self.param(w, m, em, &addr, load),
            Space::Shared => self.shared(w, m, em, &addr, load),
            Space::Global | Space::GlobalNc => self.global(w, m, em, &addr, load),
            Space::Generic => {
                let mut all_shared = true;
                let mut mm = em;
                while mm != 0 {
                    let l = mm.trailing_zeros() as usize;
                    mm &= mm - 1;
                    all_shared &= addr[l].wrapping_sub(SHARED_WINDOW) < (1u64 << 32);
                }
                if all_shared {
                    for a in addr.iter_mut() {
                        *a = a.wrapping_sub(SHARED_WINDOW);
                    }
                    self.shared(w, m, em, &addr, load)
                } else {
                    self.global(w, m, em, &addr, load)
                }
            }
        }
    }

    fn param(&mut self, w: usize, m: &Mem, em: u32, addr: &[u64; 32], load: bool) -> Result<(), Fault> {
        debug_assert!(load);
        let nregs = self.k.body.nregs;
        let p = self.launch.params;
        let size = m.w as u64 * m.n as u64;
        // Fast path: one address for all lanes (a parameter read by name, or through
        // a register holding a parameter's address, as in the kernels' dims loops).
        let first = addr[em.trailing_zeros() as usize];
        let mut uniform = true;
        for (l, &a) in addr.iter().enumerate() {
            uniform &= (em >> l) & 1 == 0 || a == first;
        }
        if uniform && first.checked_add(size).is_some_and(|e| e <= p.len() as u64) {
            for k in 0..m.n as usize {
                let o = first as usize + k * m.w as usize;
                let mut b = [0u8; 8];
                b[..m.w as usize].copy_from_slice(&p[o..o + m.w as usize]);
                let v = extend(u64::from_le_bytes(b), m);
                let r = &mut self.regs[w * nregs + m.regs[k] as usize];
                for (l, x) in r.iter_mut().enumerate() {
                    if (em >> l) & 1 != 0 {
                        *x = v;
                    }
                }
            }
            return Ok(());
        }
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            let a = addr[l];
            if a.checked_add(size).is_none_or(|e| e > p.len() as u64) {
                return Err(Fault {
                    lane: l,
                    kind: FaultKind::OutOfBounds,
                    addr: Some(a),
                    detail: format!("ld.param outside the {}-byte parameter buffer", p.len()),
                });
            }
            for k in 0..m.n as usize {
                let o = a as usize + k * m.w as usize;
                let mut b = [0u8; 8];
                b[..m.w as usize].copy_from_slice(&p[o..o + m.w as usize]);
                self.regs[w * nregs + m.regs[k] as usize][l] = extend(u64::from_le_bytes(b), m);
            }
        }
        Ok(())
    }

    fn shared(&mut self, w: usize, m: &Mem, em: u32, addr: &[u64; 32], load: bool) -> Result<(), Fault> {
        let nregs = self.k.body.nregs;
        let size = m.w as u64 * m.n as u64;
        let len = self.shared.len() as u64;
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            let a = addr[l];
            if a.checked_add(size).is_none_or(|e| e > len) {
                return Err(Fault {
                    lane: l,
                    kind: FaultKind::SharedOutOfBounds,
                    addr: Some(a),
                    detail: format!(
                        "{size}-byte shared access outside the block's {len} bytes of static shared memory"
                    ),
                });
            }
        }
        self.stats.shared_requests += 1;
        self.stats.shared_bank_conflicts += bank_conflicts(addr, em, size as u32);
        // Race check: conflicting accesses of two threads to one byte in the same
        // barrier interval (what compute-sanitizer's racecheck reports).
        let epoch = self.epoch;
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            let t = w as u32 * 32 + l as u32;
            for b in addr[l]..addr[l] + size {
                let s = &mut self.shadow[b as usize];
                if s.epoch != epoch {
                    *s = Shadow {
                        epoch,
                        writer: NONE,
                        reader: NONE,
                    };
                }
                let conflict = if s.writer != NONE && s.writer != t {
                    Some((s.writer, "written"))
                } else if !load && s.reader != NONE && s.reader != t {
                    Some((s.reader, "read"))
                } else {
                    None
                };
                if let Some((other, how)) = conflict {
                    let who = if other == MANY {
                        "several other threads".to_string()
                    } else {
                        let [x, y, z] = self.tid(other);
                        format!("thread ({x},{y},{z})")
                    };
                    return Err(Fault {
                        lane: l,
                        kind: FaultKind::SharedRace,
                        addr: Some(b),
                        detail: format!(
                            "shared byte {b:#x} {} here was {how} by {who} since the last barrier (no bar.sync between)",
                            if load { "read" } else { "written" }
                        ),
                    });
                }
                if load {
                    s.reader = if s.reader == NONE || s.reader == t { t } else { MANY };
                } else {
                    s.writer = t;
                }
            }
        }
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            for k in 0..m.n as usize {
                let o = addr[l] as usize + k * m.w as usize;
                let r = &mut self.regs[w * nregs + m.regs[k] as usize];
                let bytes = &mut self.shared[o..o + m.w as usize];
                if load {
                    let mut b = [0u8; 8];
                    b[..m.w as usize].copy_from_slice(bytes);
                    r[l] = extend(u64::from_le_bytes(b), m);
                } else {
                    bytes.copy_from_slice(&r[l].to_le_bytes()[..m.w as usize]);
                }
            }
        }
        Ok(())
    }

    fn global(&mut self, w: usize, m: &Mem, em: u32, addr: &[u64; 32], load: bool) -> Result<(), Fault> {
        let nregs = self.k.body.nregs;
        let size = m.w as u64 * m.n as u64;
        let mem = self.launch.memory;
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            lo = lo.min(addr[l]);
            hi = hi.max(addr[l]);
        }
        let span = hi - lo + size;
        let whole = if span <= u32::MAX as u64 {
            mem.resolve(lo, span as u32, !load).ok()
        } else {
            None
        };
        let mut ptrs = [std::ptr::null_mut::<u8>(); 32];
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            ptrs[l] = match whole {
                // SAFETY: `addr[l] - lo + size <= span`, and `p` is valid for `span` bytes.
                Some(p) => unsafe { p.add((addr[l] - lo) as usize) },
                None => match mem.resolve(addr[l], size as u32, !load) {
                    Ok(p) => p,
                    Err(f) => {
                        return Err(Fault {
                            lane: l,
                            kind: f.kind,
                            addr: Some(addr[l]),
                            detail: f.detail,
                        });
                    }
                },
            };
        }
        let sec = sectors(addr, em);
        let bytes = used_bytes(addr, em, size);
        if load {
            self.stats.global_load_requests += 1;
            self.stats.global_load_sectors += sec;
            self.stats.global_load_bytes += bytes;
        } else {
            self.stats.global_store_requests += 1;
            self.stats.global_store_sectors += sec;
            self.stats.global_store_bytes += bytes;
        }
        let set = match (load, m.space) {
            (false, _) => &mut self.writes,
            (true, Space::GlobalNc) => &mut self.nc_reads,
            _ => &mut self.reads,
        };
        let mut mm = em;
        while mm != 0 {
            let l = mm.trailing_zeros() as usize;
            mm &= mm - 1;
            set.push(addr[l], addr[l] + size);
        }
        let regs = &mut self.regs[w * nregs..(w + 1) * nregs];
        for k in 0..m.n as usize {
            let r = m.regs[k] as usize;
            let off = k * m.w as usize;
            let mut mm = em;
            while mm != 0 {
                let l = mm.trailing_zeros() as usize;
                mm &= mm - 1;
                // SAFETY: `ptrs[l]` is valid for `size` bytes (from `resolve`) and
                // `off + w <= size`.
                unsafe {
                    let p = ptrs[l].add(off);
                    if load {
                        regs[r][l] = extend(read_raw(p, m.w), m);
                    } else {
                        write_raw(p, m.w, regs[r][l]);
                    }
                }
            }
        }
        Ok(())
    }
}
