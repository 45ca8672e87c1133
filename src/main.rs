fn main() {
    std::process::exit(candor::cli::run());
}
