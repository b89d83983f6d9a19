//! Small helpers the targets share: a reader that takes fields off the front of a fuzz input
//! (running out yields zeros, so every input is usable), and a 64-byte-aligned copy of bytes
//! (what a page-aligned mapping gives the real parsers).

/// Takes little-endian fields off the front of an input.
pub struct Input<'a> {
    rest: &'a [u8],
}

impl<'a> Input<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Input<'a> {
        Input { rest: data }
    }

    /// The next `n` bytes, zero-padded when the input runs out.
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.rest.len());
        out[..n].copy_from_slice(&self.rest[..n]);
        self.rest = &self.rest[n..];
        out
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }

    /// The next little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    /// The next little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    /// A value in `1..=max` from the next byte (small dimensions keep layouts tiny).
    pub fn small(&mut self, max: u8) -> usize {
        1 + (self.u8() % max) as usize
    }

    /// Everything not taken yet.
    pub fn rest(self) -> &'a [u8] {
        self.rest
    }
}

/// A copy of `bytes` in a buffer aligned to 64 bytes, `len` long (zero-extended or cut).
pub struct Aligned {
    words: Vec<[u64; 8]>,
    len: usize,
}

impl Aligned {
    /// `bytes` copied into a 64-aligned buffer of `len` bytes.
    pub fn new(bytes: &[u8], len: usize) -> Aligned {
        let mut a = Aligned {
            words: vec![[0u64; 8]; len.div_ceil(64)],
            len,
        };
        let n = len.min(bytes.len());
        a.bytes_mut()[..n].copy_from_slice(&bytes[..n]);
        a
    }

    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &as_bytes(&self.words)[..self.len]
    }

    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut as_bytes_mut(&mut self.words)[..len]
    }

    /// The start of the buffer, for views that address it by offset.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.words.as_mut_ptr().cast::<u8>()
    }
}

fn as_bytes(words: &[[u64; 8]]) -> &[u8] {
    bytemuck::cast_slice(words)
}

fn as_bytes_mut(words: &mut [[u64; 8]]) -> &mut [u8] {
    bytemuck::cast_slice_mut(words)
}
