//! Converts a GGUF file into an HF folder: `convert_gguf FILE.gguf OUT_DIR`.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 3 {
        eprintln!("usage: {} FILE.gguf OUT_DIR", args[0]);
        std::process::exit(2);
    }
    if let Err(e) = verity_worker::convert_gguf(args[1].as_ref(), args[2].as_ref()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
