//! `candor devices`: where this build can run models — the CPU, and with the `cuda` feature
//! each GPU the driver reports and whether the GPU kernels compile (NVRTC) and load on it.

use anyhow::bail;

#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Fail (exit 1) unless the GPU kernels compile here, and on each GPU present also load
    /// (the driver takes the module and every kernel is found); needs the `cuda` feature and
    /// libnvrtc, not a GPU (CI uses it to check the CUDA code).
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
        use crate::model::cuda::{self, versions};
        let driver = versions::driver_version();
        match &driver {
            Ok(v) => println!("cuda driver: CUDA {v}"),
            Err(why) => println!("cuda driver: {why}"),
        }
        // NVRTC is chosen to suit the driver: a mismatch (every NVRTC found newer than the
        // driver) is its error, one line saying what to install.
        let nvrtc = cuda::nvrtc::library();
        match &nvrtc {
            Ok(l) => println!("nvrtc: {} ({})", l.version, l.path),
            Err(why) => println!("nvrtc: {why}"),
        }
        let devices = match (&driver, cuda::list_devices()) {
            (Err(_), _) => Vec::new(),
            (Ok(_), Ok(list)) if list.is_empty() => {
                println!("cuda: the driver reports no device");
                Vec::new()
            }
            (Ok(_), Ok(list)) => list,
            (Ok(_), Err(why)) => {
                println!("cuda: {why}");
                Vec::new()
            }
        };
        for d in &devices {
            println!("{d}");
        }
        // On each device the kernels are compiled for its compute capability and loaded by the
        // driver, as a model load does; without a device, compiled to PTX for the data-centre
        // GPUs' 8.0 and 9.0, and not loaded.
        let mut failed = None;
        if let Err(why) = &nvrtc {
            println!("cuda kernels: not compiled (no usable NVRTC)");
            failed = Some(why.clone());
        } else if !devices.is_empty() {
            for d in &devices {
                match cuda::check_kernels(d.ordinal) {
                    Ok(what) => println!("cuda kernels: {what}"),
                    Err(e) => {
                        println!("cuda kernels: cuda:{}: {e}", d.ordinal);
                        failed = Some(format!("cuda:{}: {e}", d.ordinal));
                    }
                }
            }
        } else {
            for cc in [(8, 0), (9, 0)] {
                let arch = versions::arch_name(cc);
                match cuda::compile_kernels(Some(cc)) {
                    Ok(_) => println!("cuda kernels: compile for {arch} (NVRTC)"),
                    Err(e) => {
                        println!("cuda kernels: {arch}: {e}");
                        failed = Some(format!("{arch}: {e}"));
                    }
                }
            }
            println!("cuda kernels: loading not checked (no GPU)");
        }
        if let (true, Some(e)) = (args.check_kernels, failed) {
            bail!("{e}");
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
