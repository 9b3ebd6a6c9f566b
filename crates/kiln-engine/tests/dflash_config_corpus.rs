//! Replays the minimized fuzz corpus of DFlash drafter configs (tests/fuzz_corpus_dflash/, from `fuzz/`'s
//! dflash_config target, plus `regression-*` inputs that once failed) through the parser: every input parses or
//! fails with an error, never a panic or an allocation failure, and what parses has one mask per layer whose spans
//! hold each row inside the block's positions (the fuzz target's property).

use kiln_engine::dflash::DraftConfig;

#[test]
fn dflash_config_corpus_replays_without_panics() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz_corpus_dflash");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() > 100, "corpus missing: {} files", files.len());
    let (mut parsed, mut sliding) = (0, 0);
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        let Ok(c) = DraftConfig::parse(text) else {
            continue;
        };
        parsed += 1;
        assert_eq!(c.layer_attn.len(), c.n_layer, "{}", f.display());
        assert!(c.block_size >= 2 && c.n_head % c.n_head_kv == 0 && !c.target_layer_ids.is_empty());
        for a in &c.layer_attn {
            sliding += a.window.is_some() as usize;
            for end in [1usize, 2, 7, 100] {
                for pos in end.saturating_sub(c.block_size.min(8))..end {
                    let (lo, hi) = a.span(pos, end);
                    assert!(lo <= pos && pos < hi && hi <= end, "{}: {a:?}", f.display());
                }
            }
        }
    }
    // The corpus reaches the parser's accepting paths, windowed layers included, not only its errors.
    eprintln!(
        "{parsed} of {} corpus inputs parse, {sliding} windowed layers",
        files.len()
    );
    assert!(
        parsed >= 2 && sliding > 0,
        "{parsed} parsed, {sliding} windowed layers"
    );
    let huge = std::fs::read_to_string(format!("{dir}/regression-huge-layer-count")).unwrap();
    assert!(DraftConfig::parse(&huge)
        .unwrap_err()
        .to_string()
        .contains("num_hidden_layers"));
}
