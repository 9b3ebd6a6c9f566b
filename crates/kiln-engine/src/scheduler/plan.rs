//! The scheduler's pure decisions, kept apart from the engine so they can be tested without a model: which
//! free slot a request takes (longest reusable prefix), how much of a slot's cache it keeps, and where a
//! sequence's prefill chunks end.

/// Length of the longest common prefix of `a` and `b`.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// How many of a slot's cached tokens a new prompt keeps. At least the prompt's last token is always run again,
/// because its logits (which the cache does not hold) pick the first generated token.
pub(crate) fn reusable(history: &[u32], prompt: &[u32]) -> usize {
    common_prefix(history, prompt).min(prompt.len().saturating_sub(1))
}

/// A free slot as the chooser sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FreeSlot {
    pub index: usize,
    /// Prompt tokens this slot's cache would save.
    pub reuse: usize,
    /// Step counter of the slot's last use (lower = longer idle).
    pub last_used: u64,
}

/// Picks the free slot that saves the most prompt tokens; among equals, the one idle longest (its cache is the
/// least likely to be wanted by the next request), then the lowest index.
pub(crate) fn choose_slot(free: &[FreeSlot]) -> Option<FreeSlot> {
    free.iter().copied().min_by(|a, b| {
        b.reuse
            .cmp(&a.reuse)
            .then(a.last_used.cmp(&b.last_used))
            .then(a.index.cmp(&b.index))
    })
}

/// End (exclusive) of the prefill chunk that starts at position `pos` of a `len`-token prompt. Chunks end at
/// multiples of `chunk` counted from position 0, so a sequence's chunk boundaries depend only on its own
/// prompt and cache, never on what else is running.
pub(crate) fn chunk_end(pos: usize, len: usize, chunk: usize) -> usize {
    ((pos / chunk + 1) * chunk).min(len)
}

/// Picks which prefilling slots contribute a chunk to this step: `candidates` (slot, chunk length) come oldest
/// request first; take whole chunks while they fit in `budget` rows. The oldest always goes in, so prefill
/// always progresses, and first-come first-served prefill finishes each prompt as early as possible instead of
/// slowing every prompt down equally (running streams are unaffected: their decode rows are in every step).
pub(crate) fn pick_prefill(candidates: &[(usize, usize)], budget: usize) -> Vec<usize> {
    let mut used = 0;
    let mut out = Vec::new();
    for &(slot, n) in candidates {
        if out.is_empty() || used + n <= budget {
            used += n;
            out.push(slot);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuse_keeps_the_last_prompt_token_to_recompute() {
        assert_eq!(reusable(&[1, 2, 3, 4], &[1, 2, 3, 4]), 3);
        assert_eq!(reusable(&[1, 2, 3, 4, 5, 6], &[1, 2, 3, 9]), 3);
        assert_eq!(reusable(&[1, 2], &[1, 2, 3, 4]), 2);
        assert_eq!(reusable(&[], &[1]), 0);
        assert_eq!(reusable(&[7], &[1, 2]), 0);
    }

    #[test]
    fn chooser_prefers_longest_prefix_then_longest_idle() {
        let s = |index, reuse, last_used| FreeSlot {
            index,
            reuse,
            last_used,
        };
        assert_eq!(
            choose_slot(&[s(0, 0, 5), s(1, 7, 9), s(2, 3, 1)]).map(|f| f.index),
            Some(1)
        );
        assert_eq!(
            choose_slot(&[s(0, 0, 5), s(1, 0, 2), s(2, 0, 2)]).map(|f| f.index),
            Some(1)
        );
        assert_eq!(choose_slot(&[]), None);
    }

    #[test]
    fn chunks_end_on_fixed_boundaries() {
        assert_eq!(chunk_end(0, 150, 64), 64);
        assert_eq!(chunk_end(64, 150, 64), 128);
        assert_eq!(chunk_end(128, 150, 64), 150);
        // A reused prefix of 70 tokens: the first chunk only runs up to the next boundary.
        assert_eq!(chunk_end(70, 150, 64), 128);
        assert_eq!(chunk_end(0, 5, 64), 5);
    }

    #[test]
    fn prefill_pick_is_oldest_first_and_budgeted() {
        let c = [(5, 64), (2, 10), (0, 30)];
        assert_eq!(pick_prefill(&c, 64), vec![5]);
        assert_eq!(pick_prefill(&c[1..], 64), vec![2, 0]);
        assert_eq!(pick_prefill(&[(1, 50), (3, 20), (4, 14)], 64), vec![1, 4]);
        // A chunk bigger than the budget still runs when it is the oldest.
        assert_eq!(pick_prefill(&[(3, 64)], 16), vec![3]);
        assert!(pick_prefill(&[], 64).is_empty());
    }
}
