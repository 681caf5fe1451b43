//! A hostile record mark allocates nothing near the size it claims. This test
//! binary installs an allocator that remembers the largest request per thread.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::ErrorKind;

use layerfs_rpc::{Records, RECORD_LIMIT};
use support::{body, fragments, Script};

struct LargestPerThread;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for LargestPerThread {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(layout.size())));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = LARGEST.try_with(|l| l.set(l.get().max(new_size)));
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: LargestPerThread = LargestPerThread;

fn largest_allocation_while(f: impl FnOnce()) -> usize {
    LARGEST.with(|l| l.set(0));
    f();
    LARGEST.with(|l| l.get())
}

#[test]
fn a_2_gib_mark_allocates_nothing_for_its_claim() {
    let mut stream = (0x8000_0000u32 | 0x7FFF_FFFF).to_be_bytes().to_vec();
    stream.extend_from_slice(&[0; 64]);
    let largest = largest_allocation_while(|| {
        let mut records = Records::new(Script::whole(stream));
        assert_eq!(
            records.next_record().unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    });
    assert!(largest <= 64 * 1024, "largest allocation {largest} bytes");
}

#[test]
fn a_chain_past_the_limit_stops_before_allocating_its_next_fragment() {
    let first = body(RECORD_LIMIT - 100, 1);
    let second = body(200, 2);
    let stream = fragments(&[&first, &second]);
    let largest = largest_allocation_while(|| {
        let mut records = Records::new(Script::whole(stream));
        assert_eq!(
            records.next_record().unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    });
    // The first fragment's buffer is allowed; nothing more.
    assert!(
        largest <= RECORD_LIMIT,
        "largest allocation {largest} bytes"
    );
}
