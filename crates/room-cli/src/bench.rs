//! `room bench` (filled in below).
#[derive(clap::Args, Debug)]
pub struct BenchArgs {}
pub fn run(_: &BenchArgs) -> i32 {
    eprintln!("error: bench is not built yet");
    1
}
