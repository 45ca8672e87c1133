//! `candor devices`: where this build can run models — the CPU, and with the `cuda` feature
//! each GPU the driver reports and whether the GPU kernels compile (NVRTC).

use anyhow::bail;

#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Fail (exit 1) unless the GPU kernels compile here; needs the `cuda` feature and libnvrtc,
    /// not a GPU (CI uses it to check the CUDA code).
    #[arg(long)]
    pub check_kernels: bool,
}

pub fn run(args: DevicesArgs) -> anyhow::Result<()> {
    println!(
        "cpu  {} threads",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    #[cfg(feature = "cuda")]
    {
        use crate::model::cuda;
        match cuda::list_devices() {
            Ok(list) if list.is_empty() => println!("cuda: the driver reports no device"),
            Ok(list) => list.iter().for_each(|l| println!("{l}")),
            Err(why) => println!("cuda: {why}"),
        }
        match cuda::compile_kernels() {
            Ok(_) => println!("cuda kernels: compile (NVRTC)"),
            Err(e) if args.check_kernels => bail!("{e}"),
            Err(e) => println!("cuda kernels: {e}"),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        println!("cuda: this build has no CUDA support (cargo build --release --features cuda)");
        if args.check_kernels {
            bail!("--check-kernels: this build has no CUDA support (build with --features cuda)");
        }
    }
    Ok(())
}
