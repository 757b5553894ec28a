//! LEB128 variable-length integers for compact headers: 7 bits per byte,
//! low bits first, the high bit set on every byte but the last.

use bytes::BufMut;

/// Bytes of the longest `u64` varint.
pub const MAX_VARINT: usize = 10;

/// Appends `v`.
#[inline]
pub fn put_varint(buf: &mut impl BufMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v & 0x7f) as u8 | 0x80);
        v >>= 7;
    }
    buf.put_u8((v & 0x7f) as u8);
}

/// Bytes `v` takes.
#[inline]
pub const fn varint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Reads a varint off the front of `b`: the value and the bytes it took.
/// `None` when `b` ends first, or the value overflows 64 bits, or it is not
/// in its shortest form (so every value has exactly one encoding).
#[inline]
pub fn get_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v: u64 = 0;
    for (i, &byte) in b.iter().enumerate().take(MAX_VARINT) {
        let part = u64::from(byte & 0x7f);
        if i == MAX_VARINT - 1 && part > 1 {
            return None; // more than 64 bits
        }
        v |= part << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                return None; // a trailing zero byte: not the shortest form
            }
            return Some((v, i + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
            assert_eq!(get_varint(&b), Some((v, b.len())));
            assert_eq!(get_varint(&b[..b.len() - 1]), None, "truncated {v}");
        }
        // Not the shortest form.
        assert_eq!(get_varint(&[0x80, 0x00]), None);
        // Eleven bytes / overflow.
        assert_eq!(get_varint(&[0xff; 11]), None);
        assert_eq!(
            get_varint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
            None
        );
        assert_eq!(get_varint(&[]), None);
    }
}
