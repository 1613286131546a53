//! `exit-with <code> [words...]`: prints the words, then exits with `code`.

fn main() {
    let args: Vec<String> = std::env::args().collect();
    println!("args: {}", args.get(2..).unwrap_or_default().join(" "));
    let code = args.get(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    std::process::exit(code);
}
