//! The blocks of one stream: segments cut into blocks, free lists per size
//! class, splitting on allocation and merging with free neighbours on free
//! (RMM's `block` and `coalescing_free_list`, PyTorch's `BlockPool`).

use std::sync::Arc;

use smallvec::SmallVec;

use super::config::PoolConfig;
use super::size_classes::{MIN_BLOCK, NCLASS, class_floor};
use super::stream_order::Events;
use crate::alloc::Allocation;
use crate::stream::StreamHandle;

/// No block (the end of a list, or no neighbour).
pub(super) const NONE: u32 = u32::MAX;

/// One block: a piece of a segment.
#[derive(Debug)]
pub(super) struct Block {
    pub(super) addr: usize,
    pub(super) size: usize,
    /// Raw allocation of the segment, on its head block only.
    segment: Option<Allocation>,
    prev: u32,
    next: u32,
    free_prev: u32,
    free_next: u32,
    free: bool,
    pub(super) large: bool,
    /// Events other streams' last uses recorded; a reuser waits on them.
    pub(super) events: Events,
}

/// The heads of the free lists, one per size class, and a bitmap of the
/// non-empty ones, so a fitting class is found in O(1).
#[derive(Debug)]
struct FreeLists {
    heads: Vec<u32>,
    bitmap: [u64; NCLASS.div_ceil(64)],
}

impl FreeLists {
    fn new() -> Self {
        FreeLists {
            heads: vec![NONE; NCLASS],
            bitmap: [0; NCLASS.div_ceil(64)],
        }
    }

    /// First non-empty class ≥ `c`.
    fn first_fit_class(&self, c: usize) -> Option<usize> {
        let mut word = c / 64;
        let mut bits = self.bitmap.get(word)? & (!0u64 << (c % 64));
        loop {
            if bits != 0 {
                return Some(word * 64 + bits.trailing_zeros() as usize);
            }
            word += 1;
            bits = *self.bitmap.get(word)?;
        }
    }
}

/// Whether a free block of `block_size` bytes handed out for `size` bytes
/// leaves a remainder worth keeping as a block of its own (PyTorch's
/// `should_split`): any 512 B in small segments; in large ones, more than a
/// small request, and never for blocks of `max_split_size` or more.
fn should_split(block_size: usize, size: usize, large: bool, cfg: &PoolConfig) -> bool {
    let rest = block_size - size;
    if large {
        rest > cfg.small_max && block_size < cfg.max_split_size
    } else {
        rest >= MIN_BLOCK
    }
}

/// The blocks of one stream, with its counters (kept under the pool's lock,
/// so the fast path does no atomic read-modify-write).
#[derive(Debug)]
pub(super) struct BlockPool {
    pub(super) stream: Option<StreamHandle>,
    pub(super) blocks: Vec<Block>,
    vacant: Vec<u32>,
    lists: [FreeLists; 2],
    pub(super) allocated: usize,
    pub(super) peak_allocated: usize,
    pub(super) active_blocks: usize,
    pub(super) alloc_count: usize,
}

impl BlockPool {
    pub(super) fn new(stream: Option<StreamHandle>) -> Self {
        BlockPool {
            stream,
            blocks: Vec::new(),
            vacant: Vec::new(),
            lists: [FreeLists::new(), FreeLists::new()],
            allocated: 0,
            peak_allocated: 0,
            active_blocks: 0,
            alloc_count: 0,
        }
    }

    /// Stores `b` in a vacant slot (or a new one); returns its id.
    fn new_block(&mut self, b: Block) -> u32 {
        match self.vacant.pop() {
            Some(i) => {
                self.blocks[i as usize] = b;
                i
            }
            None => {
                self.blocks.push(b);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn insert_free(&mut self, id: u32) {
        let (size, large) = (self.blocks[id as usize].size, self.blocks[id as usize].large);
        let c = class_floor(size);
        let lists = &mut self.lists[large as usize];
        let head = lists.heads[c];
        lists.heads[c] = id;
        lists.bitmap[c / 64] |= 1 << (c % 64);
        let b = &mut self.blocks[id as usize];
        b.free = true;
        b.free_prev = NONE;
        b.free_next = head;
        if head != NONE {
            self.blocks[head as usize].free_prev = id;
        }
    }

    fn remove_free(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let (c, large, fp, fnx) = (class_floor(b.size), b.large, b.free_prev, b.free_next);
        if fp != NONE {
            self.blocks[fp as usize].free_next = fnx;
        } else {
            let lists = &mut self.lists[large as usize];
            lists.heads[c] = fnx;
            if fnx == NONE {
                lists.bitmap[c / 64] &= !(1 << (c % 64));
            }
        }
        if fnx != NONE {
            self.blocks[fnx as usize].free_prev = fp;
        }
        self.blocks[id as usize].free = false;
    }

    /// Takes a free block of at least `size` bytes off its list, split when
    /// [`should_split`] says so; `None` when no class holds one.
    pub(super) fn get_free_block(&mut self, size: usize, large: bool, cfg: &PoolConfig) -> Option<u32> {
        let c = self.lists[large as usize].first_fit_class(class_floor(size))?;
        let id = self.lists[large as usize].heads[c];
        self.remove_free(id);
        if should_split(self.blocks[id as usize].size, size, large, cfg) {
            self.split_block(id, size);
        }
        Some(id)
    }

    /// Cuts block `id` to `size` bytes; the rest becomes a free block after it,
    /// with the same pending events (the memory's last uses are the same).
    fn split_block(&mut self, id: u32, size: usize) {
        let b = &self.blocks[id as usize];
        let (addr, rest, next, large, events) = (b.addr, b.size - size, b.next, b.large, b.events.clone());
        let tail = self.new_block(Block {
            addr: addr + size,
            size: rest,
            segment: None,
            prev: id,
            next,
            free_prev: NONE,
            free_next: NONE,
            free: false,
            large,
            events,
        });
        if next != NONE {
            self.blocks[next as usize].prev = tail;
        }
        let b = &mut self.blocks[id as usize];
        b.size = size;
        b.next = tail;
        self.insert_free(tail);
    }

    /// Frees a block and merges it with free neighbours; returns its final id.
    pub(super) fn free_block(&mut self, id: u32) -> u32 {
        let mut id = id;
        let next = self.blocks[id as usize].next;
        if next != NONE && self.blocks[next as usize].free {
            self.remove_free(next);
            self.merge_blocks(id, next);
        }
        let prev = self.blocks[id as usize].prev;
        if prev != NONE && self.blocks[prev as usize].free {
            self.remove_free(prev);
            self.merge_blocks(prev, id);
            id = prev;
        }
        self.insert_free(id);
        id
    }

    /// Merges block `b` (right after `a` in its segment) into `a`, which
    /// inherits `b`'s pending events.
    fn merge_blocks(&mut self, a: u32, b: u32) {
        let taken = std::mem::replace(&mut self.blocks[b as usize].events, SmallVec::new());
        let (size, next) = (self.blocks[b as usize].size, self.blocks[b as usize].next);
        let blk = &mut self.blocks[a as usize];
        blk.size += size;
        blk.next = next;
        for e in taken {
            if !blk.events.iter().any(|x| Arc::ptr_eq(x, &e)) {
                blk.events.push(e);
            }
        }
        if next != NONE {
            self.blocks[next as usize].prev = a;
        }
        self.vacant.push(b);
    }

    /// Ids of whole segments that are entirely free (never split, or merged back).
    pub(super) fn whole_free_segments(&self) -> Vec<u32> {
        (0..self.blocks.len() as u32)
            .filter(|&i| {
                let b = &self.blocks[i as usize];
                b.free && b.segment.is_some() && b.next == NONE
            })
            .collect()
    }

    /// Removes a whole free segment from the pool, returning its raw allocation,
    /// the events pending on it, and whether it is a large one.
    pub(super) fn detach_segment(&mut self, id: u32) -> Option<(Allocation, Events, bool)> {
        self.remove_free(id);
        let b = &mut self.blocks[id as usize];
        let seg = b.segment.take()?;
        let events = std::mem::take(&mut b.events);
        let large = b.large;
        self.vacant.push(id);
        Some((seg, events, large))
    }

    /// Inserts a whole free segment.
    pub(super) fn attach_segment(&mut self, seg: Allocation, large: bool, events: Events) -> u32 {
        let id = self.new_block(Block {
            addr: seg.ptr.as_ptr() as usize,
            size: seg.size,
            segment: Some(seg),
            prev: NONE,
            next: NONE,
            free_prev: NONE,
            free_next: NONE,
            free: false,
            large,
            events,
        });
        self.insert_free(id);
        id
    }

    pub(super) fn largest_free(&self) -> usize {
        self.blocks.iter().filter(|b| b.free).map(|b| b.size).max().unwrap_or(0)
    }
}
