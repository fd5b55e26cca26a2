//! Stream ordering (RMM's `stream_ordered_memory_resource`): one block pool
//! per stream, events recorded when memory used on other streams
//! (`record_stream`) is freed, and a device-side wait on them before the
//! memory is reused — never a host poll.

use std::sync::{Arc, Mutex};

use smallvec::SmallVec;

use super::block_pool::BlockPool;
use super::{CachingAlloc, lock};
use crate::alloc::{Allocation, NDAlloc};
use crate::error::Result;
use crate::stream::{EventHandle, StreamHandle};

/// Events a block's reuser must wait for (shared by the pieces of a split block).
pub(super) type Events = SmallVec<[Arc<EventHandle>; 1]>;

impl<A: NDAlloc> CachingAlloc<A> {
    /// The index of `stream`'s pool, made on its first use; 0 is the default stream's.
    pub(super) fn pool_index(&self, stream: Option<StreamHandle>) -> usize {
        let Some(s) = stream else { return 0 };
        if let Some(&i) = self.by_stream.read().unwrap_or_else(|e| e.into_inner()).get(&s) {
            return i;
        }
        let mut by = self.by_stream.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = by.get(&s) {
            return i;
        }
        let mut pools = self.pools.write().unwrap_or_else(|e| e.into_inner());
        pools.push(Arc::new(Mutex::new(BlockPool::new(Some(s)))));
        by.insert(s, pools.len() - 1);
        pools.len() - 1
    }

    pub(super) fn pool(&self, index: usize) -> Arc<Mutex<BlockPool>> {
        if index == 0 {
            return self.default_pool.clone();
        }
        self.pools.read().unwrap_or_else(|e| e.into_inner())[index].clone()
    }

    pub(super) fn all_pools(&self) -> Vec<Arc<Mutex<BlockPool>>> {
        self.pools.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Events at the current end of each `used_on` stream's work, for the
    /// freed block's next user to wait on.
    pub(super) fn record_stream_uses(&self, used_on: &[StreamHandle]) -> Events {
        let mut events: Events = SmallVec::new();
        let mut synced = false;
        for &s in used_on {
            match self.raw.record_event(s) {
                Ok(Some(ev)) => events.push(Arc::new(ev)),
                Ok(None) => {}
                // The stream cannot be recorded on (a driver that detects a
                // destroyed handle answers CUDA_ERROR_INVALID_HANDLE; a real one
                // may crash instead, which is why exports record only our own,
                // never-destroyed streams) while its work may still be queued.
                // Wait for all the device's work instead, once; a device that
                // cannot even synchronise has failed, and the block goes back as it is.
                Err(_) if !synced => {
                    synced = true;
                    let _ = self.raw.synchronize_device();
                }
                Err(_) => {}
            }
        }
        events
    }

    /// Makes the pool's stream wait for the events on block `id`, then drops them.
    pub(super) fn wait_on_block_events(&self, pool: &mut BlockPool, id: u32) -> Result<()> {
        let events = std::mem::take(&mut pool.blocks[id as usize].events);
        for e in &events {
            self.raw.wait_event(pool.stream, **e)?;
        }
        self.release_events(events);
        Ok(())
    }

    /// Drops `events`, releasing each one no other block still shares.
    pub(super) fn release_events(&self, events: Events) {
        for e in events {
            if let Ok(h) = Arc::try_unwrap(e) {
                self.raw.release_event(h);
            }
        }
    }

    /// A whole free segment of at least `size` bytes (of the `large` kind)
    /// another stream's pool caches, detached from it with an event at the end
    /// of that stream's work for the new owner to wait on (RMM's
    /// `get_block_from_other_stream`); `None` when no pool has one.
    pub(super) fn take_segment_from_other_stream(
        &self,
        pool_index: usize,
        size: usize,
        large: bool,
    ) -> Result<Option<(Allocation, Events, bool)>> {
        for (i, other) in self.all_pools().iter().enumerate() {
            if i == pool_index {
                continue;
            }
            let mut o = lock(other);
            let found = o.whole_free_segments().into_iter().find(|&id| {
                let b = &o.blocks[id as usize];
                b.size >= size && b.large == large
            });
            if let Some(id) = found
                && let Some((seg, mut events, seg_large)) = o.detach_segment(id)
            {
                if let Some(s) = o.stream
                    && let Some(ev) = self.raw.record_event(s)?
                {
                    events.push(Arc::new(ev));
                }
                return Ok(Some((seg, events, seg_large)));
            }
        }
        Ok(None)
    }
}
