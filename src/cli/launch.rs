//! `candor launch slurm|kubernetes --shards N -- <run arguments>`: prints a ready script that
//! runs `candor run <run arguments>` as N shards in parallel, then merges them.
//!
//! The run arguments must name the final directory with `--out OUT`; shard `I` writes
//! `OUT.shards/I` (each a resumable run directory: a shard re-run after a failure picks up
//! where it stopped), and the merge writes `OUT`, byte-identical to an unsharded run.
//!
//! - `slurm`: a bash script to run on the login node. It submits a job array (`--array=0-N-1`,
//!   each task `candor run … --shard $SLURM_ARRAY_TASK_ID/N`), then a merge job that depends on
//!   the whole array (`--dependency=afterok:<array>`). Logs go to `OUT.shards/logs/`.
//! - `kubernetes`: two Jobs as YAML for `kubectl apply -f -`: an Indexed Job of N completions
//!   (`JOB_COMPLETION_INDEX` picks the shard) and a merge Job that waits until every shard
//!   has its `results.json`, then merges. Both mount one shared volume (a
//!   PersistentVolumeClaim) as the working directory, holding models, data and outputs.
//!
//! Paths in the run arguments are as the jobs see them from the working directory.

use anyhow::{bail, Context};

use crate::store::shard::strip_run_args;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scheduler {
    /// A Slurm job array and a dependent merge job (bash script calling sbatch).
    Slurm,
    /// A Kubernetes Indexed Job and a merge Job (YAML).
    Kubernetes,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example: candor launch slurm --shards 8 -- fennec --model default \
--out runs/fennec   (then: candor launch … > submit.sh && bash submit.sh)"
)]
pub struct LaunchArgs {
    #[arg(value_enum)]
    pub scheduler: Scheduler,
    /// Number of shards (parallel jobs).
    #[arg(long, value_name = "N")]
    pub shards: usize,
    /// CPU cores per shard (also its --threads unless the run arguments set them).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub cpus: usize,
    /// Memory per shard (Slurm `--mem`, Kubernetes request), e.g. 8G.
    #[arg(long, value_name = "SIZE", default_value = "8G")]
    pub mem: String,
    /// Slurm: partition; Kubernetes: ignored.
    #[arg(long, value_name = "P")]
    pub partition: Option<String>,
    /// Slurm: time limit per shard, e.g. 04:00:00.
    #[arg(long, value_name = "T")]
    pub time: Option<String>,
    /// The candor binary as the jobs call it.
    #[arg(long, value_name = "PATH", default_value = "candor")]
    pub candor: String,
    /// Slurm: the working directory of the jobs (default: the current directory).
    /// Kubernetes: where the shared volume is mounted (default /work).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// Kubernetes: the container image holding candor.
    #[arg(long, value_name = "IMAGE", default_value = "candor:latest")]
    pub image: String,
    /// Kubernetes: the PersistentVolumeClaim mounted as the working directory.
    #[arg(long, value_name = "NAME", default_value = "candor-work")]
    pub volume_claim: String,
    /// The `candor run` arguments (protocol, models, options, --out OUT).
    #[arg(last = true, required = true, value_name = "RUN ARGS")]
    pub run: Vec<String>,
}

pub fn run(args: LaunchArgs) -> anyhow::Result<()> {
    let plan = JobPlan::new(&args)?;
    let text = match args.scheduler {
        Scheduler::Slurm => slurm(&plan, &args)?,
        Scheduler::Kubernetes => kubernetes(&plan, &args),
    };
    print!("{text}");
    Ok(())
}

/// What the jobs run.
#[derive(Debug, Clone, PartialEq)]
pub struct JobPlan {
    pub shards: usize,
    /// The run arguments without --out and --shard.
    pub run_args: Vec<String>,
    pub out: String,
    /// Whether the run arguments set --threads.
    pub has_threads: bool,
    pub protocol: String,
}

impl JobPlan {
    pub fn new(args: &LaunchArgs) -> anyhow::Result<JobPlan> {
        if args.shards == 0 {
            bail!("--shards must be at least 1");
        }
        if args.cpus == 0 {
            bail!("--cpus must be at least 1");
        }
        let mut run = args.run.clone();
        if run.first().map(String::as_str) == Some("run") {
            run.remove(0);
        }
        let out = out_arg(&run).context(
            "the run arguments need --out DIR (the merged run directory; shards go to DIR.shards/)",
        )?;
        let protocol = run.first().cloned().unwrap_or_default();
        if protocol == "all" || protocol.starts_with('-') {
            bail!("name one protocol first in the run arguments (`all` cannot be sharded)");
        }
        let has_threads = run
            .iter()
            .any(|a| a == "--threads" || a.starts_with("--threads="));
        Ok(JobPlan {
            shards: args.shards,
            run_args: strip_run_args(&run),
            out,
            has_threads,
            protocol,
        })
    }

    fn shard_dir(&self, i: &str) -> String {
        format!("{}.shards/{i}", self.out)
    }
}

fn out_arg(args: &[String]) -> Option<String> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--out" {
            return it.next().cloned();
        }
        if let Some(v) = a.strip_prefix("--out=") {
            return Some(v.to_string());
        }
    }
    None
}

/// Single-quoted for sh.
fn sh(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', "'\\''"))
}

fn join_sh(args: &[String]) -> String {
    args.iter().map(|a| sh(a)).collect::<Vec<_>>().join(" ")
}

/// The Slurm submission script.
pub fn slurm(plan: &JobPlan, args: &LaunchArgs) -> anyhow::Result<String> {
    let workdir = match &args.workdir {
        Some(w) => w.clone(),
        None => std::env::current_dir()
            .context("the current directory")?
            .display()
            .to_string(),
    };
    let n = plan.shards;
    let name = format!("candor-{}", plan.protocol);
    let threads = if plan.has_threads {
        String::new()
    } else {
        " --threads \"${SLURM_CPUS_PER_TASK:-1}\"".to_string()
    };
    let mut opts = format!("--cpus-per-task={} --mem={}", args.cpus, sh(&args.mem));
    if let Some(p) = &args.partition {
        opts += &format!(" --partition={}", sh(p));
    }
    if let Some(t) = &args.time {
        opts += &format!(" --time={}", sh(t));
    }
    let shards_dir = format!("{}.shards", plan.out);
    let merge_inputs: Vec<String> = (0..n).map(|i| plan.shard_dir(&i.to_string())).collect();
    Ok(format!(
        r#"#!/bin/bash
# Written by `candor launch slurm`: {n} shards of `candor run {run}`, then their merge.
# Run it where sbatch works: bash THIS_SCRIPT. Shards: {shards_dir}/I; merged run: {out}.
set -euo pipefail
cd {wd}
mkdir -p {logs}
array=$(sbatch --parsable --job-name={name} --array=0-{last} {opts} \
  --output={logs}/shard-%a.out --chdir={wd} <<'CANDOR_SHARD'
#!/bin/bash
set -euo pipefail
i="${{SLURM_ARRAY_TASK_ID}}"
exec {candor} run {run} --out {shards_dir}/"$i" --shard "$i"/{n}{threads}
CANDOR_SHARD
)
array="${{array%%;*}}"
merge=$(sbatch --parsable --job-name={name}-merge --dependency=afterok:"$array" \
  --cpus-per-task=1 --mem={mem} --output={logs}/merge.out --chdir={wd} <<'CANDOR_MERGE'
#!/bin/bash
set -euo pipefail
exec {candor} merge {inputs} --out {out}
CANDOR_MERGE
)
echo "submitted shard array $array ({n} tasks) and merge job ${{merge%%;*}}; merged run: {out}"
"#,
        run = join_sh(&plan.run_args),
        out = sh(&plan.out),
        wd = sh(&workdir),
        logs = sh(&format!("{shards_dir}/logs")),
        shards_dir = sh(&shards_dir),
        last = n - 1,
        candor = sh(&args.candor),
        mem = sh(&args.mem),
        inputs = join_sh(&merge_inputs),
    ))
}

fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// The Kubernetes manifests: an Indexed Job for the shards and a waiting merge Job.
pub fn kubernetes(plan: &JobPlan, args: &LaunchArgs) -> String {
    let n = plan.shards;
    let workdir = args.workdir.clone().unwrap_or_else(|| "/work".to_string());
    let name = format!("candor-{}", plan.protocol.replace('_', "-"));
    let threads = if plan.has_threads {
        String::new()
    } else {
        format!(" --threads {}", args.cpus)
    };
    let shard_cmd = format!(
        "exec {} run {} --out {}.shards/\"$JOB_COMPLETION_INDEX\" --shard \"$JOB_COMPLETION_INDEX\"/{n}{threads}",
        sh(&args.candor),
        join_sh(&plan.run_args),
        sh(&plan.out)
    );
    let inputs: Vec<String> = (0..n).map(|i| plan.shard_dir(&i.to_string())).collect();
    let wait = inputs
        .iter()
        .map(|d| format!("[ -f {}/results.json ]", sh(d)))
        .collect::<Vec<_>>()
        .join(" && ");
    let merge_cmd = format!(
        "until {wait}; do sleep 30; done; exec {} merge {} --out {}",
        sh(&args.candor),
        join_sh(&inputs),
        sh(&plan.out)
    );
    let pod = |cmd: &str, cpus: usize| {
        format!(
            r#"    spec:
      restartPolicy: Never
      containers:
        - name: candor
          image: {image}
          workingDir: {wd}
          command: ["/bin/sh", "-c", {cmd}]
          resources:
            requests: {{cpu: "{cpus}", memory: {mem}}}
          volumeMounts:
            - {{name: work, mountPath: {wd}}}
      volumes:
        - name: work
          persistentVolumeClaim: {{claimName: {claim}}}
"#,
            image = yaml_str(&args.image),
            wd = yaml_str(&workdir),
            cmd = yaml_str(cmd),
            mem = yaml_str(&k8s_mem(&args.mem)),
            claim = yaml_str(&args.volume_claim),
        )
    };
    format!(
        r#"# Written by `candor launch kubernetes`: {n} shards of `candor run {run}`, then their merge.
# kubectl apply -f THIS_FILE. Shards: {out}.shards/I on the shared volume; merged run: {out}.
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}-shards
spec:
  completionMode: Indexed
  completions: {n}
  parallelism: {n}
  backoffLimit: {backoff}
  template:
{shard_pod}---
apiVersion: batch/v1
kind: Job
metadata:
  name: {name}-merge
spec:
  backoffLimit: 2
  template:
{merge_pod}"#,
        run = join_sh(&plan.run_args),
        out = plan.out,
        backoff = 2 * n,
        shard_pod = pod(&shard_cmd, args.cpus),
        merge_pod = pod(&merge_cmd, 1),
    )
}

/// Slurm-style sizes (`8G`) as Kubernetes quantities (`8Gi`).
fn k8s_mem(m: &str) -> String {
    match m.chars().last() {
        Some(c @ ('K' | 'M' | 'G' | 'T')) => format!("{}{c}i", &m[..m.len() - 1]),
        _ => m.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> LaunchArgs {
        let mut all = vec!["candor", "launch"];
        all.extend_from_slice(args);
        match crate::cli::Args::try_parse_from(all).unwrap().command {
            crate::cli::Command::Launch(a) => a,
            _ => panic!("not launch"),
        }
    }

    #[test]
    fn slurm_script_has_the_array_and_a_dependent_merge() {
        let a = parse(&[
            "slurm",
            "--shards",
            "3",
            "--workdir",
            "/w d",
            "--",
            "fennec",
            "--model",
            "m 1.gguf",
            "--out",
            "runs/f",
            "--limit",
            "9",
        ]);
        let plan = JobPlan::new(&a).unwrap();
        assert_eq!(
            plan.run_args,
            ["fennec", "--model", "m 1.gguf", "--limit", "9"]
        );
        let s = slurm(&plan, &a).unwrap();
        assert!(s.contains("--array=0-2 --cpus-per-task=4 --mem=8G"), "{s}");
        assert!(s.contains("cd '/w d'"), "{s}");
        assert!(
            s.contains(
                "exec candor run fennec --model 'm 1.gguf' --limit 9 --out runs/f.shards/\"$i\" \
             --shard \"$i\"/3 --threads \"${SLURM_CPUS_PER_TASK:-1}\""
            ),
            "{s}"
        );
        assert!(s.contains("--dependency=afterok:\"$array\""), "{s}");
        assert!(
            s.contains(
                "exec candor merge runs/f.shards/0 runs/f.shards/1 runs/f.shards/2 --out runs/f"
            ),
            "{s}"
        );
    }

    #[test]
    fn kubernetes_job_is_indexed_and_merge_waits_for_every_shard() {
        let a = parse(&[
            "kubernetes",
            "--shards",
            "2",
            "--",
            "run",
            "refutebench",
            "--threads",
            "2",
            "--out",
            "r",
        ]);
        let y = kubernetes(&JobPlan::new(&a).unwrap(), &a);
        assert!(y.contains("completionMode: Indexed"), "{y}");
        assert!(y.contains("completions: 2"), "{y}");
        assert!(
            y.contains("--shard \\\"$JOB_COMPLETION_INDEX\\\"/2\""),
            "{y}"
        );
        assert!(!y.contains("--threads 4"), "{y}");
        assert!(y.contains("[ -f r.shards/1/results.json ]"), "{y}");
        assert!(y.contains("merge r.shards/0 r.shards/1 --out r"), "{y}");
        assert!(y.contains("memory: \"8Gi\""), "{y}");
    }

    #[test]
    fn launch_needs_out_and_one_protocol() {
        let a = parse(&["slurm", "--shards", "2", "--", "toy"]);
        assert!(JobPlan::new(&a).unwrap_err().to_string().contains("--out"));
        let a = parse(&["slurm", "--shards", "2", "--", "all", "--out", "x"]);
        assert!(JobPlan::new(&a).unwrap_err().to_string().contains("`all`"));
    }
}
