//! Whatever the reader accepts, the writer must accept and reproduce: parse arbitrary bytes; on success write
//! the file back with `GgufWriter`, parse that, write it again, and require identical bytes (a comparison that
//! also holds for NaN metadata) and identical tensor directories and data.
#![no_main]

use kiln_gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fn rewrite(f: &GgufFile) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add(k, v.clone()).expect("the reader accepted this key");
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.shape)
            .expect("the reader accepted this tensor");
    }
    let mut d = w.begin(Vec::new()).expect("writing to memory");
    for t in f.tensors() {
        d.write_tensor_data(&t.name, f.tensor_data(t))
            .expect("sizes come from the same shape");
    }
    d.finish().expect("all tensors written")
}

fuzz_target!(|data: &[u8]| {
    let Ok(first) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let bytes = rewrite(&first);
    let second = GgufFile::from_bytes(bytes.clone()).expect("kiln-written file parses");
    assert_eq!(second.alignment(), first.alignment());
    assert_eq!(second.tensors().len(), first.tensors().len());
    for (a, b) in first.tensors().iter().zip(second.tensors()) {
        assert_eq!(
            (&a.name, a.ty, &a.shape, a.size),
            (&b.name, b.ty, &b.shape, b.size)
        );
        assert_eq!(first.tensor_data(a), second.tensor_data(b));
    }
    assert_eq!(rewrite(&second), bytes);
});
