//! Compiles `src/shim.c` against ggml's headers (`$GGML_SRC/include`) and links the static ggml
//! libraries of a CMake build (`$GGML_DIR`, made by `build-ggml.sh`).

use std::path::{Path, PathBuf};

fn required_dir(var: &str, what: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed={var}");
    let Some(value) = std::env::var_os(var) else {
        panic!("{var} is not set: it must name {what} (see scripts/peer-ggml/build-ggml.sh)");
    };
    let dir = PathBuf::from(value);
    if !dir.is_dir() {
        panic!(
            "{var}={} is not a directory: it must name {what}",
            dir.display()
        );
    }
    dir
}

/// The folder under `build` holding `libggml-base.a` (`src/` in a CMake build of ggml).
fn library_dir(build: &Path) -> PathBuf {
    [build.join("src"), build.to_path_buf(), build.join("lib")]
        .into_iter()
        .find(|dir| dir.join("libggml-base.a").is_file())
        .unwrap_or_else(|| {
            panic!(
                "GGML_DIR={}: no libggml-base.a in it, src/ or lib/ (build it with \
                 build-ggml.sh GGML_SRC GGML_DIR)",
                build.display()
            )
        })
}

fn main() {
    let source = required_dir("GGML_SRC", "a ggml source tree (its include/ggml.h)");
    let build = required_dir("GGML_DIR", "the CMake build folder of build-ggml.sh");
    let include = source.join("include");
    if !include.join("ggml-cpu.h").is_file() {
        panic!("GGML_SRC={}: no include/ggml-cpu.h in it", source.display());
    }
    println!("cargo:rerun-if-changed=src/shim.c");
    cc::Build::new()
        .file("src/shim.c")
        .include(&include)
        .opt_level(2)
        .compile("peer_ggml_shim");
    let libs = library_dir(&build);
    println!(
        "cargo:rerun-if-changed={}",
        libs.join("libggml-cpu.a").display()
    );
    println!("cargo:rustc-link-search=native={}", libs.display());
    for lib in ["ggml", "ggml-cpu", "ggml-base"] {
        println!("cargo:rustc-link-lib=static={lib}");
    }
    // ggml's CPU backend is partly C++ and uses threads.
    for lib in ["stdc++", "pthread", "m"] {
        println!("cargo:rustc-link-lib=dylib={lib}");
    }
}
