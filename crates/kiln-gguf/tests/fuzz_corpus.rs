//! Replays the minimized fuzz corpus (tests/fuzz_corpus/, from `fuzz/`'s gguf_reader target, plus
//! `regression-*` inputs that once failed) through the parser and the writer: every input must parse or fail
//! with an error, never panic; parsed files must give consistent views, and must survive a write → read → write
//! round trip byte for byte (the gguf_roundtrip target's property).

use kiln_gguf::{GgufFile, GgufWriter, Summary};

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add(k, v.clone()).unwrap();
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.shape).unwrap();
    }
    let mut d = w.begin(Vec::new()).unwrap();
    for t in f.tensors() {
        d.write_tensor_data(&t.name, f.tensor_data(t)).unwrap();
    }
    d.finish().unwrap()
}

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
                let bytes = rewrite(&f);
                let again = GgufFile::from_bytes(bytes.clone()).unwrap();
                assert_eq!(again.tensors().len(), f.tensors().len());
                for (a, b) in f.tensors().iter().zip(again.tensors()) {
                    assert_eq!((&a.name, a.ty, &a.shape), (&b.name, b.ty, &b.shape));
                    assert_eq!(f.tensor_data(a), again.tensor_data(b));
                }
                assert_eq!(rewrite(&again), bytes, "{}", path.display());
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
