//! Parses arbitrary bytes as a DFlash drafter's `config.json`; what parses must describe a drafter kiln can run:
//! one attention mask per layer, every row's span inside the block's positions and holding the row itself.
#![no_main]

use kiln_engine::dflash::DraftConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(c) = DraftConfig::parse(text) else {
        return;
    };
    assert_eq!(c.layer_attn.len(), c.n_layer);
    assert!(c.block_size >= 2 && c.n_head % c.n_head_kv == 0 && !c.target_layer_ids.is_empty());
    for a in &c.layer_attn {
        for end in [1usize, 2, 7, 100] {
            for pos in end.saturating_sub(c.block_size.min(8))..end {
                let (lo, hi) = a.span(pos, end);
                assert!(
                    lo <= pos && pos < hi && hi <= end,
                    "{a:?}: row {pos} of {end} sees {lo}..{hi}"
                );
            }
        }
    }
});
