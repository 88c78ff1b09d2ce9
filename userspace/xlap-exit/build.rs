//! Compiles the C++ terminate handler (src/terminate.cpp): an allocation
//! failure in the engine's C++ becomes exit code 8, as one in Rust does.

fn main() {
    println!("cargo:rerun-if-changed=src/terminate.cpp");
    cc::Build::new()
        .cpp(true)
        .file("src/terminate.cpp")
        .flag_if_supported("-std=c++17")
        .warnings(true)
        .compile("xlap_terminate");
}
