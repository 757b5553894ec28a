#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| surelink_cache::text::fuzz::binary(data));
