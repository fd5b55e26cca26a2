//! GPU copies and fills of tensors, written once for every GPU runtime over
//! [`GpuRuntime`]: planned on the host by the shared planner, then one DMA or
//! one kernel launch. Host↔device copies of contiguous pageable memory are one
//! DMA (the driver stages it); other pageable or strided host views go through
//! a bounded, reused ring of pinned chunks (`staging_mb` in
//! `DEVTENSOR_ALLOC_CONF`): the CPU gathers (scatters) one chunk while the DMA
//! of the other runs, and the GPU permutes. Copies between GPUs run on a stream
//! with peer access where the devices allow it, ordered with both GPUs' work by
//! events.

use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use super::Tensor;
use crate::backend::gpu_runtime::{GpuEvent, GpuRuntime, GpuStream, run_plan, try_memcpy_2d};
use crate::backend::launch::{fill_call, split_for_32bit};
use crate::copy::plan::{BaseAddrs, CopyPlan, PlanKind, PlanOptions, plan_copy, plan_fill};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout;

/// The GPU work on located memory runs on: its own GPU, or for memory of no
/// GPU (pinned host memory, `None`) the calling thread's current device (see
/// [`crate::backend::current_ordinal`]), so a process that uses only GPU 1
/// never touches GPU 0.
fn ordinal_of(rt: &dyn GpuRuntime, gpu: Option<u32>) -> Result<u32> {
    match gpu {
        Some(i) => Ok(i),
        None => crate::backend::current_ordinal(rt.device_memory(0).backend()),
    }
}

fn plan_for(dst: &Tensor, src: &Tensor) -> Result<CopyPlan> {
    plan_copy(
        dst.shape(),
        dst.strides(),
        src.strides(),
        dst.dtype().size(),
        BaseAddrs {
            dst: dst.data_ptr() as usize,
            src: src.data_ptr() as usize,
        },
        PlanOptions::GPU,
    )
}

fn check_same_kind(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.is_read_only() {
        return Err(Error::ReadOnly);
    }
    if dst.shape() != src.shape() {
        return Err(Error::ShapeMismatch {
            op: "copy",
            expected: dst.shape().to_vec(),
            got: src.shape().to_vec(),
        });
    }
    if dst.dtype() != src.dtype() {
        return Err(Error::DTypeMismatch {
            op: "copy",
            expected: dst.dtype(),
            got: src.dtype(),
        });
    }
    Ok(())
}

/// How a copy's two views share memory.
#[derive(PartialEq, Eq)]
enum Sharing {
    /// No byte of an element in common.
    None,
    /// The same layout at the same address: each element copied onto itself.
    Identical,
    /// Some bytes in common: a kernel must not read what it writes (it reads
    /// through the non-coherent cache), nor may a DMA's areas overlap (the
    /// CUDA runtime's `cudaMemcpy2D`: "The memory areas may not overlap").
    Partial,
}

fn sharing(dst: &Tensor, src: &Tensor) -> Result<Sharing> {
    let e = dst.dtype().size();
    let (Some(d), Some(s)) = (
        layout::byte_range(dst.shape(), dst.strides(), e)?,
        layout::byte_range(src.shape(), src.strides(), e)?,
    ) else {
        return Ok(Sharing::None); // an empty view
    };
    let absolute = |t: &Tensor, r: (isize, isize)| -> Result<(usize, usize)> {
        crate::copy::plan::absolute_range(t.data_ptr() as usize, r)
    };
    if !crate::copy::plan::ranges_overlap(absolute(dst, d)?, absolute(src, s)?) {
        return Ok(Sharing::None);
    }
    let (dp, sp) = (dst.data_ptr() as usize, src.data_ptr() as usize);
    let (shape, ds, ss) = (dst.shape(), dst.strides(), src.strides());
    Ok(if crate::copy::plan::same_layout(dp, sp, shape, ds, ss) {
        Sharing::Identical
    } else if crate::copy::plan::views_may_share(dp, ds, sp, ss, shape, e) {
        Sharing::Partial
    } else {
        Sharing::None // elements that interleave (`t[::2]`, `t[1::2]`) share no byte
    })
}

/// Enqueues `src → dst` on `stream` without synchronising. Both tensors must
/// be device or managed memory of `stream`'s GPU. Their storages record the
/// stream, so the pool does not reuse them elsewhere before this work is done.
pub(super) fn copy_on_stream(rt: &dyn GpuRuntime, dst: &Tensor, src: &Tensor, stream: &GpuStream) -> Result<()> {
    check_same_kind(dst, src)?;
    let ordinal = stream.ordinal;
    for d in [dst.device(), src.device()] {
        if rt.locate(d) != Some(Some(ordinal)) {
            return Err(Error::DeviceMismatch {
                expected: rt.device_memory(ordinal),
                got: d,
            });
        }
    }
    match sharing(dst, src)? {
        Sharing::None => {}
        // The destination's own check first (a broadcast view onto itself is
        // refused, as on the CPU), then nothing to copy.
        Sharing::Identical => return plan_for(dst, src).map(drop),
        Sharing::Partial => {
            plan_for(dst, src)?; // refused before anything is allocated or queued
            // Through a fresh copy of the source, allocated for the work stream:
            // `stream` waits for that stream's earlier users of the block.
            let tmp = Tensor::empty(src.shape(), src.dtype(), src.device())?;
            rt.handoff(&rt.work_stream(ordinal), stream)?;
            copy_on_stream(rt, &tmp, src, stream)?;
            return copy_on_stream(rt, dst, &tmp, stream);
        }
    }
    let plan = plan_for(dst, src)?;
    let handle = stream.handle;
    dst.storage().record_stream(handle);
    src.storage().record_stream(handle);
    // SAFETY: both views lie inside live device storages of this GPU, and the
    // recorded stream keeps their memory from reuse until the work is done.
    unsafe { run_plan(rt, &plan, dst.data_ptr() as u64, src.data_ptr() as u64, stream) }
}

/// Copies between tensors of which at least one lives on a GPU of runtime `R`,
/// on the default stream of the GPU involved. Copies that touch host-visible
/// memory synchronise before returning, so the host may read the result.
pub(super) fn copy_tensor(rt: &dyn GpuRuntime, dst: &Tensor, src: &Tensor) -> Result<()> {
    check_same_kind(dst, src)?;
    match sharing(dst, src)? {
        Sharing::None => {}
        // As in `copy_on_stream`: the destination's own check first.
        Sharing::Identical => return plan_for(dst, src).map(drop),
        // Through a fresh copy of the source, allocated for the work stream
        // both copies run on (no lock: the caller holds both storages').
        Sharing::Partial => {
            plan_for(dst, src)?;
            let tmp = Tensor::empty(src.shape(), src.dtype(), src.device())?;
            copy_tensor(rt, &tmp, src)?;
            return copy_tensor(rt, dst, &tmp);
        }
    }
    match (rt.locate(dst.device()), rt.locate(src.device())) {
        // Both reachable from one GPU through unified addressing.
        (Some(d), Some(s)) if d.is_none() || s.is_none() || d == s => {
            let ordinal = ordinal_of(rt, d.or(s))?; // None: pinned on both sides
            let stream = rt.work_stream(ordinal);
            let plan = plan_for(dst, src)?;
            let pinned = [dst.device(), src.device()].contains(&rt.pinned_host());
            let (dp, sp) = (dst.data_ptr() as u64, src.data_ptr() as u64);
            // The views lie inside live storages that outlive the synchronisation
            // at the end; pinned and managed memory are device-accessible through
            // unified addressing: the contract of `run_plan` and `try_memcpy_2d`.
            let done = match plan.kind {
                // One DMA, or one kernel on device / managed memory.
                PlanKind::Empty | PlanKind::Memcpy => {
                    // SAFETY: see above.
                    unsafe { run_plan(rt, &plan, dp, sp, &stream)? };
                    true
                }
                _ if !pinned => {
                    // SAFETY: see above.
                    unsafe { run_plan(rt, &plan, dp, sp, &stream)? };
                    true
                }
                // Pinned memory: a 2-D DMA when the rows are contiguous.
                // SAFETY: see above.
                _ => unsafe { try_memcpy_2d(rt, &plan, dp, sp, &stream)? },
            };
            if !done {
                // A permutation across the bus: pinned chunks gathered (scattered)
                // by the CPU, DMA'd whole, permuted on the GPU.
                return if src.device() == rt.pinned_host() {
                    staged_host_to_device(rt, dst, src, ordinal)
                } else {
                    staged_device_to_host(rt, dst, src, ordinal)
                };
            }
            if dst.device().is_host_accessible() || src.device().is_host_accessible() {
                rt.synchronize(&stream)?;
            }
            Ok(())
        }
        (Some(Some(d)), Some(Some(s))) => peer_copy_tensor(rt, dst, d, src, s),
        (Some(_), Some(_)) => unreachable!("the first arm takes every pair with pinned memory"),
        // Another runtime's device memory: through a host tensor.
        (Some(_), None) if !src.device().is_host_accessible() => copy_tensor(rt, dst, &src.to(Device::Cpu)?),
        (None, Some(_)) if !dst.device().is_host_accessible() => {
            let host = Tensor::empty(dst.shape(), dst.dtype(), Device::Cpu)?;
            copy_tensor(rt, &host, src)?;
            dst.copy_from(&host)
        }
        // Host-accessible memory on both sides: the CPU engine.
        (Some(_), None) if dst.device().is_host_accessible() => dst.copy_from(src),
        (None, Some(_)) if src.device().is_host_accessible() => dst.copy_from(src),
        // Host (pageable) → device memory.
        (Some(d), None) => {
            let ordinal = ordinal_of(rt, d)?;
            if src.device() == Device::Cpu && src.is_contiguous() && dst.is_contiguous() {
                return direct_dma(rt, dst, src, ordinal);
            }
            staged_host_to_device(rt, dst, src, ordinal)
        }
        // Device memory → host (pageable).
        (None, Some(s)) => {
            let ordinal = ordinal_of(rt, s)?;
            if dst.device() == Device::Cpu && src.is_contiguous() && dst.is_contiguous() {
                return direct_dma(rt, dst, src, ordinal);
            }
            staged_device_to_host(rt, dst, src, ordinal)
        }
        (None, None) => Err(Error::UnsupportedDevice {
            op: "GPU copy between host tensors",
            device: dst.device(),
        }),
    }
}

/// One DMA between contiguous pageable host memory and contiguous device
/// memory (the driver stages pageable memory itself, a bounded buffer of its
/// own), then a synchronisation: nothing pinned by devtensor.
fn direct_dma(rt: &dyn GpuRuntime, dst: &Tensor, src: &Tensor, ordinal: u32) -> Result<()> {
    if dst.nbytes() == 0 {
        return Ok(());
    }
    let stream = rt.work_stream(ordinal);
    // SAFETY: both views are contiguous inside live storages of `nbytes` bytes
    // from their start; the host range is ordinary memory the driver reads or
    // writes before the synchronisation below returns, and the device range
    // stays alive until then too.
    unsafe {
        rt.memcpy(
            ordinal,
            dst.data_ptr() as u64,
            src.data_ptr() as u64,
            dst.nbytes(),
            &stream,
        )?
    };
    rt.synchronize(&stream)
}

// ----- the pinned staging ring ----------------------------------------------------------

/// One runtime's pinned staging memory: two slots of `slot` bytes, allocated
/// on first use from its pinned pool and kept for reuse. The lock is held for
/// a whole copy, so copies that stage take turns.
struct Ring {
    buf: Option<Tensor>,
    slot: usize,
}

/// The ring of the runtime whose pinned memory is `pinned`.
fn ring_of(pinned: Device) -> Result<Arc<Mutex<Ring>>> {
    static RINGS: Mutex<Vec<(Device, Arc<Mutex<Ring>>)>> = Mutex::new(Vec::new());
    let mut rings = RINGS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, r)) = rings.iter().find(|(d, _)| *d == pinned) {
        return Ok(r.clone());
    }
    // Two slots, each a multiple of 512 bytes (aligned for every element size).
    let slot = (crate::alloc::staging_bytes()? / 2 / 512).max(1) * 512;
    let r = Arc::new(Mutex::new(Ring { buf: None, slot }));
    rings.push((pinned, r.clone()));
    Ok(r)
}

/// How a tensor is cut into chunks of at most `slot` bytes, each a view: the
/// leading dims `..k` take single indices, dim `k` a range of `step` indices,
/// the dims after `k` are whole.
struct Chunks {
    k: usize,
    step: usize,
    per_lead: usize,
    count: usize,
}

impl Chunks {
    fn new(shape: &[usize], elem: usize, slot: usize) -> Chunks {
        let total = shape.iter().product::<usize>() * elem;
        if shape.is_empty() || total <= slot {
            return Chunks {
                k: 0,
                step: shape.first().copied().unwrap_or(1).max(1),
                per_lead: 1,
                count: usize::from(total > 0),
            };
        }
        // The first dim whose inner block (the dims after it) fits a slot.
        let mut k = shape.len() - 1;
        let mut inner = elem;
        while k > 0 && inner * shape[k] <= slot {
            inner *= shape[k];
            k -= 1;
        }
        let step = (slot / inner).clamp(1, shape[k]);
        let per_lead = shape[k].div_ceil(step);
        let leads: usize = shape[..k].iter().product();
        Chunks {
            k,
            step,
            per_lead,
            count: leads * per_lead,
        }
    }

    /// Chunk `c` of `t` (which has the shape the chunks were made for).
    fn view(&self, t: &Tensor, c: usize) -> Result<Tensor> {
        if t.ndim() == 0 {
            return Ok(t.clone());
        }
        let (mut lead, part) = (c / self.per_lead, c % self.per_lead);
        let mut idx = vec![0usize; self.k];
        for d in (0..self.k).rev() {
            idx[d] = lead % t.shape()[d];
            lead /= t.shape()[d];
        }
        let mut v = t.clone();
        for &i in &idx {
            v = v.select(0, i as isize)?;
        }
        let a = part * self.step;
        let b = (a + self.step).min(v.shape()[0]);
        v.slice(0, Some(a as isize), Some(b as isize), 1)
    }
}

/// A contiguous staging area: the pinned slot or the device scratch, seen as
/// the chunk's shape.
struct Area {
    addr: u64,
    strides: Vec<isize>,
}

impl Area {
    fn new(addr: u64, shape: &[usize]) -> Result<Area> {
        Ok(Area {
            addr,
            strides: layout::contiguous_strides(shape)?.to_vec(),
        })
    }
}

/// Enqueues `area (contiguous) → view` when `to_view`, else `view → area`, on
/// `stream`: one DMA, or a 2-D DMA, or a DMA through the device `scratch` and a
/// kernel on the device side (`scratch` is allocated on first need).
///
/// # Safety
///
/// `area` is device-accessible (pinned) memory of the chunk's bytes, `view` a
/// view of live device memory, both alive until the stream's work is done;
/// work on `stream` runs in order, so one scratch serves every chunk.
#[allow(clippy::too_many_arguments)]
unsafe fn enqueue_chunk(
    rt: &dyn GpuRuntime,
    view: &Tensor,
    area: &Area,
    to_view: bool,
    scratch: &mut Option<Tensor>,
    slot: usize,
    ordinal: u32,
    stream: &GpuStream,
) -> Result<()> {
    let e = view.dtype().size();
    let vaddr = view.data_ptr() as u64;
    let (dst_s, src_s, dst, src) = if to_view {
        (view.strides(), &area.strides[..], vaddr, area.addr)
    } else {
        (&area.strides[..], view.strides(), area.addr, vaddr)
    };
    let bases = BaseAddrs {
        dst: dst as usize,
        src: src as usize,
    };
    let plan = plan_copy(view.shape(), dst_s, src_s, e, bases, PlanOptions::GPU)?;
    let dma = match plan.kind {
        PlanKind::Empty => true,
        PlanKind::Memcpy => {
            // SAFETY: both ranges are device-accessible and alive (caller's contract).
            unsafe { run_plan(rt, &plan, dst, src, stream)? };
            true
        }
        // SAFETY: as above.
        _ => unsafe { try_memcpy_2d(rt, &plan, dst, src, stream)? },
    };
    if dma {
        return Ok(());
    }
    // A permutation: DMA the contiguous bytes to or from the device scratch,
    // permute there with a kernel (stream order keeps the scratch's uses apart).
    let scratch = match scratch {
        Some(t) => t,
        None => scratch.insert(Tensor::empty(&[slot], DType::U8, rt.device_memory(ordinal))?),
    };
    let s_addr = scratch.data_ptr() as u64;
    let bytes = view.nbytes();
    let via = |dst: u64, dst_s: &[isize], src: u64, src_s: &[isize]| -> Result<CopyPlan> {
        let bases = BaseAddrs {
            dst: dst as usize,
            src: src as usize,
        };
        plan_copy(view.shape(), dst_s, src_s, e, bases, PlanOptions::GPU)
    };
    // SAFETY: (all three calls) the scratch holds `slot` ≥ `bytes` bytes of this
    // GPU's memory; the other ranges as above.
    unsafe {
        if to_view {
            rt.memcpy(ordinal, s_addr, area.addr, bytes, stream)?;
            let p = via(vaddr, view.strides(), s_addr, &area.strides)?;
            run_plan(rt, &p, vaddr, s_addr, stream)
        } else {
            let p = via(s_addr, &area.strides, vaddr, view.strides())?;
            run_plan(rt, &p, s_addr, vaddr, stream)?;
            rt.memcpy(ordinal, area.addr, s_addr, bytes, stream)
        }
    }
}

/// Locks the ring and makes sure its pinned memory is allocated.
fn ring_buffer<'r>(
    rt: &dyn GpuRuntime,
    ring: &'r Mutex<Ring>,
) -> Result<(std::sync::MutexGuard<'r, Ring>, u64, usize)> {
    let mut g = ring.lock().unwrap_or_else(PoisonError::into_inner);
    let slot = g.slot;
    let buf = match &g.buf {
        Some(b) => b.data_ptr() as u64,
        None => {
            let b = Tensor::empty(&[2 * slot], DType::U8, rt.pinned_host())?;
            let addr = b.data_ptr() as u64;
            g.buf = Some(b);
            addr
        }
    };
    Ok((g, buf, slot))
}

/// Host (any host-accessible memory, any layout) → device memory of GPU
/// `ordinal` through the pinned ring: the CPU gathers chunk `c + 1` into one
/// slot while the DMA of chunk `c` reads the other; a slot is refilled only
/// after an event says its DMA is done.
fn staged_host_to_device(rt: &dyn GpuRuntime, dst: &Tensor, src: &Tensor, ordinal: u32) -> Result<()> {
    let ring = ring_of(rt.pinned_host())?;
    let (_guard, buf, slot) = ring_buffer(rt, &ring)?;
    let stream = rt.work_stream(ordinal);
    let e = dst.dtype().size();
    let chunks = Chunks::new(dst.shape(), e, slot);
    let mut scratch = None;
    let mut done: [Option<Box<dyn GpuEvent>>; 2] = [None, None];
    let chunked = (0..chunks.count).try_for_each(|c| {
        let j = c % 2;
        if let Some(ev) = done[j].take() {
            ev.synchronize()?; // the DMA that read this slot (chunk c - 2)
        }
        let (dv, sv) = (chunks.view(dst, c)?, chunks.view(src, c)?);
        let area = Area::new(buf + (j * slot) as u64, dv.shape())?;
        // SAFETY: the slot holds `slot` ≥ the chunk's bytes, contiguous, and no
        // DMA uses it (waited above); `sv` is a host-accessible view in bounds.
        unsafe {
            crate::copy::copy_strided(
                area.addr as *mut u8,
                &area.strides,
                sv.data_ptr(),
                sv.strides(),
                sv.shape(),
                e,
            )?
        };
        // SAFETY: pinned slot and device view, both alive past the synchronisation below.
        unsafe { enqueue_chunk(rt, &dv, &area, true, &mut scratch, slot, ordinal, &stream)? };
        if c + 2 < chunks.count {
            done[j] = Some(rt.record(&stream)?);
        }
        Ok(())
    });
    finish_staged(rt, &stream, chunked)
}

/// The end of a copy through the pinned ring: its stream synchronised, on
/// failure too, before the ring's lock is released. A DMA of a copy that
/// failed part-way may still read or write a slot, and the next copy, of
/// another GPU's stream perhaps, would reuse it meanwhile.
fn finish_staged(rt: &dyn GpuRuntime, stream: &GpuStream, chunked: Result<()>) -> Result<()> {
    let synced = rt.synchronize(stream);
    chunked.and(synced)
}

/// Device memory of GPU `ordinal` → host (any host-accessible memory, any
/// layout) through the pinned ring: the DMA of chunk `c + 1` fills one slot
/// while the CPU scatters chunk `c` from the other, after its event.
fn staged_device_to_host(rt: &dyn GpuRuntime, dst: &Tensor, src: &Tensor, ordinal: u32) -> Result<()> {
    let ring = ring_of(rt.pinned_host())?;
    let (_guard, buf, slot) = ring_buffer(rt, &ring)?;
    let stream = rt.work_stream(ordinal);
    let e = dst.dtype().size();
    let chunks = Chunks::new(dst.shape(), e, slot);
    let mut scratch = None;
    // The chunk whose DMA is in flight, and the event that says it is done.
    let mut pending: Option<(usize, Option<Box<dyn GpuEvent>>)> = None;
    let scatter = |c: usize, ev: Option<Box<dyn GpuEvent>>| -> Result<()> {
        match ev {
            Some(ev) => ev.synchronize()?,
            None => rt.synchronize(&stream)?,
        }
        let dv = chunks.view(dst, c)?;
        let area = Area::new(buf + ((c % 2) * slot) as u64, dv.shape())?;
        // SAFETY: the slot's DMA is done (waited above) and holds the chunk
        // contiguously; `dv` is a writable host-accessible view in bounds.
        unsafe {
            crate::copy::copy_strided(
                dv.data_ptr(),
                dv.strides(),
                area.addr as *const u8,
                &area.strides,
                dv.shape(),
                e,
            )
        }
    };
    let chunked = (0..chunks.count).try_for_each(|c| {
        let sv = chunks.view(src, c)?;
        let area = Area::new(buf + ((c % 2) * slot) as u64, sv.shape())?;
        // SAFETY: the slot was scattered by the host (chunk c - 2, below) before
        // this DMA is enqueued; the device view and the slot outlive the work.
        unsafe { enqueue_chunk(rt, &sv, &area, false, &mut scratch, slot, ordinal, &stream)? };
        let ev = if c + 1 < chunks.count {
            Some(rt.record(&stream)?)
        } else {
            None
        };
        match pending.replace((c, ev)) {
            Some((p, pev)) => scatter(p, pev),
            None => Ok(()),
        }
    });
    let chunked = chunked.and_then(|()| pending.map_or(Ok(()), |(p, pev)| scatter(p, pev)));
    finish_staged(rt, &stream, chunked)
}

// ----- between GPUs ---------------------------------------------------------------------

/// Whether GPU `ordinal` reaches GPU `peer`'s memory, enabling it on the first
/// ask for each ordered pair of a runtime's GPUs (the answer is kept for the
/// process: enabling is a context-wide, one-time setting).
fn peer_access(rt: &dyn GpuRuntime, ordinal: u32, peer: u32) -> Result<bool> {
    static ENABLED: Mutex<Vec<((Device, Device), bool)>> = Mutex::new(Vec::new());
    let key = (rt.device_memory(ordinal), rt.device_memory(peer));
    let mut enabled = ENABLED.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&(_, ok)) = enabled.iter().find(|(k, _)| *k == key) {
        return Ok(ok);
    }
    let ok = rt.try_enable_peer_access(ordinal, peer)?;
    enabled.push((key, ok));
    Ok(ok)
}

/// GPU `s` → GPU `d` (`d != s`). With peer access (enabled once per pair) the
/// copy runs on one GPU's default stream, reading or writing the other's memory
/// directly (one DMA, or one kernel for any layout); without it, a contiguous
/// gather on `s`, the driver's peer DMA, and a scatter on `d`. Either way it is
/// ordered after both GPUs' earlier work and before their later work by events:
/// no host synchronisation, no pinned staging.
fn peer_copy_tensor(rt: &dyn GpuRuntime, dst: &Tensor, d: u32, src: &Tensor, s: u32) -> Result<()> {
    let (ds, ss) = (rt.work_stream(d), rt.work_stream(s));
    let device_pair = dst.device() == rt.device_memory(d) && src.device() == rt.device_memory(s);
    let runner = if peer_access(rt, d, s)? {
        Some((&ds, &ss))
    } else if peer_access(rt, s, d)? {
        Some((&ss, &ds))
    } else {
        None
    };
    if let Some((run, other)) = runner {
        rt.handoff(other, run)?;
        let plan = plan_for(dst, src)?;
        let (dp, sp) = (dst.data_ptr() as u64, src.data_ptr() as u64);
        // SAFETY: both views lie in live memory of their GPUs; GPU `o` may access
        // the other's memory (enabled above); the handoff back below keeps the
        // other GPU's later work (frees and reuse included) after this copy.
        unsafe {
            if plan.kind == PlanKind::Memcpy && device_pair {
                let at = |p: u64, off: isize| p.wrapping_add_signed(off as i64);
                rt.peer_copy(
                    d,
                    at(dp, plan.dst_offset),
                    s,
                    at(sp, plan.src_offset),
                    plan.bytes(),
                    run,
                )?;
            } else {
                run_plan(rt, &plan, dp, sp, run)?;
            }
        }
        rt.handoff(run, other)?;
    } else {
        // No peer access: gather on `s`, the driver's peer copy, scatter on `d`.
        let src_c = if src.is_contiguous() {
            src.clone()
        } else {
            src.contiguous()?
        };
        let tmp = if dst.is_contiguous() && dst.device() == rt.device_memory(d) {
            dst.clone()
        } else {
            Tensor::empty(dst.shape(), dst.dtype(), rt.device_memory(d))?
        };
        rt.handoff(&ds, &ss)?; // `tmp`'s earlier users on `d`
        // SAFETY: both buffers hold `nbytes` contiguous bytes of device memory of
        // their GPUs; `src_c` is freed on `s` after the copy (same stream) and
        // `tmp` on `d` after the handoff below.
        unsafe {
            rt.peer_copy(
                d,
                tmp.data_ptr() as u64,
                s,
                src_c.data_ptr() as u64,
                src_c.nbytes(),
                &ss,
            )?
        };
        rt.handoff(&ss, &ds)?;
        if !Arc::ptr_eq(tmp.storage(), dst.storage()) {
            copy_tensor(rt, dst, &tmp)?;
        }
    }
    if dst.device().is_host_accessible() || src.device().is_host_accessible() {
        rt.synchronize(&ds)?;
        rt.synchronize(&ss)?;
    }
    Ok(())
}

/// Fills a GPU tensor of runtime `R` with one raw element value.
pub(super) fn fill_tensor(rt: &dyn GpuRuntime, dst: &Tensor, value: &[u8]) -> Result<()> {
    let Some(g) = rt.locate(dst.device()) else {
        return Err(Error::UnsupportedDevice {
            op: "GPU fill",
            device: dst.device(),
        });
    };
    if dst.is_read_only() {
        return Err(Error::ReadOnly);
    }
    let ordinal = ordinal_of(rt, g)?;
    let stream = rt.work_stream(ordinal);
    let plan = plan_fill(
        dst.shape(),
        dst.strides(),
        value.len(),
        dst.data_ptr() as usize,
        PlanOptions::GPU,
    )?;
    if plan.kind == PlanKind::Empty {
        return Ok(());
    }
    let base = (dst.data_ptr() as usize).wrapping_add_signed(plan.dst_offset);
    let misaligned = plan.dims.iter().fold(base, |g, d| g | d.dst.unsigned_abs()) % plan.elem_size != 0;
    if misaligned {
        // A foreign view whose elements are not naturally aligned (DLPack's
        // byte_offset allows it): the fill kernel's element stores would fault, so
        // copy from one aligned device element, broadcast; the copy planner splits
        // the elements into aligned units.
        let one = Tensor::empty(&[1], dst.dtype(), rt.device_memory(ordinal))?;
        fill_tensor(rt, &one, value)?;
        let shape: Vec<isize> = dst.shape().iter().map(|&d| d as isize).collect();
        let src = one.reshape(&vec![1; shape.len()])?.expand(&shape)?;
        return copy_tensor(rt, dst, &src);
    }
    // Every size runs on the device: past 2^31 elements, one launch per 32-bit piece.
    for piece in split_for_32bit(&plan) {
        let Some((mut call, mut wide)) = fill_call(&piece, value)? else {
            return Err(Error::Internal("a fill value of 1 to 16 bytes over at most 16 dims"));
        };
        let mut base = (dst.data_ptr() as u64).wrapping_add_signed(piece.dst_offset as i64);
        let mut params = [
            (&raw mut base).cast::<c_void>(),
            wide.as_mut_ptr().cast(),
            call.args_ptr(),
        ];
        // SAFETY: params match `fill_eE(u8*, T, StridedArgs)` (the value is read as
        // `elem_size` bytes from `wide`); every index lies inside the view.
        unsafe { rt.launch(ordinal, &call, &mut params, &stream)? };
    }
    if dst.device().is_host_accessible() {
        rt.synchronize(&stream)?;
    }
    Ok(())
}
