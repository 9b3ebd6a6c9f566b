//! GPT-2's byte-level alphabet: every byte is written as one printable Unicode character, so that BPE
//! vocabularies can be stored as strings. Printable Latin-1 bytes stand for themselves; the other 68 bytes map,
//! in order, to U+0100 and up.

/// The character standing for each byte.
pub(crate) fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            let cp = next;
            next += 1;
            cp
        };
        // All code points used are below U+0144, hence valid chars.
        *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char`], indexed by code point (all are below 324).
pub(crate) fn char_to_byte() -> Vec<Option<u8>> {
    let mut inv = vec![None; 324];
    for (b, c) in byte_to_char().iter().enumerate() {
        inv[*c as usize] = Some(b as u8);
    }
    inv
}

/// Decodes a byte-level token text into its bytes. A character outside the alphabet (which a well-formed
/// vocabulary never has) is kept as its own UTF-8 bytes rather than dropped.
pub(crate) fn decode_into(text: &str, inv: &[Option<u8>], out: &mut Vec<u8>) {
    for c in text.chars() {
        match inv.get(c as usize).copied().flatten() {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
}

/// Encodes bytes into the byte-level alphabet.
#[cfg(test)]
pub(crate) fn encode(bytes: &[u8], table: &[char; 256]) -> String {
    bytes.iter().map(|&b| table[b as usize]).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alphabet_is_a_bijection_with_gpt2_anchors() {
        let t = byte_to_char();
        // Anchors every GPT-2 vocabulary shows: space is 'Ġ', newline 'Ċ', tab 'ĉ'.
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'\t' as usize], 'ĉ');
        assert_eq!(t[b'a' as usize], 'a');
        let inv = char_to_byte();
        for b in 0..=255u8 {
            assert_eq!(inv[t[b as usize] as usize], Some(b));
        }
        let mut out = Vec::new();
        let all: Vec<u8> = (0..=255).collect();
        decode_into(&encode(&all, &t), &inv, &mut out);
        assert_eq!(out, all);
    }
}
