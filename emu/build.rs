//! The cdylib is the driver: give it the soname a CUDA program's loader looks for.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
