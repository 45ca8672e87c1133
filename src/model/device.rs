//! Where the forward pass runs: `--device cpu|cuda[:N]`, and the handles the engine's KV
//! bookkeeping holds for blocks that live in a device's memory.
//!
//! The engine keeps deciding which blocks a sequence has, which it shares with forks and the
//! prefix cache, and when one is copied before a write; on a GPU a block is a slot of one KV
//! pool in device memory ([`DeviceBlock`]) instead of host numbers, and a hybrid model's
//! recurrent state a buffer there ([`DeviceState`]). Without the `cuda`
//! feature the device types are uninhabited, so host-only builds carry no device code paths.

use std::fmt;
use std::str::FromStr;

use super::error::ModelError;

/// The device a model is loaded on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The host CPU (the packed forward pass with its own kernels).
    #[default]
    Cpu,
    /// CUDA device `N` (ordinal as the driver counts them).
    Cuda(usize),
}

impl DeviceSpec {
    /// Whether this build can run on the device at all (`cuda` needs the `cuda` feature);
    /// the error says how to get a build that can.
    pub fn check_built(self) -> Result<(), ModelError> {
        match self {
            DeviceSpec::Cpu => Ok(()),
            DeviceSpec::Cuda(_) if cfg!(feature = "cuda") => Ok(()),
            DeviceSpec::Cuda(_) => Err(ModelError::Device(format!(
                "`--device {self}`: this candor was built without CUDA support; rebuild with \
                 `cargo build --release --features cuda` (no CUDA installation is needed to \
                 build; the GPU machine needs its driver and libnvrtc)"
            ))),
        }
    }

    pub fn is_cpu(self) -> bool {
        self == DeviceSpec::Cpu
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = String;

    /// `cpu`, `cuda` (device 0) or `cuda:N`.
    fn from_str(s: &str) -> Result<DeviceSpec, String> {
        let bad = || format!("unknown device `{s}` (expected cpu, cuda or cuda:N)");
        match s {
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse().map(DeviceSpec::Cuda).map_err(|_| bad())
            }
        }
    }
}

#[cfg(feature = "cuda")]
pub use super::cuda::{DeviceBlock, DeviceState, KvPool};

/// A block of KV positions in a device's memory (uninhabited: this build has no devices).
#[cfg(not(feature = "cuda"))]
#[derive(Debug, Clone)]
pub enum DeviceBlock {}

/// A device's pool of KV blocks (uninhabited: this build has no devices).
#[cfg(not(feature = "cuda"))]
#[derive(Debug, Clone)]
pub enum KvPool {}

/// A sequence's recurrent state in a device's memory (uninhabited: this build has no
/// devices).
#[cfg(not(feature = "cuda"))]
#[derive(Debug, Clone)]
pub enum DeviceState {}

#[cfg(not(feature = "cuda"))]
impl DeviceState {
    /// Floats held.
    pub fn len(&self) -> usize {
        match *self {}
    }

    /// Whether it holds no floats.
    pub fn is_empty(&self) -> bool {
        match *self {}
    }

    /// The device address the kernels update.
    pub fn addr(&self) -> u64 {
        match *self {}
    }

    /// The state, read back.
    pub fn to_host(&self) -> Vec<f32> {
        match *self {}
    }

    /// Sets every float to zero.
    pub fn zero(&mut self) {
        match *self {}
    }
}

#[cfg(not(feature = "cuda"))]
impl KvPool {
    pub fn alloc(&self) -> DeviceBlock {
        match *self {}
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        match *self {}
    }

    /// Blocks not in use.
    pub fn free_blocks(&self) -> usize {
        match *self {}
    }

    /// A zero recurrent state of `len` floats on the pool's device.
    pub fn new_state(&self, _len: usize) -> DeviceState {
        match *self {}
    }

    /// The recurrent state `v`, uploaded to the pool's device.
    pub fn state_from(&self, _v: &[f32]) -> DeviceState {
        match *self {}
    }
}

#[cfg(not(feature = "cuda"))]
impl DeviceBlock {
    /// The block's slot in its pool.
    pub fn slot(&self) -> u32 {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_cuda_and_an_ordinal() {
        assert_eq!("cpu".parse(), Ok(DeviceSpec::Cpu));
        assert_eq!("cuda".parse(), Ok(DeviceSpec::Cuda(0)));
        assert_eq!("cuda:3".parse(), Ok(DeviceSpec::Cuda(3)));
        for bad in [
            "gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", "cuda:1:2", " cpu",
        ] {
            let err = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(err.contains(bad), "{bad}: {err}");
        }
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
        assert_eq!(DeviceSpec::Cpu.to_string(), "cpu");
    }

    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        assert!(DeviceSpec::Cpu.check_built().is_ok());
        let r = DeviceSpec::Cuda(0).check_built();
        if cfg!(feature = "cuda") {
            assert!(r.is_ok());
        } else {
            let msg = r.unwrap_err().to_string();
            assert!(msg.contains("--features cuda"), "{msg}");
        }
    }
}
