//! `devices.json`: what each device of a replicated run (`--device cuda:all`, `cpu,cpu`) did —
//! its items, steps, tokens generated, seconds and tokens per second. Written beside the
//! merged run before its reports, which show it as their run notes; not part of the results
//! (the seconds change from run to run, the results do not).

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::run_dir::write_atomic;
use super::StoreError;

/// The file's name in a run directory.
pub const DEVICES: &str = "devices.json";

/// One replica's share of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceShare {
    pub replica: usize,
    pub device: String,
    /// The CPU threads it was given (a CPU replica), or none.
    pub threads: Option<usize>,
    pub items: usize,
    pub steps: usize,
    pub tokens_generated: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
}

impl DeviceShare {
    /// A share, its seconds to the millisecond and its rate to a tenth.
    pub fn new(
        (replica, device, threads): (usize, String, Option<usize>),
        (items, steps, tokens_generated): (usize, usize, usize),
        seconds: f64,
    ) -> DeviceShare {
        let rate = tokens_generated as f64 / seconds.max(1e-9);
        DeviceShare {
            replica,
            device,
            threads,
            items,
            steps,
            tokens_generated,
            seconds: (seconds * 1000.0).round() / 1000.0,
            tokens_per_second: (rate * 10.0).round() / 10.0,
        }
    }
}

impl std::fmt::Display for DeviceShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replica {} on {}{}: {} items, {} steps, {} tokens generated in {:.1} s ({:.1} tok/s)",
            self.replica,
            self.device,
            self.threads
                .map_or(String::new(), |t| format!(" ({t} threads)")),
            self.items,
            self.steps,
            self.tokens_generated,
            self.seconds,
            self.tokens_per_second
        )
    }
}

/// Writes `dir/devices.json`.
pub fn write(dir: &Path, shares: &[DeviceShare]) -> Result<(), StoreError> {
    let text = serde_json::to_string_pretty(shares).expect("plain values serialise") + "\n";
    write_atomic(&dir.join(DEVICES), text.as_bytes())
}

/// The shares in `dir/devices.json`, or none where there is no such file (a one-device run).
pub fn read(dir: &Path) -> Result<Option<Vec<DeviceShare>>, String> {
    let path = dir.join(DEVICES);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("{}: not a list of device shares: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_round_trip_and_read_as_one_line_each() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(read(tmp.path()), Ok(None));
        let shares = vec![
            DeviceShare::new((0, "cuda:0".into(), None), (3, 12, 1536), 9.87654),
            DeviceShare::new((1, "cpu".into(), Some(4)), (2, 8, 0), 0.0),
        ];
        write(tmp.path(), &shares).unwrap();
        let back = read(tmp.path()).unwrap().unwrap();
        assert_eq!(back, shares);
        assert_eq!(
            back[0].to_string(),
            "replica 0 on cuda:0: 3 items, 12 steps, 1536 tokens generated in 9.9 s (155.5 tok/s)"
        );
        assert_eq!(back[0].seconds, 9.877);
        assert!(back[1]
            .to_string()
            .starts_with("replica 1 on cpu (4 threads): "));
        std::fs::write(tmp.path().join(DEVICES), "{").unwrap();
        let err = read(tmp.path()).unwrap_err();
        assert!(err.contains("devices.json: not a list"), "{err}");
    }
}
