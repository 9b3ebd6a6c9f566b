//! Replays the minimized fuzz corpus (tests/fuzz_corpus/, from `fuzz/`'s gguf_reader target) through the
//! parser: every input must parse or fail with an error, never panic; parsed files must give consistent views.

use kiln_gguf::{GgufFile, Summary};

#[test]
fn fuzz_corpus_replays_without_panics() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fuzz_corpus");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(files.len() >= 50, "corpus has only {} files", files.len());
    let (mut ok, mut err) = (0, 0);
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        match GgufFile::from_bytes(bytes) {
            Ok(f) => {
                ok += 1;
                for (k, v) in f.metadata().iter() {
                    let _ = (
                        v.to_string(),
                        f.metadata().get_u32(k),
                        f.metadata().get_arr_str(k),
                    );
                }
                for t in f.tensors() {
                    assert_eq!(f.tensor_data(t).len() as u64, t.size, "{}", path.display());
                    assert_eq!(t.offset % f.alignment(), 0);
                }
                let _ = Summary::of(&f);
            }
            Err(e) => {
                err += 1;
                let msg = e.to_string();
                assert!(
                    !msg.is_empty() && !msg.contains('\n'),
                    "{}: {msg:?}",
                    path.display()
                );
            }
        }
    }
    // The corpus exercises both outcomes.
    assert!(ok > 0 && err > 0, "ok {ok}, err {err}");
}
