//! Page-aligned host buffers with run-time checked, disjoint, concurrent spans.

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Alignment of every buffer: one 4 KiB page, what GPUDirect-TCPX's regMr wants.
pub const PAGE: usize = 4096;

/// Why a buffer or span could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    #[error("buffer of 0 bytes asked for: give a size of at least 1 byte")]
    ZeroSize,
    #[error("host allocation of {0} bytes failed: lower the size or free memory")]
    OutOfMemory(usize),
    #[error("a null pointer was given as memory to borrow: pass the buffer's start address")]
    NullPointer,
    #[error("span {offset}+{len} is outside the buffer of {size} bytes")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("span {offset}+{len} overlaps span {other_offset}+{other_len} that is still lent out")]
    Overlap {
        offset: usize,
        len: usize,
        other_offset: usize,
        other_len: usize,
    },
}

/// A zero-initialised, [`PAGE`]-aligned host allocation.
///
/// Access goes through [`HostBuffer::span`], which lends `&mut [u8]` to one byte range at a time:
/// ranges lent out at the same moment never overlap, so several threads may fill or drain
/// different parts of one buffer concurrently (one socket per part, say).
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// How the bytes were allocated; `None` for borrowed memory ([`HostBuffer::borrowed`]),
    /// which is never freed here.
    layout: Option<Layout>,
    /// Ranges lent out now: start -> end (exclusive).
    lent: Mutex<BTreeMap<usize, usize>>,
    /// Bytes landing here are read again at once ([`HostBuffer::mark_read_at_once`]).
    read_at_once: AtomicBool,
}

// SAFETY: the allocation is owned by the buffer and only reached through `Span`s, whose ranges the
// `lent` map keeps disjoint; a raw pointer is handed out only for FFI registration, whose users
// must uphold the same rule (documented on `as_ptr`).
unsafe impl Send for HostBuffer {}
// SAFETY: as above; shared access only creates spans under the `lent` mutex.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zeroed bytes aligned to [`PAGE`].
    pub fn new(len: usize) -> Result<Arc<Self>, MemError> {
        if len == 0 {
            return Err(MemError::ZeroSize);
        }
        let layout = Layout::from_size_align(len, PAGE).map_err(|_| MemError::OutOfMemory(len))?;
        // SAFETY: layout has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).ok_or(MemError::OutOfMemory(len))?;
        Ok(Arc::new(HostBuffer {
            ptr,
            len,
            layout: Some(layout),
            lent: Mutex::new(BTreeMap::new()),
            read_at_once: AtomicBool::new(false),
        }))
    }

    /// Wraps `len` bytes at `ptr` that someone else allocated and frees (a NumPy array, a torch
    /// tensor on the CPU, a `bytearray`), so that transports can send from and receive into it.
    /// Nothing is copied and nothing is freed when the buffer is dropped. Unlike
    /// [`HostBuffer::new`] the start need not be page-aligned.
    ///
    /// # Safety
    /// `ptr..ptr + len` must be one allocation readable and writable by this process for as long
    /// as the returned buffer (any clone of the `Arc`, any [`Span`] of it) lives, and nothing else
    /// may write those bytes while a span over them is lent out, nor read bytes a receive writes.
    pub unsafe fn borrowed(ptr: *mut u8, len: usize) -> Result<Arc<Self>, MemError> {
        if len == 0 {
            return Err(MemError::ZeroSize);
        }
        let ptr = NonNull::new(ptr).ok_or(MemError::NullPointer)?;
        Ok(Arc::new(HostBuffer {
            ptr,
            len,
            layout: None,
            lent: Mutex::new(BTreeMap::new()),
            read_at_once: AtomicBool::new(false),
        }))
    }

    /// Whether the bytes belong to someone else ([`HostBuffer::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        self.layout.is_none()
    }

    /// Says that bytes landing in this buffer are read again at once (a staging ring the copy
    /// engine drains as soon as a chunk lands), so receives should leave them in the CPU's cache
    /// rather than write them around it.
    pub fn mark_read_at_once(&self) {
        self.read_at_once.store(true, Ordering::Relaxed);
    }

    /// Whether [`HostBuffer::mark_read_at_once`] was called.
    pub fn is_read_at_once(&self) -> bool {
        self.read_at_once.load(Ordering::Relaxed)
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Start address, for registering the buffer with a plugin. Whoever writes through it must hold
    /// a [`Span`] over the range written.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// Lends bytes `offset..offset + len`, refused if that overlaps a range lent out now.
    pub fn span(self: &Arc<Self>, offset: usize, len: usize) -> Result<Span, MemError> {
        let size = self.len();
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(MemError::OutOfBounds { offset, len, size });
        }
        let end = offset + len;
        let mut lent = self.lent.lock().unwrap_or_else(|p| p.into_inner());
        // The nearest range starting before `end` is the only one that can overlap, since the
        // lent ranges are disjoint and sorted.
        if let Some((&s, &e)) = lent.range(..end).next_back() {
            if e > offset {
                return Err(MemError::Overlap {
                    offset,
                    len,
                    other_offset: s,
                    other_len: e - s,
                });
            }
        }
        lent.insert(offset, end);
        Ok(Span {
            buf: Arc::clone(self),
            offset,
            len,
        })
    }

    /// Lends the whole buffer (fails while any part is lent out).
    pub fn span_all(self: &Arc<Self>) -> Result<Span, MemError> {
        self.span(0, self.len())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let Some(layout) = self.layout {
            // SAFETY: `ptr` came from `alloc_zeroed(layout)` and is freed once, here.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) }
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len())
            .field("borrowed", &self.is_borrowed())
            .finish()
    }
}

/// Exclusive access to one byte range of a [`HostBuffer`]; the range is returned when dropped.
pub struct Span {
    buf: Arc<HostBuffer>,
    offset: usize,
    len: usize,
}

impl Span {
    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn buffer(&self) -> &Arc<HostBuffer> {
        &self.buf
    }

    /// Splits into `[0, mid)` and `[mid, len)`, each lent on its own (both must be non-empty).
    /// Fails, giving the span back, when `mid` is 0 or not below the length.
    pub fn split_at(self, mid: usize) -> Result<(Span, Span), Span> {
        if mid == 0 || mid >= self.len {
            return Err(self);
        }
        let this = std::mem::ManuallyDrop::new(self);
        // Take the Arc out without running Span's Drop (which would return the range).
        let buf = Arc::clone(&this.buf);
        let (offset, len) = (this.offset, this.len);
        // SAFETY: `this` is never used or dropped again, so its Arc is released exactly once here.
        drop(unsafe { std::ptr::read(&this.buf) });
        {
            let mut lent = buf.lent.lock().unwrap_or_else(|p| p.into_inner());
            lent.insert(offset, offset + mid);
            lent.insert(offset + mid, offset + len);
        }
        Ok((
            Span {
                buf: Arc::clone(&buf),
                offset,
                len: mid,
            },
            Span {
                buf,
                offset: offset + mid,
                len: len - mid,
            },
        ))
    }
}

impl Deref for Span {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: offset+len is inside the allocation (checked in `span`) and no other live span
        // overlaps it (the `lent` map), so no one else writes these bytes while we read them.
        unsafe { std::slice::from_raw_parts(self.buf.ptr.as_ptr().add(self.offset), self.len) }
    }
}

impl DerefMut for Span {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only reference through this span.
        unsafe { std::slice::from_raw_parts_mut(self.buf.ptr.as_ptr().add(self.offset), self.len) }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        let mut lent = self.buf.lent.lock().unwrap_or_else(|p| p.into_inner());
        lent.remove(&self.offset);
    }
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Span({}+{})", self.offset, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_bounded() {
        let b = HostBuffer::new(10_000).unwrap();
        assert_eq!(b.as_ptr() as usize % PAGE, 0);
        assert!(b.span_all().unwrap().iter().all(|&x| x == 0));
        assert_eq!(HostBuffer::new(0).unwrap_err(), MemError::ZeroSize);
        assert!(matches!(
            b.span(9_999, 2),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(
            b.span(usize::MAX, 2),
            Err(MemError::OutOfBounds { .. })
        ));
        assert!(matches!(b.span(0, 0), Err(MemError::OutOfBounds { .. })));
    }

    #[test]
    fn borrowed_memory_is_read_and_written_in_place_and_not_freed() {
        let mut backing = vec![7u8; 1000];
        // SAFETY: `backing` outlives `b` (dropped at the end of this scope, after `b`) and is not
        // touched while spans are lent.
        let b = unsafe { HostBuffer::borrowed(backing.as_mut_ptr().wrapping_add(3), 500) }.unwrap();
        assert!(b.is_borrowed() && b.len() == 500);
        {
            let mut s = b.span(10, 4).unwrap();
            assert_eq!(&s[..], &[7, 7, 7, 7]);
            s.copy_from_slice(&[1, 2, 3, 4]);
        }
        assert!(matches!(b.span(499, 2), Err(MemError::OutOfBounds { .. })));
        drop(b);
        assert_eq!(&backing[13..17], &[1, 2, 3, 4]);
        assert_eq!(backing[12], 7);
        // SAFETY: null and empty are refused before anything is touched.
        let null = unsafe { HostBuffer::borrowed(std::ptr::null_mut(), 8) };
        assert_eq!(null.unwrap_err(), MemError::NullPointer);
        // SAFETY: as above.
        let empty = unsafe { HostBuffer::borrowed(backing.as_mut_ptr(), 0) };
        assert_eq!(empty.unwrap_err(), MemError::ZeroSize);
    }

    #[test]
    fn overlapping_spans_are_refused_until_returned() {
        let b = HostBuffer::new(100).unwrap();
        let mut a = b.span(10, 10).unwrap();
        let c = b.span(20, 10).unwrap(); // adjacent is fine
        assert!(matches!(
            b.span(15, 2),
            Err(MemError::Overlap {
                other_offset: 10,
                ..
            })
        ));
        assert!(matches!(b.span(0, 11), Err(MemError::Overlap { .. })));
        assert!(matches!(
            b.span(29, 5),
            Err(MemError::Overlap {
                other_offset: 20,
                ..
            })
        ));
        assert!(b.span_all().is_err());
        a.fill(7);
        drop(a);
        drop(c);
        let all = b.span_all().unwrap();
        assert_eq!(&all[9..21], &[0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0]);
    }

    #[test]
    fn split_spans_are_lent_separately() {
        let b = HostBuffer::new(100).unwrap();
        let s = b.span(10, 20).unwrap();
        let s = s.split_at(0).unwrap_err();
        let s = s.split_at(20).unwrap_err();
        let (mut a, c) = s.split_at(5).unwrap();
        assert_eq!((a.offset(), a.len(), c.offset(), c.len()), (10, 5, 15, 15));
        a.fill(1);
        drop(c);
        let again = b.span(15, 15).unwrap();
        assert!(matches!(
            b.span(12, 1),
            Err(MemError::Overlap {
                other_offset: 10,
                ..
            })
        ));
        drop((a, again));
        assert!(b.span_all().is_ok());
        assert_eq!(
            Arc::strong_count(&b),
            1,
            "split spans release their references"
        );
    }

    #[test]
    fn spans_are_written_from_several_threads() {
        let b = HostBuffer::new(4 * 1000).unwrap();
        std::thread::scope(|s| {
            for i in 0..4 {
                let mut sp = b.span(i * 1000, 1000).unwrap();
                s.spawn(move || sp.fill(i as u8 + 1));
            }
        });
        let all = b.span_all().unwrap();
        for i in 0..4 {
            assert!(all[i * 1000..(i + 1) * 1000]
                .iter()
                .all(|&x| x == i as u8 + 1));
        }
    }
}
