//! Fragments of an oversized sync item. The server splits an item's text into pieces of at most
//! `max` bytes on UTF-8 boundaries; a reader reassembles them and accepts an item only when its
//! fragments cover `[0, total)` contiguously and the last one says `item_complete`.

/// Split `text` from byte `from` into `(offset, piece)` runs of at most `max` bytes, each ending on
/// a character boundary. `max` must be at least 4 (one UTF-8 character).
pub fn split(text: &str, from: usize, max: usize) -> Vec<(usize, &str)> {
    assert!(max >= 4, "a chunk holds at least one UTF-8 character");
    assert!(
        text.is_char_boundary(from),
        "chunks start on a character boundary"
    );
    let mut out = Vec::new();
    let mut o = from;
    while o < text.len() {
        let mut n = (text.len() - o).min(max);
        while !text.is_char_boundary(o + n) {
            n -= 1;
        }
        out.push((o, &text[o..o + n]));
        o += n;
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    #[error("fragment of seq {seq} at offset {offset} does not follow offset {expected}")]
    Gap {
        seq: u64,
        offset: u64,
        expected: u64,
    },
    #[error("fragment of seq {got} arrived while seq {open} is incomplete")]
    Interleaved { open: u64, got: u64 },
    #[error("fragments of seq {seq} exceed its total of {total} bytes")]
    Overflow { seq: u64, total: u64 },
    #[error("item_complete for seq {seq} ends at {end}, not at its total of {total} bytes")]
    ShortComplete { seq: u64, end: u64, total: u64 },
    #[error("an item may not exceed {0} bytes")]
    TooLarge(u64),
}

/// One fragment as delivered on a page.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Fragment {
    pub seq: u64,
    pub offset: u64,
    pub total_bytes: u64,
    /// `item_chunk` or `item_complete`.
    pub fragment: String,
    pub data: String,
}

/// Reassembles fragments into whole items; refuses anything out of order.
#[derive(Debug, Default)]
pub struct Reassembler {
    open: Option<(u64, u64, String)>,
    /// Largest item accepted, in bytes.
    pub item_bytes_max: u64,
}

impl Reassembler {
    pub fn new(item_bytes_max: u64) -> Self {
        Reassembler {
            open: None,
            item_bytes_max,
        }
    }

    /// Feed one fragment; returns the whole item text when this fragment completes it.
    pub fn push(&mut self, f: &Fragment) -> Result<Option<String>, ChunkError> {
        if f.total_bytes > self.item_bytes_max {
            return Err(ChunkError::TooLarge(self.item_bytes_max));
        }
        let (seq, total, buf) = self
            .open
            .get_or_insert_with(|| (f.seq, f.total_bytes, String::new()));
        if *seq != f.seq {
            return Err(ChunkError::Interleaved {
                open: *seq,
                got: f.seq,
            });
        }
        let expected = buf.len() as u64;
        if f.offset != expected {
            return Err(ChunkError::Gap {
                seq: f.seq,
                offset: f.offset,
                expected,
            });
        }
        if expected + f.data.len() as u64 > *total || f.total_bytes != *total {
            return Err(ChunkError::Overflow {
                seq: f.seq,
                total: *total,
            });
        }
        buf.push_str(&f.data);
        if f.fragment == "item_complete" {
            let end = buf.len() as u64;
            if end != *total {
                return Err(ChunkError::ShortComplete {
                    seq: f.seq,
                    end,
                    total: *total,
                });
            }
            let (_, _, text) = self.open.take().expect("an item is open");
            return Ok(Some(text));
        }
        Ok(None)
    }

    /// Whether an item is partly assembled.
    pub fn in_progress(&self) -> Option<(u64, u64)> {
        self.open.as_ref().map(|(s, _, b)| (*s, b.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn split_then_reassemble_is_identity(text in "\\PC{0,300}", max in 4usize..40) {
            let pieces = split(&text, 0, max);
            let mut r = Reassembler::new(1 << 20);
            let mut got = None;
            for (i, (o, p)) in pieces.iter().enumerate() {
                prop_assert!(p.len() <= max && !p.is_empty());
                let f = Fragment { seq: 7, offset: *o as u64, total_bytes: text.len() as u64,
                    fragment: if i + 1 == pieces.len() { "item_complete".into() } else { "item_chunk".into() }, data: (*p).into() };
                got = r.push(&f).unwrap();
            }
            if !text.is_empty() {
                prop_assert_eq!(got.as_deref(), Some(text.as_str()));
            }
        }
    }

    #[test]
    fn gaps_and_interleaving_are_refused() {
        let mut r = Reassembler::new(100);
        let f = |seq, offset, data: &str, last| Fragment {
            seq,
            offset,
            total_bytes: 6,
            data: data.into(),
            fragment: if last {
                "item_complete".into()
            } else {
                "item_chunk".into()
            },
        };
        r.push(&f(1, 0, "abc", false)).unwrap();
        assert!(matches!(
            r.push(&f(2, 3, "def", true)),
            Err(ChunkError::Interleaved { .. })
        ));
        assert!(matches!(
            r.push(&f(1, 4, "ef", true)),
            Err(ChunkError::Gap { .. })
        ));
        assert_eq!(
            r.push(&f(1, 3, "def", true)).unwrap().as_deref(),
            Some("abcdef")
        );
    }
}
