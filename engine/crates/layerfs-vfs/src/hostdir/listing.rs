//! Reading a host directory and naming positions in it.

use std::os::fd::BorrowedFd;

use rustix::fs::{Dir, FileType};

use crate::error::Result;

/// Entries of a directory other than `.` and `..`: name, inode, is-directory.
pub fn list(fd: BorrowedFd<'_>) -> Result<Vec<(Vec<u8>, u64, bool)>> {
    let mut dir = Dir::read_from(fd)?;
    let mut out = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let name = entry.file_name().to_bytes();
        if name == b"." || name == b".." {
            continue;
        }
        out.push((
            name.to_vec(),
            entry.ino(),
            entry.file_type() == FileType::Directory,
        ));
    }
    Ok(out)
}

/// FNV-1a of the name, kept clear of the cookies of `.` and `..` (1, 2) and
/// of the sign bit.
pub fn name_cookie(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    3 + (h >> 2)
}
