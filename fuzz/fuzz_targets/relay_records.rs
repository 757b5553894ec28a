#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| surelink_sim::fuzz::relay_records(data));
