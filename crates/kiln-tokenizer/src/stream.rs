//! Streaming detokenization: ids in one at a time, complete UTF-8 text out.

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Turns a stream of token ids into text without ever emitting part of a character: bytes of a character that
/// is split across tokens (byte-level BPE pieces, `<0xXX>` byte fallback) are held until it is complete.
///
/// The concatenation of everything [`StreamDecoder::push`] and [`StreamDecoder::finish`] return equals
/// [`Tokenizer::decode`] of all the ids (without `clean_up_tokenization_spaces`, which needs the whole text).
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    skip_special: bool,
    first: bool,
}

impl StreamDecoder {
    /// A decoder for a new sequence; `skip_special` drops control tokens as in [`Tokenizer::decode`].
    pub fn new(skip_special: bool) -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            skip_special,
            first: true,
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        if tok.skips_leading_bos(id, self.skip_special, self.first) {
            return Ok(String::new());
        }
        let piece = tok.decode_piece(id, self.skip_special)?;
        self.pending
            .extend_from_slice(tok.strip_first(piece, &mut self.first));
        Ok(self.take_complete())
    }

    /// Returns whatever is still held (an unfinished character becomes U+FFFD) and resets for reuse.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.first = true;
        out
    }

    /// Whether bytes of an unfinished character are being held.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // The prefix was just validated.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Bytes that can never start or continue a character: replace, as decode does.
                        Some(n) => {
                            out.push('\u{FFFD}');
                            rest = &bad[n..];
                        }
                        // An unfinished character at the end: keep it for the next token.
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }
}
