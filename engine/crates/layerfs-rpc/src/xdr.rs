//! XDR (RFC 4506) as every layer here reads it: a bounds-checked cursor over
//! a record, the one padding rule, and [`Append`] for the replies written
//! item by item.

/// Zero bytes after `len` bytes of opaque data or a string, to the next
/// four-byte boundary (RFC 4506 §4.10).
pub const fn padding(len: usize) -> usize {
    (4 - len % 4) % 4
}

/// `len` bytes of opaque data with their padding.
pub const fn padded(len: usize) -> usize {
    len + padding(len)
}

/// Reads XDR items off a byte slice; every read checks the bounds first, and
/// a short slice gives `None`, never a panic.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    /// Whether every byte was read.
    pub fn is_empty(&self) -> bool {
        self.at == self.bytes.len()
    }

    /// How many bytes were read.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.bytes[self.at..]
    }

    /// The next `n` bytes, as they are.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len())?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Some(taken)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some((u64::from(self.u32()?) << 32) | u64::from(self.u32()?))
    }

    /// Variable-length opaque data of at most `max` bytes, padding skipped.
    pub fn opaque(&mut self, max: usize) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        if len > max {
            return None;
        }
        let body = self.take(len)?;
        self.take(padding(len))?;
        Some(body)
    }
}

/// Appends XDR items to a buffer: for replies whose items are written one by
/// one into the reply itself (a listing of thousands of entries), where
/// packing through `io::Write` item by item would cost a quarter of the
/// call. What an item takes is what it appended: sizes are measured, not
/// counted by hand.
pub trait Append {
    fn put_u32(&mut self, v: u32);

    #[inline]
    fn put_u64(&mut self, v: u64) {
        self.put_u32((v >> 32) as u32);
        self.put_u32(v as u32);
    }

    #[inline]
    fn put_bool(&mut self, v: bool) {
        self.put_u32(u32::from(v));
    }

    /// Variable-length opaque data: its length, the bytes, and zeros to the
    /// next four-byte boundary.
    fn put_opaque(&mut self, bytes: &[u8]);
}

impl Append for Vec<u8> {
    #[inline]
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }

    #[inline]
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_be_bytes());
    }

    #[inline]
    fn put_opaque(&mut self, bytes: &[u8]) {
        self.put_u32(bytes.len() as u32);
        self.extend_from_slice(bytes);
        self.extend_from_slice(&[0; 3][..padding(bytes.len())]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_reaches_the_next_word() {
        assert_eq!(
            (0..9).map(padding).collect::<Vec<_>>(),
            [0, 3, 2, 1, 0, 3, 2, 1, 0]
        );
        assert_eq!(padded(5), 8);
    }

    #[test]
    fn a_cursor_reads_words_and_opaques_and_stops_at_the_end() {
        let bytes = [
            0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, b'a', b'b', b'c', 0, 9,
        ];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u32(), Some(1));
        assert_eq!(c.u64(), Some(2));
        assert_eq!(c.opaque(3), Some(&b"abc"[..]));
        assert_eq!(c.rest(), &[9]);
        assert_eq!(c.u32(), None, "one byte is not a word");
        assert_eq!(c.take(1), Some(&[9][..]));
        assert!(c.is_empty());
    }

    #[test]
    fn what_append_writes_a_cursor_reads_back() {
        let mut out = Vec::new();
        out.put_u32(7);
        out.put_u64(u64::MAX - 1);
        out.put_bool(true);
        for len in 0..9 {
            out.put_opaque(&vec![0xAB; len]);
        }
        let mut c = Cursor::new(&out);
        assert_eq!(c.u32(), Some(7));
        assert_eq!(c.u64(), Some(u64::MAX - 1));
        assert_eq!(c.u32(), Some(1));
        for len in 0..9 {
            assert_eq!(c.opaque(8), Some(&vec![0xAB; len][..]), "length {len}");
        }
        assert!(c.is_empty(), "padding to the word, and nothing more");
        assert_eq!(
            out.len(),
            4 + 8 + 4 + (0..9).map(|n| 4 + padded(n)).sum::<usize>()
        );
    }

    #[test]
    fn an_opaque_past_its_limit_or_the_record_is_refused() {
        assert_eq!(Cursor::new(&[0, 0, 0, 4, 1, 2, 3, 4]).opaque(3), None);
        assert_eq!(Cursor::new(&[0, 0, 0, 4, 1, 2]).opaque(8), None);
        assert_eq!(
            Cursor::new(&[0, 0, 0, 1, 1, 0]).opaque(8),
            None,
            "padding missing"
        );
        assert_eq!(Cursor::new(&[255, 255, 255, 255]).opaque(usize::MAX), None);
    }
}
