//! Parses arbitrary bytes as GGUF; on success touches every metadata value and every tensor byte, so an
//! invalid range or a lying count shows up as a crash here rather than in a model loader.
#![no_main]

use kiln_gguf::{GgufFile, Summary};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    let md = file.metadata();
    for (key, value) in md.iter() {
        std::hint::black_box(value.to_string());
        // Every accessor must return a value or an error, never panic, whatever the stored type.
        let _ = md.get_u32(key);
        let _ = md.get_i64(key);
        let _ = md.get_f32(key);
        let _ = md.get_str(key);
        let _ = md.get_arr_str(key);
        let _ = md.get_arr_f32(key);
        let _ = md.get_arr_i32(key);
    }
    let mut sum = 0u64;
    for t in file.tensors() {
        let bytes = file.tensor_data(t);
        assert_eq!(bytes.len() as u64, t.size);
        assert_eq!(t.offset % file.alignment(), 0);
        sum = bytes.iter().fold(sum, |a, &b| a.wrapping_add(b as u64));
        assert!(std::ptr::eq(file.tensor(&t.name).unwrap(), t));
    }
    std::hint::black_box(sum);
    std::hint::black_box(Summary::of(&file));
});
