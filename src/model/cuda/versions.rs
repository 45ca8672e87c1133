//! Which CUDA this machine has, and whether the GPU kernels can run with it: the driver's
//! CUDA version, the NVRTC library's, and a device's compute capability (the kernels are
//! compiled for it). PTX from an NVRTC newer than the driver cannot be loaded (a 12.x driver
//! refuses NVRTC 13's PTX), so that pairing is refused before compiling, in one line that says
//! what to install. Not responsible for finding NVRTC (`super::nvrtc`), opening devices or
//! loading kernels (`super`).

use std::fmt;

/// A CUDA version, `major.minor` (the driver API's and NVRTC's numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    /// From the driver API's encoding (`cuDriverGetVersion`: 1000 × major + 10 × minor).
    pub fn from_driver(v: i32) -> CudaVersion {
        let v = v.max(0) as u32;
        CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The CUDA version of the installed driver (`libcuda.so.1`), or why it cannot be read.
pub fn driver_version() -> Result<CudaVersion, String> {
    // SAFETY: only probes whether the library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver (libcuda.so.1 not found)".into());
    }
    let mut v = 0i32;
    // SAFETY: cuDriverGetVersion writes one int and needs no cuInit; it exists in every
    // driver the kernels can run on.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    if r != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("the CUDA driver did not report its version: {r:?}"));
    }
    Ok(CudaVersion::from_driver(v))
}

/// `Err` (one line saying what to install) when kernels compiled by `nvrtc` cannot be loaded
/// by `driver`: PTX is accepted only from an NVRTC of the driver's CUDA version or older.
pub fn check_pair(driver: CudaVersion, nvrtc: CudaVersion) -> Result<(), String> {
    if nvrtc <= driver {
        return Ok(());
    }
    let wheel = if driver.major >= 13 {
        format!("nvidia-cuda-nvrtc=={}.{}.*", driver.major, driver.minor)
    } else {
        format!(
            "nvidia-cuda-nvrtc-cu{}=={}.{}.*",
            driver.major, driver.major, driver.minor
        )
    };
    Err(format!(
        "cuda: NVRTC {nvrtc} is newer than the driver's CUDA {driver}, which cannot load its \
         kernels: `pip install '{wheel}'` and put its lib folder first on LD_LIBRARY_PATH, or \
         update the NVIDIA driver to CUDA {nvrtc} or newer"
    ))
}

/// NVRTC's name of the virtual architecture of compute capability `(major, minor)`.
pub fn arch_name(cc: (i32, i32)) -> &'static str {
    match cc {
        (7, 0) => "compute_70",
        (7, 5) => "compute_75",
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 7) => "compute_87",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        // Other capabilities: named once per process (NVRTC takes a static string).
        (major, minor) => Box::leak(format!("compute_{major}{minor}").into_boxed_str()),
    }
}

/// NVRTC's name of the real architecture of compute capability `(major, minor)` (a cubin's).
pub fn sm_name(cc: (i32, i32)) -> String {
    format!("sm_{}{}", cc.0, cc.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    #[test]
    fn driver_versions_decode() {
        assert_eq!(CudaVersion::from_driver(12040), v(12, 4));
        assert_eq!(CudaVersion::from_driver(13000), v(13, 0));
        assert_eq!(CudaVersion::from_driver(12090).to_string(), "12.9");
    }

    #[test]
    fn nvrtc_no_newer_than_the_driver() {
        assert!(check_pair(v(13, 0), v(13, 0)).is_ok());
        assert!(check_pair(v(13, 0), v(12, 8)).is_ok());
        assert!(check_pair(v(12, 8), v(12, 4)).is_ok());
        let e = check_pair(v(12, 4), v(13, 0)).unwrap_err();
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains("NVRTC 13.0") && e.contains("CUDA 12.4"), "{e}");
        assert!(e.contains("nvidia-cuda-nvrtc-cu12==12.4.*"), "{e}");
        let e = check_pair(v(12, 4), v(12, 8)).unwrap_err();
        assert!(e.contains("nvidia-cuda-nvrtc-cu12==12.4.*"), "{e}");
        let e = check_pair(v(13, 0), v(13, 1)).unwrap_err();
        assert!(e.contains("'nvidia-cuda-nvrtc==13.0.*'"), "{e}");
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_name((9, 0)), "compute_90");
        assert_eq!(arch_name((8, 6)), "compute_86");
        assert_eq!(arch_name((11, 0)), "compute_110");
        assert_eq!(sm_name((9, 0)), "sm_90");
        assert_eq!(sm_name((12, 0)), "sm_120");
    }
}
