fn main() {
    println!("cargo::rustc-check-cfg=cfg(dlpack_header)");
}
