//! `candor run … --device cpu,cpu | cuda:all | cuda:0,cuda:1`: one replica of the run per
//! device. Replica `I` of `N` is a child `candor run … --shard I/N` on its own device (a GPU
//! seen alone through `CUDA_VISIBLE_DEVICES`, or a share of the CPU's threads), writing
//! `OUT.shards/I`; then `candor merge` joins them into `OUT`. The split is the shards' fixed
//! rule (the items at positions I, I+N, … after --subset and --limit) and the merge replays
//! the run from the replicas' logs, so `OUT` holds the bytes a one-device run writes: samples,
//! results, the manifest's identity, and the reports but for their run notes (tests/it/report.rs
//! checks it on `cpu,cpu,cpu`). What each device did (items, tokens, seconds) goes to
//! `OUT/devices.json`, stderr and the reports' run notes, not into the results. Run the same command again to resume: each replica resumes its
//! directory, and the merge finishes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::model::device::DeviceSpec;
use crate::store::devices::{self, DeviceShare};
use crate::store::shard::ShardDir;

use super::run::{Protocol, RunArgs};

/// One entry of `--device`: a device, or every GPU the driver shows (`cuda:all`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeviceArg {
    One(DeviceSpec),
    CudaAll,
}

/// `--device`: one device, or a comma-separated list of them (one replica each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Devices(Vec<DeviceArg>);

impl FromStr for Devices {
    type Err = String;

    fn from_str(s: &str) -> Result<Devices, String> {
        let list = s
            .split(',')
            .map(|d| match d.trim() {
                "cuda:all" => Ok(DeviceArg::CudaAll),
                "" => Err(format!(
                    "`{s}`: an empty device in the list (expected e.g. cpu,cpu or cuda:0,cuda:1)"
                )),
                d => d.parse().map(DeviceArg::One),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Devices(list))
    }
}

impl Devices {
    pub fn one(d: DeviceSpec) -> Devices {
        Devices(vec![DeviceArg::One(d)])
    }

    /// The device of a one-device run (`cuda:all` counts as `cuda:0` until expanded).
    pub fn first(&self) -> DeviceSpec {
        match self.0.first() {
            Some(DeviceArg::One(d)) => *d,
            Some(DeviceArg::CudaAll) => DeviceSpec::Cuda(0),
            None => DeviceSpec::Cpu,
        }
    }

    /// Whether this names exactly one device.
    pub fn is_one(&self) -> bool {
        matches!(self.0[..], [DeviceArg::One(_)])
    }

    /// The devices, `cuda:all` replaced by every GPU the driver shows.
    pub fn expand(&self) -> anyhow::Result<Vec<DeviceSpec>> {
        let mut out = Vec::new();
        for d in &self.0 {
            match d {
                DeviceArg::One(d) => out.push(*d),
                DeviceArg::CudaAll => out.extend(all_gpus()?),
            }
        }
        Ok(out)
    }
}

/// Every GPU the driver shows, as `cuda:N`.
fn all_gpus() -> anyhow::Result<Vec<DeviceSpec>> {
    DeviceSpec::Cuda(0).check_built()?;
    #[cfg(feature = "cuda")]
    {
        let gpus = crate::model::cuda::list_devices()
            .map_err(|e| anyhow::anyhow!("--device cuda:all: {e}"))?;
        if gpus.is_empty() {
            bail!("--device cuda:all: the driver shows no GPU");
        }
        Ok(gpus.iter().map(|g| DeviceSpec::Cuda(g.ordinal)).collect())
    }
    #[cfg(not(feature = "cuda"))]
    unreachable!("check_built refuses cuda without the feature")
}

/// The run's arguments as given after `candor run`, without the options each replica gets
/// its own value of (`--device`, `--out`, `--threads`).
fn base_args(argv: &[String]) -> Vec<String> {
    let own = ["--device", "--out", "--threads"];
    let mut out = Vec::new();
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        if own.contains(&a.as_str()) {
            it.next();
            continue;
        }
        if own.iter().any(|o| a.starts_with(&format!("{o}="))) {
            continue;
        }
        out.push(a.clone());
    }
    out
}

/// One replica: its child process (while it runs), device, directory and log.
struct Replica {
    device: DeviceSpec,
    dir: PathBuf,
    log: PathBuf,
    threads: Option<usize>,
    child: Option<Child>,
    started: Instant,
    seconds: f64,
    status: Option<std::process::ExitStatus>,
}

/// Runs `args` as one replica per device of `devices` (at least two), then merges them.
pub fn run(args: &RunArgs, devices: &[DeviceSpec]) -> anyhow::Result<()> {
    if args.shard.is_some() {
        bail!("--shard with several --device: the replicas are the shards; give one or the other");
    }
    if args.protocol == Protocol::All {
        bail!("several --device run one protocol at a time: run each protocol on its own");
    }
    let gpus = devices.iter().filter(|d| !d.is_cpu()).count();
    if gpus != 0 && gpus != devices.len() {
        bail!(
            "--device mixes the CPU and GPUs ({}): their tokens differ, so one run uses one kind",
            list(devices)
        );
    }
    same_card(devices)?;
    let n = devices.len();
    let shards = PathBuf::from(format!("{}.shards", args.out.display()));
    std::fs::create_dir_all(&shards).with_context(|| format!("creating {}", shards.display()))?;
    let argv: Vec<String> = std::env::args().skip(2).collect();
    let base = base_args(&argv);
    let exe = std::env::current_exe().context("finding the candor executable")?;
    // The CPU's threads shared among its replicas; a GPU replica keeps the default.
    let total = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let per_cpu = (total / n).max(1);
    let mut replicas = Vec::new();
    for (i, &device) in devices.iter().enumerate() {
        let dir = shards.join(i.to_string());
        let log = shards.join(format!("{i}.log"));
        let out = std::fs::File::create(&log).with_context(|| format!("{}", log.display()))?;
        let mut cmd = Command::new(&exe);
        cmd.arg("run").args(&base);
        cmd.arg("--out")
            .arg(&dir)
            .arg("--shard")
            .arg(format!("{i}/{n}"));
        let threads = match device {
            DeviceSpec::Cpu => {
                cmd.args(["--device", "cpu", "--threads", &per_cpu.to_string()]);
                Some(per_cpu)
            }
            DeviceSpec::Cuda(ordinal) => {
                // The replica sees its GPU alone, as cuda:0: every replica's arguments (and
                // so the merged manifest) are those of a one-GPU run.
                cmd.args(["--device", "cuda"]);
                cmd.env("CUDA_VISIBLE_DEVICES", visible_device(ordinal));
                None
            }
        };
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone().context("the replica's log")?)
            .stderr(out);
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting replica {i} on {device}"))?;
        eprintln!(
            "candor: replica {i}/{n} on {device}{}: {} (log {})",
            threads.map_or(String::new(), |t| format!(" ({t} threads)")),
            dir.display(),
            log.display()
        );
        replicas.push(Replica {
            device,
            dir,
            log,
            threads,
            child: Some(child),
            started: Instant::now(),
            seconds: 0.0,
            status: None,
        });
    }
    wait_all(&mut replicas)?;
    let failed: Vec<String> = replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| !r.status.is_some_and(|s| s.success()))
        .map(|(i, r)| {
            format!(
                "replica {i} on {} ({}): {}",
                r.device,
                r.status.map_or("not finished".into(), |s| s.to_string()),
                last_lines(&r.log, 4)
            )
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {n} replicas failed; what they finished is kept in {}, and the same command \
             again resumes them:\n{}",
            failed.len(),
            shards.display(),
            failed.join("\n")
        );
    }
    let opened = replicas
        .iter()
        .map(|r| ShardDir::open(&r.dir))
        .collect::<Result<Vec<_>, _>>()?;
    // Before the merge, whose reports show it as their run notes.
    write_devices(&args.out, &replicas, &opened)?;
    super::merge::merge(&opened, &args.out)
}

/// A replica ends when this process does (killed, or its terminal closed): it is stopped
/// with SIGTERM rather than left running on its shard, which the same command resumes.
#[cfg(target_os = "linux")]
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child's own attributes.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_: &mut Command) {}

/// Waits for every replica, noting when each finished.
fn wait_all(replicas: &mut [Replica]) -> anyhow::Result<()> {
    loop {
        let mut running = 0;
        for (i, r) in replicas.iter_mut().enumerate() {
            let Some(child) = &mut r.child else { continue };
            match child
                .try_wait()
                .with_context(|| format!("waiting for replica {i}"))?
            {
                Some(status) => {
                    r.seconds = r.started.elapsed().as_secs_f64();
                    r.status = Some(status);
                    r.child = None;
                    eprintln!(
                        "candor: replica {i} on {} {} after {:.1} s",
                        r.device,
                        if status.success() {
                            "finished".to_string()
                        } else {
                            format!("failed ({status})")
                        },
                        r.seconds
                    );
                }
                None => running += 1,
            }
        }
        if running == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `OUT/devices.json`: per replica its device, items, steps, tokens generated, seconds and
/// tokens per second (also printed).
fn write_devices(out: &Path, replicas: &[Replica], shards: &[ShardDir]) -> anyhow::Result<()> {
    let mut shares = Vec::new();
    for (i, (r, shard)) in replicas.iter().zip(shards).enumerate() {
        let items: std::collections::BTreeSet<&str> =
            shard.samples.iter().map(|s| s.item.as_str()).collect();
        let tokens: usize = shard
            .samples
            .iter()
            .filter_map(|s| s.output.as_ref())
            .map(|o| o.output_tokens)
            .sum();
        let share = DeviceShare::new(
            (i, r.device.to_string(), r.threads),
            (items.len(), shard.samples.len(), tokens),
            r.seconds,
        );
        eprintln!("candor: {share}");
        shares.push(share);
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    devices::write(out, &shares).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

/// GPU `ordinal` as this process counts them, in the child's `CUDA_VISIBLE_DEVICES`: the
/// ordinal-th entry of ours when it is set.
fn visible_device(ordinal: usize) -> String {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(v) if !v.trim().is_empty() => v
            .split(',')
            .nth(ordinal)
            .map_or_else(|| ordinal.to_string(), |s| s.trim().to_string()),
        _ => ordinal.to_string(),
    }
}

/// GPUs of one run must be one card model: a GPU's tokens are deterministic on that card.
fn same_card(devices: &[DeviceSpec]) -> anyhow::Result<()> {
    if devices.iter().all(|d| d.is_cpu()) {
        return Ok(());
    }
    devices[0].check_built()?;
    #[cfg(feature = "cuda")]
    {
        let gpus = crate::model::cuda::list_devices().map_err(|e| anyhow::anyhow!("{e}"))?;
        let name = |d: &DeviceSpec| match d {
            DeviceSpec::Cuda(o) => gpus
                .iter()
                .find(|g| g.ordinal == *o)
                .map(|g| (g.name.clone(), g.cc))
                .ok_or_else(|| anyhow::anyhow!("--device {d}: the driver shows no such GPU")),
            DeviceSpec::Cpu => unreachable!("GPUs only"),
        };
        let first = name(&devices[0])?;
        for d in &devices[1..] {
            let this = name(d)?;
            if this != first {
                bail!(
                    "--device {}: {d} is a {} and {} a {}; a GPU's tokens are deterministic per \
                     card model, so one run uses one",
                    list(devices),
                    this.0,
                    devices[0],
                    first.0
                );
            }
        }
    }
    Ok(())
}

fn list(devices: &[DeviceSpec]) -> String {
    devices
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The last `n` non-empty lines of a replica's log, on one line.
fn last_lines(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_lists_parse_and_expand() {
        let d: Devices = "cpu".parse().unwrap();
        assert!(d.is_one());
        assert_eq!(d.first(), DeviceSpec::Cpu);
        let d: Devices = "cpu, cpu".parse().unwrap();
        assert!(!d.is_one());
        assert_eq!(d.expand().unwrap(), [DeviceSpec::Cpu, DeviceSpec::Cpu]);
        let d: Devices = "cuda:0,cuda:1".parse().unwrap();
        assert_eq!(
            d.expand().unwrap(),
            [DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]
        );
        assert!(!"cuda:all".parse::<Devices>().unwrap().is_one());
        assert!("cpu,,cpu".parse::<Devices>().unwrap_err().contains("empty"));
        assert!("cpu,gpu"
            .parse::<Devices>()
            .unwrap_err()
            .contains("unknown"));
    }

    #[test]
    fn replicas_get_the_run_arguments_without_their_own() {
        let argv: Vec<String> = [
            "toy",
            "--model",
            "fake:a",
            "--device",
            "cpu,cpu",
            "--out=x",
            "--threads",
            "4",
            "--limit",
            "9",
        ]
        .map(String::from)
        .into();
        assert_eq!(
            base_args(&argv),
            ["toy", "--model", "fake:a", "--limit", "9"]
        );
    }
}
