//! XDR (RFC 4506) as every layer here reads it: a bounds-checked cursor over
//! a record, and the one padding rule.

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
