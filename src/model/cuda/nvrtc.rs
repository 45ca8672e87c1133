//! NVRTC, found and loaded by Candor rather than by cudarc: every libnvrtc this machine has is
//! a candidate (`$CANDOR_NVRTC` alone when set; else `LD_LIBRARY_PATH`, the folder of the
//! driver's `libcuda.so.1`, CUDA installations under `/usr/local`, the `nvidia-cuda-nvrtc-cu12`
//! and CUDA 13 `nvidia-cuda-nvrtc` wheels in the usual Python environments, and the loader's
//! own search), and the newest one no newer than the driver is used, since a driver cannot
//! load PTX from a newer NVRTC (a 12.x driver refuses NVRTC 13's). Without a driver (a build
//! machine checking that the kernels compile) the newest is used. Only compiling source to PTX
//! or a cubin lives here; loading it is the driver's (`super`).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::versions::{self, CudaVersion};

type Prog = *mut c_void;

/// The NVRTC functions used, from one library.
struct Fns {
    create: unsafe extern "C" fn(
        *mut Prog,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Prog, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    ptx_size: unsafe extern "C" fn(Prog, *mut usize) -> c_int,
    ptx: unsafe extern "C" fn(Prog, *mut c_char) -> c_int,
    /// `nvrtcGetCUBINSize` / `nvrtcGetCUBIN` (NVRTC 11.1 and newer).
    cubin_size: Option<unsafe extern "C" fn(Prog, *mut usize) -> c_int>,
    cubin: Option<unsafe extern "C" fn(Prog, *mut c_char) -> c_int>,
    destroy: unsafe extern "C" fn(*mut Prog) -> c_int,
}

/// A loaded libnvrtc.
pub struct Nvrtc {
    /// Where it was found (a path, or a name the loader resolved).
    pub path: String,
    pub version: CudaVersion,
    fns: Fns,
}

/// The last `dlerror` message.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlopen(name, RTLD_NOW | flags)`.
fn dl_open(name: &[u8], flags: c_int) -> Result<*mut c_void, String> {
    let c = CString::new(name).map_err(|_| "a NUL in a library path".to_string())?;
    // SAFETY: opening a shared library runs its initialisers; libnvrtc's and its builtins'
    // have no preconditions.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | flags) };
    if h.is_null() {
        Err(dl_error())
    } else {
        Ok(h)
    }
}

fn sym<T: Copy>(h: *mut c_void, name: &str) -> Result<T, String> {
    let c = CString::new(name).expect("symbol name");
    // SAFETY: h is a live handle; the symbol is looked up by name only.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    if p.is_null() {
        return Err(format!("no symbol {name}"));
    }
    debug_assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: T is the function pointer type of `name` in NVRTC's C API (nvrtc.h).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

impl Nvrtc {
    /// Loads the libnvrtc at `path` (a path, or a bare name for the loader's search), after its
    /// `libnvrtc-builtins` from the same folder (NVRTC opens it by name, which would otherwise
    /// need that folder on `LD_LIBRARY_PATH`).
    fn open(path: &Path) -> Result<Nvrtc, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(rd) = std::fs::read_dir(dir) {
                for e in rd.flatten() {
                    if e.file_name()
                        .as_bytes()
                        .starts_with(b"libnvrtc-builtins.so")
                    {
                        // Best effort: NVRTC names the builtins it wants in its error.
                        let _ = dl_open(e.path().as_os_str().as_bytes(), libc::RTLD_GLOBAL);
                    }
                }
            }
        }
        let h = dl_open(path.as_os_str().as_bytes(), libc::RTLD_LOCAL)?;
        let version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int =
            sym(h, "nvrtcVersion")?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: nvrtcVersion writes two ints.
        if unsafe { version(&mut major, &mut minor) } != 0 {
            return Err("nvrtcVersion failed".into());
        }
        Ok(Nvrtc {
            path: path.display().to_string(),
            version: CudaVersion {
                major: major.max(0) as u32,
                minor: minor.max(0) as u32,
            },
            fns: Fns {
                create: sym(h, "nvrtcCreateProgram")?,
                compile: sym(h, "nvrtcCompileProgram")?,
                log_size: sym(h, "nvrtcGetProgramLogSize")?,
                log: sym(h, "nvrtcGetProgramLog")?,
                ptx_size: sym(h, "nvrtcGetPTXSize")?,
                ptx: sym(h, "nvrtcGetPTX")?,
                cubin_size: sym(h, "nvrtcGetCUBINSize").ok(),
                cubin: sym(h, "nvrtcGetCUBIN").ok(),
                destroy: sym(h, "nvrtcDestroyProgram")?,
            },
        })
    }

    /// Compiles CUDA C++ `src` to PTX with `options`; `Err` holds NVRTC's log.
    pub fn compile(&self, src: &str, options: &[String]) -> Result<String, String> {
        let ptx = self.build(src, options, false)?;
        String::from_utf8(ptx).map_err(|_| "NVRTC's PTX is not UTF-8".to_string())
    }

    /// Compiles CUDA C++ `src` to a cubin with `options` (which name a real architecture,
    /// `--gpu-architecture=sm_XX`): the driver loads it without compiling PTX itself.
    pub fn compile_cubin(&self, src: &str, options: &[String]) -> Result<Vec<u8>, String> {
        if self.fns.cubin.is_none() || self.fns.cubin_size.is_none() {
            return Err(format!("NVRTC {} has no nvrtcGetCUBIN", self.version));
        }
        self.build(src, options, true)
    }

    /// Compiles `src`; the PTX (trailing NULs removed) or, with `cubin`, the cubin.
    fn build(&self, src: &str, options: &[String], cubin: bool) -> Result<Vec<u8>, String> {
        let f = &self.fns;
        let src = CString::new(src).map_err(|_| "a NUL in the kernel source".to_string())?;
        let name = CString::new("kernels.cu").expect("name");
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).expect("option"))
            .collect();
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let mut prog: Prog = std::ptr::null_mut();
        // SAFETY: NVRTC's C API as documented: the strings outlive the calls, the program is
        // destroyed once, buffers are sized by the matching *Size call.
        unsafe {
            let r = (f.create)(
                &mut prog,
                src.as_ptr(),
                name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            if r != 0 {
                return Err(format!("nvrtcCreateProgram failed ({r})"));
            }
            let r = (f.compile)(prog, ptrs.len() as c_int, ptrs.as_ptr());
            let out = if r != 0 {
                let mut n = 0usize;
                (f.log_size)(prog, &mut n);
                let mut log = vec![0u8; n.max(1)];
                (f.log)(prog, log.as_mut_ptr().cast());
                let log = String::from_utf8_lossy(&log);
                Err(format!(
                    "NVRTC {} ({}) failed ({r}): {}",
                    self.version,
                    self.path,
                    log.trim_end_matches('\0').trim()
                ))
            } else if let (true, Some(size), Some(get)) = (cubin, f.cubin_size, f.cubin) {
                let mut n = 0usize;
                let r = size(prog, &mut n);
                let mut bin = vec![0u8; n];
                if r != 0 || n == 0 || get(prog, bin.as_mut_ptr().cast()) != 0 {
                    Err(format!("NVRTC {}: no cubin ({r})", self.version))
                } else {
                    Ok(bin)
                }
            } else {
                let mut n = 0usize;
                (f.ptx_size)(prog, &mut n);
                let mut ptx = vec![0u8; n.max(1)];
                (f.ptx)(prog, ptx.as_mut_ptr().cast());
                while ptx.last() == Some(&0) {
                    ptx.pop();
                }
                Ok(ptx)
            };
            (f.destroy)(&mut prog);
            out
        }
    }
}

/// Folders of `LD_LIBRARY_PATH`, the driver's, CUDA installations and Python environments'
/// NVRTC wheels, in that order.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("LD_LIBRARY_PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(d) = driver_dir() {
        dirs.push(d);
    }
    let glob = |root: &Path, pred: &dyn Fn(&str) -> bool| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(root)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| pred(&e.file_name().to_string_lossy()))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    };
    for cuda in glob(Path::new("/usr/local"), &|n| n.starts_with("cuda")) {
        dirs.push(cuda.join("lib64"));
        dirs.push(cuda.join("targets/x86_64-linux/lib"));
    }
    let mut roots: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.extend(["/usr/local", "/usr", "/opt/conda"].map(PathBuf::from));
    if let Some(home) = std::env::var_os("HOME") {
        roots.push(Path::new(&home).join(".local"));
    }
    for root in roots {
        for py in glob(&root.join("lib"), &|n| n.starts_with("python3")) {
            for sp in ["site-packages", "dist-packages"] {
                // The CUDA 12 wheel (nvidia/cuda_nvrtc/lib) and CUDA 13's (nvidia/cu13/lib).
                for sub in ["cuda_nvrtc/lib", "cu13/lib", "cu12/lib"] {
                    dirs.push(py.join(sp).join("nvidia").join(sub));
                }
            }
        }
    }
    dirs
}

/// The folder of the driver's libcuda.so.1, when the loader finds one.
fn driver_dir() -> Option<PathBuf> {
    let h = dl_open(b"libcuda.so.1", libc::RTLD_LOCAL).ok()?;
    let f: *mut c_void = sym(h, "cuInit").ok()?;
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(f, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let p = unsafe { CStr::from_ptr(info.dli_fname) };
    Path::new(std::ffi::OsStr::from_bytes(p.to_bytes()))
        .parent()
        .map(Path::to_path_buf)
}

/// Every libnvrtc found: files named `libnvrtc.so[.N...]` in [`candidate_dirs`], then the
/// loader's own search by name. `$CANDOR_NVRTC` (a file) replaces them all.
fn candidates() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("CANDOR_NVRTC") {
        return vec![PathBuf::from(p)];
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for d in candidate_dirs() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        let mut found: Vec<PathBuf> = rd
            .flatten()
            .filter(|e| {
                let n = e.file_name();
                let n = n.as_bytes();
                n.starts_with(b"libnvrtc.so")
                    && n[b"libnvrtc.so".len()..]
                        .iter()
                        .all(|&c| c == b'.' || c.is_ascii_digit())
            })
            .map(|e| e.path())
            .collect();
        found.sort();
        for p in found {
            let canon = std::fs::canonicalize(&p).unwrap_or(p);
            if !out.contains(&canon) {
                out.push(canon);
            }
        }
    }
    out.extend(["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"].map(PathBuf::from));
    out
}

/// Chooses among loaded `(path, version)` candidates: the newest no newer than `driver` (the
/// first found among equals), or without a driver the newest; `Err` when every one is newer
/// than the driver (the one line of [`versions::check_pair`]) or none was found.
fn choose(found: &[CudaVersion], driver: Option<CudaVersion>) -> Result<usize, String> {
    let fits = |v: &CudaVersion| driver.is_none_or(|d| *v <= d);
    let mut best: Option<usize> = None;
    for (i, v) in found.iter().enumerate() {
        if fits(v) && best.is_none_or(|b| *v > found[b]) {
            best = Some(i);
        }
    }
    match (best, driver) {
        (Some(i), _) => Ok(i),
        (None, Some(d)) if !found.is_empty() => {
            let oldest = found.iter().min().expect("non-empty");
            Err(versions::check_pair(d, *oldest).expect_err("newer than the driver"))
        }
        _ => Err(
            "libnvrtc not found (install CUDA's NVRTC: the nvidia-cuda-nvrtc-cu12 pip package for \
             a CUDA 12 driver, nvidia-cuda-nvrtc for CUDA 13; or set CANDOR_NVRTC to the library)"
                .into(),
        ),
    }
}

/// The NVRTC the kernels are compiled with (found and chosen once per process).
pub fn library() -> Result<&'static Nvrtc, String> {
    static LIB: OnceLock<Result<Nvrtc, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let driver = versions::driver_version().ok();
        let mut loaded: Vec<Nvrtc> = Vec::new();
        for p in candidates() {
            if let Ok(l) = Nvrtc::open(&p) {
                loaded.push(l);
            }
        }
        let versions: Vec<CudaVersion> = loaded.iter().map(|l| l.version).collect();
        let i = choose(&versions, driver)?;
        Ok(loaded.swap_remove(i))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The version of the libnvrtc that the kernels are compiled with ([`library`]: the newest
/// found that the driver can load), or why there is none.
pub fn version() -> Result<CudaVersion, String> {
    library().map(|l| l.version)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    #[test]
    fn chooses_the_newest_nvrtc_no_newer_than_the_driver() {
        let found = [v(13, 0), v(12, 4), v(12, 8), v(12, 4)];
        assert_eq!(choose(&found, Some(v(13, 0))), Ok(0));
        assert_eq!(choose(&found, Some(v(12, 9))), Ok(2));
        assert_eq!(choose(&found, Some(v(12, 6))), Ok(1));
        assert_eq!(choose(&found, None), Ok(0));
        let e = choose(&found, Some(v(12, 2))).unwrap_err();
        assert!(
            !e.contains('\n') && e.contains("nvidia-cuda-nvrtc-cu12==12.2.*"),
            "{e}"
        );
        let e = choose(&[], Some(v(12, 2))).unwrap_err();
        assert!(e.contains("libnvrtc not found"), "{e}");
    }
}
